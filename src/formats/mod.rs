//! Model-file formats other than the store: what a file is, and the structural view of its
//! tensors that `inspect`, `hash --structural` and `diff` share.
//!
//! - [`ztensor`]: zTensor v1.0 files (`ZTEN1000`), read and written;
//! - [`structural`]: weight-inspect v0.1.0's structural hash and diff;
//! - [`gguf`]: GGUF v2/v3 files (llama.cpp, stable-diffusion.cpp), read, written and imported;
//! - [`dfsn`]: the DFSN container (a model, its sha256 and editable JSON metadata);
//! - [`model_hash`]: the model hashes of Stable Diffusion tools and Civitai;
//! - [`infotext`]: A1111 `parameters` text, written and parsed.

pub mod dfsn;
pub mod gguf;
pub mod infotext;
pub mod model_hash;
pub mod structural;
pub mod ztensor;

use crate::store::{blob, Store, StoreError, StoredModel};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    ZTensor(#[from] ztensor::Error),
    #[error(transparent)]
    Dfsn(#[from] dfsn::Error),
    #[error(transparent)]
    Gguf(#[from] gguf::Error),
    #[error(transparent)]
    Structural(#[from] structural::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("`{}`: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("`{}` is not a safetensors, zTensor or DFSN file (read as safetensors)", path.display())]
    Unrecognised {
        path: PathBuf,
        source: structural::Error,
    },
    #[error("`{}` is a {} file, which has no tensors to list (expected safetensors, zTensor, DFSN or GGUF)", path.display(), kind.name())]
    NoTensors { path: PathBuf, kind: FileKind },
}

/// One tensor as the structural views see it, whatever file it came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TensorEntry {
    pub name: String,
    /// The safetensors dtype name in lower case (`f32`, `bf16`, `u8`, `bool`): weight-inspect's
    /// spelling, used for every format so that files of different formats compare.
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Bytes of the tensor's dense little-endian data.
    pub byte_length: u64,
}

/// The tensors and metadata of a model file, a stored model or a component of one.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Listing {
    /// `safetensors`, `ztensor`, `dfsn` …: the `format` of weight-inspect's artifact.
    pub format: String,
    /// Tensors sorted by name.
    pub tensors: Vec<TensorEntry>,
    /// File-level metadata: safetensors `__metadata__`, zTensor attributes, DFSN metadata.
    pub metadata: BTreeMap<String, serde_json::Value>,
}

/// Lower-case hex of `bytes`, as digests are printed.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a file is, told by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Safetensors,
    ZTensor,
    Dfsn,
    Png,
    /// A pickled PyTorch checkpoint (a zip archive).
    Ckpt,
    Gguf,
    Unknown,
}

impl FileKind {
    /// What the file is, as a sentence's object: for errors that refuse it.
    pub fn describe(self) -> &'static str {
        match self {
            FileKind::Safetensors => "a safetensors file",
            FileKind::ZTensor => "a zTensor file",
            FileKind::Dfsn => "a DFSN container",
            FileKind::Png => "a PNG image",
            FileKind::Ckpt => "a pickled PyTorch checkpoint (convert it to safetensors first)",
            FileKind::Gguf => "a GGUF file",
            FileKind::Unknown => {
                "no model file zimage knows (its first bytes match no format, or it is empty)"
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FileKind::Safetensors => "safetensors",
            FileKind::ZTensor => "ztensor",
            FileKind::Dfsn => "dfsn",
            FileKind::Png => "png",
            FileKind::Ckpt => "ckpt",
            FileKind::Gguf => "gguf",
            FileKind::Unknown => "unknown",
        }
    }

    /// Tells the kind from a file's first 16 bytes (fewer for a short file) and its length.
    pub fn sniff(head: &[u8], file_len: u64) -> FileKind {
        if head.starts_with(ztensor::MAGIC) {
            FileKind::ZTensor
        } else if head.starts_with(dfsn::MAGIC) {
            FileKind::Dfsn
        } else if head.starts_with(b"\x89PNG\r\n\x1a\n") {
            FileKind::Png
        } else if head.starts_with(b"GGUF") {
            FileKind::Gguf
        } else if head.starts_with(b"PK\x03\x04") {
            FileKind::Ckpt
        } else if head.len() >= 9
            && u64::from_le_bytes(head[..8].try_into().expect("8 bytes"))
                .checked_add(8)
                .is_some_and(|n| n <= file_len)
            && head[8..].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
        {
            FileKind::Safetensors
        } else {
            FileKind::Unknown
        }
    }

    /// Opens `path` and tells its kind. Only a regular file is opened: a FIFO would block and
    /// a directory has no content; either is an error that says what it is.
    pub fn of_file(path: &Path) -> std::io::Result<FileKind> {
        let (mut file, len) = crate::files::open_regular(path).map_err(|e| match e {
            crate::files::FileError::Io { cause: source, .. } => source,
            e => std::io::Error::new(std::io::ErrorKind::InvalidInput, not_regular(&e)),
        })?;
        let mut head = Vec::with_capacity(16);
        file.by_ref().take(16).read_to_end(&mut head)?;
        Ok(FileKind::sniff(&head, len))
    }
}

