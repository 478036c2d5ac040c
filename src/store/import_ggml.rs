//! Importing a tensor held in ggml blocks (a GGUF file's): into MLX affine quantization with
//! group 32 where the values map exactly, re-quantized by MLX where they cannot, or widened to
//! f32 where the tensor is no matrix. See [`crate::ggml`] for which type takes which path.
//!
//! Quantized results are Ollama's v2 quantized blob (the packed weight, `.scale`, `.bias`,
//! `quant_type` and `group_size` in the metadata, which the loader already reads), with the
//! ggml type the values came from recorded beside them. The symmetric types (Q4_0, Q5_0, Q8_0)
//! have no `.bias`, f16 scales and their own `quant_type` (`q4_0` …).

use super::blob::{self, BlobWriter};
use super::manifest::Layer;
use super::source_tensor::{
    describe_non_finite, non_finite, open_range, tensor_layer, SourceTensor,
};
use super::{Store, StoreError};
use crate::files::FileError;
use crate::ggml::{self, Affine, GgmlType, ImportPath, GROUP};
use crate::mlx::{self, QuantMode, QuantizedTensor};
use crate::safetensors::{header_bytes, Dtype, TensorSpec};
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Mutex;

/// What became of an import's ggml-encoded tensors.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GgmlReport {
    /// Tensors per path, e.g. `Q4_0 → int4, group 32 (exact)`.
    pub paths: BTreeMap<String, usize>,
    /// The largest `|stored − source|` of any re-quantized value, and its tensor.
    pub max_requantize_error: Option<(String, f32)>,
}

impl GgmlReport {
    fn count(&mut self, path: String) {
        *self.paths.entry(path).or_default() += 1;
    }

