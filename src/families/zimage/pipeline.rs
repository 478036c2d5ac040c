//! Z-Image's pipeline: its configs and tokenizer read once, the Qwen3 text encoder, the S3-DiT
//! transformer (steered by a ControlNet when one is set) and the VAE loaded per phase, and one
//! `generate` from a request to RGB pixels, as diffusers' `ZImagePipeline` computes it.

use super::control::{self, ControlNetLoader};
use super::controlnet::ControlNet;
use super::denoise;
use super::transformer::{DitConfig, ZImageTransformer};
use crate::memory_plan::{ModelSizes, RequestShape, TensorSize};
use crate::mlx::{Array, Dtype};
use crate::models::vae_tiling::Tiling;
use crate::models::{
    Checkpoint, Qwen3Config, Qwen3Encoder, Residency, VaeConfig, VaeDecoder, VaeEncoder,
};
use crate::pipeline::{
    cfg_truncation_error, component_sizes, condition, config_in, decode_to_rgb8, encode_prompts,
    held_checkpoint, load_adapters, measure, parse_config, preview_map, read_config,
    release_freed_memory, request_range_error_in, to_decode, ControlInput, Error, Generated,
    ModelSource, Progress, Request,
};
use crate::preview::{LatentFormat, RgbMap};
use crate::scheduler::{Schedule, SchedulerConfig};
use crate::text::PromptTokenizer;
use std::ops::ControlFlow;

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
        load_adapters(&self.source, None, specs, lenient, self.dtype)
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
        let c = &self.configs;
        ModelSizes {
            text_encoder: &sizes[0],
            transformer: &sizes[1],
            vae: &sizes[2],
            text_config: (&self.configs.text_encoder).into(),
            denoiser: super::denoiser(&c.transformer, &c.text_encoder, &c.vae),
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
        let cell = 2 * self.configs.vae.scale_factor() as u32;
        let size = (req.width, req.height);
        if let Some(e) = request_range_error_in(req.steps as u64, req.guidance, size, cell)
            .or_else(|| cfg_truncation_error(req.cfg_truncation))
        {
            return Err(Error::Request(e));
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
        let multiple = super::transformer::SEQ_MULTI_OF as u32;
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

/// Checks a Z-Image model's three configs together, as `generate` does before it loads
/// anything: each on its own, and the widths that join them.
pub fn check_configs(configs: &[(String, Vec<u8>)]) -> Result<(), String> {
    let text: Qwen3Config = config_in(configs, "text_encoder/config.json", Qwen3Config::validate)?;
    let vae: VaeConfig = config_in(configs, "vae/config.json", VaeConfig::validate)?;
    let dit: DitConfig = config_in(configs, "transformer/config.json", DitConfig::validate)?;
    if dit.cap_feat_dim != text.hidden_size {
        return Err(format!(
            "the transformer reads captions {} wide (`cap_feat_dim`), but the text encoder's `hidden_size` is {}",
            dit.cap_feat_dim, text.hidden_size
        ));
    }
    if dit.in_channels != vae.latent_channels {
        return Err(format!(
            "the transformer reads {} latent channels (`in_channels`), but the VAE's `latent_channels` is {}",
            dit.in_channels, vae.latent_channels
        ));
    }
    Ok(())
}
