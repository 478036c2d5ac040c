//! Affine quantization along the last axis, and products with quantized weights.

use crate::mlx::array::{check, shim_call, Array};
use crate::mlx::error::Result;
use crate::mlx::ffi;
use std::ptr::{null_mut, NonNull};

/// Affine quantization along the last axis: `(packed u32 weights, scales, biases)`.
#[track_caller]
pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<(Array, Array, Array)> {
    let (mut q, mut s, mut b) = (null_mut(), null_mut(), null_mut());
    // SAFETY: the three out-pointers are locals the shim writes once each on success; `w` is a
    // live handle borrowed for the call.
    let status =
        unsafe { ffi::mlxs_quantize(&mut q, &mut s, &mut b, w.as_ptr(), group_size, bits) };
    check("quantize", status)?;
    let wrap = |p| Array::from_raw(NonNull::new(p).expect("quantize filled its outputs"));
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
    shim_call!(
        "dequantize",
        mlxs_dequantize(
            wq.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            group_size,
            bits,
        )
    )
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
    shim_call!(
        "quantized_matmul",
        mlxs_quantized_matmul(
            x.as_ptr(),
            wq.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            transpose as i32,
            group_size,
            bits,
        )
    )
}
