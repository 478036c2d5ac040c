//! OpenAI's image API as the `openai` client sends it: `POST /v1/images/generations` (JSON)
//! and `POST /v1/images/edits` (a multipart form with the picture and an optional mask),
//! answered with base64 PNGs or with URLs this server serves for an hour, and `GET /v1/models`.
//! A request without a model, or with one of OpenAI's own ids, runs on the server's current model.

use super::errors::{Api, ApiError};
use super::ollama::{display_name, wait_done};
use super::worker::Job;
use super::{open_model, unix_seconds, with_model, AppState, MAX_IMAGES_PER_REQUEST};
use crate::generation::{ControlJob, PictureInput};
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{HeaderMap, StatusCode};
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

#[derive(Deserialize, Default)]
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
    cfg_normalization: Option<bool>,
    cfg_truncation: Option<f64>,
    /// Only with a picture (`/v1/images/edits`).
    strength: Option<f64>,
    /// A stored ControlNet, the control image it follows (base64 in JSON, a file in a form) and
    /// its scale.
    controlnet: Option<String>,
    control_image: Option<String>,
    control_scale: Option<f32>,
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
    req: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let limit = <ImagesBody as super::NamesModel>::MAX_BODY;
    let body: ImagesBody = super::read_json(API, &headers, body, limit).await?;
    let name = requested_model(&state, &body.model).await?;
    super::check_strength(API, body.strength, false)?;
    let control_image = (body.control_image.as_deref())
        .map(|t| super::base64_field(API, "control_image", t))
        .transpose()?;
    let pictures: Vec<crate::input_budget::Input> = (control_image.as_deref())
        .map(|bytes| crate::input_budget::Input {
            what: "field",
            name: "control_image",
            bytes,
        })
        .into_iter()
        .collect();
    let copies = body.n.unwrap_or(1).clamp(1, MAX_IMAGES_PER_REQUEST);
    // Held until the answer is done: the control image lives that long.
    let _reservation = super::admit_inputs(&state, API, &pictures, copies)?;
    let control = super::decode_control(&state, API, &body, control_image).await?;
    run(
        state,
        name,
        body,
        None,
        Vec::new(),
        control,
        Answer {
            route: "POST /v1/images/generations",
            host: host(&headers),
            ignored: 0,
        },
    )
    .await
}

