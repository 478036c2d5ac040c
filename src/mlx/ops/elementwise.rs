//! Elementwise ops: one-input maths as `Array` methods, two-input arithmetic, comparisons and
//! logic with numpy broadcasting, selection, clipping and dtype changes.

use super::scalar_like;
use crate::mlx::array::{shim_call, Array};
use crate::mlx::dtype::Dtype;
use crate::mlx::error::Result;

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $ffi:ident),* $(,)?) => {
        impl Array {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Result<Array> {
                    shim_call!(stringify!($name), $ffi(self.as_ptr()))
                }
            )*
        }
    };
}

unary_methods! {
    /// `-x`.
    neg => mlxs_negative,
    /// `e^x`.
    exp => mlxs_exp,
    /// The natural logarithm.
    log => mlxs_log,
    /// The sine, in radians.
    sin => mlxs_sin,
    /// The cosine, in radians.
    cos => mlxs_cos,
    /// The hyperbolic tangent.
    tanh => mlxs_tanh,
    /// `1 / (1 + e^-x)`.
    sigmoid => mlxs_sigmoid,
    /// The square root.
    sqrt => mlxs_sqrt,
    /// `1 / sqrt(x)`.
    rsqrt => mlxs_rsqrt,
    /// `x · x`.
    square => mlxs_square,
    /// `|x|`.
    abs => mlxs_abs,
    /// The Gauss error function.
    erf => mlxs_erf,
    /// `!x` on booleans.
    logical_not => mlxs_logical_not,
    /// `x · sigmoid(x)`. On the CPU, float32 runs a vectorised kernel of the shim's own, since
    /// MLX's CPU exp is scalar on x86-64 (about 10× slower).
    silu => mlxs_silu,
    /// torch's `GELU(approximate="tanh")`, `½x(1 + tanh(√(2/π)(x + 0.044715x³)))`, computed in
    /// f32 and rounded once to a narrower dtype. On the CPU, f32 runs one pass of the shim's own
    /// on every core (MLX's tanh is libm's, one element at a time on one thread).
    gelu_tanh => mlxs_gelu_tanh,
}

impl Array {
    /// Converts the values to `dtype` (rounding, for a narrower float).
    #[track_caller]
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        let code = dtype.code("astype")?;
        shim_call!("astype", mlxs_astype(self.as_ptr(), code))
    }

    /// Reinterprets the bytes as another dtype of the same or a dividing size.
    #[track_caller]
    pub fn view(&self, dtype: Dtype) -> Result<Array> {
        let code = dtype.code("view")?;
        shim_call!("view", mlxs_view(self.as_ptr(), code))
    }
}

macro_rules! binary_fns {
    ($($(#[$doc:meta])* $name:ident => $ffi:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(a: &Array, b: &Array) -> Result<Array> {
                shim_call!(stringify!($name), $ffi(a.as_ptr(), b.as_ptr()))
            }
        )*
    };
}

binary_fns! {
    /// `a + b`.
    add => mlxs_add,
    /// `a - b`.
    sub => mlxs_subtract,
    /// `a · b`.
    mul => mlxs_multiply,
    /// `a / b`.
    div => mlxs_divide,
    /// The larger of `a` and `b`.
    maximum => mlxs_maximum,
    /// The smaller of `a` and `b`.
    minimum => mlxs_minimum,
    /// `a` to the power `b`.
    power => mlxs_power,
    /// `a == b`, as booleans.
    equal => mlxs_equal,
    /// `a != b`, as booleans.
    not_equal => mlxs_not_equal,
    /// `a < b`, as booleans.
    less => mlxs_less,
    /// `a <= b`, as booleans.
    less_equal => mlxs_less_equal,
    /// `a > b`, as booleans.
    greater => mlxs_greater,
    /// `a >= b`, as booleans.
    greater_equal => mlxs_greater_equal,
    /// `a && b` on booleans.
    logical_and => mlxs_logical_and,
    /// `a || b` on booleans.
    logical_or => mlxs_logical_or,
}

/// Limits values to `[lo, hi]`; either bound may be absent.
#[track_caller]
pub fn clip(a: &Array, lo: Option<f32>, hi: Option<f32>) -> Result<Array> {
    let bound = |v: Option<f32>| v.map(|x| scalar_like(a, x)).transpose();
    let (lo, hi) = (bound(lo)?, bound(hi)?);
    shim_call!(
        "clip",
        mlxs_clip(
            a.as_ptr(),
            Array::opt_ptr(lo.as_ref()),
            Array::opt_ptr(hi.as_ref()),
        )
    )
}

/// `cond ? a : b`, elementwise with broadcasting.
#[track_caller]
pub fn where_(cond: &Array, a: &Array, b: &Array) -> Result<Array> {
    shim_call!("where", mlxs_where(cond.as_ptr(), a.as_ptr(), b.as_ptr()))
}
