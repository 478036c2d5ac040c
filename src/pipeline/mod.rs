//! What every family's pipeline shares: where a model's files and weights come from
//! ([`ModelSource`]), a request and what it starts from ([`condition`]), the reference pictures
//! it may carry ([`mod@reference`]), the phases' reports and progress, and the steps that are the
//! same whatever the family (reading configs, encoding prompts and letting the encoder go,
//! decoding to RGB bytes, binding LoRAs). Each family's own pipeline, in its folder under
//! `crate::families`, owns the evaluation points (after text encoding, once per step, after
//! decoding) and the memory staging.

pub mod condition;
pub mod control;
pub mod core;
pub mod packing;
pub mod reference;
mod sources;

pub use condition::ImageInput;
pub use control::{ControlInput, ControlSpec};

use crate::memory_plan::TensorSize;
use crate::mlx::{self, Array, Dtype};
use crate::models::vae_tiling::Tiling;
use crate::models::{self, Checkpoint, Residency, VaeDecoder};
use crate::preview::{LatentFormat, Preview, RgbMap};
use std::ops::ControlFlow;
use std::time::Instant;

pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Where a pipeline gets its files and weights: a stored model or a diffusers directory.
pub trait ModelSource {
    /// A short name for messages and metadata.
    fn name(&self) -> String;
    /// A stable identity of the weights (the store's model identity), for image metadata.
    fn identity(&self) -> String;
    /// The bytes of a config file by its path in diffusers layout (`transformer/config.json`),
    /// or `None` when the model has no such file.
    fn config_file(&self, path: &str) -> Result<Option<Vec<u8>>, SourceError>;
    /// One component's tensors by their names inside the component (lazy arrays).
    fn component(&self, component: &str) -> Result<ComponentWeights, SourceError>;
    /// Whether [`ModelSource::mapped_component`] maps the weights from files.
    fn maps_weights(&self) -> bool {
        false
    }
    /// The same, mapped from files where the source can (with a [`ComponentWeights::release`]),
    /// for [`Residency::Streamed`]; else as [`ModelSource::component`] gives it.
    fn mapped_component(&self, component: &str) -> Result<ComponentWeights, SourceError> {
        self.component(component)
    }
    /// The sizes of one component's tensors, read without loading them.
    fn tensor_sizes(&self, component: &str) -> Result<Vec<TensorSize>, SourceError>;
    /// The LoRAs the model itself carries (a derived model's), read and checked.
    fn loras(&self) -> Result<Vec<crate::lora::Input>, crate::lora::Error> {
        Ok(Vec::new())
    }
    /// A digest of one component's weights that changes when any of them does, where the
    /// source knows one without reading them (the store's blob digests).
    fn component_digest(&self, _component: &str) -> Option<String> {
        None
    }
}

/// A borrowed source is a source: a family reads a model it was handed by reference.
impl<T: ModelSource + ?Sized> ModelSource for &T {
    fn name(&self) -> String {
        (**self).name()
    }
    fn identity(&self) -> String {
        (**self).identity()
    }
    fn config_file(&self, path: &str) -> Result<Option<Vec<u8>>, SourceError> {
        (**self).config_file(path)
    }
    fn component(&self, component: &str) -> Result<ComponentWeights, SourceError> {
        (**self).component(component)
    }
    fn maps_weights(&self) -> bool {
        (**self).maps_weights()
    }
    fn mapped_component(&self, component: &str) -> Result<ComponentWeights, SourceError> {
        (**self).mapped_component(component)
    }
    fn tensor_sizes(&self, component: &str) -> Result<Vec<TensorSize>, SourceError> {
        (**self).tensor_sizes(component)
    }
    fn loras(&self) -> Result<Vec<crate::lora::Input>, crate::lora::Error> {
        (**self).loras()
    }
    fn component_digest(&self, component: &str) -> Option<String> {
        (**self).component_digest(component)
    }
}

