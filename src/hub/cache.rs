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
//!
//! The cache folder itself may be a link (to another disk), but nothing under it is followed
//! when zimage writes: every folder it writes in must be a real folder, every file it opens a
//! regular file (a FIFO would block a pull), and the one kind of link it replaces is a
//! snapshot's link into `blobs`. Anything else in their place is refused, naming it, so that no
//! write, rename or removal lands outside the cache. A snapshot's link is made at a temporary
//! name and renamed over, so that two pulls of one repository never meet between a removal and
//! a creation.

use super::api::HubFile;
use super::HubError;
use crate::files::FileError;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct RepoCache {
    /// The cache folder (`HF_HUB_CACHE`).
    root: PathBuf,
    /// `models--OWNER--REPO`.
    folder: String,
    /// `<cache>/models--OWNER--REPO`.
    pub dir: PathBuf,
}

/// Tells temporary links of one process apart.
static NEXT_LINK: AtomicU64 = AtomicU64::new(0);

impl RepoCache {
    pub fn new(cache: &Path, owner: &str, repo: &str) -> RepoCache {
        let folder = format!("models--{owner}--{repo}");
        RepoCache {
            root: cache.to_path_buf(),
            dir: cache.join(&folder),
            folder,
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

    /// The file is cached whole: its blob is there, a regular file (not a link to one) with
    /// the size the Hub states.
    pub fn holds(&self, f: &HubFile) -> bool {
        std::fs::symlink_metadata(self.blob(&f.etag))
            .is_ok_and(|m| m.is_file() && m.len() == f.size)
    }

    /// `<cache>/<rel>`, each folder of it made where missing and checked to be a real folder:
    /// a link or a file in the way is refused, so that nothing written there leaves the cache.
    fn folder(&self, rel: &Path) -> Result<PathBuf, HubError> {
        std::fs::create_dir_all(&self.root).map_err(FileError::io(&self.root))?;
        let mut at = self.root.clone();
        for part in rel.components() {
            let Component::Normal(part) = part else {
                return Err(HubError::Foreign {
                    path: at.join(part),
                    kind: "a path that leaves its folder",
                    expected: "a folder",
                });
            };
            at.push(part);
            // Twice at most: another pull may make the folder between the look and the make.
            for tries in 0.. {
                match std::fs::symlink_metadata(&at) {
                    Ok(meta) if meta.is_dir() => break,
                    Ok(meta) => {
                        return Err(HubError::Foreign {
                            path: at,
                            kind: crate::files::kind_of(&meta),
                            expected: "a folder",
                        })
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries == 0 => {
                        match std::fs::create_dir(&at) {
                            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                                return Err(FileError::io(&at)(e).into())
                            }
                            _ => {}
                        }
                    }
                    Err(e) => return Err(FileError::io(&at)(e).into()),
                }
            }
        }
        Ok(at)
    }

    /// `models--OWNER--REPO/<rel>` as a checked folder ([`RepoCache::folder`]).
    fn repo_folder(&self, rel: &Path) -> Result<PathBuf, HubError> {
        self.folder(&Path::new(&self.folder).join(rel))
    }

    /// The folder of blobs, checked to be a real folder, made if missing.
    pub fn blobs(&self) -> Result<PathBuf, HubError> {
        self.repo_folder(Path::new("blobs"))
    }

    /// Removes what an earlier run left of `etag`'s download, which no run will continue (the
    /// file is refused): under its lock, and only a regular file in the cache's own folder.
    pub fn discard_incomplete(&self, etag: &str) -> Result<(), HubError> {
        if !self.dir.join("blobs").is_dir() {
            return Ok(());
        }
        self.blobs()?;
        let _lock = self.lock(etag)?;
        let path = self.incomplete(etag);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            std::fs::remove_file(&path).map_err(FileError::io(&path))?;
        }
        Ok(())
    }

    /// Holds the download lock of `etag` until the returned file is dropped; waits while
    /// another process (zimage or huggingface_hub) holds it.
    pub fn lock(&self, etag: &str) -> Result<std::fs::File, HubError> {
        let dir = self.folder(&Path::new(".locks").join(&self.folder))?;
        let path = dir.join(format!("{etag}.lock"));
        let file = crate::files::open_regular_here(
            &path,
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true),
        )
        .map_err(|e| foreign(e, "a lock file"))?;
        file.lock().map_err(FileError::io(&path))?;
        Ok(file)
    }

