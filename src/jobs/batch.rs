//! What every family's runner shares: the images a job made and their outcome, progress
//! forwarded as the job's, how a batch ends short, and the hires pass and picture input as
//! requests.

use super::error::Error;
use super::job::{Hires, Job, PictureInput};
use super::masked_area::MaskedArea;
use super::progress::{Cancel, Progress};
use crate::memory_plan::{self, MemoryPlan, ModelSizes, RequestShape};
use crate::mlx::fast::Products;
use crate::models::Residency;
use crate::pipeline::{self, PhaseReport, Request};
use crate::preview::Preview;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One image a job made.
#[derive(Debug, Clone)]
pub struct Image {
    /// The PNG with its metadata (A1111 infotext and the request as JSON).
    pub png: Vec<u8>,
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
    /// The seed it was drawn from.
    pub seed: u64,
    /// The schedule's length (of the last pass).
    pub steps: usize,
    /// The denoising steps that ran, over every pass.
    pub steps_run: usize,
    /// The prompt's length in the text encoder's tokens.
    pub prompt_tokens: usize,
    /// Each phase's time and peak memory, the first pass's then the hires pass's.
    pub phases: Vec<PhaseReport>,
    /// Seconds the ControlNet's hints took over the denoise (`None` without control).
    pub control_seconds: Option<f64>,
    /// The A1111 infotext written into the PNG.
    pub infotext: String,
}

impl Image {
    /// The time of every phase called `phase`, over the passes.
    pub fn seconds(&self, phase: &str) -> Duration {
        Duration::from_secs_f64(
            self.phases
                .iter()
                .filter(|p| p.phase == phase)
                .map(|p| p.seconds)
                .sum(),
        )
    }
}

/// What a job made, and how.
#[derive(Debug)]
pub struct Outcome {
    /// The images made, one per seed not skipped.
    pub images: Vec<Image>,
    /// The seeds of the images skipped while they were made (A1111's skip), in order.
    pub skipped: Vec<u64>,
    /// The job was stopped with [`Cancel::stop_keeping_finished`] after these images; the rest
    /// of its count was not made.
    pub stopped: bool,
    /// The plan of the job's largest pass.
    pub plan: MemoryPlan,
    /// Time spent loading the model's configs and binding LoRAs (zero when all was loaded).
    pub load: Duration,
    /// The model's name as shown.
    pub model_name: String,
    /// The LoRAs applied, with the keys `lora_lenient` skipped.
    pub loras: Vec<crate::lora::Applied>,
    /// The ControlNet's weights the denoise estimate holds, when one steers.
    pub controlnet_weights: Option<u64>,
    /// What the job asked that the model does not read, each a line for the user.
    pub notes: Vec<String>,
}

/// Forwards the pipeline's progress as the job's.
pub struct Reporter<'a> {
    progress: &'a mut dyn FnMut(&Progress),
    started: Instant,
    images: usize,
    image: usize,
    phase: &'static str,
    preview: Option<Arc<Preview>>,
}

impl<'a> Reporter<'a> {
    /// A reporter of a batch of `images`, starting on the first, its clock started now.
    pub fn new(progress: &'a mut dyn FnMut(&Progress), images: usize) -> Reporter<'a> {
        Reporter {
            progress,
            started: Instant::now(),
            images,
            image: 1,
            phase: "load",
            preview: None,
        }
    }

    /// Time since the job started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn report(&mut self, step: usize, steps: usize) {
        (self.progress)(&Progress {
            preview: self.preview.clone(),
            image: self.image,
            images: self.images,
            phase: self.phase,
            step,
            steps,
            elapsed: self.started.elapsed(),
        })
    }

    /// Reports on image `image` of the batch from here on, without the last one's preview.
    pub fn start_image(&mut self, image: usize) {
        self.image = image;
        self.preview = None;
    }

    pub fn phase(&mut self, name: &'static str) {
        self.phase = name;
        self.report(0, 0);
    }

    pub fn pipeline(&mut self, p: pipeline::Progress) {
        match p {
            pipeline::Progress::Phase(name) => self.phase(name),
            pipeline::Progress::Step {
                index,
                total,
                preview,
            } => {
                if let Some(p) = preview {
                    self.preview = Some(Arc::new(p));
                }
                self.report(index, total)
            }
        }
    }
}

/// How a batch's passes ended short: the seeds of the images skipped, and whether a stop
/// that keeps the finished images ended it.
#[derive(Default)]
pub struct BatchEnds {
    pub skipped: Vec<u64>,
    pub stopped: bool,
}

