//! `zimage serve`: Ollama's image API (`/api/generate`, `/api/tags`, …), OpenAI's
//! (`/v1/images/generations`, `/v1/images/edits`, `/v1/models`) and AUTOMATIC1111's
//! (`/sdapi/v1/txt2img`, `/sdapi/v1/img2img`, …) over HTTP, on the models of the store, so the
//! clients that called Ollama or A1111 for images work unchanged.
//!
//! Requests are parsed and bounded here; generation runs on one worker thread
//! ([`worker`]) that keeps the last model loaded for `keep_alive`.

pub mod a1111;
pub mod current;
pub mod drain;
pub mod errors;
pub mod hosted;
pub mod metrics;
pub mod ollama;
pub mod openai;
pub mod origin;
pub mod probes;
pub mod pull;
pub mod ui;
pub mod worker;

use crate::store::{Store, StoredModel};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use errors::{Api, ApiError};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use worker::{KeepAlive, Worker};

/// Where Ollama listens, so that its clients find this server without settings.
pub const DEFAULT_PORT: u16 = 11434;
/// The largest request body read. A prompt is a few kilobytes; nothing a client sends for an
/// image needs more.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// The largest body of a request that carries pictures (Ollama's base64 `images`, OpenAI's
/// edit form): a few full-size PNGs.
pub const MAX_PICTURE_BODY_BYTES: usize = 64 << 20;
/// The most images one OpenAI request may ask for (OpenAI's own limit).
pub const MAX_IMAGES_PER_REQUEST: u64 = 10;
/// Models stay loaded this long after their last request unless told otherwise.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(5 * 60);
/// Requests that may wait for the worker unless `ZIMAGE_MAX_QUEUE` says otherwise.
pub const DEFAULT_MAX_QUEUE: usize = 64;

/// What the HTTP side shares.
pub struct AppState {
    pub store: crate::store::Store,
    pub worker: Worker,
    pub api_key: Option<String>,
    /// The folder requests may name LoRA files in (`--lora-dir`); none: requests name none.
    pub lora_dir: Option<std::path::PathBuf>,
    /// The memory the input pictures of the requests held at once may take together.
    pub inputs: Arc<crate::input_budget::Pool>,
    /// Images answered by URL.
    pub hosted: hosted::Hosted,
    /// The model chosen for requests that name none (`--default-model`, or a client's
    /// choice); none: [`current::current_model`] picks the newest.
    pub default_model: std::sync::Mutex<Option<crate::store::ModelName>>,
    /// Where the page keeps the images it made.
    pub gallery: ui::gallery::Gallery,
    /// The page's jobs, as it polls them.
    pub page_jobs: ui::jobs::PageJobs,
    /// What `/readyz` waits for besides the worker (the `--pull` models).
    pub readiness: probes::Readiness,
}

impl AppState {
    /// The model chosen for requests that name none, if one was.
    pub fn chosen_model(&self) -> Option<crate::store::ModelName> {
        self.default_model
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn choose_model(&self, name: crate::store::ModelName) {
        *self.default_model.lock().unwrap_or_else(|p| p.into_inner()) = Some(name);
    }
}

/// Seconds a client is asked to wait before it tries a busy server again.
pub const RETRY_AFTER_SECONDS: u32 = 5;

/// Admits a request's input pictures before any is decoded: their headers are checked, and the
/// memory they will hold decoded (each `copies` times: a request for several images carries its
/// inputs with each) is taken from the server's pool until the returned reservation is dropped.
/// Inputs that could never fit are a 400; inputs that fit once other requests finish, a 503
/// with `Retry-After`.
pub fn admit_inputs(
    state: &AppState,
    api: Api,
    inputs: &[crate::input_budget::Input],
    copies: u64,
) -> Result<Option<crate::input_budget::Reservation>, ApiError> {
    use crate::input_budget as budget;
    if inputs.is_empty() {
        return Ok(None);
    }
    let capacity = state.inputs.capacity();
    let bytes = budget::check(
        inputs,
        copies,
        capacity,
        " this server holds for a request's pictures",
        "",
    )
    .map_err(|e| ApiError::bad_request(api, e.to_string()))?;
    let reservation = state.inputs.try_reserve(bytes).map_err(|busy| {
        ApiError::new(
            api,
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the server is busy: this request's pictures need about {} of memory decoded, and the requests it holds leave {} free; try again later",
                crate::memory_plan::gb(busy.wanted),
                crate::memory_plan::gb(busy.free)
            ),
        )
        .with_retry_after(RETRY_AFTER_SECONDS)
    })?;
    Ok(Some(reservation))
}

