//! Text → image with Z-Image: encode the prompt, denoise with the flow-match Euler schedule
//! (with classifier-free guidance when asked), decode with the VAE, and quantise to RGB bytes.
//!
//! Mirrors diffusers 0.42.1 `ZImagePipeline.__call__` (zimage-spec §4–6). The pipeline owns the
//! evaluation points (after text encoding, once per step, after decoding) and the memory
//! staging: the text encoder is dropped before denoising, and the transformer and the VAE are
//! loaded when their phase starts and dropped after it unless the caller keeps them for more
//! images.

pub mod condition;
pub mod control;
pub mod denoise;
pub mod klein;
mod sources;

pub use condition::ImageInput;
pub use control::{ControlInput, ControlNetLoader, ControlSpec};

use crate::memory_plan::{ModelSizes, RequestShape, TensorSize};
use crate::mlx::{self, Array, Dtype};
use crate::models::vae_tiling::Tiling;
use crate::models::{
    self, Checkpoint, ControlNet, DitConfig, Qwen3Config, Qwen3Encoder, Residency, VaeConfig,
    VaeDecoder, VaeEncoder, ZImageTransformer,
};
use crate::preview::{LatentFormat, Preview, RgbMap};
use crate::scheduler::{Schedule, SchedulerConfig};
use crate::text::PromptTokenizer;
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

/// The family of the model `source` holds, from its `model_index.json`.
pub fn family_of(source: &impl ModelSource) -> Result<crate::family::Family, Error> {
    let index = read_config(source, "model_index.json")?.ok_or_else(|| Error::MissingConfig {
        model: source.name(),
        path: "model_index.json".into(),
    })?;
    crate::family::Family::from_model_index(&index).map_err(|reason| Error::BadConfig {
        model: source.name(),
        path: "model_index.json".into(),
        reason,
    })
}

/// The model's own LoRAs, then the files `specs` names, bound to the linear layers of the
/// model `source` holds, of `family`, in `dtype` (none: no adapters). `lenient` applies to
/// `specs`; the model's own keep the choice made when they were stored.
pub fn load_adapters(
    source: &impl ModelSource,
    family: crate::family::Family,
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
    let targets =
        crate::lora::Targets::new(family, &sizes("text_encoder")?, &sizes("transformer")?);
    Ok(crate::lora::Adapters::bind(&inputs, &targets, dtype)?)
}

