//! One file into the cache: appended to `blobs/<etag>.incomplete` (continued with `Range` from
//! what an earlier run left, as huggingface_hub continues), hashed as it arrives, and renamed
//! to `blobs/<etag>` only when its size and hash (an LFS file's sha256, another's git blob id)
//! are the Hub's.

use super::cache::RepoCache;
use super::http::Hub;
use super::{check_status, HubError, HubFile, HubRepo, PullProgress};
use crate::files::FileError;
use crate::registry::printable;
use reqwest::header::{CONTENT_RANGE, RANGE};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Tries per file for failures a retry may cure (a dropped connection, a stall, a 5xx); each
/// continues from the bytes the last one left.
const ATTEMPTS: u32 = 4;

/// Bytes read from a response per write.
const BUFFER: usize = 1 << 20;

/// The partial file and what is known of its bytes.
struct Partial {
    file: File,
    hasher: Sha256,
    len: u64,
}

impl Partial {
    /// Opens `path` (in a folder checked to be the cache's own) to append, hashing the bytes
    /// an earlier run left; a link or a special file in its place is refused.
    fn open(path: &Path) -> Result<Partial, HubError> {
        let io = FileError::io(path);
        let mut file = crate::files::open_regular_here(
            path,
            std::fs::OpenOptions::new()
                .read(true)
                .append(true)
                .create(true),
        )
        .map_err(|e| super::cache::foreign(e, "a partial download"))?;
        let mut hasher = Sha256::new();
        let len = std::io::copy(&mut file, &mut hasher).map_err(&io)?;
        Ok(Partial { file, hasher, len })
    }

    fn restart(&mut self, path: &Path) -> Result<(), HubError> {
        self.file.set_len(0).map_err(FileError::io(path))?;
        self.hasher = Sha256::new();
        self.len = 0;
        Ok(())
    }
}

/// Downloads `f` from `url` into the cache. Returns the bytes an earlier run had left.
#[allow(clippy::too_many_arguments)]
pub fn download(
    hub: &Hub,
    repo: &HubRepo,
    commit: &str,
    url: &str,
    cache: &RepoCache,
    f: &HubFile,
    progress: &dyn PullProgress,
    stop: &AtomicBool,
) -> Result<u64, HubError> {
    let _lock = cache.lock(&f.etag)?;
    // Another process may have finished it while this one waited for the lock.
    if cache.holds(f) {
        progress.advance(f, f.size);
        return Ok(f.size);
    }
    cache.blobs()?;
    let path = cache.incomplete(&f.etag);
    let mut part = Partial::open(&path)?;
    if part.len > f.size {
        part.restart(&path)?;
    }
    let had = part.len;
    progress.advance(f, had);
    let mut tries = 0;
    loop {
        let at = Target { repo, commit, url };
        match fetch_rest(hub, &at, &path, &mut part, f, progress, stop) {
            Ok(()) => break,
            Err(e)
                if e.is_transient()
                    && tries + 1 < ATTEMPTS
                    && !stop.load(Ordering::Relaxed)
                    && !progress.stopped() =>
            {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100 << tries));
            }
            // Bytes from a server that broke the protocol (more than the file's size, another
            // range or commit than asked for) are no start for a later run.
            Err(e @ HubError::Protocol { .. }) => {
                drop(part);
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
            // Otherwise the bytes so far stay for the next run to continue from.
            Err(e) => return Err(e),
        }
    }
    // An LFS file is checked against the sha256 the Hub states, any other against its git
    // blob id.
    let (hash, actual) = match &f.sha256 {
        Some(_) => ("sha256", format!("{:x}", part.hasher.clone().finalize())),
        None => ("git blob id", git_blob_id(&path, part.len, f.etag.len())?),
    };
    let expected = f.sha256.clone().unwrap_or_else(|| f.etag.clone());
    let got = part.len;
    if got != f.size || actual != expected {
        drop(part);
        let _ = std::fs::remove_file(&path);
        return Err(HubError::Mismatch {
            path: f.path.clone(),
            size: got,
            hash,
            actual,
            expected_size: f.size,
            expected,
        });
    }
    part.file.sync_all().map_err(FileError::io(&path))?;
    drop(part);
    let blob = cache.blob(&f.etag);
    std::fs::rename(&path, &blob).map_err(FileError::io(&blob))?;
    Ok(had)
}