/// Runs `work`, which decodes a request's pictures when it has any, on the blocking pool, off
/// the async threads that answer every other request; a request without pictures runs it where
/// it is, for no hop to another thread.
pub async fn decoding<T: Send + 'static>(
    api: Api,
    has_pictures: bool,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    if !has_pictures {
        return work();
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::new(api, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

/// The most LoRAs one request may apply.
pub const MAX_LORAS_PER_REQUEST: usize = 16;

/// One LoRA a request asks for: a file in the server's `--lora-dir`, with its scale.
#[derive(serde::Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct LoraBody {
    pub path: String,
    pub scale: Option<f32>,
}

/// A request's `loras`, each resolved inside the server's LoRA folder. A path that leaves the
/// folder (absolute, `..`, or a link to elsewhere) or names no file is refused: a client
/// reads no file the operator did not put there.
pub fn request_loras(
    state: &AppState,
    api: Api,
    loras: Option<&[LoraBody]>,
) -> Result<Vec<crate::lora::LoraSpec>, ApiError> {
    let loras = loras.unwrap_or_default();
    if loras.is_empty() {
        return Ok(Vec::new());
    }
    let bad = |message: String| ApiError::bad_request(api, message).with_param("loras");
    let Some(dir) = &state.lora_dir else {
        return Err(bad(
            "this server takes no LoRA files: start it with `--lora-dir DIR` (or ZIMAGE_LORA_DIR) and name files in that folder".into(),
        ));
    };
    if loras.len() > MAX_LORAS_PER_REQUEST {
        return Err(bad(format!(
            "{} LoRAs asked for; a request may apply at most {MAX_LORAS_PER_REQUEST}",
            loras.len()
        )));
    }
    loras
        .iter()
        .map(|l| {
            let shown = crate::lora::shown(&l.path);
            let scale = l.scale.unwrap_or(1.0);
            if let Some(e) = crate::lora::scale_error(scale) {
                return Err(bad(format!("LoRA `{shown}`: {e}")));
            }
            let relative = std::path::Path::new(&l.path);
            let inside = !l.path.is_empty()
                && relative
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !inside {
                return Err(bad(format!(
                    "LoRA path `{shown}` must be a file name relative to the server's LoRA folder, without `..`"
                )));
            }
            let found = dir
                .join(relative)
                .canonicalize()
                .ok()
                .filter(|p| p.starts_with(dir) && p.is_file());
            let Some(path) = found else {
                return Err(bad(format!(
                    "LoRA `{shown}`: no such file in the server's LoRA folder"
                )));
            };
            Ok(crate::lora::LoraSpec { path, scale })
        })
        .collect()
}

/// The model a request named, for the request's log line.
#[derive(Clone)]
pub struct LoggedModel(pub String);

/// `host[:port]`, `:port`, `http://host[:port][/path]` or `[v6]:port`, read as Ollama reads
/// `OLLAMA_HOST`: a missing host is 127.0.0.1, a missing port 11434 (80 or 443 after an
/// `http://` or `https://` scheme).
pub fn parse_host(text: &str) -> Result<(String, u16), String> {
    let text = text.trim();
    let (default_port, rest) = match text.split_once("://") {
        None => (DEFAULT_PORT, text),
        Some(("http", rest)) => (80, rest),
        Some(("https", rest)) => (443, rest),
        Some((scheme, _)) => {
            return Err(format!(
                "`{}`: scheme `{}` is not http or https",
                text.escape_debug(),
                scheme.escape_debug()
            ))
        }
    };
    let hostport = rest.split('/').next().unwrap_or("");
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("`{}`: `[` without `]`", text.escape_debug()))?;
        match after.strip_prefix(':') {
            Some(p) => (host, Some(p)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("`{}`: junk after `]`", text.escape_debug())),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().map_err(|_| {
            format!(
                "`{}`: port `{}` is not a number within 0..=65535",
                text.escape_debug(),
                p.escape_debug()
            )
        })?,
        None => default_port,
    };
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    Ok((host.to_string(), port))
}

/// The addresses `host:port` resolves to.
pub fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve `{}`: {e}", host.escape_debug()))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("`{}` resolves to no address", host.escape_debug()));
    }
    Ok(addrs)
}

