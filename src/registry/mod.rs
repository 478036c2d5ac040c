//! Models to and from a registry that speaks the Docker Registry HTTP API v2 (OCI
//! distribution), as Ollama moves them: a manifest whose layers are per-tensor blobs.
//!
//! - [`client`]: HTTP, redirects, timeouts and the authentication dance;
//! - [`auth`]: credentials and `WWW-Authenticate` challenges;
//! - [`pull`](mod@pull): manifest and missing blobs into the store, verified, resumable;
//! - [`push`](mod@push): missing blobs and the manifest to the registry.
//!
//! Everything a registry sends is untrusted: digests and names are validated before they touch
//! the filesystem, sizes are bounded by the manifest, and a blob is renamed into place only
//! when its bytes hash to the digest asked for.

pub mod auth;
pub mod client;
pub mod pull;
pub mod push;

pub use auth::Credentials;
pub use client::{Client, ClientOptions};
pub use pull::{pull, PullSummary};
pub use push::{push, PushSummary};

use crate::store::{blob::BlobError, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{url}: {reason}")]
    Http { url: String, reason: String },
    #[error(
        "{url}: the registry answered {status}{detail}",
        detail = if .detail.is_empty() { String::new() } else { format!(" ({})", .detail) }
    )]
    Status {
        url: String,
        status: u16,
        detail: String,
    },
    #[error("{url}: {reason}")]
    Auth { url: String, reason: String },
    #[error("{url}: {reason}")]
    Protocol { url: String, reason: String },
    /// `--user` or a credentials file line that is not `[HOST ]USER:PASSWORD`.
    #[error("{what}: {problem}")]
    Credentials { what: String, problem: &'static str },
    #[error(transparent)]
    CredentialsFile(crate::files::FileError),
    #[error("cannot start the HTTP client: {reason}")]
    ClientStart { reason: String },
    /// A signal stopped the transfers.
    #[error("stopped before every transfer finished")]
    Stopped,
    #[error(
        "`{model}` is not in the registry `{host}` ({url} answered 404); check the name and tag"
    )]
    NotInRegistry {
        model: String,
        host: String,
        url: String,
    },
    #[error("the manifest lists blob `{digest}` as both {size} and {other} bytes; it is broken")]
    ConflictingSizes {
        digest: String,
        size: u64,
        other: u64,
    },
    /// A blob of the model to push is missing or truncated in the local store.
    #[error(
        "blob `{digest}` of `{model}` is {} in `{}`; nothing was pushed: see `zimage verify {model}`",
        found.map_or("missing".into(), |s| format!("{s} bytes, not {expected}")),
        blobs.display()
    )]
    LocalBlob {
        digest: String,
        model: String,
        expected: u64,
        found: Option<u64>,
        blobs: std::path::PathBuf,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Blob(#[from] BlobError),
}

impl RegistryError {
    /// A failure a retry may cure: the connection, a stall, a server error.
    pub fn is_transient(&self) -> bool {
        match self {
            RegistryError::Http { .. } => true,
            RegistryError::Status { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

/// What the registry repository of a model is: `<namespace>/<model>`, and the URL prefix
/// `<scheme>://<host>/v2/<namespace>/<model>`.
pub fn repository(name: &crate::store::ModelName) -> String {
    format!("{}/{}", name.namespace, name.model)
}

/// Runs `work` on every item with `workers` threads; the first error stops the others (they
/// check `stop` between chunks) and is returned.
pub(crate) fn for_each_parallel<T: Sync>(
    items: &[T],
    workers: usize,
    stop: &std::sync::atomic::AtomicBool,
    work: impl Fn(&T) -> Result<(), RegistryError> + Sync,
) -> Result<(), RegistryError> {
    for_each_parallel_with(items, workers, stop, || (), |_, item| work(item))
}

/// [`for_each_parallel`] with state each thread makes once, with `state`, and keeps from one
/// item to the next (a buffer).
pub(crate) fn for_each_parallel_with<T: Sync, S>(
    items: &[T],
    workers: usize,
    stop: &std::sync::atomic::AtomicBool,
    state: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, &T) -> Result<(), RegistryError> + Sync,
) -> Result<(), RegistryError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let first_error: std::sync::Mutex<Option<RegistryError>> = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..workers.clamp(1, items.len().max(1)) {
            scope.spawn(|| {
                let mut state = state();
                loop {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    if let Err(e) = work(&mut state, item) {
                        stop.store(true, Ordering::Relaxed);
                        let mut slot = first_error.lock().unwrap_or_else(|e| e.into_inner());
                        if slot.is_none() {
                            *slot = Some(e);
                        }
                        break;
                    }
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None if stop.load(std::sync::atomic::Ordering::Relaxed) => Err(RegistryError::Stopped),
        None => Ok(()),
    }
}

/// Text from a registry as an error may print it: one line, control characters escaped, cut.
pub(crate) fn printable(text: &str, max: usize) -> String {
    let escaped: String = text.trim().escape_debug().collect();
    match escaped.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &escaped[..at]),
        None => escaped,
    }
}

/// What a transfer reports while it runs (a progress bar in the CLI).
pub trait Progress: Sync {
    /// Before the first byte: what is to move.
    fn start(&self, bytes: u64, blobs: usize);
    /// Bytes moved since the last call.
    fn advance(&self, bytes: u64);
    /// One more blob complete.
    fn blob_done(&self);
}

/// No progress shown.
pub struct Quiet;

impl Progress for Quiet {
    fn start(&self, _: u64, _: usize) {}
    fn advance(&self, _: u64) {}
    fn blob_done(&self) {}
}
