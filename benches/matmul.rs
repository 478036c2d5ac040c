//! f32 and bf16 matmul throughput through the MLX wrapper, next to the BLAS's own sgemm
//! called directly in the same run. `cargo bench --bench matmul`.

mod common;

use common::best_of;
use zimage::mlx::{self, ops, random, Dtype};

fn main() {
    zimage::platform::use_default_device().unwrap();
    println!(
        "MLX {} ({}), device {:?}",
        mlx::version(),
        mlx::build_info().variant,
        mlx::default_device()
    );
    println!("BLAS: {}", mlx::blas_description());
    println!(
        "{:>6} {:>6} {:>14} {:>14} {:>8}",
        "n", "dtype", "wrapper GF/s", "sgemm GF/s", "ratio"
    );
    for n in [1024usize, 4096] {
        let flops = 2.0 * (n as f64).powi(3);
        let reps = if n >= 4096 { 3 } else { 10 };
        let a =
            random::normal(&[n as i32, n as i32], Dtype::F32, &random::key(1).unwrap()).unwrap();
        let b =
            random::normal(&[n as i32, n as i32], Dtype::F32, &random::key(2).unwrap()).unwrap();
        mlx::eval(&[&a, &b]).unwrap();
        let wrapper = best_of(reps, || ops::matmul(&a, &b).unwrap().eval().unwrap());
        let (av, bv) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        let mut c = vec![0f32; n * n];
        let sgemm = match mlx::blas_sgemm(n, n, n, &av, &bv, &mut c) {
            Ok(()) => Some(best_of(reps, || {
                mlx::blas_sgemm(n, n, n, &av, &bv, &mut c).unwrap()
            })),
            Err(_) => None,
        };
        let (w, s) = (flops / wrapper / 1e9, sgemm.map(|t| flops / t / 1e9));
        match s {
            Some(s) => println!(
                "{n:>6} {:>6} {w:>14.1} {s:>14.1} {:>7.0}%",
                "f32",
                100.0 * w / s
            ),
            None => println!("{n:>6} {:>6} {w:>14.1} {:>14} {:>8}", "f32", "-", "-"),
        }
        let (a16, b16) = (
            a.astype(Dtype::BF16).unwrap(),
            b.astype(Dtype::BF16).unwrap(),
        );
        mlx::eval(&[&a16, &b16]).unwrap();
        let reps16 = if n >= 4096 { 1 } else { 3 };
        let t16 = best_of(reps16, || ops::matmul(&a16, &b16).unwrap().eval().unwrap());
        println!(
            "{n:>6} {:>6} {:>14.1} {:>14} {:>8}",
            "bf16",
            flops / t16 / 1e9,
            "-",
            "-"
        );
    }
}
