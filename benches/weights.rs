//! The denoising step with the weights held each way, measured in one run on one model: f32
//! copies (the bf16 import cast at load), bf16 as stored (each layer widened as it runs), and
//! int8 / int4 imports kept packed. `cargo bench --bench weights`.
//!
//! The model is a synthetic Z-Image at the real widths (models/synthetic.rs), 2 main blocks,
//! 2 refiners of each kind and 2 text layers unless `ZIMAGE_BENCH_MODEL` names a diffusers
//! directory; `ZIMAGE_BENCH_SIZE` sets the image side (default 256), `ZIMAGE_BENCH_STEPS` the
//! steps per run (default 2). Each mode runs a warm-up generation, then 3 timed ones.

mod common;
#[path = "../models/synthetic.rs"]
mod synthetic;

use common::{env_or, median};
use std::path::PathBuf;
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::zimage::Pipeline;
use zimage::loader::{ReadPath, StoreSource};
use zimage::models::Residency;
use zimage::store::{ImportOptions, Quantization, Store};

fn main() {
    zimage::platform::return_freed_memory_to_the_system();
    zimage::platform::use_default_device().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let model = match std::env::var_os("ZIMAGE_BENCH_MODEL") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let dir = scratch.path().join("model");
            let spec = synthetic::Spec {
                layers: 2,
                refiner_layers: 2,
                text_layers: 2,
                ..synthetic::Spec::real()
            };
            synthetic::write_with(&dir, &spec, &synthetic::Options { sync: false }).unwrap();
            dir
        }
    };
    let size: u32 = env_or("ZIMAGE_BENCH_SIZE", 256);
    let steps: usize = env_or("ZIMAGE_BENCH_STEPS", 2);
    let store = Store::at(&scratch.path().join("store"));
    let dir = DiffusersDir::open(&model).unwrap();
    let dtype = zimage::platform::default_compute_dtype();
    let modes: [(&str, Option<Quantization>, Residency); 4] = [
        ("f32 copies", None, Residency::Compute),
        ("bf16 stored", None, Residency::Stored),
        ("int8", Some(Quantization::Int8), Residency::Stored),
        ("int4", Some(Quantization::Int4), Residency::Stored),
    ];
    println!(
        "model {} at {size}×{size}, {steps} steps, {dtype} compute, device {:?}",
        model.display(),
        zimage::mlx::default_device()
    );
    println!(
        "{:<12} {:>10} {:>10} {:>8} {:>10}",
        "weights", "step s", "× f32", "text s", "MLX peak"
    );
    let mut f32_step = None;
    for (label, quantize, residency) in modes {
        let name = format!("bench:{}", label.replace(' ', "-"));
        let opts = ImportOptions {
            quantize,
            ..ImportOptions::default()
        };
        store.create(&name, &dir, &opts, &|_| {}).unwrap();
        let source = StoreSource {
            model: store.open(&name).unwrap(),
            store: store.clone(),
            read_path: ReadPath::MlxLoader,
        };
        let mut p = Pipeline::new(source, dtype, true).unwrap();
        p.set_residency(residency);
        let req = common::fox_request(size, steps);
        let (mut step, mut text, mut peak) = (vec![], vec![], 0usize);
        for run in 0..4 {
            let out = p.generate(&req, &mut |_| {}).unwrap();
            let phase = |n: &str| out.phases.iter().find(|x| x.phase == n).unwrap().clone();
            peak = peak.max(phase("denoise").peak_bytes);
            if run > 0 {
                step.push(phase("denoise").seconds / steps as f64);
                text.push(phase("text").seconds);
            }
        }
        let step = median(step);
        let base = *f32_step.get_or_insert(step);
        println!(
            "{label:<12} {step:>10.3} {:>10.2} {:>8.3} {:>9.0}M",
            step / base,
            median(text),
            peak as f64 / 1e6
        );
        drop(p);
        zimage::mlx::memory::clear_cache();
    }
}
