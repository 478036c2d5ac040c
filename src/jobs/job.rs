//! A generation job: everything one call produces, as plain data. The command line builds one
//! from its flags, each server API from its body, the page from its form; `crate::generation::run` makes
//! the images. [`Job::check`] is the one validation before anything loads, so a bad request gets
//! the same answer wherever it came from.

use super::error::Error;
use super::feature::Feature;
use super::source::ModelChoice;
use crate::models::Residency;
use crate::pipeline;
use crate::store::Store;
use std::path::PathBuf;

/// The most bytes a prompt (or negative prompt) may have. The model reads a prompt's first
/// 512 tokens, a few kilobytes of text; a longer one is refused rather than read, held by the
/// worker and recorded in every image's metadata.
pub const MAX_PROMPT_BYTES: usize = 64 << 10;
/// The most images one job makes.
pub const MAX_COUNT: u32 = 100;
/// The most pixels of padding around an only-masked area (A1111's slider stops at 256).
pub const MAX_MASKED_PADDING: u32 = 1024;
/// The padding around an only-masked area when a request names none (A1111's).
pub const DEFAULT_MASKED_PADDING: u32 = 32;
/// The hires pass's bounds on its scale.
pub const MIN_HIRES_SCALE: f32 = 1.0;
pub const MAX_HIRES_SCALE: f32 = 4.0;

/// Everything one generation request asks for; `None` fields take the model's defaults.
#[derive(Debug, Clone)]
pub struct Job {
    /// The model to draw with.
    pub model: ModelChoice,
    /// What to draw.
    pub prompt: String,
    /// Used only with guidance > 0.
    pub negative_prompt: Option<String>,
    /// `None`: from the input picture (rounded as diffusers rounds it), else the model's
    /// default size.
    pub width: Option<u32>,
    /// As `width`.
    pub height: Option<u32>,
    /// `None`: the model's default (Turbo's 8).
    pub steps: Option<usize>,
    /// `None`: the model's default (Turbo's 0).
    pub guidance: Option<f32>,
    /// With guidance, cap each step's guided prediction at the norm of the prompt's own
    /// (diffusers' `cfg_normalization`); `None`: the model's default (off).
    pub cfg_normalization: Option<bool>,
    /// With guidance, run unguided once the model time passes this, within [0, 1] (diffusers'
    /// `cfg_truncation`); `None`: the model's default (1, guided throughout).
    pub cfg_truncation: Option<f64>,
    /// True classifier-free guidance's scale: a second prediction from the negative prompt
    /// each step, beside a guidance-distilled model's embedded guidance; `None` (or 1): off.
    pub true_cfg: Option<f32>,
    /// Image k of the job is drawn from `seed + k`.
    pub seed: u64,
    /// How many images, each from the next seed.
    pub count: u32,
    /// Initial latents from a safetensors file instead of the seed.
    pub noise: Option<PathBuf>,
    /// The picture to start from (image-to-image, or inpainting with a mask).
    pub input: Option<PictureInput>,
    /// A control image and the ControlNet that steers the denoise with it.
    pub control: Option<ControlJob>,
    /// LoRAs applied on top of the model's own, for this job.
    pub loras: Vec<crate::lora::LoraSpec>,
    /// Skip LoRA keys that name no layer of the model instead of refusing the file.
    pub lora_lenient: bool,
    /// The memory budget (`12GB`); `None`: `ZIMAGE_MEMORY_LIMIT`, else most of the machine.
    pub memory_limit: Option<String>,
    /// How weights are held; `None`: the memory plan chooses.
    pub residency: Option<Residency>,
    /// A second pass at a larger size (generate, upscale, refine).
    pub hires: Option<Hires>,
    /// Pictures the model edits from (references, in order, for a family that takes them);
    /// without a size
    /// the output takes the first one's.
    pub references: Vec<Picture>,
    /// Report each step's latents as a small picture ([`super::progress::Progress::preview`]).
    pub preview: bool,
}

/// A decoded picture, with what the request called it (`--image \`a.png\``, `field \`image\``)
/// for messages.
#[derive(Debug, Clone)]
pub struct Picture {
    /// The decoded pixels.
    pub image: image::DynamicImage,
    /// What the request called it, for messages.
    pub label: String,
}

/// An image-to-image or inpaint input.
#[derive(Debug, Clone)]
pub struct PictureInput {
    /// The picture to start from.
    pub picture: Picture,
    /// White repaints, black keeps.
    pub mask: Option<Picture>,
    /// `None`: 0.6 for image-to-image, 1.0 for inpainting.
    pub strength: Option<f64>,
    /// Inpaint the masked area alone, with this many pixels around it, at the image's full
    /// size, and paste it back (A1111's "only masked"); `None`: the whole picture.
    pub only_masked: Option<u32>,
}

