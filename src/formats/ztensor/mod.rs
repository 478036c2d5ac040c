//! zTensor v1.0 (`ZTEN1000`): reader and writer, byte-compatible with the files crate
//! `ztensor` 1.0.0 and PyPI `ztensor` 1.0.x write.
//!
//! ```text
//! "ZTEN1000" | zero padding | blobs, each at a multiple of 64 | CBOR manifest | u64 LE manifest size
//! ```
//! The manifest maps tensor names to a dtype, a shape, a format (`dense`, `sparse_csr`,
//! `sparse_coo`) and the components that make it up (`data`; `values`, `indices`, `indptr`;
//! `values`, `coords`), each a byte range with an optional `zstd` encoding and digest.
//!
//! - [`read`]: [`ZtFile`], a validated view of a file (its manifest checked in `manifest.rs`),
//!   and dense decoding;
//! - [`write`](mod@write): [`Writer`], streamed and atomic;
//! - [`source`]: [`ZtSource`], a .zt file as an import source for the store.
//!
//! Reading is strict where a file could mislead (every structural rule of the spec's §7.1 and
//! more: aligned, in-bounds, non-overlapping components; exact sizes; sparse indices in range and
//! unrepeated; another major version fails) and lenient about what cannot mislead (unknown keys
//! and `"encoding": "raw"`, as crate 1.0.0; a missing `generator` or `attributes`, which crate
//! 1.0.0 requires, reads as empty). Digests `crc32c:` (hex in either
//! case, `0x` optional) and `sha256:` are verified whenever a component's bytes are read; a
//! malformed one is an error. A digest of another algorithm cannot be checked: the file still
//! opens, the component is read unverified and [`ZtFile::warnings`] says so, since refusing it
//! would only lock out files that later writers might produce.
//!
//! Data is little-endian on disk and in memory: zimage runs on little-endian hosts only.

mod cbor;
mod digest;
mod manifest;
pub mod read;
pub mod source;
pub mod write;

pub use digest::Digest;
pub use read::{
    max_dense_bytes, Component, Encoding, Layout, TensorMeta, ZtFile, DEFAULT_MAX_DENSE_BYTES,
    MAX_DENSE_BYTES_VAR,
};
pub use source::ZtSource;
pub use write::{Checksum, WriteOptions, Writer};

use super::{Listing, TensorEntry};
use crate::safetensors::Dtype as StDtype;
use std::path::{Path, PathBuf};

/// The 8 bytes every zTensor v1.0 file starts with.
pub const MAGIC: &[u8; 8] = b"ZTEN1000";
/// Every component starts at a multiple of this.
pub const ALIGNMENT: u64 = 64;
/// The `version` our writer puts in the manifest.
pub const VERSION: &str = "1.0";
/// The `generator` crate 1.0.0 writes (it never bumped it); we write the same so that our
/// manifests are byte-identical to its own.
pub const GENERATOR: &str = "zTensor-Rust v0.1.0";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{}`: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("`{}`: tensor `{tensor}`: {reason}", path.display())]
    Tensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("`{}`: tensor `{tensor}`, component `{component}`: {reason}", path.display())]
    Component {
        path: PathBuf,
        tensor: String,
        component: String,
        reason: String,
    },
    #[error("`{}`: tensor `{tensor}`, component `{component}`: digest mismatch (the manifest says `{expected}`, the data hashes to `{actual}`); the file is damaged, copy or write it again", path.display())]
    DigestMismatch {
        path: PathBuf,
        tensor: String,
        component: String,
        expected: String,
        actual: String,
    },
    #[error("`{}`: tensor `{tensor}` has dtype {dtype}, which zTensor v1.0 cannot hold (it has float64/32/16, bfloat16, int8–64, uint8–64 and bool); keep this model as safetensors", path.display())]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: StDtype,
    },
    #[error("`{}`: no tensor `{tensor}` in the file (see `zimage inspect`)", path.display())]
    NotFound { path: PathBuf, tensor: String },
    #[error("`{}`: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
        move |source| Error::Io {
            path: path.to_path_buf(),
            cause: source,
        }
    }
}

/// Element types of zTensor v1.0, spelled in the manifest as `name()` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZDtype {
    Float64,
    Float32,
    Float16,
    BFloat16,
    Int64,
    Int32,
    Int16,
    Int8,
    Uint64,
    Uint32,
    Uint16,
    Uint8,
    Bool,
}

impl ZDtype {
    pub const ALL: [ZDtype; 13] = [
        ZDtype::Float64,
        ZDtype::Float32,
        ZDtype::Float16,
        ZDtype::BFloat16,
        ZDtype::Int64,
        ZDtype::Int32,
        ZDtype::Int16,
        ZDtype::Int8,
        ZDtype::Uint64,
        ZDtype::Uint32,
        ZDtype::Uint16,
        ZDtype::Uint8,
        ZDtype::Bool,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ZDtype::Float64 => "float64",
            ZDtype::Float32 => "float32",
            ZDtype::Float16 => "float16",
            ZDtype::BFloat16 => "bfloat16",
            ZDtype::Int64 => "int64",
            ZDtype::Int32 => "int32",
            ZDtype::Int16 => "int16",
            ZDtype::Int8 => "int8",
            ZDtype::Uint64 => "uint64",
            ZDtype::Uint32 => "uint32",
            ZDtype::Uint16 => "uint16",
            ZDtype::Uint8 => "uint8",
            ZDtype::Bool => "bool",
        }
    }

    /// The manifest spelling; exact and lower case, as crate 1.0.0 requires.
    pub fn parse(s: &str) -> Option<ZDtype> {
        ZDtype::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Bytes per element (bool takes a whole byte).
    pub fn size(self) -> u64 {
        self.safetensors().bits() / 8
    }

    pub fn safetensors(self) -> StDtype {
        match self {
            ZDtype::Float64 => StDtype::F64,
            ZDtype::Float32 => StDtype::F32,
            ZDtype::Float16 => StDtype::F16,
            ZDtype::BFloat16 => StDtype::BF16,
            ZDtype::Int64 => StDtype::I64,
            ZDtype::Int32 => StDtype::I32,
            ZDtype::Int16 => StDtype::I16,
            ZDtype::Int8 => StDtype::I8,
            ZDtype::Uint64 => StDtype::U64,
            ZDtype::Uint32 => StDtype::U32,
            ZDtype::Uint16 => StDtype::U16,
            ZDtype::Uint8 => StDtype::U8,
            ZDtype::Bool => StDtype::BOOL,
        }
    }

    /// `None` for the safetensors types zTensor v1.0 has no name for (F8_*, F6_*, F4, C64).
    pub fn from_safetensors(d: StDtype) -> Option<ZDtype> {
        ZDtype::ALL.into_iter().find(|z| z.safetensors() == d)
    }
}

/// Elements of a shape; `[]` is a scalar (one element). `None` on overflow.
pub fn numel(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// The structural view of a .zt file (dtype names as safetensors spells them, lower case).
/// Reads only the manifest.
pub fn listing(path: &Path) -> Result<Listing, Error> {
    let file = ZtFile::open(path)?;
    let tensors = file
        .tensors()
        .map(|t| TensorEntry {
            name: t.name.clone(),
            dtype: t.dtype.safetensors().name().to_ascii_lowercase(),
            shape: t.shape.clone(),
            byte_length: t.dense_len,
        })
        .collect();
    let metadata = file
        .attributes()
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    Ok(Listing {
        format: "ztensor".into(),
        tensors,
        metadata,
    })
}

#[cfg(test)]
mod tests;
