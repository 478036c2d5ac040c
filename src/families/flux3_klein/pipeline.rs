//! Text → image and editing with FLUX.3 \[klein\]: Qwen3-VL's language model read at eight
//! depths over a window padded to a multiple of 80 rows (padding rows at position 1), the
//! flow-match Euler schedule with a constant shift, a flow map's target time per step (or
//! classifier-free guidance on a base model), denoising in FLUX.2's BatchNorm-normalised token
//! space, then the shared VAE decoder and, for one reference, the crop back to its own size.
//!
//! Mirrors diffusers 0.42.1's `Flux3DistilledAutoBlocks` / `Flux3AutoBlocks` without the prompt
//! upsampler (the FLUX.3 spec §2–8).

use super::configs::{self, Flux3Configs, PAD_MULTIPLE, TEXT_LAYERS};
use super::references::Prepared;
use super::transformer::{Flux3Transformer, Rope};
use crate::chat_template::ChatTemplate;
use crate::memory_plan::{ModelSizes, RequestShape, TensorSize};
use crate::mlx::{ops, Array, Dtype};
use crate::models::vae_tiling::Tiling;
use crate::models::{self, Checkpoint, Qwen3Encoder, Residency, VaeDecoder, VaeEncoder};
use crate::pipeline::core::Core;
use crate::pipeline::{
    measure, read_config, release_freed_memory, Error, Generated, ModelSource, Progress, Request,
    NO_TRUNCATION,
};
use crate::scheduler::Schedule;
use crate::text::PromptTokenizer;
use std::ops::ControlFlow;

/// The longest text window (diffusers' `max_sequence_length` default).
pub const MAX_SEQUENCE_LENGTH: usize = 8192;
/// The token the tokenizer pads with.
const PAD_TOKEN: &str = "<|endoftext|>";
/// The position every padding row of the text window has in the encoder, as in training.
const PAD_POSITION: i32 = 1;

/// The steps and guidance a request that names none runs with: a flow map's 16 steps without
/// guidance (1 is off), a base model's 50 with guidance 3.5 (diffusers' block defaults).
pub fn default_steps_and_guidance(flow_map: bool) -> (usize, f32) {
    match flow_map {
        true => (16, 1.0),
        false => (50, 3.5),
    }
}

/// The text window of a prompt of `real` tokens: rounded up to a multiple of 80, at most
/// [`MAX_SEQUENCE_LENGTH`].
pub fn window(real: usize) -> usize {
    (real.div_ceil(PAD_MULTIPLE) * PAD_MULTIPLE).clamp(PAD_MULTIPLE, MAX_SEQUENCE_LENGTH)
}

/// A FLUX.3 \[klein\] pipeline; the components load per phase.
pub struct Flux3Pipeline<S: ModelSource> {
    core: Core<S>,
    pub configs: Flux3Configs,
    tokenizer: PromptTokenizer,
    /// The processor's chat template; Qwen3-VL-Instruct's when the model ships none.
    template: Option<ChatTemplate>,
    pad_id: u32,
}

impl<S: ModelSource> Flux3Pipeline<S> {
    /// Reads the configs and the tokenizer and checks that the components fit each other.
    pub fn new(source: S, dtype: Dtype) -> Result<Flux3Pipeline<S>, Error> {
        let configs = Flux3Configs::read(&source)?;
        let read = |name: &str| {
            read_config(&source, &format!("tokenizer/{name}")).map_err(|e| e.to_string())
        };
        let tokenizer = PromptTokenizer::from_files(read)?;
        let template = ChatTemplate::from_files(read).map_err(|reason| Error::BadConfig {
            model: source.name(),
            path: "tokenizer".into(),
            reason,
        })?;
        let pad_id = tokenizer
            .token_id(PAD_TOKEN)
            .ok_or_else(|| Error::BadConfig {
                model: source.name(),
                path: "tokenizer".into(),
                reason: format!("has no `{PAD_TOKEN}` token to pad prompts with"),
            })?;
        Ok(Flux3Pipeline {
            core: Core::new(source, dtype),
            configs,
            tokenizer,
            template,
            pad_id,
        })
    }

    pub fn dtype(&self) -> Dtype {
        self.core.dtype
    }

    pub fn source(&self) -> &S {
        &self.core.source
    }

