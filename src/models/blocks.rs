//! What the transformers share: the timestep's sinusoidal embedding, attention in chunks
//! where MLX does not fuse it, the interleaved RoPE rotation and the evaluation point after
//! each block.

use super::weights::Release;
use crate::mlx::{self, fast, ops, Array};

/// diffusers' `Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0)` of `s`, in f32:
/// frequencies `exp(−ln(10000)·k/(dim/2))`, then `[cos | sin]` of `s·f_k`.
pub(crate) fn sinusoid(s: f32, dim: i32) -> Vec<f32> {
    let half = dim / 2;
    let neg_ln = -(10000f64.ln() as f32);
    let args: Vec<f32> = (0..half)
        .map(|k| s * ((neg_ln * k as f32) / half as f32).exp())
        .collect();
    args.iter()
        .map(|a| a.cos())
        .chain(args.iter().map(|a| a.sin()))
        .collect()
}

/// Unmasked attention of `[1, H, S, D]` inputs through MLX's attention. Where MLX fuses it
/// (a GPU) in one call, which never writes the `[H, S, S]` scores; elsewhere in chunks of
/// queries whose scores stay under [`crate::platform::ATTENTION_CHUNK_BYTES`], each evaluated
/// before the next is built (left in one graph, MLX would compute them side by side).
pub(crate) fn attend(q: &Array, k: &Array, v: &Array, scale: f32) -> mlx::Result<Array> {
    let (heads, s) = (q.dim(1) as u64, q.dim(2));
    let chunk = query_chunk(heads, s as u64);
    if crate::platform::attention_is_fused() || chunk >= s as u64 {
        return fast::scaled_dot_product_attention(q, k, v, scale, fast::Mask::None);
    }
    mlx::eval(&[q, k, v])?;
    let mut outs = Vec::new();
    for start in (0..s).step_by(chunk as usize) {
        let qc = q.slice_axis(2, start, (start + chunk as i32).min(s))?;
        let o = fast::scaled_dot_product_attention(&qc, k, v, scale, fast::Mask::None)?;
        o.eval()?;
        outs.push(o);
    }
    ops::concatenate(&outs.iter().collect::<Vec<_>>(), 2)
}

/// `t` in f32, for attention that runs in f32 whatever the compute dtype and is rounded once at
/// the end, as torch's CPU attention kernel (transformers' default, `sdpa`) computes a bf16
/// one: scores, softmax and the product with `v` each rounded to bf16 drift about twice as far
/// from the f32 result (the text encoders' bf16 tests measure it).
pub(crate) fn widen(t: &Array) -> mlx::Result<Array> {
    match t.dtype() {
        mlx::Dtype::F32 => Ok(t.clone()),
        _ => t.astype(mlx::Dtype::F32),
    }
}

/// Queries per chunk of `attend` where MLX's attention is not fused: `heads` × chunk × `keys`
/// f32 scores within [`crate::platform::ATTENTION_CHUNK_BYTES`], at least one row.
pub fn query_chunk(heads: u64, keys: u64) -> u64 {
    (crate::platform::ATTENTION_CHUNK_BYTES / (heads * keys * 4).max(1)).max(1)
}

/// Interleaved-pair rotation in f32: `(x₀, x₁) → (x₀cos − x₁sin, x₀sin + x₁cos)`, written as
/// `x·cos + swap(x)·sin±` with `swap(x)` the pairs exchanged and `sin±` = `(−sin, sin)`, which
/// rounds exactly as the pairwise form (a product of a narrow value by an f32 one widens it
/// first; `a + (−b)` is `a − b`) in three f32 passes over `x` instead of a dozen.
pub(crate) fn apply_rope(x: &Array, (cos, sin): &(Array, Array)) -> mlx::Result<Array> {
    let dtype = x.dtype();
    let shape = x.shape();
    let (s, h, hd) = (shape[0], shape[1], shape[2]);
    let pairs = x.reshape(&[s, h, hd / 2, 2])?;
    let swapped = ops::concatenate(
        &[&pairs.slice_axis(3, 1, 2)?, &pairs.slice_axis(3, 0, 1)?],
        3,
    )?;
    // [S, 1, hd/2] tables, each value twice: (cos, cos) and (−sin, sin) per pair.
    let interleave = |a: &Array, b: &Array| -> mlx::Result<Array> {
        ops::stack(&[a, b], 3)?.reshape(&[s, 1, hd])
    };
    let cos2 = interleave(cos, cos)?.reshape(&[s, 1, hd / 2, 2])?;
    let sin2 = interleave(&sin.neg()?, sin)?.reshape(&[s, 1, hd / 2, 2])?;
    ((&pairs * &cos2)? + (&swapped * &sin2)?)?
        .reshape(&[s, h, hd])?
        .astype(dtype)
}

/// After a block named `block` (`("layers", 3)`): with `release` (streamed weights) computes
/// `x` now and lets go of the weights' pages; in the GPU graph computes `x` now, so that the
/// next block starts from evaluated inputs and no more than one block's transients are alive
/// ([`crate::platform::evaluates_per_block`]). Under `ZIMAGE_DEBUG_BLOCKS` reports MLX's memory.
pub(crate) fn after_block(
    release: Option<&Release>,
    x: &Array,
    block: (&str, usize),
) -> mlx::Result<()> {
    if release.is_some() || crate::platform::evaluates_per_block() {
        mlx::eval(&[x])?;
    }
    if let Some(release) = release {
        release.release();
    }
    if crate::platform::debug_blocks() {
        report_block(block);
    }
    Ok(())
}

/// One line of `ZIMAGE_DEBUG_BLOCKS`'s report: MLX's live arrays, its peak so far in the phase
/// and its cache, after block `name.index`.
fn report_block((name, index): (&str, usize)) {
    let mb = |b: usize| b as f64 / 1e6;
    eprintln!(
        "block    {:<22} MLX active {:>9.1} MB   peak {:>9.1} MB   cache {:>9.1} MB",
        format!("{name}.{index}"),
        mb(mlx::memory::active_memory()),
        mb(mlx::memory::peak_memory()),
        mb(mlx::memory::cache_memory()),
    );
}
