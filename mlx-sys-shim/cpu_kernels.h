// Elementwise kernels that MLX's CPU backend runs slowly on x86-64 (its exp is scalar there),
// written as MLX primitives so that they take part in lazy graphs like any other op.
#pragma once

#include "mlx/mlx.h"

namespace mlxs {

// x · sigmoid(x): the fast kernel for a float32 input on a CPU stream, MLX's own ops otherwise.
mlx::core::array silu(const mlx::core::array& x);

}  // namespace mlxs
