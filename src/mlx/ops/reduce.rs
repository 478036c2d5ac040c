//! Reductions and normalisations over axes (all axes when the list is empty).

use crate::mlx::array::{shim_call, Array};
use crate::mlx::error::Result;

macro_rules! reductions {
    ($($name:ident => $ffi:ident),* $(,)?) => {
        impl Array {
            $(
                /// Reduces over `axes` (all axes when empty).
                #[track_caller]
                pub fn $name(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
                    shim_call!(
                        stringify!($name),
                        $ffi(self.as_ptr(), axes.as_ptr(), axes.len(), keepdims as i32)
                    )
                }
            )*
        }
    };
}

reductions! { sum => mlxs_sum, mean => mlxs_mean, max => mlxs_max, min => mlxs_min, argmax => mlxs_argmax }

impl Array {
    /// Variance over `axes` (all when empty) with `ddof` delta degrees of freedom.
    #[track_caller]
    pub fn var(&self, axes: &[i32], keepdims: bool, ddof: i32) -> Result<Array> {
        shim_call!(
            "var",
            mlxs_var(
                self.as_ptr(),
                axes.as_ptr(),
                axes.len(),
                keepdims as i32,
                ddof,
            )
        )
    }

    /// Softmax over `axes` (all when empty); `precise` accumulates in f32 for half types.
    #[track_caller]
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array> {
        shim_call!(
            "softmax",
            mlxs_softmax(self.as_ptr(), axes.as_ptr(), axes.len(), precise as i32)
        )
    }
}
