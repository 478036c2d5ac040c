//! The generation worker: one thread that owns MLX and the resident model, fed by a bounded
//! queue. Generation is blocking and takes the whole machine, so requests run one at a time;
//! each reports its steps and its result over a channel, and stops at the next step boundary
//! once its client has gone.

use super::metrics::{Metrics, Outcome};
use crate::generation::{self, Engine, ErrorClass, ModelChoice};
use crate::mlx::Dtype;
use crate::store::{ModelName, Store, StoredModel};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc::UnboundedSender;

/// How long a model stays loaded after its last request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    For(Duration),
    Forever,
}

/// What a job reports, in order: `Started` once the model is ready, `Step` per denoising
/// step, then `Done`.
#[derive(Debug)]
pub enum Event {
    Started,
    Progress(generation::Progress),
    Done(Result<Finished, JobError>),
}

/// A finished job.
#[derive(Debug)]
pub struct Finished {
    pub images: Vec<generation::Image>,
    /// Time spent reading the model's configs and tokenizer (zero when it was resident).
    pub load: Duration,
    /// From the job's start on the worker to its end.
    pub total: Duration,
    /// The model was unloaded at the job's end (`keep_alive` 0).
    pub unloaded: bool,
    /// The job was interrupted after `images`; the rest of its count was not made.
    pub interrupted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobErrorKind {
    BadRequest,
    NotFound,
    /// The client went away.
    Stopped,
    /// Someone stopped the running job on purpose ([`Worker::interrupt`]).
    Interrupted,
    /// The server stopped before the job ran ([`Worker::stop_all`]): another may run it.
    Unavailable,
    Internal,
}

#[derive(Debug, Clone)]
pub struct JobError {
    pub kind: JobErrorKind,
    pub message: String,
}

impl JobError {
    pub fn new(kind: JobErrorKind, message: impl Into<String>) -> JobError {
        JobError {
            kind,
            message: message.into(),
        }
    }
}

impl From<generation::Error> for JobError {
    fn from(e: generation::Error) -> JobError {
        let kind = match e.class() {
            // A request too large for the machine is the request's to change.
            ErrorClass::BadRequest | ErrorClass::DoesNotFit => JobErrorKind::BadRequest,
            ErrorClass::NotFound => JobErrorKind::NotFound,
            ErrorClass::Stopped => JobErrorKind::Stopped,
            ErrorClass::Internal => JobErrorKind::Internal,
        };
        let message = match &e {
            generation::Error::DoesNotFit(_) => {
                format!("{e}; ask for a smaller width and height")
            }
            // The messages name the command line's flags; the APIs' fields have no dashes.
            _ => e.to_string().replace("--", ""),
        };
        JobError::new(kind, message)
    }
}

/// A request's link to its client: set when the client goes (or the job is interrupted), read
/// at each step boundary.
#[derive(Debug, Default)]
pub struct Cancel {
    gone: generation::Cancel,
    interrupted: AtomicBool,
    steps_done: AtomicUsize,
    left_after: AtomicUsize,
}

impl Cancel {
    pub fn is_cancelled(&self) -> bool {
        self.gone.is_cancelled()
    }

    /// Stops the job at its next step boundary although its client is still there.
    pub fn interrupt(&self) {
        let done = self.steps_done.load(Ordering::SeqCst);
        self.left_after.store(done, Ordering::SeqCst);
        self.interrupted.store(true, Ordering::SeqCst);
        self.gone.stop_keeping_finished();
    }

    /// Drops the image being made at its next step boundary; the job goes on with the next.
    pub fn skip(&self) {
        self.gone.skip_image();
    }

    pub fn was_interrupted(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst)
    }
}

/// Held by whatever answers the client (the handler, or the body stream it returns): when it
/// is dropped before [`CancelGuard::finish`], the client has gone and the job stops.
pub struct CancelGuard {
    cancel: Arc<Cancel>,
    finished: bool,
}

impl CancelGuard {
    pub fn new() -> (CancelGuard, Arc<Cancel>) {
        let cancel = Arc::new(Cancel::default());
        (
            CancelGuard {
                cancel: cancel.clone(),
                finished: false,
            },
            cancel,
        )
    }

    /// The switch this guard flips, to find the job in the queue.
    pub fn cancel(&self) -> &Arc<Cancel> {
        &self.cancel
    }

