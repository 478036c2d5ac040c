//! The generation worker: one thread that owns MLX and the resident model, fed by a bounded
//! queue. Generation is blocking and takes the whole machine, so requests run one at a time;
//! each reports its steps and its result over a channel, and stops at the next step boundary
//! once its client has gone.

use crate::generation::{self, Provenance};
use crate::loader::{ReadPath, StoreSource};
use crate::mlx::Dtype;
use crate::pipeline::{self, Pipeline, Progress, Request};
use crate::store::{ModelName, Store, StoreError, StoredModel};
use std::collections::VecDeque;
use std::ops::ControlFlow;
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

/// One image to make; the sides left out take the model's default.
#[derive(Debug, Clone)]
pub struct Spec {
    pub prompt: String,
    pub negative_prompt: Option<String>,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub steps: usize,
    pub guidance: f32,
    pub seed: u64,
    /// The picture to start from (img2img, or inpaint with a mask), decoded.
    pub input: Option<SpecInput>,
    /// The ControlNet (a stored name) and the control image that steers it.
    pub control: Option<pipeline::control::ControlSpec>,
}

/// A request's input picture, decoded but not yet sized: the size is settled once the model
/// is loaded, as `zimage generate` settles it.
#[derive(Debug, Clone)]
pub struct SpecInput {
    pub image: image::DynamicImage,
    /// White (or, for OpenAI's masks, transparent) repaints.
    pub mask: Option<image::DynamicImage>,
    /// `None`: the CLI's default for the task.
    pub strength: Option<f64>,
}

/// What a job reports, in order: `Started` once the model is ready, `Step` per denoising
/// step, then `Done`.
#[derive(Debug)]
pub enum Event {
    Started,
    Step {
        image: usize,
        completed: usize,
        total: usize,
    },
    Done(Result<Finished, JobError>),
}

/// One generated image.
#[derive(Debug)]
pub struct Image {
    pub png: Vec<u8>,
    pub prompt_tokens: usize,
    pub steps: usize,
    pub text: Duration,
    pub denoise: Duration,
    pub decode: Duration,
}

