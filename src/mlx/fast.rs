//! Fused kernels from `mlx/fast.h`.

use super::array::{shim_call, Array};
use super::error::Result;
use std::ffi::{c_int, CString};

/// `x · rsqrt(mean(x²) + eps) · weight` over the last axis, accumulated in f32.
#[track_caller]
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    shim_call!(
        "rms_norm",
        mlxs_fast_rms_norm(x.as_ptr(), Array::opt_ptr(weight), eps)
    )
}

/// `residual + rms_norm(x)·weight` over the last axis (`weight`: the last axis's N values, in any
/// shape); without a residual, the norm alone. On the CPU in f32 one pass on every core, where
/// MLX composes five single-threaded ones.
#[track_caller]
pub fn rms_norm_residual(
    x: &Array,
    weight: &Array,
    eps: f32,
    residual: Option<&Array>,
) -> Result<Array> {
    shim_call!(
        "rms_norm_residual",
        mlxs_fast_rms_norm_residual(x.as_ptr(), weight.as_ptr(), eps, Array::opt_ptr(residual))
    )
}

/// The transformer's attention from fused q|k|v projections `[S, 3·heads·D]`: q and k RMS-normed
/// per head (`q_weight`, `k_weight`: D values; `eps`) and rotated by RoPE's interleaved pairs
/// (`cos`, `sin`: S·D/2 angles), q times `q_scale`.
#[derive(Debug, Clone, Copy)]
pub struct QkvHeads<'a> {
    /// q's RMS-norm weight, D values.
    pub q_weight: &'a Array,
    /// k's RMS-norm weight, D values.
    pub k_weight: &'a Array,
    /// RoPE's cosines, S·D/2 angles.
    pub cos: &'a Array,
    /// RoPE's sines, S·D/2 angles.
    pub sin: &'a Array,
    /// Attention heads in the projections.
    pub heads: i32,
    /// The norms' epsilon.
    pub eps: f32,
    /// What q is multiplied by after the rotation (attention's `1/sqrt(D)`, say).
    pub q_scale: f32,
}

impl QkvHeads<'_> {
    /// Attention's inputs `[3, heads, S, D]`, normed, rotated and q scaled. One pass on the CPU
    /// in f32.
    #[track_caller]
    pub fn split(&self, qkv: &Array) -> Result<Array> {
        self.run("qkv_heads", qkv, false)
    }

    /// [`attention_rows`] of [`QkvHeads::split`] in one step: `[S, heads·D]`. On the CPU in f32
    /// each core takes whole heads, norming and rotating each head's q and k into buffers of its
    /// own and reading v where it lies, so the `[3, heads, S, D]` copy is never written;
    /// elsewhere the two steps.
    #[track_caller]
    pub fn attention(&self, qkv: &Array) -> Result<Array> {
        self.run("qkv_attention", qkv, true)
    }

    #[track_caller]
    fn run(&self, name: &'static str, qkv: &Array, attend: bool) -> Result<Array> {
        shim_call!(
            name,
            mlxs_fast_qkv(
                qkv.as_ptr(),
                self.q_weight.as_ptr(),
                self.k_weight.as_ptr(),
                self.cos.as_ptr(),
                self.sin.as_ptr(),
                self.heads,
                self.eps,
                self.q_scale,
                i32::from(attend),
            )
        )
    }
}

/// Unmasked attention of [`QkvHeads::split`]'s `[3, H, S, D]` (q already scaled) → `[S, H·D]`,
/// the heads side by side. On the CPU in f32: BLAS products per head written into the heads'
/// columns and a one-pass softmax on every core.
#[track_caller]
pub fn attention_rows(qkv: &Array) -> Result<Array> {
    shim_call!("attention_rows", mlxs_fast_attention_rows(qkv.as_ptr()))
}

/// `[..., 2F]` → `[..., F]`: SiLU of the first half of the last axis times the second half.
#[track_caller]
pub fn silu_gate(x: &Array) -> Result<Array> {
    shim_call!("silu_gate", mlxs_fast_silu_gate(x.as_ptr()))
}