/// `keep_alive` as Ollama takes it: a number of seconds, or a Go duration (`5m`, `1h30m`,
/// `300ms`); negative keeps the model loaded until another is asked for, 0 unloads it at once.
pub fn parse_keep_alive(value: &serde_json::Value) -> Result<KeepAlive, String> {
    let seconds = match value {
        serde_json::Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
        serde_json::Value::String(s) => parse_duration(s)?,
        other => {
            return Err(format!(
                "keep_alive is {other}; give seconds, or a duration such as \"5m\""
            ))
        }
    };
    if seconds.is_nan() {
        return Err("keep_alive is not a number".into());
    }
    if seconds < 0.0 {
        return Ok(KeepAlive::Forever);
    }
    // Anything past a century is forever in practice, and keeps `Instant` arithmetic sound.
    if seconds > 100.0 * 365.0 * 86400.0 {
        return Ok(KeepAlive::Forever);
    }
    Ok(KeepAlive::For(Duration::from_secs_f64(seconds)))
}

/// Seconds in a Go duration string (`1h30m`, `-1m`, `2.5s`), or in a plain number.
fn parse_duration(text: &str) -> Result<f64, String> {
    let bad = || {
        format!(
            "keep_alive `{}` is no duration; give seconds, or e.g. \"5m\", \"1h\", \"-1\"",
            text.escape_debug()
        )
    };
    let t = text.trim();
    if let Ok(n) = t.parse::<f64>() {
        return Ok(n);
    }
    let (sign, mut rest) = match t.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, t.strip_prefix('+').unwrap_or(t)),
    };
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    Ok(sign * total)
}

/// A time as RFC 3339 in UTC, as Ollama's JSON carries times.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// A time as 14 digits, `20261126045012` (UTC), as A1111 stamps its jobs and the gallery
/// names its files.
pub fn compact_time(t: SystemTime) -> String {
    rfc3339(t)
        .chars()
        .filter(char::is_ascii_digit)
        .take(14)
        .collect()
}

/// Seconds since the Unix epoch.
pub fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A request body that names the model it is for, in the dialect of `API`.
pub trait NamesModel {
    const API: Api;
    /// The most bytes such a body may have.
    const MAX_BODY: usize = MAX_BODY_BYTES;
    fn model(&self) -> &str;
}

/// The bytes of a base64 field (`field` names it in messages); a data URL's prefix is skipped.
pub fn base64_field(api: Api, field: &str, text: &str) -> Result<Vec<u8>, ApiError> {
    use base64::Engine;
    let text = text.rsplit_once(',').map_or(text, |(_, b)| b);
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| ApiError::bad_request(api, format!("field `{field}` is not base64: {e}")))
}

/// A JSON body with the ControlNet fields `controlnet` and `control_scale`.
pub trait ControlFields {
    fn controlnet(&self) -> Option<&str>;
    fn control_scale(&self) -> Option<f32>;
}

/// [`control_job`] for a body's fields and the control image it carried.
pub fn request_control(
    store: &Store,
    api: Api,
    body: &impl ControlFields,
    control_image: Option<&[u8]>,
) -> Result<Option<crate::generation::ControlJob>, ApiError> {
    let (net, scale) = (body.controlnet(), body.control_scale());
    control_job(store, api, net, control_image, scale)
}

/// [`request_control`] off the async threads (it decodes the control image).
pub async fn decode_control(
    state: &AppState,
    api: Api,
    body: &impl ControlFields,
    control_image: Option<Vec<u8>>,
) -> Result<Option<crate::generation::ControlJob>, ApiError> {
    let (net, scale) = (body.controlnet().map(str::to_string), body.control_scale());
    let store = state.store.clone();
    decoding(api, control_image.is_some(), move || {
        control_job(&store, api, net.as_deref(), control_image.as_deref(), scale)
    })
    .await
}

