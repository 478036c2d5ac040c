//! Content-addressed blobs: `blobs/sha256-<64 hex>`, written atomically, hashed while written.
//!
//! A tensor blob is a safetensors file. We write the seed format: one tensor keyed `"data"`,
//! header keys `dtype, shape, data_offsets`, padded with spaces (to 8 bytes, or to a page when
//! asked, so the data can be mapped without a copy). Reading accepts every generation Ollama
//! wrote (see [`crate::loader`]).

use crate::files::FileError;
use crate::safetensors::{self, Dtype, Header, TensorSpec};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Prefix of the temporary files blobs are written to before they are renamed into place.
pub const PARTIAL_PREFIX: &str = ".partial-";

/// Why a blob cannot be named, read or written.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// A digest that is not `sha256:` and 64 hex digits (a manifest's, or a name's).
    #[error("invalid digest `{0}`: expected `sha256:` and 64 hex digits")]
    BadDigest(String),
    /// A blob a manifest names is not in the store.
    #[error("blob `{digest}` is missing from `{}`", dir.display())]
    Missing {
        /// The blob's digest.
        digest: String,
        /// The store's `blobs` folder.
        dir: PathBuf,
    },
    /// A tensor blob whose safetensors header cannot be read.
    #[error("blob `{digest}`: {cause}")]
    Header {
        /// The blob's digest.
        digest: String,
        /// What is wrong with the header.
        cause: safetensors::Error,
    },
    /// A tensor blob laid out in none of the ways a store holds tensors.
    #[error("blob `{digest}`: {reason}")]
    Layout {
        /// The blob's digest.
        digest: String,
        /// What does not fit.
        reason: String,
    },
    /// A blob that arrived (from a registry, say) with other bytes than its digest promised.
    #[error(
        "blob `{expected}` ({expected_size} bytes) arrived as {size} bytes that hash to `{digest}`; \
         the source's copy is damaged, so nothing was kept"
    )]
    Mismatch {
        /// The digest asked for.
        expected: String,
        /// The size asked for.
        expected_size: u64,
        /// What the bytes that came hash to.
        digest: String,
        /// How many bytes came.
        size: u64,
    },
    /// A blob file that cannot be read or written.
    #[error(transparent)]
    File(#[from] FileError),
}

/// The hex part of a `sha256:<hex>` (or `sha256-<hex>`) digest, validated.
pub fn digest_hex(digest: &str) -> Result<&str, BlobError> {
    let hex = digest
        .strip_prefix("sha256:")
        .or_else(|| digest.strip_prefix("sha256-"))
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| BlobError::BadDigest(digest.to_string()))?;
    Ok(hex)
}

/// `blobs/sha256-<hex>` under `root`; rejects anything but a well-formed digest.
pub fn blob_path(root: &Path, digest: &str) -> Result<PathBuf, BlobError> {
    Ok(root.join("blobs").join(format!(
        "sha256-{}",
        digest_hex(digest)?.to_ascii_lowercase()
    )))
}

/// A blob being written: bytes go to a temporary file while they are hashed.
pub struct BlobWriter {
    root: PathBuf,
    tmp: PathBuf,
    _registered: Option<crate::files::Registered>,
    out: Option<BufWriter<File>>,
    hasher: Sha256,
    size: u64,
    /// Set once the temp file is renamed or removed.
    done: bool,
    /// A resumable download's partial file survives an error, for the next run to continue.
    keep_on_error: bool,
    /// Whether `finish` syncs the file before the rename; a writer of many blobs may sync the
    /// filesystem once instead, before anything refers to them.
    sync: bool,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl BlobWriter {
    pub fn new(root: &Path) -> Result<BlobWriter, BlobError> {
        let dir = root.join("blobs");
        std::fs::create_dir_all(&dir).map_err(FileError::io(&dir))?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!("{PARTIAL_PREFIX}{}-{n}", std::process::id()));
        // Registered before it exists, so a signal at any point finds it on the list.
        let registered = crate::files::register_temporary(&tmp);
        let file = File::create(&tmp).map_err(FileError::io(&tmp))?;
        Ok(BlobWriter {
            root: root.to_path_buf(),
            _registered: Some(registered),
            tmp,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            hasher: Sha256::new(),
            size: 0,
            done: false,
            keep_on_error: false,
            sync: true,
        })
    }

