//! The web page of `zimage serve`, at `/ui`: a form for the job, live progress with cancel,
//! and a gallery of what it made. The page is three static files built into the binary; it
//! speaks the small JSON API below, which runs its jobs on the same worker and runner as every
//! other API.
//!
//! - `GET /ui/api/info`: the models, LoRA files and ControlNets the form offers.
//! - `POST /ui/api/jobs`: queue a job; `GET /ui/api/jobs/{id}` its state, `POST …/cancel`.
//! - `GET /ui/api/gallery`, `GET /ui/gallery/{file}`, `DELETE /ui/api/gallery/{file}`.

pub mod gallery;
pub mod jobs;

use super::errors::{Api, ApiError};
use super::{AppState, LoraBody};
use crate::families::{Family, Feature};
use crate::generation;
use crate::store::{Store, StoredModel};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// The page's errors are `{"error": "…"}`, as Ollama's.
const API: Api = Api::Ollama;
/// The most LoRA files the form lists.
const MAX_LORA_FILES: usize = 500;

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_CSS: &str = include_str!("page/app.css");
const APP_JS: &str = include_str!("page/app.js");

/// The paths any browser may fetch without the API key: the page itself holds no secret, and
/// asks for the key when the API wants one.
pub fn is_public(path: &str) -> bool {
    matches!(path, "/ui" | "/ui/" | "/ui/app.css" | "/ui/app.js")
}

/// Whether a request for `/` comes from a browser, which is sent to the page; API clients
/// (which do not ask for HTML) keep `/`'s plain answer.
pub fn wants_page(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"))
}

pub fn routes() -> Router<Arc<AppState>> {
    let page = Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/app.css", get(css))
        .route("/ui/app.js", get(js));
    let api = Router::new()
        .route("/ui/api/info", get(info))
        .route(
            "/ui/api/jobs",
            post(submit).layer(axum::extract::DefaultBodyLimit::max(
                super::MAX_PICTURE_BODY_BYTES,
            )),
        )
        .route("/ui/api/jobs/{id}", get(status))
        .route("/ui/api/jobs/{id}/cancel", post(cancel))
        .route("/ui/api/gallery", get(gallery_list))
        .route(
            "/ui/api/gallery/{file}",
            axum::routing::delete(gallery_delete),
        )
        .route("/ui/gallery/{file}", get(gallery_file))
        .layer(axum::middleware::from_fn(same_origin));
    page.merge(api)
}