    /// The answer reached the client: dropping the guard no longer cancels anything.
    pub fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.finished {
            let done = self.cancel.steps_done.load(Ordering::SeqCst);
            self.cancel.left_after.store(done, Ordering::SeqCst);
            self.cancel.gone.cancel();
        }
    }
}

/// One request for the worker.
pub struct Job {
    pub model: ModelName,
    /// The images to make; `None` just loads the model (or unloads it, with `keep_alive` 0).
    pub generate: Option<generation::Job>,
    pub keep_alive: Option<KeepAlive>,
    pub cancel: Arc<Cancel>,
    pub events: UnboundedSender<Event>,
    /// `METHOD path model`, for the log.
    pub label: String,
}

/// The model the worker holds, as `/api/ps` shows it.
#[derive(Debug, Clone)]
pub struct ResidentInfo {
    pub model: StoredModel,
    /// `None`: kept until another model is asked for.
    pub expires_at: Option<SystemTime>,
}

/// What the worker is started with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub store: Store,
    pub keep_alive: KeepAlive,
    pub max_queue: usize,
    /// `--memory-limit`, else `ZIMAGE_MEMORY_LIMIT`, else most of the machine.
    pub memory_limit: Option<String>,
    pub dtype: Option<Dtype>,
}

/// The queue is full, or the server drains: the request was not taken.
#[derive(Debug)]
pub struct QueueFull {
    pub capacity: usize,
    /// The server is stopping ([`Worker::drain`]) and takes no new job.
    pub draining: bool,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    evict: Vec<ModelName>,
}

struct Queue {
    state: Mutex<QueueState>,
    wake: Condvar,
    capacity: usize,
    /// Set once the server drains; never cleared.
    draining: AtomicBool,
    /// The worker holds a job: set under the lock as it takes one from the queue, cleared
    /// once it has answered it (so a job is never in neither place).
    busy: AtomicBool,
    metrics: Arc<Metrics>,
}

/// What the worker does next.
enum Work {
    Job(Box<Job>),
    Evict(ModelName),
    Expired,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A panic while holding this lock leaves plain data behind; carry on with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for work, or for the resident model's `deadline`.
    fn next(&self, deadline: Option<Instant>) -> Work {
        let mut state = self.lock();
        loop {
            if let Some(name) = state.evict.pop() {
                return Work::Evict(name);
            }
            if let Some(job) = state.jobs.pop_front() {
                if job.cancel.is_cancelled() {
                    eprintln!("{}: the client left while queued; not run", job.label);
                    self.metrics.finished(&job.label, Outcome::Cancelled);
                    continue;
                }
                self.busy.store(true, Ordering::SeqCst);
                return Work::Job(Box::new(job));
            }
            match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Work::Expired;
                    }
                    state = self
                        .wake
                        .wait_timeout(state, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                None => state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }
}

/// The job the worker is running, as progress answers show it.
#[derive(Debug, Clone)]
pub struct Running {
    /// `METHOD path model`.
    pub label: String,
    pub model: ModelName,
    pub started: SystemTime,
    /// The latest report; `None` until the job reports.
    pub progress: Option<generation::Progress>,
    cancel: Arc<Cancel>,
}

impl Running {
    pub fn interrupted(&self) -> bool {
        self.cancel.was_interrupted()
    }
}

/// The handle the HTTP side holds.
#[derive(Clone)]
pub struct Worker {
    queue: Arc<Queue>,
    resident: Arc<Mutex<Option<ResidentInfo>>>,
    running: Arc<Mutex<Option<Running>>>,
    last_used: Arc<Mutex<Option<(ModelName, SystemTime)>>>,
}

impl Worker {
    /// Starts the worker thread.
    pub fn start(settings: Settings) -> std::io::Result<Worker> {
        let worker = Worker {
            queue: Arc::new(Queue {
                state: Mutex::new(QueueState::default()),
                wake: Condvar::new(),
                capacity: settings.max_queue,
                draining: AtomicBool::new(false),
                busy: AtomicBool::new(false),
                metrics: Arc::new(Metrics::new()),
            }),
            resident: Arc::new(Mutex::new(None)),
            running: Arc::new(Mutex::new(None)),
            last_used: Arc::new(Mutex::new(None)),
        };
        let handle = worker.clone();
        std::thread::Builder::new()
            .name("zimage-generate".into())
            .spawn(move || run(handle, settings))?;
        Ok(worker)
    }

