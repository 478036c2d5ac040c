//! AUTOMATIC1111's web UI API (`/sdapi/v1/`), as its clients (the `webuiapi` package, Open
//! WebUI, SillyTavern) call it: `txt2img` and `img2img` parsed into one generation job, the
//! listings clients read before they generate, the options that pick the model, and the
//! progress, interrupt and skip routes over the worker's running job.
//!
//! A field zimage cannot honour is refused with a 400 that names it, unless its value is the
//! one that changes nothing (clients send every field, most at its neutral value).

use super::current::{current_model, image_models};
use super::errors::{Api, ApiError};
use super::worker::{Event, Job};
use super::{with_model, AppState};
use crate::generation::{self, Hires, Picture, PictureInput};
use crate::store::{ModelName, StoredModel};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::SystemTime;

const API: Api = Api::A1111;

/// The one sampler zimage has: the flow-matching Euler step of Z-Image's scheduler.
const SAMPLER: &str = "Euler";
/// The one schedule: flow matching with the model's shift, which A1111 clients call automatic.
const SCHEDULER: &str = "automatic";
/// A1111's img2img strength when a request gives none.
const DEFAULT_DENOISING: f64 = 0.75;
/// The widest mask blur taken, in pixels (A1111's slider stops at 64).
const MAX_MASK_BLUR: f32 = 64.0;

/// A txt2img or img2img body: the fields that map, and those that must be neutral. Other
/// fields are ignored, as A1111 ignores fields its model does not have.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Body1111 {
    prompt: Option<String>,
    negative_prompt: Option<String>,
    styles: Option<Vec<String>>,
    seed: Option<i64>,
    subseed: Option<i64>,
    subseed_strength: Option<f64>,
    seed_resize_from_h: Option<i64>,
    seed_resize_from_w: Option<i64>,
    sampler_name: Option<String>,
    sampler_index: Option<String>,
    scheduler: Option<String>,
    batch_size: Option<u64>,
    n_iter: Option<u64>,
    steps: Option<u64>,
    cfg_scale: Option<f32>,
    width: Option<u32>,
    height: Option<u32>,
    restore_faces: Option<bool>,
    tiling: Option<bool>,
    s_churn: Option<f64>,
    override_settings: Option<Map<String, Value>>,
    script_name: Option<String>,
    alwayson_scripts: Option<Map<String, Value>>,
    enable_hr: Option<bool>,
    hr_scale: Option<f32>,
    hr_upscaler: Option<String>,
    hr_second_pass_steps: Option<u64>,
    hr_resize_x: Option<u32>,
    hr_resize_y: Option<u32>,
    hr_checkpoint_name: Option<String>,
    hr_sampler_name: Option<String>,
    hr_scheduler: Option<String>,
    hr_prompt: Option<String>,
    hr_negative_prompt: Option<String>,
    firstphase_width: Option<u32>,
    firstphase_height: Option<u32>,
    denoising_strength: Option<f64>,
    init_images: Option<Vec<String>>,
    resize_mode: Option<i64>,
    mask: Option<String>,
    mask_blur: Option<f32>,
    inpainting_fill: Option<i64>,
    inpaint_full_res: Option<Value>,
    inpainting_mask_invert: Option<Value>,
    initial_noise_multiplier: Option<f64>,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(API, message)
}

/// A 0/1 or boolean field, as A1111's clients send either.
fn flag(field: &str, v: &Option<Value>) -> Result<bool, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::Number(n)) if n.as_i64() == Some(0) => Ok(false),
        Some(Value::Number(n)) if n.as_i64() == Some(1) => Ok(true),
        Some(other) => Err(bad(format!(
            "field `{field}` is {other}; give 0 or 1 (or false or true)"
        ))),
    }
}

/// An unset or empty text.
fn unset(v: &Option<String>) -> bool {
    v.as_deref().is_none_or(|s| s.is_empty())
}

