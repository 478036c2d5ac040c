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
    neg => mlxs_negative,
    exp => mlxs_exp,
    log => mlxs_log,
    sin => mlxs_sin,
    cos => mlxs_cos,
    tanh => mlxs_tanh,
    sigmoid => mlxs_sigmoid,
    sqrt => mlxs_sqrt,
    rsqrt => mlxs_rsqrt,
    square => mlxs_square,
    abs => mlxs_abs,
    erf => mlxs_erf,
    logical_not => mlxs_logical_not,
    /// `x · sigmoid(x)`. On the CPU, float32 runs a vectorised kernel of the shim's own, since
    /// MLX's CPU exp is scalar on x86-64 (about 10× slower).
    silu => mlxs_silu,
}

impl Array {
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
    add => mlxs_add,
    sub => mlxs_subtract,
    mul => mlxs_multiply,
    div => mlxs_divide,
    maximum => mlxs_maximum,
    minimum => mlxs_minimum,
    power => mlxs_power,
    equal => mlxs_equal,
    not_equal => mlxs_not_equal,
    less => mlxs_less,
    less_equal => mlxs_less_equal,
    greater => mlxs_greater,
    greater_equal => mlxs_greater_equal,
    logical_and => mlxs_logical_and,
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
