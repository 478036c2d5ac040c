//! Text → image with FLUX.2 \[klein\]: Qwen3's hidden states after layers 9, 18 and 27 over the
//! padded prompt, the flow-match Euler schedule shifted by the empirical μ, denoising in
//! BatchNorm-normalised token space (with classifier-free guidance on base models), then the
//! BatchNorm un-normalise, unpatchify and the shared VAE decoder.
//!
//! Mirrors diffusers 0.42.1 `Flux2KleinPipeline.__call__` (klein-spec §2–8). The phases, their
//! reports and the stop points are the Z-Image pipeline's; only the steps inside differ.

use super::configs::{self, TEXT_LAYERS};
use super::transformer::{Flux2Config, Flux2Transformer};
use crate::families::Feature;
use crate::memory_plan::{ModelSizes, RequestShape, TensorSize};
use crate::mlx::{self, ops, Array, Dtype};
use crate::models::vae_tiling::Tiling;
use crate::models::{
    self, Checkpoint, Qwen3Config, Qwen3Encoder, Residency, VaeConfig, VaeDecoder, VaeEncoder,
};
use crate::pipeline::core::Core;
use crate::pipeline::reference::{Reference, MAX_REFERENCES};
use crate::pipeline::{
    measure, parse_config, read_config, release_freed_memory, Error, Generated, ModelSource,
    Progress, Request, NO_TRUNCATION,
};
use crate::preview::{LatentFormat, RgbMap, StepPreviews};
use crate::scheduler::{empirical_mu, Schedule, SchedulerConfig};
use crate::text::PromptTokenizer;
use std::ops::ControlFlow;

/// The text length the transformer reads: every prompt is padded (or cut) to it.
pub const MAX_SEQUENCE_LENGTH: usize = 512;
/// The token the tokenizer pads with.
const PAD_TOKEN: &str = "<|endoftext|>";

/// The steps and guidance a request that names none runs with: a distilled model's 4 steps
/// without guidance (1 is off), a base model's 50 with guidance 4 (diffusers' defaults and the
/// model cards').
pub fn default_steps_and_guidance(is_distilled: bool) -> (usize, f32) {
    match is_distilled {
        true => (4, 1.0),
        false => (50, 4.0),
    }
}

/// The steps and guidance a klein model in `source` runs with when neither the request nor the
/// model's recorded defaults name them, and whether it is distilled.
pub fn family_defaults(source: &(impl ModelSource + ?Sized)) -> Option<(usize, f32, bool)> {
    let bytes = read_config(source, "model_index.json").ok()??;
    let distilled = is_distilled(&serde_json::from_slice(&bytes).ok()?);
    let (steps, guidance) = default_steps_and_guidance(distilled);
    Some((steps, guidance, distilled))
}

/// Whether a `model_index.json` says the model is step-wise distilled (absent: a base model).
pub fn is_distilled(model_index: &serde_json::Value) -> bool {
    model_index["is_distilled"].as_bool().unwrap_or(false)
}

/// A klein model's configuration, read once from its json files.
pub struct KleinConfigs {
    pub text_encoder: Qwen3Config,
    pub transformer: Flux2Config,
    pub vae: VaeConfig,
    pub scheduler: SchedulerConfig,
    /// Step-wise distilled: guidance is ignored (`model_index.json` `is_distilled`).
    pub is_distilled: bool,
}

/// A klein pipeline; the components load per phase.
pub struct KleinPipeline<S: ModelSource> {
    core: Core<S>,
    pub configs: KleinConfigs,
    tokenizer: PromptTokenizer,
    pad_id: u32,
    /// The latents → RGB map each step's preview is drawn with, once fitted.
    rgb_map: Option<RgbMap>,
    /// Whether steps report previews.
    previews: bool,
}

