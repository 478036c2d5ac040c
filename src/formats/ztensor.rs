//! zTensor v1.0 (`ZTEN1000`): reader and writer. (being written)

use super::Listing;
use std::path::{Path, PathBuf};

/// The 8 bytes every zTensor v1.0 file starts with.
pub const MAGIC: &[u8; 8] = b"ZTEN1000";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{}`: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

/// The structural view of a .zt file (dtype names as safetensors spells them, lower case).
pub fn listing(path: &Path) -> Result<Listing, Error> {
    Err(Error::Invalid { path: path.to_path_buf(), reason: "zTensor reading is not built yet".into() })
}

/// A .zt file as a source for `zimage create`: every tensor under one component, dense and
/// little-endian (compressed or sparse tensors are decoded to a temporary file first).
pub struct ZtSource {}

impl ZtSource {
    pub fn open(path: &Path, component: &str) -> Result<ZtSource, Error> {
        let _ = component;
        Err(Error::Invalid { path: path.to_path_buf(), reason: "zTensor import is not built yet".into() })
    }
}

impl crate::store::TensorSource for ZtSource {
    fn tensors(&self) -> Vec<crate::store::SourceTensor> {
        Vec::new()
    }
    fn config_files(&self) -> Result<Vec<(String, Vec<u8>)>, crate::store::StoreError> {
        Ok(Vec::new())
    }
}
