//! A tensor an import reads, as a byte range of a file, and the small pieces both import paths
//! (plain values and ggml blocks) share: its layer in the manifest, its bytes as a stream, and
//! the check for values that are not finite.

use super::manifest::{Layer, TENSOR_MEDIA_TYPE};
use super::StoreError;
use crate::files::FileError;
use crate::safetensors::Dtype;
use half::{bf16, f16};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

/// One tensor to import and where its little-endian bytes are.
#[derive(Debug, Clone)]
pub struct SourceTensor {
    /// The component it goes under (`transformer`).
    pub component: String,
    /// The name inside the component (`model.layers.0.mlp.down_proj.weight`).
    pub name: String,
    /// The element type of plain bytes; for ggml blocks, the type their values widen to (F32).
    pub dtype: Dtype,
    /// Its shape, in torch's order.
    pub shape: Vec<u64>,
    /// The file holding its bytes.
    pub file: PathBuf,
    /// Where in `file` its first byte is.
    pub offset: u64,
    /// How many bytes it takes there.
    pub nbytes: u64,
    /// How those bytes encode its values.
    pub encoding: Encoding,
    /// The tensor's bytes start this far into the range and wrap around to its start: the
    /// range's halves swapped, say, when a layout orders a tensor's row blocks the other way
    /// (0 for a tensor read as it lies).
    pub roll: u64,
}

/// How a source tensor's bytes encode its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Dense little-endian values of `dtype`, as safetensors holds them.
    #[default]
    Plain,
    /// Blocks of a ggml type along each row (a GGUF tensor).
    Ggml(crate::ggml::GgmlType),
}

impl SourceTensor {
    /// Rows `start..end` along the first (torch) axis, without reading anything: rows are
    /// contiguous in every encoding (ggml blocks never cross a row). `None` when the range is
    /// outside the tensor, the tensor has no axis or its bytes are rolled.
    pub fn rows(&self, start: u64, end: u64) -> Option<SourceTensor> {
        let first = *self.shape.first()?;
        if start > end || end > first || self.roll != 0 {
            return None;
        }
        let row_bytes = self.nbytes.checked_div(first).unwrap_or(0);
        let mut out = self.clone();
        out.shape[0] = end - start;
        out.offset = self.offset + start * row_bytes;
        out.nbytes = (end - start) * row_bytes;
        Some(out)
    }
}

pub(super) fn tensor_layer(
    t: &SourceTensor,
    digest: String,
    size: u64,
    dtype: Dtype,
    shape: Vec<u64>,
) -> Layer {
    Layer {
        media_type: TENSOR_MEDIA_TYPE.into(),
        digest,
        size,
        from: None,
        name: Some(format!("{}/{}", t.component, t.name)),
        dtype: Some(dtype.name().into()),
        shape: Some(shape),
    }
}

pub(super) fn open_range(t: &SourceTensor) -> Result<impl Read, StoreError> {
    let io = FileError::io(&t.file);
    let roll = t.roll.min(t.nbytes);
    let part = |start: u64, len: u64| -> Result<_, StoreError> {
        let mut f = std::fs::File::open(&t.file).map_err(&io)?;
        f.seek(SeekFrom::Start(t.offset + start)).map_err(&io)?;
        Ok(std::io::BufReader::with_capacity(1 << 20, f).take(len))
    };
    Ok(part(roll, t.nbytes - roll)?.chain(part(0, roll)?))
}

/// The first value of `bytes` (little-endian `dtype`) that is NaN or infinite: its index and
/// its value in words. Only float types can hold one.
pub fn first_non_finite(bytes: &[u8], dtype: Dtype) -> Option<(u64, String)> {
    let found = |i: usize, v: f32| Some((i as u64, describe_non_finite(v)));
    match dtype {
        Dtype::F32 => (bytes.chunks_exact(4).enumerate())
            .map(|(i, c)| (i, f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .find(|(_, v)| !v.is_finite())
            .and_then(|(i, v)| found(i, v)),
        // An all-ones exponent is NaN or infinity, in both 16-bit formats.
        Dtype::F16 => (bytes.chunks_exact(2).enumerate())
            .find(|(_, c)| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00)
            .and_then(|(i, c)| found(i, f16::from_le_bytes([c[0], c[1]]).to_f32())),
        Dtype::BF16 => (bytes.chunks_exact(2).enumerate())
            .find(|(_, c)| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80)
            .and_then(|(i, c)| found(i, bf16::from_le_bytes([c[0], c[1]]).to_f32())),
        d if crate::fp8::is_fp8(d) => (bytes.iter().enumerate())
            .map(|(i, &b)| (i, crate::fp8::to_f32(b, d)))
            .find(|(_, v)| !v.is_finite())
            .and_then(|(i, v)| found(i, v)),
        Dtype::F64 => (bytes.chunks_exact(8).enumerate())
            .map(|(i, c)| (i, f64::from_le_bytes(c.try_into().expect("8 bytes"))))
            .find(|(_, v)| !v.is_finite())
            .and_then(|(i, v)| found(i, v as f32)),
        _ => None,
    }
}

/// `NaN`, `+inf` or `-inf`.
pub fn describe_non_finite(v: f32) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v > 0.0 {
        "+inf".into()
    } else {
        "-inf".into()
    }
}

/// The error for tensor `t` holding `value` at `index`.
pub(super) fn non_finite(t: &SourceTensor, index: u64, value: String) -> StoreError {
    StoreError::NonFinite {
        file: t.file.clone(),
        component: t.component.clone(),
        tensor: t.name.clone(),
        value,
        index,
    }
}
