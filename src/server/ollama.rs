//! Ollama's API as its clients (the `ollama` Python package 0.6, open-webui, oterm) send and
//! read it: `/api/generate` with the image fields, and the model listing and management
//! routes, answered from the store.

use super::errors::{Api, ApiError};
use super::worker::{CancelGuard, Event, Finished, Job, JobError};
use super::{open_model, rfc3339, with_model, AppState};
use crate::store::name::DEFAULT_TAG;
use crate::store::{ModelName, Store, StoredModel};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc::UnboundedReceiver;

const API: Api = Api::Ollama;

/// The largest manifest `config` blob read for a listing (Ollama's are a few hundred bytes).
const CONFIG_BLOB_LIMIT: u64 = 1 << 20;

/// A model's name as Ollama lists it: always with its tag (`z-image:latest`).
pub fn display_name(name: &ModelName) -> String {
    let short = name.short();
    if name.tag == DEFAULT_TAG {
        format!("{short}:{DEFAULT_TAG}")
    } else {
        short
    }
}

/// The manifest's `config` blob as JSON (Ollama's `ConfigV2`: format, family, file type,
/// capabilities), or an empty object when it cannot be read.
fn config_blob(store: &Store, model: &StoredModel) -> Value {
    let digest = &model.manifest.config.digest;
    store
        .blob_path(digest)
        .ok()
        .filter(|p| crate::store::blob::check_inside_store(&store.root, digest, p).is_ok())
        .and_then(|p| crate::files::read_bounded(&p, CONFIG_BLOB_LIMIT, "config blob").ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| json!({}))
}

/// Parameters of the tensor layers, from the shapes the manifest records.
fn parameter_count(model: &StoredModel) -> u64 {
    model
        .manifest
        .tensor_layers()
        .filter_map(|l| l.shape.as_ref())
        .map(|s| {
            s.iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .unwrap_or(0)
        })
        .fold(0u64, u64::saturating_add)
}