/// A request's ControlNet fields: `controlnet` (a stored name), `control_image` (its bytes) and
/// `control_scale`, checked as `--controlnet/--control/--control-scale` are and the image decoded.
pub fn control_job(
    store: &Store,
    api: Api,
    controlnet: Option<&str>,
    control_image: Option<&[u8]>,
    scale: Option<f32>,
) -> Result<Option<crate::generation::ControlJob>, ApiError> {
    let bad = |m: String| ApiError::bad_request(api, m);
    let (controlnet, bytes) = match (controlnet, control_image) {
        (None, None) if scale.is_some() => {
            return Err(bad("control_scale needs `controlnet` and `control_image`".into()))
        }
        (None, None) => return Ok(None),
        (None, Some(_)) => {
            return Err(bad(
                "control_image needs `controlnet`: a control image steers a ControlNet (the name of one in the store)".into(),
            )
            .with_param("controlnet"))
        }
        (Some(_), None) => {
            return Err(bad(
                "controlnet needs `control_image`: the image (pose, edges, depth) it follows".into(),
            )
            .with_param("control_image"))
        }
        (Some(n), Some(b)) => (n, b),
    };
    let name = crate::store::ModelName::parse(controlnet)
        .map_err(|e| bad(format!("controlnet: {e}")).with_param("controlnet"))?;
    let scale = scale.unwrap_or(crate::generation::DEFAULT_CONTROL_SCALE);
    if let Some(e) = crate::generation::control_scale_error(scale) {
        return Err(bad(e.replace("--control-scale", "control_scale")).with_param("control_scale"));
    }
    let image = crate::image_in::decode(bytes, "field", "control_image")
        .map_err(|e| bad(e.to_string()).with_param("control_image"))?;
    Ok(Some(crate::generation::ControlJob {
        net: crate::generation::ControlNetChoice::Stored {
            store: store.clone(),
            name: name.to_string(),
        },
        image: crate::generation::Picture {
            image,
            label: "field `control_image`".into(),
        },
        scale,
    }))
}

/// A request's input picture and mask (`fields` names them in messages), decoded and checked
/// to be of one size; `mask_of` reads the mask as the API defines it (white repaints, or
/// OpenAI's transparent pixels).
pub fn picture_input(
    api: Api,
    fields: [&str; 2],
    image: &[u8],
    mask: Option<&[u8]>,
    strength: Option<f64>,
    mask_of: fn(&image::DynamicImage) -> image::DynamicImage,
) -> Result<crate::generation::PictureInput, ApiError> {
    let [image_field, mask_field] = fields;
    let bad = |e: crate::image_in::Error| ApiError::bad_request(api, e.to_string());
    let picture = crate::image_in::decode(image, "field", image_field).map_err(bad)?;
    let mask = match mask {
        None => None,
        Some(bytes) => {
            let mask = crate::image_in::decode(bytes, "field", mask_field).map_err(bad)?;
            if (mask.width(), mask.height()) != (picture.width(), picture.height()) {
                return Err(ApiError::bad_request(
                    api,
                    format!(
                        "field `{mask_field}` is {}×{}, but `{image_field}` is {}×{}; give a mask of the picture's size",
                        mask.width(),
                        mask.height(),
                        picture.width(),
                        picture.height()
                    ),
                )
                .with_param("mask"));
            }
            Some(mask_of(&mask))
        }
    };
    Ok(crate::generation::PictureInput {
        picture: crate::generation::Picture {
            image: picture,
            label: format!("field `{image_field}`"),
        },
        mask: mask.map(|image| crate::generation::Picture {
            image,
            label: format!("field `{mask_field}`"),
        }),
        strength,
        only_masked: None,
    })
}

/// A request's `strength`: only with a picture, and within (0, 1] as `--strength` takes it.
pub fn check_strength(api: Api, strength: Option<f64>, has_picture: bool) -> Result<(), ApiError> {
    match strength {
        None => Ok(()),
        Some(_) if !has_picture => Err(ApiError::bad_request(
            api,
            "strength needs a picture to start from: it says how far the picture is taken back toward noise",
        )),
        Some(s) if !crate::number::within(s, crate::number::above(0.0, 1.0)) => Err(ApiError::bad_request(
            api,
            format!("strength is {s}; it must be within (0, 1]"),
        )),
        Some(_) => Ok(()),
    }
}

/// A request that names one model: its JSON body, read within its `MAX_BODY`, and the
/// name, checked; a handler's argument.
pub struct Named<T> {
    pub body: T,
    pub name: crate::store::ModelName,
}

impl<T, S> axum::extract::FromRequest<S> for Named<T>
where
    T: serde::de::DeserializeOwned + NamesModel,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let body: T = read_json(T::API, &parts.headers, body, T::MAX_BODY).await?;
        let name = model_name(T::API, body.model())?;
        Ok(Named { body, name })
    }
}