/// Refuses a phase's result that holds a NaN or an infinity, naming the phase.
/// The VAE's decode of `latents` (tiled when `tiling` says so) as 8-bit RGB, checked finite.
fn decode_to_rgb8(
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

fn check_finite(a: &Array, phase: &'static str, what: &'static str) -> Result<(), Error> {
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

/// Progress callbacks from [`Pipeline::generate`].
pub enum Progress {
    Phase(&'static str),
    Step {
        index: usize,
        total: usize,
        /// The step's latents as a picture, with previews on ([`Pipeline::set_previews`]).
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
    fn decoded(
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

/// The model's configuration, read once from its json files.
pub struct ModelConfigs {
    pub text_encoder: Qwen3Config,
    pub transformer: DitConfig,
    pub vae: VaeConfig,
    pub scheduler: SchedulerConfig,
}

/// A loaded pipeline. The heavy components are loaded lazily per phase.
pub struct Pipeline<S: ModelSource> {
    source: S,
    pub configs: ModelConfigs,
    tokenizer: PromptTokenizer,
    dtype: Dtype,
    /// How unquantized linear weights are held (quantized ones always stay packed).
    residency: Residency,
    /// Decode in tiles (to bound the decode's memory), or whole.
    tiling: Option<Tiling>,
    /// Keep the transformer and VAE between images (more memory, no reload).
    keep_models: bool,
    transformer: Option<ZImageTransformer>,
    vae: Option<VaeDecoder>,
    /// LoRA pairs added, unfused, to the linear layers they target.
    adapters: crate::lora::Adapters,
    /// The ControlNet requests with a control image are steered by, loaded with the
    /// transformer (and kept with it).
    controlnet: Option<Box<dyn ControlNetLoader>>,
    controlnet_sizes: Vec<TensorSize>,
    controlnet_model: Option<ControlNet>,
    /// The latents → RGB map each step's preview is drawn with, once fitted.
    rgb_map: Option<RgbMap>,
    /// Whether steps report previews.
    previews: bool,
}

pub use crate::models::{MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE};

/// Reads, parses and validates one config file.
fn parse_config<T: serde::de::DeserializeOwned>(
    source: &impl ModelSource,
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
fn read_config(source: &impl ModelSource, path: &str) -> Result<Option<Vec<u8>>, Error> {
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

impl<S: ModelSource> Pipeline<S> {
    /// Reads the configs and the tokenizer; weights load when they are first needed.
    pub fn new(source: S, dtype: Dtype, keep_models: bool) -> Result<Pipeline<S>, Error> {
        let configs = ModelConfigs {
            text_encoder: parse_config(&source, "text_encoder/config.json", Qwen3Config::validate)?,
            transformer: parse_config(&source, "transformer/config.json", DitConfig::validate)?,
            vae: parse_config(&source, "vae/config.json", VaeConfig::validate)?,
            scheduler: parse_config(
                &source,
                "scheduler/scheduler_config.json",
                SchedulerConfig::validate,
            )?,
        };
        let bad = |path: &str, reason: String| Error::BadConfig {
            model: source.name(),
            path: path.into(),
            reason,
        };
        // The transformer's widths that the other components' outputs must match.
        let t = &configs.transformer;
        for (key, ours, theirs, value) in [
            (
                "cap_feat_dim",
                t.cap_feat_dim,
                "the text encoder's `hidden_size`",
                configs.text_encoder.hidden_size,
            ),
            (
                "in_channels",
                t.in_channels,
                "the VAE's `latent_channels`",
                configs.vae.latent_channels,
            ),
        ] {
            if ours != value {
                return Err(bad(
                    "transformer/config.json",
                    format!("`{key}` {ours} differs from {theirs} {value}"),
                ));
            }
        }
        let tokenizer = PromptTokenizer::from_files(|name| {
            read_config(&source, &format!("tokenizer/{name}")).map_err(|e| e.to_string())
        })
        .map_err(|e| match e {
            crate::text::Error::Load { reason, .. } => crate::text::Error::Load {
                dir: std::path::Path::new(&source.name()).join("tokenizer"),
                reason,
            },
            other => other,
        })?;
        if let Some(id) = tokenizer.max_id() {
            if id >= configs.text_encoder.vocab_size as u64 {
                return Err(bad(
                    "text_encoder/config.json",
                    format!(
                        "`vocab_size` is {}, but the tokenizer has token id {id}",
                        configs.text_encoder.vocab_size
                    ),
                ));
            }
        }
        Ok(Pipeline {
            source,
            configs,
            tokenizer,
            dtype,
            residency: Residency::Compute,
            tiling: None,
            keep_models,
            transformer: None,
            vae: None,
            adapters: Default::default(),
            controlnet: None,
            controlnet_sizes: Vec::new(),
            controlnet_model: None,
            rgb_map: None,
            previews: false,
        })
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    /// Chooses how unquantized linear weights are held from now on.
    pub fn set_residency(&mut self, residency: Residency) {
        self.residency = residency;
    }

    /// Applies these LoRA pairs from the next image on (a kept transformer is rebuilt).
    pub fn set_adapters(&mut self, adapters: crate::lora::Adapters) {
        self.adapters = adapters;
        self.transformer = None;
    }

    /// The model's own LoRAs, then the files `specs` names, bound to the model's layers in the
    /// compute dtype (see [`load_adapters`]).
    pub fn load_adapters(
        &self,
        specs: &[crate::lora::LoraSpec],
        lenient: bool,
    ) -> Result<crate::lora::Adapters, Error> {
        let family = crate::family::Family::ZImage;
        load_adapters(&self.source, family, specs, lenient, self.dtype)
    }

    /// Steers requests that carry a control image with this ControlNet from the next image on
    /// (`None`: none), after checking that it fits the model's transformer.
    pub fn set_controlnet(
        &mut self,
        loader: Option<Box<dyn ControlNetLoader>>,
    ) -> Result<(), Error> {
        if let Some(l) = &loader {
            l.config()
                .validate()
                .and_then(|()| l.config().check_fits(&self.configs.transformer))
                .map_err(|reason| {
                    Error::Request(format!(
                        "--controlnet `{}` does not fit model `{}`: {reason}",
                        l.name(),
                        self.source.name()
                    ))
                })?;
        }
        self.controlnet_sizes = loader
            .as_ref()
            .map(|l| l.tensor_sizes())
            .unwrap_or_default();
        self.controlnet = loader;
        self.controlnet_model = None;
        Ok(())
    }

    /// The ControlNet set, for metadata.
    pub fn controlnet(&self) -> Option<&dyn ControlNetLoader> {
        self.controlnet.as_deref()
    }

    /// The LoRAs applied, for metadata.
    pub fn adapters(&self) -> &crate::lora::Adapters {
        &self.adapters
    }

    pub fn residency(&self) -> Residency {
        self.residency
    }

    /// Decodes in tiles from now on (`None`: whole).
    pub fn set_tiling(&mut self, tiling: Option<Tiling>) {
        self.tiling = tiling;
    }

    /// The sizes of the model's tensors, per component, for memory estimates.
    pub fn tensor_sizes(&self) -> Result<[Vec<TensorSize>; 3], Error> {
        component_sizes(&self.source)
    }

    /// The model's sizes and configuration as the memory plan reads them.
    /// Whether the transformer can stream ([`Residency::Streamed`]): weights mapped from a store,
    /// on the CPU.
    pub fn can_stream(&self) -> bool {
        self.source.maps_weights() && crate::platform::can_stream_weights()
    }

    pub fn model_sizes<'a>(&'a self, sizes: &'a [Vec<TensorSize>; 3]) -> ModelSizes<'a> {
        ModelSizes {
            text_encoder: &sizes[0],
            transformer: &sizes[1],
            vae: &sizes[2],
            text_config: &self.configs.text_encoder,
            denoiser: crate::memory_plan::Denoiser::ZImage(&self.configs.transformer),
            vae_config: &self.configs.vae,
            controlnet: &self.controlnet_sizes,
        }
    }

    /// What `req` asks of memory apart from the model.
    pub fn request_shape(&self, req: &Request) -> Result<RequestShape, Error> {
        let mut tokens = self.token_ids(&req.prompt)?.len();
        let guided = req.guidance > 0.0;
        if guided {
            let negative = req.negative_prompt.as_deref().unwrap_or("");
            tokens = tokens.max(self.token_ids(negative)?.len());
        }
        Ok(RequestShape {
            width: req.width,
            height: req.height,
            prompt_tokens: tokens as u32,
            prompts: 1 + guided as u32,
            reference_tokens: 0,
            compute_bytes: self.dtype.size_bytes() as u64,
            // A ControlNet's control image is encoded too.
            encodes: (req.input.is_some() || self.controlnet.is_some())
                .then_some((req.width, req.height)),
            graph: crate::platform::graph(),
            device: crate::mlx::default_device(),
        })
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn checkpoint(&self, component: &str) -> Result<Checkpoint, Error> {
        held_checkpoint(
            &self.source,
            component,
            self.dtype,
            self.residency,
            &self.adapters,
        )
    }

    pub fn load_text_encoder(&self) -> Result<Qwen3Encoder, Error> {
        Ok(Qwen3Encoder::new(
            &self.configs.text_encoder,
            self.checkpoint("text_encoder")?,
        )?)
    }

    pub fn load_transformer(&self) -> Result<ZImageTransformer, Error> {
        Ok(ZImageTransformer::new(
            &self.configs.transformer,
            self.checkpoint("transformer")?,
        )?)
    }

    pub fn load_vae(&self) -> Result<VaeDecoder, Error> {
        Ok(VaeDecoder::new(&self.configs.vae, self.checkpoint("vae")?)?)
    }

    /// The ControlNet set with [`Pipeline::set_controlnet`], loaded for the model's transformer.
    pub fn load_controlnet(&self) -> Result<ControlNet, Error> {
        let loader = self
            .controlnet
            .as_ref()
            .ok_or_else(|| Error::Request("no ControlNet is set".into()))?;
        loader
            .load(control::LoadAs {
                dit: &self.configs.transformer,
                dtype: self.dtype,
                residency: self.residency,
            })
            .map_err(|cause| Error::Source {
                model: loader.name(),
                cause,
            })
    }

    pub fn load_vae_encoder(&self) -> Result<VaeEncoder, Error> {
        Ok(VaeEncoder::new(&self.configs.vae, self.checkpoint("vae")?)?)
    }

    /// Token ids of the templated prompt.
    pub fn token_ids(&self, prompt: &str) -> Result<Vec<u32>, Error> {
        Ok(self.tokenizer.encode_prompt(prompt)?)
    }

    /// Checks a request against the model, before any weights load.
    pub fn validate(&self, req: &Request) -> Result<(), Error> {
        check_request_ranges(req)?;
        let cell = 2 * self.configs.vae.scale_factor() as u32;
        if !req.width.is_multiple_of(cell) || !req.height.is_multiple_of(cell) {
            return Err(Error::Request(format!(
                "width and height must be positive multiples of {cell}, got {}×{}",
                req.width, req.height
            )));
        }
        let lens = &self.configs.transformer.axes_lens;
        let (ht, wt) = (req.height / cell, req.width / cell);
        if ht as i32 > lens[1] || wt as i32 > lens[2] {
            return Err(Error::Request(format!(
                "{}×{} needs {ht}×{wt} patches, more than the model's position tables ({}×{})",
                req.width, req.height, lens[1], lens[2]
            )));
        }
        // Caption tokens take positions 1..=Lp on the first axis and image tokens Lp + 1,
        // with Lp the longest prompt's token count rounded up to the padding multiple.
        let tokens = self.request_shape(req)?.prompt_tokens;
        let multiple = models::transformer::SEQ_MULTI_OF as u32;
        let last = (tokens.div_ceil(multiple) * multiple + 1) as i32;
        if last >= lens[0] {
            return Err(Error::Request(format!(
                "the prompt needs {} caption positions, more than the model's `axes_lens[0]` {} holds; shorten the prompt",
                last + 1,
                lens[0]
            )));
        }
        if let Some(input) = &req.input {
            input.check(req.width, req.height).map_err(Error::Request)?;
            if let Some(e) = condition::no_step_error(req.steps, input.strength) {
                return Err(Error::Request(e));
            }
        }
        if let Some(noise) = &req.noise {
            let expected = self.latent_shape(req).iter().product::<i32>() as usize;
            if noise.len() != expected {
                return Err(Error::Request(format!(
                    "noise has {} values, {}×{} needs {:?} = {expected}",
                    noise.len(),
                    req.width,
                    req.height,
                    self.latent_shape(req)
                )));
            }
            if let Some(i) = noise.iter().position(|v| !v.is_finite()) {
                return Err(Error::Request(format!(
                    "noise value {i} is {}; initial latents must be finite",
                    noise[i]
                )));
            }
        }
        Ok(())
    }

    /// Checks a request's control input against the request and the ControlNet set, before any
    /// weights load.
    pub fn validate_control(&self, req: &Request, control: &ControlInput) -> Result<(), Error> {
        control
            .check(req.width, req.height)
            .map_err(Error::Request)?;
        let net = self.controlnet.as_ref().ok_or_else(|| {
            Error::Request(
                "--control needs --controlnet: a control image steers a ControlNet".into(),
            )
        })?;
        let Some(input) = &req.input else {
            return Ok(());
        };
        if input.mask.is_none() {
            return Err(Error::Request(
                "--control with --image needs --mask: a ControlNet repaints the masked part of a picture; it does not rework a whole one".into(),
            ));
        }
        if input.strength != 1.0 {
            return Err(Error::Request(format!(
                "--strength is {}; with --control the masked part is painted from pure noise (strength 1)",
                input.strength
            )));
        }
        let needs = 2 * self.configs.transformer.in_channels + 1;
        let reads = net.config().control_in_dim;
        if reads < needs {
            return Err(Error::Request(format!(
                "--controlnet `{}` is version {}, reading {reads} control channels; inpainting with --mask needs {needs} (a 2.x ControlNet)",
                net.name(),
                net.version()
            )));
        }
        Ok(())
    }

    /// How the denoiser lays out its latents.
    pub fn latent_format(&self) -> LatentFormat {
        let channels = self.configs.transformer.in_channels;
        LatentFormat::decoded_by("z-image", channels, &self.configs.vae)
    }

    /// Turns each step's preview on or off. The first time on, the preview map is read from
    /// the cache or fitted against the VAE (see [`crate::preview`]).
    pub fn set_previews(&mut self, on: bool) -> Result<(), Error> {
        if on && self.rgb_map.is_none() {
            let vae = match self.vae.take() {
                Some(v) => v,
                None => self.load_vae()?,
            };
            let map = preview_map(&self.source, &self.latent_format(), &vae);
            if self.keep_models {
                self.vae = Some(vae);
            }
            self.rgb_map = Some(map?);
        }
        self.previews = on;
        Ok(())
    }

    /// The fitted preview map, if previews were ever turned on.
    pub fn rgb_map(&self) -> Option<&RgbMap> {
        self.rgb_map.as_ref()
    }

    /// `[C, H/8, W/8]`.
    pub fn latent_shape(&self, req: &Request) -> [i32; 3] {
        let f = self.configs.vae.scale_factor() as u32;
        [
            self.configs.transformer.in_channels,
            (req.height / f) as i32,
            (req.width / f) as i32,
        ]
    }

    /// Runs the whole pipeline for one image.
    pub fn generate(
        &mut self,
        req: &Request,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Generated, Error> {
        self.generate_or_stop(req, &mut |p| {
            progress(p);
            ControlFlow::Continue(())
        })
    }

    /// The same, stopping at the next phase or step boundary when `progress` answers
    /// `Break` (a server whose client left): the run ends with [`Error::Stopped`], and the
    /// models kept between images stay kept.
    pub fn generate_or_stop(
        &mut self,
        req: &Request,
        progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
    ) -> Result<Generated, Error> {
        self.generate_controlled(req, None, progress)
    }

    /// [`Pipeline::generate_or_stop`] steered by `control` through the ControlNet set with
    /// [`Pipeline::set_controlnet`] (`None`: unsteered).
    pub fn generate_controlled(
        &mut self,
        req: &Request,
        control: Option<&ControlInput>,
        progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
    ) -> Result<Generated, Error> {
        self.validate(req)?;
        if let Some(c) = control {
            self.validate_control(req, c)?;
        }
        let mut phases = Vec::new();
        let cfg_on = req.guidance > 0.0;
        let stopped = |step: usize| Error::Stopped {
            step,
            total: req.steps,
        };

        // 1. Text: encode the prompt (and the negative one), then release the encoder.
        if progress(Progress::Phase("text")).is_break() {
            return Err(stopped(0));
        }
        let (caption, negative) = encode_prompts(
            &mut phases,
            req,
            cfg_on,
            || self.load_text_encoder(),
            |encoder, text| Ok(encoder.encode(&self.token_ids(text)?)?),
        )?;

        // 2. Encode the picture an image task starts from, or the control image (with a
        //    picture to repaint, that picture too), then release the encoder. An image task's
        //    latent is the generator's first draw and the noise the next; control images are
        //    encoded by their mode, drawing nothing.
        let mut generator = crate::torch_rng::Generator::new(req.seed);
        let (image_latents, control_latents) = if req.input.is_some() || control.is_some() {
            if progress(Progress::Phase("encode")).is_break() {
                return Err(stopped(0));
            }
            let encoded = measure(&mut phases, "encode", || {
                let encoder = self.load_vae_encoder()?;
                let size = (req.width, req.height);
                let tiling = self.tiling.as_ref();
                match (control, &req.input) {
                    (Some(c), input) => {
                        let latents =
                            control::control_latents(&encoder, c, input.as_ref(), size, tiling)?;
                        Ok::<_, Error>((None, Some(latents)))
                    }
                    (None, Some(input)) => {
                        let latents = condition::image_latents(
                            &encoder,
                            input,
                            size,
                            tiling,
                            &mut generator,
                        )?;
                        Ok((Some(latents), None))
                    }
                    (None, None) => Ok((None, None)),
                }
            })?;
            release_freed_memory();
            encoded
        } else {
            (None, None)
        };

        // 3. Denoise.
        if progress(Progress::Phase("denoise")).is_break() {
            return Err(stopped(0));
        }
        let mut control_seconds = None;
        let latents = measure(&mut phases, "denoise", || {
            let transformer = match self.transformer.take() {
                Some(t) => t,
                None => self.load_transformer()?,
            };
            let controlnet = match (&control_latents, self.controlnet_model.take()) {
                (None, kept) => kept,
                (Some(_), Some(net)) => Some(net),
                (Some(_), None) => Some(self.load_controlnet()?),
            };
            let shape = self.latent_shape(req);
            let noise = match &req.noise {
                Some(n) => n.clone(),
                None => generator
                    .randn(shape.iter().product::<i32>() as usize)
                    .map_err(Error::Request)?,
            };
            let noise = Array::from_slice(&noise, &shape)?;
            let schedule = Schedule::new(req.steps, self.configs.scheduler.shift);
            // The ControlNet inpaint pipeline paints from pure noise (its picture is an input).
            let first = match (&req.input, control) {
                (Some(i), None) => i.first_step(req.steps),
                _ => 0,
            };
            let (latents, inpaint) = match (&image_latents, &req.input) {
                (Some(image), Some(input)) => {
                    let start = condition::scale_noise(image, schedule.sigmas[first], &noise)?;
                    let inpaint = match &input.mask {
                        Some(mask) => Some(condition::Inpaint::new(
                            image.clone(),
                            noise,
                            mask,
                            req.width,
                            req.height,
                        )?),
                        None => None,
                    };
                    (start, inpaint)
                }
                _ => (noise, None),
            };
            // The caption's refined tokens and the RoPE tables are the same at every step.
            let positive = transformer.prepare(&shape, &caption)?;
            positive.eval()?;
            let negative_prepared = match &negative {
                Some(neg) => Some(transformer.prepare(&shape, neg)?),
                None => None,
            };
            if let Some(p) = &negative_prepared {
                p.eval()?;
            }
            let guidance = denoise::Guidance {
                positive: &positive,
                negative: negative_prepared.as_ref().map(|n| (n, req.guidance)),
                normalization: req.cfg_normalization,
                truncation: req.cfg_truncation,
            };
            let mut steering = match (&controlnet, &control_latents, control) {
                (Some(net), Some(latents), Some(c)) => Some(control::Control {
                    net,
                    latents: latents.clone(),
                    scale: c.scale,
                    seconds: 0.0,
                }),
                _ => None,
            };
            let out = denoise::denoise(
                &transformer,
                latents,
                &schedule,
                first,
                &guidance,
                steering.as_mut(),
                inpaint.as_ref(),
                self.rgb_map.as_ref().filter(|_| self.previews),
                progress,
            );
            control_seconds = steering.map(|s| s.seconds);
            if self.keep_models {
                self.transformer = Some(transformer);
                self.controlnet_model = controlnet;
            }
            out
        })?;
        let held = (caption, negative, image_latents, control_latents);
        to_decode(&latents, held, progress, stopped(req.steps))?;

        // 4. Decode and quantise.
        let rgb = measure(&mut phases, "decode", || {
            let vae = match self.vae.take() {
                Some(v) => v,
                None => self.load_vae()?,
            };
            let rgb = decode_to_rgb8(&vae, &latents, self.tiling.as_ref())?;
            if self.keep_models {
                self.vae = Some(vae);
            }
            Ok::<_, Error>(rgb)
        })?;
        Ok(Generated::decoded(
            rgb,
            req,
            phases,
            latents,
            control_seconds,
        ))
    }
}

/// The bounds every request must keep whatever the model: the same the command line checks
/// its flags against before loading anything.
pub fn check_request_ranges(req: &Request) -> Result<(), Error> {
    request_range_error(req.steps as u64, req.guidance, req.width, req.height)
        .or_else(|| cfg_truncation_error(req.cfg_truncation))
        .map_or(Ok(()), |e| Err(Error::Request(e)))
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
/// bounds. Steps, guidance, width and height are named as the command line's flags name them.
pub fn request_range_error(steps: u64, guidance: f32, width: u32, height: u32) -> Option<String> {
    request_range_error_in(steps, guidance, (width, height), 16)
}

/// The same for a model whose sides are multiples of `cell` pixels.
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
        if !(cell..=MAX_IMAGE_SIDE).contains(&v) || v % cell != 0 {
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
fn encode_prompts<E>(
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
fn to_decode<T>(
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
fn preview_map(
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

fn release_freed_memory() {
    mlx::memory::clear_cache();
    crate::platform::trim_freed_memory();
}

/// Runs `f` as one phase, recording its time and MLX's peak memory during it.
fn measure<T, E>(
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
    let streams = matches!(component, "transformer" | "text_encoder");
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
