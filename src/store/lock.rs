//! The store lock: an advisory lock on `<root>/.zimage-lock` that keeps `gc` from sweeping
//! while anything writes or reads blobs.
//!
//! - Imports, `rm`, `verify` and model loads hold it **shared**, so any number run at once.
//! - `gc` and the removals of `doctor` hold it **exclusive**, so no import is ever half done
//!   while they decide what is garbage: a blob written by an unfinished import is not yet
//!   referenced by any manifest, and only the lock tells it apart from garbage.
//!
//! The lock is the operating system's (`flock` on Unix, `LockFileEx` on Windows), released when
//! the process ends however it ends, so a killed process never leaves the store locked.

use super::{Store, StoreError};
use crate::files::FileError;
use std::fs::File;
use std::path::PathBuf;

/// The lock file's name in the store root.
pub const LOCK_FILE: &str = ".zimage-lock";

/// A held store lock; released on drop.
#[derive(Debug)]
pub struct StoreLock {
    _file: Option<File>,
}

impl StoreLock {
    /// No lock at all: for a store this process may only read (a read-only folder), where
    /// nobody running as this user can collect garbage either.
    fn none() -> StoreLock {
        StoreLock { _file: None }
    }
}

impl Store {
    fn lock_path(&self) -> PathBuf {
        self.root.join(LOCK_FILE)
    }

    fn open_lock_file(&self) -> Result<File, std::io::Error> {
        std::fs::create_dir_all(&self.root)?;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.lock_path())
    }

    /// The shared lock, for anything that writes blobs and manifests.
    pub fn lock_for_writing(&self) -> Result<StoreLock, StoreError> {
        let path = self.lock_path();
        let io = FileError::io(&path);
        let file = self.open_lock_file().map_err(&io)?;
        file.lock_shared().map_err(&io)?;
        Ok(StoreLock { _file: Some(file) })
    }

    /// The shared lock, for reading blobs. A store whose lock file cannot be created (a
    /// read-only folder) is read without it.
    pub fn lock_for_reading(&self) -> Result<StoreLock, StoreError> {
        match self.open_lock_file() {
            Ok(file) => {
                file.lock_shared()
                    .map_err(FileError::io(&self.lock_path()))?;
                Ok(StoreLock { _file: Some(file) })
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
                ) =>
            {
                Ok(StoreLock::none())
            }
            Err(source) => Err(StoreError::from(FileError::Io {
                path: self.lock_path(),
                cause: source,
            })),
        }
    }

    /// The exclusive lock if nobody else holds the store now.
    pub(crate) fn try_lock_for_sweeping(&self) -> Result<StoreLock, StoreError> {
        let path = self.lock_path();
        let file = self.open_lock_file().map_err(FileError::io(&path))?;
        match file.try_lock() {
            Ok(()) => Ok(StoreLock { _file: Some(file) }),
            Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Busy),
            Err(std::fs::TryLockError::Error(source)) => Err(StoreError::from(FileError::Io {
                path,
                cause: source,
            })),
        }
    }

    /// The exclusive lock, for sweeping. When other processes hold the store, `waiting` is
    /// called once before this blocks until they finish.
    pub(crate) fn lock_for_sweeping(&self, waiting: &dyn Fn()) -> Result<StoreLock, StoreError> {
        let path = self.lock_path();
        let io = FileError::io(&path);
        let file = self.open_lock_file().map_err(&io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                waiting();
                file.lock().map_err(&io)?;
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e).into()),
        }
        Ok(StoreLock { _file: Some(file) })
    }
}
