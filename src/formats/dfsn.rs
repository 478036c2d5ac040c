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
