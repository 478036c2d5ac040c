//! The store's image models as A1111's checkpoints, the options that pick the current one,
//! and the listings clients read before they generate.

use super::request::Body1111;
use super::{bad, API, SAMPLER, SCHEDULER};
use crate::server::current::{current_model, image_models};
use crate::server::errors::ApiError;
use crate::server::AppState;
use crate::store::{ModelName, StoredModel};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The store's image models, each with its A1111 title.
struct Checkpoint {
    model: StoredModel,
    identity: String,
}

impl Checkpoint {
    fn hash(&self) -> &str {
        self.identity.get(..10).unwrap_or(&self.identity)
    }

    fn title(&self) -> String {
        format!("{} [{}]", self.model.name.short(), self.hash())
    }

    /// Whether a client's name for a checkpoint (its title, name, hash, or A1111's
    /// `name.safetensors [hash]`) means this one.
    fn answers_to(&self, text: &str) -> bool {
        let short = self.model.name.short();
        let bare = text.split(" [").next().unwrap_or(text);
        let bare = bare.strip_suffix(".safetensors").unwrap_or(bare);
        text == self.title()
            || bare == short
            || bare == self.model.name.to_string()
            || bare == crate::server::ollama::display_name(&self.model.name)
            || text == self.hash()
            || text == self.identity
    }

    fn listed(&self) -> Value {
        json!({
            "title": self.title(),
            "model_name": self.model.name.short(),
            "hash": self.hash(),
            "sha256": self.identity,
            "filename": self.model.name.manifest_path(),
            "config": null,
        })
    }
}

async fn checkpoints(state: &AppState) -> Result<Vec<Checkpoint>, ApiError> {
    Ok(image_models(state, API)
        .await?
        .into_iter()
        .map(|model| Checkpoint {
            identity: model.manifest.model_identity(),
            model,
        })
        .collect())
}

/// The stored model a client's checkpoint name means, or a 404 listing the ones there are.
async fn find_checkpoint(state: &AppState, text: &str) -> Result<ModelName, ApiError> {
    let all = checkpoints(state).await?;
    if let Some(c) = all.iter().find(|c| c.answers_to(text)) {
        return Ok(c.model.name.clone());
    }
    let titles: Vec<String> = all.iter().map(Checkpoint::title).collect();
    Err(ApiError::new(
        API,
        StatusCode::NOT_FOUND,
        format!(
            "checkpoint `{}` is not in the store; the checkpoints are: {} (GET /sdapi/v1/sd-models lists them)",
            text.escape_debug(),
            if titles.is_empty() { "none".to_string() } else { titles.join(", ") }
        ),
    ))
}

/// The options this server reports: what it is, so a client posting them back changes nothing.
async fn options_now(state: &AppState) -> Result<Map<String, Value>, ApiError> {
    let current = match current_model(state, API).await {
        Ok(name) => Some(name),
        Err(e) if e.status == StatusCode::NOT_FOUND => None,
        Err(e) => return Err(e),
    };
    let chosen = match current {
        Some(name) => checkpoints(state)
            .await?
            .into_iter()
            .find(|c| c.model.name == name),
        None => None,
    };
    let mut options = Map::new();
    options.insert(
        "sd_model_checkpoint".into(),
        json!(chosen.as_ref().map(Checkpoint::title)),
    );
    options.insert(
        "sd_checkpoint_hash".into(),
        json!(chosen.as_ref().map(|c| c.identity.clone())),
    );
    options.insert("sd_vae".into(), json!("Automatic"));
    // The text encoder's layer is the model's own: A1111's 1.
    options.insert("CLIP_stop_at_last_layers".into(), json!(1));
    options.insert("samples_format".into(), json!("png"));
    options.insert("eta_noise_seed_delta".into(), json!(0));
    options.insert("sd_checkpoints_limit".into(), json!(1));
    Ok(options)
}

/// A1111 settings that clients send with every request and that change no pixel of zimage's
/// images: where and whether files are saved, what the UI shows.
const UNSEEN_SETTINGS: [&str; 9] = [
    "samples_save",
    "save_images_add_number",
    "grid_save",
    "return_grid",
    "enable_pnginfo",
    "live_previews_enable",
    "show_progressbar",
    "sd_vae_overrides_per_model_preferences",
    "do_not_show_images",
];

/// Whether an override changes nothing here: an empty value (clients send `""`, `[]` or null
/// for "the default"), the checkpoint's own VAE (`None`, `Automatic`), or a setting of
/// [`UNSEEN_SETTINGS`].
fn changes_no_pixel(key: &str, value: &Value) -> bool {
    let empty = match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    let own_vae = key == "sd_vae" && matches!(value.as_str(), Some("None" | "Automatic"));
    empty || own_vae || UNSEEN_SETTINGS.contains(&key)
}