    /// Queues a job, unless as many wait already as the queue holds. Jobs whose clients have
    /// gone leave the queue here, so they take no place.
    pub fn submit(&self, job: Job) -> Result<(), QueueFull> {
        let mut state = self.queue.lock();
        state.jobs.retain(|j| {
            let keep = !j.cancel.is_cancelled();
            if !keep {
                eprintln!("{}: the client left while queued; not run", j.label);
                self.queue.metrics.finished(&j.label, Outcome::Cancelled);
            }
            keep
        });
        let draining = self.is_draining();
        if draining || state.jobs.len() >= self.queue.capacity {
            return Err(QueueFull {
                capacity: self.queue.capacity,
                draining,
            });
        }
        state.jobs.push_back(job);
        self.queue.wake.notify_one();
        Ok(())
    }

    /// Stops taking jobs: from now on [`Worker::submit`] refuses every job, and the worker
    /// goes on with those it holds.
    pub fn drain(&self) {
        // Under the queue's lock, so no job is queued after a drain saw the queue empty.
        let _state = self.queue.lock();
        self.queue.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.queue.draining.load(Ordering::SeqCst)
    }

    /// Nothing waits and nothing runs.
    pub fn is_idle(&self) -> bool {
        let state = self.queue.lock();
        !self.queue.busy.load(Ordering::SeqCst)
            && state.jobs.iter().all(|j| j.cancel.is_cancelled())
    }

    /// Ends every job the worker holds: the waiting ones are answered at once that the server
    /// stopped, the running one stops at its next step as an interrupt does.
    pub fn stop_all(&self) {
        let dropped: Vec<Job> = self.queue.lock().jobs.drain(..).collect();
        for job in dropped {
            eprintln!("{}: the server stopped before it ran; not run", job.label);
            self.queue.metrics.finished(&job.label, Outcome::Cancelled);
            let _ = job.events.send(Event::Done(Err(JobError::new(
                JobErrorKind::Unavailable,
                "the server stopped before this request ran; send it again",
            ))));
        }
        self.interrupt();
    }

    /// Jobs may wait while one runs; more are refused.
    pub fn capacity(&self) -> usize {
        self.queue.capacity
    }

    /// The metrics the worker keeps.
    pub fn metrics(&self) -> &Metrics {
        &self.queue.metrics
    }

    /// Unloads `name` if it is resident (it was deleted).
    pub fn evict(&self, name: ModelName) {
        self.queue.lock().evict.push(name);
        self.queue.wake.notify_one();
    }