pub use crate::models::weights::ComponentWeights;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("model `{model}`: {cause}")]
    Source { model: String, cause: SourceError },
    #[error("model `{model}` has no `{path}`")]
    MissingConfig { model: String, path: String },
    #[error("`{path}` of model `{model}`: {reason}")]
    BadConfig {
        model: String,
        path: String,
        reason: String,
    },
    #[error(transparent)]
    Model(#[from] models::ModelError),
    #[error(transparent)]
    Text(#[from] crate::text::Error),
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    #[error(transparent)]
    Lora(#[from] crate::lora::Error),
    #[error("invalid request: {0}")]
    Request(String),
    /// The progress callback asked to stop; `step` denoising steps of `total` had run.
    #[error("stopped after step {step} of {total}")]
    Stopped { step: usize, total: usize },
    /// A phase's result holds NaN or infinity: a picture made from it would be black.
    #[error("the {phase} phase produced {value} values ({what}); the model's weights or its inputs hold non-finite values, so no picture is written")]
    NonFinite {
        phase: &'static str,
        what: &'static str,
        /// `NaN`, `+inf` or `-inf`.
        value: String,
    },
}

/// The model's own LoRAs, then the files `specs` names, bound to the linear layers of the
/// model `source` holds, whose transformer's layers also answer to `original_names` (its
/// family's), in `dtype` (none: no adapters). `lenient` applies to
/// `specs`; the model's own keep the choice made when they were stored.
pub fn load_adapters(
    source: &impl ModelSource,
    original_names: Option<crate::lora::OriginalNames>,
    specs: &[crate::lora::LoraSpec],
    lenient: bool,
    dtype: Dtype,
) -> Result<crate::lora::Adapters, Error> {
    let mut inputs = source.loras()?;
    for spec in specs {
        inputs.push(crate::lora::Input::read(spec, lenient)?);
    }
    if inputs.is_empty() {
        return Ok(Default::default());
    }
    let sizes = |c: &str| {
        source.tensor_sizes(c).map_err(|cause| Error::Source {
            model: source.name(),
            cause,
        })
    };
    let targets = crate::lora::Targets::new(
        original_names,
        &sizes("text_encoder")?,
        &sizes("transformer")?,
    );
    Ok(crate::lora::Adapters::bind(&inputs, &targets, dtype)?)
}

/// Refuses a phase's result that holds a NaN or an infinity, naming the phase.
/// The VAE's decode of `latents` (tiled when `tiling` says so) as 8-bit RGB, checked finite.
pub(crate) fn decode_to_rgb8(
    vae: &VaeDecoder,
    latents: &Array,
    tiling: Option<&Tiling>,
) -> Result<Vec<u8>, Error> {
    let _reuse = crate::platform::ReuseFreedMemory::start();
    let image = match tiling {
        Some(tiling) => vae.decode_tiled(latents, tiling)?,
        None => vae.decode(latents)?,
    };
    check_finite(&image, "decode", "pixels")?;
    Ok(models::vae::to_rgb8(&image)?)
}

pub(crate) fn check_finite(
    a: &Array,
    phase: &'static str,
    what: &'static str,
) -> Result<(), Error> {
    let values = a.astype(Dtype::F32)?.to_vec::<f32>()?;
    match values.into_iter().find(|v| !v.is_finite()) {
        Some(v) => Err(Error::NonFinite {
            phase,
            what,
            value: crate::store::import::describe_non_finite(v),
        }),
        None => Ok(()),
    }
}

/// What to generate.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Request {
    pub prompt: String,
    /// Used only with guidance > 0; the reference's default is the empty prompt.
    pub negative_prompt: Option<String>,
    pub width: u32,
    pub height: u32,
    pub steps: usize,
    /// Classifier-free guidance scale; 0 turns guidance off (Turbo's setting).
    pub guidance: f32,
    /// With guidance, caps each step's guided prediction at the norm of the prompt's own
    /// (diffusers' `cfg_normalization`; off by default).
    pub cfg_normalization: bool,
    /// With guidance, the model time `(1000 − t)/1000` in [0, 1] past which steps run unguided
    /// (diffusers' `cfg_truncation`; 1, the default, never truncates).
    pub cfg_truncation: f64,
    pub seed: u64,
    /// Initial latents `[16, H/8, W/8]` in f32; drawn from `seed` like torch's CPU generator
    /// when absent.
    #[serde(skip)]
    pub noise: Option<Vec<f32>>,
    /// The picture an image-to-image or inpaint request starts from; `None` for text → image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<ImageInput>,
}

/// The `cfg_truncation` that keeps guidance at every step.
pub const NO_TRUNCATION: f64 = 1.0;

/// Time and peak MLX memory of one phase.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseReport {
    pub phase: &'static str,
    pub seconds: f64,
    /// MLX's peak allocation during the phase.
    pub peak_bytes: usize,
    /// What MLX keeps cached of the buffers it freed, at the phase's end (cleared after it).
    pub cache_bytes: usize,
    /// The process's peak resident memory so far, at the phase's end: the phase that raises it
    /// holds the peak.
    pub peak_resident_bytes: Option<u64>,
}

