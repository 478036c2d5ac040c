//! Graceful drain: on SIGTERM or SIGINT the server stops taking jobs, finishes the ones it
//! holds, then stops listening and ends; so a rolling update or a scale-down loses no request.
//!
//! While it drains it still answers: `/readyz` says 503 (a load balancer or Kubernetes stops
//! sending work), and a new generation request gets 503 with `Retry-After`, which a proxy
//! retries on another replica. Past the drain's timeout, or on a second signal, the jobs left
//! are stopped and the server ends with a failure status.

use super::worker::Worker;
use super::AppState;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the drain looks whether the worker is done.
const POLL: Duration = Duration::from_millis(100);

/// How long the running job may take to reach its next step once it is stopped.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// The default of `--drain-timeout`: longer than a large image takes, shorter than Kubernetes'
/// usual grace periods are set to.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// SIGTERM and SIGINT, registered before the server starts so that none is missed.
#[cfg(unix)]
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    /// Must run inside the runtime.
    pub fn register() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next signal's name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Ctrl-C, where there are no Unix signals.
#[cfg(not(unix))]
pub struct Signals;

#[cfg(not(unix))]
impl Signals {
    pub fn register() -> std::io::Result<Signals> {
        Ok(Signals)
    }

    async fn next(&mut self) -> &'static str {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

/// Serves until a signal's drain ends; `Ok(true)` when every job finished within `timeout`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    mut signals: Signals,
    timeout: Duration,
) -> std::io::Result<bool> {
    let worker = state.worker.clone();
    let clean = Arc::new(AtomicBool::new(true));
    let flag = clean.clone();
    axum::serve(listener, super::router(state))
        .with_graceful_shutdown(async move {
            let finished = drain(&worker, &mut signals, timeout).await;
            flag.store(finished, Ordering::SeqCst);
        })
        .await?;
    Ok(clean.load(Ordering::SeqCst))
}

/// Waits for a signal, then for the worker to finish what it holds; whether it did in time.
async fn drain(worker: &Worker, signals: &mut Signals, timeout: Duration) -> bool {
    let name = signals.next().await;
    worker.drain();
    eprintln!(
        "{name}: draining: taking no new request, finishing {} running and {} queued within {} s (--drain-timeout)",
        usize::from(worker.running().is_some()),
        worker.queued(),
        timeout.as_secs()
    );
    let deadline = Instant::now() + timeout;
    loop {
        if worker.is_idle() {
            eprintln!("drained: every request was answered; stopping");
            return true;
        }
        if Instant::now() >= deadline {
            eprintln!(
                "the drain timed out after {} s: stopping {} running and {} queued request(s)",
                timeout.as_secs(),
                usize::from(worker.running().is_some()),
                worker.queued()
            );
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            again = signals.next() => {
                eprintln!("{again} again: stopping the requests left now");
                break;
            }
        }
    }
    worker.stop_all();
    let stop_by = Instant::now() + STOP_WAIT;
    while !worker.is_idle() && Instant::now() < stop_by {
        tokio::time::sleep(POLL).await;
    }
    false
}
