//! Tiled VAE decoding (`VaeDecoder::decode_tiled`) and the decode memory model.
//!
//! MLX's memory counters are process-wide, so every test here takes `LOCK`: the one test that
//! measures memory then sees only its own allocations.

use std::path::Path;
use std::sync::Mutex;
use zimage::mlx::{self, io, memory, random, Array, Dtype};
use zimage::models::vae::to_rgb8;
use zimage::models::vae_tiling::{
    choose_tiling, decode_peak_bytes, decoder_tensor_shapes, flux_vae_config,
    random_decoder_weights, tiled_decode_peak_bytes, Tiling,
};
use zimage::models::{Checkpoint, VaeConfig, VaeDecoder};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn demo_vae() -> VaeDecoder {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny/vae");
    let cfg: VaeConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let st = io::load_safetensors(&dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    VaeDecoder::new(&cfg, Checkpoint::new("vae", st.tensors, Dtype::F32)).unwrap()
}

fn latents(c: i32, h: i32, w: i32, seed: u64) -> Array {
    let z = random::normal(&[c, h, w], Dtype::F32, &random::key(seed).unwrap()).unwrap();
    z.eval().unwrap();
    z
}

fn f32s(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

#[test]
fn a_tile_covering_the_latent_is_the_untiled_decode_bit_for_bit() {
    let _g = lock();
    zimage::platform::use_default_device().unwrap();
    let vae = demo_vae();
    let z = latents(16, 16, 24, 1);
    let want = f32s(&vae.decode(&z).unwrap());
    for tile in [24, 64] {
        let got = f32s(&vae.decode_tiled(&z, &Tiling::new(tile)).unwrap());
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "tile {tile} differs from the untiled decode"
        );
    }
}

/// diffusers 0.42.1 `AutoencoderKL.tiled_decode` transcribed literally onto `[H, W, C]` f32
/// tiles: decode every tile, then blend each (in place) with the already blended tile above
/// and to the left, crop, concatenate.
fn diffusers_tiled_decode(vae: &VaeDecoder, z: &Array, tile_latent: i32, overlap: f64) -> Vec<f32> {
    struct T {
        h: usize,
        w: usize,
        c: usize,
        v: Vec<f32>,
    }
    let s = z.shape();
    let (ch, h, w) = (s[0], s[1], s[2]);
    let tile_sample = tile_latent as usize * 8;
    let overlap_size = (tile_latent as f64 * (1.0 - overlap)) as usize;
    let blend_extent = (tile_sample as f64 * overlap) as usize;
    let row_limit = tile_sample - blend_extent;
    let mut rows: Vec<Vec<T>> = Vec::new();
    for i in (0..h as usize).step_by(overlap_size) {
        let mut row = Vec::new();
        for j in (0..w as usize).step_by(overlap_size) {
            let (i1, j1) = (
                (i + tile_latent as usize).min(h as usize),
                (j + tile_latent as usize).min(w as usize),
            );
            let t = z
                .slice(
                    &[0, i as i32, j as i32],
                    &[ch, i1 as i32, j1 as i32],
                    &[1, 1, 1],
                )
                .unwrap();
            let d = vae.decode(&t).unwrap();
            let ds = d.shape();
            row.push(T {
                h: ds[0] as usize,
                w: ds[1] as usize,
                c: ds[2] as usize,
                v: f32s(&d),
            });
        }
        rows.push(row);
    }
    let at = |t: &T, y: usize, x: usize, k: usize| (y * t.w + x) * t.c + k;
    for i in 0..rows.len() {
        for j in 0..rows[i].len() {
            if i > 0 {
                let (above, cur) = {
                    let (a, b) = rows.split_at_mut(i);
                    (&a[i - 1][j], &mut b[0][j])
                };
                let e = above.h.min(cur.h).min(blend_extent);
                for y in 0..e {
                    let (wa, wb) = (
                        (1.0 - y as f64 / e as f64) as f32,
                        (y as f64 / e as f64) as f32,
                    );
                    for x in 0..cur.w {
                        for k in 0..cur.c {
                            let a = above.v[at(above, above.h - e + y, x, k)];
                            let b = cur.v[at(cur, y, x, k)];
                            let idx = at(cur, y, x, k);
                            cur.v[idx] = a * wa + b * wb;
                        }
                    }
                }
            }
            if j > 0 {
                let (left, cur) = {
                    let (a, b) = rows[i].split_at_mut(j);
                    (&a[j - 1], &mut b[0])
                };
                let e = left.w.min(cur.w).min(blend_extent);
                for x in 0..e {
                    let (wa, wb) = (
                        (1.0 - x as f64 / e as f64) as f32,
                        (x as f64 / e as f64) as f32,
                    );
                    for y in 0..cur.h {
                        for k in 0..cur.c {
                            let a = left.v[at(left, y, left.w - e + x, k)];
                            let b = cur.v[at(cur, y, x, k)];
                            let idx = at(cur, y, x, k);
                            cur.v[idx] = a * wa + b * wb;
                        }
                    }
                }
            }
        }
    }
    let (out_h, out_w) = (h as usize * 8, w as usize * 8);
    let c = rows[0][0].c;
    let mut out = vec![f32::NAN; out_h * out_w * c];
    let mut oy = 0;
    for row in &rows {
        let mut ox = 0;
        let kh = row[0].h.min(row_limit);
        for t in row {
            let kw = t.w.min(row_limit);
            for y in 0..kh {
                for x in 0..kw {
                    for k in 0..c {
                        out[((oy + y) * out_w + ox + x) * c + k] = t.v[at(t, y, x, k)];
                    }
                }
            }
            ox += kw;
        }
        assert_eq!(ox, out_w);
        oy += kh;
    }
    assert_eq!(oy, out_h);
    out
}

#[test]
fn tiled_decode_is_diffusers_tiled_decode() {
    let _g = lock();
    zimage::platform::use_default_device().unwrap();
    let vae = demo_vae();
    // 16-pixel tiles start every 12 latent pixels and blend over 32 image pixels: 26 rows end
    // in a tile of 2 (16 image pixels, narrower than the blend), 20 columns in one of 8. Then a
    // single row of 24-pixel tiles (18 apart, 48-pixel blends) for a wide image.
    for (h, w, tile) in [(26, 20, 16), (20, 36, 24)] {
        let z = latents(16, h, w, 2);
        let got = vae.decode_tiled(&z, &Tiling::new(tile)).unwrap();
        assert_eq!(got.shape(), vec![h * 8, w * 8, 3]);
        let got = f32s(&got);
        let want = diffusers_tiled_decode(&vae, &z, tile, 0.25);
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert_eq!(
            diff, 0.0,
            "{h}×{w} latent, tile {tile}: max |difference| {diff}"
        );
    }
}

/// Tiled against untiled on the demo VAE at 512² (64² latents in 32-pixel tiles, the demo's
/// own `sample_size` and so diffusers' default tile: 3×3 tiles, 64-pixel blends). Each tile
/// normalises with its own GroupNorm statistics and attends only to itself, so the two differ
/// by design. Measured over seeds 3, 4, 5 (random-weight VAE, outputs up to ±2.2, 2% beyond
/// ±1): max |Δ| 0.15–0.18 and mean |Δ| 0.0104–0.0110 in [-1, 1] units; in 8-bit pixels max
/// 19–23, mean 1.28–1.36, 28–29% of values identical. (With 16-pixel tiles at 256²: max |Δ|
/// 0.28–0.34, mean 0.024–0.025; 8-bit max 35–43, mean 2.9–3.2.) The bounds leave about 1.2–1.4×
/// headroom over seed 3's max |Δ| 0.184, mean 0.0104, 8-bit max 23, mean 1.28.
#[test]
fn tiled_decode_stays_close_to_the_untiled_decode() {
    let _g = lock();
    zimage::platform::use_default_device().unwrap();
    let vae = demo_vae();
    let z = latents(16, 64, 64, 3);
    let full = vae.decode(&z).unwrap();
    let tiled = vae.decode_tiled(&z, &Tiling::new(32)).unwrap();
    let (a, b) = (f32s(&full), f32s(&tiled));
    let n = a.len() as f64;
    let d: Vec<f32> = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).collect();
    let max = d.iter().copied().fold(0.0f32, f32::max);
    let mean = d.iter().map(|&x| x as f64).sum::<f64>() / n;
    let (pa, pb) = (to_rgb8(&full).unwrap(), to_rgb8(&tiled).unwrap());
    let pd: Vec<i32> = pa
        .iter()
        .zip(&pb)
        .map(|(&x, &y)| (x as i32 - y as i32).abs())
        .collect();
    let pmax = *pd.iter().max().unwrap();
    let pmean = pd.iter().map(|&x| x as f64).sum::<f64>() / n;
    let same = pd.iter().filter(|&&x| x == 0).count() as f64 / n;
    println!(
        "tiled vs untiled: max |Δ| {max:.4}, mean |Δ| {mean:.5}; 8-bit: max {pmax}, mean \
         {pmean:.3}, identical {:.1}%",
        same * 100.0
    );
    assert!(max < 0.25, "max |Δ| {max}");
    assert!(mean < 0.0125, "mean |Δ| {mean}");
    assert!(pmax <= 30, "8-bit max |Δ| {pmax}");
    assert!(pmean < 1.6, "8-bit mean |Δ| {pmean}");
}