/// The sampler a request names, checked: zimage has flow-matching Euler alone.
fn check_sampler(field: &str, name: &Option<String>) -> Result<(), ApiError> {
    match name.as_deref() {
        None | Some("") => Ok(()),
        Some(s) if s.eq_ignore_ascii_case(SAMPLER) || s == "k_euler" => Ok(()),
        Some(s) => Err(bad(format!(
            "{field} `{}`: zimage has one sampler, `{SAMPLER}` (Z-Image's flow-matching Euler step); send `{SAMPLER}`",
            s.escape_debug()
        ))),
    }
}

fn check_scheduler(field: &str, name: &Option<String>) -> Result<(), ApiError> {
    match name.as_deref() {
        None | Some("") => Ok(()),
        Some(s) if s.eq_ignore_ascii_case(SCHEDULER) => Ok(()),
        Some(s) => Err(bad(format!(
            "{field} `{}`: zimage has one schedule, flow matching with the model's shift, listed as `Automatic`; send `Automatic`",
            s.escape_debug()
        ))),
    }
}

/// The fields zimage has no counterpart for, each checked to be at its neutral value.
fn check_neutral(b: &Body1111) -> Result<(), ApiError> {
    let refuse = |field: &str, why: &str| Err(bad(format!("field `{field}`: {why}")));
    if b.styles.as_ref().is_some_and(|s| !s.is_empty()) {
        return refuse(
            "styles",
            "zimage has no saved styles; put the style's words in the prompt",
        );
    }
    if b.subseed_strength.is_some_and(|s| s != 0.0) {
        return refuse(
            "subseed_strength",
            "zimage has no variation seeds; leave it 0",
        );
    }
    if b.seed_resize_from_h.is_some_and(|v| v > 0) || b.seed_resize_from_w.is_some_and(|v| v > 0) {
        return refuse(
            "seed_resize_from_w/h",
            "zimage draws the noise at the image's own size; leave them 0 or -1",
        );
    }
    if b.restore_faces == Some(true) {
        return refuse(
            "restore_faces",
            "zimage has no face restoration; send false",
        );
    }
    if b.tiling == Some(true) {
        return refuse("tiling", "zimage makes no tileable images; send false");
    }
    if b.s_churn.is_some_and(|v| v != 0.0) {
        return refuse("s_churn", "zimage's Euler step adds no noise; leave it 0");
    }
    if !unset(&b.script_name) {
        return refuse(
            "script_name",
            "zimage runs no A1111 scripts; leave it empty",
        );
    }
    if let Some((name, _)) = b.alwayson_scripts.iter().flatten().find(|(_, s)| {
        s.get("args").is_some_and(|a| {
            a.as_array()
                .is_none_or(|a| !a.is_empty() && a != &[json!(false)])
        })
    }) {
        return Err(bad(format!(
            "field `alwayson_scripts.{}`: zimage runs no A1111 scripts; leave it out (ControlNet: use Ollama's or OpenAI's API with `controlnet`)",
            name.escape_debug()
        )));
    }
    if b.initial_noise_multiplier.is_some_and(|v| v != 1.0) {
        return refuse(
            "initial_noise_multiplier",
            "zimage draws the noise at its own scale; leave it 1",
        );
    }
    check_sampler("sampler_name", &b.sampler_name)?;
    check_sampler("sampler_index", &b.sampler_index)?;
    check_scheduler("scheduler", &b.scheduler)
}

