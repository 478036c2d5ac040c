//! VAE decode time and memory: the real-width (FLUX.1) decoder with random f32 weights, untiled
//! and tiled, against the memory model in `zimage::models::vae_tiling`.
//! `cargo bench --bench vae` runs every case; `ZIMAGE_VAE_BENCH_CASES` picks some, as a comma
//! list of `SIZE` (untiled) and `SIZE/TILE` (tiled, tile in latent pixels), e.g. `512,1024/64`.
//!
//! Each case runs in a child process of its own, so that its MLX peak and its process peak RSS
//! (VmHWM) are its own. MLX peak is `peak_memory()` over the decode; "work" is that less the
//! memory alive before it (weights, conv matrices and latents): what the model predicts.

use std::process::Command;
use std::time::Instant;
use zimage::mlx::{self, memory, random, Dtype};
use zimage::models::vae_tiling::{
    conv_matrix_bytes, decode_peak_bytes, flux_vae_config, random_decoder_weights,
    tiled_decode_peak_bytes, Tiling,
};
use zimage::models::{Checkpoint, VaeDecoder};

const DEFAULT_CASES: &str = "256,512,768,1024,1024/64,1024/32,2048/64,2048/32";
const CHILD: &str = "ZIMAGE_VAE_BENCH_CHILD";

fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

fn parse(case: &str) -> (i32, Option<i32>) {
    let mut it = case.trim().split('/');
    let size = it.next().unwrap().parse().expect("size");
    let tile = it.next().map(|t| t.parse().expect("tile"));
    (size, tile)
}

/// Runs one case in this process and prints one tab-separated result line.
fn child(case: &str) {
    zimage::platform::use_default_device().unwrap();
    let (size, tile) = parse(case);
    let cfg = flux_vae_config();
    let weights = random_decoder_weights(&cfg, 7).unwrap();
    let vae = VaeDecoder::new(&cfg, Checkpoint::new("vae", weights, Dtype::F32)).unwrap();
    // A small decode first makes the convolution matrices, as a pipeline's first decode would.
    let warm = random::normal(&[16, 16, 16], Dtype::F32, &random::key(1).unwrap()).unwrap();
    vae.decode(&warm).unwrap().eval().unwrap();
    drop(warm);
    let f = cfg.scale_factor();
    let latents = random::normal(
        &[cfg.latent_channels, size / f, size / f],
        Dtype::F32,
        &random::key(2).unwrap(),
    )
    .unwrap();
    latents.eval().unwrap();
    memory::clear_cache();
    let base = memory::active_memory() as u64;
    memory::reset_peak_memory();
    let t = Instant::now();
    let image = match tile {
        None => vae.decode(&latents).unwrap(),
        Some(t) => vae.decode_tiled(&latents, &Tiling::new(t)).unwrap(),
    };
    image.eval().unwrap();
    let secs = t.elapsed().as_secs_f64();
    let peak = memory::peak_memory() as u64;
    assert_eq!(image.shape(), vec![size, size, 3]);
    let predicted = match tile {
        None => decode_peak_bytes(&cfg, size, size, 4),
        Some(t) => tiled_decode_peak_bytes(&cfg, size, size, &Tiling::new(t), 4),
    };
    println!(
        "RESULT\t{secs}\t{peak}\t{base}\t{predicted}\t{}",
        peak_rss_bytes()
    );
}

fn main() {
    if let Ok(case) = std::env::var(CHILD) {
        child(&case);
        return;
    }
    let cfg = flux_vae_config();
    let cases = std::env::var("ZIMAGE_VAE_BENCH_CASES").unwrap_or_else(|_| DEFAULT_CASES.into());
    println!(
        "FLUX.1 VAE decoder, random f32 weights, device {:?}, {}",
        mlx::default_device(),
        mlx::blas_description()
    );
    println!(
        "resident before each decode: weights + conv matrices ({:.0} MB of them) + latents",
        conv_matrix_bytes(&cfg, 4) as f64 / 1e6
    );
    println!(
        "{:>6} {:>6} {:>9} {:>12} {:>11} {:>11} {:>7} {:>12}",
        "size", "tile", "time s", "MLX peak MB", "work MB", "model MB", "model", "peak RSS MB"
    );
    let exe = std::env::current_exe().unwrap();
    for case in cases.split(',').filter(|c| !c.trim().is_empty()) {
        let (size, tile) = parse(case);
        let out = Command::new(&exe).env(CHILD, case.trim()).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let Some(line) = stdout.lines().find(|l| l.starts_with("RESULT\t")) else {
            println!(
                "{size:>6} {:>6} failed: {}{}",
                tile.map_or("-".into(), |t| t.to_string()),
                stdout,
                String::from_utf8_lossy(&out.stderr)
            );
            continue;
        };
        let v: Vec<f64> = line
            .split('\t')
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect();
        let (secs, peak, base, predicted, rss) = (v[0], v[1], v[2], v[3], v[4]);
        let work = peak - base;
        println!(
            "{size:>6} {:>6} {secs:>9.2} {:>12.0} {:>11.0} {:>11.0} {:>+6.1}% {:>12.0}",
            tile.map_or("-".into(), |t| t.to_string()),
            peak / 1e6,
            work / 1e6,
            predicted / 1e6,
            (predicted / work - 1.0) * 100.0,
            rss / 1e6
        );
    }
}
