//! What live previews cost: `cargo bench --bench preview` fits the preview map against the
//! model's VAE (time, and R² on held-out latents), then times the denoising step with previews
//! off and on (median of `ZIMAGE_BENCH_RUNS` warm runs each, default 5, taken in turn; 0 stops
//! after the fit), checks
//! that the image is the same bit for bit, and times a step's preview alone (the map applied to
//! the latents, read back; the best of 20) and what a front end does with it: its PNG, and the atomic write
//! `generate --preview` makes on its own thread.
//!
//! The model is the tiny demo model, or the diffusers directory `ZIMAGE_BENCH_MODEL` names
//! (e.g. the "big" configuration from `python models/make_tiny.py --big DIR`), at
//! `ZIMAGE_BENCH_SIZE`² (default 512) for `ZIMAGE_BENCH_STEPS` steps (default 8).

mod common;

use common::{best_of, env_or, median};
use std::path::PathBuf;
use std::time::Instant;
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::zimage::Pipeline;
use zimage::pipeline::Progress;

fn main() {
    let model = std::env::var_os("ZIMAGE_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny"));
    let size: u32 = env_or("ZIMAGE_BENCH_SIZE", 512);
    let steps: usize = env_or("ZIMAGE_BENCH_STEPS", 8);
    let runs: usize = env_or("ZIMAGE_BENCH_RUNS", 5);
    let dtype = zimage::platform::default_compute_dtype();
    let mut p = Pipeline::new(DiffusersDir::open(&model).unwrap(), dtype, true).unwrap();
    let req = common::fox_request(size, steps);
    println!(
        "preview: model {} at {size}x{size}, {steps} steps, {dtype}, device {:?}",
        model.display(),
        zimage::mlx::default_device()
    );
    // Warm: loads the transformer and the VAE, so that the fit times the decodes alone.
    p.generate(&req, &mut |_| {}).unwrap();
    let t = Instant::now();
    p.set_previews(true).unwrap();
    let map = p.rgb_map().unwrap().clone();
    println!(
        "  fit {:.3} s | R² on held-out latents {:.4}",
        t.elapsed().as_secs_f64(),
        map.r2
    );
    if runs == 0 {
        return;
    }

    let (mut off, mut on) = (vec![], vec![]);
    let (mut rgb_off, mut rgb_on) = (None, None);
    let mut last = None;
    for _ in 0..runs {
        for previews in [false, true] {
            p.set_previews(previews).unwrap();
            let out = p
                .generate(&req, &mut |progress| {
                    if let Progress::Step {
                        preview: Some(pic), ..
                    } = progress
                    {
                        last = Some(pic);
                    }
                })
                .unwrap();
            let denoise = out.phases.iter().find(|x| x.phase == "denoise").unwrap();
            let per_step = denoise.seconds / steps as f64;
            match previews {
                false => (off.push(per_step), rgb_off = Some(out.rgb)),
                true => (on.push(per_step), rgb_on = Some(out.rgb)),
            };
        }
    }
    assert!(rgb_off == rgb_on, "previews changed the image");
    let (off, on) = (median(off), median(on));
    println!(
        "  step off {off:.5} s | on {on:.5} s | {:+.2}% (median of {runs}); image identical",
        100.0 * (on - off) / off
    );

    let preview = last.expect("a step reported a preview");
    let shape = p.latent_shape(&req);
    let draws = zimage::torch_rng::randn(7, shape.iter().product::<i32>() as usize).unwrap();
    let latents = zimage::mlx::Array::from_slice(&draws, &shape).unwrap();
    latents.eval().unwrap();
    let drawn = best_of(20, || {
        map.preview(&latents).unwrap();
    });
    println!(
        "  a step's preview drawn {drawn:.6} s ({:.2}% of a step)",
        100.0 * drawn / off
    );
    let png = best_of(20, || {
        preview.png();
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("preview.png");
    let write = best_of(20, || {
        zimage::files::write_output(&file, &preview.png()).unwrap()
    });
    println!(
        "  preview {}x{} | PNG {:.5} s | PNG written atomically {:.5} s ({:.1}% of a step)",
        preview.width,
        preview.height,
        png,
        write,
        100.0 * write / off
    );
}