/// The hires pass of a txt2img body, when `enable_hr` asks for one.
fn hires(b: &Body1111) -> Result<Option<Hires>, ApiError> {
    if b.enable_hr != Some(true) {
        return Ok(None);
    }
    match b.hr_upscaler.as_deref() {
        None | Some("") | Some("Lanczos") | Some("None") => {}
        Some(u) => {
            return Err(bad(format!(
                "hr_upscaler `{}`: zimage upscales the first picture with Lanczos; send `Lanczos`",
                u.escape_debug()
            )))
        }
    }
    if b.hr_resize_x.is_some_and(|v| v > 0) || b.hr_resize_y.is_some_and(|v| v > 0) {
        return Err(bad("hr_resize_x/hr_resize_y: zimage's hires pass takes a scale; give hr_scale and leave them 0"));
    }
    if b.firstphase_width.is_some_and(|v| v > 0) || b.firstphase_height.is_some_and(|v| v > 0) {
        return Err(bad(
            "firstphase_width/firstphase_height: give the first pass's size as width and height",
        ));
    }
    let same = |v: &Option<String>, main: &str| {
        unset(v)
            || v.as_deref()
                .is_some_and(|s| s == main || s.starts_with("Use same"))
    };
    if !same(&b.hr_checkpoint_name, "") {
        return Err(bad(
            "hr_checkpoint_name: the hires pass runs on the same model; leave it out",
        ));
    }
    check_sampler(
        "hr_sampler_name",
        &b.hr_sampler_name
            .clone()
            .filter(|s| !s.starts_with("Use same")),
    )?;
    check_scheduler(
        "hr_scheduler",
        &b.hr_scheduler
            .clone()
            .filter(|s| !s.starts_with("Use same")),
    )?;
    let prompt = b.prompt.as_deref().unwrap_or("");
    let negative = b.negative_prompt.as_deref().unwrap_or("");
    if !same(&b.hr_prompt, prompt) || !same(&b.hr_negative_prompt, negative) {
        return Err(bad("hr_prompt/hr_negative_prompt: the hires pass uses the first pass's prompts; leave them empty"));
    }
    Ok(Some(Hires {
        scale: b.hr_scale.unwrap_or(2.0),
        strength: b.denoising_strength.unwrap_or(Hires::DEFAULT_STRENGTH),
        steps: b
            .hr_second_pass_steps
            .filter(|&s| s > 0)
            .map(|s| usize::try_from(s).unwrap_or(usize::MAX)),
    }))
}

/// A base64 picture field, decoded.
fn decode_picture(field: &str, text: &str) -> Result<Picture, ApiError> {
    let bytes = super::base64_field(API, field, text)?;
    let image = crate::image_in::decode(&bytes, "field", field).map_err(|e| bad(e.to_string()))?;
    Ok(Picture {
        image,
        label: format!("field `{field}`"),
    })
}

/// The mask as A1111 prepares it: inverted when asked, then blurred by `mask_blur` pixels
/// (PIL's Gaussian radius is its standard deviation). zimage binarises the mask at half, so
/// the blur rounds the mask's outline and drops features thinner than the blur; it does not
/// feather the seam as A1111's soft mask does.
fn prepare_mask(mut mask: Picture, invert: bool, blur: f32) -> Picture {
    let mut luma = mask.image.to_luma8();
    if invert {
        image::imageops::invert(&mut luma);
    }
    if blur > 0.0 {
        luma = image::imageops::blur(&luma, blur);
    }
    mask.image = image::DynamicImage::ImageLuma8(luma);
    mask
}