/// A control image and the ControlNet it steers.
#[derive(Debug, Clone)]
pub struct ControlJob {
    /// The ControlNet.
    pub net: ControlNetChoice,
    /// The control image (edges, depth, pose …) it reads.
    pub image: Picture,
    /// How strongly its hints count.
    pub scale: f32,
}

/// A hires pass: the first image upscaled `scale` times in pixel space (Lanczos-3), then
/// reworked by image-to-image at that size.
#[derive(Debug, Clone, PartialEq)]
pub struct Hires {
    /// How many times larger the second pass is, each way.
    pub scale: f32,
    /// How far the upscaled picture is taken back toward noise, in (0, 1].
    pub strength: f64,
    /// The second pass's schedule length; `None`: the first pass's. As in image-to-image,
    /// only the last `steps × strength` of them run.
    pub steps: Option<usize>,
}

impl Hires {
    /// The hires strength when a request names none (A1111's default).
    pub const DEFAULT_STRENGTH: f64 = 0.7;

    /// The second pass's size for a first pass of `width`×`height`: each side scaled and
    /// rounded down to a multiple of `cell`.
    pub fn size(&self, width: u32, height: u32, cell: u32) -> (u32, u32) {
        let side = |s: u32| ((s as f64 * self.scale as f64) as u32 / cell * cell).max(cell);
        (side(width), side(height))
    }
}

