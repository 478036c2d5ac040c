//! `GET /healthz` and `GET /readyz`, for a load balancer or Kubernetes' kubelet.
//!
//! `/healthz` says the process answers; `/readyz` whether it should be sent work: its store is
//! readable, its queue has room, it is not draining, and the models of `--pull` are in. Both
//! answer without the API key and whatever the `Host` (a kubelet probes by the pod's address
//! and sends no key), and say nothing but ready or why not.

use super::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What readiness waits for besides the worker.
#[derive(Debug, Default)]
pub struct Readiness {
    /// `--pull` models not yet in the store.
    pulls_left: AtomicUsize,
    /// The last reason logged, so that a probe every few seconds logs a change once.
    logged: Mutex<Option<String>>,
}

impl Readiness {
    pub fn pulls_to_come(&self, n: usize) {
        self.pulls_left.store(n, Ordering::SeqCst);
    }

    pub fn pulled_one(&self) {
        let _ = self
            .pulls_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Logs `reason` (none: ready) when it differs from the last one logged.
    pub fn log_change(&self, reason: Option<&str>) {
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.as_deref() == reason {
            return;
        }
        match reason {
            Some(r) => eprintln!("not ready: {r}"),
            None if logged.is_some() => eprintln!("ready"),
            None => {}
        }
        *logged = reason.map(str::to_string);
    }
}

/// The probe routes, open to all.
pub fn is_probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let reason = not_ready(&state).await;
    state.readiness.log_change(reason.as_deref());
    match reason {
        None => "ready\n".into_response(),
        Some(r) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {r}\n")).into_response(),
    }
}

/// Why the server should not be sent work now; `None` when it should.
pub async fn not_ready(state: &Arc<AppState>) -> Option<String> {
    let worker = &state.worker;
    if worker.is_draining() {
        return Some("draining: finishing the requests it holds before it stops".into());
    }
    let pulls = state.readiness.pulls_left.load(Ordering::SeqCst);
    if pulls > 0 {
        return Some(format!("pulling {pulls} model(s) named by --pull"));
    }
    let root = state.store.root.clone();
    let store = tokio::task::spawn_blocking(move || store_unreadable(&root))
        .await
        .unwrap_or_else(|e| Some(e.to_string()));
    if store.is_some() {
        return store;
    }
    let (queued, capacity) = (worker.queued(), worker.capacity());
    if queued >= capacity {
        return Some(format!(
            "the queue is full ({queued} requests wait; --max-queue is {capacity})"
        ));
    }
    None
}

/// Why the store at `root` cannot be read, if it cannot. A store not made yet is an empty
/// store; one that exists must let this process list its models. Nothing is written: a store
/// on a read-only volume serves.
pub fn store_unreadable(root: &Path) -> Option<String> {
    let fix =
        "check that the volume is mounted and readable by this user, or give another with --store";
    for dir in [root.to_path_buf(), root.join("manifests")] {
        match std::fs::read_dir(&dir) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                return Some(format!(
                    "the store's folder `{}` cannot be read: {e}; {fix}",
                    dir.display()
                ))
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_whose_models_are_a_file_is_unreadable_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(store_unreadable(&dir.path().join("none")), None);
        assert_eq!(store_unreadable(dir.path()), None);
        std::fs::write(dir.path().join("manifests"), b"").unwrap();
        let reason = store_unreadable(dir.path()).unwrap();
        assert!(reason.contains("manifests"), "{reason}");
    }
}