/// Refuses a request to the page's API that a page of another site sent: a browser names
/// the sending page's origin, and the page's own requests name this server. Without it any
/// site the user visits could queue jobs on, or delete images from, a server on loopback; and
/// embed its gallery's images (an `<img>` sends no `Origin`, but says it is cross-site).
async fn same_origin(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<Response, ApiError> {
    let headers = req.headers();
    let (host, origin) =
        super::origin::host_and_origin(headers).map_err(|e| ApiError::bad_request(API, e))?;
    if super::origin::from_another_site(headers) {
        return Err(ApiError::new(
            API,
            StatusCode::FORBIDDEN,
            "a page of another site may not use this server's page or its images; open the page at /ui",
        ));
    }
    if let Some(origin) = origin {
        if !super::origin::same_origin(origin, host) {
            return Err(ApiError::new(
                API,
                StatusCode::FORBIDDEN,
                format!(
                    "a page of another site (`{}`) may not use this server's page API; open the page at /ui",
                    crate::shown::text(origin)
                ),
            ));
        }
    }
    Ok(next.run(req).await)
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        text,
    )
        .into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

/// `GET /ui/api/info`.
async fn info(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let current = super::current::current_model(&state, API).await.ok();
    let store = state.store.clone();
    let lora_dir = state.lora_dir.clone();
    let (models, controlnets, loras) = tokio::task::spawn_blocking(move || {
        let scan = store.scan().map_err(|e| e.to_string())?;
        let mut models = Vec::new();
        let mut controlnets = Vec::new();
        for m in &scan.models {
            if generation::check_image_model(&store, m).is_ok() {
                models.push(model_entry(&store, m));
            } else if super::current::is_controlnet(&store, m) {
                controlnets.push(m.name.short());
            }
        }
        let loras = lora_dir.as_deref().map(lora_files).unwrap_or_default();
        Ok::<_, String>((models, controlnets, loras))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_err(|e| ApiError::new(API, StatusCode::INTERNAL_SERVER_ERROR, e))?;
    Ok(Json(json!({
        "models": models,
        "current": current.map(|m| m.short()),
        "loras": loras,
        "controlnets": controlnets,
        "max_count": generation::MAX_COUNT,
        "max_references": crate::pipeline::reference::MAX_REFERENCES,
        // Where the model's own is unknown; each model gives its own.
        "size_multiple": 16,
    })))
}

/// A model as the form offers it: its name, default size and recorded settings.
fn model_entry(store: &Store, model: &StoredModel) -> Value {
    let source = crate::loader::StoreSource::new(store, model);
    let defaults = crate::generation_defaults::GenerationDefaults::of(&source).unwrap_or_default();
    let side = store
        .config_file(model, "vae/config.json")
        .ok()
        .flatten()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|c| c["sample_size"].as_u64())
        .unwrap_or(1024);
    let (mut steps, mut guidance, negative) = defaults.resolve(None, None, None);
    // A model without a family of its own is the first family's, as the runner reads it.
    let family = Family::of(&source).unwrap_or_else(|_| Family::default_family());
    // The family's own defaults where the model records none.
    if let Some(own) = family.own_defaults(&source) {
        steps = defaults.steps.unwrap_or(own.steps);
        guidance = defaults.guidance.unwrap_or(own.guidance);
    }
    let cell = family.cell(&source).unwrap_or(16);
    json!({
        "name": model.name.to_string(),
        "short": model.name.short(),
        "family": family.name(),
        // What the form offers for this model.
        "takes": {
            "controlnet": family.model_takes(&source, Feature::ControlNet),
            "cfg_normalization": family.model_takes(&source, Feature::CfgNormalization),
            "cfg_truncation": family.model_takes(&source, Feature::CfgTruncation),
            "references": family.model_takes(&source, Feature::References),
            "picture": family.model_takes(&source, Feature::ImageInput),
            "mask": family.model_takes(&source, Feature::Mask),
            "hires": family.model_takes(&source, Feature::Hires),
        },
        "width": side,
        "height": side,
        "size_multiple": cell,
        "steps": steps,
        "guidance": guidance,
        "negative_prompt": negative.unwrap_or_default(),
        "cfg_normalization": defaults.cfg_normalization.unwrap_or(false),
        "cfg_truncation": defaults.cfg_truncation.unwrap_or(crate::pipeline::NO_TRUNCATION),
    })
}

/// The safetensors files under the LoRA folder (three levels deep at most), as paths relative
/// to it, sorted.
fn lora_files(dir: &std::path::Path) -> Vec<String> {
    fn walk(dir: &std::path::Path, root: &std::path::Path, depth: usize, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.filter_map(Result::ok) {
            if out.len() >= MAX_LORA_FILES {
                return;
            }
            let path = e.path();
            if path.is_dir() && depth < 3 {
                walk(&path, root, depth + 1, out);
            } else if path.extension().is_some_and(|x| x == "safetensors") {
                if let Some(relative) = path.strip_prefix(root).ok().and_then(|p| p.to_str()) {
                    out.push(relative.to_string());
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, 0, &mut out);
    out.sort();
    out
}

/// A job as the page's form sends it.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct PageBody {
    model: Option<String>,
    #[serde(default)]
    prompt: String,
    negative_prompt: Option<String>,
    width: Option<u32>,
    height: Option<u32>,
    steps: Option<u64>,
    guidance: Option<f32>,
    /// True classifier-free guidance's scale (`--true-cfg`), for a guidance-distilled model.
    true_cfg: Option<f32>,
    cfg_normalization: Option<bool>,
    cfg_truncation: Option<f64>,
    seed: Option<u64>,
    count: Option<u32>,
    loras: Option<Vec<LoraBody>>,
    /// A data URL or base64.
    picture: Option<String>,
    /// Pictures the model edits from (a family that takes references), data URLs or base64, in
    /// order.
    references: Option<Vec<String>>,
    strength: Option<f64>,
    /// White repaints, black keeps; the picture's size.
    mask: Option<String>,
    /// Inpaint the masked area alone with this padding (`--only-masked`).
    only_masked: Option<u32>,
    controlnet: Option<String>,
    control_image: Option<String>,
    control_scale: Option<f32>,
    /// A hires pass (`--hires-scale`, `--hires-strength`, `--hires-steps`).
    hires_scale: Option<f32>,
    hires_strength: Option<f64>,
    hires_steps: Option<u64>,
}

impl super::ControlFields for PageBody {
    fn controlnet(&self) -> Option<&str> {
        self.controlnet.as_deref()
    }
    fn control_scale(&self) -> Option<f32> {
        self.control_scale
    }
}

/// `POST /ui/api/jobs`: the form checked and queued; `{"id"}`.
async fn submit(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body: PageBody =
        super::read_json(API, &headers, body, super::MAX_PICTURE_BODY_BYTES).await?;
    let name = match body.model.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => super::model_name(API, m)?,
        None => super::current::current_model(&state, API).await?,
    };
    let decode = |field: &str, text: &Option<String>| {
        text.as_deref()
            .map(|t| super::base64_field(API, field, t))
            .transpose()
    };
    let picture = decode("picture", &body.picture)?;
    let mask = decode("mask", &body.mask)?;
    let control_image = decode("control_image", &body.control_image)?;
    let references: Vec<Vec<u8>> = (body.references.iter().flatten().enumerate())
        .map(|(k, t)| super::base64_field(API, &format!("references[{k}]"), t))
        .collect::<Result<_, _>>()?;
    if picture.is_none() {
        if mask.is_some() {
            return Err(ApiError::bad_request(
                API,
                "field `mask` needs `picture`: a mask says which part of the picture to paint again",
            ));
        }
        if body.only_masked.is_some() {
            return Err(ApiError::bad_request(
                API,
                "field `only_masked` needs `picture` and `mask`: it inpaints the area the mask marks",
            ));
        }
    }
    super::check_strength(API, body.strength, picture.is_some())?;
    // The numbers and prompts are checked before any picture is admitted or decoded.
    let job = generation::Job {
        negative_prompt: body.negative_prompt.clone().filter(|n| !n.is_empty()),
        // Random seeds stay within 2³², as A1111 draws them, so the page's JavaScript numbers
        // hold them exactly.
        seed: body
            .seed
            .unwrap_or_else(|| super::random_seed() % (1 << 32)),
        count: body.count.unwrap_or(1),
        loras: super::request_loras(&state, API, body.loras.as_deref())?,
        hires: hires(&body)?,
        ..generation::Job::new(super::stored(&state, &name), body.prompt.clone())
    };
    let job = super::with_request_numbers!(job, body);
    super::check_job(API, &job)?;
    let names: Vec<String> = (0..references.len())
        .map(|k| format!("references[{k}]"))
        .collect();
    let mut given = vec![
        ("field", "picture", picture.as_deref()),
        ("field", "mask", mask.as_deref()),
        ("field", "control_image", control_image.as_deref()),
    ];
    given.extend(
        (names.iter().zip(&references)).map(|(n, b)| ("field", n.as_str(), Some(b.as_slice()))),
    );
    let inputs = crate::input_budget::Input::given(&given);
    let reservation = super::admit_inputs(&state, API, &inputs, 1)?;
    let store = state.store.clone();
    let has_pictures = !inputs.is_empty();
    let job = super::decoding(API, has_pictures, move || {
        let input = picture
            .map(|p| {
                super::picture_input(
                    API,
                    ["picture", "mask"],
                    &p,
                    mask.as_deref(),
                    body.strength,
                    image::DynamicImage::clone,
                )
            })
            .transpose()?
            .map(|input| generation::PictureInput {
                only_masked: body.only_masked,
                ..input
            });
        let control = super::request_control(&store, API, &body, control_image.as_deref())?;
        let job = generation::Job {
            input,
            control,
            references: super::decode_references(API, "references", &references)?,
            ..job
        };
        super::check_job(API, &job)?;
        Ok(job)
    })
    .await?;
    super::check_family(&state, API, &name, &job)?;
    super::open_model(&state, API, &name, true).await?;
    let id = jobs::PageJobs::submit(&state, name, job, reservation)?;
    Ok(Json(json!({ "id": id.to_string() })))
}

/// The form's hires pass: `hires_scale` turns it on; the strength and steps need it.
fn hires(body: &PageBody) -> Result<Option<generation::Hires>, ApiError> {
    match body.hires_scale {
        None if body.hires_strength.is_some() || body.hires_steps.is_some() => {
            Err(ApiError::bad_request(
                API,
                "hires_strength and hires_steps need hires_scale: the pass they set",
            ))
        }
        None => Ok(None),
        Some(scale) => Ok(Some(generation::Hires {
            scale,
            strength: body
                .hires_strength
                .unwrap_or(generation::Hires::DEFAULT_STRENGTH),
            steps: body
                .hires_steps
                .map(|s| usize::try_from(s).unwrap_or(usize::MAX)),
        })),
    }
}

fn job_id(text: &str) -> Result<u64, ApiError> {
    text.parse().map_err(|_| {
        ApiError::new(
            API,
            StatusCode::NOT_FOUND,
            format!("no job `{}`", crate::shown::text(text)),
        )
    })
}

fn no_job(id: u64) -> ApiError {
    ApiError::new(
        API,
        StatusCode::NOT_FOUND,
        format!("no job {id}: it never was, or it ended long ago"),
    )
}

/// `GET /ui/api/jobs/{id}`.
async fn status(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = job_id(&id)?;
    let state2 = state.clone();
    tokio::task::spawn_blocking(move || state2.page_jobs.status(&state2, id))
        .await
        .map_err(|e| ApiError::new(API, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map(Json)
        .ok_or_else(|| no_job(id))
}

/// `POST /ui/api/jobs/{id}/cancel`.
async fn cancel(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = job_id(&id)?;
    let cancelled = state.page_jobs.cancel(id).ok_or_else(|| no_job(id))?;
    Ok(Json(json!({ "cancelled": cancelled })))
}

/// `GET /ui/api/gallery`.
async fn gallery_list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let images = tokio::task::spawn_blocking(move || state.gallery.list(state.lora_dir.as_deref()))
        .await
        .map_err(|e| ApiError::new(API, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(json!({ "images": images })))
}

fn no_file(file: &str) -> ApiError {
    ApiError::new(
        API,
        StatusCode::NOT_FOUND,
        format!("no image `{}` in the gallery", crate::shown::text(file)),
    )
}

/// `GET /ui/gallery/{file}`: the PNG as made, metadata and all.
async fn gallery_file(
    State(state): State<Arc<AppState>>,
    Path(file): Path<String>,
) -> Result<Response, ApiError> {
    if !gallery::valid_name(&file) {
        return Err(no_file(&file));
    }
    let gallery = state.gallery.clone();
    let name = file.clone();
    let bytes = tokio::task::spawn_blocking(move || gallery.read(&name))
        .await
        .ok()
        .flatten()
        .ok_or_else(|| no_file(&file))?;
    Ok((
        [
            (header::CONTENT_TYPE, "image/png"),
            (header::CACHE_CONTROL, "private, max-age=86400"),
        ],
        bytes,
    )
        .into_response())
}

/// `DELETE /ui/api/gallery/{file}`.
async fn gallery_delete(
    State(state): State<Arc<AppState>>,
    Path(file): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !gallery::valid_name(&file) {
        return Err(no_file(&file));
    }
    let deleted = state
        .gallery
        .delete(&file)
        .map_err(|e| ApiError::new(API, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if !deleted {
        return Err(no_file(&file));
    }
    Ok(Json(json!({ "deleted": true })))
}