#[test]
fn choose_tiling_tiles_only_what_does_not_fit() {
    let cfg = flux_vae_config();
    const GB: u64 = 1_000_000_000;
    assert_eq!(choose_tiling(&cfg, 512, 512, 4, 8 * GB), None);
    assert_eq!(choose_tiling(&cfg, 1024, 1024, 4, 8 * GB), None);
    let t = choose_tiling(&cfg, 1024, 1024, 4, 3 * GB / 2).expect("1024² needs tiles in 1.5 GB");
    assert!(t.tile_latent >= 16 && t.tile_latent % 8 == 0 && t.tile_latent < 128);
    assert_eq!(t.overlap, 0.25);
    assert!(tiled_decode_peak_bytes(&cfg, 1024, 1024, &t, 4) <= 3 * GB / 2);
    // The next larger tile would not fit.
    let bigger = Tiling::new(t.tile_latent + 8);
    assert!(tiled_decode_peak_bytes(&cfg, 1024, 1024, &bigger, 4) > 3 * GB / 2);
    // Tighter budgets give smaller tiles, down to 16.
    let small = choose_tiling(&cfg, 1024, 1024, 4, 300_000_000).unwrap();
    assert!(small.tile_latent < t.tile_latent);
    assert_eq!(
        choose_tiling(&cfg, 2048, 2048, 4, 1).unwrap().tile_latent,
        16
    );
    // A non-square image that only overflows along one side still gets a tile.
    assert!(choose_tiling(&cfg, 512, 2048, 4, 3 * GB / 2).is_some());
}

