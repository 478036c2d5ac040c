//! `push`: the blobs a registry lacks (asked with `HEAD`), uploaded several at once (`POST`,
//! then one `PUT ?digest=`, or `PATCH` parts and a closing `PUT` for a large blob), then the
//! manifest, `PUT` last so the registry never holds a model whose blobs it lacks.

use super::client::Client;
use super::pull::distinct_blobs;
use super::{for_each_parallel, repository, Progress, RegistryError};
use crate::store::manifest::{Manifest, MAX_MANIFEST_BYTES};
use crate::store::{blob, ModelName, Store, StoreError};
use reqwest::blocking::Body;
use reqwest::header::{CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, LOCATION};
use reqwest::StatusCode;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Blobs larger than this are uploaded in `PATCH` parts of this size.
pub const CHUNK_SIZE: u64 = 64 << 20;

/// Tries per blob for failures a retry may cure.
const ATTEMPTS: u32 = 3;

/// The slowest upload rate waited for before a request counts as stalled: a part of
/// `CHUNK_SIZE` may take the stall limit plus a minute.
const SLOWEST_UPLOAD_BYTES_PER_SEC: u64 = 1 << 20;

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PushSummary {
    pub blobs: usize,
    pub blobs_uploaded: usize,
    pub bytes_uploaded: u64,
    pub blobs_present: usize,
    pub bytes_present: u64,
}

/// Pushes the stored model `name` to `dest` on `client`'s registry.
pub fn push(
    store: &Store,
    name: &str,
    dest: &ModelName,
    client: &Client,
    parallel: usize,
    progress: &dyn Progress,
) -> Result<PushSummary, RegistryError> {
    let _lock = store.lock_for_reading()?;
    let model = store.open(name)?;
    let path = store.root.join(model.name.manifest_path());
    // The file's own bytes go up, so the registry's digest of the manifest is the store's.
    let bytes = crate::files::read_bounded(&path, MAX_MANIFEST_BYTES, "manifest")
        .map_err(StoreError::from)?;
    let manifest = Manifest::parse(&bytes).map_err(|reason| StoreError::BadManifest {
        path: path.clone(),
        reason,
    })?;
    let wanted = distinct_blobs(&manifest)?;
    let mut local = Vec::new();
    for w in wanted {
        let p = store.blob_path(&w.digest)?;
        blob::check_inside_store(&store.root, &w.digest, &p)?;
        let size = std::fs::metadata(&p)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len());
        if size != Some(w.size) {
            return Err(RegistryError::LocalBlob {
                digest: w.digest.clone(),
                model: model.name.short(),
                expected: w.size,
                found: size,
                blobs: store.root.join("blobs"),
            });
        }
        local.push((w, p));
    }
    let repo = repository(dest);
    let stop = AtomicBool::new(false);
    let uploaded = AtomicUsize::new(0);
    let uploaded_bytes = AtomicU64::new(0);
    let total = local
        .iter()
        .fold(0u64, |n, (w, _)| n.saturating_add(w.size));
    progress.start(total, local.len());
    for_each_parallel(&local, parallel, &stop, |(w, p)| {
        let url = client.url(&format!("/v2/{repo}/blobs/{}", w.digest));
        let response = client.send(&url, &|http| http.head(&url))?;
        match response.status() {
            s if s.is_success() => {}
            StatusCode::NOT_FOUND => {
                upload_retrying(client, &repo, &w.digest, p, w.size, progress)?;
                uploaded.fetch_add(1, Ordering::Relaxed);
                uploaded_bytes.fetch_add(w.size, Ordering::Relaxed);
                progress.blob_done();
                return Ok(());
            }
            _ => return Err(client.status_error(&url, response)),
        }
        progress.advance(w.size);
        progress.blob_done();
        Ok(())
    })?;
    put_manifest(client, &repo, &dest.tag, &manifest.media_type, bytes)?;
    let blobs_uploaded = uploaded.into_inner();
    let bytes_uploaded = uploaded_bytes.into_inner();
    Ok(PushSummary {
        blobs: local.len(),
        blobs_uploaded,
        bytes_uploaded,
        blobs_present: local.len() - blobs_uploaded,
        bytes_present: total.saturating_sub(bytes_uploaded),
    })
}

