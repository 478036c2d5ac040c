//! AUTOMATIC1111's web UI API (`/sdapi/v1/`), as its clients (the `webuiapi` package, Open
//! WebUI, SillyTavern) call it: `txt2img` and `img2img` parsed into one generation job, the
//! listings clients read before they generate, the options that pick the model, and the
//! progress, interrupt and skip routes over the worker's running job.
//!
//! A field zimage cannot honour is refused with a 400 that names it, unless its value is the
//! one that changes nothing (clients send every field, most at its neutral value).

mod controlnet;
mod models;
mod progress;
mod request;

pub use models::{
    embeddings, get_options, loras, none, refresh_checkpoints, samplers, schedulers, scripts,
    sd_models, sd_vae, set_options, upscalers,
};
pub use progress::{interrupt, progress, skip};

/// `GET /controlnet/version`: the ControlNet extension's API version.
pub async fn controlnet_version() -> Json<Value> {
    Json(json!({ "version": controlnet::VERSION }))
}

/// `GET /controlnet/model_list`: the stored ControlNets, by name.
pub async fn controlnet_models(
    State(state): State<Arc<AppState>>,
) -> Result<Json<Value>, ApiError> {
    let names = super::current::controlnets(&state, API).await?;
    Ok(Json(json!({ "model_list": names })))
}

/// `GET /controlnet/module_list`: no preprocessors; clients send prepared control images.
pub async fn controlnet_modules() -> Json<Value> {
    Json(json!({ "module_list": ["none"], "module_detail": {} }))
}

use super::errors::{Api, ApiError};
use super::worker::{Event, Job};
use super::{with_model, AppState};
use crate::generation;
use crate::store::ModelName;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use models::request_model;
use request::{job_of, Body1111, Kind};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::SystemTime;

const API: Api = Api::A1111;
/// The one sampler zimage has: the flow-matching Euler step every family's schedule takes.
const SAMPLER: &str = "Euler";
/// The one schedule: flow matching with the model's shift, which A1111 clients call automatic.
const SCHEDULER: &str = "automatic";

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(API, message)
}

/// A body as received (echoed as `parameters`), and as read.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<(Value, Body1111), ApiError> {
    let raw: Value = super::read_json(API, headers, body, super::MAX_PICTURE_BODY_BYTES).await?;
    let parsed = serde_path_to_error::deserialize(raw.clone()).map_err(|e| {
        let path = e.path().to_string();
        bad(format!("field `{path}`: {}", e.into_inner()))
    })?;
    Ok((raw, parsed))
}

/// The `info` JSON A1111 writes beside the images.
fn info(
    b: &Body1111,
    job: &generation::Job,
    model: &ModelName,
    images: &[generation::Image],
    started: SystemTime,
) -> Value {
    let first = images
        .first()
        .map(|i| crate::formats::infotext::parse(&i.infotext));
    let param = |key: &str| first.as_ref().and_then(|t| t.get(key)).map(str::to_string);
    let number = |key: &str| param(key).and_then(|v| v.parse::<f64>().ok());
    let size = param("Size").and_then(|s| {
        let (w, h) = s.split_once('x')?;
        Some((w.parse::<u32>().ok()?, h.parse::<u32>().ok()?))
    });
    let (width, height) = size.unwrap_or((job.width.unwrap_or(0), job.height.unwrap_or(0)));
    let seeds: Vec<u64> = images.iter().map(|i| i.seed).collect();
    let prompt = first
        .as_ref()
        .map_or(job.prompt.clone(), |t| t.prompt.clone());
    let negative = first
        .as_ref()
        .map_or(String::new(), |t| t.negative_prompt.clone());
    let n = images.len();
    json!({
        "prompt": prompt,
        "all_prompts": vec![&prompt; n],
        "negative_prompt": negative,
        "all_negative_prompts": vec![&negative; n],
        "seed": job.seed,
        "all_seeds": seeds,
        // Without variation seeds (subseed_strength 0) the subseeds are the seeds.
        "subseed": job.seed,
        "all_subseeds": seeds,
        "subseed_strength": 0,
        "width": width,
        "height": height,
        "sampler_name": SAMPLER,
        "scheduler": SCHEDULER,
        "cfg_scale": number("CFG scale").or(job.guidance.map(f64::from)),
        "steps": number("Steps").map(|s| s as u64).or(job.steps.map(|s| s as u64)),
        "batch_size": b.batch_size.unwrap_or(1),
        "n_iter": b.n_iter.unwrap_or(1),
        "restore_faces": false,
        "face_restoration_model": null,
        "sd_model_name": model.short(),
        "sd_model_hash": param("Model hash"),
        "sd_vae_name": null,
        "sd_vae_hash": null,
        "seed_resize_from_w": -1,
        "seed_resize_from_h": -1,
        "denoising_strength": number("Denoising strength"),
        "extra_generation_params": {},
        "index_of_first_image": 0,
        "infotexts": images.iter().map(|i| i.infotext.clone()).collect::<Vec<_>>(),
        "styles": [],
        "job_timestamp": super::compact_time(started),
        "clip_skip": 1,
        "is_using_inpainting_conditioning": false,
        "version": format!("zimage {}", env!("CARGO_PKG_VERSION")),
    })
}

/// txt2img and img2img: the job queued, its images awaited, A1111's answer made.
async fn generate(
    state: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
    kind: Kind,
) -> Result<Response, ApiError> {
    let (raw, b) = read_body(&headers, body).await?;
    let model = request_model(&state, &b).await?;
    let (job, pictures) = job_of(&state, &b, kind, &model)?;
    // Held until the answer is done: the pictures live that long.
    let _reservation = super::admit_inputs(&state, API, &pictures.inputs(), 1)?;
    let store = state.store.clone();
    let has_pictures = !pictures.inputs().is_empty();
    let job = super::decoding(API, has_pictures, move || pictures.decode_into(&store, job)).await?;
    super::open_model(&state, API, &model, true).await?;
    let started = SystemTime::now();
    let label = format!("POST {} {}", kind.path(), model.short().escape_debug());
    // A1111's clients show the running step's picture from `progress`.
    let generate = generation::Job {
        preview: true,
        ..job.clone()
    };
    let (mut guard, mut rx) = super::queue(&state, API, |cancel, events| Job {
        model: model.clone(),
        generate: Some(generate),
        keep_alive: None,
        cancel,
        events,
        label,
    })?;
    let finished = loop {
        match rx.recv().await {
            Some(Event::Done(result)) => break result.map_err(|e| super::job_error(API, e))?,
            Some(_) => {}
            None => {
                return Err(ApiError::new(
                    API,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the generation worker stopped; restart the server",
                ))
            }
        }
    };
    guard.finish();
    let images: Vec<String> = finished
        .images
        .iter()
        .map(|i| base64::engine::general_purpose::STANDARD.encode(&i.png))
        .collect();
    let info = info(&b, &job, &model, &finished.images, started);
    let answer = json!({
        "images": images,
        "parameters": raw,
        "info": info.to_string(),
    });
    Ok(with_model(Json(answer).into_response(), &model.short()))
}

/// `POST /sdapi/v1/txt2img`.
pub async fn txt2img(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    generate(state, headers, body, Kind::Txt2Img).await
}

/// `POST /sdapi/v1/img2img`.
pub async fn img2img(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    generate(state, headers, body, Kind::Img2Img).await
}
