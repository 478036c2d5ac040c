//! Text → image, Kontext editing, image-to-image and inpainting with FLUX.1: CLIP's pooled vector
//! and T5's padded rows as the prompt (each encoder let go once it has run), the flow-match
//! Euler schedule shifted by the line μ of the image's token count (\[dev\]) or not at all
//! (\[schnell\]), denoising in packed 2×2-patch token space with the guidance scale embedded
//! (guidance-distilled models) and, when asked, true classifier-free guidance, then the
//! unpack and the AutoencoderKL decode.
//!
//! Mirrors diffusers 0.42.1 `FluxPipeline`, `FluxKontextPipeline`, `FluxImg2ImgPipeline` and
//! `FluxInpaintPipeline` (flux1-spec §2–§10). The phases, their reports and the stop points are
//! those of every pipeline here.

use super::configs::{self, Flux1Configs, KONTEXT_CLASSES};
use super::transformer::{Flux1Config, Flux1Transformer};
use crate::clip_tokenizer::ClipTokenizer;
use crate::families::Feature;
use crate::memory_plan::{Denoiser, ModelSizes, RequestShape, TensorSize, TextShape};
use crate::mlx::{self, ops, Array, Dtype};
use crate::models::clip_text::{ClipTextConfig, ClipTextModel};
use crate::models::t5::{T5Config, T5Encoder};
use crate::models::vae_tiling::Tiling;
use crate::models::{self, Checkpoint, Residency, VaeConfig, VaeDecoder, VaeEncoder};
use crate::pipeline::core::Core;
use crate::pipeline::reference::Reference;
use crate::pipeline::{
    condition, measure, parse_config, read_config, release_freed_memory, Error, Generated,
    ModelSource, Progress, Request, NO_TRUNCATION,
};
use crate::preview::{LatentFormat, RgbMap, StepPreviews};
use crate::scheduler::SchedulerConfig;
use crate::t5_tokenizer::T5Tokenizer;
use std::ops::ControlFlow;

pub use crate::pipeline::packing::{euler_step, pack, patchify};

/// T5's window: 512 rows for a guidance-distilled model (\[dev\]'s and Kontext's default), 256
/// for \[schnell\] (its model card's; it has no guidance embedder to tell it by otherwise).
pub fn text_length(transformer: &Flux1Config) -> usize {
    match transformer.guidance_embeds {
        true => 512,
        false => 256,
    }
}

/// The steps and guidance a request that names none runs with: \[dev\]'s (and Kontext's) 28
/// steps at guidance 3.5, \[schnell\]'s 4 steps (it reads no guidance).
pub fn default_steps_and_guidance(transformer: &Flux1Config) -> (usize, f32) {
    match transformer.guidance_embeds {
        true => (28, 3.5),
        false => (4, 0.0),
    }
}

/// A prompt as the transformer reads it.
pub struct Prompt {
    /// CLIP's pooled vector `[P]`.
    pub pooled: Array,
    /// T5's rows `[T, J]`, padding rows included.
    pub rows: Array,
}

/// A FLUX.1 pipeline; the components load per phase.
pub struct Flux1Pipeline<S: ModelSource> {
    core: Core<S>,
    pub configs: Flux1Configs,
    clip_tokenizer: ClipTokenizer,
    t5_tokenizer: T5Tokenizer,
    /// True classifier-free guidance's scale (1: off).
    true_cfg: f32,
    /// The latents → RGB map each step's preview is drawn with, once fitted.
    rgb_map: Option<RgbMap>,
    /// Whether steps report previews.
    previews: bool,
}

