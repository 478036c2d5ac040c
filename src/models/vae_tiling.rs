//! Tiled VAE decoding and encoding, and a model of how much memory a decode needs.
//!
//! [`VaeDecoder::decode_tiled`] decodes the latents in overlapping square tiles, one at a time,
//! and blends each tile into its neighbours above and to the left with a linear ramp, as
//! diffusers' `AutoencoderKL.tiled_decode` (0.42.1) does with `enable_tiling()`. Only one tile's
//! activations exist at a time; what is kept between tiles is the finished image (on the Rust
//! heap) and the edge strips later tiles blend with.
//!
//! [`decode_peak_bytes`] and [`tiled_decode_peak_bytes`] predict MLX's peak memory over a
//! decode on the CPU (where [`super::vae`] evaluates one convolution at a time), by walking the
//! decoder's layers and summing the buffers alive at each evaluation point; [`choose_tiling`]
//! uses them to pick the largest tile that fits a budget.

use super::vae::{VaeConfig, VaeDecoder, ATTENTION_CHUNK};
use super::vae_encoder::VaeEncoder;
use crate::mlx::{self, ops, random, Array, Dtype};
use std::collections::HashMap;

/// How to tile a decode: square tiles of `tile_latent` latent pixels, each overlapping the
/// next by the fraction `overlap` of a tile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tiling {
    pub tile_latent: i32,
    pub overlap: f32,
}

/// diffusers' overlap factor (`tile_overlap_factor`).
pub const DEFAULT_OVERLAP: f32 = 0.25;

impl Default for Tiling {
    /// 64-latent-pixel tiles (512 image pixels for an 8× VAE) overlapping by a quarter.
    fn default() -> Tiling {
        Tiling::new(64)
    }
}

impl Tiling {
    /// Tiles of `tile_latent` latent pixels with diffusers' overlap of a quarter.
    pub fn new(tile_latent: i32) -> Tiling {
        Tiling {
            tile_latent,
            overlap: DEFAULT_OVERLAP,
        }
    }

    /// Latent pixels from one tile's start to the next's: `int(tile · (1 − overlap))`, as
    /// diffusers computes its `overlap_size`.
    pub fn step(&self) -> i32 {
        (self.tile_latent as f64 * (1.0 - self.overlap as f64)) as i32
    }

    /// Image pixels each tile contributes along an axis (diffusers' `row_limit`), for a VAE
    /// that upsamples by `scale`.
    pub fn keep(&self, scale: i32) -> i32 {
        self.step() * scale
    }

    /// Image pixels over which a tile is blended into its neighbour (diffusers'
    /// `blend_extent`): the tile less what it keeps. This is diffusers'
    /// `int(tile_sample · overlap)` whenever `tile_latent · overlap` is whole (with other
    /// values diffusers' own crops do not add up to the image).
    pub fn blend(&self, scale: i32) -> i32 {
        self.tile_latent * scale - self.keep(scale)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.tile_latent < 1 {
            return Err(format!(
                "tile size {} must be at least 1 latent pixel",
                self.tile_latent
            ));
        }
        if !(0.0..1.0).contains(&self.overlap) {
            return Err(format!("tile overlap {} must be in [0, 1)", self.overlap));
        }
        if self.step() < 1 {
            return Err(format!(
                "tile size {} with overlap {} leaves no step between tiles",
                self.tile_latent, self.overlap
            ));
        }
        Ok(())
    }

    /// Whether latents of `h`×`w` are decoded in more than one tile (diffusers tiles when
    /// either side exceeds the tile).
    pub fn tiles(&self, h: i32, w: i32) -> bool {
        h > self.tile_latent || w > self.tile_latent
    }

    /// The tiles along an axis of `n` latent pixels: `(start, length)`, starts every `step()`
    /// from 0 while below `n`, each `tile_latent` long or cut at the edge (as diffusers'
    /// `range(0, n, overlap_size)` and slicing give them).
    pub fn spans(&self, n: i32) -> Vec<(i32, i32)> {
        spans(n, self.tile_latent, self.step())
    }
}