/// A finished job.
#[derive(Debug)]
pub struct Finished {
    pub images: Vec<Image>,
    /// Time spent reading the model's configs and tokenizer (zero when it was resident).
    pub load: Duration,
    /// From the job's start on the worker to its end.
    pub total: Duration,
    /// The model was unloaded at the job's end (`keep_alive` 0).
    pub unloaded: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobErrorKind {
    BadRequest,
    NotFound,
    Stopped,
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

/// A request's link to its client: set when the client goes, read at each step boundary.
#[derive(Debug, Default)]
pub struct Cancel {
    gone: AtomicBool,
    steps_done: AtomicUsize,
    left_after: AtomicUsize,
}

impl Cancel {
    pub fn is_cancelled(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
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
            self.cancel.gone.store(true, Ordering::SeqCst);
        }
    }
}

/// One request for the worker.
pub struct Job {
    pub model: ModelName,
    /// The images to make; none just loads the model (or unloads it, with `keep_alive` 0).
    pub specs: Vec<Spec>,
    /// LoRAs applied on top of the model's own, for this request only.
    pub loras: Vec<crate::lora::LoraSpec>,
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

/// The queue is full: the request was not taken.
#[derive(Debug)]
pub struct QueueFull {
    pub capacity: usize,
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
}

/// What the worker does next.
enum Work {
    Job(Job),
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
                    continue;
                }
                return Work::Job(job);
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

/// The handle the HTTP side holds.
#[derive(Clone)]
pub struct Worker {
    queue: Arc<Queue>,
    resident: Arc<Mutex<Option<ResidentInfo>>>,
}

impl Worker {
    /// Starts the worker thread.
    pub fn start(settings: Settings) -> std::io::Result<Worker> {
        let worker = Worker {
            queue: Arc::new(Queue {
                state: Mutex::new(QueueState::default()),
                wake: Condvar::new(),
                capacity: settings.max_queue,
            }),
            resident: Arc::new(Mutex::new(None)),
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
            }
            keep
        });
        if state.jobs.len() >= self.queue.capacity {
            return Err(QueueFull {
                capacity: self.queue.capacity,
            });
        }
        state.jobs.push_back(job);
        self.queue.wake.notify_one();
        Ok(())
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
}

/// The loaded model.
struct Resident {
    model: StoredModel,
    pipeline: Pipeline<StoreSource>,
    expires: Option<Instant>,
    /// The request LoRAs the pipeline's adapters were bound for (`None`: none bound yet, not
    /// even the model's own).
    loras: Option<Vec<LoraStamp>>,
    /// The stored ControlNet set on the pipeline; it stays loaded with the model until a
    /// request names another.
    controlnet: Option<String>,
}

/// A request LoRA as bound: its file's size and time of change tell an edited file from the
/// one bound before.
#[derive(Debug, Clone, PartialEq)]
struct LoraStamp {
    spec: crate::lora::LoraSpec,
    len: u64,
    modified: Option<SystemTime>,
}

impl LoraStamp {
    fn of(spec: &crate::lora::LoraSpec) -> LoraStamp {
        let meta = std::fs::metadata(&spec.path).ok();
        LoraStamp {
            spec: spec.clone(),
            len: meta.as_ref().map_or(0, |m| m.len()),
            modified: meta.and_then(|m| m.modified().ok()),
        }
    }
}

/// Binds the model's own LoRAs and the job's to the resident pipeline, unless those are
/// bound already. A file that is no LoRA, or does not fit the model, is the request's fault.
fn bind_loras(job: &Job, r: &mut Resident) -> Result<(), JobError> {
    let wanted: Vec<LoraStamp> = job.loras.iter().map(LoraStamp::of).collect();
    if r.loras.as_ref() == Some(&wanted) {
        return Ok(());
    }
    let adapters = r
        .pipeline
        .load_adapters(&job.loras, false)
        .map_err(|e| match e {
            pipeline::Error::Lora(
                crate::lora::Error::File { .. }
                | crate::lora::Error::Read(_)
                | crate::lora::Error::Format(_)
                | crate::lora::Error::Spec(..),
            ) => JobError::new(JobErrorKind::BadRequest, e.to_string()),
            other => JobError::new(JobErrorKind::Internal, other.to_string()),
        })?;
    r.pipeline.set_adapters(adapters);
    r.loras = Some(wanted);
    Ok(())
}

/// Whether a stored model is one this server generates with: a Z-Image pipeline. Text models
/// (and other image pipelines) in the same store are refused by name.
pub fn check_image_model(store: &Store, model: &StoredModel) -> Result<(), JobError> {
    let name = model.name.short();
    let index = store
        .config_file(model, "model_index.json")
        .map_err(|e| JobError::new(JobErrorKind::Internal, e.to_string()))?;
    let Some(index) = index else {
        return Err(JobError::new(
            JobErrorKind::BadRequest,
            format!("model `{name}` is not an image model (it has no model_index.json); zimage serves Z-Image models only, so run text models with Ollama"),
        ));
    };
    let class = serde_json::from_slice::<serde_json::Value>(&index)
        .ok()
        .and_then(|j| j["_class_name"].as_str().map(str::to_string));
    if class.as_deref() != Some("ZImagePipeline") {
        return Err(JobError::new(
            JobErrorKind::BadRequest,
            format!(
                "model `{name}` is a {} pipeline, not a Z-Image one; zimage serves Z-Image models only",
                class.as_deref().unwrap_or("unknown")
            ),
        ));
    }
    Ok(())
}

/// A store lookup's failure as a job error.
pub fn open_error(e: StoreError) -> JobError {
    match e {
        StoreError::NotFound(_) => JobError::new(
            JobErrorKind::NotFound,
            format!("{e}; import it with `zimage create`"),
        ),
        StoreError::Name(_) => JobError::new(JobErrorKind::BadRequest, e.to_string()),
        other => JobError::new(JobErrorKind::Internal, other.to_string()),
    }
}

/// Sets the stored ControlNet `name` on the resident pipeline, unless it is set already.
fn set_controlnet(r: &mut Resident, settings: &Settings, name: &str) -> Result<(), JobError> {
    if r.controlnet.as_deref() == Some(name) {
        return Ok(());
    }
    let net =
        crate::controlnet_source::open_stored(settings.store.clone(), name).map_err(
            |e| match e {
                crate::controlnet_source::Error::Store(e) => {
                    let mut e = open_error(e);
                    e.message = format!("controlnet: {}", e.message);
                    e
                }
                other => JobError::new(JobErrorKind::BadRequest, format!("controlnet: {other}")),
            },
        )?;
    r.controlnet = None;
    r.pipeline
        .set_controlnet(Some(Box::new(net)))
        .map_err(|e| JobError::new(JobErrorKind::BadRequest, e.to_string().replace("--", "")))?;
    r.controlnet = Some(name.to_string());
    Ok(())
}

fn release_memory() {
    crate::mlx::memory::clear_cache();
    crate::platform::trim_freed_memory();
}

fn run(handle: Worker, settings: Settings) {
    if let Err(e) = crate::platform::use_default_device() {
        eprintln!("warning: cannot select the default MLX device: {e}");
    }
    let dtype = settings
        .dtype
        .unwrap_or_else(crate::platform::default_compute_dtype);
    let mut resident: Option<Resident> = None;
    loop {
        let deadline = resident.as_ref().and_then(|r| r.expires);
        match handle.queue.next(deadline) {
            Work::Expired => {
                if let Some(r) = resident.take() {
                    eprintln!("unloaded {} (keep_alive elapsed)", r.model.name.short());
                }
                release_memory();
                handle.set_resident(None);
            }
            Work::Evict(name) => {
                if resident.as_ref().is_some_and(|r| r.model.name == name) {
                    resident = None;
                    release_memory();
                    handle.set_resident(None);
                }
            }
            Work::Job(job) => {
                let result = run_job(&job, &mut resident, &settings, dtype);
                let info = resident.as_ref().map(|r| ResidentInfo {
                    model: r.model.clone(),
                    expires_at: r
                        .expires
                        .map(|e| SystemTime::now() + e.saturating_duration_since(Instant::now())),
                });
                handle.set_resident(info);
                if let Err(e) = &result {
                    if e.kind == JobErrorKind::Stopped {
                        eprintln!("{}: {}", job.label, e.message);
                    }
                }
                // The client may be gone; then nobody reads the result.
                let _ = job.events.send(Event::Done(result));
            }
        }
    }
}

/// Makes `job.model` the resident model, loading it if another (or none) is loaded.
fn ensure_resident<'a>(
    job: &Job,
    resident: &'a mut Option<Resident>,
    settings: &Settings,
    dtype: Dtype,
) -> Result<&'a mut Resident, JobError> {
    let model = settings
        .store
        .open(&job.model.to_string())
        .map_err(open_error)?;
    let current = resident.as_ref().is_some_and(|r| {
        r.model.name == model.name && r.model.manifest_digest == model.manifest_digest
    });
    if !current {
        if let Some(old) = resident.take() {
            eprintln!(
                "unloaded {} to load {}",
                old.model.name.short(),
                model.name.short()
            );
            drop(old);
            release_memory();
        }
        check_image_model(&settings.store, &model)?;
        let source = StoreSource {
            store: settings.store.clone(),
            model: model.clone(),
            read_path: ReadPath::MlxLoader,
        };
        let pipeline = Pipeline::new(source, dtype, true)
            .map_err(|e| JobError::new(JobErrorKind::Internal, e.to_string()))?;
        *resident = Some(Resident {
            model,
            pipeline,
            expires: None,
            loras: None,
            controlnet: None,
        });
    }
    Ok(resident.as_mut().expect("set above"))
}