impl<S: ModelSource> KleinPipeline<S> {
    /// Reads the configs and the tokenizer and checks that the components fit each other.
    pub fn new(source: S, dtype: Dtype) -> Result<KleinPipeline<S>, Error> {
        let index: serde_json::Value =
            parse_config(&source, "model_index.json", |_: &serde_json::Value| Ok(()))?;
        let configs = KleinConfigs {
            text_encoder: parse_config(&source, "text_encoder/config.json", Qwen3Config::validate)?,
            transformer: parse_config(&source, "transformer/config.json", Flux2Config::validate)?,
            vae: parse_config(&source, "vae/config.json", VaeConfig::validate)?,
            scheduler: parse_config(&source, "scheduler/scheduler_config.json", |s| {
                SchedulerConfig::validate_dynamic(s)
            })?,
            is_distilled: is_distilled(&index),
        };
        let bad = |path: &str, reason: String| Error::BadConfig {
            model: source.name(),
            path: path.into(),
            reason,
        };
        let (t, e, v) = (&configs.transformer, &configs.text_encoder, &configs.vae);
        configs::check_configs(e, t, v).map_err(|(path, reason)| bad(path, reason))?;
        let tokenizer = PromptTokenizer::from_files(|name| {
            read_config(&source, &format!("tokenizer/{name}")).map_err(|e| e.to_string())
        })?;
        let pad_id = tokenizer.token_id(PAD_TOKEN).ok_or_else(|| {
            bad(
                "tokenizer",
                format!("has no `{PAD_TOKEN}` token to pad prompts with"),
            )
        })?;
        Ok(KleinPipeline {
            core: Core::new(source, dtype),
            configs,
            tokenizer,
            pad_id,
            rgb_map: None,
            previews: false,
        })
    }

    pub fn dtype(&self) -> Dtype {
        self.core.dtype
    }

    pub fn source(&self) -> &S {
        &self.core.source
    }

    /// klein's own LoRAs (a derived model's), then the files `specs` names, bound to its
    /// layers in the compute dtype (see [`crate::pipeline::load_adapters`]).
    pub fn load_adapters(
        &self,
        specs: &[crate::lora::LoraSpec],
        lenient: bool,
    ) -> Result<crate::lora::Adapters, Error> {
        let originals = Some(super::layout::original_linear as crate::lora::OriginalNames);
        self.core.load_adapters(originals, specs, lenient)
    }

    /// Applies these LoRA pairs from the next image on.
    pub fn set_adapters(&mut self, adapters: crate::lora::Adapters) {
        self.core.adapters = adapters;
    }

    /// The LoRAs bound, for the image's metadata.
    pub fn adapters(&self) -> &crate::lora::Adapters {
        &self.core.adapters
    }

    /// A component's model, made from its checkpoint.
    fn load<M>(
        &self,
        component: &str,
        make: impl FnOnce(Checkpoint) -> Result<M, models::ModelError>,
    ) -> Result<M, Error> {
        self.core.load(component, make)
    }

    /// Qwen3 bound up to the deepest layer klein reads.
    pub fn load_text_encoder(&self) -> Result<Qwen3Encoder, Error> {
        let layers = *TEXT_LAYERS.iter().max().expect("three layers") as i32;
        self.load("text_encoder", |c| {
            Qwen3Encoder::with_layers(&self.configs.text_encoder, c, layers)
        })
    }

    pub fn load_transformer(&self) -> Result<Flux2Transformer, Error> {
        self.load("transformer", |c| {
            Flux2Transformer::new(&self.configs.transformer, c)
        })
    }

    /// The VAE's encoder, for reference pictures and the picture an inpaint starts from.
    pub fn load_vae_encoder(&self) -> Result<VaeEncoder, Error> {
        self.load("vae", |c| VaeEncoder::new(&self.configs.vae, c))
    }

    /// The VAE's decoder.
    pub fn load_vae(&self) -> Result<VaeDecoder, Error> {
        self.load("vae", |c| VaeDecoder::new(&self.configs.vae, c))
    }

    /// The VAE's BatchNorm statistics as `(mean, sqrt(var + eps))`, `[C]` each, in the
    /// compute dtype (the square root taken there, as the reference does with its buffers).
    pub fn latent_statistics(&self) -> Result<(Array, Array), Error> {
        let eps = self.configs.vae.batch_norm_eps.expect("checked when read");
        (self.core).batch_norm_statistics(self.configs.transformer.in_channels, eps)
    }

    /// Token ids of the templated prompt, cut to the text length.
    pub fn token_ids(&self, prompt: &str) -> Result<Vec<u32>, Error> {
        Ok(self.tokenizer.encode_templated(
            prompt,
            &|p| Ok(crate::text::chat_template_no_thinking(p)),
            MAX_SEQUENCE_LENGTH,
        )?)
    }

    /// `[h9 | h18 | h27]` per row of the padded prompt: `[512, 3·hidden]`.
    pub fn prompt_embeds(&self, encoder: &Qwen3Encoder, prompt: &str) -> Result<Array, Error> {
        let ids = self.token_ids(prompt)?;
        let states = encoder.encode_padded(&ids, self.pad_id, MAX_SEQUENCE_LENGTH, &TEXT_LAYERS)?;
        Ok(ops::concatenate(&states.iter().collect::<Vec<_>>(), 1)?)
    }