/// The git object id of a file's `len` bytes as a blob, `"blob <len>\0"` and the bytes hashed
/// with sha1 (a 40-digit id) or sha256 (64, a repository in git's sha256 format): what the Hub
/// lists for a file outside LFS.
fn git_blob_id(path: &Path, len: u64, id_digits: usize) -> Result<String, HubError> {
    fn hashed<D: Digest>(path: &Path, len: u64) -> std::io::Result<Vec<u8>> {
        let mut digest = D::new();
        digest.update(format!("blob {len}\0"));
        let mut file = File::open(path)?;
        let mut buf = vec![0u8; BUFFER];
        loop {
            match file.read(&mut buf)? {
                0 => return Ok(digest.finalize().to_vec()),
                n => digest.update(&buf[..n]),
            }
        }
    }
    let id = match id_digits {
        64 => hashed::<Sha256>(path, len),
        _ => hashed::<sha1::Sha1>(path, len),
    };
    let id = id.map_err(FileError::io(path))?;
    Ok(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where a file comes from: its repository, the commit the list named, its `resolve` URL.
struct Target<'a> {
    repo: &'a HubRepo,
    commit: &'a str,
    url: &'a str,
}

/// Appends the rest of the file (from `part.len`) to the partial file.
fn fetch_rest(
    hub: &Hub,
    at: &Target,
    path: &Path,
    part: &mut Partial,
    f: &HubFile,
    progress: &dyn PullProgress,
    stop: &AtomicBool,
) -> Result<(), HubError> {
    let Target { repo, commit, url } = *at;
    let start = part.len;
    if start == f.size && start > 0 {
        return Ok(());
    }
    let (response, resolved) = hub.resolve(url, &|r| {
        if start > 0 {
            r.header(RANGE, format!("bytes={start}-"))
        } else {
            r
        }
    })?;
    let protocol = |reason: String| HubError::Protocol {
        url: url.to_string(),
        reason,
    };
    // The Hub's own word on the file, where it gives it, must be the list's: otherwise the
    // bytes would be of another commit or another file, and are not fetched at all.
    if let Some(served) = resolved.commit.filter(|c| c != commit) {
        return Err(protocol(format!(
            "the Hub serves `{}` from commit {} for a pull of commit {commit}",
            f.path,
            printable(&served, 80)
        )));
    }
    if let Some((etag, sha)) =
        (resolved.linked_etag.zip(f.sha256.as_ref())).filter(|(e, s)| e != *s)
    {
        return Err(protocol(format!(
            "the Hub's ETag for `{}` is {}, but its file list states sha256 {sha}; nothing was \
             stored",
            f.path,
            printable(&etag, 80)
        )));
    }
    match response.status() {
        StatusCode::PARTIAL_CONTENT => {
            let range = response
                .headers()
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !range.starts_with(&format!("bytes {start}-")) {
                return Err(protocol(format!(
                    "asked for bytes from {start}, the server sent `Content-Range: {}`",
                    printable(range, 80)
                )));
            }
        }
        // The server ignored the range and sends the whole file.
        StatusCode::OK if start > 0 => part.restart(path)?,
        _ => {}
    }
    let mut response = check_status(hub, repo, url, response)?;
    let mut buf = vec![0u8; BUFFER];
    loop {
        if stop.load(Ordering::Relaxed) || progress.stopped() {
            return Err(HubError::Stopped);
        }
        let n = match response.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(hub.read_error(url, &e)),
        };
        if part.len + n as u64 > f.size {
            return Err(protocol(format!(
                "the server sends more than the {} bytes the Hub states for `{}`",
                f.size, f.path
            )));
        }
        part.file
            .write_all(&buf[..n])
            .map_err(FileError::io(path))?;
        part.hasher.update(&buf[..n]);
        part.len += n as u64;
        progress.advance(f, n as u64);
    }
    if part.len < f.size {
        return Err(HubError::Network {
            url: url.to_string(),
            reason: format!(
                "the download broke off after {} of {} bytes",
                part.len, f.size
            ),
        });
    }
    Ok(())
}