/// The tiles along an axis of `n` pixels: `(start, length)`, starts every `step` from 0 while
/// below `n`, each `tile` long or cut at the edge (diffusers' `range(0, n, step)` and slicing).
fn spans(n: i32, tile: i32, step: i32) -> Vec<(i32, i32)> {
    (0..n.max(0))
        .step_by(step.max(1) as usize)
        .map(|s| (s, tile.min(n - s)))
        .collect()
}

/// diffusers' tiled loop (`tiled_decode`, `_tiled_encode`): `run` maps each input tile
/// (`rows` × `cols` spans, in input pixels) to an output tile `[h, w, C]`; each output tile is
/// blended in place with the (already blended) tile above and to its left over `blend` output
/// pixels, and its first `keep` rows and columns are kept. Output tiles are evaluated one at a
/// time; the result `[out_h, out_w, C]` is assembled on the Rust heap and returned evaluated.
fn assemble_tiles(
    rows: &[(i32, i32)],
    cols: &[(i32, i32)],
    blend: i32,
    keep: i32,
    (out_h, out_w): (i32, i32),
    run: impl Fn((i32, i32), (i32, i32)) -> mlx::Result<Array>,
) -> mlx::Result<Array> {
    // The finished output, row-major [out_h, out_w, channels] in the tiles' dtype, made at the
    // first tile (which tells the dtype and channels).
    let mut image: Option<(Vec<u8>, Dtype, i32)> = None;
    // The bottom strip of the last (blended) tile of each column, and the right strip of the
    // last tile of this row: all that later tiles need of their neighbours.
    let mut above: Vec<Option<Array>> = vec![None; cols.len()];
    for (i, &row) in rows.iter().enumerate() {
        let mut left: Option<Array> = None;
        for (j, &col) in cols.iter().enumerate() {
            let mut tile = run(row, col)?;
            // Evaluated before anything else is built: one tile's activations at a time.
            tile.eval()?;
            if let Some(a) = &above[j] {
                tile = blend_into(a, &tile, blend, 0)?;
            }
            if let Some(l) = &left {
                tile = blend_into(l, &tile, blend, 1)?;
            }
            tile.eval()?;
            let ts = tile.shape();
            let (ph, pw, ch) = (ts[0], ts[1], ts[2]);
            let (buf, dtype, _) = image.get_or_insert_with(|| {
                let d = tile.dtype();
                let bytes = out_h as usize * out_w as usize * ch as usize * d.size_bytes();
                (vec![0u8; bytes], d, ch)
            });
            let px = ch as usize * dtype.size_bytes();
            // Keep the first `keep` rows and columns (all of an edge tile).
            let (kh, kw) = (keep.min(ph), keep.min(pw));
            let crop = tile
                .slice(&[0, 0, 0], &[kh, kw, ch], &[1, 1, 1])?
                .to_bytes()?;
            let (oy, ox) = ((i as i32 * keep) as usize, (j as i32 * keep) as usize);
            let row_bytes = kw as usize * px;
            for r in 0..kh as usize {
                let dst = ((oy + r) * out_w as usize + ox) * px;
                buf[dst..dst + row_bytes]
                    .copy_from_slice(&crop[r * row_bytes..(r + 1) * row_bytes]);
            }
            above[j] = Some(copy_of(&tile.slice_axis(0, ph - blend.min(ph), ph)?)?);
            left = Some(copy_of(&tile.slice_axis(1, pw - blend.min(pw), pw)?)?);
        }
    }
    drop(above);
    let (buf, dtype, ch) = image.expect("a non-empty input has tiles");
    let out = Array::from_bytes(&buf, &[out_h, out_w, ch], dtype)?;
    drop(buf);
    out.eval()?;
    Ok(out)
}