    /// The resident model, if any.
    pub fn resident(&self) -> Option<ResidentInfo> {
        self.resident
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_resident(&self, info: Option<ResidentInfo>) {
        *self.resident.lock().unwrap_or_else(|p| p.into_inner()) = info;
    }

    /// The job running now, if any.
    pub fn running(&self) -> Option<Running> {
        lock(&self.running).clone()
    }

    /// Jobs waiting for the worker (the running one not counted).
    pub fn queued(&self) -> usize {
        let state = self.queue.lock();
        state
            .jobs
            .iter()
            .filter(|j| !j.cancel.is_cancelled())
            .count()
    }

    /// Where the job with this cancel switch waits: 1 runs next; `None` when it is not queued
    /// (running, finished or dropped).
    pub fn position(&self, cancel: &Arc<Cancel>) -> Option<usize> {
        let state = self.queue.lock();
        state
            .jobs
            .iter()
            .filter(|j| !j.cancel.is_cancelled())
            .position(|j| Arc::ptr_eq(&j.cancel, cancel))
            .map(|i| i + 1)
    }

    /// Stops the running job at its next step boundary; whether one was running.
    pub fn interrupt(&self) -> bool {
        self.flip_running(Cancel::interrupt)
    }

    /// Drops the running job's current image at its next step boundary; whether one was
    /// running.
    pub fn skip(&self) -> bool {
        self.flip_running(Cancel::skip)
    }

    /// Flips a switch of the running job's cancel; whether one was running.
    fn flip_running(&self, flip: fn(&Cancel)) -> bool {
        lock(&self.running)
            .as_ref()
            .map(|r| flip(&r.cancel))
            .is_some()
    }

    /// The model the last job ran on, and when it started.
    pub fn last_used(&self) -> Option<(ModelName, SystemTime)> {
        lock(&self.last_used).clone()
    }

    fn report(&self, progress: &generation::Progress) {
        if let Some(r) = lock(&self.running).as_mut() {
            r.progress = Some(progress.clone());
        }
    }
}

/// A panic while holding one of these locks leaves plain data behind; carry on with it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The loaded model and when it goes.
struct Resident {
    engine: Engine,
    expires: Option<Instant>,
}

impl Resident {
    fn model(&self) -> Option<&StoredModel> {
        self.engine.stored_model()
    }
}

fn run(handle: Worker, settings: Settings) {
    if let Err(e) = crate::platform::use_default_device() {
        eprintln!("warning: cannot select the default MLX device: {e}");
    }
    crate::platform::prepare_device_memory();
    let kernels = crate::mlx::runtime::kernel_cache_dir();
    if let Some(dir) = crate::platform::kernels_compile_first(kernels.as_deref()) {
        eprintln!("{}", crate::platform::first_compile_note(&dir));
    }
    let mut resident = Resident {
        engine: Engine::new(settings.dtype, true),
        expires: None,
    };
    loop {
        let deadline = resident.model().and(resident.expires);
        match handle.queue.next(deadline) {
            Work::Expired => {
                if let Some(m) = resident.model() {
                    eprintln!("unloaded {} (keep_alive elapsed)", m.name.short());
                }
                resident.engine.unload();
                handle.set_resident(None);
            }
            Work::Evict(name) => {
                if resident.model().is_some_and(|m| m.name == name) {
                    resident.engine.unload();
                    handle.set_resident(None);
                }
            }
            Work::Job(job) => {
                *lock(&handle.last_used) = Some((job.model.clone(), SystemTime::now()));
                *lock(&handle.running) = Some(Running {
                    label: job.label.clone(),
                    model: job.model.clone(),
                    started: SystemTime::now(),
                    progress: None,
                    cancel: job.cancel.clone(),
                });
                let result = run_job(&job, &mut resident, &settings, &handle);
                *lock(&handle.running) = None;
                count(&handle.queue.metrics, &job, &result);
                let info = resident.model().map(|m| ResidentInfo {
                    model: m.clone(),
                    expires_at: resident
                        .expires
                        .map(|e| SystemTime::now() + e.saturating_duration_since(Instant::now())),
                });
                handle.set_resident(info);
                if let Err(e) = &result {
                    if matches!(e.kind, JobErrorKind::Stopped | JobErrorKind::Interrupted) {
                        eprintln!("{}: {}", job.label, e.message);
                    }
                }
                // The client may be gone; then nobody reads the result.
                let _ = job.events.send(Event::Done(result));
                handle.queue.busy.store(false, Ordering::SeqCst);
            }
        }
    }
}

/// A finished job in the metrics, with MLX's memory as the job left it.
fn count(metrics: &Metrics, job: &Job, result: &Result<Finished, JobError>) {
    let outcome = match result {
        Ok(f) if f.interrupted => Outcome::Cancelled,
        Ok(_) => Outcome::Ok,
        Err(e)
            if matches!(
                e.kind,
                JobErrorKind::Stopped | JobErrorKind::Interrupted | JobErrorKind::Unavailable
            ) =>
        {
            Outcome::Cancelled
        }
        Err(_) => Outcome::Error,
    };
    metrics.finished(&job.label, outcome);
    if let Ok(f) = result {
        let model = job.model.short();
        if job.generate.is_some() {
            metrics.generated(&model, f.total);
        }
        if !f.load.is_zero() {
            metrics.loaded(&model, f.load);
        }
    }
    metrics.mlx_memory(
        crate::mlx::memory::active_memory(),
        crate::mlx::memory::peak_memory(),
    );
}

fn run_job(
    job: &Job,
    resident: &mut Resident,
    settings: &Settings,
    handle: &Worker,
) -> Result<Finished, JobError> {
    let start = Instant::now();
    if job.cancel.is_cancelled() {
        return Err(JobError::new(
            JobErrorKind::Stopped,
            "the client left before the run started; not run",
        ));
    }
    let keep_alive = job.keep_alive.unwrap_or(settings.keep_alive);
    let unloads = keep_alive == KeepAlive::For(Duration::ZERO);
    let model = ModelChoice::Stored {
        store: settings.store.clone(),
        name: job.model.to_string(),
    };
    if job.generate.is_none() && unloads {
        if resident.model().is_some_and(|m| m.name == job.model) {
            resident.engine.unload();
        }
        return Ok(Finished {
            images: Vec::new(),
            load: Duration::ZERO,
            total: start.elapsed(),
            unloaded: true,
            interrupted: false,
        });
    }
    if let Some(old) = resident.model().filter(|m| m.name != job.model) {
        eprintln!(
            "unloaded {} to load {}",
            old.name.short(),
            job.model.short()
        );
    }
    let (images, load, interrupted) = match &job.generate {
        None => {
            let load = Instant::now();
            resident.engine.load(&model)?;
            let _ = job.events.send(Event::Started);
            (Vec::new(), load.elapsed(), false)
        }
        Some(generate) => {
            let generate = generation::Job {
                model,
                memory_limit: generate
                    .memory_limit
                    .clone()
                    .or_else(|| settings.memory_limit.clone()),
                ..generate.clone()
            };
            let mut started = false;
            let mut done_before = 0;
            let mut image_now = 0;
            let model_label = job.model.short();
            // The previous step's report, to time each step.
            let mut last_step: Option<(usize, usize, Instant)> = None;
            let outcome = generation::run(
                &generate,
                &mut resident.engine,
                &mut |p| {
                    handle.report(p);
                    if !started && p.phase != "load" {
                        started = true;
                        let _ = job.events.send(Event::Started);
                    }
                    if p.image != image_now {
                        image_now = p.image;
                        done_before = job.cancel.steps_done.load(Ordering::SeqCst);
                    }
                    if p.steps > 0 {
                        let now = Instant::now();
                        if let Some((image, step, at)) = last_step {
                            if image == p.image && p.step == step + 1 {
                                handle.queue.metrics.step(&model_label, now - at);
                            }
                        }
                        handle.queue.metrics.mlx_memory(
                            crate::mlx::memory::active_memory(),
                            crate::mlx::memory::peak_memory(),
                        );
                        last_step = Some((p.image, p.step, now));
                        job.cancel
                            .steps_done
                            .store(done_before + p.step, Ordering::SeqCst);
                        let _ = job.events.send(Event::Progress(p.clone()));
                    }
                },
                &job.cancel.gone,
            );
            let outcome = outcome.map_err(|e| match e {
                generation::Error::Stopped { image, step, total }
                    if job.cancel.was_interrupted() =>
                {
                    JobError::new(
                        JobErrorKind::Interrupted,
                        format!(
                            "interrupted after step {} of the run (image {image}: step {step} of {total}); no image of this request was kept",
                            job.cancel.steps_done.load(Ordering::SeqCst),
                        ),
                    )
                }
                generation::Error::Stopped { image, step, total } => JobError::new(
                    JobErrorKind::Stopped,
                    format!(
                        "the client left after step {} of the run; stopped after step {} (image {image}: step {step} of {total})",
                        job.cancel.left_after.load(Ordering::SeqCst),
                        job.cancel.steps_done.load(Ordering::SeqCst),
                    ),
                ),
                other => other.into(),
            });
            match outcome {
                Ok(o) => (o.images, o.load, o.stopped),
                Err(e) => {
                    resident.expires = expiry(keep_alive);
                    if unloads {
                        resident.engine.unload();
                    }
                    return Err(e);
                }
            }
        }
    };
    resident.expires = expiry(keep_alive);
    if unloads {
        resident.engine.unload();
    }
    if interrupted {
        eprintln!(
            "{}: interrupted; answered with the {} image{} made before",
            job.label,
            images.len(),
            if images.len() == 1 { "" } else { "s" }
        );
    }
    Ok(Finished {
        images,
        load,
        total: start.elapsed(),
        unloaded: unloads,
        interrupted,
    })
}

fn expiry(keep_alive: KeepAlive) -> Option<Instant> {
    match keep_alive {
        KeepAlive::Forever => None,
        KeepAlive::For(d) => Some(Instant::now() + d),
    }
}