#[test]
fn the_memory_model_scales_as_the_decoder_does() {
    let cfg = flux_vae_config();
    // The peak is the first full-resolution resnet (256 → 128 channels): its input, the
    // norm's output and the convolution's output (256 + 256 + 128), plus the scaled latents.
    let n = 1024u64 * 1024;
    assert_eq!(
        decode_peak_bytes(&cfg, 1024, 1024, 4),
        (640 * n + n / 64 * 16) * 4
    );
    assert_eq!(
        decode_peak_bytes(&cfg, 512, 512, 2) * 2,
        decode_peak_bytes(&cfg, 512, 512, 4)
    );
    // A tile covering the image is the untiled decode.
    assert_eq!(
        tiled_decode_peak_bytes(&cfg, 512, 512, &Tiling::new(64), 4),
        decode_peak_bytes(&cfg, 512, 512, 4)
    );
    assert!(
        tiled_decode_peak_bytes(&cfg, 1024, 1024, &Tiling::new(64), 4)
            < decode_peak_bytes(&cfg, 1024, 1024, 4) / 3
    );
}

#[test]
fn random_weights_fit_the_decoder_exactly() {
    let _g = lock();
    let cfg = VaeConfig {
        block_out_channels: vec![32, 64],
        layers_per_block: 1,
        norm_num_groups: 8,
        ..flux_vae_config()
    };
    let w = random_decoder_weights(&cfg, 1).unwrap();
    assert_eq!(w.len(), decoder_tensor_shapes(&cfg).len());
    // `new` rejects missing, mis-shaped and unused tensors alike.
    VaeDecoder::new(&cfg, Checkpoint::new("vae", w, Dtype::F32)).unwrap();
}

/// The model against MLX's own peak, on the demo VAE (whose small channels make the mid-block
/// attention's scores a large part of the peak at 512²) and on a narrowed FLUX layout.
#[test]
fn the_memory_model_matches_mlx_peak_memory() {
    let _g = lock();
    zimage::platform::use_default_device().unwrap();
    if mlx::default_device() != mlx::Device::Cpu {
        return; // the model is of the CPU path
    }
    let demo = demo_vae();
    let narrow_cfg = VaeConfig {
        block_out_channels: vec![32, 64, 128, 128],
        norm_num_groups: 32,
        ..flux_vae_config()
    };
    let narrow = VaeDecoder::new(
        &narrow_cfg,
        Checkpoint::new(
            "vae",
            random_decoder_weights(&narrow_cfg, 5).unwrap(),
            Dtype::F32,
        ),
    )
    .unwrap();
    for (vae, size, tile) in [
        (&demo, 256, None),
        (&demo, 512, None),
        (&demo, 256, Some(16)),
        (&narrow, 256, Some(16)),
    ] {
        let cfg = &vae.config;
        // Warm up: the first decode makes the convolution matrices.
        vae.decode(&latents(cfg.latent_channels, 8, 8, 9))
            .unwrap()
            .eval()
            .unwrap();
        let z = latents(cfg.latent_channels, size / 8, size / 8, 4);
        memory::clear_cache();
        let base = memory::active_memory() as f64;
        memory::reset_peak_memory();
        let out = match tile {
            None => vae.decode(&z).unwrap(),
            Some(t) => vae.decode_tiled(&z, &Tiling::new(t)).unwrap(),
        };
        out.eval().unwrap();
        let work = memory::peak_memory() as f64 - base;
        drop(out);
        let predicted = match tile {
            None => decode_peak_bytes(cfg, size, size, 4),
            Some(t) => tiled_decode_peak_bytes(cfg, size, size, &Tiling::new(t), 4),
        } as f64;
        println!(
            "{:?} {size}² tile {tile:?}: measured {:.1} MB, predicted {:.1} MB",
            cfg.block_out_channels,
            work / 1e6,
            predicted / 1e6
        );
        let err = (predicted / work - 1.0).abs();
        assert!(
            err < 0.10,
            "{size}² tile {tile:?}: predicted {predicted}, measured {work}"
        );
    }
}
