//! A weight in one of MLX's quantizations, kept packed.

use super::array::{check, shim_call};
use super::{fast, ffi, Array, Result};
use std::ffi::CStr;

/// MLX's quantization modes: affine (`w = scale · q + bias` per group) and the float formats
/// with shared per-group exponents or scales and no bias; and one of ours, symmetric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    /// `w = scale · q + bias` per group, unsigned `q` of 2 to 8 bits (Ollama's int8, int4).
    Affine,
    /// OCP's MX 4-bit floats (e2m1), a shared power-of-two scale per group of 32.
    Mxfp4,
    /// OCP's MX 8-bit floats (e4m3), a shared power-of-two scale per group of 32.
    Mxfp8,
    /// NVIDIA's 4-bit floats (e2m1), an fp8 scale per group of 16.
    Nvfp4,
    /// `w = scale · (q − 2^(bits−1))` in f32 per group, unsigned `q` packed as MLX packs affine
    /// weights and no biases: GGUF's Q4_0, Q5_0 and Q8_0 held as they come, their f16 scales
    /// as they are (4.5 bits a weight for Q4_0). MLX runs it as affine, with the biases made
    /// from the scales; MLX's `quantize` makes none.
    Symmetric,
}

impl QuantMode {
    /// The mode's name as MLX spells it, for the shim.
    pub(crate) fn as_cstr(self) -> &'static CStr {
        match self {
            QuantMode::Affine => c"affine",
            QuantMode::Mxfp4 => c"mxfp4",
            QuantMode::Mxfp8 => c"mxfp8",
            QuantMode::Nvfp4 => c"nvfp4",
            QuantMode::Symmetric => c"symmetric",
        }
    }

    /// A stored `quant_type` (Ollama's spellings) as (mode, default group size, bits).
    pub(crate) fn from_quant_type(quant_type: &str) -> Option<(QuantMode, i32, i32)> {
        Some(match quant_type.to_ascii_lowercase().as_str() {
            "int8" | "q8" => (QuantMode::Affine, 64, 8),
            "int4" | "q4" => (QuantMode::Affine, 64, 4),
            // Written by GGUF imports (Q5_0, Q5_1, Q5_K), always with a stated group of 32.
            "int5" => (QuantMode::Affine, 32, 5),
            // ggml's symmetric block types, written by GGUF imports.
            "q4_0" => (QuantMode::Symmetric, 32, 4),
            "q5_0" => (QuantMode::Symmetric, 32, 5),
            "q8_0" => (QuantMode::Symmetric, 32, 8),
            "nvfp4" => (QuantMode::Nvfp4, 16, 4),
            "mxfp8" => (QuantMode::Mxfp8, 32, 8),
            "mxfp4" => (QuantMode::Mxfp4, 32, 4),
            _ => return None,
        })
    }
}

/// Packed u32 values with per-group scales (and biases, in affine mode), along the last axis.
#[derive(Debug, Clone)]
pub struct QuantizedTensor {
    /// The codes, `bits` each, packed into u32s along the last axis.
    pub weight: Array,
    /// One scale per group of `group_size` values.
    pub scales: Array,
    /// One offset per group, in affine mode; `None` in the others.
    pub biases: Option<Array>,
    /// How many consecutive values share a scale (and bias).
    pub group_size: i32,
    /// Bits per value.
    pub bits: i32,
    /// How codes, scales and biases make values.
    pub mode: QuantMode,
}

impl QuantizedTensor {
    /// Quantizes `w` along its last axis.
    pub fn quantize(w: &Array, group_size: i32, bits: i32, mode: QuantMode) -> Result<Self> {
        let (mut q, mut s, mut b) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        // SAFETY: the out-pointers are valid locals; on success the shim fills q and s and sets
        // b to an owned array or null, each owned by us from here on.
        let status = unsafe {
            ffi::mlxs_quantize_mode(
                &mut q,
                &mut s,
                &mut b,
                w.as_ptr(),
                group_size,
                bits,
                mode.as_cstr().as_ptr(),
            )
        };
        check("quantize", status)?;
        let wrap = |p| std::ptr::NonNull::new(p).map(Array::from_raw);
        Ok(QuantizedTensor {
            weight: wrap(q).expect("quantize filled the weight"),
            scales: wrap(s).expect("quantize filled the scales"),
            biases: wrap(b),
            group_size,
            bits,
            mode,
        })
    }

    /// The full-precision weight (in the scales' dtype in affine mode, f32 in symmetric mode).
    pub fn dequantize(&self) -> Result<Array> {
        shim_call!(
            "dequantize",
            mlxs_dequantize_mode(
                self.weight.as_ptr(),
                self.scales.as_ptr(),
                Array::opt_ptr(self.biases.as_ref()),
                self.group_size,
                self.bits,
                self.mode.as_cstr().as_ptr(),
            )
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

    /// The arrays to evaluate to hold it in memory.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = vec![&self.weight, &self.scales];
        all.extend(self.biases.as_ref());
        all
    }

    /// The quantization as [`fast::linear`] takes it.
    pub fn packing(&self) -> fast::Packing<'_> {
        fast::Packing {
            scales: &self.scales,
            biases: self.biases.as_ref(),
            group_size: self.group_size,
            bits: self.bits,
            mode: self.mode,
        }
    }
}