    /// The latents a preview is drawn from: the VAE's own `[C, 2h, 2w]` (the tokens' BatchNorm
    /// undone and their 2×2 patches unpacked, both exact and cheap), so that the map is fitted
    /// on the VAE's channels at its scale rather than four times as many at twice it.
    pub fn latent_format(&self) -> LatentFormat {
        let vae = &self.configs.vae;
        LatentFormat::decoded_by("flux2", vae.latent_channels, vae)
    }

    /// Turns each step's preview on or off, fitting (or reading from the cache) the map the
    /// first time.
    pub fn set_previews(&mut self, on: bool) -> Result<(), Error> {
        if on && self.rgb_map.is_none() {
            let map = crate::pipeline::preview_map(
                &self.core.source,
                &self.latent_format(),
                &self.load_vae()?,
            );
            self.rgb_map = Some(map?);
        }
        self.previews = on;
        Ok(())
    }

    /// Pixels per token along each side: the VAE's scale times the 2×2 packing.
    pub fn cell(&self) -> u32 {
        2 * self.configs.vae.scale_factor() as u32
    }

    /// The token grid `(h, w)` of an output size.
    pub fn grid(&self, req: &Request) -> (i32, i32) {
        let cell = self.cell();
        ((req.height / cell) as i32, (req.width / cell) as i32)
    }

    /// Whether classifier-free guidance runs: above 1, on a base model.
    pub fn guided(&self, req: &Request) -> bool {
        req.guidance > 1.0 && !self.configs.is_distilled
    }

    /// Checks a request against the model, before any weights load.
    pub fn validate(&self, req: &Request) -> Result<(), Error> {
        let cell = self.cell();
        let size = (req.width, req.height);
        if let Some(e) =
            crate::pipeline::request_range_error_in(req.steps as u64, req.guidance, size, cell)
        {
            return Err(Error::Request(e));
        }
        let mut used = Vec::new();
        if req.cfg_truncation != NO_TRUNCATION {
            used.push(Feature::CfgTruncation);
        }
        if req.cfg_normalization {
            used.push(Feature::CfgNormalization);
        }
        super::family().refuse(&used).map_err(Error::Request)?;
        if let Some(input) = &req.input {
            input.check(req.width, req.height).map_err(Error::Request)?;
            if let Some(e) = crate::pipeline::condition::no_step_error(req.steps, input.strength) {
                return Err(Error::Request(e));
            }
        }
        if let Some(noise) = &req.noise {
            let (h, w) = self.grid(req);
            let expected = (self.configs.transformer.in_channels * h * w) as usize;
            if noise.len() != expected {
                return Err(Error::Request(format!(
                    "noise has {} values, {}×{} needs {expected}",
                    noise.len(),
                    req.width,
                    req.height
                )));
            }
        }
        Ok(())
    }

    /// Runs the whole pipeline for one image, stopping at the next phase or step boundary when
    /// `progress` answers `Break`.
    pub fn generate(
        &mut self,
        req: &Request,
        progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
    ) -> Result<Generated, Error> {
        self.generate_from(req, &[], progress)
    }

