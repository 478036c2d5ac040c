//! `pull`: a model's manifest from a registry, then every blob the store lacks, then the
//! manifest, written last.
//!
//! Blobs download several at once; a large one comes in ranged parts, one after another, so it
//! is hashed while written and an interrupted download continues from the bytes it has (its
//! partial file, `blobs/.partial-<hex>`, is kept for the next run, and swept by `gc`). The store
//! lock is held shared for the whole run, as an import holds it, so no `gc` sweeps a blob that
//! is downloaded but not yet referenced.
//!
//! A blob is renamed into place without an fsync of its own: its writing to the disk starts as
//! it completes, and one sync of the filesystem, before the manifest, makes them all durable.

use super::client::Client;
use super::{for_each_parallel_with, printable, repository, Progress, RegistryError};
use crate::store::blob::{BlobError, BlobWriter};
use crate::store::manifest::{Manifest, MANIFEST_MEDIA_TYPE, MAX_MANIFEST_BYTES};
use crate::store::{blob, ModelName, Store};
use reqwest::header::{ACCEPT, CONTENT_RANGE, CONTENT_TYPE, RANGE};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The OCI spelling of a single-image manifest, accepted as well as Docker's.
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// Blobs larger than this are fetched in ranged parts of this size.
pub const PART_SIZE: u64 = 64 << 20;

/// Tries per blob for failures a retry may cure (a dropped connection, a stall, a 5xx).
const ATTEMPTS: u32 = 3;

/// Bytes gathered from a response before they are hashed and written: a tensor blob of a
/// few MiB takes a few writes, and each thread keeps its one buffer from blob to blob.
const BATCH: usize = 1 << 20;

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PullSummary {
    /// Distinct blobs the manifest references.
    pub blobs: usize,
    pub blobs_downloaded: usize,
    pub bytes_downloaded: u64,
    pub blobs_present: usize,
    pub bytes_present: u64,
    /// Bytes an earlier, interrupted run had already downloaded.
    pub bytes_resumed: u64,
}

/// One blob to fetch.
#[derive(Debug, Clone)]
pub(crate) struct Wanted {
    pub digest: String,
    pub size: u64,
}

/// Pulls `name` (`host/namespace/model:tag`, defaults as the store resolves them) into `store`.
pub fn pull(
    store: &Store,
    name: &str,
    client: &Client,
    parallel: usize,
    progress: &dyn Progress,
) -> Result<PullSummary, RegistryError> {
    let name = ModelName::parse(name).map_err(crate::store::StoreError::from)?;
    let _lock = store.lock_for_writing()?;
    let (bytes, manifest) = fetch_manifest(client, &name)?;
    let wanted = distinct_blobs(&manifest)?;
    let mut summary = PullSummary {
        blobs: wanted.len(),
        ..PullSummary::default()
    };
    let mut missing = Vec::new();
    for w in wanted {
        let path = store.blob_path(&w.digest)?;
        let present = std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == w.size)
            && blob::check_inside_store(&store.root, &w.digest, &path).is_ok();
        if present {
            summary.blobs_present += 1;
            summary.bytes_present = summary.bytes_present.saturating_add(w.size);
        } else {
            missing.push(w);
        }
    }
    let total = missing.iter().fold(0u64, |n, w| n.saturating_add(w.size));
    progress.start(total, missing.len());
    let repo = repository(&name);
    let stop = AtomicBool::new(false);
    let resumed = std::sync::atomic::AtomicU64::new(0);
    let batch = || vec![0u8; BATCH];
    for_each_parallel_with(&missing, parallel, &stop, batch, |buf, w| {
        let had = download(store, client, &repo, w, buf, progress, &stop)?;
        resumed.fetch_add(had, Ordering::Relaxed);
        progress.blob_done();
        Ok(())
    })?;
    // Blobs were renamed into place unsynced: made durable here at once, before the manifest
    // that names them.
    let paths = missing
        .iter()
        .map(|w| store.blob_path(&w.digest))
        .collect::<Result<Vec<_>, _>>()?;
    blob::sync_filesystem(&store.root, &paths)?;
    summary.blobs_downloaded = missing.len();
    summary.bytes_downloaded = total;
    summary.bytes_resumed = resumed.into_inner();
    store.check_blobs_present(&manifest)?;
    // The registry's bytes, as they are: the stored manifest's digest is the registry's.
    let path = store.root.join(name.manifest_path());
    let dir = path.parent().expect("manifest paths have parents");
    std::fs::create_dir_all(dir)
        .map_err(|e| crate::store::StoreError::from(crate::files::FileError::io(dir)(e)))?;
    crate::store::write_atomic(&path, &bytes)?;
    Ok(summary)
}