    /// Records which commit `revision` named (huggingface_hub writes no ref for a commit).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        if revision == commit {
            return Ok(());
        }
        let rel = Path::new("refs").join(revision);
        let dir = self.repo_folder(rel.parent().expect("refs have a folder"))?;
        let path = dir.join(rel.file_name().expect("a revision has a name"));
        crate::files::replace_regular(&path, commit.as_bytes())
            .map_err(|e| foreign(e, "a ref file"))
    }

    /// Makes `snapshots/<commit>/<path>` lead to the file's blob: a link made at a temporary
    /// name and renamed over what is there, a link into `blobs` (or a copy) only.
    pub fn link(&self, commit: &str, f: &HubFile) -> Result<(), HubError> {
        let rel = Path::new("snapshots").join(commit).join(&f.path);
        let dir = self.repo_folder(rel.parent().expect("snapshot files have a folder"))?;
        let name = rel.file_name().expect("snapshot files have a name");
        let path = dir.join(name);
        // Relative, as huggingface_hub links: the cache can move.
        let depth = f.path.split('/').count() + 1;
        let target: PathBuf = std::iter::repeat_n("..", depth)
            .chain(["blobs", f.etag.as_str()])
            .collect();
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let now = std::fs::read_link(&path).map_err(FileError::io(&path))?;
                if now == target {
                    return Ok(());
                }
                if !is_blob_link(&now, depth) {
                    return Err(HubError::Foreign {
                        path,
                        kind: "a symbolic link out of the cache's blobs",
                        expected: "a link into `blobs`",
                    });
                }
            }
            // A copy (made where there are no links) is replaced like a link.
            Ok(meta) if meta.is_file() => {}
            Ok(meta) => {
                return Err(HubError::Foreign {
                    path,
                    kind: crate::files::kind_of(&meta),
                    expected: "a link into `blobs`",
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(FileError::io(&path)(e).into()),
        }
        let tmp = dir.join(format!(
            ".{}.{}-{}.zimage-link",
            name.to_string_lossy(),
            std::process::id(),
            NEXT_LINK.fetch_add(1, Ordering::Relaxed)
        ));
        let _registered = crate::files::register_temporary(&tmp);
        let made = (|| {
            // One left by a process that died here.
            let _ = std::fs::remove_file(&tmp);
            #[cfg(unix)]
            std::os::unix::fs::symlink(&target, &tmp)?;
            // Without symlinks huggingface_hub copies; a copy serves the same.
            #[cfg(not(unix))]
            std::fs::copy(self.blob(&f.etag), &tmp)?;
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_file(&tmp);
            return Err(FileError::io(&path)(e).into());
        }
        Ok(())
    }
}

/// Whether `target` is a snapshot file's link into `blobs` from `depth` folders down: what
/// zimage and huggingface_hub make, and so what may be replaced.
fn is_blob_link(target: &Path, depth: usize) -> bool {
    let parts: Vec<Component> = target.components().collect();
    parts.len() == depth + 2
        && parts[..depth].iter().all(|c| *c == Component::ParentDir)
        && parts[depth] == Component::Normal("blobs".as_ref())
        && matches!(parts[depth + 1], Component::Normal(_))
}

/// A file error in the cache, with a file that is not a regular one told as a foreign entry.
pub(super) fn foreign(e: FileError, expected: &'static str) -> HubError {
    match e {
        FileError::NotRegular { path, kind } => HubError::Foreign {
            path,
            kind,
            expected,
        },
        e => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_links_into_blobs_are_the_caches_own() {
        assert!(is_blob_link(Path::new("../../blobs/abc"), 2));
        assert!(is_blob_link(Path::new("../../../blobs/abc"), 3));
        assert!(!is_blob_link(Path::new("../../blobs/abc"), 3));
        assert!(!is_blob_link(Path::new("/etc/passwd"), 2));
        assert!(!is_blob_link(Path::new("../../blobs/../x"), 2));
        assert!(!is_blob_link(Path::new("../../other/abc"), 2));
    }
}