fn run_job(
    job: &Job,
    resident: &mut Option<Resident>,
    settings: &Settings,
    dtype: Dtype,
) -> Result<Finished, JobError> {
    let start = Instant::now();
    if job.cancel.is_cancelled() {
        return Err(JobError::new(
            JobErrorKind::Stopped,
            "the client left before the run started; not run",
        ));
    }
    let keep_alive = job.keep_alive.unwrap_or(settings.keep_alive);
    if job.specs.is_empty() && keep_alive == KeepAlive::For(Duration::ZERO) {
        let unloaded = resident.as_ref().is_some_and(|r| r.model.name == job.model);
        if unloaded {
            *resident = None;
            release_memory();
        }
        return Ok(Finished {
            images: Vec::new(),
            load: Duration::ZERO,
            total: start.elapsed(),
            unloaded: true,
        });
    }
    let load_start = Instant::now();
    let r = ensure_resident(job, resident, settings, dtype)?;
    bind_loras(job, r)?;
    let load = load_start.elapsed();
    let _ = job.events.send(Event::Started);
    let mut images = Vec::with_capacity(job.specs.len());
    let mut outcome = Ok(());
    for (index, spec) in job.specs.iter().enumerate() {
        match generate_one(job, r, spec, index, settings, dtype) {
            Ok(image) => images.push(image),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    r.expires = match keep_alive {
        KeepAlive::Forever => None,
        KeepAlive::For(d) => Some(Instant::now() + d),
    };
    let unloaded = keep_alive == KeepAlive::For(Duration::ZERO);
    if unloaded {
        *resident = None;
        release_memory();
    }
    outcome?;
    Ok(Finished {
        images,
        load,
        total: start.elapsed(),
        unloaded,
    })
}

fn generate_one(
    job: &Job,
    r: &mut Resident,
    spec: &Spec,
    index: usize,
    settings: &Settings,
    dtype: Dtype,
) -> Result<Image, JobError> {
    let bad = |e: String| JobError::new(JobErrorKind::BadRequest, e);
    let sample = r.pipeline.configs.vae.sample_size.unwrap_or(1024);
    // Built as `zimage generate` builds it, so that a seed gives the CLI's pixels: without a
    // size, an input picture gives it, rounded as diffusers rounds it.
    let cell = 2 * r.pipeline.configs.vae.scale_factor() as u32;
    let given = (spec.input.as_ref().map(|i| ("input picture", &i.image)))
        .or_else(|| spec.control.as_ref().map(|c| ("control image", &c.image)));
    let (default_w, default_h) = match given {
        Some((what, image)) => crate::image_in::default_size(image.width(), image.height(), cell)
            .ok_or_else(|| {
            bad(format!(
                "the {what} is {}×{}; it needs at least {cell} pixels each way",
                image.width(),
                image.height()
            ))
        })?,
        None => (sample, sample),
    };
    let mut req = Request {
        prompt: spec.prompt.clone(),
        negative_prompt: spec.negative_prompt.clone(),
        width: spec.width.unwrap_or(default_w),
        height: spec.height.unwrap_or(default_h),
        steps: spec.steps,
        guidance: spec.guidance,
        cfg_normalization: false,
        cfg_truncation: pipeline::NO_TRUNCATION,
        seed: spec.seed,
        noise: None,
        input: None,
    };
    r.pipeline.validate(&req).map_err(|e| bad(e.to_string()))?;
    if let Some(i) = &spec.input {
        let strength = i.strength.unwrap_or(if i.mask.is_some() {
            pipeline::condition::DEFAULT_INPAINT_STRENGTH
        } else {
            pipeline::condition::DEFAULT_STRENGTH
        });
        req.input = Some(pipeline::ImageInput {
            rgb: crate::image_in::picture(&i.image, req.width, req.height).into_raw(),
            mask: i
                .mask
                .as_ref()
                .map(|m| crate::image_in::mask(m, req.width, req.height)),
            strength,
        });
        r.pipeline.validate(&req).map_err(|e| bad(e.to_string()))?;
    }
    let control = match &spec.control {
        Some(c) => {
            set_controlnet(r, settings, &c.controlnet)?;
            let input = c.input(req.width, req.height);
            r.pipeline
                .validate_control(&req, &input)
                .map_err(|e| bad(e.to_string().replace("--", "")))?;
            Some(input)
        }
        None => None,
    };
    let prompt_tokens = r
        .pipeline
        .token_ids(&req.prompt)
        .map_err(|e| bad(e.to_string()))?
        .len();
    let plan = generation::plan_memory(&r.pipeline, &req, settings.memory_limit.as_deref(), None)
        .map_err(|e| match e {
        generation::Error::DoesNotFit(e) => bad(format!("{e}; ask for a smaller width and height")),
        other => JobError::new(JobErrorKind::Internal, other.to_string()),
    })?;
    r.pipeline.set_residency(plan.residency);
    r.pipeline.set_tiling(plan.tiling);
    let done_before = job.cancel.steps_done.load(Ordering::SeqCst);
    let out = r
        .pipeline
        .generate_controlled(&req, control.as_ref(), &mut |p| {
            if let Progress::Step { index: step, total } = p {
                job.cancel
                    .steps_done
                    .store(done_before + step, Ordering::SeqCst);
                let _ = job.events.send(Event::Step {
                    image: index,
                    completed: step,
                    total,
                });
            }
            if job.cancel.is_cancelled() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
    let out = out.map_err(|e| match e {
        pipeline::Error::Stopped { step, total } => JobError::new(
            JobErrorKind::Stopped,
            format!(
                "the client left after step {} of the run; stopped after step {} (image {}: step {step} of {total})",
                job.cancel.left_after.load(Ordering::SeqCst),
                job.cancel.steps_done.load(Ordering::SeqCst),
                index + 1
            ),
        ),
        pipeline::Error::Request(m) => bad(m),
        other => JobError::new(JobErrorKind::Internal, other.to_string()),
    })?;
    let seconds = |phase: &str| {
        out.phases
            .iter()
            .find(|p| p.phase == phase)
            .map(|p| Duration::from_secs_f64(p.seconds))
            .unwrap_or_default()
    };
    let name = r.model.name.short();
    let identity = r.model.manifest.model_identity();
    let steered = generation::ControlProvenance::of(&r.pipeline, control.as_ref());
    let png = generation::encode_png_controlled(
        &out,
        &req,
        &Provenance {
            model_name: &name,
            identity: &identity,
            dtype,
            noise_file: None,
            loras: &r.pipeline.adapters().applied,
            shift: r.pipeline.configs.scheduler.shift,
        },
        steered.as_ref(),
    )
    .map_err(|e| JobError::new(JobErrorKind::Internal, e.to_string()))?;
    Ok(Image {
        png,
        prompt_tokens,
        steps: req.steps,
        text: seconds("text"),
        denoise: seconds("denoise"),
        decode: seconds("decode"),
    })
}