/// The manifest of `name`: bounded, parsed, its digests checked, and checked against the
/// digest the registry says it has.
pub fn fetch_manifest(
    client: &Client,
    name: &ModelName,
) -> Result<(Vec<u8>, Manifest), RegistryError> {
    let url = client.url(&format!("/v2/{}/manifests/{}", repository(name), name.tag));
    let response = client.send(&url, &|http| {
        http.get(&url).header(
            ACCEPT,
            format!("{MANIFEST_MEDIA_TYPE}, {OCI_MANIFEST_MEDIA_TYPE}"),
        )
    })?;
    if response.status() == StatusCode::NOT_FOUND {
        return Err(RegistryError::NotInRegistry {
            model: name.short(),
            host: name.host.clone(),
            url,
        });
    }
    if !response.status().is_success() {
        return Err(client.status_error(&url, response));
    }
    let claimed = response
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let bytes = client.read_small(&url, response, MAX_MANIFEST_BYTES, "manifest")?;
    let bad = |reason: String| RegistryError::Protocol {
        url: url.clone(),
        reason,
    };
    if let Some(claimed) = claimed.filter(|c| c.starts_with("sha256:")) {
        let actual = format!("sha256:{:x}", Sha256::digest(&bytes));
        if !crate::store::same_digest(&claimed, &actual) {
            return Err(bad(format!(
                "the manifest hashes to `{actual}`, but the registry says `{}`; it was damaged \
                 on the way or in the registry",
                printable(&claimed, 80)
            )));
        }
    }
    let manifest = Manifest::parse(&bytes).map_err(|e| {
        bad(format!(
            "the manifest (`{}`) is no model manifest: {}",
            printable(&content_type, 80),
            printable(&e, 200)
        ))
    })?;
    if manifest.media_type != MANIFEST_MEDIA_TYPE && manifest.media_type != OCI_MANIFEST_MEDIA_TYPE
    {
        return Err(bad(format!(
            "the manifest's mediaType is `{}`; zimage pulls single models ({MANIFEST_MEDIA_TYPE})",
            printable(&manifest.media_type, 80)
        )));
    }
    Ok((bytes, manifest))
}

/// Each blob once; a digest listed twice with two sizes is a broken manifest.
pub(crate) fn distinct_blobs(manifest: &Manifest) -> Result<Vec<Wanted>, RegistryError> {
    let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let mut out = Vec::new();
    for layer in std::iter::once(&manifest.config).chain(&manifest.layers) {
        let hex = blob::digest_hex(&layer.digest)?.to_ascii_lowercase();
        match seen.get(&hex) {
            Some(&size) if size != layer.size => {
                return Err(RegistryError::ConflictingSizes {
                    digest: layer.digest.clone(),
                    size,
                    other: layer.size,
                })
            }
            Some(_) => {}
            None => {
                seen.insert(hex.clone(), layer.size);
                out.push(Wanted {
                    digest: format!("sha256:{hex}"),
                    size: layer.size,
                });
            }
        }
    }
    Ok(out)
}

/// Downloads one blob into place, continuing an earlier run's partial file. Returns the bytes
/// that earlier run had.
fn download(
    store: &Store,
    client: &Client,
    repo: &str,
    w: &Wanted,
    buf: &mut [u8],
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<u64, RegistryError> {
    let url = client.url(&format!("/v2/{repo}/blobs/{}", w.digest));
    let (writer, had) = BlobWriter::resume(&store.root, &w.digest)?;
    let mut writer = writer.without_sync();
    let had = if had > w.size {
        writer.restart()?;
        0
    } else {
        had
    };
    progress.advance(had);
    let mut tries = 0;
    loop {
        match fetch_into(client, &url, &mut writer, w.size, buf, progress, stop) {
            Ok(()) => break,
            Err(e) if e.is_transient() && tries + 1 < ATTEMPTS && !stop.load(Ordering::Relaxed) => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100 << tries));
            }
            // Bytes from a registry that breaks the protocol are not worth resuming from, and a
            // pull it failed leaves nothing behind; a stall's or a dropped connection's are kept.
            Err(e)
                if matches!(e, RegistryError::Protocol { .. }) || stop.load(Ordering::Relaxed) =>
            {
                writer.discard();
                return Err(e);
            }
            Err(e) => return Err(e),
        }
    }
    match writer.finish_expecting(&w.digest, w.size) {
        Ok(_) => Ok(had),
        // Bytes an earlier run left may be what is wrong: once more from the start.
        Err(BlobError::Mismatch { .. }) if had > 0 => {
            let (writer, _) = BlobWriter::resume(&store.root, &w.digest)?;
            let mut writer = writer.without_sync();
            writer.restart()?;
            fetch_into(client, &url, &mut writer, w.size, buf, progress, stop)?;
            writer.finish_expecting(&w.digest, w.size)?;
            Ok(0)
        }
        Err(e) => Err(mismatch_from(e, &url)),
    }
}

/// Says where a mismatched blob came from.
fn mismatch_from(e: BlobError, url: &str) -> RegistryError {
    match e {
        BlobError::Mismatch { .. } => RegistryError::Protocol {
            url: url.to_string(),
            reason: e.to_string(),
        },
        other => other.into(),
    }
}

