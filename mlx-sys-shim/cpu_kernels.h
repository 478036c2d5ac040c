// Elementwise kernels that MLX's CPU backend runs slowly on x86-64 (its exp is scalar there),
// written as MLX primitives so that they take part in lazy graphs like any other op.
#pragma once

#include "mlx/mlx.h"

namespace mlxs {

// x · sigmoid(x): the fast kernel for a float32 input on a CPU stream, MLX's own ops otherwise;
// float16 and bfloat16 compute in float32 and round once.
mlx::core::array silu(const mlx::core::array& x);

// e^x, the same way, for x in [-87, 88] (infinity above, zero below).
mlx::core::array exp(const mlx::core::array& x);

// Unmasked attention over [B, H, S, D] inputs; in float32 on the CPU, composed from BLAS
// products and the exp kernel (MLX's CPU path spends most of its time in a scalar exp),
// otherwise MLX's fused kernel.
mlx::core::array attention(const mlx::core::array& q, const mlx::core::array& k, const mlx::core::array& v,
                           float scale);

}  // namespace mlxs