/// `6.2B`, `24.1M`, as Ollama shows parameter sizes.
fn human_count(n: u64) -> String {
    match n {
        0 => String::new(),
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

fn is_image(config: &Value, model: &StoredModel) -> bool {
    config["capabilities"]
        .as_array()
        .is_some_and(|c| c.iter().any(|v| v == "image"))
        || model.manifest.config_file("model_index.json").is_some()
}

/// `details` as Ollama gives it for a model.
fn details(config: &Value, model: &StoredModel) -> Value {
    let image = is_image(config, model);
    let text = |key: &str| {
        config[key]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let family = text("model_family").unwrap_or_else(|| {
        if image {
            "zimage".into()
        } else {
            String::new()
        }
    });
    let parameter_size = match parameter_count(model) {
        0 => text("parameter_size").unwrap_or_default(),
        n => human_count(n),
    };
    json!({
        "parent_model": "",
        "format": text("model_format").unwrap_or_else(|| "safetensors".into()),
        "family": family,
        "families": config["model_families"].as_array().cloned().unwrap_or_else(|| vec![json!(family)]),
        "parameter_size": parameter_size,
        "quantization_level": text("file_type").unwrap_or_default(),
    })
}

/// One model as `/api/tags` lists it.
fn listed(store: &Store, model: &StoredModel) -> Value {
    let config = config_blob(store, model);
    json!({
        "name": display_name(&model.name),
        "model": display_name(&model.name),
        "modified_at": rfc3339(model.modified),
        "size": model.size(),
        "digest": model.manifest_digest.trim_start_matches("sha256:"),
        "details": details(&config, model),
    })
}

pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}

/// `GET /api/tags`: every model in the store, text models included.
pub async fn tags(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let models = super::each_model(&state, API, listed).await?;
    Ok(Json(json!({ "models": models })))
}

/// `GET /api/ps`: the loaded model, if any.
pub async fn ps(State(state): State<Arc<AppState>>) -> Json<Value> {
    let models = match state.worker.resident() {
        None => vec![],
        Some(r) => {
            let store = state.store.clone();
            let model = r.model.clone();
            let entry = tokio::task::spawn_blocking(move || listed(&store, &model))
                .await
                .unwrap_or_else(|_| json!({}));
            // Ollama's "forever" is the largest duration Go has: about 292 years.
            let expires = r
                .expires_at
                .unwrap_or_else(|| SystemTime::now() + Duration::from_secs(292 * 365 * 86400));
            vec![json!({
                "name": entry["name"],
                "model": entry["model"],
                "size": r.model.size(),
                "digest": entry["digest"],
                "details": entry["details"],
                "expires_at": rfc3339(expires),
                "size_vram": r.model.size(),
            })]
        }
    };
    Json(json!({ "models": models }))
}

#[derive(Deserialize)]
pub struct ModelBody {
    #[serde(default, alias = "name")]
    model: String,
}

/// `POST /api/show`.
pub async fn show(
    State(state): State<Arc<AppState>>,
    super::Named { body, name }: super::Named<ModelBody>,
) -> Result<Response, ApiError> {
    let model = open_model(&state, API, &name, false).await?;
    let store = state.store.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let config = config_blob(&store, &model);
        let image = is_image(&config, &model);
        let capabilities = config["capabilities"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![json!(if image { "image" } else { "completion" })]);
        json!({
            "license": "",
            "modelfile": format!("# zimage model {}\nFROM {}\n", display_name(&model.name), model.name),
            "parameters": "",
            "template": "",
            "details": details(&config, &model),
            "model_info": {
                "general.architecture": if image { "zimage" } else { "" },
                "general.parameter_count": parameter_count(&model),
                "zimage.model_identity": model.manifest.model_identity(),
                "zimage.components": model.manifest.components(),
            },
            "capabilities": capabilities,
            "modified_at": rfc3339(model.modified),
        })
    })
    .await
    .map_err(|e| ApiError::new(API, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(with_model(Json(answer).into_response(), &body.model))
}

/// `DELETE /api/delete`: removes the manifest (blobs stay until `zimage gc`) and unloads the
/// model if it is loaded.
pub async fn delete(
    State(state): State<Arc<AppState>>,
    super::Named { body, name }: super::Named<ModelBody>,
) -> Result<Response, ApiError> {
    let store = state.store.clone();
    let full = name.to_string();
    tokio::task::spawn_blocking(move || store.remove(&full))
        .await
        .map_err(|e| ApiError::new(API, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| super::job_error(API, crate::generation::open_error(e).into()))?;
    state.worker.evict(name);
    Ok(with_model(StatusCode::OK.into_response(), &body.model))
}

#[derive(Deserialize, Default)]
struct GenerateOptions {
    seed: Option<i64>,
    strength: Option<f64>,
}

#[derive(Deserialize)]
pub struct GenerateBody {
    #[serde(default)]
    model: String,
    #[serde(default)]
    prompt: String,
    width: Option<u32>,
    height: Option<u32>,
    steps: Option<u64>,
    options: Option<GenerateOptions>,
    negative_prompt: Option<String>,
    guidance: Option<f32>,
    /// True classifier-free guidance's scale (`--true-cfg`), for a guidance-distilled model.
    true_cfg: Option<f32>,
    cfg_normalization: Option<bool>,
    cfg_truncation: Option<f64>,
    stream: Option<bool>,
    keep_alive: Option<Value>,
    loras: Option<Vec<super::LoraBody>>,
    /// Base64 pictures, as Ollama carries them; the first is the img2img input.
    images: Option<Vec<String>>,
    strength: Option<f64>,
    /// A stored ControlNet, the control image it follows (base64) and its scale.
    controlnet: Option<String>,
    control_image: Option<String>,
    control_scale: Option<f32>,
}

/// A request's strength (from `options`, or the top level), checked against its pictures.
fn request_strength(body: &GenerateBody) -> Result<Option<f64>, ApiError> {
    let strength = body
        .options
        .as_ref()
        .and_then(|o| o.strength)
        .or(body.strength);
    let first = body.images.as_ref().and_then(|i| i.first());
    super::check_strength(API, strength, first.is_some())?;
    Ok(strength)
}

/// A picture's bytes as a request carries them, not yet decoded.
pub type PictureBytes = Option<Vec<u8>>;

/// The pictures of a request as bytes: its first `images` entry (the img2img input) and its
/// `control_image`, both base64, not yet decoded.
pub fn request_pictures(body: &GenerateBody) -> Result<(PictureBytes, PictureBytes), ApiError> {
    let first = body.images.as_ref().and_then(|i| i.first());
    let image = first
        .map(|t| super::base64_field(API, "images[0]", t))
        .transpose()?;
    let control = (body.control_image.as_deref())
        .map(|t| super::base64_field(API, "control_image", t))
        .transpose()?;
    Ok((image, control))
}

/// The img2img input of a request, decoded under the input limits.
pub fn decode_input(
    bytes: &[u8],
    strength: Option<f64>,
) -> Result<crate::generation::PictureInput, ApiError> {
    let image = crate::image_in::decode(bytes, "field `images`", "images[0]")
        .map_err(|e| ApiError::bad_request(API, e.to_string()))?;
    Ok(crate::generation::PictureInput {
        picture: crate::generation::Picture {
            image,
            label: "field `images[0]`".into(),
        },
        mask: None,
        strength,
        only_masked: None,
    })
}

/// The body of `POST /api/generate` as bytes are read into it (the fuzzed entry point).
pub fn parse_generate_body(bytes: &[u8]) -> Result<GenerateBody, ApiError> {
    super::parse_json(API, bytes)
}

/// Ollama's timestamp for now.
fn now() -> String {
    rfc3339(SystemTime::now())
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// The last line of an answer: the image and the durations Ollama reports.
fn final_line(model: &str, finished: &Finished) -> Value {
    let mut line = json!({
        "model": model,
        "created_at": now(),
        "response": "",
        "done": true,
        "done_reason": if finished.images.is_empty() {
            if finished.unloaded { "unload" } else { "load" }
        } else {
            "stop"
        },
        "total_duration": nanos(finished.total),
        "load_duration": nanos(finished.load),
    });
    if let Some(image) = finished.images.first() {
        line["image"] = json!(base64::engine::general_purpose::STANDARD.encode(&image.png));
        line["prompt_eval_count"] = json!(image.prompt_tokens);
        line["prompt_eval_duration"] = json!(nanos(image.seconds("text")));
        line["eval_count"] = json!(image.steps);
        line["eval_duration"] = json!(nanos(image.seconds("denoise") + image.seconds("decode")));
    }
    line
}

fn progress_line(model: &str, completed: usize, total: usize) -> Value {
    json!({
        "model": model,
        "created_at": now(),
        "response": "",
        "done": false,
        "completed": completed,
        "total": total,
    })
}

/// `POST /api/generate`: NDJSON progress then the image (`stream` true, the default), or
/// the image alone.
pub async fn generate(
    State(state): State<Arc<AppState>>,
    super::Named { body, name }: super::Named<GenerateBody>,
) -> Result<Response, ApiError> {
    let seed = match body.options.as_ref().and_then(|o| o.seed) {
        Some(s) if s >= 0 => s as u64,
        // Ollama's clients send -1 (or nothing) for a random seed.
        _ => super::random_seed(),
    };
    // The numbers are checked first, as the command line checks its flags before any file.
    let job = crate::generation::Job {
        negative_prompt: body.negative_prompt.clone(),
        seed,
        ..crate::generation::Job::new(super::stored(&state, &name), body.prompt.clone())
    };
    let mut job = super::with_request_numbers!(job, body);
    super::check_job(API, &job)?;
    let keep_alive = body
        .keep_alive
        .as_ref()
        .map(super::parse_keep_alive)
        .transpose()
        .map_err(|e| ApiError::bad_request(API, e))?;
    job.loras = super::request_loras(&state, API, body.loras.as_deref())?;
    let strength = request_strength(&body)?;
    let (image, control_image) = request_pictures(&body)?;
    // A model of a family that takes references edits from its `images`, every one a
    // reference; for the others the first is the picture image-to-image starts from.
    let takes_references = super::model_takes(&state, &name, crate::families::Feature::References);
    let references: Vec<Vec<u8>> = match takes_references {
        true => (body.images.iter().flatten().enumerate())
            .map(|(k, t)| super::base64_field(API, &format!("images[{k}]"), t))
            .collect::<Result<_, _>>()?,
        false => Vec::new(),
    };
    let image = image.filter(|_| !takes_references);
    let names: Vec<String> = (0..references.len())
        .map(|k| format!("images[{k}]"))
        .collect();
    let mut given = vec![
        ("field `images`", "images[0]", image.as_deref()),
        ("field", "control_image", control_image.as_deref()),
    ];
    given.extend(
        names
            .iter()
            .zip(&references)
            .map(|(n, b)| ("field `images`", n.as_str(), Some(b.as_slice()))),
    );
    let pictures = crate::input_budget::Input::given(&given);
    // Held until the answer is done: the pictures live that long.
    let reservation = super::admit_inputs(&state, API, &pictures, 1)?;
    let has_pictures = image.is_some() || !references.is_empty();
    let (input, references) = super::decoding(API, has_pictures, move || {
        let references = super::decode_references(API, "images", &references)?;
        let input = (image.as_deref())
            .map(|b| decode_input(b, strength))
            .transpose()?;
        Ok((input, references))
    })
    .await?;
    job.input = input;
    job.references = references;
    job.control = super::decode_control(&state, API, &body, control_image).await?;
    super::check_job(API, &job)?;
    super::check_family(&state, API, &name, &job)?;
    open_model(&state, API, &name, true).await?;
    // No prompt: the model is only loaded (or unloaded).
    let generate = (!body.prompt.is_empty()).then_some(job);
    let label = format!("POST /api/generate {}", body.model.escape_debug());
    let (guard, mut rx) = super::queue(&state, API, |cancel, events| Job {
        model: name,
        generate,
        keep_alive,
        cancel,
        events,
        label,
    })?;
    let model = body.model.clone();
    // A job behind another one: the stream starts now and says where it waits. (An idle
    // worker takes the job at once, and loading a model answers in one line.)
    let waits = state.worker.running().is_some() && state.worker.position(guard.cancel()).is_some();
    if !body.prompt.is_empty() && body.stream.unwrap_or(true) && waits {
        let waiting = Waiting {
            worker: state.worker.clone(),
            cancel: guard.cancel().clone(),
            reported: None,
            looked: false,
        };
        let answer = stream_answer(model.clone(), rx, (guard, reservation), Some(waiting));
        return Ok(with_model(answer, &model));
    }
    let first = first_event(&mut rx).await;
    let response = match first {
        Event::Done(Err(e)) => return Err(super::job_error(API, e)),
        Event::Done(Ok(finished)) => {
            let mut guard = guard;
            guard.finish();
            Json(final_line(&model, &finished)).into_response()
        }
        _ if body.stream.unwrap_or(true) => {
            stream_answer(model.clone(), rx, (guard, reservation), None)
        }
        _ => {
            let mut guard = guard;
            let finished = wait_done(&mut rx)
                .await
                .map_err(|e| super::job_error(API, e))?;
            guard.finish();
            Json(final_line(&model, &finished)).into_response()
        }
    };
    Ok(with_model(response, &model))
}

/// The job's first event; a worker that went away reads as an internal error.
async fn first_event(rx: &mut UnboundedReceiver<Event>) -> Event {
    rx.recv().await.unwrap_or_else(|| {
        Event::Done(Err(JobError::new(
            super::worker::JobErrorKind::Internal,
            "the generation worker stopped; restart the server",
        )))
    })
}

/// Waits for the job's result, skipping progress.
pub async fn wait_done(rx: &mut UnboundedReceiver<Event>) -> Result<Finished, JobError> {
    loop {
        if let Event::Done(result) = first_event(rx).await {
            return result;
        }
    }
}

/// How often a waiting job's stream looks at its place in the queue.
const QUEUE_LOOK: Duration = Duration::from_millis(500);

/// A streamed job that waits in the queue: where it was last said to be.
struct Waiting {
    worker: super::worker::Worker,
    cancel: Arc<super::worker::Cancel>,
    /// The place last reported; `None` before the first look.
    reported: Option<usize>,
    looked: bool,
}

impl Waiting {
    /// A line with the job's place in the queue when it changed; null otherwise.
    fn look(&mut self, model: &str) -> Value {
        self.looked = true;
        match self.worker.position(&self.cancel) {
            Some(n) if self.reported != Some(n) => {
                self.reported = Some(n);
                json!({
                    "model": model,
                    "created_at": now(),
                    "response": "",
                    "done": false,
                    "queue_position": n,
                })
            }
            _ => Value::Null,
        }
    }
}

/// The NDJSON stream: while the job waits, a line whenever its place in the queue changes
/// (`queue_position`, 1 = next); then a line per step, then the final line (or an `error`
/// line). The stream holds the cancel guard, so a client that leaves stops the job, and the
/// reservation of the request's pictures, given back when the stream ends.
fn stream_answer(
    model: String,
    rx: UnboundedReceiver<Event>,
    held: (CancelGuard, Option<crate::input_budget::Reservation>),
    waiting: Option<Waiting>,
) -> Response {
    let lines = futures_util::stream::unfold(
        (rx, Some(held), model, waiting),
        |(mut rx, held, model, mut waiting)| async move {
            let (mut guard, reservation) = held?;
            let event = match waiting.as_mut() {
                Some(w) if !w.looked => Err(w.look(&model)),
                Some(w) => match tokio::time::timeout(QUEUE_LOOK, first_event(&mut rx)).await {
                    Ok(event) => Ok(event),
                    Err(_) => Err(w.look(&model)),
                },
                None => Ok(first_event(&mut rx).await),
            };
            let event = match event {
                Ok(event) => event,
                Err(line) => {
                    let bytes = if line.is_null() {
                        Ok(Bytes::new())
                    } else {
                        ndjson(&line)
                    };
                    return Some((bytes, (rx, Some((guard, reservation)), model, waiting)));
                }
            };
            // Once the job has left the queue its events alone are reported: the state below
            // carries no `Waiting` on.
            let line = match event {
                Event::Started => json!(null),
                Event::Progress(p) => progress_line(&model, p.step, p.steps),
                Event::Done(Ok(finished)) => {
                    guard.finish();
                    let line = final_line(&model, &finished);
                    return Some((ndjson(&line), (rx, None, model, None)));
                }
                Event::Done(Err(e)) => {
                    guard.finish();
                    let line = json!({ "error": e.message });
                    return Some((ndjson(&line), (rx, None, model, None)));
                }
            };
            let bytes = if line.is_null() {
                Ok(Bytes::new())
            } else {
                ndjson(&line)
            };
            Some((bytes, (rx, Some((guard, reservation)), model, None)))
        },
    );
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

fn ndjson(v: &Value) -> Result<Bytes, std::convert::Infallible> {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    Ok(Bytes::from(line))
}

impl super::NamesModel for ModelBody {
    const API: Api = API;

    fn model(&self) -> &str {
        &self.model
    }
}

impl super::ControlFields for GenerateBody {
    fn controlnet(&self) -> Option<&str> {
        self.controlnet.as_deref()
    }
    fn control_scale(&self) -> Option<f32> {
        self.control_scale
    }
}

impl super::NamesModel for GenerateBody {
    const API: Api = API;
    // Its `images` carry pictures in base64.
    const MAX_BODY: usize = super::MAX_PICTURE_BODY_BYTES;

    fn model(&self) -> &str {
        &self.model
    }
}