impl VaeDecoder {
    /// Decodes latents `[C, h, w]` like [`VaeDecoder::decode`], in tiles: each tile of
    /// `tiling.tile_latent` latent pixels (`tiling.step()` apart) is decoded and evaluated on
    /// its own, its top edge blended with the tile above and its left edge with the tile to the
    /// left over `tiling.blend(scale)` image pixels by diffusers' linear ramp, and its first
    /// `tiling.keep(scale)` rows and columns kept. When the tile covers the whole latent this is
    /// exactly `decode`.
    ///
    /// Memory: one tile's activations, the image being assembled (on the Rust heap until the
    /// end, then once in MLX), and for the blends one strip per tile column. On the CPU the
    /// decode is evaluated as it goes; the returned image is evaluated too.
    pub fn decode_tiled(&self, latents: &Array, tiling: &Tiling) -> mlx::Result<Array> {
        tiling
            .validate()
            .map_err(|m| mlx::Error::new("decode_tiled", m))?;
        let s = latents.shape();
        if s.len() != 3 {
            return Err(mlx::Error::new(
                "decode_tiled",
                format!("expects latents [C, h, w], got shape {s:?}"),
            ));
        }
        let (c, h, w) = (s[0], s[1], s[2]);
        if h < 1 || w < 1 || !tiling.tiles(h, w) {
            return self.decode(latents);
        }
        let scale = self.config.scale_factor();
        assemble_tiles(
            &tiling.spans(h),
            &tiling.spans(w),
            tiling.blend(scale),
            tiling.keep(scale),
            (h * scale, w * scale),
            |(y0, th), (x0, tw)| {
                self.decode(&latents.slice(&[0, y0, x0], &[c, y0 + th, x0 + tw], &[1, 1, 1])?)
            },
        )
    }
}

impl VaeEncoder {
    /// The moments of `image` `[H, W, 3]` like [`VaeEncoder::moments`], in tiles as diffusers'
    /// `_tiled_encode` makes them: image tiles of `tiling.tile_latent · scale` pixels,
    /// `int(tile · (1 − overlap))` apart, each encoded on its own; the moment tiles blended
    /// over `int(tile_latent · overlap)` latent pixels and cropped to the rest. When the tile
    /// covers the whole image this is exactly `moments`.
    pub fn moments_tiled(&self, image: &Array, tiling: &Tiling) -> mlx::Result<Array> {
        tiling
            .validate()
            .map_err(|m| mlx::Error::new("moments_tiled", m))?;
        let s = image.shape();
        if s.len() != 3 {
            return Err(mlx::Error::new(
                "moments_tiled",
                format!("expects an image [H, W, 3], got shape {s:?}"),
            ));
        }
        let (h, w, c) = (s[0], s[1], s[2]);
        let scale = self.config.scale_factor();
        let tile = tiling.tile_latent * scale;
        if h <= tile && w <= tile {
            return self.moments(image);
        }
        let step = (tile as f64 * (1.0 - tiling.overlap as f64)) as i32;
        let blend = (tiling.tile_latent as f64 * tiling.overlap as f64) as i32;
        assemble_tiles(
            &spans(h, tile, step),
            &spans(w, tile, step),
            blend,
            tiling.tile_latent - blend,
            (h / scale, w / scale),
            |(y0, th), (x0, tw)| {
                self.moments(&image.slice(&[y0, x0, 0], &[y0 + th, x0 + tw, c], &[1, 1, 1])?)
            },
        )
    }
}

/// A copy of `x` in a buffer of its own, evaluated, so that keeping it does not keep the
/// array it was sliced from.
fn copy_of(x: &Array) -> mlx::Result<Array> {
    Array::from_bytes(&x.to_bytes()?, &x.shape(), x.dtype())
}