impl BatchEnds {
    /// A pass's output; `None` when a skip dropped the image (seed `seed`) or a stop that keeps
    /// the `finished` images made before ended the batch. Any other stop or error is the job's.
    pub fn pass<T>(
        &mut self,
        result: Result<T, Error>,
        cancel: &Cancel,
        seed: u64,
        finished: usize,
    ) -> Result<Option<T>, Error> {
        match result {
            Ok(made) => Ok(Some(made)),
            Err(Error::Stopped { .. }) if cancel.take_skip() => {
                self.skipped.push(seed);
                Ok(None)
            }
            Err(Error::Stopped { .. }) if cancel.keeps_finished() && finished > 0 => {
                self.stopped = true;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The job's outcome: its `images` and how the batch ended, with no LoRA or ControlNet.
    pub fn outcome(
        self,
        images: Vec<Image>,
        plan: MemoryPlan,
        load: Duration,
        model_name: String,
    ) -> Outcome {
        Outcome {
            images,
            skipped: self.skipped,
            stopped: self.stopped,
            plan,
            load,
            model_name,
            loras: Vec::new(),
            controlnet_weights: None,
            notes: Vec::new(),
        }
    }
}

/// The denoising steps a request runs: image input skips the schedule's first ones.
pub fn steps_run_of(req: &Request) -> usize {
    let skipped = req.input.as_ref().map_or(0, |i| i.first_step(req.steps));
    (req.steps - skipped).max(1)
}

/// The hires pass's request: image-to-image of the first picture (filled in per image) at the
/// scaled size, from the same seed.
pub fn hires_request(
    job: &Job,
    hires: &Hires,
    cell: u32,
    validate: impl Fn(&Request) -> Result<(), pipeline::Error>,
    first: &Request,
) -> Result<Request, Error> {
    if job.input.as_ref().is_some_and(|i| i.mask.is_some()) || job.control.is_some() {
        return Err(Error::Request(
            "--hires-scale works on text → image and image-to-image; inpainting and ControlNet jobs have no hires pass".into(),
        ));
    }
    let (width, height) = hires.size(first.width, first.height, cell);
    let req = Request {
        width,
        height,
        steps: hires.steps.unwrap_or(first.steps),
        noise: None,
        input: Some(pipeline::ImageInput {
            // A placeholder of the right size, so the request checks; each image's first
            // pass replaces it.
            rgb: vec![0; width as usize * height as usize * 3],
            mask: None,
            strength: hires.strength,
        }),
        ..first.clone()
    };
    validate(&req).map_err(|e| match e {
        pipeline::Error::Request(m) => Error::Request(format!("the hires pass: {m}")),
        other => other.into(),
    })?;
    Ok(req)
}

/// An image task's input at `width`×`height`: the picture (Lanczos-3) and its binarised mask,
/// at the job's strength or `default_strength`; with `--only-masked`, the area around the mask
/// cut out and scaled to that size instead, with the cut-out to paste the result back with.
pub fn picture_input(
    i: &PictureInput,
    (width, height): (u32, u32),
    default_strength: f64,
) -> Result<(pipeline::ImageInput, Option<MaskedArea>), Error> {
    let rgb = crate::image_in::picture(&i.picture.image, width, height);
    let mask = (i.mask.as_ref()).map(|m| crate::image_in::mask(&m.image, width, height));
    let (rgb, mask, area) = match (i.only_masked, mask) {
        (Some(padding), Some(mask)) => {
            let cut = MaskedArea::new(rgb, mask, padding, (width, height))
                .map_err(|e| Error::Request(format!("--only-masked: {e}")))?;
            let (rgb, mask) = cut.input(width, height);
            (rgb, Some(mask), Some(cut))
        }
        (_, mask) => (rgb.into_raw(), mask, None),
    };
    let strength = i.strength.unwrap_or(default_strength);
    let input = pipeline::ImageInput {
        rgb,
        mask,
        strength,
    };
    Ok((input, area))
}

/// The hires pass of one image: `second` (from [`hires_request`]) with `seed`, starting from
/// the first pass's picture (RGB bytes, width, height) scaled to its size.
pub fn hires_input(
    (rgb, width, height): (Vec<u8>, u32, u32),
    second: &Request,
    seed: u64,
) -> Result<Request, Error> {
    let mut second = Request {
        seed,
        ..second.clone()
    };
    let picture = image::RgbImage::from_raw(width, height, rgb)
        .ok_or_else(|| Error::Png("the first pass's picture has the wrong size".into()))?;
    let picture = image::DynamicImage::ImageRgb8(picture);
    if let Some(input) = second.input.as_mut() {
        input.rgb = crate::image_in::picture(&picture, second.width, second.height).into_raw();
    }
    Ok(second)
}

/// Checks that a request of `shape` on a model of `model`'s sizes fits the memory budget
/// (`limit`, else `ZIMAGE_MEMORY_LIMIT`, else most of the machine) and chooses how to hold the
/// weights and decode; `residency` overrides the choice of how weights are held.
pub fn plan_for(
    model: &ModelSizes,
    shape: &RequestShape,
    can_stream: bool,
    limit: Option<&str>,
    residency: Option<Residency>,
) -> Result<MemoryPlan, Error> {
    // bf16 products read bf16 weights as they are: widening them first gains nothing.
    let residency = residency.or_else(|| {
        (Products::for_process() == Products::Bf16).then_some(match can_stream {
            true => Residency::Streamed,
            false => Residency::Stored,
        })
    });
    let (budget, source) = memory_plan::budget(limit).map_err(Error::Budget)?;
    let base = crate::platform::held_before_loading();
    let mut plan = model.plan(shape, budget, &source, base, can_stream)?;
    if let Some(residency) = residency.filter(|r| *r != plan.residency) {
        plan.residency = residency;
        plan.estimate = model.estimate(shape, residency, plan.tiling.as_ref(), base);
        plan.cache_limit = model.cache_limit(shape, &plan.estimate, budget);
    }
    Ok(plan)
}
