//! A Hugging Face Hub on 127.0.0.1 for the tests, serving one folder as a repository the way
//! the Hub does: the revision's file list with sizes, blob ids and LFS sha256
//! (`/api/models/{repo}/revision/{rev}`), `resolve` URLs that answer small files themselves
//! and send LFS files (`*.safetensors`) to a second, "CDN" origin, with `ETag`,
//! `X-Linked-Etag`, `X-Linked-Size` and `X-Repo-Commit`, and `Range` on both. It counts the
//! file bytes it sends and records every request, with its `Authorization`. Asked to, it is a
//! hostile Hub: a file listed at another size, sent as zeros without end, or sent two bytes a
//! second (and noting when the client hangs up).

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The commit every revision of the test repository names.
pub const COMMIT: &str = "4f2b8e1c0d9a7b6c5e4f3a2b1c0d9e8f7a6b5c4d";

/// One file of the repository.
#[derive(Clone)]
pub struct Served {
    pub path: String,
    pub bytes: Bytes,
    pub sha256: String,
    /// A stand-in for the git blob id (40 hex digits, as the Hub's are).
    pub blob_id: String,
    pub lfs: bool,
}

/// A request the servers answered: which origin, the path, its `Range` and `Authorization`.
#[derive(Clone, Debug)]
pub struct Seen {
    pub origin: &'static str,
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

pub struct HubState {
    /// `OWNER/REPO`.
    pub repo: String,
    pub files: Vec<Served>,
    /// Requests without `Authorization: Bearer <token>` are refused with 401 (a gated model).
    pub token: Option<String>,
    /// Paths whose next download breaks off halfway, once.
    pub cut_once: Mutex<HashSet<String>>,
    /// A path whose sha256 the list states wrongly.
    pub wrong_sha256: Mutex<Option<String>>,
    /// A path served with its last byte changed (its size and listed ids unchanged).
    pub altered: Mutex<Option<String>>,
    /// A path the list states at this size, whatever its bytes.
    pub listed_size: Mutex<Option<(String, u64)>>,
    /// A path whose download is zeros without end.
    pub endless: Mutex<Option<String>>,
    /// A path whose download sends two bytes a second.
    pub slow: Mutex<Option<String>>,
    /// Set when a slow download's connection ends (the client hung up).
    pub slow_dropped: AtomicBool,
    /// File bytes sent, by either origin.
    pub bytes_sent: AtomicU64,
    pub seen: Mutex<Vec<Seen>>,
    cdn: Mutex<String>,
}

/// The two servers; they stop with the test process.
pub struct HubServer {
    pub url: String,
    pub cdn_url: String,
    pub state: Arc<HubState>,
    _runtime: tokio::runtime::Runtime,
}

impl HubServer {
    /// Serves the files under `dir` as `repo` (`OWNER/REPO`).
    pub fn start(dir: &Path, repo: &str, token: Option<&str>) -> HubServer {
        let mut files = Vec::new();
        collect(dir, dir, &mut files);
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let state = Arc::new(HubState {
            repo: repo.to_string(),
            files,
            token: token.map(str::to_string),
            cut_once: Mutex::new(HashSet::new()),
            wrong_sha256: Mutex::new(None),
            altered: Mutex::new(None),
            listed_size: Mutex::new(None),
            endless: Mutex::new(None),
            slow: Mutex::new(None),
            slow_dropped: AtomicBool::new(false),
            bytes_sent: AtomicU64::new(0),
            seen: Mutex::new(Vec::new()),
            cdn: Mutex::new(String::new()),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let hub = Router::new()
            .route("/api/models/{owner}/{name}/revision/{rev}", get(listing))
            .route("/{owner}/{name}/resolve/{rev}/{*path}", get(resolve))
            .with_state(state.clone());
        let cdn = Router::new()
            .route("/lfs/{sha}", get(cdn_file))
            .with_state(state.clone());
        let serve = |router: Router| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.set_nonblocking(true).unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let _entered = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            runtime.spawn(async move { axum::serve(listener, router).await });
            url
        };
        let url = serve(hub);
        let cdn_url = serve(cdn);
        *state.cdn.lock().unwrap() = cdn_url.clone();
        HubServer {
            url,
            cdn_url,
            state,
            _runtime: runtime,
        }
    }

    pub fn bytes_sent(&self) -> u64 {
        self.state.bytes_sent.load(Ordering::Relaxed)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn file(&self, path: &str) -> &Served {
        self.state.files.iter().find(|f| f.path == path).unwrap()
    }
}

/// The id git gives the bytes as a blob: what the Hub lists for a file outside LFS.
fn git_blob_id(bytes: &[u8]) -> String {
    let mut sha1 = sha1::Sha1::new();
    sha1.update(format!("blob {}\0", bytes.len()));
    sha1.update(bytes);
    format!("{:x}", sha1.finalize())
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<Served>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path: PathBuf = entry.unwrap().path();
        if path.is_dir() {
            collect(root, &path, out);
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let sha256 = format!("{:x}", Sha256::digest(&bytes));
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        out.push(Served {
            lfs: rel.ends_with(".safetensors"),
            blob_id: git_blob_id(&bytes),
            path: rel,
            bytes: Bytes::from(bytes),
            sha256,
        });
    }
}

/// Records the request; the 401 a gated repository answers without the token.
fn admit(
    state: &HubState,
    origin: &'static str,
    path: &str,
    headers: &HeaderMap,
) -> Option<Response> {
    let value = |h: header::HeaderName| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let authorization = value(header::AUTHORIZATION);
    state.seen.lock().unwrap().push(Seen {
        origin,
        path: path.to_string(),
        range: value(header::RANGE),
        authorization: authorization.clone(),
    });
    let token = state.token.as_ref().filter(|_| origin == "hub")?;
    if authorization == Some(format!("Bearer {token}")) {
        return None;
    }
    Some(
        (
            StatusCode::UNAUTHORIZED,
            [
                ("x-error-code", "GatedRepo"),
                ("x-error-message", "Access to this model is restricted."),
            ],
            "{\"error\": \"Access to this model is restricted.\"}",
        )
            .into_response(),
    )
}

fn known_revision(state: &HubState, repo: &str, rev: &str) -> bool {
    repo == state.repo && (rev == "main" || rev == COMMIT)
}

async fn listing(
    State(state): State<Arc<HubState>>,
    UrlPath((owner, name, rev)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = admit(
        &state,
        "hub",
        &format!("/api/models/{owner}/{name}"),
        &headers,
    ) {
        return refused;
    }
    if !known_revision(&state, &format!("{owner}/{name}"), &rev) {
        return (
            StatusCode::NOT_FOUND,
            "{\"error\": \"Repository not found\"}",
        )
            .into_response();
    }
    let wrong = state.wrong_sha256.lock().unwrap().clone();
    let listed = state.listed_size.lock().unwrap().clone();
    let siblings: Vec<serde_json::Value> = state
        .files
        .iter()
        .map(|f| {
            let size = match &listed {
                Some((path, size)) if *path == f.path => *size,
                _ => f.bytes.len() as u64,
            };
            let mut s = serde_json::json!({
                "rfilename": f.path, "size": size, "blobId": f.blob_id,
            });
            if f.lfs {
                let sha = if wrong.as_deref() == Some(&f.path) {
                    "0".repeat(64)
                } else {
                    f.sha256.clone()
                };
                s["lfs"] = serde_json::json!({"sha256": sha, "size": size, "pointerSize": 134});
            }
            s
        })
        .collect();
    axum::Json(serde_json::json!({
        "id": state.repo, "sha": COMMIT, "private": false, "gated": state.token.is_some(),
        "siblings": siblings,
    }))
    .into_response()
}

async fn resolve(
    State(state): State<Arc<HubState>>,
    UrlPath((owner, name, rev, path)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = admit(
        &state,
        "hub",
        &format!("/{owner}/{name}/resolve/{rev}/{path}"),
        &headers,
    ) {
        return refused;
    }
    let Some(f) = state
        .files
        .iter()
        .find(|f| f.path == path)
        .filter(|_| known_revision(&state, &format!("{owner}/{name}"), &rev))
    else {
        return (
            StatusCode::NOT_FOUND,
            [("x-error-code", "EntryNotFound")],
            "",
        )
            .into_response();
    };
    if f.lfs {
        let location = format!("{}/lfs/{}", state.cdn.lock().unwrap(), f.sha256);
        // What the list states, as a Hub whose record and bytes differ would say it.
        let linked = match state.wrong_sha256.lock().unwrap().as_deref() == Some(&f.path) {
            true => "0".repeat(64),
            false => f.sha256.clone(),
        };
        return (
            StatusCode::FOUND,
            [
                (header::LOCATION.as_str(), location),
                ("x-linked-etag", format!("\"{linked}\"")),
                ("x-linked-size", f.bytes.len().to_string()),
                ("x-repo-commit", COMMIT.to_string()),
                (header::ETAG.as_str(), format!("\"{}\"", f.blob_id)),
            ],
        )
            .into_response();
    }
    let mut response = send(state.clone(), f, &headers);
    let h = response.headers_mut();
    h.insert(header::ETAG, format!("\"{}\"", f.blob_id).parse().unwrap());
    h.insert("x-repo-commit", COMMIT.parse().unwrap());
    response
}

async fn cdn_file(
    State(state): State<Arc<HubState>>,
    UrlPath(sha): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let _ = admit(&state, "cdn", &format!("/lfs/{sha}"), &headers);
    match state.files.iter().find(|f| f.sha256 == sha) {
        Some(f) => send(state.clone(), f, &headers),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Sets [`HubState::slow_dropped`] when the slow body it goes with is dropped.
struct NoteDrop(Arc<HubState>);

impl Drop for NoteDrop {
    fn drop(&mut self) {
        self.0.slow_dropped.store(true, Ordering::SeqCst);
    }
}

/// Zeros without end, counted as sent.
fn endless(state: Arc<HubState>) -> Body {
    let chunk = Bytes::from(vec![0u8; 64 << 10]);
    Body::from_stream(futures_util::stream::repeat_with(move || {
        state
            .bytes_sent
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Ok::<_, std::io::Error>(chunk.clone())
    }))
}

/// `bytes` at two a second; the end of the connection is noted.
fn slow(state: Arc<HubState>, bytes: Bytes) -> Body {
    let guard = NoteDrop(state);
    Body::from_stream(futures_util::stream::unfold(
        (guard, bytes),
        |(guard, mut rest)| async move {
            if rest.is_empty() {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let part = rest.split_to(1);
            guard.0.bytes_sent.fetch_add(1, Ordering::Relaxed);
            Some((Ok::<_, std::io::Error>(part), (guard, rest)))
        },
    ))
}

/// The file, or the part `Range: bytes=N-` asks for; broken off halfway once if asked to.
fn send(state: Arc<HubState>, f: &Served, headers: &HeaderMap) -> Response {
    if state.endless.lock().unwrap().as_deref() == Some(&f.path) {
        return Response::new(endless(state));
    }
    let len = f.bytes.len();
    let start = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|s| s.parse::<usize>().ok());
    let from = start.unwrap_or(0).min(len);
    let mut body = f.bytes.slice(from..);
    if state.altered.lock().unwrap().as_deref() == Some(&f.path) && !body.is_empty() {
        let mut changed = body.to_vec();
        *changed.last_mut().unwrap() ^= 1;
        body = Bytes::from(changed);
    }
    let cut = state.cut_once.lock().unwrap().remove(&f.path);
    let status = if start.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    let mut out = Response::builder()
        .status(status)
        .header(header::CONTENT_LENGTH, body.len())
        .header(header::ACCEPT_RANGES, "bytes");
    if start.is_some() {
        out = out.header(
            header::CONTENT_RANGE,
            format!("bytes {from}-{}/{len}", len.saturating_sub(1)),
        );
    }
    let body = if state.slow.lock().unwrap().as_deref() == Some(&f.path) {
        slow(state.clone(), body)
    } else if cut {
        let half = body.slice(..body.len() / 2);
        state
            .bytes_sent
            .fetch_add(half.len() as u64, Ordering::Relaxed);
        let parts: Vec<Result<Bytes, std::io::Error>> =
            vec![Ok(half), Err(std::io::Error::other("the connection broke"))];
        // A pause after each part, so the first is on the wire before the connection drops.
        Body::from_stream(futures_util::StreamExt::then(
            futures_util::stream::iter(parts),
            |part| async {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                part
            },
        ))
    } else {
        state
            .bytes_sent
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        Body::from(body)
    };
    out.body(body).unwrap()
}
