//! Operations, mirroring `mlx/ops.h`: single-input ops are `Array` methods, the rest are free
//! functions here. Arithmetic operators return `Result` too, so `(&x + &h)?` composes.
//!
//! The code is split by family (elementwise, reductions, shape, linear algebra, quantization);
//! every free function is re-exported here, so callers name them `ops::X`.

mod elementwise;
mod linalg;
mod quantize;
mod reduce;
mod shape;

pub use elementwise::{
    add, clip, div, equal, greater, greater_equal, less, less_equal, logical_and, logical_or,
    maximum, minimum, mul, not_equal, power, sub, where_,
};
pub use linalg::{addmm, conv2d, matmul};
pub use quantize::{dequantize, quantize, quantized_matmul};
pub use shape::{concatenate, pad, split, split_at, stack};

use super::array::Array;
use super::dtype::Dtype;
use super::error::Result;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// A scalar in `like`'s dtype when that is a float type (f32 otherwise), so that scalar
/// arithmetic never promotes a bf16 activation to f32 behind the caller's back.
#[track_caller]
pub(crate) fn scalar_like(like: &Array, v: f32) -> Result<Array> {
    let dt = if like.dtype().is_float() {
        like.dtype()
    } else {
        Dtype::F32
    };
    Array::full(&[], v, dt)
}

macro_rules! operator {
    ($trait:ident, $method:ident, $f:ident) => {
        impl $trait<&Array> for &Array {
            type Output = Result<Array>;
            #[track_caller]
            fn $method(self, rhs: &Array) -> Result<Array> {
                $f(self, rhs)
            }
        }
        impl $trait<Array> for &Array {
            type Output = Result<Array>;
            #[track_caller]
            fn $method(self, rhs: Array) -> Result<Array> {
                $f(self, &rhs)
            }
        }
        impl $trait<&Array> for Array {
            type Output = Result<Array>;
            #[track_caller]
            fn $method(self, rhs: &Array) -> Result<Array> {
                $f(&self, rhs)
            }
        }
        impl $trait<Array> for Array {
            type Output = Result<Array>;
            #[track_caller]
            fn $method(self, rhs: Array) -> Result<Array> {
                $f(&self, &rhs)
            }
        }
        impl $trait<f32> for &Array {
            type Output = Result<Array>;
            #[track_caller]
            fn $method(self, rhs: f32) -> Result<Array> {
                $f(self, &scalar_like(self, rhs)?)
            }
        }
        impl $trait<f32> for Array {
            type Output = Result<Array>;
            #[track_caller]
            fn $method(self, rhs: f32) -> Result<Array> {
                $f(&self, &scalar_like(&self, rhs)?)
            }
        }
    };
}

operator!(Add, add, add);
operator!(Sub, sub, sub);
operator!(Mul, mul, mul);
operator!(Div, div, div);

impl Neg for &Array {
    type Output = Result<Array>;
    #[track_caller]
    fn neg(self) -> Result<Array> {
        Array::neg(self)
    }
}

impl Neg for Array {
    type Output = Result<Array>;
    #[track_caller]
    fn neg(self) -> Result<Array> {
        Array::neg(&self)
    }
}
