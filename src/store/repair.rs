//! Finding and removing damage: manifests that cannot be read, models whose blobs are gone,
//! and the temporary files of interrupted writes.

use super::{DamagedModel, Store, StoreError};
use crate::files::FileError;
use std::path::PathBuf;

/// One thing wrong with a store, and what removing it takes away.
#[derive(Debug, Clone)]
pub enum Damage {
    /// A manifest that cannot be read: the model can be neither loaded nor collected around.
    Manifest(DamagedModel),
    /// A model whose manifest reads well but names blobs that are missing or of the wrong size.
    MissingBlobs {
        name: String,
        path: PathBuf,
        missing: Vec<String>,
    },
    /// A temporary file an interrupted import or manifest write left behind.
    Temporary { path: PathBuf, bytes: u64 },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Manifest(d) => write!(
                f,
                "model `{}`: damaged manifest `{}`: {}",
                d.name,
                d.path.display(),
                d.reason
            ),
            Damage::MissingBlobs { name, missing, .. } => write!(
                f,
                "model `{name}`: {} blob(s) missing or truncated (first: `{}`)",
                missing.len(),
                missing.first().map(String::as_str).unwrap_or("")
            ),
            Damage::Temporary { path, bytes } => write!(
                f,
                "leftover temporary file `{}` ({bytes} bytes)",
                path.display()
            ),
        }
    }
}

impl Damage {
    /// What the removal does, in a few words, for the prompt.
    pub fn remedy(&self) -> &'static str {
        match self {
            Damage::Manifest(_) | Damage::MissingBlobs { .. } => "remove the model's manifest",
            Damage::Temporary { .. } => "delete the file",
        }
    }
}

impl Store {
    /// Everything [`Damage`] in the store. Temporary files are listed only when no other
    /// process holds the store (they may be an import's work in progress); blobs are checked
    /// by presence and size (`verify` re-hashes them).
    #[doc(hidden)]
    pub fn examine(&self) -> Result<Vec<Damage>, StoreError> {
        let scan = {
            let _lock = self.lock_for_reading()?;
            self.scan()?
        };
        let mut out: Vec<Damage> = scan.damaged.into_iter().map(Damage::Manifest).collect();
        for m in &scan.models {
            let missing: Vec<String> = std::iter::once(&m.manifest.config)
                .chain(&m.manifest.layers)
                .filter(|l| {
                    let size = self
                        .blob_path(&l.digest)
                        .ok()
                        .and_then(|p| std::fs::metadata(p).ok())
                        .map(|md| md.len());
                    size != Some(l.size)
                })
                .map(|l| l.digest.clone())
                .collect();
            if !missing.is_empty() {
                out.push(Damage::MissingBlobs {
                    name: m.name.short(),
                    path: self.root.join(m.name.manifest_path()),
                    missing,
                });
            }
        }
        if let Ok(lock) = self.try_lock_for_sweeping() {
            let temporaries = scan.temporaries.into_iter().chain(self.partial_blobs());
            for path in temporaries {
                let bytes = std::fs::symlink_metadata(&path).map_or(0, |m| m.len());
                out.push(Damage::Temporary { path, bytes });
            }
            drop(lock);
        }
        Ok(out)
    }

    /// Removes one piece of damage found by [`Store::examine`].
    #[doc(hidden)]
    pub fn repair(&self, damage: &Damage) -> Result<(), StoreError> {
        let path = match damage {
            Damage::Manifest(d) => {
                let _lock = self.lock_for_writing()?;
                d.path.clone()
            }
            Damage::MissingBlobs { path, .. } => {
                let _lock = self.lock_for_writing()?;
                path.clone()
            }
            Damage::Temporary { path, .. } => {
                // Only while nobody else holds the store is a temporary file surely stale.
                let _lock = self
                    .try_lock_for_sweeping()
                    .map_err(|_| StoreError::TemporaryInUse { path: path.clone() })?;
                path.clone()
            }
        };
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(StoreError::from(FileError::Io {
                    path,
                    cause: source,
                }))
            }
        }
        if !matches!(damage, Damage::Temporary { .. }) {
            self.tidy_manifest_dirs(&path);
        }
        Ok(())
    }
}