/// Reads a JSON body of at most `limit` bytes; errors name the field at fault.
pub async fn read_json<T: serde::de::DeserializeOwned>(
    api: Api,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, ApiError> {
    let too_large = || {
        ApiError::new(
            api,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {limit} bytes, the most this server reads"),
        )
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large())?;
    parse_json(api, &bytes)
}

/// A JSON request body parsed into `T`; errors name the field at fault and quote at most a few
/// hundred bytes of what was sent.
pub fn parse_json<T: serde::de::DeserializeOwned>(api: Api, bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            api,
            "the request body is empty; send a JSON object",
        ));
    }
    // serde would take an array for a struct, field by field; the APIs take objects only.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ApiError::bad_request(
            api,
            "the request body is a JSON array; send a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = crate::shown::text(&e.path().to_string());
        let inner = e.into_inner();
        let syntax = inner.is_syntax() || inner.is_eof();
        // serde quotes the value it refuses, whole.
        let inner = crate::shown::message_quoting(&inner.to_string());
        if syntax {
            ApiError::bad_request(api, format!("the request body is not JSON: {inner}"))
        } else if path == "." || path.is_empty() {
            ApiError::bad_request(
                api,
                format!("the request body is not the JSON object this API takes: {inner}"),
            )
        } else {
            ApiError::bad_request(api, format!("field `{path}`: {inner}"))
        }
    })?;
    de.end().map_err(|e| {
        ApiError::bad_request(
            api,
            format!("the request body has data after its JSON: {e}"),
        )
    })?;
    Ok(value)
}