    /// The same, editing from `references` (0 to [`MAX_REFERENCES`] pictures, prepared with
    /// [`Reference::prepare`]): their tokens join every step's input, clean, at positions
    /// `(10 + 10k, i, j, 0)` (klein-spec §4).
    pub fn generate_from(
        &mut self,
        req: &Request,
        references: &[Reference],
        progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
    ) -> Result<Generated, Error> {
        self.validate(req)?;
        if references.len() > MAX_REFERENCES {
            return Err(Error::Request(format!(
                "{} reference pictures given; FLUX.2 [klein] takes at most {MAX_REFERENCES}",
                references.len()
            )));
        }
        let mut phases = Vec::new();
        let stopped = |step: usize| Error::Stopped {
            step,
            total: req.steps,
        };
        let guided = self.guided(req);

        // 1. Text: the prompt (and the negative one) over all padded rows.
        if progress(Progress::Phase("text")).is_break() {
            return Err(stopped(0));
        }
        let (prompt, negative) = crate::pipeline::encode_prompts(
            &mut phases,
            req,
            guided,
            || self.load_text_encoder(),
            |encoder, text| self.prompt_embeds(encoder, text),
        )?;

        // 2. Encode the picture an image task starts from (itself the first reference) and the
        //    references, then release the encoder.
        let (h, w) = self.grid(req);
        let mut ref_grids = Vec::new();
        let mut image = None;
        let ref_tokens = match (references.is_empty(), &req.input) {
            (true, None) => None,
            _ => {
                if progress(Progress::Phase("encode")).is_break() {
                    return Err(stopped(0));
                }
                let tokens = measure(&mut phases, "encode", || {
                    let encoder = self.load_vae_encoder()?;
                    let mut parts = Vec::new();
                    if let Some(input) = &req.input {
                        let (x0, mask) =
                            self.image_condition(&encoder, input, (req.width, req.height))?;
                        ref_grids.push((h, w));
                        parts.push(x0.clone());
                        image = Some((x0, mask, input.first_step(req.steps)));
                    }
                    if !references.is_empty() {
                        let (tokens, grids) = self.reference_tokens(&encoder, references)?;
                        ref_grids.extend(grids);
                        parts.push(tokens);
                    }
                    let tokens = ops::concatenate(&parts.iter().collect::<Vec<_>>(), 0)?;
                    tokens.eval()?;
                    Ok::<_, Error>(tokens)
                })?;
                release_freed_memory();
                Some(tokens)
            }
        };

        // 3. Denoise in normalised token space.
        if progress(Progress::Phase("denoise")).is_break() {
            return Err(stopped(0));
        }
        let c = self.configs.transformer.in_channels;
        let latents = measure(&mut phases, "denoise", || {
            let transformer = self.load_transformer()?;
            let noise = match &req.noise {
                Some(n) => n.clone(),
                None => crate::torch_rng::Generator::new(req.seed)
                    .randn((c * h * w) as usize)
                    .map_err(Error::Request)?,
            };
            let noise = pack(&Array::from_slice(&noise, &[c, h, w])?)?.astype(self.core.dtype)?;
            let schedule =
                Schedule::exponential(req.steps, empirical_mu((h * w) as usize, req.steps));
            // An image task starts part-way, from the picture noised to that step's level.
            let first = image.as_ref().map_or(0, |(_, _, first)| *first);
            let mut x = match &image {
                Some((x0, _, _)) => noised(x0, &noise, schedule.sigmas[first])?,
                None => noise.clone(),
            };
            let inpaint = image
                .as_ref()
                .filter(|_| req.input.as_ref().is_some_and(|i| i.mask.is_some()));
            let ids = super::rope::ids(MAX_SEQUENCE_LENGTH, (h, w), &ref_grids);
            let cfg = &self.configs.transformer;
            let rope = super::rope::tables(&ids, &cfg.axes_dims_rope, cfg.rope_theta)?;
            let statistics = match self.previews {
                true => Some(self.latent_statistics()?),
                false => None,
            };
            let mut previews = (self.rgb_map.as_ref())
                .filter(|_| self.previews)
                .map(StepPreviews::new);
            let _reuse = crate::platform::ReuseFreedMemory::start();
            for i in first..schedule.steps() {
                let t = schedule.timesteps[i];
                let tokens = match &ref_tokens {
                    Some(r) => ops::concatenate(&[&x, &r.astype(x.dtype())?], 0)?,
                    None => x.clone(),
                };
                // Only the output rows are the velocity; the reference rows are context.
                let velocity = |text: &Array| {
                    transformer
                        .forward(&tokens, t, text, &rope)?
                        .slice_axis(0, 0, h * w)
                };
                let mut v = velocity(&prompt)?;
                if let Some(neg) = &negative {
                    let v_neg = velocity(neg)?;
                    v = (&v_neg + ((&v - &v_neg)? * req.guidance)?)?;
                }
                x = euler_step(&x, &v, schedule.dt(i))?;
                // Inpainting keeps the unmasked part: the picture at the next step's noise
                // level (clean after the last step) where the mask is 0.
                if let Some((x0, mask, _)) = inpaint {
                    let kept = match i + 1 < schedule.steps() {
                        true => noised(x0, &noise, schedule.sigmas[i + 1])?,
                        false => x0.clone(),
                    };
                    let mask = mask.astype(x.dtype())?;
                    x = ((((&mask * -1.0)? + 1.0)? * kept)? + (&mask * &x)?)?;
                }
                x.eval()?;
                let preview = match (previews.as_mut(), &statistics) {
                    (Some(p), Some(stats)) => {
                        p.step(i + 1 == schedule.steps(), || unpack(&x, (h, w), stats))?
                    }
                    _ => None,
                };
                // Counted as the Z-Image pipeline counts: the steps this image runs.
                let total = schedule.steps() - first;
                if progress(Progress::Step {
                    index: i + 1 - first,
                    total,
                    preview,
                })
                .is_break()
                {
                    return Err(Error::Stopped {
                        step: i + 1 - first,
                        total,
                    });
                }
            }
            Ok::<_, Error>(x)
        })?;
        let held = (prompt, negative, ref_tokens);
        crate::pipeline::to_decode(&latents, held, progress, stopped(req.steps))?;

        // 4. Un-normalise, unpatchify, decode and quantise.
        let rgb = measure(&mut phases, "decode", || {
            let vae = self.load_vae()?;
            let z = self.vae_latents(&latents, (h, w))?;
            crate::pipeline::decode_to_rgb8(&vae, &z, self.core.tiling.as_ref())
        })?;
        Ok(Generated::decoded(rgb, req, phases, latents, None))
    }