/// diffusers' `blend_v` (`axis` 0) / `blend_h` (`axis` 1) on `[H, W, C]` tiles: over the first
/// `e = min(prev, tile, blend)` rows (columns) of `tile`, position `y` becomes
/// `prev[−e + y] · (1 − y/e) + tile[y] · (y/e)`. Each product and the sum are rounded to the
/// tile's dtype, as torch's arithmetic with Python-float weights rounds them.
fn blend_into(prev: &Array, tile: &Array, blend: i32, axis: i32) -> mlx::Result<Array> {
    let (np, nt) = (prev.dim(axis), tile.dim(axis));
    let e = blend.min(np).min(nt);
    if e <= 0 {
        return Ok(tile.clone());
    }
    let dtype = tile.dtype();
    let ramp = |f: &dyn Fn(f64) -> f64| -> mlx::Result<Array> {
        let v: Vec<f32> = (0..e).map(|y| f(y as f64 / e as f64) as f32).collect();
        let shape = if axis == 0 { [e, 1, 1] } else { [1, e, 1] };
        Array::from_slice(&v, &shape)
    };
    let (w_prev, w_tile) = (ramp(&|t| 1.0 - t)?, ramp(&|t| t)?);
    let a = prev.slice_axis(axis, np - e, np)?.astype(Dtype::F32)?;
    let b = tile.slice_axis(axis, 0, e)?.astype(Dtype::F32)?;
    let mixed = ((a * &w_prev)?.astype(dtype)? + (b * &w_tile)?.astype(dtype)?)?;
    if e == nt {
        return Ok(mixed);
    }
    let rest = tile.slice_axis(axis, e, nt)?;
    ops::concatenate(&[&mixed, &rest], axis)
}

// ---- The memory model ------------------------------------------------------------------------
//
// On the CPU every convolution evaluates its input, then its output (`Conv2d::forward`), so at
// each convolution the live buffers are known: the block's input, the norm+SiLU output feeding
// the convolution, its result, and whatever the surrounding code still holds. The pending
// residual sums are evaluated at the next convolution, where MLX gives the sum the buffer of one
// of its operands (nothing else holds them), so they add nothing. The walk below sums the live
// buffers at every convolution and over the mid-block attention, and takes the largest. For the
// convolutions the counts are exact; for the attention within a chunk-sized buffer or two (MLX's
// CPU stream frees behind the allocations). `cargo bench --bench vae` measures them.

/// Elements alive at the worst point of a decode of `h`×`w` latent pixels, beyond what was
/// alive before the call.
fn decode_peak_elems(cfg: &VaeConfig, h: i64, w: i64) -> u64 {
    let chans: Vec<i64> = cfg
        .block_out_channels
        .iter()
        .rev()
        .map(|&c| c as i64)
        .collect();
    let top = chans[0];
    let latent = cfg.latent_channels as i64;
    let mut p = h * w;
    // The scaled latents `z` stay alive for the whole decode.
    let z = p * latent;
    // conv_in: z and its output.
    let mut peak = z + p * top;
    // A resnet block on x (p pixels, cin channels) to cout: conv1 sees x, norm1(x), h1; then
    // norm2 x, h1, n2 (and, when cin ≠ cout, the shortcut's output s, made first); conv2, which
    // adds the residual itself, x, n2, s and its output.
    let resnet = |p: i64, cin: i64, cout: i64| {
        let shortcut = if cin != cout { cout } else { 0 };
        (p * (2 * cin + cout)).max(p * (cin + 2 * cout + shortcut))
    };
    peak = peak.max(z + resnet(p, top, top));
    if cfg.mid_block_add_attention {
        peak = peak.max(z + attention_elems(p, top));
    }
    peak = peak.max(z + resnet(p, top, top));
    let mut cin = top;
    for (i, &cout) in chans.iter().enumerate() {
        for r in 0..=cfg.layers_per_block {
            let c0 = if r == 0 { cin } else { cout };
            peak = peak.max(z + resnet(p, c0, cout));
        }
        if i + 1 < chans.len() {
            // The block's output (p pixels) and the convolution's output, which on the CPU reads
            // the input enlarged ×2 without making it; elsewhere that nearest ×2 copy too.
            let copy = if crate::platform::convolutions_as_matmuls() {
                0
            } else {
                4
            };
            peak = peak.max(z + p * cout * (1 + 4 + copy));
            p *= 4;
        }
        cin = cout;
    }
    let last = *chans.last().expect("validated non-empty");
    // norm_out + SiLU, then conv_out.
    peak = peak.max(z + p * (2 * last + cfg.out_channels as i64));
    peak.max(0) as u64
}