impl Job {
    /// The batch's images, numbered from 1, each with its seed: the job's seed, then one more
    /// per image.
    pub fn images(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..self.count as usize).map(|k| (k + 1, self.seed.wrapping_add(k as u64)))
    }

    /// The options of this job that only some model families take.
    pub fn features(&self) -> Vec<Feature> {
        // A front end that sends every field (the page) sends the value that changes nothing.
        let truncated = self
            .cfg_truncation
            .is_some_and(|t| t != pipeline::NO_TRUNCATION);
        let used = [
            (Feature::ControlNet, self.control.is_some()),
            (Feature::CfgTruncation, truncated),
            (
                Feature::CfgNormalization,
                self.cfg_normalization == Some(true),
            ),
            (Feature::TrueCfg, self.true_cfg.is_some_and(|s| s != 1.0)),
            (Feature::References, !self.references.is_empty()),
            // A mask comes with a picture: the mask is the option to name first.
            (
                Feature::Mask,
                self.input.as_ref().is_some_and(|i| i.mask.is_some()),
            ),
            (Feature::ImageInput, self.input.is_some()),
            (Feature::Hires, self.hires.is_some()),
        ];
        (used.into_iter())
            .filter_map(|(f, used)| used.then_some(f))
            .collect()
    }

    /// The references' count and sizes, which need no model.
    fn check_references(&self) -> Result<(), Error> {
        let max = pipeline::reference::MAX_REFERENCES;
        if self.references.len() > max {
            return Err(Error::Request(format!(
                "{} reference pictures given; a model takes at most {max}",
                self.references.len()
            )));
        }
        for p in &self.references {
            let (w, h) = (p.image.width(), p.image.height());
            pipeline::reference::Reference::check_size(w, h, &p.label).map_err(Error::Request)?;
        }
        Ok(())
    }

    /// A text → image job of one image with every setting left to the model.
    pub fn new(model: ModelChoice, prompt: impl Into<String>) -> Job {
        Job {
            model,
            prompt: prompt.into(),
            negative_prompt: None,
            width: None,
            height: None,
            steps: None,
            guidance: None,
            cfg_normalization: None,
            cfg_truncation: None,
            true_cfg: None,
            seed: 42,
            count: 1,
            noise: None,
            input: None,
            control: None,
            loras: Vec::new(),
            lora_lenient: false,
            memory_limit: None,
            residency: None,
            hires: None,
            references: Vec::new(),
            preview: false,
        }
    }

    /// Checks every bound and combination that needs no model, before anything loads. A
    /// setting left to the model is checked once the model is read.
    pub fn check(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Request(m));
        let prompts = [
            ("--prompt", Some(&self.prompt)),
            ("--negative", self.negative_prompt.as_ref()),
        ];
        for (flag, text) in prompts {
            if let Some(len) = text.map(String::len).filter(|&n| n > MAX_PROMPT_BYTES) {
                return bad(format!(
                    "{flag} is {len} bytes; a prompt may have at most {MAX_PROMPT_BYTES} (the model reads its first {} tokens)",
                    crate::text::MAX_SEQUENCE_LENGTH
                ));
            }
        }
        // Sides are checked against their bounds here and against the model's own token cell
        // once the model is read (its family's pipeline checks them).
        let side = |v: Option<u32>| v.unwrap_or(1);
        if let Some(e) = pipeline::request_range_error_in(
            self.steps.unwrap_or(1) as u64,
            self.guidance.unwrap_or(0.0),
            (side(self.width), side(self.height)),
            1,
        ) {
            return bad(e);
        }
        if let Some(e) = self.cfg_truncation.and_then(pipeline::cfg_truncation_error) {
            return bad(e);
        }
        if !(1..=MAX_COUNT).contains(&self.count) {
            return bad(format!(
                "--count is {}; it must be within 1..={MAX_COUNT}",
                self.count
            ));
        }
        if let Some(limit) = &self.memory_limit {
            crate::memory_plan::parse_size(limit)
                .map_err(|e| Error::Budget(format!("--memory-limit: {e}")))?;
        }
        if let Some(input) = &self.input {
            if let Some(s) = input.strength {
                if !crate::number::within(s, crate::number::above(0.0, 1.0)) {
                    return bad(format!("--strength is {s}; it must be within (0, 1]"));
                }
            }
            if let Some(mask) = &input.mask {
                let (p, m) = (&input.picture, mask);
                if (m.image.width(), m.image.height()) != (p.image.width(), p.image.height()) {
                    return bad(format!(
                        "{} is {}×{}, but {} is {}×{}; give a mask of the picture's size",
                        m.label,
                        m.image.width(),
                        m.image.height(),
                        p.label,
                        p.image.width(),
                        p.image.height()
                    ));
                }
            }
        }
        if let Some(padding) = self.input.as_ref().and_then(|i| i.only_masked) {
            if self.input.as_ref().is_some_and(|i| i.mask.is_none()) {
                return bad(
                    "--only-masked needs --mask: it inpaints the area the mask marks".into(),
                );
            }
            if padding > MAX_MASKED_PADDING {
                return bad(format!(
                    "--only-masked padding is {padding} pixels; it must be at most {MAX_MASKED_PADDING}"
                ));
            }
            if self.control.is_some() || self.hires.is_some() {
                return bad("--only-masked inpaints a cut-out of the picture; it takes no --control or --hires-scale".into());
            }
        }
        if let Some(c) = &self.control {
            if let Some(e) = pipeline::control::scale_error(c.scale) {
                return bad(e);
            }
            match &self.input {
                Some(i) if i.mask.is_none() => return bad(
                    "--control with --image needs --mask: a ControlNet repaints the masked part of a picture; it does not rework a whole one".into(),
                ),
                _ => {}
            }
        }
        self.check_references()?;
        if let Some(h) = &self.hires {
            let scales = crate::number::above(MIN_HIRES_SCALE.into(), MAX_HIRES_SCALE.into());
            if !crate::number::within(h.scale, scales) {
                return bad(format!(
                    "--hires-scale is {}; it must be within ({MIN_HIRES_SCALE}, {MAX_HIRES_SCALE}]",
                    h.scale
                ));
            }
            if !crate::number::within(h.strength, crate::number::above(0.0, 1.0)) {
                return bad(format!(
                    "--hires-strength is {}; it must be within (0, 1]",
                    h.strength
                ));
            }
            if let Some(e) = h.steps.and_then(|s| {
                pipeline::request_range_error_in(s as u64, 0.0, (1, 1), 1)
                    .map(|e| e.replace("--steps", "--hires-steps"))
            }) {
                return bad(e);
            }
            if self.noise.is_some() {
                return bad("--hires-scale with --noise: the second pass draws its noise from the seed; leave one out".into());
            }
        }
        Ok(())
    }
}

/// The ControlNet a job names.
#[derive(Debug, Clone)]
pub enum ControlNetChoice {
    /// A diffusers directory or a published single file (the command line allows paths).
    Path(PathBuf),
    /// A ControlNet in `store`, by name.
    Stored {
        /// The store holding it.
        store: Store,
        /// Its name there.
        name: String,
    },
}

impl ControlNetChoice {
    /// What tells one ControlNet from another, for keeping it set between jobs.
    pub fn key(&self) -> String {
        match self {
            ControlNetChoice::Path(p) => format!("path:{}", p.display()),
            ControlNetChoice::Stored { store, name } => {
                format!("stored:{}:{name}", store.root.display())
            }
        }
    }
}
