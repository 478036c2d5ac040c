//! A weight in MLX's affine quantization, kept packed.

use super::{fast, ops, Array, Result};

/// Packed u32 values with per-group scales and biases: `w = scale · q + bias` per group of
/// `group_size` consecutive values along the last axis.
#[derive(Debug, Clone)]
pub struct QuantizedTensor {
    pub weight: Array,
    pub scales: Array,
    pub biases: Array,
    pub group_size: i32,
    pub bits: i32,
}

impl QuantizedTensor {
    /// The full-precision weight, in the scales' dtype.
    pub fn dequantize(&self) -> Result<Array> {
        ops::dequantize(
            &self.weight,
            &self.scales,
            &self.biases,
            self.group_size,
            self.bits,
        )
    }

    /// The logical shape `[rows, columns]` of the weight the values stand for.
    pub fn shape(&self) -> Vec<i32> {
        let mut shape = self.weight.shape();
        if let Some(last) = shape.last_mut() {
            *last = *last * 32 / self.bits.max(1);
        }
        shape
    }

    /// Bytes held in memory: packed values, scales and biases.
    pub fn nbytes(&self) -> usize {
        self.weight.nbytes() + self.scales.nbytes() + self.biases.nbytes()
    }

    /// The quantization as [`fast::linear`] takes it.
    pub fn affine(&self) -> fast::Affine<'_> {
        fast::Affine {
            scales: &self.scales,
            biases: &self.biases,
            group_size: self.group_size,
            bits: self.bits,
        }
    }
}