    /// The model's own LoRAs (a derived model's), then the files `specs` names, bound to its
    /// layers in the compute dtype; the transformer's layers also answer to BFL's names.
    pub fn load_adapters(
        &self,
        specs: &[crate::lora::LoraSpec],
        lenient: bool,
    ) -> Result<crate::lora::Adapters, Error> {
        let originals = Some(super::layout::original_linear as crate::lora::OriginalNames);
        self.core.load_adapters(originals, specs, lenient)
    }

    pub fn set_adapters(&mut self, adapters: crate::lora::Adapters) {
        self.core.adapters = adapters;
    }

    pub fn adapters(&self) -> &crate::lora::Adapters {
        &self.core.adapters
    }

    fn load<M>(
        &self,
        component: &str,
        make: impl FnOnce(Checkpoint) -> Result<M, models::ModelError>,
    ) -> Result<M, Error> {
        self.core.load(component, make)
    }

    /// Qwen3-VL's language model bound up to the deepest layer read.
    pub fn load_text_encoder(&self) -> Result<Qwen3Encoder, Error> {
        let layers = *TEXT_LAYERS.iter().max().expect("eight layers") as i32;
        self.load("text_encoder", |c| {
            Qwen3Encoder::with_layers(&self.configs.text_encoder, c, layers)
        })
    }

    pub fn load_transformer(&self) -> Result<Flux3Transformer, Error> {
        self.load("transformer", |c| {
            Flux3Transformer::new(&self.configs.transformer, c)
        })
    }

    pub fn load_vae_encoder(&self) -> Result<VaeEncoder, Error> {
        self.load("vae", |c| VaeEncoder::new(&self.configs.vae, c))
    }

    pub fn load_vae(&self) -> Result<VaeDecoder, Error> {
        self.load("vae", |c| VaeDecoder::new(&self.configs.vae, c))
    }

    /// The VAE's BatchNorm statistics as `(mean, sqrt(var + eps))`, `[C]` each, in the
    /// compute dtype.
    pub fn latent_statistics(&self) -> Result<(Array, Array), Error> {
        let eps = self.configs.vae.batch_norm_eps.expect("checked when read");
        (self.core).batch_norm_statistics(self.configs.transformer.in_channels, eps)
    }

    /// Token ids of the templated prompt (the model's template, else Qwen3-VL-Instruct's: no
    /// think block), cut to the longest window.
    pub fn token_ids(&self, prompt: &str) -> Result<Vec<u32>, Error> {
        let render = |p: &str| match &self.template {
            Some(t) => t.render_user(p).map_err(crate::text::Error::Encode),
            None => Ok(crate::text::chat_template(p)),
        };
        Ok(self
            .tokenizer
            .encode_templated(prompt, &render, MAX_SEQUENCE_LENGTH)?)
    }