/// img2img's picture, mask and strength.
fn img2img_input(b: &Body1111) -> Result<PictureInput, ApiError> {
    let first = match b.init_images.as_deref() {
        Some([first, ..]) => first,
        _ => {
            return Err(bad(
                "field `init_images` is required: the picture (base64) to start from",
            ))
        }
    };
    let picture = decode_picture("init_images[0]", first)?;
    if b.resize_mode.is_some_and(|m| m != 0) {
        return Err(bad(format!(
            "resize_mode {}: zimage resizes the picture to width×height (resize_mode 0, `Just resize`); send 0",
            b.resize_mode.unwrap_or(0)
        )));
    }
    let strength = b.denoising_strength.unwrap_or(DEFAULT_DENOISING);
    if !(strength > 0.0 && strength <= 1.0) {
        return Err(bad(format!(
            "denoising_strength is {strength}; it must be within (0, 1]"
        )));
    }
    let mask = match b.mask.as_deref().filter(|m| !m.is_empty()) {
        None => None,
        Some(text) => {
            if flag("inpaint_full_res", &b.inpaint_full_res)? {
                return Err(bad(
                    "inpaint_full_res: zimage inpaints the whole picture, not the masked area at full resolution; send false (`Whole picture`)",
                ));
            }
            // With the whole picture taken back to noise, every fill starts the same.
            match b.inpainting_fill {
                None | Some(1) => {}
                Some(0 | 2 | 3) if strength == 1.0 => {}
                Some(f) => {
                    return Err(bad(format!(
                        "inpainting_fill {f}: zimage starts the masked part from the picture itself (1, `original`); send 1, or denoising_strength 1 (then every fill is the same)"
                    )))
                }
            }
            let blur = b.mask_blur.unwrap_or(0.0);
            if !(0.0..=MAX_MASK_BLUR).contains(&blur) {
                return Err(bad(format!(
                    "mask_blur is {blur}; it must be within 0..={MAX_MASK_BLUR} pixels"
                )));
            }
            let invert = flag("inpainting_mask_invert", &b.inpainting_mask_invert)?;
            Some(prepare_mask(decode_picture("mask", text)?, invert, blur))
        }
    };
    Ok(PictureInput {
        picture,
        mask,
        strength: Some(strength),
    })
}

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
            || bare == super::ollama::display_name(&self.model.name)
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

/// The model a generation runs on: `override_settings.sd_model_checkpoint`, else the current
/// one. Other overrides must equal what the server reports.
async fn request_model(state: &AppState, b: &Body1111) -> Result<ModelName, ApiError> {
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
        // Without a VAE file of its own, `None` (the checkpoint's VAE) is `Automatic`.
        let same_vae = key == "sd_vae" && value.as_str() == Some("None");
        if !same_vae && reported.as_ref().and_then(|r| r.get(key)) != Some(value) {
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

/// A body as received (echoed as `parameters`), and as read.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<(Value, Body1111), ApiError> {
    let raw: Value = super::read_json(API, headers, body, super::MAX_PICTURE_BODY_BYTES).await?;
    let parsed = serde_path_to_error::deserialize(raw.clone()).map_err(|e| {
        let path = e.path().to_string();
        bad(format!("field `{path}`: {}", e.into_inner()))
    })?;
    Ok((raw, parsed))
}

/// Whether a request is txt2img or img2img.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Txt2Img,
    Img2Img,
}

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Txt2Img => "/sdapi/v1/txt2img",
            Kind::Img2Img => "/sdapi/v1/img2img",
        }
    }
}

/// A body as a generation job, everything checked that needs no model.
fn job_of(
    state: &AppState,
    b: &Body1111,
    kind: Kind,
    model: &ModelName,
) -> Result<generation::Job, ApiError> {
    check_neutral(b)?;
    let seed = match b.seed {
        None | Some(-1) => super::random_seed() % (1 << 32),
        Some(s) if s >= 0 => s as u64,
        Some(s) => {
            return Err(bad(format!(
                "seed is {s}; give a seed ≥ 0, or -1 for a random one"
            )))
        }
    };
    let (batch, iterations) = (b.batch_size.unwrap_or(1), b.n_iter.unwrap_or(1));
    let count = batch.saturating_mul(iterations);
    if !(1..=generation::MAX_COUNT as u64).contains(&count) {
        return Err(bad(format!(
            "batch_size × n_iter is {batch} × {iterations} = {count}; one request makes 1 to {} images",
            generation::MAX_COUNT
        )));
    }
    let (prompt, loras) = prompt_loras(state, b.prompt.as_deref().unwrap_or(""))?;
    let mut job = generation::Job {
        negative_prompt: b.negative_prompt.clone().filter(|n| !n.is_empty()),
        width: b.width,
        height: b.height,
        steps: b.steps.map(|s| usize::try_from(s).unwrap_or(usize::MAX)),
        guidance: b.cfg_scale,
        seed,
        count: count as u32,
        loras,
        ..generation::Job::new(super::stored(state, model), prompt)
    };
    match kind {
        Kind::Txt2Img => {
            if b.init_images.as_ref().is_some_and(|i| !i.is_empty()) || !unset(&b.mask) {
                return Err(bad(
                    "txt2img takes no `init_images` or `mask`; send them to /sdapi/v1/img2img",
                ));
            }
            job.hires = hires(b)?;
        }
        Kind::Img2Img => job.input = Some(img2img_input(b)?),
    }
    super::check_job(API, &job)?;
    Ok(job)
}

