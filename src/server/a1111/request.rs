//! A txt2img or img2img body read into a generation job: the fields that map, and the checks
//! that the fields zimage has no counterpart for are at the value that changes nothing.

use super::{bad, API, SAMPLER, SCHEDULER};
use crate::families::{Family, Feature};
use crate::generation::{self, Hires, Picture, PictureInput};
use crate::server::errors::ApiError;
use crate::server::AppState;
use crate::store::ModelName;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// A1111's img2img strength when a request gives none.
const DEFAULT_DENOISING: f64 = 0.75;
/// The widest mask blur taken, in pixels (A1111's slider stops at 64).
const MAX_MASK_BLUR: f32 = 64.0;

/// A txt2img or img2img body: the fields that map, and those that must be neutral. Other
/// fields are ignored, as A1111 ignores fields its model does not have.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub(super) struct Body1111 {
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
    pub(super) batch_size: Option<u64>,
    pub(super) n_iter: Option<u64>,
    steps: Option<u64>,
    cfg_scale: Option<f32>,
    /// Forge's guidance scale for a guidance-distilled model (FLUX's embedded guidance); with
    /// it, `cfg_scale` is true classifier-free guidance's scale, as Forge reads them.
    distilled_cfg_scale: Option<f32>,
    width: Option<u32>,
    height: Option<u32>,
    restore_faces: Option<bool>,
    tiling: Option<bool>,
    s_churn: Option<f64>,
    pub(super) override_settings: Option<Map<String, Value>>,
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
    inpaint_full_res_padding: Option<i64>,
    inpainting_mask_invert: Option<Value>,
    initial_noise_multiplier: Option<f64>,
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
            "{field} `{}`: zimage has one sampler, `{SAMPLER}` (the flow-matching Euler step); send `{SAMPLER}`",
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
    if let Some((name, script)) =
        (b.alwayson_scripts.iter().flatten()).find(|(_, s)| !s.is_object())
    {
        return Err(bad(format!(
            "field `alwayson_scripts.{}` is {}; give an object with the script's `args`",
            name.escape_debug(),
            super::controlnet::kind(script)
        )));
    }
    if let Some((name, _)) = b.alwayson_scripts.iter().flatten().find(|(name, s)| {
        // ControlNet's units are read by `controlnet::unit`.
        !name.eq_ignore_ascii_case("controlnet")
            && s.get("args").is_some_and(|a| {
                a.as_array()
                    .is_none_or(|a| !a.is_empty() && a != &[json!(false)])
            })
    }) {
        return Err(bad(format!(
            "field `alwayson_scripts.{}`: zimage runs no A1111 scripts but ControlNet; leave it out",
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
fn decode_picture(field: &str, bytes: &[u8]) -> Result<Picture, ApiError> {
    let image = crate::image_in::decode(bytes, "field", field).map_err(|e| bad(e.to_string()))?;
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

/// How an img2img body reads its picture and mask, every field checked.
struct Img2Img {
    strength: f64,
    only_masked: Option<u32>,
    invert: bool,
    blur: f32,
}

/// A body's pictures, base64 undone but not decoded (the server admits them to its input
/// budget by their headers first), with how they are read.
#[derive(Default)]
pub(super) struct Pictures {
    init: Option<(Vec<u8>, Img2Img)>,
    mask: Option<Vec<u8>>,
    control: Option<super::controlnet::UnitRequest>,
    /// The reference pictures of a model that takes them: `init_images` after the first, named.
    references: Vec<(String, Vec<u8>)>,
}

impl Pictures {
    /// The pictures as the input budget weighs them.
    pub(super) fn inputs(&self) -> Vec<crate::input_budget::Input<'_>> {
        let mut given = vec![
            (
                "field",
                "init_images[0]",
                self.init.as_ref().map(|(b, _)| b.as_slice()),
            ),
            ("field", "mask", self.mask.as_deref()),
            (
                "field",
                self.control.as_ref().map_or("", |c| c.field.as_str()),
                self.control.as_ref().map(|c| c.bytes.as_slice()),
            ),
        ];
        let references = self.references.iter();
        given.extend(references.map(|(n, b)| ("field", n.as_str(), Some(b.as_slice()))));
        crate::input_budget::Input::given(&given)
    }

    /// `job` with its pictures decoded (slow work: call it off the async threads), checked
    /// again with them.
    pub(super) fn decode_into(
        self,
        store: &crate::store::Store,
        mut job: generation::Job,
    ) -> Result<generation::Job, ApiError> {
        if let Some((bytes, how)) = self.init {
            let mask = (self.mask.as_deref())
                .map(|m| decode_picture("mask", m))
                .transpose()?;
            job.input = Some(PictureInput {
                picture: decode_picture("init_images[0]", &bytes)?,
                mask: mask.map(|m| prepare_mask(m, how.invert, how.blur)),
                strength: Some(how.strength),
                only_masked: how.only_masked,
            });
        }
        if let Some(unit) = &self.control {
            job.control = Some(unit.decode(store, (job.width, job.height))?);
        }
        job.references = (self.references.iter())
            .map(|(name, bytes)| decode_picture(name, bytes))
            .collect::<Result<_, _>>()?;
        crate::server::check_job(API, &job)?;
        Ok(job)
    }
}

/// img2img's picture and mask as bytes, with its settings, checked.
fn img2img_pictures(b: &Body1111) -> Result<Pictures, ApiError> {
    let first = match b.init_images.as_deref() {
        Some([first, ..]) => first,
        _ => {
            return Err(bad(
                "field `init_images` is required: the picture (base64) to start from",
            ))
        }
    };
    let picture = crate::server::base64_field(API, "init_images[0]", first)?;
    if b.resize_mode.is_some_and(|m| m != 0) {
        return Err(bad(format!(
            "resize_mode {}: zimage resizes the picture to width×height (resize_mode 0, `Just resize`); send 0",
            b.resize_mode.unwrap_or(0)
        )));
    }
    let strength = b.denoising_strength.unwrap_or(DEFAULT_DENOISING);
    if !crate::number::within(strength, crate::number::above(0.0, 1.0)) {
        return Err(bad(format!(
            "denoising_strength is {strength}; it must be within (0, 1]"
        )));
    }
    let mut how = Img2Img {
        strength,
        only_masked: None,
        invert: false,
        blur: 0.0,
    };
    let Some(text) = b.mask.as_deref().filter(|m| !m.is_empty()) else {
        return Ok(Pictures {
            init: Some((picture, how)),
            ..Pictures::default()
        });
    };
    if flag("inpaint_full_res", &b.inpaint_full_res)? {
        let padding = b
            .inpaint_full_res_padding
            .unwrap_or(generation::DEFAULT_MASKED_PADDING as i64);
        if !(0..=generation::MAX_MASKED_PADDING as i64).contains(&padding) {
            return Err(bad(format!(
                "inpaint_full_res_padding is {padding}; it must be within 0..={} pixels",
                generation::MAX_MASKED_PADDING
            )));
        }
        how.only_masked = Some(padding as u32);
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
    how.blur = b.mask_blur.unwrap_or(0.0);
    if !crate::number::within(how.blur, 0.0..=f64::from(MAX_MASK_BLUR)) {
        return Err(bad(format!(
            "mask_blur is {}; it must be 0 or a number of pixels within 1e-38..={MAX_MASK_BLUR}",
            how.blur
        )));
    }
    how.invert = flag("inpainting_mask_invert", &b.inpainting_mask_invert)?;
    Ok(Pictures {
        init: Some((picture, how)),
        mask: Some(crate::server::base64_field(API, "mask", text)?),
        ..Pictures::default()
    })
}

/// Whether a request is txt2img or img2img.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
    Txt2Img,
    Img2Img,
}

impl Kind {
    pub(super) fn path(self) -> &'static str {
        match self {
            Kind::Txt2Img => "/sdapi/v1/txt2img",
            Kind::Img2Img => "/sdapi/v1/img2img",
        }
    }
}

/// A body as a generation job, everything checked that needs no model and no decoded
/// picture; its pictures as bytes, to be admitted and decoded into the job.
pub(super) fn job_of(
    state: &AppState,
    b: &Body1111,
    kind: Kind,
    model: &ModelName,
) -> Result<(generation::Job, Pictures), ApiError> {
    check_neutral(b)?;
    let seed = match b.seed {
        None | Some(-1) => crate::server::random_seed() % (1 << 32),
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
        // Forge's pair: the embedded guidance, and `cfg_scale` as true guidance above 1.
        guidance: b.distilled_cfg_scale.or(b.cfg_scale),
        true_cfg: b.distilled_cfg_scale.and(b.cfg_scale).filter(|&s| s != 1.0),
        seed,
        count: count as u32,
        loras,
        ..generation::Job::new(crate::server::stored(state, model), prompt)
    };
    let mut pictures = match kind {
        Kind::Txt2Img => {
            if b.init_images.as_ref().is_some_and(|i| !i.is_empty()) || !unset(&b.mask) {
                return Err(bad(
                    "txt2img takes no `init_images` or `mask`; send them to /sdapi/v1/img2img",
                ));
            }
            job.hires = hires(b)?;
            Pictures::default()
        }
        Kind::Img2Img => img2img_pictures(b)?,
    };
    crate::server::check_job(API, &job)?;
    pictures.control = super::controlnet::unit(b.alwayson_scripts.as_ref())?;
    if let Some(family) = crate::server::family(state, model) {
        refuse_untaken(family, &pictures)?;
        if crate::server::model_takes(state, model, Feature::References) {
            // A family that edits from references alone reads every picture as one.
            let all = !crate::server::model_takes(state, model, Feature::ImageInput)
                && pictures.mask.is_none();
            if all {
                pictures.init = None;
            }
            pictures.references = references(b, if all { 0 } else { 1 })?;
        }
    }
    Ok((job, pictures))
}

/// The fields a model of `family` cannot follow, refused by name before anything loads.
fn refuse_untaken(family: Family, pictures: &Pictures) -> Result<(), ApiError> {
    let name = family.name();
    let refused = [(
        (pictures.control.as_ref())
            .filter(|_| !family.takes(Feature::ControlNet))
            .map(|c| c.field.as_str()),
        "ControlNet is not available",
    )];
    match refused
        .iter()
        .find_map(|(field, why)| field.map(|f| (f, why)))
    {
        Some((field, why)) => Err(bad(format!(
            "field `{field}`: {why} for {name} models; leave it out"
        ))),
        None => Ok(()),
    }
}

/// An img2img's `init_images` from `from` on, for a model that takes references: the
/// reference pictures the edit follows, in order. The first is the picture img2img starts
/// from (`from` 1) unless the model only edits from references (`from` 0).
fn references(b: &Body1111, from: usize) -> Result<Vec<(String, Vec<u8>)>, ApiError> {
    let extra = b.init_images.iter().flatten().enumerate().skip(from);
    extra
        .map(|(k, text)| {
            let name = format!("init_images[{k}]");
            let bytes = crate::server::base64_field(API, &name, text)?;
            Ok((name, bytes))
        })
        .collect()
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
        bodies.push(crate::server::LoraBody {
            path: format!("{}.safetensors", name.trim()),
            scale,
        });
        rest = &rest[start + len + 1..];
    }
    text.push_str(rest);
    let loras = crate::server::request_loras(state, API, Some(&bodies))?;
    Ok((text.trim().to_string(), loras))
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
}
