//! OpenAI's image API as the `openai` client sends it: `POST /v1/images/generations` answered
//! with base64 PNGs (there is no file host for `url`), and `GET /v1/models`.

use super::errors::{Api, ApiError};
use super::ollama::{check_ranges, display_name, wait_done};
use super::worker::{Job, Spec};
use super::{open_model, unix_seconds, with_model, AppState, MAX_IMAGES_PER_REQUEST};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::SystemTime;

const API: Api = Api::OpenAi;

/// `GET /v1/models`: the store's image models.
pub async fn models(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let data = super::each_model(&state, API, |_, m| {
        json!({
            "id": display_name(&m.name),
            "object": "model",
            "created": unix_seconds(m.modified),
            "owned_by": m.name.namespace,
        })
    })
    .await?;
    Ok(Json(json!({ "object": "list", "data": data })))
}

#[derive(Deserialize)]
pub struct ImagesBody {
    #[serde(default)]
    model: String,
    #[serde(default)]
    prompt: String,
    n: Option<u64>,
    size: Option<String>,
    response_format: Option<String>,
    seed: Option<i64>,
    steps: Option<u64>,
    negative_prompt: Option<String>,
    guidance: Option<f32>,
    loras: Option<Vec<super::LoraBody>>,
}

/// `"WxH"`, or `"auto"` (the model's default) as OpenAI's size.
fn parse_size(size: &str) -> Result<(Option<u32>, Option<u32>), ApiError> {
    if size == "auto" {
        return Ok((None, None));
    }
    let bad = || {
        ApiError::bad_request(
            API,
            format!(
                "size `{}` is not WIDTHxHEIGHT (e.g. \"1024x1024\")",
                size.escape_debug()
                    .to_string()
                    .chars()
                    .take(40)
                    .collect::<String>()
            ),
        )
        .with_param("size")
    };
    let (w, h) = size.split_once(['x', 'X']).ok_or_else(bad)?;
    let side = |s: &str| s.trim().parse::<u32>().map_err(|_| bad());
    Ok((Some(side(w)?), Some(side(h)?)))
}

/// `POST /v1/images/generations`.
pub async fn generate(
    State(state): State<Arc<AppState>>,
    super::Named { body, name }: super::Named<ImagesBody>,
) -> Result<Response, ApiError> {
    if body.prompt.is_empty() {
        return Err(ApiError::bad_request(API, "field `prompt` is required").with_param("prompt"));
    }
    match body.response_format.as_deref() {
        None | Some("b64_json") => {}
        Some("url") => {
            return Err(ApiError::bad_request(
                API,
                "response_format `url` is not offered: this server hosts no files; ask for \"b64_json\"",
            )
            .with_param("response_format"))
        }
        Some(other) => {
            return Err(ApiError::bad_request(
                API,
                format!("response_format `{}` is not \"b64_json\"", other.escape_debug()),
            )
            .with_param("response_format"))
        }
    }
    let n = body.n.unwrap_or(1);
    if !(1..=MAX_IMAGES_PER_REQUEST).contains(&n) {
        return Err(ApiError::bad_request(
            API,
            format!("n is {n}; it must be within 1..={MAX_IMAGES_PER_REQUEST}"),
        )
        .with_param("n"));
    }
    let (width, height) = match body.size.as_deref() {
        Some(s) => parse_size(s)?,
        None => (None, None),
    };
    let steps = body
        .steps
        .unwrap_or(crate::generation::DEFAULT_STEPS as u64);
    let guidance = body.guidance.unwrap_or(0.0);
    check_ranges(API, steps, guidance, width, height)?;
    let loras = super::request_loras(&state, API, body.loras.as_deref())?;
    open_model(&state, API, &name, true).await?;
    let seed = match body.seed {
        Some(s) if s >= 0 => s as u64,
        _ => super::random_seed(),
    };
    let specs = (0..n)
        .map(|i| Spec {
            prompt: body.prompt.clone(),
            negative_prompt: body.negative_prompt.clone(),
            width,
            height,
            steps: steps as usize,
            guidance,
            // Each image of a request gets the next seed, so any one can be made again alone.
            seed: seed.wrapping_add(i),
            input: None,
        })
        .collect();
    let label = format!("POST /v1/images/generations {}", body.model.escape_debug());
    let (mut guard, mut rx) = super::queue(&state, API, |cancel, events| Job {
        model: name,
        specs,
        loras,
        keep_alive: None,
        cancel,
        events,
        label,
    })?;
    let finished = wait_done(&mut rx)
        .await
        .map_err(|e| super::job_error(API, e))?;
    guard.finish();
    let data: Vec<Value> = finished
        .images
        .iter()
        .map(|image| {
            json!({
                "b64_json": base64::engine::general_purpose::STANDARD.encode(&image.png),
                "revised_prompt": body.prompt,
            })
        })
        .collect();
    let answer = json!({ "created": unix_seconds(SystemTime::now()), "data": data });
    Ok(with_model(Json(answer).into_response(), &body.model))
}

impl super::NamesModel for ImagesBody {
    const API: Api = API;

    fn model(&self) -> &str {
        &self.model
    }
}