/// The mid-block attention over `p` tokens of `c` channels (`MidAttention::forward`), which
/// evaluates q, k and v, then one chunk of queries at a time. First the block input, the normed
/// input, q, k and v; then for each chunk the input, q, k, v, the earlier chunks' outputs, the
/// scores and their exponentials (and row sums), and two chunk-sized `[chunk, c]` buffers (of
/// the scaled queries, the product with v and its normalised copy) that MLX's CPU stream, which
/// runs behind the allocations, has not yet freed or already made (measured).
fn attention_elems(p: i64, c: i64) -> i64 {
    let mut peak = 5 * p * c;
    let mut start = 0;
    while start < p {
        let chunk = (ATTENTION_CHUNK as i64).min(p - start);
        peak = peak.max(4 * p * c + start * c + 2 * chunk * p + 2 * chunk * c + chunk);
        start += chunk;
    }
    peak
}

/// Predicted MLX peak memory of [`VaeDecoder::decode`] of an `height`×`width` image (image
/// pixels, multiples of the VAE's scale factor) on the CPU, in bytes, for activations of
/// `dtype_bytes` bytes (4 for f32): `mlx::memory::peak_memory()` after `reset_peak_memory()`
/// less `active_memory()` before the call. Not included: the weights and the latents (alive
/// before the call), and on a decoder's first call the convolution weights in matrix form,
/// which are made then and kept (their size is [`conv_matrix_bytes`]). Measured for f32, where
/// it is within 0.1% from 256² to 1024²; other dtypes scale the same counts, which on the CPU
/// (whose bf16 GroupNorm and convolutions make f32 temporaries) is a lower bound. On a GPU the
/// decoder is one lazy graph and this is not a model of it.
pub fn decode_peak_bytes(cfg: &VaeConfig, height: i32, width: i32, dtype_bytes: usize) -> u64 {
    let f = cfg.scale_factor() as i64;
    let (h, w) = (height as i64 / f, width as i64 / f);
    decode_peak_elems(cfg, h, w) * dtype_bytes as u64
}

/// Predicted MLX peak memory of [`VaeDecoder::decode_tiled`] of an `height`×`width` image
/// with `tiling`, as [`decode_peak_bytes`] counts it: the largest tile's decode plus what is
/// kept between tiles (one strip per tile column and the strip to the left), or at the end
/// the image as one MLX array, whichever is larger.
pub fn tiled_decode_peak_bytes(
    cfg: &VaeConfig,
    height: i32,
    width: i32,
    tiling: &Tiling,
    dtype_bytes: usize,
) -> u64 {
    let f = cfg.scale_factor();
    let (h, w) = (height / f, width / f);
    if !tiling.tiles(h, w) {
        return decode_peak_bytes(cfg, height, width, dtype_bytes);
    }
    let out = cfg.out_channels as i64;
    let blend = tiling.blend(f) as i64;
    let (rows, cols) = (tiling.spans(h), tiling.spans(w));
    // Strips kept: one per column (`blend` rows of its width) and one `blend` columns wide.
    let strips: i64 = cols
        .iter()
        .map(|&(_, tw)| blend.min(tw as i64 * f as i64) * tw as i64 * f as i64 * out)
        .sum::<i64>()
        + blend * (tiling.tile_latent.min(h) * f) as i64 * out;
    let mut worst = 0u64;
    for &(_, th) in &rows {
        for &(_, tw) in &cols {
            worst = worst.max(decode_peak_elems(cfg, th as i64, tw as i64));
        }
    }
    let tiles = (worst as i64 + strips) as u64;
    let image = (height as i64 * width as i64 * out) as u64;
    tiles.max(image) * dtype_bytes as u64
}