/// The images a request asks for, made from `input` when it has one, as OpenAI answers them.
async fn run(
    state: Arc<AppState>,
    name: crate::store::ModelName,
    body: ImagesBody,
    input: Option<PictureInput>,
    references: Vec<crate::generation::Picture>,
    control: Option<ControlJob>,
    answer: Answer,
) -> Result<Response, ApiError> {
    if body.prompt.is_empty() {
        return Err(ApiError::bad_request(API, "field `prompt` is required").with_param("prompt"));
    }
    let by_url = match body.response_format.as_deref() {
        None | Some("b64_json") => false,
        Some("url") => true,
        Some(other) => {
            return Err(ApiError::bad_request(
                API,
                format!(
                    "response_format `{}` is neither \"b64_json\" nor \"url\"",
                    crate::shown::text(other)
                ),
            )
            .with_param("response_format"))
        }
    };
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
    let seed = match body.seed {
        Some(s) if s >= 0 => s as u64,
        _ => super::random_seed(),
    };
    let job = crate::generation::Job {
        negative_prompt: body.negative_prompt.clone(),
        width,
        height,
        steps: body.steps.map(|s| usize::try_from(s).unwrap_or(usize::MAX)),
        guidance: body.guidance,
        cfg_normalization: body.cfg_normalization,
        cfg_truncation: body.cfg_truncation,
        seed,
        // Each image of a request gets the next seed, so any one can be made again alone.
        count: n as u32,
        input,
        references,
        control,
        loras: super::request_loras(&state, API, body.loras.as_deref())?,
        ..crate::generation::Job::new(super::stored(&state, &name), body.prompt.clone())
    };
    super::check_job(API, &job)?;
    super::check_family(&state, API, &name, &job)?;
    open_model(&state, API, &name, true).await?;
    let label = format!("{} {}", answer.route, body.model.escape_debug());
    let (mut guard, mut rx) = super::queue(&state, API, |cancel, events| Job {
        model: name,
        generate: Some(job),
        keep_alive: None,
        cancel,
        events,
        label,
    })?;
    let finished = wait_done(&mut rx)
        .await
        .map_err(|e| super::job_error(API, e))?;
    guard.finish();
    let interrupted = finished.interrupted.then_some(finished.images.len());
    let data: Vec<Value> = (finished.images.into_iter())
        .map(|image| match by_url {
            true => json!({
                "url": format!("http://{}/v1/images/files/{}.png", answer.host, state.hosted.keep(image.png)),
                "revised_prompt": body.prompt,
            }),
            false => json!({
                "b64_json": base64::engine::general_purpose::STANDARD.encode(&image.png),
                "revised_prompt": body.prompt,
            }),
        })
        .collect();
    let mut reply = json!({ "created": unix_seconds(SystemTime::now()), "data": data });
    let mut notes = Vec::new();
    if answer.ignored > 0 {
        notes.push(format!(
            "{} more `image[]` files were left out: zimage edits the first picture alone",
            answer.ignored
        ));
    }
    if let Some(made) = interrupted {
        notes.push(format!(
            "the run was interrupted after {made} of the {n} images asked for"
        ));
    }
    if !notes.is_empty() {
        reply["zimage_note"] = json!(notes.join("; "));
    }
    Ok(with_model(Json(reply).into_response(), &body.model))
}

/// The model a request names. OpenAI's own ids (`dall-e-2`, which Open WebUI sends unless an
/// admin names a model, `dall-e-3`, `gpt-image-1`…) and no model at all mean the server's
/// current one: `--default-model`, else the one used or created last.
async fn requested_model(
    state: &AppState,
    model: &str,
) -> Result<crate::store::ModelName, ApiError> {
    let openai_id = model.starts_with("dall-e-") || model.starts_with("gpt-image-");
    if model.is_empty() || openai_id {
        return super::current::current_model(state, API).await;
    }
    super::model_name(API, model)
}

/// How an answer is made: the route for the log, the host its URLs name, and how many pictures
/// of the request were left out.
struct Answer {
    route: &'static str,
    host: String,
    ignored: usize,
}

/// The host a client reached this server by, for the URLs it is answered with.
fn host(headers: &HeaderMap) -> String {
    headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_graphic()))
        .unwrap_or("127.0.0.1")
        .to_string()
}

/// `GET /v1/images/files/{id}.png`: an image answered by URL, while it is kept.
pub async fn hosted_file(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(file): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let id = file.strip_suffix(".png").unwrap_or(&file);
    match state.hosted.get(id) {
        Some(png) => Ok(([(axum::http::header::CONTENT_TYPE, "image/png")], png).into_response()),
        None => Err(ApiError::new(
            API,
            StatusCode::NOT_FOUND,
            format!(
                "no image `{}`: images answered by URL are kept for {} minutes",
                crate::shown::text(&file),
                super::hosted::KEPT_FOR.as_secs() / 60
            ),
        )),
    }
}

