//! The VAE encoder's time, as `models/bench_reference.py --encode` times diffusers'
//! `vae.encode`: a picture in [-1, 1] through the encoder to its moments and one sample, f32,
//! the median of 3 warm runs per side, and the process's peak RSS.
//!
//! `ZIMAGE_BENCH_MODEL` names a diffusers directory (default: the demo model; the "big"
//! benchmark model of `models/make_tiny.py --big` has the real encoder's widths), and
//! `ZIMAGE_BENCH_SIDES` the sides (default `256,512`).
//!
//! ```sh
//! ZIMAGE_BENCH_MODEL=/tmp/big cargo bench --bench vae_encode
//! ```

use std::path::PathBuf;
use std::time::Instant;
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::zimage::Pipeline;
use zimage::mlx::{self, random, Dtype};
use zimage::models::vae_encoder::LatentDistribution;

fn main() {
    let model = std::env::var_os("ZIMAGE_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny"));
    let sides: Vec<i32> = std::env::var("ZIMAGE_BENCH_SIDES")
        .unwrap_or_else(|_| "256,512".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("ZIMAGE_BENCH_SIDES: sides like 256,512")
        })
        .collect();
    zimage::platform::use_default_device().unwrap();
    let dir = DiffusersDir::open(&model).unwrap();
    let pipeline = Pipeline::new(dir, Dtype::F32, false).unwrap();
    let encoder = pipeline.load_vae_encoder().unwrap();
    println!("zimage encode: the VAE encoder of {}, f32", model.display());
    let key = random::key(3).unwrap();
    for side in sides {
        let image = random::normal(&[side, side, 3], Dtype::F32, &key)
            .unwrap()
            .tanh()
            .unwrap();
        let mut times = Vec::new();
        for run in 0..4 {
            let start = Instant::now();
            let moments = encoder.moments(&image).unwrap();
            let dist = LatentDistribution::from_moments(&moments).unwrap();
            // ε in torch's [C, h, w] order, as the generator draws it; moments are [h, w, 2C].
            let shape = [moments.dim(2) / 2, moments.dim(0), moments.dim(1)];
            let eps = random::normal(&shape, Dtype::F32, &key).unwrap();
            let sample = dist.sample(&eps).unwrap();
            mlx::eval(&[&sample]).unwrap();
            if run > 0 {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        let rss = zimage::platform::peak_resident_bytes().unwrap_or(0) as f64 / 1e6;
        println!(
            "zimage encode {side}x{side}: {:.3} s | peak RSS {rss:.0} MB",
            times[times.len() / 2]
        );
    }
}
