//! GGUF (versions 2 and 3), the file format of llama.cpp and stable-diffusion.cpp: a strict
//! reader, a writer, and a GGUF file as an import source.
//!
//! Layout: `"GGUF" | u32 version | u64 tensors | u64 metadata keys | keys | tensor infos |
//! padding | data`, little-endian, strings as `u64 length + UTF-8`. Tensor offsets are relative
//! to the data section, which starts at the first multiple of `general.alignment` (32 unless
//! the file says otherwise) after the tensor infos. Dimensions are stored innermost first; this
//! module presents shapes in torch order (outermost first).
//!
//! The reader checks every count, length, offset and size against the file before allocating
//! or reading anything: a length past the end, a count that cannot fit in the bytes left,
//! overlapping or misaligned tensors, unknown types and absurd dimensions are errors naming the
//! field.
//!
//! One job per file: `read` parses and checks, `write` writes, `source` imports, `names` maps
//! llama.cpp's tensor names to the ones our models load.

mod names;
mod read;
mod source;
mod write;

pub use crate::ggml::GgmlType;
pub use names::{hf_name_for_llama, is_llama_naming};
pub use read::{read, read_file};
pub use source::GgufSource;
pub use write::{header, padding, write, TensorHead, WriteTensor};

use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section and of every tensor when the file does not set one.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most metadata keys accepted: real files carry a few dozen (a tokenizer is one key holding
/// an array).
pub const MAX_METADATA_KEYS: u64 = 65_536;
/// Most tensors accepted.
pub const MAX_TENSORS: u64 = 1 << 20;
/// Longest key or tensor name (the format's own limit).
pub const MAX_NAME_LEN: u64 = 65_535;
/// ggml's most dimensions.
pub const MAX_DIMS: u32 = 4;
/// Most nested array levels (arrays of arrays).
pub const MAX_NESTING: u32 = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Values of one type (`type_id`), possibly none.
    Array {
        type_id: u32,
        values: Vec<Value>,
    },
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The format's id of this value's type.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array { .. } => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// An unsigned integer value of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// As JSON; arrays longer than `max_array` become a short description.
    pub fn to_json(&self, max_array: usize) -> serde_json::Value {
        use serde_json::json;
        match self {
            Value::U8(v) => json!(v),
            Value::I8(v) => json!(v),
            Value::U16(v) => json!(v),
            Value::I16(v) => json!(v),
            Value::U32(v) => json!(v),
            Value::I32(v) => json!(v),
            Value::F32(v) => json!(v),
            Value::Bool(v) => json!(v),
            Value::String(v) => json!(v),
            Value::U64(v) => json!(v),
            Value::I64(v) => json!(v),
            Value::F64(v) => json!(v),
            Value::Array { type_id, values } if values.len() > max_array => json!(format!(
                "[{} values of {}]",
                values.len(),
                type_name(*type_id)
            )),
            Value::Array { values, .. } => {
                serde_json::Value::Array(values.iter().map(|v| v.to_json(max_array)).collect())
            }
        }
    }
}

/// The format's name of a value type id.
pub fn type_name(id: u32) -> &'static str {
    [
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64",
        "f64",
    ]
    .get(id as usize)
    .copied()
    .unwrap_or("unknown")
}

/// One tensor of a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// Torch order (outermost first): the file's dimensions reversed.
    pub shape: Vec<u64>,
    /// Offset of the data from the start of the file.
    pub offset: u64,
    pub nbytes: u64,
}

impl TensorInfo {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A parsed, checked GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct Gguf {
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Where the data section starts in the file.
    pub data_start: u64,
    pub file_len: u64,
}

impl Gguf {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not a GGUF file (it does not start with `GGUF`)")]
    BadMagic,
    #[error("`version` is {0}; GGUF versions 2 and 3 are read")]
    UnsupportedVersion(u32),
    #[error("`version` reads as {0:#x}: a big-endian GGUF file, which is not read")]
    BigEndian(u32),
    #[error(
        "{field}: needs {needed} bytes at offset {at}, but the file ends at {file_len} (truncated)"
    )]
    Truncated {
        field: String,
        at: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("{field}: {count} exceeds the limit of {limit}")]
    TooMany {
        field: String,
        count: u64,
        limit: u64,
    },
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("tensor `{name}`: unknown ggml type id {id}")]
    UnknownType { name: String, id: u32 },
    #[error("tensor `{name}`: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("tensors `{first}` and `{second}` overlap (bytes {start}..{end} of the data section are claimed by both)")]
    Overlap {
        first: String,
        second: String,
        start: u64,
        end: u64,
    },
    #[error("the key `{0}` appears twice")]
    DuplicateKey(String),
    #[error("the tensor `{0}` appears twice")]
    DuplicateTensor(String),
    #[error("tensor `{name}` is {ty}, which zimage cannot import (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K to Q6_K are)")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error("`{}`: {cause}", path.display())]
    InFile { path: PathBuf, cause: Box<Error> },
}

crate::files::in_file_error!(Error);

pub type Result<T> = std::result::Result<T, Error>;

/// The structural view of a GGUF file: tensor names as stored, ggml type names in lower case
/// as the dtype, shapes in torch order, metadata with long arrays summarised.
pub fn listing(path: &Path) -> Result<super::Listing> {
    let g = read_file(path)?;
    let mut tensors: Vec<super::TensorEntry> = g
        .tensors
        .iter()
        .map(|t| super::TensorEntry {
            name: t.name.clone(),
            dtype: t.ggml_type.name().to_ascii_lowercase(),
            shape: t.shape.clone(),
            byte_length: t.nbytes,
        })
        .collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let metadata = g
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.to_json(64)))
        .collect();
    Ok(super::Listing {
        format: "gguf".into(),
        tensors,
        metadata,
    })
}

#[cfg(test)]
mod tests;
