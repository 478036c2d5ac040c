// CPU kernels for what MLX's CPU backend runs slowly on x86-64 (its exp is scalar there, its
// convolutions do not reach the BLAS), written as MLX primitives so that they take part in lazy
// graphs like any other op. Each falls back to MLX's own ops on a GPU or in other dtypes.
#pragma once

#include <optional>
#include <string>

#include "mlx/mlx.h"

namespace mlxs {

// x · sigmoid(x): the fast kernel for a float32 input on a CPU stream, MLX's own ops otherwise;
// float16 and bfloat16 compute in float32 and round once.
mlx::core::array silu(const mlx::core::array& x);

// ½x(1 + tanh(√(2/π)(x + 0.044715x³))), torch's GELU(approximate="tanh"): one pass on every
// core for float32 on a CPU stream, MLX's own ops otherwise; float16 and bfloat16 compute in
// float32 and round once.
mlx::core::array gelu_tanh(const mlx::core::array& x);

// Attention over [B, H, S, D] inputs, unmasked, causal or with an additive mask, with grouped kv
// heads. On the CPU it is composed from BLAS products in f32 and a one-pass softmax kernel (MLX's
// CPU path spends most of its time in a scalar exp), and a narrower dtype rounds where torch's
// CPU kernel does; elsewhere, and for masks other than float32 ones on float32 inputs, it is
// MLX's fused kernel.
mlx::core::array attention(const mlx::core::array& q, const mlx::core::array& k, const mlx::core::array& v,
                           float scale, bool causal, const std::optional<mlx::core::array>& mask);

// GroupNorm over [B, ..., C] with PyTorch's grouping (consecutive channels), statistics in f32,
// then SiLU when `silu` is set. A fused three-pass kernel for float32 on the CPU; MLX's ops
// otherwise, which round the result to the input's dtype before the SiLU.
mlx::core::array group_norm(const mlx::core::array& x, const mlx::core::array& weight, const mlx::core::array& bias,
                            int groups, float eps, bool silu);

// A convolution of NHWC `x` by a k×k kernel with a stride, `pad_lo` zero rows and columns before
// the input and `pad_hi` after (each below k), given as the [k·k·I, O] matrix whose row
// (dy·k + dx)·I + i holds tap (dy, dx), input channel i; plus a per-channel bias. On the CPU in
// float32 as BLAS products: a stride-1 "same" 3×3 by Winograd's F(2×2, 3×3) (16 products per
// block of tiles), anything else as blocks of gathered patches times the weight; MLX's
// conv_general elsewhere.
mlx::core::array conv2d(const mlx::core::array& x, const mlx::core::array& weight, const mlx::core::array& bias, int k,
                        int stride, int pad_lo, int pad_hi);

// The stride-1 "same" 3×3 case of conv2d on `x` enlarged `upsample` (1 or 2) times by nearest
// neighbour, plus `residual` (shaped as the output) when given: on the CPU in float32 one pass
// that makes neither the enlarged input nor the sum's operand; elsewhere the steps one by one.
mlx::core::array conv3x3_same(const mlx::core::array& x, const mlx::core::array& weight, const mlx::core::array& bias,
                              int upsample, const std::optional<mlx::core::array>& residual);

// The modes MLX quantizes in, plus "symmetric": packed unsigned q with per-group scales and no
// biases, value = scale · (q − 2^(bits−1)) computed in float32 (GGUF's Q4_0, Q5_0 and Q8_0 as
// they come, their f16 scales kept as they are).
//
// A symmetric weight's scales, as dtype, with the affine biases that give the same values.
std::pair<mlx::core::array, mlx::core::array> symmetric_as_affine(const mlx::core::array& scales, int bits,
                                                                   mlx::core::Dtype dtype);

// Whether `linear`'s bf16 products run here (a CPU with AVX512-BF16).
bool bf16_products_available();

// MLX's dequantize for its modes; a symmetric weight in float32, exactly.
mlx::core::array dequantize(const mlx::core::array& w, const mlx::core::array& scales,
                            const std::optional<mlx::core::array>& biases, int group_size, int bits,
                            const std::string& mode);

// y = x · Wᵀ (+ bias) for x [..., K] and W [N, K] kept as stored: dense in any float dtype, or
// quantized (packed uint32 weight with scales and biases, group_size, bits, mode). On the CPU
// with float32 x, a bf16/f16 or 2/4/8-bit weight is widened a tile of rows at a time into a
// reused buffer and multiplied by sgemm, so no float32 copy of the layer is ever made;
// elsewhere quantized_matmul (GPU) or MLX's dequantize and matmul. `bf16_products` lets the CPU
// kernel multiply in bf16 with float32 sums (any weight form, float32 included) where the CPU
// has AVX512-BF16: about twice the rate, inputs rounded to 8 significant bits.
mlx::core::array linear(const mlx::core::array& x, const mlx::core::array& w,
                        const std::optional<mlx::core::array>& scales, const std::optional<mlx::core::array>& biases,
                        const std::optional<mlx::core::array>& bias, int group_size, int bits,
                        const std::string& mode, bool bf16_products);

// RMS norm over the last axis times `weight` ([N] or any shape of N values), plus `residual`
// when given: one pass on every core for float32 on the CPU; MLX's rms_norm (and add) otherwise.
mlx::core::array rms_norm(const mlx::core::array& x, const mlx::core::array& weight, float eps,
                          const std::optional<mlx::core::array>& residual);

// The fused q|k|v projections of S tokens, [S, 3·H·D], as attention takes them: [3, H, S, D]
// with q and k RMS-normed per head (weights of D values, `eps`) and rotated by RoPE's interleaved
// pairs (cos and sin of S·D/2 angles), and q times `q_scale`. One pass on the CPU in float32.
mlx::core::array qkv_heads(const mlx::core::array& qkv, const mlx::core::array& q_weight,
                           const mlx::core::array& k_weight, const mlx::core::array& cos,
                           const mlx::core::array& sin, int heads, float eps, float q_scale);

// Unmasked attention of qkv_heads' [3, H, S, D] (q already scaled) → [S, H·D]. On the CPU in
// float32, BLAS products per head written straight into the heads' columns, with a one-pass
// softmax across the cores; `attention` and a transpose otherwise.
mlx::core::array attention_rows(const mlx::core::array& qkv);

// attention_rows(qkv_heads(...)) in one step: [S, 3·H·D] → [S, H·D]. On the CPU in float32 each
// core takes whole heads, norming and rotating each head's q and k into buffers of its own and
// reading v in place; the two steps elsewhere.
mlx::core::array qkv_attention(const mlx::core::array& qkv, const mlx::core::array& q_weight,
                               const mlx::core::array& k_weight, const mlx::core::array& cos,
                               const mlx::core::array& sin, int heads, float eps, float q_scale);

// [..., 2F] → [..., F]: SiLU of the first half of the last axis times the second half.
mlx::core::array silu_gate(const mlx::core::array& x);

}  // namespace mlxs