/// A model name from a request, checked as the store checks names.
/// `describe` of every readable model in the store, read off the async threads.
pub async fn each_model<T: Send + 'static>(
    state: &AppState,
    api: Api,
    describe: fn(&Store, &StoredModel) -> T,
) -> Result<Vec<T>, ApiError> {
    let store = state.store.clone();
    tokio::task::spawn_blocking(move || {
        let scan = store.scan().map_err(|e| e.to_string())?;
        Ok(scan.models.iter().map(|m| describe(&store, m)).collect())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_err(|e| ApiError::new(api, StatusCode::INTERNAL_SERVER_ERROR, e))
}

pub fn model_name(api: Api, name: &str) -> Result<crate::store::ModelName, ApiError> {
    if name.is_empty() {
        return Err(ApiError::bad_request(api, "field `model` is required").with_param("model"));
    }
    crate::store::ModelName::parse(name)
        .map_err(|e| ApiError::bad_request(api, e.to_string()).with_param("model"))
}

/// Opens a model for a request, off the async threads (it reads the store).
pub async fn open_model(
    state: &AppState,
    api: Api,
    name: &crate::store::ModelName,
    must_generate: bool,
) -> Result<crate::store::StoredModel, ApiError> {
    let store = state.store.clone();
    let full = name.to_string();
    let opened = tokio::task::spawn_blocking(move || {
        let model = store.open(&full).map_err(crate::generation::open_error)?;
        if must_generate {
            crate::generation::check_image_model(&store, &model)?;
        }
        Ok::<_, crate::generation::Error>(model)
    })
    .await
    .map_err(|e| ApiError::new(api, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    opened.map_err(|e| job_error(api, e.into()))
}

/// The family of `name` in this server's store (`None`: not there, or no image model): what
/// a request's pictures mean depends on it.
pub fn family(state: &AppState, name: &crate::store::ModelName) -> Option<crate::families::Family> {
    let model = state.store.open(&name.to_string()).ok()?;
    let index = state.store.config_file(&model, "model_index.json").ok()??;
    crate::families::Family::from_model_index(&index).ok()
}

/// Whether requests to the stored model `name` may use `feature` (false when it cannot be
/// read: the job then fails where it is run, naming why).
pub fn model_takes(
    state: &AppState,
    name: &crate::store::ModelName,
    feature: crate::families::Feature,
) -> bool {
    let Some(f) = family(state, name) else {
        return false;
    };
    let Ok(model) = state.store.open(&name.to_string()) else {
        return false;
    };
    f.model_takes(
        &crate::loader::StoreSource::new(&state.store, &model),
        feature,
    )
}

/// Refuses, before it is queued, a job that uses an option the family of `name` does not
/// take, naming it, or names a side that is not a multiple of the model's own token cell.
pub fn check_family(
    state: &AppState,
    api: Api,
    name: &crate::store::ModelName,
    job: &crate::generation::Job,
) -> Result<(), ApiError> {
    let Some(f) = family(state, name) else {
        return Ok(());
    };
    f.refuse(&job.features())
        .map_err(|e| ApiError::bad_request(api, e))?;
    let Ok(model) = state.store.open(&name.to_string()) else {
        return Ok(());
    };
    let source = crate::loader::StoreSource::new(&state.store, &model);
    f.refuse_for(&source, &job.features())
        .map_err(|e| ApiError::bad_request(api, e))?;
    // The sides a job names, against the model's own token cell.
    let Ok(cell) = f.cell(&source) else {
        return Ok(());
    };
    let sides = (job.width.unwrap_or(cell), job.height.unwrap_or(cell));
    match crate::pipeline::request_range_error_in(1, 0.0, sides, cell) {
        Some(e) => Err(ApiError::bad_request(api, e)),
        None => Ok(()),
    }
}

/// Reference pictures as a request carries them (`field` `[k]`, bytes), decoded under the
/// input limits.
pub fn decode_references(
    api: Api,
    field: &str,
    pictures: &[Vec<u8>],
) -> Result<Vec<crate::generation::Picture>, ApiError> {
    (pictures.iter().enumerate())
        .map(|(k, bytes)| {
            let name = format!("{field}[{k}]");
            let image = crate::image_in::decode(bytes, &format!("field `{field}`"), &name)
                .map_err(|e| ApiError::bad_request(api, e.to_string()))?;
            Ok(crate::generation::Picture {
                image,
                label: format!("field `{name}`"),
            })
        })
        .collect()
}

/// `name` in this server's store, as a job's model.
pub fn stored(state: &AppState, name: &crate::store::ModelName) -> crate::generation::ModelChoice {
    crate::generation::ModelChoice::Stored {
        store: state.store.clone(),
        name: name.to_string(),
    }
}

/// `$job` with the size, steps and guidance that `$body` names: a request body with fields of
/// those names, as Ollama's generate and the page's form have them. A macro, since the bodies
/// are different types (the page's refuses unknown fields, so they cannot share a flattened
/// struct).
macro_rules! with_request_numbers {
    ($job:expr, $body:expr) => {
        crate::generation::Job {
            width: $body.width,
            height: $body.height,
            // A count beyond usize is out of range all the same.
            steps: $body
                .steps
                .map(|s| usize::try_from(s).unwrap_or(usize::MAX)),
            guidance: $body.guidance,
            cfg_normalization: $body.cfg_normalization,
            cfg_truncation: $body.cfg_truncation,
            true_cfg: $body.true_cfg,
            ..$job
        }
    };
}
pub(crate) use with_request_numbers;

/// A job's checks as an answer: the command line's flags named as the API's fields.
pub fn check_job(api: Api, job: &crate::generation::Job) -> Result<(), ApiError> {
    job.check().map_err(|e| job_error(api, e.into()))
}

/// A worker's error as an answer.
pub fn job_error(api: Api, e: worker::JobError) -> ApiError {
    let status = match e.kind {
        worker::JobErrorKind::BadRequest => StatusCode::BAD_REQUEST,
        worker::JobErrorKind::NotFound => StatusCode::NOT_FOUND,
        // Nobody reads this answer: the client has gone.
        worker::JobErrorKind::Stopped => {
            StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST)
        }
        worker::JobErrorKind::Interrupted => StatusCode::CONFLICT,
        worker::JobErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        worker::JobErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(api, status, e.message)
}

/// The answer when the queue is full.
/// Queues the job `make` builds around a fresh cancel flag and event channel; returns the
/// guard that cancels it if the client goes, and the job's events.
pub fn queue(
    state: &AppState,
    api: Api,
    make: impl FnOnce(Arc<worker::Cancel>, UnboundedSender<worker::Event>) -> worker::Job,
) -> Result<(worker::CancelGuard, UnboundedReceiver<worker::Event>), ApiError> {
    let (guard, cancel) = worker::CancelGuard::new();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    state
        .worker
        .submit(make(cancel, tx))
        .map_err(|f| queue_full(api, f))?;
    Ok((guard, rx))
}

pub fn queue_full(api: Api, full: worker::QueueFull) -> ApiError {
    if full.draining {
        return ApiError::new(
            api,
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is stopping and takes no new request; send it again (another replica takes it)",
        )
        .with_retry_after(RETRY_AFTER_SECONDS);
    }
    ApiError::new(
        api,
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the server is busy: {} requests are waiting already; try again later (the queue's length is ZIMAGE_MAX_QUEUE)",
            full.capacity
        ),
    )
    .with_retry_after(RETRY_AFTER_SECONDS)
}

/// A seed for a request that gives none: different for every request.
pub fn random_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // splitmix64, so that neighbouring requests get unrelated seeds.
    let mut z = nanos ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Every route, with authentication and the request log around them.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(root))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(metrics::page))
        .route("/api/version", get(ollama::version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/delete", delete(ollama::delete))
        .route("/api/generate", post(ollama::generate))
        .route("/api/pull", post(pull::pull))
        .route("/v1/models", get(openai::models))
        .route("/v1/images/generations", post(openai::generate))
        .route("/v1/images/files/{file}", get(openai::hosted_file))
        .route(
            "/v1/images/edits",
            post(openai::edit).layer(axum::extract::DefaultBodyLimit::max(MAX_PICTURE_BODY_BYTES)),
        )
        .route("/sdapi/v1/txt2img", post(a1111::txt2img))
        .route("/sdapi/v1/img2img", post(a1111::img2img))
        .route("/sdapi/v1/sd-models", get(a1111::sd_models))
        .route(
            "/sdapi/v1/options",
            get(a1111::get_options).post(a1111::set_options),
        )
        .route("/sdapi/v1/samplers", get(a1111::samplers))
        .route("/sdapi/v1/schedulers", get(a1111::schedulers))
        .route("/sdapi/v1/upscalers", get(a1111::upscalers))
        .route("/sdapi/v1/sd-vae", get(a1111::sd_vae))
        .route("/sdapi/v1/prompt-styles", get(a1111::none))
        .route("/sdapi/v1/hypernetworks", get(a1111::none))
        .route("/sdapi/v1/face-restorers", get(a1111::none))
        .route("/sdapi/v1/latent-upscale-modes", get(a1111::none))
        .route("/sdapi/v1/embeddings", get(a1111::embeddings))
        .route("/sdapi/v1/loras", get(a1111::loras))
        .route("/sdapi/v1/scripts", get(a1111::scripts))
        .route("/sdapi/v1/progress", get(a1111::progress))
        .route("/sdapi/v1/interrupt", post(a1111::interrupt))
        .route("/sdapi/v1/skip", post(a1111::skip))
        .route(
            "/sdapi/v1/refresh-checkpoints",
            post(a1111::refresh_checkpoints),
        )
        .route("/controlnet/version", get(a1111::controlnet_version))
        .route("/controlnet/model_list", get(a1111::controlnet_models))
        .route("/controlnet/module_list", get(a1111::controlnet_modules))
        .merge(ui::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            refuse_other_sites,
        ))
        .layer(axum::middleware::from_fn(log_request))
        .with_state(state)
}

/// `/`: API clients and monitors get a plain answer; a browser is sent to the page.
async fn root(headers: HeaderMap) -> Response {
    if ui::wants_page(&headers) {
        return axum::response::Redirect::to("/ui").into_response();
    }
    "zimage is running".into_response()
}

async fn not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        Api::of_path(uri.path()),
        StatusCode::NOT_FOUND,
        format!("no route {method} {}", uri.path().escape_debug()),
    )
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        Api::of_path(uri.path()),
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {method}", uri.path().escape_debug()),
    )
}