/// GroupNorm over `[B, ..., C]` with PyTorch's grouping (each group is `C / groups` consecutive
/// channels), statistics in f32, then SiLU when `silu` is set. On the CPU in f32 one fused kernel.
#[track_caller]
pub fn group_norm(
    x: &Array,
    weight: &Array,
    bias: &Array,
    groups: i32,
    eps: f32,
    silu: bool,
) -> Result<Array> {
    shim_call!(
        "group_norm",
        mlxs_fast_group_norm(
            x.as_ptr(),
            weight.as_ptr(),
            bias.as_ptr(),
            groups,
            eps,
            i32::from(silu),
        )
    )
}

/// A stride-1 convolution with "same" zero padding of NHWC `x` by an odd `k`×`k` kernel, plus
/// `bias`: [`conv2d`] with `k / 2` zeros on every side. On the CPU a 3×3 kernel runs by
/// Winograd's F(4×4, 3×3), 4× fewer multiplications than direct summation (36 sgemms per
/// block of 4×4 output tiles).
#[track_caller]
pub fn conv2d_same(x: &Array, weight: &Array, bias: &Array, k: i32) -> Result<Array> {
    conv2d(x, weight, bias, k, 1, (k / 2, k / 2))
}

/// [`conv2d_same`] by a 3×3 kernel of `x` enlarged ×2 by nearest neighbour when `upsample`
/// (each pixel a 2×2 block), plus `residual` (shaped as the output) when given. On the CPU in
/// f32 one pass that makes neither the enlarged input nor a separate sum, with the bytes those
/// steps give; elsewhere the steps one by one.
#[track_caller]
pub fn conv3x3_same(
    x: &Array,
    weight: &Array,
    bias: &Array,
    upsample: bool,
    residual: Option<&Array>,
) -> Result<Array> {
    shim_call!(
        "conv3x3_same",
        mlxs_fast_conv3x3_same(
            x.as_ptr(),
            weight.as_ptr(),
            bias.as_ptr(),
            if upsample { 2 } else { 1 },
            Array::opt_ptr(residual)
        )
    )
}

/// A convolution of NHWC `x` by a `k`×`k` kernel, plus `bias`, with a `stride` and `padding`
/// zero rows and columns (before, after) the input, each below `k`. `weight` is the
/// `[k·k·I, O]` matrix whose row `(dy·k + dx)·I + i` holds tap `(dy, dx)` of input channel `i`.
/// On the CPU in f32 as BLAS products (blocks of gathered patches times the weight, one sgemm
/// each, or Winograd's tiles, see [`conv2d_same`]); elsewhere MLX's `conv_general`.
#[track_caller]
pub fn conv2d(
    x: &Array,
    weight: &Array,
    bias: &Array,
    k: i32,
    stride: i32,
    padding: (i32, i32),
) -> Result<Array> {
    shim_call!(
        "conv2d",
        mlxs_fast_conv2d(
            x.as_ptr(),
            weight.as_ptr(),
            bias.as_ptr(),
            k,
            stride,
            padding.0,
            padding.1
        )
    )
}

/// How a quantized weight is packed: per-group scales (and biases, in affine mode).
#[derive(Debug, Clone, Copy)]
pub struct Packing<'a> {
    /// One scale per group.
    pub scales: &'a Array,
    /// One offset per group, in affine mode.
    pub biases: Option<&'a Array>,
    /// Values per group.
    pub group_size: i32,
    /// Bits per value.
    pub bits: i32,
    /// How codes, scales and biases make values.
    pub mode: super::QuantMode,
}

/// The inputs of a linear layer's products on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Products {
    /// f32 inputs (the weight widened exactly): the reference's arithmetic.
    #[default]
    F32,
    /// bf16 inputs with f32 sums, on a CPU with AVX512-BF16 (twice f32's rate; elsewhere the
    /// products stay f32): activations and weights rounded to 8 significant bits, as a bf16
    /// run on a GPU rounds them, while everything between the products stays in f32.
    Bf16,
}

