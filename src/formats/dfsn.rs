//! The DFSN container. (being written)

use super::Listing;
use std::path::{Path, PathBuf};

/// The 4 bytes every DFSN container starts with.
pub const MAGIC: &[u8; 4] = b"DFSN";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{}`: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

/// The structural view of the model inside a container; its metadata is the container's JSON.
pub fn listing(path: &Path) -> Result<Listing, Error> {
    Err(Error::Invalid { path: path.to_path_buf(), reason: "DFSN reading is not built yet".into() })
}

/// What the container holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelType {
    Ckpt,
    Safetensors,
}

/// A parsed container header: where things are, and what it claims.
#[derive(Debug, Clone)]
pub struct Container {
    pub model_type: ModelType,
    /// The stored sha256 of the model bytes.
    pub sha256: [u8; 32],
    pub metadata: serde_json::Value,
    pub metadata_offset: u64,
    pub model_offset: u64,
    pub model_len: u64,
}

impl Container {
    pub fn open(path: &Path) -> Result<Container, Error> {
        Err(Error::Invalid { path: path.to_path_buf(), reason: "DFSN reading is not built yet".into() })
    }
}
