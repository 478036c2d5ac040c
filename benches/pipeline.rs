//! Denoising-step timings and the rate of the transformer's matrix products, next to MLX's
//! sgemm rate measured in the same run. `cargo bench --bench pipeline` runs two cases:
//!
//! - `pipeline`: the whole pipeline (per step, text, VAE decode, total, peak memory; median of 3
//!   warm runs) on the tiny demo model at 256²; point `ZIMAGE_BENCH_MODEL` at another diffusers
//!   directory (e.g. the "big" configuration from `python models/make_tiny.py --big DIR`) and set
//!   `ZIMAGE_BENCH_SIZE` (default 256). `models/bench_reference.py` measures diffusers on the same
//!   model the same way.
//! - `real`: the transformer alone at the real widths (dim 3840, 30 heads of 128; the synthetic
//!   model of `models/synthetic.rs` with `ZIMAGE_BENCH_LAYERS` main blocks, default 2, and one
//!   refiner of each kind, written to a temporary directory, or to `ZIMAGE_BENCH_REAL_MODEL` and
//!   kept there; an existing directory there, such as the "big" model, is used as it is), a
//!   32-token caption, at the sides in `ZIMAGE_BENCH_SIZES` (default `256,512`):
//!   median of 3 warm steps each.
//!
//! `ZIMAGE_BENCH_CASE=pipeline` or `real` runs one case alone. Each step's matrix-product FLOPs
//! are counted from the config and the token counts (every linear 2·m·n·k, attention's QKᵀ and
//! PV), over the work a step does: the caption's projection and context refiner depend on the
//! request only and are left out. The sgemm rate is MLX's f32 matmul of `tokens×dim` by a
//! transposed `dim×dim` weight (as the linear layers call it) and by a `dim×ffn` one.

mod common;
#[path = "../models/synthetic.rs"]
mod synthetic;

use common::{env_or, median};
use std::path::PathBuf;
use std::time::Instant;
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::zimage::transformer::SEQ_MULTI_OF;
use zimage::families::zimage::DitConfig;
use zimage::families::zimage::Pipeline;
use zimage::mlx::{self, ops, random, Array, Dtype};

fn peak_rss_mb() -> f64 {
    zimage::platform::peak_resident_bytes().unwrap_or(0) as f64 / 1e6
}

fn round_up(n: u64, m: u64) -> u64 {
    n.div_ceil(m) * m
}

/// FLOPs of the matrix products of one transformer step on a `side`² image with a caption of
/// `caption_tokens`, and the token count of the main layers.
fn step_flops(cfg: &DitConfig, side: u32, caption_tokens: u64) -> (f64, u64) {
    let d = cfg.dim as u64;
    let f = (cfg.dim as f64 / 3.0 * 8.0) as u64;
    let a = d.min(256);
    let patch = 4 * cfg.in_channels as u64;
    let n = (side as u64 / 16) * (side as u64 / 16);
    let np = round_up(n, SEQ_MULTI_OF as u64);
    let s = np + round_up(caption_tokens, SEQ_MULTI_OF as u64);
    // Linears (QKV, out, w1/w3, w2, adaLN) and attention's two products over t tokens.
    let block = |t: u64| -> u64 {
        2 * t * d * (3 * d + d + 2 * f) + 2 * t * f * d + 2 * 2 * t * t * d + 2 * a * 4 * d
    };
    let total = 2 * (256 * 1024 + 1024 * a)      // timestep MLP
        + 2 * n * patch * d                          // patch embedding
        + cfg.n_refiner_layers as u64 * block(np)    // noise refiner
        + cfg.n_layers as u64 * block(s)             // main layers
        + 2 * a * d + 2 * s * d * patch; // final layer
    (total as f64, s)
}

