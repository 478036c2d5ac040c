//! OpenBLAS's parallel jobs run on zimage's own workers (see `mlx-sys-shim/blas.c`): products
//! big enough for OpenBLAS to split come out right, from several threads at once, and
//! `ZIMAGE_BLAS_THREADS=openblas` leaves OpenBLAS its own threads.
#![cfg(target_os = "linux")]

use zimage::mlx::{self, random, Dtype};

/// `a [m, k] · b [k, n]` in f64, the reference the products are held to.
fn product(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = f64::from(a[i * k + p]);
            for j in 0..n {
                c[i * n + j] += x * f64::from(b[p * n + j]);
            }
        }
    }
    c
}

/// `len` values in (-1, 1) from MLX's generator, seeded: tanh of unit normals.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let shape = [i32::try_from(len).unwrap()];
    (random::normal(&shape, Dtype::F32, &random::key(seed).unwrap()).unwrap())
        .tanh()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

#[test]
fn openblas_hands_its_jobs_to_zimage() {
    let blas = mlx::blas_description();
    assert!(blas.contains("its jobs on zimage's workers"), "{blas}");
}

#[test]
fn split_products_from_several_threads_at_once_are_right() {
    // 192×256·256×224: large enough that OpenBLAS splits it into jobs on a machine of two cores
    // or more; four threads issue three each, so calls meet at the workers.
    let (m, n, k) = (192, 224, 256);
    // The operands are drawn here, on one thread: only the products run concurrently.
    let operands: Vec<Vec<(Vec<f32>, Vec<f32>)>> = (0..4u64)
        .map(|t| {
            (0..3u64)
                .map(|round| {
                    let seed = t * 10 + round;
                    (values(m * k, seed), values(k * n, seed + 100))
                })
                .collect()
        })
        .collect();
    std::thread::scope(|scope| {
        for (t, rounds) in operands.iter().enumerate() {
            scope.spawn(move || {
                for (round, (a, b)) in rounds.iter().enumerate() {
                    let mut c = vec![0.0f32; m * n];
                    mlx::blas_sgemm(m, n, k, a, b, &mut c).unwrap();
                    let want = product(a, b, m, n, k);
                    let worst = c
                        .iter()
                        .zip(&want)
                        .map(|(&got, &w)| (f64::from(got) - w).abs())
                        .fold(0.0, f64::max);
                    // Sums of 256 products of values below 1: f32 rounding stays near 1e-5.
                    assert!(worst < 1e-4, "thread {t}, round {round}: off by {worst}");
                }
            });
        }
    });
}

#[test]
fn zimage_blas_threads_openblas_keeps_openblas_threads() {
    let bin = env!("CARGO_BIN_EXE_zimage");
    let run = |choice: Option<&str>| {
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("info");
        match choice {
            Some(v) => cmd.env("ZIMAGE_BLAS_THREADS", v),
            None => cmd.env_remove("ZIMAGE_BLAS_THREADS"),
        };
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(run(None).contains("its jobs on zimage's workers"));
    assert!(run(Some("openblas")).contains("its jobs on its own threads"));
}
