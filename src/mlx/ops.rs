//! Operations, mirroring `mlx/ops.h`: single-input ops are `Array` methods, the rest are free
//! functions here. Arithmetic operators return `Result` too, so `(&x + &h)?` composes.

use super::array::{call, check, Array};
use super::dtype::Dtype;
use super::error::{Error, Result};
use super::ffi;
use std::ops::{Add, Div, Mul, Neg, Sub};

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $ffi:ident),* $(,)?) => {
        impl Array {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Result<Array> {
                    call(stringify!($name), |out| unsafe { ffi::$ffi(out, self.as_ptr()) })
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
}

macro_rules! reductions {
    ($($name:ident => $ffi:ident),* $(,)?) => {
        impl Array {
            $(
                /// Reduces over `axes` (all axes when empty).
                #[track_caller]
                pub fn $name(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
                    call(stringify!($name), |out| unsafe {
                        ffi::$ffi(out, self.as_ptr(), axes.as_ptr(), axes.len(), keepdims as i32)
                    })
                }
            )*
        }
    };
}

reductions! { sum => mlxs_sum, mean => mlxs_mean, max => mlxs_max, min => mlxs_min, argmax => mlxs_argmax }

impl Array {
    /// `x · sigmoid(x)`. On the CPU, float32 runs a vectorised kernel of the shim's own, since
    /// MLX's CPU exp is scalar on x86-64 (about 10× slower).
    #[track_caller]
    pub fn silu(&self) -> Result<Array> {
        call("silu", |out| unsafe { ffi::mlxs_silu(out, self.as_ptr()) })
    }

    #[track_caller]
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        call("astype", |out| unsafe {
            ffi::mlxs_astype(out, self.as_ptr(), dtype.code())
        })
    }

    /// Reinterprets the bytes as another dtype of the same or a dividing size.
    #[track_caller]
    pub fn view(&self, dtype: Dtype) -> Result<Array> {
        call("view", |out| unsafe {
            ffi::mlxs_view(out, self.as_ptr(), dtype.code())
        })
    }

    #[track_caller]
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        call("reshape", |out| unsafe {
            ffi::mlxs_reshape(out, self.as_ptr(), shape.as_ptr(), shape.len())
        })
    }

    #[track_caller]
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        call("transpose", |out| unsafe {
            ffi::mlxs_transpose(out, self.as_ptr(), axes.as_ptr(), axes.len())
        })
    }

    #[track_caller]
    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        call("swapaxes", |out| unsafe {
            ffi::mlxs_swapaxes(out, self.as_ptr(), a, b)
        })
    }

    #[track_caller]
    pub fn expand_dims(&self, axis: i32) -> Result<Array> {
        call("expand_dims", |out| unsafe {
            ffi::mlxs_expand_dims(out, self.as_ptr(), axis)
        })
    }

    #[track_caller]
    pub fn squeeze(&self, axis: i32) -> Result<Array> {
        call("squeeze", |out| unsafe {
            ffi::mlxs_squeeze(out, self.as_ptr(), axis)
        })
    }

    #[track_caller]
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        call("broadcast_to", |out| unsafe {
            ffi::mlxs_broadcast_to(out, self.as_ptr(), shape.as_ptr(), shape.len())
        })
    }

    /// Repeats each element `repeats` times along `axis` (`[a, b]` → `[a, a, b, b]`).
    #[track_caller]
    pub fn repeat(&self, repeats: i32, axis: i32) -> Result<Array> {
        call("repeat", |out| unsafe {
            ffi::mlxs_repeat(out, self.as_ptr(), repeats, axis)
        })
    }

    /// `self[start:stop:strides]`, one entry per axis.
    #[track_caller]
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        let n = self.ndim();
        if start.len() != n || stop.len() != n || strides.len() != n {
            return Err(Error::new(
                "slice",
                format!(
                    "needs {n} start, stop and stride values for shape {:?}",
                    self.shape()
                ),
            ));
        }
        call("slice", |out| unsafe {
            ffi::mlxs_slice(
                out,
                self.as_ptr(),
                start.as_ptr(),
                stop.as_ptr(),
                strides.as_ptr(),
                n,
            )
        })
    }

    /// `self[..., start:stop, ...]` along one axis.
    #[track_caller]
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        let shape = self.shape();
        let n = shape.len() as i32;
        let ax = if axis < 0 { axis + n } else { axis };
        if ax < 0 || ax >= n {
            return Err(Error::new(
                "slice_axis",
                format!("axis {axis} out of range for shape {shape:?}"),
            ));
        }
        let mut lo = vec![0; shape.len()];
        let mut hi = shape.clone();
        lo[ax as usize] = start;
        hi[ax as usize] = stop;
        self.slice(&lo, &hi, &vec![1; shape.len()])
    }

    /// Gathers along `axis` with integer `indices`.
    #[track_caller]
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        call("take", |out| unsafe {
            ffi::mlxs_take(out, self.as_ptr(), indices.as_ptr(), axis)
        })
    }

    #[track_caller]
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        call("take_along_axis", |out| unsafe {
            ffi::mlxs_take_along_axis(out, self.as_ptr(), indices.as_ptr(), axis)
        })
    }

    /// Variance over `axes` (all when empty) with `ddof` delta degrees of freedom.
    #[track_caller]
    pub fn var(&self, axes: &[i32], keepdims: bool, ddof: i32) -> Result<Array> {
        call("var", |out| unsafe {
            ffi::mlxs_var(
                out,
                self.as_ptr(),
                axes.as_ptr(),
                axes.len(),
                keepdims as i32,
                ddof,
            )
        })
    }

    /// Softmax over `axes` (all when empty); `precise` accumulates in f32 for half types.
    #[track_caller]
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array> {
        call("softmax", |out| unsafe {
            ffi::mlxs_softmax(
                out,
                self.as_ptr(),
                axes.as_ptr(),
                axes.len(),
                precise as i32,
            )
        })
    }

    #[track_caller]
    pub fn matmul(&self, rhs: &Array) -> Result<Array> {
        matmul(self, rhs)
    }
}