/// The bytes of the convolution weights in the `[k·k·I, O]` form the CPU path multiplies by,
/// made on a decoder's first decode and kept with it.
pub fn conv_matrix_bytes(cfg: &VaeConfig, dtype_bytes: usize) -> u64 {
    decoder_tensor_shapes(cfg)
        .iter()
        .filter(|(_, s)| s.len() == 4)
        .map(|(_, s)| s.iter().map(|&d| d as u64).product::<u64>())
        .sum::<u64>()
        * dtype_bytes as u64
}

/// The bytes the CPU convolutions keep as scratch once the decoder has run (outside MLX's
/// memory, in the process's): the widest 3×3 convolution's Winograd-transformed weight, 36·I·O
/// f32 values (F(4×4, 3×3) has 36 products), and one block of transformed tiles and their
/// products, at most 32 MiB (the shim's `CpuWinogradConv3x3::kBlockBytes`).
pub fn conv_scratch_bytes(cfg: &VaeConfig) -> u64 {
    const BLOCK_BYTES: u64 = 32 << 20;
    const PRODUCTS: u64 = 36;
    decoder_tensor_shapes(cfg)
        .iter()
        .filter(|(_, s)| s.len() == 4 && s[2] == 3 && s[3] == 3)
        .map(|(_, s)| 4 * (PRODUCTS * s[0] as u64 * s[1] as u64 + s[1] as u64) + BLOCK_BYTES)
        .max()
        .unwrap_or(0)
}

/// The tiling for an `height`×`width` decode to stay under `budget_bytes` of MLX memory as
/// [`decode_peak_bytes`] counts it (weights excluded): `None` when the untiled decode fits,
/// else the largest tile, a multiple of 8 latent pixels and at least 16, whose predicted peak
/// fits, with diffusers' overlap. When not even 16 fits, 16: the least memory tiling gets.
pub fn choose_tiling(
    cfg: &VaeConfig,
    height: i32,
    width: i32,
    dtype_bytes: usize,
    budget_bytes: u64,
) -> Option<Tiling> {
    if decode_peak_bytes(cfg, height, width, dtype_bytes) <= budget_bytes {
        return None;
    }
    let f = cfg.scale_factor();
    let longest = (height / f).max(width / f);
    // A tile as long as the latent's longest side would not tile at all.
    let mut t = ((longest - 1) / 8) * 8;
    while t >= 16 {
        let tiling = Tiling::new(t);
        if tiled_decode_peak_bytes(cfg, height, width, &tiling, dtype_bytes) <= budget_bytes {
            return Some(tiling);
        }
        t -= 8;
    }
    Some(Tiling::new(16))
}

// ---- Random weights, for tests and benchmarks ------------------------------------------------