/// Progress callbacks from a family's pipeline as it generates.
pub enum Progress {
    Phase(&'static str),
    Step {
        index: usize,
        total: usize,
        /// The step's latents as a picture, when previews are on.
        preview: Option<Preview>,
    },
}

/// A generated image and how it was made.
pub struct Generated {
    /// Row-major RGB bytes, `height × width × 3`.
    pub rgb: Vec<u8>,
    pub width: u32,
    pub height: u32,
    pub phases: Vec<PhaseReport>,
    /// The denoiser's final latents, as it lays them out.
    pub latents: Array,
    /// Seconds the ControlNet's hints took over the whole denoise (`None` without control).
    pub control_seconds: Option<f64>,
}

impl Generated {
    /// `req`'s image once decoded to `rgb`, the decode's memory handed back first.
    pub(crate) fn decoded(
        rgb: Vec<u8>,
        req: &Request,
        phases: Vec<PhaseReport>,
        latents: Array,
        control_seconds: Option<f64>,
    ) -> Generated {
        release_freed_memory();
        Generated {
            rgb,
            width: req.width,
            height: req.height,
            phases,
            latents,
            control_seconds,
        }
    }
}

pub use crate::models::{MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE};

/// Reads, parses and validates one config file.
pub(crate) fn parse_config<T: serde::de::DeserializeOwned>(
    source: &(impl ModelSource + ?Sized),
    path: &str,
    validate: impl Fn(&T) -> Result<(), String>,
) -> Result<T, Error> {
    let bytes = read_config(source, path)?.ok_or_else(|| Error::MissingConfig {
        model: source.name(),
        path: path.to_string(),
    })?;
    let bad = |reason: String| Error::BadConfig {
        model: source.name(),
        path: path.into(),
        reason,
    };
    let config = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    validate(&config).map_err(bad)?;
    Ok(config)
}

/// The bytes of a config or tokenizer file, refused above the file's limit whatever the
/// source (a store's blob is read before it can be measured; it is still not parsed).
pub(crate) fn read_config(
    source: &(impl ModelSource + ?Sized),
    path: &str,
) -> Result<Option<Vec<u8>>, Error> {
    let bytes = source.config_file(path).map_err(|e| Error::Source {
        model: source.name(),
        cause: e,
    })?;
    let (limit, what) = crate::diffusers_dir::config_limit(path);
    match bytes {
        Some(b) if b.len() as u64 > limit => Err(Error::BadConfig {
            model: source.name(),
            path: path.into(),
            reason: format!(
                "{} bytes, more than the {limit} bytes a {what} may be",
                b.len()
            ),
        }),
        other => Ok(other),
    }
}

/// One of `configs` (`(path, bytes)` in diffusers layout), parsed and validated; the message
/// names the file.
pub fn config_in<T: serde::de::DeserializeOwned>(
    configs: &[(String, Vec<u8>)],
    path: &str,
    validate: impl Fn(&T) -> Result<(), String>,
) -> Result<T, String> {
    let bytes = configs
        .iter()
        .find(|(p, _)| p == path)
        .map(|(_, b)| b)
        .ok_or_else(|| format!("the model would have no `{path}`"))?;
    let config: T = serde_json::from_slice(bytes).map_err(|e| format!("`{path}`: {e}"))?;
    validate(&config).map_err(|e| format!("`{path}`: {e}"))?;
    Ok(config)
}

/// What is wrong with this `cfg_truncation`, if anything (named as the command line's flag).
pub fn cfg_truncation_error(truncation: f64) -> Option<String> {
    (!crate::number::within(truncation, 0.0..=1.0)).then(|| {
        format!(
            "--cfg-truncation is {truncation}; it must be within [0, 1] (the model time past which guidance stops; 1 keeps it throughout)"
        )
    })
}

/// What is wrong with these request values, if anything: one line naming the setting and its
/// bounds, for a model whose sides are multiples of `cell` pixels. Steps, guidance, width and
/// height are named as the command line's flags name them.
pub fn request_range_error_in(
    steps: u64,
    guidance: f32,
    (width, height): (u32, u32),
    cell: u32,
) -> Option<String> {
    let max_steps = crate::scheduler::MAX_STEPS as u64;
    if !(1..=max_steps).contains(&steps) {
        return Some(format!(
            "--steps is {steps}; it must be within 1..={max_steps}"
        ));
    }
    if !crate::number::within(guidance, 0.0..) {
        return Some(format!(
            "--guidance is {guidance}; it must be a finite number ≥ 0 (0 turns guidance off)"
        ));
    }
    for (flag, v) in [("--width", width), ("--height", height)] {
        let refused = !(cell..=MAX_IMAGE_SIDE).contains(&v) || v % cell != 0;
        // Before the model is read (`cell` 1) only the bounds every model shares are known.
        if refused && cell == 1 {
            return Some(format!(
                "{flag} is {v}; it must be within 1..={MAX_IMAGE_SIDE}"
            ));
        }
        if refused {
            return Some(format!(
                "{flag} is {v}; widths and heights are multiples of {cell} within {cell}..={MAX_IMAGE_SIDE}"
            ));
        }
    }
    let pixels = width as u64 * height as u64;
    if pixels > MAX_IMAGE_PIXELS {
        return Some(format!(
            "--width × --height is {width}×{height} = {pixels} pixels, more than {MAX_IMAGE_PIXELS} (4096×4096)"
        ));
    }
    None
}

/// Hands a finished phase's buffers back to the system, so the next phase starts lean.
/// The text phase: the prompt's features, and with `guided` the negative prompt's (the empty
/// prompt when the request gives none), from the encoder `load` gives, evaluated; the encoder
/// is let go and its memory handed back before the next phase.
pub(crate) fn encode_prompts<E>(
    phases: &mut Vec<PhaseReport>,
    req: &Request,
    guided: bool,
    load: impl FnOnce() -> Result<E, Error>,
    encode: impl Fn(&E, &str) -> Result<Array, Error>,
) -> Result<(Array, Option<Array>), Error> {
    let features = measure(phases, "text", || {
        let encoder = load()?;
        let pos = encode(&encoder, &req.prompt)?;
        let neg = match guided {
            true => Some(encode(
                &encoder,
                req.negative_prompt.as_deref().unwrap_or(""),
            )?),
            false => None,
        };
        let mut outs = vec![&pos];
        outs.extend(neg.as_ref());
        mlx::eval(&outs)?;
        Ok::<_, Error>((pos, neg))
    })?;
    release_freed_memory();
    Ok(features)
}

/// From the denoise to the decode phase: the latents checked, what the denoise read (`held`)
/// let go and its memory handed back before the decoder loads, then the decode announced;
/// `stop` is the error when `progress` stops there.
pub(crate) fn to_decode<T>(
    latents: &Array,
    held: T,
    progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
    stop: Error,
) -> Result<(), Error> {
    check_finite(latents, "denoise", "latents")?;
    drop(held);
    release_freed_memory();
    match progress(Progress::Phase("decode")).is_break() {
        true => Err(stop),
        false => Ok(()),
    }
}

/// The preview map of latents laid out as `format` and decoded by `vae`: the one cached for
/// the VAE's weights, else fitted now (see [`crate::preview`]).
pub(crate) fn preview_map(
    source: &impl ModelSource,
    format: &LatentFormat,
    vae: &VaeDecoder,
) -> Result<RgbMap, Error> {
    let digest = source.component_digest("vae");
    Ok(RgbMap::cached_or_fit(
        format,
        digest.as_deref(),
        &mut |z| vae.decode(z),
    )?)
}

pub(crate) fn release_freed_memory() {
    mlx::memory::clear_cache();
    crate::platform::trim_freed_memory();
}

/// Runs `f` as one phase, recording its time and MLX's peak memory during it.
pub(crate) fn measure<T, E>(
    phases: &mut Vec<PhaseReport>,
    phase: &'static str,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    mlx::memory::reset_peak_memory();
    let start = Instant::now();
    let out = f()?;
    phases.push(PhaseReport {
        phase,
        seconds: start.elapsed().as_secs_f64(),
        peak_bytes: mlx::memory::peak_memory(),
        cache_bytes: mlx::memory::cache_memory(),
        peak_resident_bytes: crate::platform::peak_resident_bytes(),
    });
    Ok(out)
}

/// The sizes of a model's tensors, per component (text encoder, transformer, VAE), for memory
/// estimates.
pub(crate) fn component_sizes(source: &impl ModelSource) -> Result<[Vec<TensorSize>; 3], Error> {
    let sizes = |c: &str| {
        source.tensor_sizes(c).map_err(|e| Error::Source {
            model: source.name(),
            cause: e,
        })
    };
    Ok([sizes("text_encoder")?, sizes("transformer")?, sizes("vae")?])
}

/// One component's checkpoint, its weights held in `residency`: the transformer and the text
/// encoder streamed block by block when so asked (the VAE is small), with `adapters`' LoRA
/// pairs bound to its layers.
pub(crate) fn held_checkpoint(
    source: &impl ModelSource,
    component: &str,
    dtype: Dtype,
    residency: Residency,
    adapters: &crate::lora::Adapters,
) -> Result<Checkpoint, Error> {
    let streams = matches!(component, "transformer" | "text_encoder" | "text_encoder_2");
    let weights = match residency == Residency::Streamed && streams {
        true => source.mapped_component(component),
        false => source.component(component),
    }
    .map_err(|e| Error::Source {
        model: source.name(),
        cause: e,
    })?;
    Ok(Checkpoint::new(component, weights.tensors, dtype)
        .with_quantized(weights.quantized)
        .with_residency(residency)
        .with_release(weights.release)
        .with_adapters(adapters.for_component(component)))
}