/// `POST /v1/images/edits`: a multipart form as OpenAI takes it. `image` is the picture (one;
/// `image[]` as the client sends a list is taken too), `mask` the optional mask, transparent
/// where the picture is repainted (a mask without alpha is read as white = repaint); without a
/// mask the whole picture is reworked (img2img). The other fields are those of
/// `/v1/images/generations`, as text, with `strength`.
pub async fn edit(State(state): State<Arc<AppState>>, req: Request) -> Result<Response, ApiError> {
    let host = host(req.headers());
    let form = Multipart::from_request(req, &())
        .await
        .map_err(|e| ApiError::new(API, e.status(), e.body_text()))?;
    let EditForm {
        body,
        image,
        extra_images,
        mask,
        control_image,
    } = read_edit_form(form).await?;
    let name = requested_model(&state, &body.model).await?;
    let Some(image) = image else {
        return Err(
            ApiError::bad_request(API, "field `image` is required: the picture to edit")
                .with_param("image"),
        );
    };
    super::check_strength(API, body.strength, true)?;
    // Without a mask, a model of a family that takes references edits from every picture
    // given, as references.
    let as_references =
        mask.is_none() && super::model_takes(&state, &name, crate::families::Feature::References);
    let names: Vec<String> = (1..=extra_images.len())
        .map(|k| format!("image[{k}]"))
        .collect();
    let mut given = vec![
        ("field", "image", Some(image.as_slice())),
        ("field", "mask", mask.as_deref()),
        ("field", "control_image", control_image.as_deref()),
    ];
    if as_references {
        let extra = names.iter().zip(&extra_images);
        given.extend(extra.map(|(n, b)| ("field", n.as_str(), Some(b.as_slice()))));
    }
    let pictures = crate::input_budget::Input::given(&given);
    // Each image asked for carries the inputs; held until the answer is done.
    let copies = body.n.unwrap_or(1).clamp(1, MAX_IMAGES_PER_REQUEST);
    let _reservation = super::admit_inputs(&state, API, &pictures, copies)?;
    let strength = body.strength;
    let ignored = if as_references { 0 } else { extra_images.len() };
    let (input, references) = super::decoding(API, true, move || {
        Ok(match as_references {
            true => {
                let all: Vec<Vec<u8>> = std::iter::once(image).chain(extra_images).collect();
                (None, super::decode_references(API, "image", &all)?)
            }
            false => (
                Some(decode_edit(&image, mask.as_deref(), strength)?),
                Vec::new(),
            ),
        })
    })
    .await?;
    let control = super::decode_control(&state, API, &body, control_image).await?;
    run(
        state,
        name,
        body,
        input,
        references,
        control,
        Answer {
            route: "POST /v1/images/edits",
            host,
            ignored,
        },
    )
    .await
}

/// The multipart body of an edit request (`content_type` with its boundary), read into its
/// fields as [`edit`] reads it: the entry point the fuzzer drives.
pub async fn read_edit_body(content_type: &str, body: Vec<u8>) -> Result<EditForm, ApiError> {
    let req = axum::http::Request::builder()
        .method("POST")
        .header(axum::http::header::CONTENT_TYPE, content_type)
        .body(axum::body::Body::from(body))
        .map_err(|e| ApiError::bad_request(API, e.to_string()))?;
    let form = Multipart::from_request(req, &())
        .await
        .map_err(|e| ApiError::new(API, e.status(), e.body_text()))?;
    read_edit_form(form).await
}

/// The fields of an edit request, read; the pictures not yet decoded.
pub struct EditForm {
    pub body: ImagesBody,
    pub image: Option<Vec<u8>>,
    /// `image[]` files after the first: clients send several to newer models, which take them
    /// as references. A model whose family takes references does, without a mask; otherwise
    /// zimage edits the
    /// first and leaves these out (the answer says so).
    pub extra_images: Vec<Vec<u8>>,
    pub mask: Option<Vec<u8>>,
    /// A file, or base64 text.
    pub control_image: Option<Vec<u8>>,
}

