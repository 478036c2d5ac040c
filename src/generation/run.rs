//! The one runner: a [`Job`] in, images with their metadata out. It settles what the job left
//! to the model (size, steps, guidance), plans the memory, binds LoRAs and the ControlNet,
//! makes each image of the batch from its own seed, runs the hires pass, and writes each PNG's
//! metadata; front ends only parse requests into jobs and encode what comes back.

use super::masked_area::MaskedArea;
use super::metadata::{self, ControlProvenance, HiresProvenance, Provenance};
use super::{plan_memory, Cancel, Engine, Error, Hires, Job, Progress};
use crate::generation_defaults::GenerationDefaults;
use crate::memory_plan::MemoryPlan;
use crate::pipeline::{self, ControlInput, ModelSource, PhaseReport, Pipeline, Request};
use crate::preview::Preview;
use std::ops::ControlFlow;
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
}

/// Forwards the pipeline's progress as the job's.
pub(super) struct Reporter<'a> {
    progress: &'a mut dyn FnMut(&Progress),
    started: Instant,
    images: usize,
    image: usize,
    phase: &'static str,
    preview: Option<Arc<Preview>>,
}

impl Reporter<'_> {
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
    pub(super) fn start_image(&mut self, image: usize) {
        self.image = image;
        self.preview = None;
    }

    pub(super) fn phase(&mut self, name: &'static str) {
        self.phase = name;
        self.report(0, 0);
    }

    pub(super) fn pipeline(&mut self, p: pipeline::Progress) {
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

/// One pass of one image: the request and the control input at its size.
struct Pass {
    /// An only-masked inpaint's cut-out, pasted back into each image made.
    area: Option<super::masked_area::MaskedArea>,
    req: Request,
    control: Option<ControlInput>,
}

/// Makes the job's images on `engine`, reporting to `progress`, stopping at the next step
/// boundary once `cancel` is set.
pub fn run(
    job: &Job,
    engine: &mut Engine,
    progress: &mut dyn FnMut(&Progress),
    cancel: &Cancel,
) -> Result<Outcome, Error> {
    job.check()?;
    let mut reporter = Reporter {
        progress,
        started: Instant::now(),
        images: job.count as usize,
        image: 1,
        phase: "load",
        preview: None,
    };
    reporter.phase("load");
    engine.load(&job.model)?;
    let dtype = engine.dtype();
    if let Some(klein) = engine.klein() {
        let load = reporter.started.elapsed();
        return super::klein::run(job, klein, dtype, &mut reporter, cancel, load);
    }
    if !job.references.is_empty() {
        let refused = crate::family::Family::ZImage.refuse(&[crate::family::Feature::References]);
        refused.map_err(Error::Request)?;
    }
    let loaded = engine.loaded();
    loaded.bind_loras(&job.loras, job.lora_lenient)?;
    if let Some(c) = &job.control {
        loaded.set_controlnet(&c.net)?;
    }
    let load = reporter.started.elapsed();

    let first = first_pass(job, &loaded.pipeline, &loaded.defaults)?;
    let pipeline = &mut loaded.pipeline;
    pipeline.set_previews(job.preview)?;
    let hires = match &job.hires {
        Some(h) => {
            let cell = 2 * pipeline.configs.vae.scale_factor() as u32;
            let validate = |r: &Request| pipeline.validate(r);
            Some(hires_request(job, h, cell, validate, &first.req)?)
        }
        None => None,
    };
    let first_plan = plan_memory(
        pipeline,
        &first.req,
        job.memory_limit.as_deref(),
        job.residency,
    )?;
    let hires_plan = match &hires {
        Some(r) => Some(plan_memory(
            pipeline,
            r,
            job.memory_limit.as_deref(),
            job.residency,
        )?),
        None => None,
    };
    let prompt_tokens = pipeline.token_ids(&job.prompt)?.len();
    let model_name = pipeline.source().name();
    let identity = pipeline.source().identity();
    let shift = pipeline.configs.scheduler.shift;

    let mut out = Vec::with_capacity(job.count as usize);
    let mut ends = BatchEnds::default();
    for (image, seed) in job.images() {
        reporter.start_image(image);
        let mut req = first.req.clone();
        req.seed = seed;
        let generated = run_pass(
            pipeline,
            &first_plan,
            &req,
            first.control.as_ref(),
            cancel,
            image,
            &mut |p| reporter.pipeline(p),
        );
        let Some(generated) = ends.pass(generated, cancel, seed, out.len())? else {
            if ends.stopped {
                break;
            }
            continue;
        };
        let mut phases = generated.phases;
        let mut steps_run = steps_run_of(&req);
        let mut control_seconds = generated.control_seconds;
        let (rgb, width, height, last_req, hires_from) = match (&hires, &job.hires, &hires_plan) {
            (Some(second), Some(h), Some(plan)) => {
                reporter.phase("hires");
                let first = (generated.rgb, generated.width, generated.height);
                let second = hires_input(first, second, seed)?;
                let refined = run_pass(pipeline, plan, &second, None, cancel, image, &mut |p| {
                    reporter.pipeline(p)
                });
                let Some(refined) = ends.pass(refined, cancel, seed, out.len())? else {
                    if ends.stopped {
                        break;
                    }
                    continue;
                };
                phases.extend(refined.phases);
                steps_run += steps_run_of(&second);
                control_seconds = control_seconds.or(refined.control_seconds);
                (
                    refined.rgb,
                    refined.width,
                    refined.height,
                    second,
                    Some(HiresProvenance::of(h, &req)),
                )
            }
            _ => (
                generated.rgb,
                generated.width,
                generated.height,
                req.clone(),
                None,
            ),
        };
        let rgb = match &first.area {
            Some(area) => area
                .paste(rgb, width, height)
                .ok_or_else(|| Error::Png("the inpainted area has the wrong size".into()))?,
            None => rgb,
        };
        let steered = ControlProvenance::of(pipeline, first.control.as_ref());
        let from = Provenance {
            model_name: &model_name,
            identity: &identity,
            dtype,
            noise_file: job.noise.as_deref(),
            loras: &pipeline.adapters().applied,
            shift,
            only_masked: first
                .area
                .as_ref()
                .and(job.input.as_ref().and_then(|i| i.only_masked)),
            references: &[],
        };
        // The metadata speaks of the request as asked: the first pass's size and schedule,
        // with the hires pass's settings beside them.
        let (infotext, json) =
            metadata::png_text_full(&req, &from, steered.as_ref(), hires_from.as_ref());
        let png = crate::image_out::encode_png(
            &rgb,
            width,
            height,
            &[
                (crate::image_out::PARAMETERS_KEY, &infotext),
                (crate::image_out::ZIMAGE_KEY, &json),
            ],
        )
        .map_err(Error::Png)?;
        out.push(Image {
            png,
            width,
            height,
            seed,
            steps: last_req.steps,
            steps_run,
            prompt_tokens,
            phases,
            control_seconds,
            infotext,
        });
    }
    let plan = match hires_plan {
        Some(p) if p.estimate.peak() > first_plan.estimate.peak() => p,
        _ => first_plan,
    };
    let controlnet_weights = match pipeline.controlnet() {
        Some(_) => {
            let sizes = pipeline.tensor_sizes()?;
            Some(
                pipeline
                    .model_sizes(&sizes)
                    .controlnet_weights(plan.residency, dtype.size_bytes() as u64),
            )
        }
        None => None,
    };
    Ok(Outcome {
        loras: pipeline.adapters().applied.clone(),
        controlnet_weights,
        ..ends.outcome(out, plan, load, model_name)
    })
}

/// How a batch's passes ended short: the seeds of the images skipped, and whether a stop
/// that keeps the finished images ended it.
#[derive(Default)]
pub(super) struct BatchEnds {
    pub(super) skipped: Vec<u64>,
    pub(super) stopped: bool,
}

impl BatchEnds {
    /// A pass's output; `None` when a skip dropped the image (seed `seed`) or a stop that keeps
    /// the `finished` images made before ended the batch. Any other stop or error is the job's.
    pub(super) fn pass<T>(
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
    pub(super) fn outcome(
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
        }
    }
}

/// Generates one pass with `plan`'s residency and tiling.
fn run_pass<S: ModelSource>(
    pipeline: &mut Pipeline<S>,
    plan: &MemoryPlan,
    req: &Request,
    control: Option<&ControlInput>,
    cancel: &Cancel,
    image: usize,
    progress: &mut dyn FnMut(pipeline::Progress),
) -> Result<pipeline::Generated, Error> {
    pipeline.set_residency(plan.residency);
    pipeline.set_tiling(plan.tiling);
    if let Some(limit) = plan.cache_limit {
        crate::mlx::memory::set_cache_limit(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    pipeline
        .generate_controlled(req, control, &mut |p| {
            progress(p);
            if cancel.stops_image() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .map_err(|e| match e {
            pipeline::Error::Stopped { step, total } => Error::Stopped { image, step, total },
            other => other.into(),
        })
}

/// The denoising steps a request runs: image input skips the schedule's first ones.
pub(super) fn steps_run_of(req: &Request) -> usize {
    let skipped = req.input.as_ref().map_or(0, |i| i.first_step(req.steps));
    (req.steps - skipped).max(1)
}

/// The job's first (or only) pass as a request: the size, steps and guidance it left to the
/// model settled, the input picture and control image at that size, all checked.
fn first_pass<S: ModelSource>(
    job: &Job,
    pipeline: &Pipeline<S>,
    defaults: &GenerationDefaults,
) -> Result<Pass, Error> {
    let sample = pipeline.configs.vae.sample_size.unwrap_or(1024);
    // Without a size an input picture gives it, rounded as diffusers rounds it.
    let cell = 2 * pipeline.configs.vae.scale_factor() as u32;
    let given = (job.input.as_ref().map(|i| &i.picture)).or(job.control.as_ref().map(|c| &c.image));
    let (default_w, default_h) = match given {
        Some(p) => crate::image_in::default_size(p.image.width(), p.image.height(), cell)
            .ok_or_else(|| {
                Error::Request(format!(
                    "{} is {}×{}; a picture needs at least {cell} pixels each way",
                    p.label,
                    p.image.width(),
                    p.image.height()
                ))
            })?,
        None => (sample, sample),
    };
    // What the job leaves unsaid, the model's recorded defaults say (Turbo records none).
    let (steps, guidance, negative_prompt) =
        defaults.resolve(job.steps, job.guidance, job.negative_prompt.clone());
    let mut req = Request {
        prompt: job.prompt.clone(),
        negative_prompt,
        width: job.width.unwrap_or(default_w),
        height: job.height.unwrap_or(default_h),
        steps,
        guidance,
        cfg_normalization: (job.cfg_normalization)
            .or(defaults.cfg_normalization)
            .unwrap_or(false),
        cfg_truncation: (job.cfg_truncation)
            .or(defaults.cfg_truncation)
            .unwrap_or(pipeline::NO_TRUNCATION),
        seed: job.seed,
        noise: None,
        input: None,
    };
    pipeline.validate(&req)?;
    let mut area = None;
    if let Some(i) = &job.input {
        let strength = match i.mask.is_some() {
            true => pipeline::condition::DEFAULT_INPAINT_STRENGTH,
            false => pipeline::condition::DEFAULT_STRENGTH,
        };
        let (input, cut) = picture_input(i, (req.width, req.height), strength)?;
        req.input = Some(input);
        area = cut;
        pipeline.validate(&req)?;
    }
    if let Some(path) = &job.noise {
        req.noise = Some(super::noise::read(path, pipeline.latent_shape(&req))?);
        pipeline.validate(&req)?;
    }
    let control = job.control.as_ref().map(|c| ControlInput {
        rgb: crate::image_in::picture(&c.image.image, req.width, req.height).into_raw(),
        scale: c.scale,
    });
    if let Some(c) = &control {
        pipeline.validate_control(&req, c)?;
    }
    Ok(Pass { req, control, area })
}

/// The hires pass's request: image-to-image of the first picture (filled in per image) at the
/// scaled size, from the same seed.
pub(super) fn hires_request(
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
pub(super) fn picture_input(
    i: &super::PictureInput,
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
pub(super) fn hires_input(
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
