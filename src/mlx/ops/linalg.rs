//! Matrix products and convolution.

use crate::mlx::array::{shim_call, Array};
use crate::mlx::error::Result;

/// Matrix product with numpy broadcasting over leading axes.
#[track_caller]
pub fn matmul(a: &Array, b: &Array) -> Result<Array> {
    shim_call!("matmul", mlxs_matmul(a.as_ptr(), b.as_ptr()))
}

impl Array {
    /// `self @ rhs`: the free function [`matmul`] as a method.
    #[track_caller]
    pub fn matmul(&self, rhs: &Array) -> Result<Array> {
        matmul(self, rhs)
    }
}

/// `alpha · (a @ b) + beta · c`.
#[track_caller]
pub fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
    shim_call!(
        "addmm",
        mlxs_addmm(c.as_ptr(), a.as_ptr(), b.as_ptr(), alpha, beta)
    )
}

/// 2-D convolution, channels last: `x` is NHWC, `w` is `[O, kh, kw, I/groups]`.
#[track_caller]
pub fn conv2d(
    x: &Array,
    w: &Array,
    stride: (i32, i32),
    padding: (i32, i32),
    dilation: (i32, i32),
    groups: i32,
) -> Result<Array> {
    shim_call!(
        "conv2d",
        mlxs_conv2d(
            x.as_ptr(),
            w.as_ptr(),
            stride.0,
            stride.1,
            padding.0,
            padding.1,
            dilation.0,
            dilation.1,
            groups,
        )
    )
}
