//! `/api/pull` as Ollama answers it: `{"model": NAME}` pulls `hf.co/OWNER/REPO[:REVISION]`
//! from the Hugging Face Hub (`HF_ENDPOINT`, `HF_TOKEN` and the cache as `zimage pull` reads
//! them) or any other name from its registry; the answer is NDJSON lines of `status`, and of
//! `digest`, `total` and `completed` while bytes move, ending in `{"status": "success"}` or an
//! `{"error": …}` line. With `"stream": false`, one final object.

use super::errors::{Api, ApiError};
use super::AppState;
use crate::hub::{FetchOptions, HubEnv, HubFile, HubRepo, PullProgress};
use crate::registry::{Client, ClientOptions, Progress};
use crate::store::ImportOptions;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

const API: Api = Api::Ollama;

/// The most lines a second per file (a fast download would otherwise send one per read).
const LINE_INTERVAL: Duration = Duration::from_millis(100);

/// Blobs or files moved at once.
const PARALLEL: usize = 6;

#[derive(Deserialize)]
pub struct PullBody {
    #[serde(default, alias = "name")]
    model: String,
    #[serde(default)]
    insecure: bool,
    stream: Option<bool>,
}

impl super::NamesModel for PullBody {
    const API: Api = API;

    fn model(&self) -> &str {
        &self.model
    }
}

pub async fn pull(
    State(state): State<Arc<AppState>>,
    super::Named { body, .. }: super::Named<PullBody>,
) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let store = state.store.clone();
    tokio::task::spawn_blocking(move || {
        let lines = Lines {
            tx,
            files: Mutex::new(HashMap::new()),
            moved: AtomicU64::new(0),
            total: AtomicU64::new(0),
            last: Mutex::new(Instant::now()),
        };
        let last = match run(&store, &body.model, body.insecure, &lines) {
            Ok(()) => json!({"status": "success"}),
            Err(e) => json!({"error": crate::shown::escape_controls(&e)}),
        };
        lines.send(last);
    });
    if body.stream == Some(false) {
        let mut last = json!({"error": "the pull ended without an answer"});
        while let Some(line) = rx.recv().await {
            last = line;
        }
        return match last.get("error").and_then(Value::as_str) {
            Some(e) => ApiError::new(API, StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
            None => axum::Json(last).into_response(),
        };
    }
    let lines = futures_util::stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(bytes)), rx))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

/// The pull itself, on a blocking thread; its error in one line.
fn run(
    store: &crate::store::Store,
    name: &str,
    insecure: bool,
    lines: &Lines,
) -> Result<(), String> {
    if let Some(repo) = HubRepo::parse(name) {
        let repo = repo.map_err(|e| e.to_string())?;
        let opts = FetchOptions {
            parallel: PARALLEL,
            ..FetchOptions::default()
        };
        crate::hub::pull(
            store,
            &repo,
            None,
            &HubEnv::from_env(),
            &opts,
            &ImportOptions::default(),
            lines,
        )
        .map_err(|e| format!("pulling `{}`: {e}", repo.store_name))?;
        return Ok(());
    }
    let parsed = crate::store::ModelName::parse(name).map_err(|e| e.to_string())?;
    let client = Client::new(
        &parsed.host,
        ClientOptions {
            insecure,
            ..ClientOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    lines.send(json!({"status": "pulling manifest"}));
    crate::registry::pull(store, name, &client, PARALLEL, lines)
        .map_err(|e| format!("pulling `{}`: {e}", parsed.short()))?;
    Ok(())
}

/// Progress as Ollama's lines, at most one per file each [`LINE_INTERVAL`].
struct Lines {
    tx: UnboundedSender<Value>,
    /// Per file: bytes so far and when its last line went.
    files: Mutex<HashMap<String, (u64, Instant)>>,
    /// A registry pull's bytes so far, and their total.
    moved: AtomicU64,
    total: AtomicU64,
    last: Mutex<Instant>,
}

impl Lines {
    fn send(&self, line: Value) {
        // A client that left no longer reads; a Hub pull sees it through `stopped`.
        let _ = self.tx.send(line);
    }

    fn file_line(&self, f: &HubFile, bytes: u64, force: bool) {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let entry = files.entry(f.path.clone()).or_insert((0, Instant::now()));
        entry.0 += bytes;
        if !force && entry.1.elapsed() < LINE_INTERVAL {
            return;
        }
        entry.1 = Instant::now();
        self.send(json!({
            "status": format!("pulling {}", f.path),
            "digest": format!("sha256:{}", f.sha256.as_deref().unwrap_or(&f.etag)),
            "total": f.size,
            "completed": entry.0.min(f.size),
        }));
    }

    /// A line now and then: `force`, or when the last went a while ago.
    fn due(&self, force: bool) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if force || last.elapsed() >= LINE_INTERVAL {
            *last = Instant::now();
            return true;
        }
        false
    }
}

impl PullProgress for Lines {
    fn status(&self, status: &str) {
        self.send(json!({ "status": status }));
    }
    fn downloads(&self, files: &[&HubFile]) {
        for f in files {
            self.file_line(f, 0, true);
        }
    }
    fn advance(&self, file: &HubFile, bytes: u64) {
        self.file_line(file, bytes, false);
    }
    fn file_done(&self, file: &HubFile) {
        self.file_line(file, 0, true);
    }
    fn importing(&self, done: u64, total: u64) {
        if self.due(done == total) {
            self.send(json!({"status": "importing", "total": total, "completed": done}));
        }
    }
    /// The client left: its answer (the stream, or the one object it waited for) was dropped,
    /// so no one reads the lines and the pull stops rather than hold the Hub's connection.
    fn stopped(&self) -> bool {
        self.tx.is_closed()
    }
}

impl Progress for Lines {
    fn start(&self, bytes: u64, _: usize) {
        self.total.store(bytes, Ordering::Relaxed);
    }
    fn advance(&self, bytes: u64) {
        let moved = self.moved.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if self.due(false) {
            self.send(json!({
                "status": "pulling blobs",
                "total": self.total.load(Ordering::Relaxed),
                "completed": moved,
            }));
        }
    }
    fn blob_done(&self) {}
}