    /// The references as the transformer reads them: each encoded (the VAE's mean), patchified,
    /// normalised and packed, concatenated `[ΣN_k, 4C]`, with each one's token grid.
    pub fn reference_tokens(
        &self,
        encoder: &VaeEncoder,
        references: &[Reference],
    ) -> Result<(Array, Vec<(i32, i32)>), Error> {
        let (mean, std) = self.latent_statistics()?;
        let c4 = mean.dim(0);
        let (mean, std) = (mean.reshape(&[c4, 1, 1])?, std.reshape(&[c4, 1, 1])?);
        let mut tokens = Vec::new();
        let mut grids = Vec::new();
        for r in references {
            let p = self.normalised_latents(encoder, &r.rgb, (r.width, r.height), (&mean, &std))?;
            grids.push((p.dim(1), p.dim(2)));
            tokens.push(pack(&p)?);
        }
        let refs: Vec<&Array> = tokens.iter().collect();
        Ok((ops::concatenate(&refs, 0)?, grids))
    }

    /// A picture's latents in the denoiser's space: the encoder's mean, patchified and
    /// normalised by the BatchNorm statistics `(mean, std)` (each `[4C, 1, 1]`): `[4C, h, w]`.
    fn normalised_latents(
        &self,
        encoder: &VaeEncoder,
        rgb: &[u8],
        (width, height): (u32, u32),
        (mean, std): (&Array, &Array),
    ) -> Result<Array, Error> {
        let x = models::vae_encoder::image_to_array(rgb, width, height)?;
        let moments = encoder.moments(&x)?;
        let z = models::vae_encoder::LatentDistribution::from_moments(&moments)?.mode()?;
        Ok(((patchify(&z)?.astype(self.core.dtype)? - mean)? / std)?)
    }

    /// What an image task starts from, conditions on and keeps: the picture's packed latents
    /// `x0` `[N, 4C]`, which are also its first reference, and the token mask `[N, 1]` (1
    /// repaints; from the mean of each cell's centre 2×2 pixels, as diffusers' bilinear
    /// downsampling reads it; all 1 without a mask) (klein-spec §9).
    pub fn image_condition(
        &self,
        encoder: &VaeEncoder,
        input: &crate::pipeline::ImageInput,
        size: (u32, u32),
    ) -> Result<(Array, Array), Error> {
        let (mean, std) = self.latent_statistics()?;
        let c4 = mean.dim(0);
        let stats = (&mean.reshape(&[c4, 1, 1])?, &std.reshape(&[c4, 1, 1])?);
        let x0 = pack(&self.normalised_latents(encoder, &input.rgb, size, stats)?)?;
        let mask = token_mask(input.mask.as_deref(), size, self.cell());
        let n = mask.len() as i32;
        Ok((x0, Array::from_slice(&mask, &[n, 1])?))
    }

    /// Packed normalised latents `[N, 4C]` → the VAE's `[C, 2h, 2w]` (f32): the BatchNorm
    /// statistics undone in the latents' dtype, then the 2×2 patches unpacked (klein-spec §8.1).
    pub fn vae_latents(&self, latents: &Array, grid: (i32, i32)) -> Result<Array, Error> {
        Ok(unpack(latents, grid, &self.latent_statistics()?)?)
    }
}