async fn read_edit_form(mut form: Multipart) -> Result<EditForm, ApiError> {
    let broken = |e: axum::extract::multipart::MultipartError| {
        ApiError::new(
            API,
            e.status(),
            format!("the multipart form cannot be read: {}", e.body_text()),
        )
    };
    let mut out = EditForm {
        body: ImagesBody::default(),
        image: None,
        extra_images: Vec::new(),
        mask: None,
        control_image: None,
    };
    while let Some(field) = form.next_field().await.map_err(broken)? {
        let key = field.name().unwrap_or_default().to_string();
        match key.as_str() {
            "image" | "image[]" | "mask" | "control_image" => {
                let is_file = field.file_name().is_some();
                let mut bytes = field.bytes().await.map_err(broken)?.to_vec();
                let slot = match key.as_str() {
                    "mask" => &mut out.mask,
                    "control_image" => {
                        if !is_file {
                            let text = String::from_utf8_lossy(&bytes).into_owned();
                            bytes = super::base64_field(API, "control_image", &text)?;
                        }
                        &mut out.control_image
                    }
                    _ => &mut out.image,
                };
                let is_image = matches!(key.as_str(), "image" | "image[]");
                if is_image && slot.is_some() {
                    out.extra_images.push(bytes);
                    continue;
                }
                if slot.replace(bytes).is_some() {
                    return Err(ApiError::bad_request(
                        API,
                        format!("field `{key}` is given twice; this server takes one mask and one control image"),
                    ));
                }
            }
            _ => {
                let text = field.text().await.map_err(broken)?;
                set_form_field(&mut out.body, &key, text)?;
            }
        }
    }
    Ok(out)
}

/// One text field of the form into `body`. Fields this server does not use (`quality`,
/// `background`, `user`, …) are accepted and ignored, as in the JSON endpoint.
fn set_form_field(body: &mut ImagesBody, key: &str, text: String) -> Result<(), ApiError> {
    fn number<T: std::str::FromStr>(key: &str, text: &str) -> Result<T, ApiError> {
        text.trim().parse().map_err(|_| {
            ApiError::bad_request(
                API,
                format!(
                    "field `{key}` is `{}`, not a number",
                    text.chars().take(40).collect::<String>().escape_debug()
                ),
            )
        })
    }
    if text.len() > super::MAX_BODY_BYTES {
        return Err(ApiError::new(
            API,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "field `{}` is larger than {} bytes, the most this server reads for a text field",
                key.escape_debug(),
                super::MAX_BODY_BYTES
            ),
        ));
    }
    match key {
        "model" => body.model = text,
        "prompt" => body.prompt = text,
        "negative_prompt" => body.negative_prompt = Some(text),
        "size" => body.size = Some(text),
        "response_format" => body.response_format = Some(text),
        "n" => body.n = Some(number(key, &text)?),
        "seed" => body.seed = Some(number(key, &text)?),
        "steps" => body.steps = Some(number(key, &text)?),
        "guidance" => body.guidance = Some(number(key, &text)?),
        "cfg_normalization" => body.cfg_normalization = Some(number(key, &text)?),
        "cfg_truncation" => body.cfg_truncation = Some(number(key, &text)?),
        "strength" => body.strength = Some(number(key, &text)?),
        "controlnet" => body.controlnet = Some(text),
        "control_scale" => body.control_scale = Some(number(key, &text)?),
        "loras" => {
            body.loras = Some(serde_json::from_str(&text).map_err(|e| {
                ApiError::bad_request(
                    API,
                    format!("field `loras` is not a JSON list of {{path, scale}}: {e}"),
                )
                .with_param("loras")
            })?)
        }
        _ => {}
    }
    Ok(())
}

/// The picture and mask of an edit, decoded under the input limits; the mask in OpenAI's
/// convention (transparent repaints) turned into the pipeline's (white repaints).
pub fn decode_edit(
    image: &[u8],
    mask: Option<&[u8]>,
    strength: Option<f64>,
) -> Result<PictureInput, ApiError> {
    super::picture_input(
        API,
        ["image", "mask"],
        image,
        mask,
        strength,
        crate::image_in::mask_from_alpha,
    )
}

impl super::ControlFields for ImagesBody {
    fn controlnet(&self) -> Option<&str> {
        self.controlnet.as_deref()
    }
    fn control_scale(&self) -> Option<f32> {
        self.control_scale
    }
}

impl super::NamesModel for ImagesBody {
    const API: Api = API;

    fn model(&self) -> &str {
        &self.model
    }
}
