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

/// Writes a GGUF v3 file to `out`. The alignment is `general.alignment` when `metadata` sets it
/// (a u32 power of two), else 32. Each tensor's bytes must be exactly what its type and shape
/// need.
pub fn write(
    out: &mut impl Write,
    metadata: &[(String, Value)],
    tensors: &[WriteTensor],
) -> Result<()> {
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
        let numel = t.shape.iter().product::<u64>();
        let expected = t.ggml_type.nbytes(numel);
        if expected != Some(t.data.len() as u64)
            || !t
                .shape
                .last()
                .copied()
                .unwrap_or(1)
                .is_multiple_of(t.ggml_type.block_len())
        {
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
        put_string(&mut head, &t.name);
        head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for d in t.shape.iter().rev() {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&t.ggml_type.id().to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + t.data.len() as u64).div_ceil(alignment) * alignment;
    }
    pad(&mut head, alignment);
    out.write_all(&head)?;
    for t in tensors {
        out.write_all(t.data)?;
        let padding = (t.data.len() as u64).div_ceil(alignment) * alignment - t.data.len() as u64;
        out.write_all(&vec![0u8; padding as usize])?;
    }
    Ok(())
}

fn pad(bytes: &mut Vec<u8>, alignment: u64) {
    let len = bytes.len() as u64;
    bytes.resize((len.div_ceil(alignment) * alignment) as usize, 0);
}