/// The model a generation runs on: `override_settings.sd_model_checkpoint`, else the current
/// one. Other overrides must equal what the server reports.
pub(super) async fn request_model(state: &AppState, b: &Body1111) -> Result<ModelName, ApiError> {
    let overrides = b.override_settings.clone().unwrap_or_default();
    let mut named = None;
    let mut reported = None;
    for (key, value) in &overrides {
        if key == "sd_model_checkpoint" {
            let text = value.as_str().ok_or_else(|| {
                bad("override_settings.sd_model_checkpoint must be a checkpoint's title")
            })?;
            named = Some(find_checkpoint(state, text).await?);
            continue;
        }
        if reported.is_none() {
            reported = Some(options_now(state).await?);
        }
        if changes_no_pixel(key, value) {
            continue;
        }
        if reported.as_ref().and_then(|r| r.get(key)) != Some(value) {
            return Err(bad(format!(
                "override_settings.{}: zimage has no such setting to change (GET /sdapi/v1/options shows the ones it has)",
                key.escape_debug()
            )));
        }
    }
    match named {
        Some(name) => Ok(name),
        None => current_model(state, API).await,
    }
}

/// `GET /sdapi/v1/sd-models`: the store's image models.
pub async fn sd_models(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let all = checkpoints(&state).await?;
    Ok(Json(Value::Array(
        all.iter().map(Checkpoint::listed).collect(),
    )))
}

/// `GET /sdapi/v1/options`.
pub async fn get_options(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    Ok(Json(Value::Object(options_now(&state).await?)))
}

/// `POST /sdapi/v1/options`: clients post back the whole dict with `sd_model_checkpoint`
/// changed; that switches the current model, and the other keys change nothing.
pub async fn set_options(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let options: Map<String, Value> =
        crate::server::read_json(API, &headers, body, crate::server::MAX_BODY_BYTES).await?;
    match options.get("sd_model_checkpoint") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => {
            let name = find_checkpoint(&state, text).await?;
            state.choose_model(name);
        }
        Some(other) => {
            return Err(bad(format!(
                "field `sd_model_checkpoint` is {other}; give a checkpoint's title from GET /sdapi/v1/sd-models"
            )))
        }
    }
    Ok(Json(Value::Null))
}

pub async fn samplers() -> Json<Value> {
    Json(json!([{ "name": SAMPLER, "aliases": ["k_euler"], "options": {} }]))
}

pub async fn schedulers() -> Json<Value> {
    Json(json!([{
        "name": SCHEDULER,
        "label": "Automatic",
        "aliases": null,
        "default_rho": -1,
        "need_inner_model": false,
    }]))
}

/// The hires pass resizes with Lanczos; A1111's `None` resizes with Lanczos too.
pub async fn upscalers() -> Json<Value> {
    let entry = |name: &str| json!({ "name": name, "model_name": null, "model_path": null, "model_url": null, "scale": 4 });
    Json(json!([entry("None"), entry("Lanczos")]))
}

pub async fn sd_vae() -> Json<Value> {
    Json(json!([]))
}

/// The listings of what zimage does not have (styles, embeddings, face restorers, …): empty.
pub async fn none() -> Json<Value> {
    Json(json!([]))
}

pub async fn embeddings() -> Json<Value> {
    Json(json!({ "loaded": {}, "skipped": {} }))
}

/// `GET /sdapi/v1/scripts`: none (clients check it for extensions).
pub async fn scripts() -> Json<Value> {
    Json(json!({ "txt2img": [], "img2img": [] }))
}

/// `GET /sdapi/v1/loras`: the LoRA files in `--lora-dir`, named as `<lora:NAME:SCALE>` takes them.
pub async fn loras(State(state): State<Arc<AppState>>) -> Json<Value> {
    let Some(dir) = state.lora_dir.clone() else {
        return Json(json!([]));
    };
    let listed = tokio::task::spawn_blocking(move || {
        let mut found: Vec<Value> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "safetensors"))
            .filter_map(|p| {
                let name = p.file_stem()?.to_str()?.to_string();
                Some(json!({ "name": name, "alias": name, "path": p, "metadata": {} }))
            })
            .collect();
        found.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        found
    })
    .await
    .unwrap_or_default();
    Json(Value::Array(listed))
}

/// `POST /sdapi/v1/refresh-checkpoints`: the store is read on every listing already.
pub async fn refresh_checkpoints() -> Json<Value> {
    Json(Value::Null)
}
