//! A strict safetensors header parser and a header writer.
//!
//! Layout: `u64 LE N | N bytes of JSON header | data`, with `data_offsets` relative to the start of
//! the data. The parser enforces every rule a strict reader should (size caps, UTF-8, one JSON
//! object, no duplicate keys, known dtypes, offsets that tile the data area exactly with no holes,
//! overlap or trailing bytes) and names the tensor and field at fault. It accepts what the
//! reference implementation accepts: leading and trailing JSON whitespace, `"__metadata__": null`,
//! unknown fields inside a tensor entry, zero-size tensors and scalars.
//!
//! The writer produces the headers our store writes: entries in the caller's order with keys
//! `dtype, shape, data_offsets` (the order Ollama's Go writer uses), `__metadata__` first when
//! present, and the header padded with spaces so that the data starts on a multiple of `align`.
//!
//! One job per file: `dtype` names the element types, `header` holds the parsed header,
//! `parse` reads and checks it, `write` writes ours.

mod header;
mod parse;
mod write;

pub use crate::dtype::Dtype;
pub use header::{Header, TensorInfo};
pub use parse::{header_len_from_prefix, parse, parse_header_json, read_header, read_header_file};
pub use write::{header_bytes, TensorSpec};

use std::path::{Path, PathBuf};

/// Largest accepted header, as in the reference implementation (decimal 100 MB).
pub const MAX_HEADER_SIZE: u64 = 100_000_000;
/// Bytes of the little-endian header-length prefix.
pub const LEN_PREFIX: u64 = 8;
/// Key of the optional string-to-string metadata map.
pub const METADATA_KEY: &str = "__metadata__";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("file is {0} bytes, too small for the 8-byte header length")]
    HeaderTooSmall(u64),
    #[error("header length {0} exceeds the {MAX_HEADER_SIZE}-byte limit")]
    HeaderTooLarge(u64),
    #[error("header length {header_len} runs past the end of the {file_len}-byte file")]
    InvalidHeaderLength { header_len: u64, file_len: u64 },
    #[error("header is not valid UTF-8: {0}")]
    InvalidUtf8(std::str::Utf8Error),
    #[error("header is not a JSON object: {0}")]
    InvalidJson(String),
    #[error("header has the key `{0}` twice")]
    DuplicateKey(String),
    #[error("`__metadata__` must be null or a map of strings: {0}")]
    BadMetadata(String),
    #[error("tensor `{name}`: field `{field}` {reason}")]
    BadField {
        name: String,
        field: &'static str,
        reason: String,
    },
    #[error("tensor `{name}`: unknown dtype `{dtype}`")]
    UnknownDtype { name: String, dtype: String },
    #[error("tensor `{name}`: invalid data_offsets {begin}..{end} (expected to start at {expected}; the data must be tiled with no holes or overlap)")]
    InvalidOffset {
        name: String,
        begin: u64,
        end: u64,
        expected: u64,
    },
    #[error("tensor `{name}`: {numel} elements of {dtype} do not fill a whole number of bytes")]
    MisalignedSlice {
        name: String,
        numel: u64,
        dtype: Dtype,
    },
    #[error("tensor `{name}`: shape {shape:?} of {dtype} needs {expected} bytes, data_offsets span {got}")]
    SizeMismatch {
        name: String,
        shape: Vec<u64>,
        dtype: Dtype,
        expected: u64,
        got: u64,
    },
    #[error("tensor `{name}`: size computation overflows")]
    Overflow { name: String },
    #[error(
        "file is {got} bytes but its header describes {expected} (truncated or trailing data)"
    )]
    LengthMismatch { expected: u64, got: u64 },
    #[error("I/O error: {0}")]
    Io(std::io::Error),
    /// The file is missing, unreadable or not a regular file; the message names it.
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error("`{}`: {cause}", path.display())]
    InFile { path: PathBuf, cause: Box<Error> },
}

// Written out rather than `#[from]`, which would chain the cause the message already shows.
impl From<std::str::Utf8Error> for Error {
    fn from(e: std::str::Utf8Error) -> Self {
        Error::InvalidUtf8(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

crate::files::in_file_error!(Error);

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests;
