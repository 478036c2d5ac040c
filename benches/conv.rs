//! The VAE's 3×3 convolutions on MLX: its direct `conv2d` against the same convolution as
//! matrix products (`zimage::models::vae::conv2d_as_matmuls`), f32, at the sizes of a
//! 512×512 decode. `cargo bench --bench conv`.

use std::time::Instant;
use zimage::mlx::{self, ops, random, Dtype};
use zimage::models::vae::{conv2d_as_matmuls, conv_taps};

fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    zimage::platform::use_default_device().unwrap();
    println!(
        "device {:?}, BLAS: {}",
        mlx::default_device(),
        mlx::blas_description()
    );
    println!(
        "{:>9} {:>6} {:>13} {:>13} {:>8}",
        "size", "ch", "direct GF/s", "matmul GF/s", "speedup"
    );
    for (hw, c) in [(64, 512), (128, 512), (256, 256), (512, 128)] {
        let x = random::normal(&[1, hw, hw, c], Dtype::F32, &random::key(1).unwrap()).unwrap();
        let w = random::normal(&[c, 3, 3, c], Dtype::F32, &random::key(2).unwrap()).unwrap();
        let taps = conv_taps(&w).unwrap();
        mlx::eval(&[&x, &w]).unwrap();
        mlx::eval(&taps.iter().collect::<Vec<_>>()).unwrap();
        let flops = 2.0 * (hw * hw) as f64 * (9 * c * c) as f64;
        let direct = best_of(2, || {
            ops::conv2d(&x, &w, (1, 1), (1, 1), (1, 1), 1)
                .unwrap()
                .eval()
                .unwrap()
        });
        let matmul = best_of(2, || {
            conv2d_as_matmuls(&x, &taps, c).unwrap().eval().unwrap()
        });
        let a = ops::conv2d(&x, &w, (1, 1), (1, 1), (1, 1), 1).unwrap();
        let b = conv2d_as_matmuls(&x, &taps, c).unwrap();
        let diff = (&a - &b)
            .unwrap()
            .abs()
            .unwrap()
            .max(&[0, 1, 2, 3], false)
            .unwrap()
            .item::<f32>()
            .unwrap();
        println!(
            "{:>9} {c:>6} {:>13.1} {:>13.1} {:>7.1}×   (max |difference| {diff:.1e})",
            format!("{hw}×{hw}"),
            flops / direct / 1e9,
            flops / matmul / 1e9,
            direct / matmul
        );
    }
}