/// Checks `Authorization: Bearer <key>` when the server has a key. `/` stays open, so that
/// clients and monitors can see the server is up, and so do the probes (a kubelet sends no
/// key) and the page (not its API), which asks for the key.
async fn authenticate(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(key) = &state.api_key else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/" || ui::is_public(path) || probes::is_probe(path) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
        return next.run(req).await;
    }
    ApiError::new(
        Api::of_path(req.uri().path()),
        StatusCode::UNAUTHORIZED,
        "this server needs an API key: send `Authorization: Bearer <key>` with the key it was started with (--api-key or ZIMAGE_API_KEY)",
    )
    .into_response()
}

/// On a server without an API key (one on loopback), refuses what a web page of another site
/// sends: a request naming a host that is not this machine (DNS rebinding), a browser's
/// request from an origin that is not allowed ([`origin`]), and one that changes state (any
/// method but GET, HEAD and OPTIONS, on every route) that a browser says comes from another
/// site without naming its origin. A key keeps such pages out already.
async fn refuse_other_sites(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    if state.api_key.is_some() || probes::is_probe(req.uri().path()) {
        return next.run(req).await;
    }
    if let Some(refusal) = other_site(&req) {
        return refusal.into_response();
    }
    next.run(req).await
}

/// The refusal of a request from another site ([`refuse_other_sites`]), if it is one.
fn other_site(req: &Request) -> Option<ApiError> {
    let api = Api::of_path(req.uri().path());
    let (host, o) = match origin::host_and_origin(req.headers()) {
        Ok(headers) => headers,
        Err(e) => return Some(ApiError::bad_request(api, e)),
    };
    if let Some(h) = host.filter(|h| !origin::host_allowed(h, origin::machine_name())) {
        let message = format!(
            "requests for host `{}` are refused: this server answers requests for this machine (localhost or an address); give it --api-key to serve other names",
            crate::shown::text(h)
        );
        return Some(ApiError::new(api, StatusCode::FORBIDDEN, message));
    }
    let Some(o) = o else {
        // A browser sends no `Origin` with some requests of another site's page (a form, an
        // `<img>`), but says where it comes from: such a request may read, never change.
        if origin::from_another_site(req.headers()) && !origin::is_safe_method(req.method()) {
            let message = format!(
                "a page of another site may not {} {} on this server (the browser says `Sec-Fetch-Site: cross-site` and names no origin); send it from a client that is no browser, or from an origin listed in ZIMAGE_ORIGINS",
                req.method(),
                req.uri().path().escape_debug()
            );
            return Some(ApiError::new(api, StatusCode::FORBIDDEN, message));
        }
        return None;
    };
    if origin::origin_allowed(o, host, origin::extra_origins()) {
        return None;
    }
    let message = format!(
        "requests from web pages of `{}` are refused; list the origin in ZIMAGE_ORIGINS (or OLLAMA_ORIGINS) to allow it",
        crate::shown::text(o)
    );
    Some(ApiError::new(api, StatusCode::FORBIDDEN, message))
}