/// MLX's f32 rate in GFLOP/s for `[m, k] · [n, k]ᵀ`, the median of 5 after a warm-up.
fn sgemm_rate(m: i32, k: i32, n: i32) -> f64 {
    let x = random::normal(&[m, k], Dtype::F32, &random::key(1).unwrap()).unwrap();
    let w = random::normal(&[n, k], Dtype::F32, &random::key(2).unwrap()).unwrap();
    mlx::eval(&[&x, &w]).unwrap();
    let wt = w.transpose(&[1, 0]).unwrap();
    let mut times = vec![];
    for i in 0..6 {
        let t = Instant::now();
        ops::matmul(&x, &wt).unwrap().eval().unwrap();
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    2.0 * m as f64 * k as f64 * n as f64 / median(times) / 1e9
}

/// Prints the products' FLOPs, their achieved rate and the sgemm rates at this model's shapes.
fn report_rates(cfg: &DitConfig, side: u32, caption_tokens: u64, step_s: f64) {
    let (flops, s) = step_flops(cfg, side, caption_tokens);
    let ffn = (cfg.dim as f64 / 3.0 * 8.0) as i32;
    let square = sgemm_rate(s as i32, cfg.dim, cfg.dim);
    let wide = sgemm_rate(s as i32, cfg.dim, ffn);
    let achieved = flops / step_s / 1e9;
    println!(
        "  products {:.2} GFLOP/step | achieved {achieved:.1} GFLOP/s | sgemm {s}×{d}·{d}×{d} {square:.1} GFLOP/s, \
         {s}×{d}·{d}×{ffn} {wide:.1} GFLOP/s | achieved/sgemm {:.0}%",
        flops / 1e9,
        100.0 * achieved / square,
        d = cfg.dim,
    );
}

fn pipeline_case() {
    let model = std::env::var_os("ZIMAGE_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny"));
    let size: u32 = env_or("ZIMAGE_BENCH_SIZE", 256);
    let dtype = match std::env::var("ZIMAGE_BENCH_DTYPE").as_deref() {
        Ok("bf16") => Dtype::BF16,
        _ => zimage::platform::default_compute_dtype(),
    };
    let mut p = Pipeline::new(DiffusersDir::open(&model).unwrap(), dtype, true).unwrap();
    let req = common::fox_request(size, 8);
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
        "pipeline: model {} at {size}x{size}, 8 steps, {dtype}, device {:?}",
        model.display(),
        zimage::mlx::default_device()
    );
    let step = median(step);
    println!(
        "  step {step:.4} s | text {:.4} s | VAE decode {:.3} s | total {:.3} s | MLX peak {:.0} MB | peak RSS {:.0} MB",
        median(text), median(vae), median(total), peak as f64 / 1e6, peak_rss_mb()
    );
    if dtype == Dtype::F32 {
        let cfg = p.load_transformer().unwrap().config.clone();
        let tokens = p.token_ids(&req.prompt).unwrap().len() as u64;
        report_rates(&cfg, size, tokens, step);
    }
}

fn real_case() {
    let scratch = tempfile::tempdir().unwrap();
    let model = match std::env::var_os("ZIMAGE_BENCH_REAL_MODEL") {
        Some(dir) => PathBuf::from(dir),
        None => scratch.path().join("model"),
    };
    if !model.exists() {
        let spec = synthetic::Spec {
            layers: env_or("ZIMAGE_BENCH_LAYERS", 2),
            refiner_layers: 1,
            // The fewest the text encoder's config allows; the case does not run it.
            text_layers: 2,
            ..synthetic::Spec::real()
        };
        synthetic::write_with(&model, &spec, &synthetic::Options { sync: false }).unwrap();
    }
    let sizes: Vec<u32> = std::env::var("ZIMAGE_BENCH_SIZES")
        .unwrap_or_else(|_| "256,512".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let dtype = Dtype::F32;
    let p = Pipeline::new(DiffusersDir::open(&model).unwrap(), dtype, false).unwrap();
    let transformer = p.load_transformer().unwrap();
    let cfg = transformer.config.clone();
    let caption_tokens = 32u64;
    let caption = random::normal(
        &[caption_tokens as i32, cfg.cap_feat_dim],
        Dtype::F32,
        &random::key(3).unwrap(),
    )
    .unwrap();
    println!(
        "real: transformer of {} (dim {}, {} heads, {} layers, {} + {} refiners), {dtype}, {caption_tokens}-token caption",
        model.display(),
        cfg.dim,
        cfg.n_heads,
        cfg.n_layers,
        cfg.n_refiner_layers,
        cfg.n_refiner_layers,
    );
    for side in sizes {
        let latent = random::normal(
            &[cfg.in_channels, side as i32 / 8, side as i32 / 8],
            Dtype::F32,
            &random::key(4).unwrap(),
        )
        .unwrap();
        let mut times = vec![];
        let t0 = Instant::now();
        let prepared = transformer.prepare(&latent.shape(), &caption).unwrap();
        prepared.eval().unwrap();
        let prepare_s = t0.elapsed().as_secs_f64();
        let _reuse = zimage::platform::ReuseFreedMemory::start();
        for i in 0..4 {
            let t = Instant::now();
            let out: Array = transformer
                .forward_prepared(&latent, 0.5, &prepared)
                .unwrap();
            out.eval().unwrap();
            if i > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        let step = median(times);
        println!("  {side}x{side}: step {step:.3} s | caption preparation {prepare_s:.3} s (once per request)");
        report_rates(&cfg, side, caption_tokens, step);
    }
}

fn main() {
    zimage::platform::return_freed_memory_to_the_system();
    zimage::platform::use_default_device().unwrap();
    let case = std::env::var("ZIMAGE_BENCH_CASE").unwrap_or_default();
    let (load1, load5, _) = load_average();
    println!(
        "BLAS: {} | load average {load1} (1 min), {load5} (5 min)",
        mlx::blas_description()
    );
    if case.is_empty() || case == "pipeline" {
        pipeline_case();
    }
    if case.is_empty() || case == "real" {
        real_case();
    }
}

fn load_average() -> (String, String, String) {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = s.split_whitespace().map(str::to_string);
    (
        it.next().unwrap_or_default(),
        it.next().unwrap_or_default(),
        it.next().unwrap_or_default(),
    )
}