fn put_manifest(
    client: &Client,
    repo: &str,
    tag: &str,
    media_type: &str,
    bytes: Vec<u8>,
) -> Result<(), RegistryError> {
    let url = client.url(&format!("/v2/{repo}/manifests/{tag}"));
    let response = client.send(&url, &|http| {
        http.put(&url)
            .header(CONTENT_TYPE, media_type)
            .body(bytes.clone())
    })?;
    if !response.status().is_success() {
        return Err(client.status_error(&url, response));
    }
    Ok(())
}

/// A blob to upload to `repo`: its digest, file and size.
struct Upload<'a> {
    repo: &'a str,
    digest: &'a str,
    path: &'a Path,
    size: u64,
}

fn upload_retrying(
    client: &Client,
    repo: &str,
    digest: &str,
    path: &Path,
    size: u64,
    progress: &dyn Progress,
) -> Result<(), RegistryError> {
    let mut tries = 0;
    let blob = Upload {
        repo,
        digest,
        path,
        size,
    };
    loop {
        match upload(client, &blob, progress) {
            Err(e) if e.is_transient() && tries + 1 < ATTEMPTS => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100 << tries));
            }
            other => return other,
        }
    }
}

/// One blob: an upload session, its parts, and the closing `PUT` with the digest.
fn upload(client: &Client, blob: &Upload, progress: &dyn Progress) -> Result<(), RegistryError> {
    let Upload {
        repo,
        digest,
        path,
        size,
    } = *blob;
    let start_url = client.url(&format!("/v2/{repo}/blobs/uploads/"));
    let response = client.send(&start_url, &|http| {
        http.post(&start_url).header(CONTENT_LENGTH, "0")
    })?;
    if response.status() != StatusCode::ACCEPTED {
        return Err(client.status_error(&start_url, response));
    }
    let mut location = next_location(client, &start_url, &response)?;
    let mut offset = 0u64;
    if size > CHUNK_SIZE {
        while offset < size {
            let len = CHUNK_SIZE.min(size - offset);
            let url = location.clone();
            let response = client.send(&url, &|http| {
                http.patch(&url)
                    .header(CONTENT_TYPE, "application/octet-stream")
                    .header(CONTENT_RANGE, format!("{offset}-{}", offset + len - 1))
                    .timeout(upload_timeout(client, len))
                    .body(section(path, offset, len))
            })?;
            if response.status() != StatusCode::ACCEPTED {
                return Err(client.status_error(&url, response));
            }
            location = next_location(client, &url, &response)?;
            offset += len;
            progress.advance(len);
        }
    }
    let mut url = reqwest::Url::parse(&location).map_err(|e| RegistryError::Protocol {
        url: location.clone(),
        reason: e.to_string(),
    })?;
    url.query_pairs_mut().append_pair("digest", digest);
    let url = url.to_string();
    let len = size - offset;
    let response = client.send(&url, &|http| {
        http.put(&url)
            .header(CONTENT_TYPE, "application/octet-stream")
            .timeout(upload_timeout(client, len))
            .body(section(path, offset, len))
    })?;
    if response.status() != StatusCode::CREATED {
        return Err(client.status_error(&url, response));
    }
    progress.advance(len);
    Ok(())
}

/// The stall limit, plus the time the slowest acceptable link takes to send `len` bytes.
fn upload_timeout(client: &Client, len: u64) -> Duration {
    client.options().stall_timeout + Duration::from_secs(len / SLOWEST_UPLOAD_BYTES_PER_SEC)
}

/// `len` bytes of `path` from `offset`, as a request body of known length.
fn section(path: &Path, offset: u64, len: u64) -> Body {
    struct Section {
        path: PathBuf,
        offset: u64,
        inner: Option<std::io::Take<std::fs::File>>,
        len: u64,
    }
    impl Read for Section {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.inner.is_none() {
                let mut f = std::fs::File::open(&self.path)?;
                f.seek(SeekFrom::Start(self.offset))?;
                self.inner = Some(f.take(self.len));
            }
            self.inner.as_mut().expect("opened above").read(buf)
        }
    }
    Body::sized(
        Section {
            path: path.to_path_buf(),
            offset,
            inner: None,
            len,
        },
        len,
    )
}

/// The upload session's URL for the next request, from `Location`.
fn next_location(
    client: &Client,
    url: &str,
    response: &reqwest::blocking::Response,
) -> Result<String, RegistryError> {
    let location = response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| RegistryError::Protocol {
            url: url.to_string(),
            reason: "the registry started an upload without a `Location` to send it to".into(),
        })?;
    client.resolve(url, location)
}