/// Compares two secrets in time that depends only on their lengths.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// One line per request: method, path, model, status and duration (to the answer's headers;
/// a streamed answer goes on after).
async fn log_request(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().escape_debug().to_string();
    let response = next.run(req).await;
    let model = response
        .extensions()
        .get::<LoggedModel>()
        .map_or("-".to_string(), |m| m.0.clone());
    eprintln!(
        "{method} {path} {model} {} {:.1} ms",
        response.status().as_u16(),
        start.elapsed().as_secs_f64() * 1e3
    );
    response
}

/// Attaches the model's name to an answer, for the log.
pub fn with_model(mut response: Response, model: &str) -> Response {
    response
        .extensions_mut()
        .insert(LoggedModel(model.escape_debug().to_string()));
    response
}

/// Serves until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<AppState>) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_read_as_ollama_reads_them() {
        let p = |s: &str| parse_host(s).unwrap();
        assert_eq!(p(""), ("127.0.0.1".into(), 11434));
        assert_eq!(p(":8080"), ("127.0.0.1".into(), 8080));
        assert_eq!(p("0.0.0.0"), ("0.0.0.0".into(), 11434));
        assert_eq!(p("http://example.com"), ("example.com".into(), 80));
        assert_eq!(p("https://example.com:9/x"), ("example.com".into(), 9));
        assert_eq!(p("[::1]:5000"), ("::1".into(), 5000));
        assert!(parse_host("host:99999").is_err());
        assert!(parse_host("ftp://x").is_err());
    }

    #[test]
    fn keep_alive_takes_seconds_and_go_durations() {
        let k = |v: serde_json::Value| parse_keep_alive(&v).unwrap();
        assert_eq!(k(serde_json::json!(0)), KeepAlive::For(Duration::ZERO));
        assert_eq!(
            k(serde_json::json!("5m")),
            KeepAlive::For(Duration::from_secs(300))
        );
        assert_eq!(
            k(serde_json::json!("1h30m")),
            KeepAlive::For(Duration::from_secs(5400))
        );
        assert_eq!(k(serde_json::json!(-1)), KeepAlive::Forever);
        assert_eq!(k(serde_json::json!("-1m")), KeepAlive::Forever);
        assert!(parse_keep_alive(&serde_json::json!("5 parsecs")).is_err());
        assert!(parse_keep_alive(&serde_json::json!([1])).is_err());
    }

    #[test]
    fn times_are_rfc3339() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.000000000Z");
        assert_eq!(compact_time(t), "20231114221320");
    }
}
