//! Writing GGUF v3: metadata, tensor infos, then each tensor's bytes as stored, every tensor
//! starting on a multiple of the alignment.

use super::*;
use std::io::Write;

/// One tensor to write: its bytes already in `ggml_type`'s encoding.
#[derive(Debug, Clone)]
pub struct WriteTensor<'a> {
    pub name: String,
    pub ggml_type: GgmlType,
    /// Torch order (outermost first).
    pub shape: Vec<u64>,
    pub data: &'a [u8],
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array { type_id, values } => {
            out.extend_from_slice(&type_id.to_le_bytes());
            out.extend_from_slice(&(values.len() as u64).to_le_bytes());
            values.iter().for_each(|v| put_value(out, v));
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// A tensor's name, type and shape (torch order): what the header says of it.
#[derive(Debug, Clone)]
pub struct TensorHead {
    pub name: String,
    pub ggml_type: GgmlType,
    pub shape: Vec<u64>,
}

impl TensorHead {
    /// The bytes its type and shape take, checked: rows must fill whole blocks.
    pub fn nbytes(&self) -> Result<u64> {
        let numel = self.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        let rows_fit =
            (self.shape.last().copied().unwrap_or(1)).is_multiple_of(self.ggml_type.block_len());
        match numel.and_then(|n| self.ggml_type.nbytes(n)) {
            Some(n) if rows_fit => Ok(n),
            _ => Err(Error::BadTensor {
                name: self.name.clone(),
                reason: format!(
                    "shape {:?} does not divide into {} blocks of {}",
                    self.shape,
                    self.ggml_type,
                    self.ggml_type.block_len()
                ),
            }),
        }
    }
}

/// The start of a GGUF v3 file, up to the first tensor's bytes, and its alignment: after it
/// come the tensors' bytes in `tensors`' order, each followed by [`padding`] zero bytes. The
/// alignment is `general.alignment` when `metadata` sets it (a u32 power of two), else 32.
pub fn header(metadata: &[(String, Value)], tensors: &[TensorHead]) -> Result<(Vec<u8>, u64)> {
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => {
            return Err(Error::Invalid {
                field: "metadata `general.alignment`".into(),
                reason: format!("must be a u32 power of two, got {v:?}"),
            })
        }
        None => DEFAULT_ALIGNMENT,
    };
    let mut head = Vec::new();
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_string(&mut head, k);
        head.extend_from_slice(&v.type_id().to_le_bytes());
        put_value(&mut head, v);
    }
    let mut offset = 0u64;
    for t in tensors {
        let nbytes = t.nbytes()?;
        put_string(&mut head, &t.name);
        head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for d in t.shape.iter().rev() {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&t.ggml_type.id().to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset += nbytes + padding(nbytes, alignment);
    }
    pad(&mut head, alignment);
    Ok((head, alignment))
}

/// The zero bytes after a tensor of `len` bytes, up to the next multiple of the alignment.
pub fn padding(len: u64, alignment: u64) -> u64 {
    len.div_ceil(alignment) * alignment - len
}

/// Writes a GGUF v3 file to `out` (see [`header`]). Each tensor's bytes must be exactly what
/// its type and shape need.
pub fn write(
    out: &mut impl Write,
    metadata: &[(String, Value)],
    tensors: &[WriteTensor],
) -> Result<()> {
    let heads: Vec<TensorHead> = tensors
        .iter()
        .map(|t| TensorHead {
            name: t.name.clone(),
            ggml_type: t.ggml_type,
            shape: t.shape.clone(),
        })
        .collect();
    for (h, t) in heads.iter().zip(tensors) {
        if h.nbytes()? != t.data.len() as u64 {
            return Err(Error::BadTensor {
                name: t.name.clone(),
                reason: format!(
                    "{} bytes do not hold shape {:?} of {}",
                    t.data.len(),
                    t.shape,
                    t.ggml_type
                ),
            });
        }
    }
    let (head, alignment) = header(metadata, &heads)?;
    out.write_all(&head)?;
    for t in tensors {
        out.write_all(t.data)?;
        out.write_all(&vec![0u8; padding(t.data.len() as u64, alignment) as usize])?;
    }
    Ok(())
}

fn pad(bytes: &mut Vec<u8>, alignment: u64) {
    let len = bytes.len() as u64;
    bytes.resize((len.div_ceil(alignment) * alignment) as usize, 0);
}