/// A [`crate::files::FileError`] without the path it starts with, for callers that name the
/// file themselves.
fn not_regular(e: &crate::files::FileError) -> String {
    let text = e.to_string();
    match text.split_once("` ") {
        Some((_, rest)) if text.starts_with('`') => rest.to_string(),
        _ => text,
    }
}

/// The structural view of a model file: safetensors, zTensor or DFSN, told by its content.
pub fn listing_of_file(path: &Path) -> Result<Listing, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        cause: source,
    };
    let open = |path: &Path| {
        crate::files::open_regular(path).map_err(|e| Error::Io {
            path: path.to_path_buf(),
            cause: std::io::Error::new(std::io::ErrorKind::InvalidInput, not_regular(&e)),
        })
    };
    match FileKind::of_file(path).map_err(io)? {
        FileKind::ZTensor => Ok(ztensor::listing(path)?),
        FileKind::Dfsn => Ok(dfsn::listing(path)?),
        FileKind::Gguf => Ok(gguf::listing(path)?),
        FileKind::Safetensors => {
            let (file, len) = open(path)?;
            let mut file = std::io::BufReader::new(file);
            Ok(structural::read_safetensors_listing(&mut file, len, path)?)
        }
        // Content that looks like nothing known is read as safetensors (as weight-inspect
        // does), so that a damaged safetensors file gets the reader's precise complaint.
        FileKind::Unknown => {
            let (file, len) = open(path)?;
            let mut file = std::io::BufReader::new(file);
            structural::read_safetensors_listing(&mut file, len, path).map_err(|source| {
                Error::Unrecognised {
                    path: path.to_path_buf(),
                    source,
                }
            })
        }
        kind => Err(Error::NoTensors {
            path: path.to_path_buf(),
            kind,
        }),
    }
}

/// The structural view of a stored model, or of one of its components. Tensor names are the
/// layer names (`transformer/layers.0.attention.to_q.weight`) for a whole model and the names
/// inside the component for one component; a blob holding several tensors (Ollama's quantized
/// generations) contributes each of them. The view has the format `safetensors`, no metadata,
/// and reads only blob headers.
pub fn listing_of_model(
    store: &Store,
    model: &StoredModel,
    component: Option<&str>,
) -> Result<Listing, Error> {
    let mut tensors = Vec::new();
    for layer in model.manifest.tensor_layers() {
        let Some((comp, name)) = layer.component_and_tensor() else {
            continue;
        };
        if component.is_some_and(|c| c != comp) {
            continue;
        }
        let (_, header) =
            blob::read_blob_header(&store.root, &layer.digest).map_err(StoreError::Blob)?;
        for t in &header.tensors {
            // `data` (the seed's key) and the layer's own name stand for the layer; a v2
            // quantized blob's companions (`NAME.scale`, `NAME.bias`) keep their own names.
            let inner = if t.name == "data"
                || t.name == name
                || t.name == layer.name.as_deref().unwrap_or_default()
            {
                name.to_string()
            } else {
                t.name
                    .strip_prefix(&format!("{comp}/"))
                    .unwrap_or(&t.name)
                    .to_string()
            };
            let full = if component.is_some() {
                inner
            } else {
                format!("{comp}/{inner}")
            };
            tensors.push(TensorEntry {
                name: full,
                dtype: t.dtype.name().to_ascii_lowercase(),
                shape: t.shape.clone(),
                byte_length: t.nbytes(),
            });
        }
    }
    if let Some(c) = component.filter(|_| tensors.is_empty()) {
        return Err(StoreError::NoComponent {
            model: model.name.short(),
            component: c.to_string(),
            have: model.manifest.components(),
        }
        .into());
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Listing {
        format: FileKind::Safetensors.name().into(),
        tensors,
        metadata: BTreeMap::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_each_kind() {
        let mut st = 2u64.to_le_bytes().to_vec();
        st.extend_from_slice(b"{}");
        assert_eq!(FileKind::sniff(&st, 10), FileKind::Safetensors);
        assert_eq!(
            FileKind::sniff(&st, 9),
            FileKind::Unknown,
            "header past the end"
        );
        assert_eq!(FileKind::sniff(b"ZTEN1000\0\0\0\0", 100), FileKind::ZTensor);
        assert_eq!(FileKind::sniff(b"DFSN\x00\x02", 0x300000), FileKind::Dfsn);
        assert_eq!(
            FileKind::sniff(b"\x89PNG\r\n\x1a\n\0\0\0\x0d", 100),
            FileKind::Png
        );
        assert_eq!(FileKind::sniff(b"hello", 5), FileKind::Unknown);
    }
}