/// Appends the rest of the blob (from `writer.len()` to `size`) to `writer`, in ranged parts.
fn fetch_into(
    client: &Client,
    url: &str,
    writer: &mut BlobWriter,
    size: u64,
    buf: &mut [u8],
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<(), RegistryError> {
    // An empty blob still takes one request, to learn that the registry has it.
    let mut requested = false;
    loop {
        let start = writer.len();
        if start >= size && (size > 0 || requested) {
            return Ok(());
        }
        requested = true;
        let end = start.saturating_add(PART_SIZE).min(size);
        let ranged = start > 0 || end < size;
        let response = client.send(url, &|http| {
            let request = http.get(url);
            if ranged {
                request.header(RANGE, format!("bytes={start}-{}", end - 1))
            } else {
                request
            }
        })?;
        let status = response.status();
        let expect = match status {
            StatusCode::PARTIAL_CONTENT if ranged => {
                check_content_range(url, &response, start, end, size)?;
                end - start
            }
            StatusCode::OK => {
                // The registry ignored the range and sends the whole blob.
                if start > 0 {
                    writer.restart()?;
                }
                size
            }
            StatusCode::NOT_FOUND => {
                return Err(RegistryError::Protocol {
                    url: url.to_string(),
                    reason: "the registry lists this blob in the manifest but does not have it \
                             (404)"
                        .into(),
                })
            }
            _ => return Err(client.status_error(url, response)),
        };
        if let Some(n) = response.content_length().filter(|&n| n != expect) {
            return Err(RegistryError::Protocol {
                url: url.to_string(),
                reason: format!(
                    "the registry announces {n} bytes where the manifest's size leaves {expect}"
                ),
            });
        }
        let mut response = response;
        let mut got = 0u64;
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(RegistryError::Stopped);
            }
            let (n, read) = fill(&mut response, buf);
            got += n as u64;
            if got > expect {
                return Err(RegistryError::Protocol {
                    url: url.to_string(),
                    reason: format!(
                        "the registry sent more than the {expect} bytes the manifest's size \
                         leaves; stopped, and nothing was kept"
                    ),
                });
            }
            // The bytes of a response that broke off are kept: a retry continues after them.
            writer.write(&buf[..n])?;
            progress.advance(n as u64);
            if read.map_err(|e| client.read_error(url, &e))? {
                break;
            }
        }
        if got < expect {
            return Err(RegistryError::Http {
                url: url.to_string(),
                reason: format!("the download broke off after {got} of {expect} bytes"),
            });
        }
    }
}

/// Reads into `buf` until it is full, the body ends or a read fails: the bytes read, and
/// whether the body ended.
fn fill(from: &mut impl Read, buf: &mut [u8]) -> (usize, std::io::Result<bool>) {
    let mut filled = 0;
    while filled < buf.len() {
        match from.read(&mut buf[filled..]) {
            Ok(0) => return (filled, Ok(true)),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (filled, Err(e)),
        }
    }
    (filled, Ok(false))
}

/// A 206's `Content-Range: bytes a-b/n` must be the part asked for.
fn check_content_range(
    url: &str,
    response: &reqwest::blocking::Response,
    start: u64,
    end: u64,
    size: u64,
) -> Result<(), RegistryError> {
    let value = response
        .headers()
        .get(CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let want = format!("bytes {start}-{}/", end - 1);
    let total_ok = value
        .strip_prefix(&want)
        .is_some_and(|t| t == "*" || t == size.to_string());
    if total_ok {
        return Ok(());
    }
    Err(RegistryError::Protocol {
        url: url.to_string(),
        reason: format!(
            "asked for bytes {start}-{} of {size}, the registry sent `Content-Range: {}`",
            end - 1,
            printable(value, 80)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out `chunks`, then fails as a dropped connection does.
    struct Broken {
        chunks: Vec<Vec<u8>>,
    }

    impl Read for Broken {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.chunks.is_empty() {
                return Err(std::io::ErrorKind::ConnectionReset.into());
            }
            let chunk = self.chunks.remove(0);
            buf[..chunk.len()].copy_from_slice(&chunk);
            Ok(chunk.len())
        }
    }

    #[test]
    fn a_batch_gathers_reads_until_the_buffer_is_full_or_the_body_ends() {
        let mut buf = [0u8; 5];
        let mut body: &[u8] = b"abcdefg";
        let (n, ended) = fill(&mut body, &mut buf);
        assert_eq!((n, ended.unwrap()), (5, false));
        assert_eq!(&buf, b"abcde");
        let (n, ended) = fill(&mut body, &mut buf);
        assert_eq!((n, ended.unwrap()), (2, true));
        assert_eq!(&buf[..2], b"fg");
    }

    #[test]
    fn the_bytes_before_a_broken_read_are_handed_over_with_the_error() {
        let mut buf = [0u8; 8];
        let mut body = Broken {
            chunks: vec![b"abc".to_vec(), b"de".to_vec()],
        };
        let (n, ended) = fill(&mut body, &mut buf);
        assert_eq!(n, 5);
        assert_eq!(&buf[..5], b"abcde");
        assert_eq!(
            ended.unwrap_err().kind(),
            std::io::ErrorKind::ConnectionReset
        );
    }
}