    /// The partial file of a download of `digest` that a later run may continue: the bytes an
    /// earlier run left are hashed again and kept, and new bytes are appended. The file is
    /// locked while written, so two processes never append to one partial file; when another
    /// process holds it, this one starts a private temporary file instead. `Ok((writer, n))`
    /// with `n` the bytes already there.
    pub fn resume(root: &Path, digest: &str) -> Result<(BlobWriter, u64), BlobError> {
        let hex = digest_hex(digest)?.to_ascii_lowercase();
        let dir = root.join("blobs");
        std::fs::create_dir_all(&dir).map_err(FileError::io(&dir))?;
        let tmp = dir.join(format!("{PARTIAL_PREFIX}{hex}"));
        let io = FileError::io(&tmp);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&tmp)
            .map_err(&io)?;
        if file.try_lock().is_err() {
            return Ok((BlobWriter::new(root)?, 0));
        }
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        // Most partial files are new and empty: no buffer for them.
        if file.metadata().map_err(&io)?.len() > 0 {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let k = file.read(&mut buf).map_err(&io)?;
                if k == 0 {
                    break;
                }
                hasher.update(&buf[..k]);
                size += k as u64;
            }
        }
        drop(io);
        Ok((
            BlobWriter {
                root: root.to_path_buf(),
                // Not removed on a signal either: an interrupted pull continues from it.
                _registered: None,
                tmp,
                // A download writes in large batches of its own: straight to the file, with no
                // second copy through a buffer.
                out: Some(BufWriter::with_capacity(0, file)),
                hasher,
                size,
                done: false,
                keep_on_error: true,
                sync: true,
            },
            size,
        ))
    }

    /// No sync before the rename: the caller syncs the filesystem (see [`sync_filesystem`])
    /// before any manifest names the blob.
    pub fn without_sync(mut self) -> BlobWriter {
        self.sync = false;
        self
    }

    /// Bytes written so far (those of an earlier run included).
    pub fn len(&self) -> u64 {
        self.size
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Empties the file, for a download that must start over.
    pub fn restart(&mut self) -> Result<(), BlobError> {
        let io = FileError::io(&self.tmp);
        let out = self.out.as_mut().expect("writer open until finish");
        out.flush().map_err(&io)?;
        out.get_ref().set_len(0).map_err(&io)?;
        self.hasher = Sha256::new();
        self.size = 0;
        Ok(())
    }

    /// Removes the temporary file, a resumable one too.
    pub fn discard(mut self) {
        self.keep_on_error = false;
    }

    /// Renames into place only when the bytes are `size` bytes hashing to `digest`; otherwise
    /// the temporary file is removed (a resumable one too: its bytes are wrong) and
    /// [`BlobError::Mismatch`] returned.
    pub fn finish_expecting(mut self, digest: &str, size: u64) -> Result<bool, BlobError> {
        let want = digest_hex(digest)?.to_ascii_lowercase();
        let got = format!("{:x}", self.hasher.clone().finalize());
        if got != want || self.size != size {
            self.keep_on_error = false;
            return Err(BlobError::Mismatch {
                expected: format!("sha256:{want}"),
                expected_size: size,
                digest: format!("sha256:{got}"),
                size: self.size,
            });
        }
        let (_, _, new) = self.finish()?;
        Ok(new)
    }

    pub fn write(&mut self, bytes: &[u8]) -> Result<(), BlobError> {
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
        let out = self.out.as_mut().expect("writer open until finish");
        out.write_all(bytes)
            .map_err(|e| FileError::io(&self.tmp)(e).into())
    }

    /// Syncs and renames into place. Returns the digest, the size and whether the blob was
    /// new (an identical blob already present is kept, and the copy discarded).
    pub fn finish(mut self) -> Result<(String, u64, bool), BlobError> {
        let tmp = self.tmp.clone();
        let io = FileError::io(&tmp);
        let out = self.out.take().expect("finish runs once");
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        let digest = format!("sha256:{:x}", self.hasher.finalize_reset());
        let dest = blob_path(&self.root, &digest)?;
        if dest.is_file() {
            drop(file);
            self.keep_on_error = false;
            return Ok((digest, self.size, false));
        }
        if self.sync {
            file.sync_all().map_err(&io)?;
        } else {
            crate::platform::start_writeback(&file);
        }
        drop(file);
        std::fs::rename(&self.tmp, &dest).map_err(FileError::io(&dest))?;
        self.done = true;
        Ok((digest, self.size, true))
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        // A writer dropped before its blob is in place (an error, a panic, a duplicate)
        // leaves no partial file behind.
        if !self.done && !self.keep_on_error {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Makes every blob written under `root` durable at once (one `syncfs` on Linux instead of an
/// fsync per blob; `paths` are synced one by one elsewhere).
pub fn sync_filesystem(root: &Path, paths: &[PathBuf]) -> Result<(), BlobError> {
    crate::platform::sync_filesystem(root, paths)
        .map_err(|(path, e)| FileError::io(&path)(e).into())
}

/// The main tensor of a tensor blob: the one that is no companion. A companion is `W.scale` or
/// `W.bias` beside a `W` in the same blob (a quantized weight); a blob holding one tensor holds
/// its main tensor, whatever its name (a plain `x.bias` included).
pub fn main_tensor(header: &Header) -> Option<&safetensors::TensorInfo> {
    let is_companion = |name: &str| {
        [".scale", ".bias"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|stem| header.tensor(stem).is_some())
        })
    };
    header.tensors.iter().find(|t| !is_companion(&t.name))
}

/// Writes a whole blob from bytes in memory.
pub fn write_blob(root: &Path, bytes: &[u8]) -> Result<(String, u64, bool), BlobError> {
    let mut w = BlobWriter::new(root)?;
    w.write(bytes)?;
    w.finish()
}

/// The header of a seed-format tensor blob: one tensor keyed `"data"`, data starting at a
/// multiple of `align`.
pub fn tensor_blob_header(
    dtype: Dtype,
    shape: &[u64],
    align: u64,
) -> Result<Vec<u8>, safetensors::Error> {
    safetensors::header_bytes(
        &[TensorSpec {
            name: "data".into(),
            dtype,
            shape: shape.to_vec(),
        }],
        None,
        align,
    )
}

/// A blob that is a symlink must lead to a file inside the store: a store unpacked from
/// somewhere else must not make zimage read (and later upload) files elsewhere on the disk.
pub fn check_inside_store(root: &Path, digest: &str, path: &Path) -> Result<(), BlobError> {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok(());
    }
    let io = FileError::io(path);
    let target = std::fs::canonicalize(path).map_err(&io)?;
    let root = std::fs::canonicalize(root).map_err(&io)?;
    if target.starts_with(&root) && target.is_file() {
        return Ok(());
    }
    Err(BlobError::Layout {
        digest: digest.to_string(),
        reason: format!(
            "`{}` is a symlink to `{}`, outside the store; replace it with the file itself",
            path.display(),
            target.display()
        ),
    })
}

/// Reads and validates a blob's safetensors header.
pub fn read_blob_header(root: &Path, digest: &str) -> Result<(PathBuf, Header), BlobError> {
    let path = blob_path(root, digest)?;
    if !path.is_file() {
        return Err(BlobError::Missing {
            digest: digest.to_string(),
            dir: root.join("blobs"),
        });
    }
    check_inside_store(root, digest, &path)?;
    let header = safetensors::read_header_file(&path).map_err(|source| BlobError::Header {
        digest: digest.into(),
        cause: source,
    })?;
    Ok((path, header))
}

/// sha256 of a file, streamed.
pub fn hash_file(path: &Path) -> Result<(String, u64), BlobError> {
    let io = FileError::io(path);
    let mut f = File::open(path).map_err(&io)?;
    let mut h = Sha256::new();
    // Most blobs of a model are small (norms, biases, configs): a buffer of their size, not a
    // whole MiB allocated and freed for each.
    let len = f.metadata().map_err(&io)?.len();
    let mut buf = vec![0u8; len.clamp(4 << 10, 1 << 20) as usize];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(&io)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((format!("sha256:{:x}", h.finalize()), n))
}