/// A1111's LoRA syntax, `<lora:NAME:SCALE>` in the prompt: each tag taken out of the prompt
/// and applied from the server's `--lora-dir` as `NAME.safetensors`.
fn prompt_loras(
    state: &AppState,
    prompt: &str,
) -> Result<(String, Vec<crate::lora::LoraSpec>), ApiError> {
    let mut text = String::new();
    let mut bodies = Vec::new();
    let mut rest = prompt;
    while let Some(start) = rest.find("<lora:") {
        let Some(len) = rest[start..].find('>') else {
            break;
        };
        let inner = &rest[start + "<lora:".len()..start + len];
        let (name, scale) = match inner.rsplit_once(':') {
            Some((n, s)) => {
                let scale = s.trim().parse::<f32>().map_err(|_| {
                    bad(format!(
                        "prompt: `<lora:{}>`: `{}` is no scale",
                        inner.escape_debug(),
                        s.escape_debug()
                    ))
                })?;
                (n, Some(scale))
            }
            None => (inner, None),
        };
        text.push_str(&rest[..start]);
        bodies.push(super::LoraBody {
            path: format!("{}.safetensors", name.trim()),
            scale,
        });
        rest = &rest[start + len + 1..];
    }
    text.push_str(rest);
    let loras = super::request_loras(state, API, Some(&bodies))?;
    Ok((text.trim().to_string(), loras))
}

