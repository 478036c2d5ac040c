//! Linear layers of the real Z-Image widths with their weights held each way: f32 (resident),
//! bf16 widened per tile, int8 and int4 dequantized per tile, all through sgemm, next to
//! MLX's own `quantized_matmul` and dequantize + matmul. `cargo bench --bench linear`.

mod common;

use common::best_of;
use std::time::Instant;
use zimage::mlx::{self, fast, ops, random, Array, Dtype};

fn main() {
    zimage::platform::use_default_device().unwrap();
    println!("MLX {}, device {:?}", mlx::version(), mlx::default_device());
    println!("BLAS: {}", mlx::blas_description());
    println!(
        "{:>14} {:>5} | {:>8} {:>8} {:>8} {:>8} | {:>6} {:>6} {:>6} | {:>9} {:>9}",
        "[out, in]",
        "rows",
        "f32 GF/s",
        "bf16",
        "int8",
        "int4",
        "bf16×",
        "int8×",
        "int4×",
        "mlx q4mm",
        "mlx deq4"
    );
    // Every linear shape of the transformer at 256² (288 tokens) and 512² (1056), and of the
    // text encoder at a prompt's length.
    let cases: &[(i32, i32, i32)] = &[
        (3840, 3840, 288),
        (10240, 3840, 288),
        (3840, 10240, 288),
        (3840, 3840, 1056),
        (10240, 3840, 1056),
        (3840, 10240, 1056),
        (9728, 2560, 24),
        (2560, 9728, 24),
    ];
    for &(n, k, m) in cases {
        let key = random::key(n as u64 + k as u64).unwrap();
        let x = random::normal(&[m, k], Dtype::F32, &key).unwrap();
        let w = random::normal(&[n, k], Dtype::F32, &random::key(7).unwrap()).unwrap();
        let w = (w * (1.0 / (k as f32).sqrt())).unwrap();
        let w16 = w.astype(Dtype::BF16).unwrap();
        let w32 = w16.astype(Dtype::F32).unwrap();
        let (q8, s8, b8) = ops::quantize(&w16, 64, 8).unwrap();
        let (q4, s4, b4) = ops::quantize(&w16, 64, 4).unwrap();
        mlx::eval(&[&x, &w16, &w32, &q8, &s8, &b8, &q4, &s4, &b4]).unwrap();
        let flops = 2.0 * m as f64 * n as f64 * k as f64;
        let reps = 5;
        let run = |f: &dyn Fn() -> Array| best_of(reps, || f().eval().unwrap());
        let wt = w32.transpose(&[1, 0]).unwrap();
        let t32 = run(&|| ops::matmul(&x, &wt).unwrap());
        let t16 = run(&|| fast::linear(&x, &w16, None, None).unwrap());
        let quant = |q: &Array, s: &Array, b: &Array| {
            let (q, s, b) = (q.clone(), s.clone(), b.clone());
            let x = x.clone();
            move || {
                let a = fast::Packing {
                    scales: &s,
                    biases: Some(&b),
                    group_size: 64,
                    bits: if q.dim(1) * 4 == k { 8 } else { 4 },
                    mode: zimage::mlx::QuantMode::Affine,
                };
                fast::linear(&x, &q, Some(a), None).unwrap()
            }
        };
        let t8 = run(&quant(&q8, &s8, &b8));
        let t4 = run(&quant(&q4, &s4, &b4));
        // MLX's own CPU paths are slow: timed once each.
        let once = |f: &dyn Fn() -> Array| {
            let t = Instant::now();
            f().eval().unwrap();
            t.elapsed().as_secs_f64()
        };
        let mlx_q4 = once(&|| ops::quantized_matmul(&x, &q4, &s4, &b4, true, 64, 4).unwrap());
        let mlx_deq = once(&|| {
            let w = ops::dequantize(&q4, &s4, &b4, 64, 4)
                .unwrap()
                .astype(Dtype::F32)
                .unwrap();
            ops::matmul(&x, &w.transpose(&[1, 0]).unwrap()).unwrap()
        });
        let gf = |t: f64| flops / t / 1e9;
        println!(
            "{:>14} {m:>5} | {:>8.1} {:>8.1} {:>8.1} {:>8.1} | {:>6.2} {:>6.2} {:>6.2} | {:>9.1} {:>9.1}",
            format!("[{n}, {k}]"),
            gf(t32),
            gf(t16),
            gf(t8),
            gf(t4),
            t16 / t32,
            t8 / t32,
            t4 / t32,
            gf(mlx_q4),
            gf(mlx_deq)
        );
        mlx::memory::clear_cache();
    }
}
