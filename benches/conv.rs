//! The VAE's 3×3 convolutions on MLX, f32, at the sizes of a 512×512 decode: MLX's direct
//! `conv2d` against `zimage::mlx::fast::conv2d_same` (what the decoder runs on the CPU: Winograd's
//! F(4×4, 3×3) as BLAS products). Rates count the direct form's 2·9·I·O FLOPs per pixel for both,
//! so the Winograd form can pass the sgemm rate. `cargo bench --bench conv`.

use std::time::Instant;
use zimage::mlx::{self, fast, ops, random, Array, Dtype};
use zimage::models::vae::conv_matrix;

fn best_of(reps: usize, mut f: impl FnMut() -> Array) -> (f64, Array) {
    let mut out = f();
    out.eval().unwrap();
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        out = f();
        out.eval().unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    (best, out)
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
        "size", "ch", "direct GF/s", "zimage GF/s", "speedup"
    );
    for (hw, c) in [(64, 512), (128, 512), (256, 256), (512, 128), (256, 32)] {
        let x = random::normal(&[1, hw, hw, c], Dtype::F32, &random::key(1).unwrap()).unwrap();
        let w = random::normal(&[c, 3, 3, c], Dtype::F32, &random::key(2).unwrap()).unwrap();
        let bias = random::normal(&[c], Dtype::F32, &random::key(3).unwrap()).unwrap();
        let matrix = conv_matrix(&w).unwrap();
        mlx::eval(&[&x, &w, &bias, &matrix]).unwrap();
        let flops = 2.0 * (hw * hw) as f64 * (9 * c * c) as f64;
        let (direct, want) = best_of(2, || {
            (ops::conv2d(&x, &w, (1, 1), (1, 1), (1, 1), 1).unwrap() + &bias).unwrap()
        });
        let (ours, got) = best_of(2, || fast::conv2d_same(&x, &matrix, &bias, 3).unwrap());
        let diff = (&got - &want)
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
            flops / ours / 1e9,
            direct / ours
        );
    }
}