/// Every tensor [`VaeDecoder::new`] binds for `cfg`, with its PyTorch shape.
pub fn decoder_tensor_shapes(cfg: &VaeConfig) -> Vec<(String, Vec<i32>)> {
    let mut out: Vec<(String, Vec<i32>)> = Vec::new();
    let conv = |name: String, cin: i32, cout: i32, k: i32, out: &mut Vec<_>| {
        out.push((format!("{name}.weight"), vec![cout, cin, k, k]));
        out.push((format!("{name}.bias"), vec![cout]));
    };
    let norm = |name: String, c: i32, out: &mut Vec<(String, Vec<i32>)>| {
        out.push((format!("{name}.weight"), vec![c]));
        out.push((format!("{name}.bias"), vec![c]));
    };
    let resnet = |name: String, cin: i32, cout: i32, out: &mut Vec<(String, Vec<i32>)>| {
        let mut v = Vec::new();
        norm(format!("{name}.norm1"), cin, &mut v);
        v.push((format!("{name}.conv1.weight"), vec![cout, cin, 3, 3]));
        v.push((format!("{name}.conv1.bias"), vec![cout]));
        norm(format!("{name}.norm2"), cout, &mut v);
        v.push((format!("{name}.conv2.weight"), vec![cout, cout, 3, 3]));
        v.push((format!("{name}.conv2.bias"), vec![cout]));
        if cin != cout {
            v.push((
                format!("{name}.conv_shortcut.weight"),
                vec![cout, cin, 1, 1],
            ));
            v.push((format!("{name}.conv_shortcut.bias"), vec![cout]));
        }
        out.extend(v);
    };
    let chans: Vec<i32> = cfg.block_out_channels.iter().rev().copied().collect();
    let top = chans[0];
    let d = "decoder";
    conv(
        format!("{d}.conv_in"),
        cfg.latent_channels,
        top,
        3,
        &mut out,
    );
    for r in 0..2 {
        resnet(format!("{d}.mid_block.resnets.{r}"), top, top, &mut out);
    }
    if cfg.mid_block_add_attention {
        let a = format!("{d}.mid_block.attentions.0");
        norm(format!("{a}.group_norm"), top, &mut out);
        for l in ["to_q", "to_k", "to_v", "to_out.0"] {
            out.push((format!("{a}.{l}.weight"), vec![top, top]));
            out.push((format!("{a}.{l}.bias"), vec![top]));
        }
    }
    let mut cin = top;
    for (i, &cout) in chans.iter().enumerate() {
        for r in 0..=cfg.layers_per_block {
            let c0 = if r == 0 { cin } else { cout };
            resnet(format!("{d}.up_blocks.{i}.resnets.{r}"), c0, cout, &mut out);
        }
        if i + 1 < chans.len() {
            conv(
                format!("{d}.up_blocks.{i}.upsamplers.0.conv"),
                cout,
                cout,
                3,
                &mut out,
            );
        }
        cin = cout;
    }
    let last = *chans.last().expect("validated non-empty");
    norm(format!("{d}.conv_norm_out"), last, &mut out);
    conv(format!("{d}.conv_out"), last, cfg.out_channels, 3, &mut out);
    out
}

/// A decoder checkpoint of random f32 weights for `cfg` (every tensor [`VaeDecoder::new`]
/// binds, nothing else), evaluated: weights `N(0, 1/fan_in)`, norm scales near 1, biases near
/// 0, so activations keep a sensible scale through the real network's depth.
pub fn random_decoder_weights(cfg: &VaeConfig, seed: u64) -> mlx::Result<HashMap<String, Array>> {
    let mut out = HashMap::new();
    for (n, (name, shape)) in decoder_tensor_shapes(cfg).into_iter().enumerate() {
        let key = random::key(seed.wrapping_mul(1_000_003).wrapping_add(n as u64))?;
        let noise = random::normal(&shape, Dtype::F32, &key)?;
        let is_norm = name.contains("norm");
        let a = if shape.len() > 1 {
            let fan_in: i32 = shape[1..].iter().product();
            (noise * (1.0 / (fan_in as f32).sqrt()))?
        } else if is_norm && name.ends_with(".weight") {
            ((noise * 0.05)? + 1.0)?
        } else {
            (noise * 0.02)?
        };
        a.eval()?;
        out.insert(name, a);
    }
    Ok(out)
}

/// The 16-channel FLUX VAE's configuration (the real models' own): channels [128, 256, 512, 512], two
/// resnets per block, 32 groups, 16 latent channels.
pub fn flux_vae_config() -> VaeConfig {
    VaeConfig {
        block_out_channels: vec![128, 256, 512, 512],
        layers_per_block: 2,
        latent_channels: 16,
        norm_num_groups: 32,
        out_channels: 3,
        scaling_factor: 0.3611,
        shift_factor: Some(0.1159),
        mid_block_add_attention: true,
        use_post_quant_conv: false,
        batch_norm_eps: None,
        use_quant_conv: false,
        in_channels: 3,
        act_fn: "silu".into(),
        sample_size: Some(1024),
    }
}