    /// `[h4 | h8 | … | h32]` per row of the prompt's window: `[P, 8·hidden]`.
    pub fn prompt_embeds(&self, encoder: &Qwen3Encoder, prompt: &str) -> Result<Array, Error> {
        let ids = self.token_ids(prompt)?;
        let states = encoder.encode_padded_at(
            &ids,
            self.pad_id,
            window(ids.len()),
            &TEXT_LAYERS,
            PAD_POSITION,
        )?;
        Ok(ops::concatenate(&states.iter().collect::<Vec<_>>(), 1)?)
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

    /// Whether classifier-free guidance runs: on a base model at a scale other than 1.
    pub fn guided(&self, req: &Request) -> bool {
        !self.configs.transformer.flow_map && (req.guidance - 1.0).abs() > 1e-9
    }

    /// The schedule of `steps`: `linspace(1, 1/n, n)` shifted by the constant shift.
    pub fn schedule(&self, steps: usize) -> Schedule {
        configs::shifted_schedule(steps, self.configs.shift)
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
        let name = super::family().name();
        if let Some(input) = &req.input {
            let flag = if input.mask.is_some() {
                "--mask"
            } else {
                "--image"
            };
            return Err(Error::Request(format!(
                "{flag} is not available for {name} models (it edits from reference pictures, --ref)"
            )));
        }
        if req.cfg_truncation != NO_TRUNCATION || req.cfg_normalization {
            let flag = match req.cfg_normalization {
                true => "--cfg-normalization",
                false => "--cfg-truncation",
            };
            return Err(Error::Request(format!(
                "{flag} is not available for {name} models"
            )));
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

    /// Runs the whole pipeline for one image from text alone.
    pub fn generate(
        &mut self,
        req: &Request,
        progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
    ) -> Result<Generated, Error> {
        self.generate_from(req, &Prepared::default(), progress)
    }

    /// The same, editing from `references` (prepared with [`Prepared::new`]); the decoded
    /// picture is cropped to their crop box when they carry one.
    pub fn generate_from(
        &mut self,
        req: &Request,
        references: &Prepared,
        progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
    ) -> Result<Generated, Error> {
        self.validate(req)?;
        let mut phases = Vec::new();
        let stopped = |step: usize| Error::Stopped {
            step,
            total: req.steps,
        };
        let guided = self.guided(req);

        // 1. Text: the prompt (and the negative one), each over its own window.
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

        // 2. The references' tokens, clean, for every step.
        let (h, w) = self.grid(req);
        let mut grids = Vec::new();
        let ref_tokens = match references.pictures.is_empty() {
            true => None,
            false => {
                if progress(Progress::Phase("encode")).is_break() {
                    return Err(stopped(0));
                }
                let tokens = measure(&mut phases, "encode", || {
                    let encoder = self.load_vae_encoder()?;
                    let (tokens, g) = self.reference_tokens(&encoder, references)?;
                    grids = g;
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
            // Drawn in f32 whatever the compute dtype, as diffusers draws it.
            let noise = match &req.noise {
                Some(n) => n.clone(),
                None => crate::torch_rng::Generator::new(req.seed)
                    .randn((c * h * w) as usize)
                    .map_err(Error::Request)?,
            };
            let mut x = pack(&Array::from_slice(&noise, &[c, h, w])?)?.astype(self.core.dtype)?;
            let schedule = self.schedule(req.steps);
            let cfg = &self.configs.transformer;
            let ropes = |text: &Array| Rope::new(cfg, text.dim(0) as usize, (h, w), &grids);
            let rope = ropes(&prompt)?;
            let rope_neg = match &negative {
                Some(n) => Some(ropes(n)?),
                None => None,
            };
            let flow_map = cfg.flow_map;
            let _reuse = crate::platform::ReuseFreedMemory::start();
            for i in 0..schedule.steps() {
                let t = schedule.timesteps[i];
                // A flow map lands at the next step's time (0 after the last).
                let target =
                    flow_map.then(|| schedule.timesteps.get(i + 1).copied().unwrap_or(0.0));
                let refs = ref_tokens.as_ref();
                let mut v = transformer.forward(&x, (t, target), &prompt, refs, &rope)?;
                if let (Some(neg), Some(rope_neg)) = (&negative, &rope_neg) {
                    let v_neg = transformer.forward(&x, (t, target), neg, refs, rope_neg)?;
                    v = (&v_neg + ((&v - &v_neg)? * req.guidance)?)?;
                }
                x = euler_step(&x, &v, schedule.dt(i))?;
                x.eval()?;
                if progress(Progress::Step {
                    index: i + 1,
                    total: schedule.steps(),
                    preview: None,
                })
                .is_break()
                {
                    return Err(Error::Stopped {
                        step: i + 1,
                        total: schedule.steps(),
                    });
                }
            }
            Ok::<_, Error>(x)
        })?;
        let held = (prompt, negative, ref_tokens);
        crate::pipeline::to_decode(&latents, held, progress, stopped(req.steps))?;

        // 4. Un-normalise, unpatchify, decode, quantise, and crop back to a single reference.
        let rgb = measure(&mut phases, "decode", || {
            let vae = self.load_vae()?;
            let z = self.vae_latents(&latents, (h, w))?;
            crate::pipeline::decode_to_rgb8(&vae, &z, self.core.tiling.as_ref())
        })?;
        let mut generated = Generated::decoded(rgb, req, phases, latents, None);
        if let Some(crop) = references.crop {
            generated.rgb = crop.apply(&generated.rgb, generated.width);
            (generated.width, generated.height) = (crop.width, crop.height);
        }
        Ok(generated)
    }

    /// The references as the transformer reads them: each encoded (the VAE's mean),
    /// patchified, normalised and packed, concatenated `[R, 4C]`, with each one's token grid.
    pub fn reference_tokens(
        &self,
        encoder: &VaeEncoder,
        references: &Prepared,
    ) -> Result<(Array, Vec<(i32, i32)>), Error> {
        let (mean, std) = self.latent_statistics()?;
        let c4 = mean.dim(0);
        let (mean, std) = (mean.reshape(&[c4, 1, 1])?, std.reshape(&[c4, 1, 1])?);
        let mut tokens = Vec::new();
        let mut grids = Vec::new();
        for r in &references.pictures {
            let x = models::vae_encoder::image_to_array(&r.rgb, r.width, r.height)?;
            let moments = encoder.moments(&x)?;
            let z = models::vae_encoder::LatentDistribution::from_moments(&moments)?.mode()?;
            let p = ((patchify(&z)?.astype(self.core.dtype)? - &mean)? / &std)?;
            grids.push((p.dim(1), p.dim(2)));
            tokens.push(pack(&p)?);
        }
        Ok((
            ops::concatenate(&tokens.iter().collect::<Vec<_>>(), 0)?,
            grids,
        ))
    }

    /// Packed normalised latents `[N, 4C]` → the VAE's `[C, 2h, 2w]` (f32): the BatchNorm
    /// statistics undone in the latents' dtype, then the 2×2 patches unpacked.
    pub fn vae_latents(&self, latents: &Array, (h, w): (i32, i32)) -> Result<Array, Error> {
        let (mean, std) = self.latent_statistics()?;
        let c4 = latents.dim(1);
        let p = ((latents * std.astype(latents.dtype())?)? + mean.astype(latents.dtype())?)?;
        let c = c4 / 4;
        // Row n = i·w + j, feature c·4 + 2·dy + dx → [c, 2i + dy, 2j + dx].
        Ok(p.reshape(&[h, w, c, 2, 2])?
            .transpose(&[2, 0, 3, 1, 4])?
            .reshape(&[c, 2 * h, 2 * w])?
            .astype(Dtype::F32)?)
    }
}

/// What the memory plan reads of a FLUX.3 model and sets on it.
impl<S: ModelSource> Flux3Pipeline<S> {
    pub fn set_residency(&mut self, residency: Residency) {
        self.core.residency = residency;
    }

    pub fn set_tiling(&mut self, tiling: Option<Tiling>) {
        self.core.tiling = tiling;
    }

    pub fn can_stream(&self) -> bool {
        self.core.can_stream()
    }

    pub fn tensor_sizes(&self) -> Result<[Vec<TensorSize>; 3], Error> {
        self.core.tensor_sizes()
    }

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

    /// What `req` with `references` asks of memory apart from the model: the prompt's window
    /// (twice when guided) and the references' tokens beside the image's.
    pub fn request_shape(&self, req: &Request, references: &Prepared) -> RequestShape {
        let cell = self.cell();
        let tokens = |w: u32, h: u32| (w / cell) * (h / cell);
        let refs: u32 = (references.pictures.iter())
            .map(|r| tokens(r.width, r.height))
            .sum();
        let prompt_tokens = self
            .token_ids(&req.prompt)
            .map_or(PAD_MULTIPLE, |i| window(i.len()));
        RequestShape {
            width: req.width,
            height: req.height,
            prompt_tokens: prompt_tokens as u32,
            prompts: 1 + self.guided(req) as u32,
            reference_tokens: refs,
            compute_bytes: self.core.dtype.size_bytes() as u64,
            encodes: (references.pictures.iter().map(|r| (r.width, r.height)))
                .max_by_key(|&(w, h)| w as u64 * h as u64),
            graph: crate::platform::graph(),
            device: crate::mlx::default_device(),
        }
    }
}

pub use crate::pipeline::packing::pack;
use crate::pipeline::packing::{euler_step, patchify};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_rounds_up_to_multiples_of_80() {
        let cases = [
            (1, 80),
            (62, 80),
            (80, 80),
            (82, 160),
            (8190, 8192),
            (9000, 8192),
        ];
        for (real, rows) in cases {
            assert_eq!(window(real), rows, "{real}");
        }
    }
}