/// `20261126045012`, as A1111 stamps its jobs.
fn job_timestamp(t: SystemTime) -> String {
    super::rfc3339(t)
        .chars()
        .filter(char::is_ascii_digit)
        .take(14)
        .collect()
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
        "job_timestamp": job_timestamp(started),
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
    let job = job_of(&state, &b, kind, &model)?;
    super::open_model(&state, API, &model, true).await?;
    let started = SystemTime::now();
    let label = format!("POST {} {}", kind.path(), model.short().escape_debug());
    let generate = job.clone();
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

/// `GET /sdapi/v1/sd-models`: the store's Z-Image models.
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
        super::read_json(API, &headers, body, super::MAX_BODY_BYTES).await?;
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

/// `GET /sdapi/v1/progress`: the worker's running job, whichever API sent it. No picture of
/// the running step is made (`current_image` is null): decoding one would slow every step.
pub async fn progress(State(state): State<Arc<AppState>>) -> Json<Value> {
    let running = state.worker.running();
    let job_count = state.worker.queued() + usize::from(running.is_some());
    let Some(r) = running else {
        return Json(json!({
            "progress": 0.0,
            "eta_relative": 0.0,
            "state": {
                "skipped": false, "interrupted": false, "stopping_generation": false,
                "job": "", "job_count": job_count, "job_timestamp": "0", "job_no": 0,
                "sampling_step": 0, "sampling_steps": 0,
            },
            "current_image": null,
            "textinfo": null,
        }));
    };
    let p = r.progress.as_ref();
    let fraction = p.map_or(0.0, generation::Progress::fraction);
    let elapsed = p.map_or(0.0, |p| p.elapsed.as_secs_f64());
    let eta = if fraction > 0.0 {
        elapsed / fraction - elapsed
    } else {
        0.0
    };
    Json(json!({
        "progress": fraction,
        "eta_relative": eta,
        "state": {
            "skipped": false,
            "interrupted": r.interrupted(),
            "stopping_generation": false,
            "job": r.label,
            "job_count": job_count,
            "job_timestamp": job_timestamp(r.started),
            "job_no": p.map_or(0, |p| p.image.saturating_sub(1)),
            "sampling_step": p.map_or(0, |p| p.step),
            "sampling_steps": p.map_or(0, |p| p.steps),
        },
        "current_image": null,
        "textinfo": p.map(|p| format!("{}: image {} of {}, step {} of {}", p.phase, p.image, p.images, p.step, p.steps)),
    }))
}

/// `POST /sdapi/v1/interrupt`: stops the running job at its next step; its request is answered
/// 409 without images.
pub async fn interrupt(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.worker.interrupt();
    Json(json!({}))
}

/// `POST /sdapi/v1/skip`: A1111 drops the current image and goes on with the batch; zimage's
/// runner cannot drop one image of a job, so skip stops the running job as interrupt does.
pub async fn skip(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.worker.interrupt();
    Json(json!({}))
}

/// `POST /sdapi/v1/refresh-checkpoints`: the store is read on every listing already.
pub async fn refresh_checkpoints() -> Json<Value> {
    Json(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutral_fields_pass_and_others_are_named() {
        let ok = Body1111 {
            sampler_name: Some("Euler".into()),
            scheduler: Some("automatic".into()),
            styles: Some(vec![]),
            subseed_strength: Some(0.0),
            ..Default::default()
        };
        assert!(check_neutral(&ok).is_ok());
        let ancestral = Body1111 {
            sampler_name: Some("Euler a".into()),
            ..Default::default()
        };
        let e = check_neutral(&ancestral).unwrap_err();
        assert!(
            e.message.contains("Euler a") && e.message.contains("one sampler"),
            "{}",
            e.message
        );
        let karras = Body1111 {
            scheduler: Some("Karras".into()),
            ..Default::default()
        };
        assert!(check_neutral(&karras)
            .unwrap_err()
            .message
            .contains("Karras"));
    }

    #[test]
    fn hires_maps_and_refuses_latent_upscalers() {
        let b = Body1111 {
            enable_hr: Some(true),
            hr_scale: Some(1.5),
            hr_upscaler: Some("Lanczos".into()),
            hr_second_pass_steps: Some(0),
            denoising_strength: Some(0.5),
            ..Default::default()
        };
        assert_eq!(
            hires(&b).unwrap(),
            Some(Hires {
                scale: 1.5,
                strength: 0.5,
                steps: None
            })
        );
        let latent = Body1111 {
            hr_upscaler: Some("Latent".into()),
            ..b
        };
        assert!(hires(&latent).unwrap_err().message.contains("Latent"));
    }

    #[test]
    fn masks_invert_then_blur() {
        let mut luma = image::GrayImage::new(9, 1);
        luma.put_pixel(4, 0, image::Luma([255]));
        let mask = Picture {
            image: image::DynamicImage::ImageLuma8(luma),
            label: "m".into(),
        };
        let inverted = prepare_mask(mask.clone(), true, 0.0).image.to_luma8();
        assert_eq!(inverted.get_pixel(4, 0).0[0], 0);
        assert_eq!(inverted.get_pixel(0, 0).0[0], 255);
        // A one-pixel line blurred by 2 pixels falls below half everywhere: it is gone.
        let blurred = prepare_mask(mask, false, 2.0).image.to_luma8();
        assert!(blurred.pixels().all(|p| p.0[0] < 128));
    }

    #[test]
    fn timestamps_are_digits() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        assert_eq!(job_timestamp(t), "20231114221320");
    }
}
