//! Affine quantization along the last axis, and products with quantized weights.

use crate::mlx::array::{shim_call, Array};
use crate::mlx::error::{Error, Result};
use crate::mlx::{QuantMode, QuantizedTensor};

/// Affine quantization along the last axis: `(packed u32 weights, scales, biases)`.
#[track_caller]
pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<(Array, Array, Array)> {
    let q = QuantizedTensor::quantize(w, group_size, bits, QuantMode::Affine)?;
    let biases = q
        .biases
        .ok_or_else(|| Error::new("quantize", "affine mode returned no biases"))?;
    Ok((q.weight, q.scales, biases))
}

/// The full-precision weight of an affine quantization, in the scales' dtype.
#[track_caller]
pub fn dequantize(
    wq: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    QuantizedTensor {
        weight: wq.clone(),
        scales: scales.clone(),
        biases: Some(biases.clone()),
        group_size,
        bits,
        mode: QuantMode::Affine,
    }
    .dequantize()
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