impl<S: ModelSource> Flux1Pipeline<S> {
    /// Reads the configs and both tokenizers and checks that the components fit each other.
    pub fn new(source: S, dtype: Dtype) -> Result<Flux1Pipeline<S>, Error> {
        let index: serde_json::Value =
            parse_config(&source, "model_index.json", |_: &serde_json::Value| Ok(()))?;
        let class = index["_class_name"].as_str().unwrap_or_default();
        let configs = Flux1Configs {
            clip: parse_config(
                &source,
                "text_encoder/config.json",
                ClipTextConfig::validate,
            )?,
            t5: parse_config(&source, "text_encoder_2/config.json", T5Config::validate)?,
            transformer: parse_config(&source, "transformer/config.json", Flux1Config::validate)?,
            vae: parse_config(&source, "vae/config.json", VaeConfig::validate)?,
            scheduler: parse_config(
                &source,
                "scheduler/scheduler_config.json",
                SchedulerConfig::validate_shift_line,
            )?,
            kontext: KONTEXT_CLASSES.contains(&class),
        };
        let c = &configs;
        configs::check_configs(&c.clip, &c.t5, &c.transformer, &c.vae).map_err(
            |(path, reason)| Error::BadConfig {
                model: source.name(),
                path: path.into(),
                reason,
            },
        )?;
        let read = |dir: &'static str| {
            let source = &source;
            move |name: &str| {
                read_config(source, &format!("{dir}/{name}")).map_err(|e| e.to_string())
            }
        };
        let clip_tokenizer = ClipTokenizer::from_files(read("tokenizer"))?;
        let t5_tokenizer =
            T5Tokenizer::from_files(read("tokenizer_2"), text_length(&c.transformer))?;
        Ok(Flux1Pipeline {
            core: Core::new(source, dtype),
            configs,
            clip_tokenizer,
            t5_tokenizer,
            true_cfg: 1.0,
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

    /// The model's own LoRAs (a derived model's), then the files `specs` names, bound to its
    /// layers in the compute dtype (see [`crate::pipeline::load_adapters`]).
    pub fn load_adapters(
        &self,
        specs: &[crate::lora::LoraSpec],
        lenient: bool,
    ) -> Result<crate::lora::Adapters, Error> {
        self.core
            .load_adapters(super::original_names(), specs, lenient)
    }

    /// Applies these LoRA pairs from the next image on.
    pub fn set_adapters(&mut self, adapters: crate::lora::Adapters) {
        self.core.adapters = adapters;
    }

    /// The LoRAs bound, for the image's metadata.
    pub fn adapters(&self) -> &crate::lora::Adapters {
        &self.core.adapters
    }

    /// True classifier-free guidance at `scale` from the next image on (1: off); it runs when
    /// the request has a negative prompt.
    pub fn set_true_cfg(&mut self, scale: f32) {
        self.true_cfg = scale;
    }

    pub fn true_cfg(&self) -> f32 {
        self.true_cfg
    }

    fn load<M>(
        &self,
        component: &str,
        make: impl FnOnce(Checkpoint) -> Result<M, models::ModelError>,
    ) -> Result<M, Error> {
        self.core.load(component, make)
    }

    /// CLIP's text model (`text_encoder`).
    pub fn load_clip(&self) -> Result<ClipTextModel, Error> {
        self.load("text_encoder", |c| {
            ClipTextModel::new(&self.configs.clip, c)
        })
    }

    /// T5's encoder (`text_encoder_2`).
    pub fn load_t5(&self) -> Result<T5Encoder, Error> {
        self.load("text_encoder_2", |c| T5Encoder::new(&self.configs.t5, c))
    }

    pub fn load_transformer(&self) -> Result<Flux1Transformer, Error> {
        self.load("transformer", |c| {
            Flux1Transformer::new(&self.configs.transformer, c)
        })
    }

    /// The VAE's encoder, for the picture an image task starts from and Kontext's.
    pub fn load_vae_encoder(&self) -> Result<VaeEncoder, Error> {
        self.load("vae", |c| VaeEncoder::new(&self.configs.vae, c))
    }

    pub fn load_vae(&self) -> Result<VaeDecoder, Error> {
        self.load("vae", |c| VaeDecoder::new(&self.configs.vae, c))
    }

    /// CLIP's ids for `prompt`: start, pieces, end, padding to its window.
    pub fn clip_ids(&self, prompt: &str) -> Result<Vec<u32>, Error> {
        Ok(self.clip_tokenizer.encode(prompt)?)
    }

    /// T5's ids for `prompt`: pieces, `</s>`, padding to the model's text length.
    pub fn t5_ids(&self, prompt: &str) -> Result<Vec<u32>, Error> {
        Ok(self.t5_tokenizer.encode(prompt)?)
    }

    /// The pieces of `prompt` T5 reads (its real tokens, `</s>` included), for reports.
    pub fn prompt_tokens(&self, prompt: &str) -> Result<usize, Error> {
        let pad = self.t5_ids("")?.last().copied();
        let ids = self.t5_ids(prompt)?;
        Ok(ids
            .iter()
            .rposition(|&i| Some(i) != pad)
            .map_or(0, |p| p + 1))
    }

    /// The text phase: each prompt's pooled vector from CLIP, then its rows from T5, each
    /// encoder let go before the next loads (T5, the larger, gone before the denoise).
    fn encode_prompts(
        &self,
        prompts: &[&str],
        phases: &mut Vec<crate::pipeline::PhaseReport>,
    ) -> Result<Vec<Prompt>, Error> {
        let prompts = measure(phases, "text", || {
            let clip = self.load_clip()?;
            let pooled = (prompts.iter())
                .map(|p| Ok(clip.forward(&self.clip_ids(p)?)?.pooled))
                .collect::<Result<Vec<_>, Error>>()?;
            mlx::eval(&pooled.iter().collect::<Vec<_>>())?;
            drop(clip);
            release_freed_memory();
            let t5 = self.load_t5()?;
            let rows = (prompts.iter())
                .map(|p| Ok(t5.encode(&self.t5_ids(p)?)?))
                .collect::<Result<Vec<_>, Error>>()?;
            mlx::eval(&rows.iter().collect::<Vec<_>>())?;
            Ok::<_, Error>(
                (pooled.into_iter().zip(rows))
                    .map(|(pooled, rows)| Prompt { pooled, rows })
                    .collect(),
            )
        })?;
        release_freed_memory();
        Ok(prompts)
    }

    /// `prompt` as the transformer reads it (CLIP and T5 loaded for it alone).
    pub fn prompt(&self, prompt: &str) -> Result<Prompt, Error> {
        let mut phases = Vec::new();
        let mut p = self.encode_prompts(&[prompt], &mut phases)?;
        Ok(p.remove(0))
    }

    /// The latents a preview is drawn from: the VAE's own `[C, 2h, 2w]` (the tokens unpacked).
    pub fn latent_format(&self) -> LatentFormat {
        let vae = &self.configs.vae;
        LatentFormat::decoded_by("flux1", vae.latent_channels, vae)
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

    /// The VAE's latent channels.
    fn channels(&self) -> i32 {
        self.configs.vae.latent_channels
    }

    /// Whether true classifier-free guidance runs: a scale above 1 and a negative prompt.
    pub fn guided(&self, req: &Request) -> bool {
        self.true_cfg > 1.0 && req.negative_prompt.is_some()
    }

    /// The guidance scale the transformer embeds: the request's on a guidance-distilled
    /// model; none on \[schnell\], which has no embedder for it (diffusers ignores it too).
    pub fn embedded_guidance(&self, req: &Request) -> Option<f32> {
        self.configs
            .transformer
            .guidance_embeds
            .then_some(req.guidance)
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
        if !(self.true_cfg.is_finite() && self.true_cfg >= 1.0) {
            return Err(Error::Request(format!(
                "--true-cfg is {}; it must be a finite number of at least 1 (1 is off)",
                self.true_cfg
            )));
        }
        if self.true_cfg > 1.0 && req.negative_prompt.is_none() {
            return Err(Error::Request(
                "--true-cfg runs a second prediction from the negative prompt, and none was given; add --negative"
                    .into(),
            ));
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
            if let Some(e) = condition::no_step_error(req.steps, input.strength) {
                return Err(Error::Request(e));
            }
        }
        if let Some(noise) = &req.noise {
            let (h, w) = self.grid(req);
            let expected = (self.channels() * 4 * h * w) as usize;
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
        self.generate_from(req, None, progress)
    }

    /// The same, editing `reference` (Kontext's picture, prepared with
    /// [`super::kontext::prepare`]): its tokens join every step's input, clean, at positions
    /// `(1, i, j)` (flux1-spec §8).
    pub fn generate_from(
        &mut self,
        req: &Request,
        reference: Option<&Reference>,
        progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
    ) -> Result<Generated, Error> {
        self.validate(req)?;
        let mut phases = Vec::new();
        let stopped = |step: usize| Error::Stopped {
            step,
            total: req.steps,
        };
        let guided = self.guided(req);

        // 1. Text: the prompt (and the negative one), CLIP then T5.
        if progress(Progress::Phase("text")).is_break() {
            return Err(stopped(0));
        }
        let mut texts = vec![req.prompt.as_str()];
        if guided {
            texts.extend(req.negative_prompt.as_deref());
        }
        let mut prompts = self.encode_prompts(&texts, &mut phases)?.into_iter();
        let prompt = prompts.next().expect("one prompt encoded");
        let negative = prompts.next();

        // 2. Encode the picture an image task starts from (its latent the generator's first
        //    draw, the noise the next) or Kontext's (its mean, drawing nothing).
        let (h, w) = self.grid(req);
        let n = h * w;
        let mut generator = crate::torch_rng::Generator::new(req.seed);
        let mut image = None;
        let mut ref_tokens = None;
        if req.input.is_some() || reference.is_some() {
            if progress(Progress::Phase("encode")).is_break() {
                return Err(stopped(0));
            }
            measure(&mut phases, "encode", || {
                let encoder = self.load_vae_encoder()?;
                let tiling = self.core.tiling.as_ref();
                if let Some(input) = &req.input {
                    let size = (req.width, req.height);
                    let z =
                        condition::image_latents(&encoder, input, size, tiling, &mut generator)?;
                    let x0 = pack(&patchify(&z)?)?.astype(self.core.dtype)?;
                    let mask = match &input.mask {
                        Some(mask) => Some(self.token_mask(mask, size)?),
                        None => None,
                    };
                    x0.eval()?;
                    image = Some((x0, mask, input.first_step(req.steps)));
                }
                if let Some(r) = reference {
                    let tokens = self.reference_tokens(&encoder, r)?;
                    tokens.eval()?;
                    let grid = (
                        (r.height / self.cell()) as i32,
                        (r.width / self.cell()) as i32,
                    );
                    ref_tokens = Some((tokens, grid));
                }
                Ok::<_, Error>(())
            })?;
            release_freed_memory();
        }

        // 3. Denoise in packed token space.
        if progress(Progress::Phase("denoise")).is_break() {
            return Err(stopped(0));
        }
        let c = self.channels();
        let latents = measure(&mut phases, "denoise", || {
            let transformer = self.load_transformer()?;
            let noise = match &req.noise {
                Some(noise) => noise.clone(),
                None => generator
                    .randn((c * 4 * h * w) as usize)
                    .map_err(Error::Request)?,
            };
            let noise = Array::from_slice(&noise, &[c, 2 * h, 2 * w])?;
            let noise = pack(&patchify(&noise)?)?.astype(self.core.dtype)?;
            let schedule = self.configs.scheduler.line_schedule(req.steps, n as usize);
            // An image task starts part-way, from the picture noised to that step's level.
            let first = image.as_ref().map_or(0, |(_, _, first)| *first);
            let mut x = match &image {
                Some((x0, _, _)) => condition::scale_noise(x0, schedule.sigmas[first], &noise)?,
                None => noise.clone(),
            };
            let cfg = &self.configs.transformer;
            let ids = super::rope::ids(
                self.t5_tokenizer.length(),
                (h, w),
                ref_tokens.as_ref().map(|(_, grid)| *grid),
            );
            let rope = super::rope::tables(&ids, &cfg.axes_dims_rope)?;
            let guidance = self.embedded_guidance(req);
            let mut previews = (self.rgb_map.as_ref())
                .filter(|_| self.previews)
                .map(StepPreviews::new);
            let _reuse = crate::platform::ReuseFreedMemory::start();
            for i in first..schedule.steps() {
                let t = schedule.timesteps[i];
                let tokens = match &ref_tokens {
                    Some((r, _)) => ops::concatenate(&[&x, &r.astype(x.dtype())?], 0)?,
                    None => x.clone(),
                };
                // Only the output rows are the velocity; Kontext's rows are context.
                let velocity = |p: &Prompt| {
                    transformer
                        .forward(&tokens, t, guidance, &p.pooled, &p.rows, &rope)?
                        .slice_axis(0, 0, n)
                };
                let mut v = velocity(&prompt)?;
                if let Some(neg) = &negative {
                    let v_neg = velocity(neg)?;
                    v = (&v_neg + ((&v - &v_neg)? * self.true_cfg)?)?;
                }
                x = euler_step(&x, &v, schedule.dt(i))?;
                // Inpainting keeps the unmasked part: the picture at the next step's noise
                // level (clean after the last step) where the mask is 0.
                if let Some((x0, Some(mask), _)) = &image {
                    let kept = match i + 1 < schedule.steps() {
                        true => condition::scale_noise(x0, schedule.sigmas[i + 1], &noise)?,
                        false => x0.clone(),
                    };
                    let mask = mask.astype(x.dtype())?;
                    x = ((((&mask * -1.0)? + 1.0)? * kept)? + (&mask * &x)?)?;
                }
                x.eval()?;
                let preview = match previews.as_mut() {
                    Some(p) => p.step(i + 1 == schedule.steps(), || {
                        unpack(&x, (h, w))?.astype(Dtype::F32)
                    })?,
                    None => None,
                };
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
        let held = (prompt, negative, ref_tokens, image);
        crate::pipeline::to_decode(&latents, held, progress, stopped(req.steps))?;

        // 4. Unpack, decode and quantise.
        let rgb = measure(&mut phases, "decode", || {
            let vae = self.load_vae()?;
            let z = unpack(&latents, (h, w))?;
            crate::pipeline::decode_to_rgb8(&vae, &z, self.core.tiling.as_ref())
        })?;
        Ok(Generated::decoded(rgb, req, phases, latents, None))
    }

    /// Kontext's picture as the transformer reads it: encoded (the VAE's mean), scaled,
    /// patchified and packed, `[N_ref, 4C]` in the compute dtype.
    pub fn reference_tokens(&self, encoder: &VaeEncoder, r: &Reference) -> Result<Array, Error> {
        let x = models::vae_encoder::image_to_array(&r.rgb, r.width, r.height)?;
        let moments = encoder.moments(&x)?;
        let z = models::LatentDistribution::from_moments(&moments)?.mode()?;
        let z = condition::scaled(&z.astype(Dtype::F32)?, &self.configs.vae)?;
        Ok(pack(&patchify(&z)?)?.astype(self.core.dtype)?)
    }

    /// The inpainting mask on the tokens, `[N, 4C]`: each latent pixel takes the mask's pixel
    /// at `(s·i, s·j)` (nearest, `s` the VAE's scale), the same over its channels, then packed
    /// as the latents are (flux1-spec §9.2).
    pub fn token_mask(&self, mask: &[u8], (width, height): (u32, u32)) -> Result<Array, Error> {
        let (h, w) = (height / self.cell(), width / self.cell());
        let (lh, lw) = (2 * h as i32, 2 * w as i32);
        let grid = condition::mask_on_grid(mask, width, height, lh, lw);
        let values: Vec<f32> = grid.iter().map(|&m| f32::from(u8::from(m))).collect();
        let m = Array::from_slice(&values, &[1, lh, lw])?;
        let m = m.broadcast_to(&[self.channels(), lh, lw])?;
        Ok(pack(&patchify(&m)?)?)
    }
}

/// Packed latents `[h·w, 4C]` → the VAE's `[C, 2h, 2w]`, in their dtype.
pub fn unpack(latents: &Array, (h, w): (i32, i32)) -> mlx::Result<Array> {
    let c = latents.dim(1) / 4;
    // Row n = i·w + j, feature c·4 + 2·dy + dx → [c, 2i + dy, 2j + dx].
    latents
        .reshape(&[h, w, c, 2, 2])?
        .transpose(&[2, 0, 3, 1, 4])?
        .reshape(&[c, 2 * h, 2 * w])
}

/// The memory plan's figures of FLUX.1's transformer over `cell`-pixel tokens: T5's rows and
/// the image's (and a Kontext picture's) tokens, unpadded; the single block's fused
/// `[q k v | MLP]` projection and its `[attention | MLP]` output input as the widest products;
/// MLX's attention on both graphs; T5's rows and the reference tokens kept for every step.
pub fn denoiser(t: &Flux1Config, cell: u32) -> Denoiser {
    let (d, m) = (t.dim() as u64, t.mlp_dim() as u64);
    Denoiser {
        dim: d,
        heads: t.num_attention_heads as u64,
        wide_values: 3 * d + m + d + m,
        cell: cell as u64,
        pad_to: 1,
        text_layers: i32::MAX,
        text_outputs: 1,
        shim_attention: false,
        kept_per_text_token: t.joint_attention_dim as u64,
        kept_per_reference_token: t.in_channels as u64,
        widest_apart: None,
    }
}

/// T5's widths as the memory plan counts the text phase's activations: its gated MLP's two
/// inner projections (`wi_0`, `wi_1`) as Qwen's gate and up.
pub fn text_shape(t5: &T5Config) -> TextShape {
    TextShape {
        hidden: t5.d_model as u64,
        intermediate: t5.d_ff as u64,
        heads: t5.num_heads as u64,
        head_dim: t5.d_kv as u64,
    }
}

/// What the memory plan reads of a FLUX.1 model and sets on it.
impl<S: ModelSource> Flux1Pipeline<S> {
    /// Holds the weights in `residency` from the next load on.
    pub fn set_residency(&mut self, residency: Residency) {
        self.core.residency = residency;
    }

    /// Decodes in tiles from now on (`None`: whole).
    pub fn set_tiling(&mut self, tiling: Option<Tiling>) {
        self.core.tiling = tiling;
    }

    /// Whether the weights can stream: mapped from a store, on the CPU.
    pub fn can_stream(&self) -> bool {
        self.core.can_stream()
    }

    /// The sizes of the model's tensors: the text phase's (T5's, with CLIP's, which runs
    /// before it and is let go, counted beside it), the transformer's and the VAE's.
    pub fn tensor_sizes(&self) -> Result<[Vec<TensorSize>; 3], Error> {
        let source = &self.core.source;
        let sizes = |c: &str| {
            source.tensor_sizes(c).map_err(|e| Error::Source {
                model: source.name(),
                cause: e,
            })
        };
        let mut text = sizes("text_encoder_2")?;
        text.extend(sizes("text_encoder")?);
        Ok([text, sizes("transformer")?, sizes("vae")?])
    }

    /// The model's sizes and configuration as the memory plan reads them: T5 is the text
    /// phase's encoder ([`text_shape`]).
    pub fn model_sizes<'a>(&'a self, sizes: &'a [Vec<TensorSize>; 3]) -> ModelSizes<'a> {
        ModelSizes {
            text_encoder: &sizes[0],
            transformer: &sizes[1],
            vae: &sizes[2],
            controlnet: &[],
            text_config: text_shape(&self.configs.t5),
            denoiser: denoiser(&self.configs.transformer, self.cell()),
            vae_config: &self.configs.vae,
        }
    }

    /// What `req` (with Kontext's `reference`) asks of memory apart from the model: T5's
    /// padded rows, twice with true CFG; the picture's tokens beside the image's.
    pub fn request_shape(&self, req: &Request, reference: Option<&Reference>) -> RequestShape {
        let cell = self.cell();
        let tokens = |w: u32, h: u32| (w / cell) * (h / cell);
        RequestShape {
            width: req.width,
            height: req.height,
            prompt_tokens: self.t5_tokenizer.length() as u32,
            prompts: 1 + self.guided(req) as u32,
            reference_tokens: reference.map_or(0, |r| tokens(r.width, r.height)),
            compute_bytes: self.core.dtype.size_bytes() as u64,
            encodes: (reference.map(|r| (r.width, r.height)))
                .into_iter()
                .chain(req.input.as_ref().map(|_| (req.width, req.height)))
                .max_by_key(|&(w, h)| w as u64 * h as u64),
            graph: crate::platform::graph(),
            device: crate::mlx::default_device(),
        }
    }
}