static PROCESS_PRODUCTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Products {
    /// What models loaded from now on in this process multiply with, unless their checkpoint
    /// says otherwise: the command line's choice (`--products`).
    pub fn set_for_process(products: Products) {
        PROCESS_PRODUCTS.store(
            products == Products::Bf16,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The choice of [`Products::set_for_process`] (f32 until it is made).
    pub fn for_process() -> Products {
        match PROCESS_PRODUCTS.load(std::sync::atomic::Ordering::Relaxed) {
            true => Products::Bf16,
            false => Products::F32,
        }
    }
}

/// `x · Wᵀ (+ bias)` for `x` `[..., K]` and `W` `[N, K]` as stored: dense in any float dtype,
/// or packed as `packing` says. On the CPU with f32 `x`, a bf16/f16 or affine 2/4/8-bit weight
/// is widened a tile of rows at a time into a reused buffer and multiplied by sgemm, so no f32
/// copy of the layer exists; on a GPU a quantized weight goes through `quantized_matmul`.
#[track_caller]
pub fn linear(
    x: &Array,
    w: &Array,
    packing: Option<Packing<'_>>,
    bias: Option<&Array>,
) -> Result<Array> {
    linear_with(x, w, packing, bias, Products::F32)
}

/// [`linear`] with the products' inputs chosen: with [`Products::Bf16`] on the CPU every weight
/// form (f32 included) is packed in bf16 and multiplied with bf16 inputs.
#[track_caller]
pub fn linear_with(
    x: &Array,
    w: &Array,
    packing: Option<Packing<'_>>,
    bias: Option<&Array>,
    products: Products,
) -> Result<Array> {
    let (scales, biases, group, bits, mode) = match packing {
        Some(p) => (Some(p.scales), p.biases, p.group_size, p.bits, p.mode),
        None => (None, None, 0, 0, super::QuantMode::Affine),
    };
    shim_call!(
        "linear",
        mlxs_fast_linear(
            x.as_ptr(),
            w.as_ptr(),
            Array::opt_ptr(scales),
            Array::opt_ptr(biases),
            Array::opt_ptr(bias),
            group,
            bits,
            mode.as_cstr().as_ptr(),
            c_int::from(products == Products::Bf16),
        )
    )
}

/// Layer norm over the last axis; weight and bias are optional (no affine when absent).
#[track_caller]
pub fn layer_norm(
    x: &Array,
    weight: Option<&Array>,
    bias: Option<&Array>,
    eps: f32,
) -> Result<Array> {
    shim_call!(
        "layer_norm",
        mlxs_fast_layer_norm(
            x.as_ptr(),
            Array::opt_ptr(weight),
            Array::opt_ptr(bias),
            eps,
        )
    )
}

/// Rotary embedding of the first `dims` features of the last axis, positions `offset..` along
/// the second-to-last axis. `traditional` rotates consecutive pairs; otherwise the two halves.
#[track_caller]
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: i32,
    freqs: Option<&Array>,
) -> Result<Array> {
    shim_call!(
        "rope",
        mlxs_fast_rope(
            x.as_ptr(),
            dims,
            traditional as i32,
            base.is_some() as i32,
            base.unwrap_or(0.0),
            scale,
            offset,
            Array::opt_ptr(freqs),
        )
    )
}

/// The attention mask of [`scaled_dot_product_attention`].
#[derive(Debug, Clone, Copy)]
pub enum Mask<'a> {
    /// Every query attends to every key.
    None,
    /// Each query attends to its own and earlier positions only.
    Causal,
    /// Boolean (true = attend) or additive, broadcastable to `[B, H, Lq, Lk]`.
    Array(&'a Array),
}

/// `softmax(q·kᵀ·scale + mask)·v` for `[B, H, L, D]` inputs; k/v may have fewer heads (GQA).
#[track_caller]
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Mask,
) -> Result<Array> {
    let (mode, arr) = match mask {
        Mask::None => ("", None),
        Mask::Causal => ("causal", None),
        Mask::Array(a) => ("array", Some(a)),
    };
    let mode = CString::new(mode).expect("mask modes have no NUL");
    // `mode` outlives the call.
    shim_call!(
        "scaled_dot_product_attention",
        mlxs_fast_scaled_dot_product_attention(
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            scale,
            mode.as_ptr(),
            Array::opt_ptr(arr),
        )
    )
}
