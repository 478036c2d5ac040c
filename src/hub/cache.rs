//! One repository in Hugging Face's cache, laid out as huggingface_hub lays it out, so that a
//! file either tool downloaded serves the other:
//!
//! ```text
//! <cache>/models--OWNER--REPO/blobs/<etag>                   the file's bytes (etag: sha256
//!                                                              for LFS files, the git blob id
//!                                                              for the others)
//! <cache>/models--OWNER--REPO/blobs/<etag>.incomplete        a download under way
//! <cache>/models--OWNER--REPO/snapshots/<commit>/<path>      -> ../../blobs/<etag>
//! <cache>/models--OWNER--REPO/refs/<revision>                the commit the revision named
//! <cache>/.locks/models--OWNER--REPO/<etag>.lock             held while downloading <etag>
//! ```
//! The lock is an `flock` on the lock file, as huggingface_hub's `filelock` takes it, so a
//! download by either tool waits for the other's.

use super::api::HubFile;
use super::HubError;
use crate::files::FileError;
use std::path::{Path, PathBuf};

pub struct RepoCache {
    /// `<cache>/models--OWNER--REPO`.
    pub dir: PathBuf,
    locks: PathBuf,
}

impl RepoCache {
    pub fn new(cache: &Path, owner: &str, repo: &str) -> RepoCache {
        let folder = format!("models--{owner}--{repo}");
        RepoCache {
            dir: cache.join(&folder),
            locks: cache.join(".locks").join(folder),
        }
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(etag)
    }

    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{etag}.incomplete"))
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit)
    }

    /// The file is cached whole: its blob is there with the size the Hub states.
    pub fn holds(&self, f: &HubFile) -> bool {
        std::fs::metadata(self.blob(&f.etag)).is_ok_and(|m| m.is_file() && m.len() == f.size)
    }

    /// Holds the download lock of `etag` until the returned file is dropped; waits while
    /// another process (zimage or huggingface_hub) holds it.
    pub fn lock(&self, etag: &str) -> Result<std::fs::File, HubError> {
        let path = self.locks.join(format!("{etag}.lock"));
        let io = FileError::io(&path);
        std::fs::create_dir_all(&self.locks).map_err(FileError::io(&self.locks))?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(&io)?;
        file.lock().map_err(&io)?;
        Ok(file)
    }

    /// Records which commit `revision` named (huggingface_hub writes no ref for a commit).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        if revision == commit {
            return Ok(());
        }
        let path = self.dir.join("refs").join(revision);
        let dir = path.parent().expect("refs have a folder");
        std::fs::create_dir_all(dir).map_err(FileError::io(dir))?;
        crate::files::write_output(&path, commit.as_bytes())?;
        Ok(())
    }

    /// Makes `snapshots/<commit>/<path>` lead to the file's blob.
    pub fn link(&self, commit: &str, f: &HubFile) -> Result<(), HubError> {
        let path = self.snapshot(commit).join(&f.path);
        let dir = path.parent().expect("snapshot files have a folder");
        std::fs::create_dir_all(dir).map_err(FileError::io(dir))?;
        // Relative, as huggingface_hub links: the cache can move.
        let depth = f.path.split('/').count() + 1;
        let target: PathBuf = std::iter::repeat_n("..", depth)
            .chain(["blobs", f.etag.as_str()])
            .collect();
        if std::fs::read_link(&path).is_ok_and(|t| t == target) {
            return Ok(());
        }
        let io = FileError::io(&path);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e).into()),
            _ => {}
        }
        #[cfg(unix)]
        std::os::unix::fs::symlink(&target, &path).map_err(&io)?;
        // Without symlinks huggingface_hub copies; a copy serves the same.
        #[cfg(not(unix))]
        std::fs::copy(self.blob(&f.etag), &path).map_err(&io)?;
        Ok(())
    }
}
