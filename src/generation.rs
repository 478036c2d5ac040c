//! The one generation path `zimage generate` and `zimage serve` share: the memory plan for a
//! request, and the PNG with its metadata (A1111 infotext and the request as JSON), so an
//! image from the server and one from the command line are the same file for the same request.

use crate::formats::infotext;
use crate::memory_plan::{self, DoesNotFit, MemoryPlan};
use crate::mlx::{self, Dtype};
use crate::models::Residency;
use crate::pipeline::{self, Generated, ModelSource, Pipeline, Request};
use std::path::Path;

/// Denoising steps when a request names none (Z-Image Turbo's setting).
pub const DEFAULT_STEPS: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The memory budget setting itself is wrong (`--memory-limit`, `ZIMAGE_MEMORY_LIMIT`).
    #[error("{0}")]
    Budget(String),
    #[error(transparent)]
    DoesNotFit(#[from] DoesNotFit),
    #[error(transparent)]
    Pipeline(#[from] pipeline::Error),
    #[error("encoding the PNG: {0}")]
    Png(String),
}

/// Checks that the request fits the memory budget (`limit`, else `ZIMAGE_MEMORY_LIMIT`, else
/// most of the machine) and chooses how to hold the weights and decode; `residency` overrides
/// the choice of how weights are held.
pub fn plan_memory<S: ModelSource>(
    pipeline: &Pipeline<S>,
    req: &Request,
    limit: Option<&str>,
    residency: Option<Residency>,
) -> Result<MemoryPlan, Error> {
    let (budget, source) = memory_plan::budget(limit).map_err(Error::Budget)?;
    let sizes = pipeline.tensor_sizes()?;
    let model = pipeline.model_sizes(&sizes);
    let shape = pipeline.request_shape(req)?;
    let base = crate::platform::held_before_loading();
    let mut plan = model.plan(&shape, budget, &source, base, pipeline.can_stream())?;
    if let Some(residency) = residency.filter(|r| *r != plan.residency) {
        plan.residency = residency;
        plan.estimate = model.estimate(&shape, residency, plan.tiling.as_ref(), base);
    }
    Ok(plan)
}

/// Where an image came from, for its metadata.
pub struct Provenance<'a> {
    pub model_name: &'a str,
    /// The store's model identity (sha256 over the tensor layers).
    pub identity: &'a str,
    pub dtype: Dtype,
    /// The file the initial latents were read from, when they were not drawn from the seed.
    pub noise_file: Option<&'a Path>,
    /// The LoRA files applied, in order.
    pub loras: &'a [crate::lora::Applied],
    /// The scheduler's shift, from the model's scheduler config.
    pub shift: f32,
}

/// The ControlNet an image was steered with, for its metadata.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ControlProvenance {
    /// The stored name or the path it was loaded from.
    pub controlnet: String,
    /// Its published version (`1.0`, `2.0`, `2.1`).
    pub version: String,
    pub scale: f32,
}

impl ControlProvenance {
    /// What `pipeline`'s ControlNet and `control` say of the steering; `None` without either.
    pub fn of<S: ModelSource>(
        pipeline: &Pipeline<S>,
        control: Option<&pipeline::ControlInput>,
    ) -> Option<ControlProvenance> {
        let (net, c) = pipeline.controlnet().zip(control)?;
        Some(ControlProvenance {
            controlnet: net.name(),
            version: net.version().to_string(),
            scale: c.scale,
        })
    }
}

/// The two text chunks of a generated PNG: (`parameters` infotext, `zimage` request JSON).
pub fn png_text(req: &Request, from: &Provenance) -> (String, String) {
    png_text_controlled(req, from, None)
}

/// [`png_text`] for an image steered by a ControlNet (`None`: not steered).
pub fn png_text_controlled(
    req: &Request,
    from: &Provenance,
    control: Option<&ControlProvenance>,
) -> (String, String) {
    let hash10 = from.identity.get(..10).unwrap_or("").to_string();
    let mut fields = vec![
        ("Steps", req.steps.to_string()),
        ("Sampler", "Euler".into()),
        (
            "Schedule type",
            format!("Flow matching, shift {}", from.shift),
        ),
        ("CFG scale", req.guidance.to_string()),
        (
            "Seed",
            if from.noise_file.is_some() {
                "-1".into()
            } else {
                req.seed.to_string()
            },
        ),
        ("Size", format!("{}x{}", req.width, req.height)),
        ("Model hash", hash10),
        ("Model", from.model_name.to_string()),
    ];
    if let Some(input) = &req.input {
        fields.push(("Denoising strength", input.strength.to_string()));
    }
    if let Some(c) = control {
        fields.push(("ControlNet", c.controlnet.clone()));
        fields.push(("ControlNet version", c.version.clone()));
        fields.push(("ControlNet scale", c.scale.to_string()));
    }
    if !from.loras.is_empty() {
        let hashes: Vec<String> = from
            .loras
            .iter()
            // As A1111 writes them: a name loses the `:` and `,` that would split the list.
            .map(|l| format!("{}: {}", l.name.replace([':', ','], ""), l.hash))
            .collect();
        fields.push(("Lora hashes", hashes.join(", ")));
    }
    fields.push(("Version", format!("zimage {}", env!("CARGO_PKG_VERSION"))));
    let parameters = infotext::format(
        &req.prompt,
        req.negative_prompt
            .as_deref()
            .filter(|_| req.guidance > 0.0)
            .unwrap_or(""),
        &fields,
    );
    let mut request_json = serde_json::json!({
        "request": req,
        "noise_file": from.noise_file,
        "model": from.model_name,
        "model_identity": from.identity,
        "loras": from.loras,
        "dtype": from.dtype.lower_name(),
        "zimage_version": env!("CARGO_PKG_VERSION"),
        "mlx_version": mlx::version(),
    });
    if let Some(c) = control {
        request_json["control"] = serde_json::json!(c);
    }
    (parameters, request_json.to_string())
}

/// The generated image as PNG bytes, with its metadata.
pub fn encode_png(out: &Generated, req: &Request, from: &Provenance) -> Result<Vec<u8>, Error> {
    encode_png_controlled(out, req, from, None)
}

/// [`encode_png`] for an image steered by a ControlNet (`None`: not steered).
pub fn encode_png_controlled(
    out: &Generated,
    req: &Request,
    from: &Provenance,
    control: Option<&ControlProvenance>,
) -> Result<Vec<u8>, Error> {
    let (parameters, json) = png_text_controlled(req, from, control);
    crate::image_out::encode_png(
        &out.rgb,
        out.width,
        out.height,
        &[
            (crate::image_out::PARAMETERS_KEY, &parameters),
            (crate::image_out::ZIMAGE_KEY, &json),
        ],
    )
    .map_err(Error::Png)
}