    fn error(&mut self, tensor: &str, err: f32) {
        if self
            .max_requantize_error
            .as_ref()
            .is_none_or(|(_, e)| err > *e)
        {
            self.max_requantize_error = Some((tensor.to_string(), err));
        }
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl Store {
    /// One ggml-encoded tensor as a blob; `report` learns the path it took.
    pub(super) fn write_ggml(
        &self,
        t: &SourceTensor,
        ty: GgmlType,
        align: u64,
        report: &Mutex<GgmlReport>,
    ) -> Result<Vec<(Layer, bool)>, StoreError> {
        let unsupported = || StoreError::GgmlUnsupported {
            file: t.file.clone(),
            tensor: t.name.clone(),
            ty,
        };
        let path = ty.import_path().ok_or_else(unsupported)?;
        let mut bytes = vec![0u8; t.nbytes as usize];
        open_range(t)?
            .read_exact(&mut bytes)
            .map_err(FileError::io(&t.file))?;
        check_finite(t, ty, &bytes)?;
        let note = |path: String| report.lock().unwrap_or_else(|e| e.into_inner()).count(path);
        // Quantization runs along rows of a matrix; anything else is widened, exactly.
        let (rows, cols) = match t.shape.as_slice() {
            [rows, cols] if *rows > 0 => (*rows, *cols),
            _ => {
                let values = ggml::dequantize(ty, &bytes).ok_or_else(unsupported)?;
                note(format!("{ty} → F32 (not a matrix; exact)"));
                return self.write_plain_f32(t, &values, align);
            }
        };
        note(format!("{ty} → {}", path.describe(ty)));
        let affine = match path {
            ImportPath::Plain => unreachable!("plain types are imported as plain bytes"),
            ImportPath::Exact { .. } | ImportPath::Symmetric { .. } => {
                ggml::to_affine(ty, &bytes, cols as usize).expect("exact types map")
            }
            ImportPath::Requantize { bits } => {
                let values = ggml::dequantize(ty, &bytes).ok_or_else(unsupported)?;
                let (affine, err) = requantize(&values, rows, cols, bits)?;
                report
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .error(&t.name, err);
                affine
            }
        };
        drop(bytes);
        let symmetric = matches!(path, ImportPath::Symmetric { .. });
        self.write_affine(t, ty, &affine, symmetric, (rows, cols), align)
    }

    fn write_plain_f32(
        &self,
        t: &SourceTensor,
        values: &[f32],
        align: u64,
    ) -> Result<Vec<(Layer, bool)>, StoreError> {
        let mut w = BlobWriter::new(&self.root)?;
        w.write(&blob::tensor_blob_header(Dtype::F32, &t.shape, align)?)?;
        w.write(&f32_bytes(values))?;
        let (digest, size, new) = w.finish()?;
        Ok(vec![(
            tensor_layer(t, digest, size, Dtype::F32, t.shape.clone()),
            new,
        )])
    }

    /// The packed values with f32 scales and biases, or (`symmetric`) with the scales alone in
    /// f16, which holds a symmetric type's `d` exactly.
    fn write_affine(
        &self,
        t: &SourceTensor,
        ty: GgmlType,
        a: &Affine,
        symmetric: bool,
        (rows, cols): (u64, u64),
        align: u64,
    ) -> Result<Vec<(Layer, bool)>, StoreError> {
        let full = format!("{}/{}", t.component, t.name);
        let groups = cols / GROUP as u64;
        let spec = |name: String, dtype, cols| TensorSpec {
            name,
            dtype,
            shape: vec![rows, cols],
        };
        let mut specs = vec![spec(
            full.clone(),
            Dtype::U32,
            cols * u64::from(a.bits) / 32,
        )];
        let quant_type = if symmetric {
            specs.push(spec(format!("{full}.scale"), Dtype::F16, groups));
            ty.name().to_ascii_lowercase()
        } else {
            specs.push(spec(format!("{full}.scale"), Dtype::F32, groups));
            specs.push(spec(format!("{full}.bias"), Dtype::F32, groups));
            format!("int{}", a.bits)
        };
        let meta = BTreeMap::from([
            ("quant_type".to_string(), quant_type),
            ("group_size".to_string(), GROUP.to_string()),
            ("ggml_type".to_string(), ty.name()),
        ]);
        let header = header_bytes(&specs, Some(&meta), align).map_err(StoreError::Header)?;
        let mut w = BlobWriter::new(&self.root)?;
        w.write(&header)?;
        w.write(&a.packed)?;
        if symmetric {
            let scales: Vec<u8> = (a.scales.iter())
                .flat_map(|&s| {
                    let d = half::f16::from_f32(s);
                    debug_assert_eq!(d.to_f32(), s, "a symmetric type's scale is its f16 d");
                    d.to_le_bytes()
                })
                .collect();
            w.write(&scales)?;
        } else {
            w.write(&f32_bytes(&a.scales))?;
            w.write(&f32_bytes(&a.biases))?;
        }
        let (digest, size, new) = w.finish()?;
        Ok(vec![(
            tensor_layer(t, digest, size, Dtype::F32, t.shape.clone()),
            new,
        )])
    }
}

/// Refuses a tensor whose values, dequantized, hold a NaN or an infinity: a block's f16 scale
/// (or minimum) that is one makes every value of the block one. Dequantized a run of blocks at a
/// time, so the check holds a few MB whatever the tensor's size.
fn check_finite(t: &SourceTensor, ty: GgmlType, bytes: &[u8]) -> Result<(), StoreError> {
    let block = ty.block_bytes() as usize;
    let chunk = block.max(1) * 16384;
    let mut before = 0u64;
    for part in bytes.chunks(chunk) {
        let Some(values) = ggml::dequantize(ty, part) else {
            // A type the import does not take: refused by the caller, with its own error.
            return Ok(());
        };
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(non_finite(
                t,
                before + i as u64,
                describe_non_finite(values[i]),
            ));
        }
        before += values.len() as u64;
    }
    Ok(())
}

/// `values` (`rows × cols`) quantized by MLX (affine, group 32, f32 scales), and the largest
/// difference between its dequantized values and `values`.
fn requantize(
    values: &[f32],
    rows: u64,
    cols: u64,
    bits: u32,
) -> Result<(Affine, f32), StoreError> {
    let run = || -> mlx::Result<(Affine, f32)> {
        let shape = [rows as i32, cols as i32];
        let w = mlx::Array::from_slice(values, &shape)?;
        let q = QuantizedTensor::quantize(&w, GROUP as i32, bits as i32, QuantMode::Affine)?;
        let back = q.dequantize()?.to_vec::<f32>()?;
        let err = back
            .iter()
            .zip(values)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        let biases = q.biases.as_ref().expect("affine quantization has biases");
        Ok((
            Affine {
                bits,
                packed: q.weight.to_bytes()?,
                scales: q.scales.to_vec::<f32>()?,
                biases: biases.to_vec::<f32>()?,
            },
            err,
        ))
    };
    if i32::try_from(rows).is_err() || i32::try_from(cols).is_err() {
        return Err(StoreError::Mlx(mlx::Error::new(
            "quantize",
            format!("[{rows}, {cols}] is too large to re-quantize"),
        )));
    }
    run().map_err(StoreError::Mlx)
}
