//! A generated image's metadata: the A1111 infotext and the request as JSON, written into its
//! PNG, so an image from the server and one from the command line are the same file for the
//! same request.

use crate::formats::infotext;
use crate::mlx::{self, Dtype};
use crate::pipeline::Request;
use std::path::Path;

/// Where an image came from, for its metadata.
pub struct Provenance<'a> {
    /// The model's name as shown.
    pub model_name: &'a str,
    /// The store's model identity (sha256 over the tensor layers).
    pub identity: &'a str,
    /// The dtype the model computed in.
    pub dtype: Dtype,
    /// The file the initial latents were read from, when they were not drawn from the seed.
    pub noise_file: Option<&'a Path>,
    /// The LoRA files applied, in order.
    pub loras: &'a [crate::lora::Applied],
    /// The scheduler's shift, from the model's scheduler config.
    pub shift: f32,
    /// The padding of an only-masked inpaint ([`super::masked_area`]).
    pub only_masked: Option<u32>,
    /// The reference pictures an edit followed, in order.
    pub references: &'a [ReferenceProvenance],
    /// True classifier-free guidance's scale, when it ran (a second prediction from the
    /// negative prompt beside an embedded guidance scale).
    pub true_cfg: Option<f32>,
}

/// A reference picture an image was edited from, for its metadata: its size and the sha256 of
/// its pixels (8-bit RGB, row by row), so the same picture can be found again however it was
/// encoded or sent (a file, base64 in a request, the page's canvas).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReferenceProvenance {
    /// The picture's width as given.
    pub width: u32,
    /// Its height as given.
    pub height: u32,
    /// The sha256 of its RGB pixels, lower-case hex.
    pub sha256: String,
}

impl ReferenceProvenance {
    /// The record of `picture`.
    pub fn of(picture: &image::DynamicImage) -> ReferenceProvenance {
        use sha2::{Digest, Sha256};
        let rgb = picture.to_rgb8();
        ReferenceProvenance {
            width: rgb.width(),
            height: rgb.height(),
            sha256: format!("{:x}", Sha256::digest(rgb.as_raw())),
        }
    }
}

/// The ControlNet an image was steered with, for its metadata.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ControlProvenance {
    /// The stored name or the path it was loaded from.
    pub controlnet: String,
    /// Its published version (`1.0`, `2.0`, `2.1`).
    pub version: String,
    /// How strongly its hints counted.
    pub scale: f32,
}

/// The hires pass an image was refined by, for its metadata.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HiresProvenance {
    /// How many times larger the second pass was, each way.
    pub scale: f32,
    /// The second pass's schedule length (`None`: the first pass's).
    pub steps: Option<usize>,
    /// How far the upscaled picture was taken back toward noise.
    pub strength: f64,
    /// The first pass's width.
    pub first_width: u32,
    /// The first pass's height.
    pub first_height: u32,
}

impl HiresProvenance {
    /// The record of `hires` run after the first pass `first`.
    pub fn of(hires: &super::job::Hires, first: &Request) -> HiresProvenance {
        HiresProvenance {
            scale: hires.scale,
            steps: hires.steps,
            strength: hires.strength,
            first_width: first.width,
            first_height: first.height,
        }
    }
}

/// The two text chunks of a generated PNG: (`parameters` infotext, `zimage` request JSON).
pub fn png_text(req: &Request, from: &Provenance) -> (String, String) {
    png_text_full(req, from, None, None)
}

/// [`png_text`] for an image steered by a ControlNet (`control`) or refined by a hires pass
/// (`hires`); `req` is the first pass's request.
pub fn png_text_full(
    req: &Request,
    from: &Provenance,
    control: Option<&ControlProvenance>,
    hires: Option<&HiresProvenance>,
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
    if let Some(scale) = from.true_cfg {
        fields.push(("True CFG scale", scale.to_string()));
    }
    if req.cfg_normalization {
        fields.push(("CFG normalization", "True".into()));
    }
    if req.cfg_truncation != crate::pipeline::NO_TRUNCATION {
        fields.push(("CFG truncation", req.cfg_truncation.to_string()));
    }
    if let Some(input) = &req.input {
        fields.push(("Denoising strength", input.strength.to_string()));
    }
    if let Some(padding) = from.only_masked {
        // As A1111 writes an "Only masked" inpaint.
        fields.push(("Inpaint area", "Only masked".into()));
        fields.push(("Masked area padding", padding.to_string()));
    }
    if let Some(h) = hires {
        // As A1111 writes a hires fix: the pass's strength as the denoising strength.
        fields.push(("Denoising strength", h.strength.to_string()));
        fields.push(("Hires upscale", h.scale.to_string()));
        if let Some(steps) = h.steps {
            fields.push(("Hires steps", steps.to_string()));
        }
        fields.push(("Hires upscaler", "Lanczos".into()));
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
    let mut fields: Vec<(String, String)> = (fields.into_iter())
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    // As A1111 names its inputs' hashes: ten hex digits (the full sha256 is in the JSON).
    for (k, r) in from.references.iter().enumerate() {
        let hash10 = r.sha256.get(..10).unwrap_or("").to_string();
        fields.push((format!("Reference {} hash", k + 1), hash10));
        let size = format!("{}x{}", r.width, r.height);
        fields.push((format!("Reference {} size", k + 1), size));
    }
    fields.push((
        "Version".into(),
        format!("zimage {}", env!("CARGO_PKG_VERSION")),
    ));
    let parameters = infotext::format(
        &req.prompt,
        req.negative_prompt
            .as_deref()
            .filter(|_| req.guidance > 0.0 || from.true_cfg.is_some())
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
    if let Some(h) = hires {
        request_json["hires"] = serde_json::json!(h);
    }
    if !from.references.is_empty() {
        request_json["references"] = serde_json::json!(from.references);
    }
    if let Some(scale) = from.true_cfg {
        request_json["true_cfg"] = serde_json::json!(scale);
    }
    if let Some(padding) = from.only_masked {
        request_json["only_masked"] = serde_json::json!({ "padding": padding });
    }
    (parameters, request_json.to_string())
}