macro_rules! binary_fns {
    ($($(#[$doc:meta])* $name:ident => $ffi:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(a: &Array, b: &Array) -> Result<Array> {
                call(stringify!($name), |out| unsafe { ffi::$ffi(out, a.as_ptr(), b.as_ptr()) })
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
    /// Matrix product with numpy broadcasting over leading axes.
    matmul => mlxs_matmul,
}

/// Limits values to `[lo, hi]`; either bound may be absent.
#[track_caller]
pub fn clip(a: &Array, lo: Option<f32>, hi: Option<f32>) -> Result<Array> {
    let bound = |v: Option<f32>| v.map(|x| scalar_like(a, x)).transpose();
    let (lo, hi) = (bound(lo)?, bound(hi)?);
    call("clip", |out| unsafe {
        ffi::mlxs_clip(
            out,
            a.as_ptr(),
            Array::opt_ptr(lo.as_ref()),
            Array::opt_ptr(hi.as_ref()),
        )
    })
}

/// `cond ? a : b`, elementwise with broadcasting.
#[track_caller]
pub fn where_(cond: &Array, a: &Array, b: &Array) -> Result<Array> {
    call("where", |out| unsafe {
        ffi::mlxs_where(out, cond.as_ptr(), a.as_ptr(), b.as_ptr())
    })
}

/// `alpha · (a @ b) + beta · c`.
#[track_caller]
pub fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
    call("addmm", |out| unsafe {
        ffi::mlxs_addmm(out, c.as_ptr(), a.as_ptr(), b.as_ptr(), alpha, beta)
    })
}

#[track_caller]
pub fn concatenate(xs: &[&Array], axis: i32) -> Result<Array> {
    let ptrs: Vec<_> = xs.iter().map(|x| x.as_ptr()).collect();
    call("concatenate", |out| unsafe {
        ffi::mlxs_concatenate(out, ptrs.as_ptr(), ptrs.len(), axis)
    })
}

#[track_caller]
pub fn stack(xs: &[&Array], axis: i32) -> Result<Array> {
    let ptrs: Vec<_> = xs.iter().map(|x| x.as_ptr()).collect();
    call("stack", |out| unsafe {
        ffi::mlxs_stack(out, ptrs.as_ptr(), ptrs.len(), axis)
    })
}

/// Splits into `parts` equal pieces along `axis`.
#[track_caller]
pub fn split(a: &Array, parts: i32, axis: i32) -> Result<Vec<Array>> {
    split_impl(a, parts, &[], axis, parts.max(0) as usize)
}

/// Splits before each of `indices` along `axis` (`indices.len() + 1` pieces).
#[track_caller]
pub fn split_at(a: &Array, indices: &[i32], axis: i32) -> Result<Vec<Array>> {
    split_impl(a, 0, indices, axis, indices.len() + 1)
}

#[track_caller]
fn split_impl(a: &Array, parts: i32, indices: &[i32], axis: i32, max: usize) -> Result<Vec<Array>> {
    let mut outs = vec![std::ptr::null_mut(); max];
    let mut count = 0usize;
    let status = unsafe {
        ffi::mlxs_split(
            outs.as_mut_ptr(),
            max,
            &mut count,
            a.as_ptr(),
            parts,
            indices.as_ptr(),
            indices.len(),
            axis,
        )
    };
    check("split", status)?;
    Ok(outs[..count]
        .iter()
        .map(|&p| Array::from_raw(std::ptr::NonNull::new(p).expect("split filled every piece")))
        .collect())
}

/// Pads with a constant; one `(before, after)` pair per axis.
#[track_caller]
pub fn pad(a: &Array, widths: &[(i32, i32)], value: f32) -> Result<Array> {
    if widths.len() != a.ndim() {
        return Err(Error::new(
            "pad",
            format!(
                "needs {} (low, high) pairs for shape {:?}, got {}",
                a.ndim(),
                a.shape(),
                widths.len()
            ),
        ));
    }
    let low: Vec<i32> = widths.iter().map(|w| w.0).collect();
    let high: Vec<i32> = widths.iter().map(|w| w.1).collect();
    call("pad", |out| unsafe {
        ffi::mlxs_pad(
            out,
            a.as_ptr(),
            low.as_ptr(),
            high.as_ptr(),
            low.len(),
            value,
        )
    })
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
    call("conv2d", |out| unsafe {
        ffi::mlxs_conv2d(
            out,
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
    })
}

/// Affine quantization along the last axis: `(packed u32 weights, scales, biases)`.
#[track_caller]
pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<(Array, Array, Array)> {
    let (mut q, mut s, mut b) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let status =
        unsafe { ffi::mlxs_quantize(&mut q, &mut s, &mut b, w.as_ptr(), group_size, bits) };
    check("quantize", status)?;
    let wrap = |p| Array::from_raw(std::ptr::NonNull::new(p).expect("quantize filled its outputs"));
    Ok((wrap(q), wrap(s), wrap(b)))
}

#[track_caller]
pub fn dequantize(
    wq: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    call("dequantize", |out| unsafe {
        ffi::mlxs_dequantize(
            out,
            wq.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            group_size,
            bits,
        )
    })
}

/// `x @ dequantize(w)ᵀ` (or without the transpose), without materialising the weights.
#[track_caller]
pub fn quantized_matmul(
    x: &Array,
    wq: &Array,
    scales: &Array,
    biases: &Array,
    transpose: bool,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    call("quantized_matmul", |out| unsafe {
        ffi::mlxs_quantized_matmul(
            out,
            x.as_ptr(),
            wq.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            transpose as i32,
            group_size,
            bits,
        )
    })
}

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
