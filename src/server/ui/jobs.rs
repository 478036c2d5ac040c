//! The page's jobs: a form posted becomes one generation job on the server's worker, run
//! whether or not the page stays open; the page polls its state (queue position, progress,
//! images) and may cancel it. Finished images go to the gallery.

use super::gallery::Gallery;
use crate::generation::{self, Progress};
use crate::server::errors::{Api, ApiError};
use crate::server::worker::{self, Event};
use crate::server::AppState;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::UnboundedReceiver;

/// Ended jobs kept for the pages that poll them; older ones are forgotten.
const KEPT_ENDED: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }

    fn ended(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Cancelled)
    }
}

/// One job as the page sees it.
pub struct PageJob {
    pub state: State,
    pub progress: Option<Progress>,
    /// Gallery file names of its images, once done.
    pub images: Vec<String>,
    pub error: Option<String>,
    cancel: Arc<worker::Cancel>,
}

/// The page's jobs by id.
#[derive(Default)]
pub struct PageJobs {
    next: AtomicU64,
    jobs: Mutex<BTreeMap<u64, PageJob>>,
}

impl PageJobs {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, PageJob>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job` on the worker as a page job; its id.
    pub fn submit(
        state: &Arc<AppState>,
        model: crate::store::ModelName,
        job: generation::Job,
        reservation: Option<crate::input_budget::Reservation>,
    ) -> Result<u64, ApiError> {
        let jobs = &state.page_jobs;
        let id = jobs.next.fetch_add(1, Ordering::Relaxed) + 1;
        let label = format!("POST /ui/api/jobs {}", model.short().escape_debug());
        let (mut guard, rx) = crate::server::queue(state, Api::Ollama, |cancel, events| {
            jobs.lock().insert(
                id,
                PageJob {
                    state: State::Queued,
                    progress: None,
                    images: Vec::new(),
                    error: None,
                    cancel: cancel.clone(),
                },
            );
            worker::Job {
                model,
                // The page shows the running step's picture.
                generate: Some(generation::Job {
                    preview: true,
                    ..job
                }),
                keep_alive: None,
                cancel,
                events,
                label,
            }
        })
        .inspect_err(|_| {
            jobs.lock().remove(&id);
        })?;
        // The job outlives the request that posted it: only the page's cancel stops it.
        guard.finish();
        tokio::spawn(follow(state.clone(), id, rx, reservation));
        Ok(id)
    }

    /// A job's state as the page polls it; `None` for an id not known.
    pub fn status(&self, state: &AppState, id: u64) -> Option<Value> {
        let jobs = self.lock();
        let job = jobs.get(&id)?;
        let position = match job.state {
            State::Queued => state.worker.position(&job.cancel),
            _ => None,
        };
        let lora_dir = state.lora_dir.as_deref();
        let images: Vec<Value> = job
            .images
            .iter()
            .filter_map(|name| {
                let modified = std::fs::metadata(state.gallery.dir.join(name))
                    .and_then(|m| m.modified())
                    .ok()?;
                state.gallery.entry(name, modified, lora_dir)
            })
            .collect();
        Some(json!({
            "id": id.to_string(),
            "state": job.state.name(),
            "position": position,
            "progress": job.progress.as_ref().map(|p| json!({
                "image": p.image,
                "images": p.images,
                "phase": p.phase,
                "step": p.step,
                "steps": p.steps,
                "fraction": p.fraction(),
                "elapsed": p.elapsed.as_secs_f64(),
            })),
            "preview": job.progress.as_ref()
                .and_then(|p| p.preview.as_ref())
                .filter(|_| job.state == State::Running)
                .map(|p| format!("data:image/png;base64,{}", p.png_base64())),
            "images": images,
            "error": job.error,
        }))
    }

    /// Stops a job at its next step, or drops it from the queue; `None` for an id not known,
    /// else whether it was still to end.
    pub fn cancel(&self, id: u64) -> Option<bool> {
        let jobs = self.lock();
        let job = jobs.get(&id)?;
        if job.state.ended() {
            return Some(false);
        }
        job.cancel.interrupt();
        // A queued job leaves the queue when the worker reaches it; the page need not wait.
        if job.state == State::Queued {
            drop(jobs);
            self.update(id, |j| {
                j.state = State::Cancelled;
                j.error = Some("cancelled before it started".into());
            });
        }
        Some(true)
    }

    fn update(&self, id: u64, change: impl FnOnce(&mut PageJob)) {
        let mut jobs = self.lock();
        let Some(job) = jobs.get_mut(&id) else {
            return;
        };
        change(job);
        if !job.state.ended() {
            return;
        }
        // Forget the oldest ended jobs beyond what pages may still poll.
        let ended: Vec<u64> = jobs
            .iter()
            .filter(|(_, j)| j.state.ended())
            .map(|(id, _)| *id)
            .collect();
        for old in ended.iter().take(ended.len().saturating_sub(KEPT_ENDED)) {
            jobs.remove(old);
        }
    }
}

/// Follows a job's events to its end, and keeps its images.
async fn follow(
    state: Arc<AppState>,
    id: u64,
    mut rx: UnboundedReceiver<Event>,
    reservation: Option<crate::input_budget::Reservation>,
) {
    let jobs = &state.page_jobs;
    let result = loop {
        match rx.recv().await {
            Some(Event::Started) => jobs.update(id, |j| j.state = State::Running),
            Some(Event::Progress(p)) => jobs.update(id, |j| {
                j.state = State::Running;
                j.progress = Some(p);
            }),
            Some(Event::Done(result)) => break Some(result),
            // The worker dropped the job unrun: it was cancelled while queued.
            None => break None,
        }
    };
    // The inputs are no longer held once the job has ended.
    drop(reservation);
    let (end, images, error) = match result {
        None => (
            State::Cancelled,
            Vec::new(),
            Some("cancelled before it started".to_string()),
        ),
        Some(Err(e))
            if matches!(
                e.kind,
                worker::JobErrorKind::Interrupted | worker::JobErrorKind::Stopped
            ) =>
        {
            (State::Cancelled, Vec::new(), Some(e.message))
        }
        Some(Err(e)) => (State::Failed, Vec::new(), Some(e.message)),
        Some(Ok(finished)) => {
            let gallery: Gallery = state.gallery.clone();
            let interrupted = finished.interrupted;
            let saved =
                tokio::task::spawn_blocking(move || gallery.save(id, &finished.images)).await;
            match saved {
                // Cancelled after some images were made: those are kept.
                Ok(Ok(names)) if interrupted => {
                    let note = format!(
                        "cancelled after {} image{}, kept in the gallery",
                        names.len(),
                        if names.len() == 1 { "" } else { "s" }
                    );
                    (State::Cancelled, names, Some(note))
                }
                Ok(Ok(names)) => (State::Done, names, None),
                Ok(Err(e)) => (State::Failed, Vec::new(), Some(e)),
                Err(e) => (State::Failed, Vec::new(), Some(e.to_string())),
            }
        }
    };
    jobs.update(id, |j| {
        j.state = end;
        j.images = images;
        j.error = error;
    });
}