/// Packed normalised latents `[h·w, 4C]` → `[C, 2h, 2w]` (f32), given the BatchNorm
/// statistics `(mean, std)`.
fn unpack(latents: &Array, (h, w): (i32, i32), (mean, std): &(Array, Array)) -> mlx::Result<Array> {
    let c4 = latents.dim(1);
    let p = ((latents * std.astype(latents.dtype())?)? + mean.astype(latents.dtype())?)?;
    let c = c4 / 4;
    // Row n = i·w + j, feature c·4 + 2·dy + dx → [c, 2i + dy, 2j + dx].
    p.reshape(&[h, w, c, 2, 2])?
        .transpose(&[2, 0, 3, 1, 4])?
        .reshape(&[c, 2 * h, 2 * w])?
        .astype(Dtype::F32)
}

/// What the memory plan reads of a klein model and sets on it.
impl<S: ModelSource> KleinPipeline<S> {
    /// Holds the weights in `residency` from the next load on.
    pub fn set_residency(&mut self, residency: Residency) {
        self.core.residency = residency;
    }

    /// Decodes in tiles from now on (`None`: whole).
    pub fn set_tiling(&mut self, tiling: Option<Tiling>) {
        self.core.tiling = tiling;
    }

    /// Whether the weights can stream ([`Residency::Streamed`]): mapped from a store, on the
    /// CPU.
    pub fn can_stream(&self) -> bool {
        self.core.can_stream()
    }

    /// The sizes of the model's tensors, per component.
    pub fn tensor_sizes(&self) -> Result<[Vec<TensorSize>; 3], Error> {
        self.core.tensor_sizes()
    }

    /// The model's sizes and configuration as the memory plan reads them.
    pub fn model_sizes<'a>(&'a self, sizes: &'a [Vec<TensorSize>; 3]) -> ModelSizes<'a> {
        ModelSizes {
            text_encoder: &sizes[0],
            transformer: &sizes[1],
            vae: &sizes[2],
            controlnet: &[],
            text_config: (&self.configs.text_encoder).into(),
            denoiser: super::denoiser(&self.configs.transformer, self.cell()),
            vae_config: &self.configs.vae,
        }
    }

    /// What `req` with `references` asks of memory apart from the model: every prompt at the
    /// padded length, twice when guided; the input picture's tokens (its first reference) and
    /// the references' beside the image's.
    pub fn request_shape(&self, req: &Request, references: &[Reference]) -> RequestShape {
        let cell = self.cell();
        let tokens = |w: u32, h: u32| (w / cell) * (h / cell);
        let input = req
            .input
            .as_ref()
            .map_or(0, |_| tokens(req.width, req.height));
        let refs: u32 = references.iter().map(|r| tokens(r.width, r.height)).sum();
        RequestShape {
            width: req.width,
            height: req.height,
            prompt_tokens: MAX_SEQUENCE_LENGTH as u32,
            prompts: 1 + self.guided(req) as u32,
            reference_tokens: input + refs,
            compute_bytes: self.core.dtype.size_bytes() as u64,
            encodes: (references.iter().map(|r| (r.width, r.height)))
                .chain(req.input.as_ref().map(|_| (req.width, req.height)))
                .max_by_key(|&(w, h)| w as u64 * h as u64),
            graph: crate::platform::graph(),
            device: crate::mlx::default_device(),
        }
    }
}

pub use crate::pipeline::packing::{euler_step, pack, patchify};

/// `σ·noise + (1 − σ)·x0`: the picture at noise level σ, as the scheduler's `scale_noise`.
fn noised(x0: &Array, noise: &Array, sigma: f32) -> mlx::Result<Array> {
    (noise * sigma)? + (x0 * (1.0 - sigma))?
}

/// The token mask of a `width × height` pixel mask (1 repaints), `cell` pixels a token: the
/// mean of each cell's centre 2×2 pixels; all 1 without a mask.
pub fn token_mask(mask: Option<&[u8]>, (width, height): (u32, u32), cell: u32) -> Vec<f32> {
    let (h, w) = (height / cell, width / cell);
    let Some(mask) = mask else {
        return vec![1.0; (h * w) as usize];
    };
    let c = cell / 2 - 1;
    let at = |y: u32, x: u32| mask[(y * width + x) as usize] as f32;
    (0..h)
        .flat_map(|i| (0..w).map(move |j| (i * cell + c, j * cell + c)))
        .map(|(y, x)| (at(y, x) + at(y, x + 1) + at(y + 1, x) + at(y + 1, x + 1)) / 4.0)
        .collect()
}
