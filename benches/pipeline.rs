//! Pipeline timings: per-step, VAE decode, total and peak memory, median of 3 warm runs.
//! `cargo bench --bench pipeline` runs the tiny demo model at 256²; point
//! `ZIMAGE_BENCH_MODEL` at another diffusers directory (e.g. the "big" configuration from
//! `python models/make_tiny.py --big DIR`) and set `ZIMAGE_BENCH_SIZE` (default 256).
//! `models/bench_reference.py` measures diffusers on the same model the same way.

use std::path::PathBuf;
use zimage::diffusers_dir::DiffusersDir;
use zimage::mlx::Dtype;
use zimage::pipeline::{Pipeline, Request};

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<f64>()
                    .unwrap_or(0.0)
            })
        })
        .unwrap_or(0.0)
        / 1024.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    zimage::platform::settle_blas_threads();
    let model = std::env::var_os("ZIMAGE_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny"));
    let size: u32 = std::env::var("ZIMAGE_BENCH_SIZE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let dtype = match std::env::var("ZIMAGE_BENCH_DTYPE").as_deref() {
        Ok("bf16") => Dtype::BF16,
        _ => zimage::platform::default_compute_dtype(),
    };
    zimage::platform::use_default_device().unwrap();
    let mut p = Pipeline::new(DiffusersDir::open(&model).unwrap(), dtype, true).unwrap();
    let req = Request {
        prompt: "a red fox in the snow".into(),
        negative_prompt: None,
        width: size,
        height: size,
        steps: 8,
        guidance: 0.0,
        seed: 42,
        noise: None,
    };
    let (mut step, mut vae, mut total, mut text, mut peak) =
        (vec![], vec![], vec![], vec![], 0usize);
    for run in 0..4 {
        let out = p.generate(&req, &mut |_| {}).unwrap();
        if run == 0 {
            continue; // warm-up: loads the transformer and VAE
        }
        let get = |name: &str| out.phases.iter().find(|x| x.phase == name).unwrap();
        step.push(get("denoise").seconds / req.steps as f64);
        vae.push(get("decode").seconds);
        text.push(get("text").seconds);
        total.push(out.phases.iter().map(|x| x.seconds).sum());
        peak = peak.max(out.phases.iter().map(|x| x.peak_bytes).max().unwrap_or(0));
    }
    println!(
        "model {} at {size}x{size}, 8 steps, {dtype}, device {:?}",
        model.display(),
        zimage::mlx::default_device()
    );
    println!(
        "step {:.4} s | text {:.4} s | VAE decode {:.3} s | total {:.3} s | MLX peak {:.0} MB | peak RSS {:.0} MB",
        median(step), median(text), median(vae), median(total), peak as f64 / 1e6, peak_rss_mb()
    );
}
