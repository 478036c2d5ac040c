//! FLUX.2 \[klein\]'s runner: the model's defaults for what the job leaves unsaid, the
//! references prepared at the model's token cell, one image per seed, and the same PNG metadata
//! as every other image. Options klein lacks were refused by name before any weights loaded.

use super::pipeline::{self as klein, KleinPipeline};
use crate::jobs::batch::{self, BatchEnds, Image, Outcome, Reporter};
use crate::jobs::error::Error;
use crate::jobs::job::Job;
use crate::jobs::job::Picture;
use crate::jobs::loaded::{Held, LoadedModel};
use crate::jobs::masked_area::MaskedArea;
use crate::jobs::metadata::{self, Provenance};
use crate::jobs::progress::Cancel;
use crate::jobs::source::Source;
use crate::memory_plan::MemoryPlan;
use crate::pipeline::reference::{capped_size, Reference, MAX_REFERENCES};
use crate::pipeline::{self, ModelSource, Request};
use std::ops::ControlFlow;

/// A loaded klein model: its pipeline, its defaults and its LoRAs.
pub type Loaded = Held<KleinPipeline<Source>>;

impl Loaded {
    fn bind(&mut self, specs: &[crate::lora::LoraSpec], lenient: bool) -> Result<(), Error> {
        let (load, set) = (KleinPipeline::load_adapters, KleinPipeline::set_adapters);
        (self.loras).bind(&mut self.pipeline, (specs, lenient), load, set)
    }
}

impl LoadedModel for Loaded {
    fn source(&self) -> &Source {
        self.pipeline.source()
    }

    fn run(&mut self, job: &Job, report: &mut Reporter, cancel: &Cancel) -> Result<Outcome, Error> {
        let load = report.elapsed();
        run(job, self, report, cancel, load)
    }
}

/// The job's references prepared as klein reads them, each refusal naming its picture.
fn references(job: &Job, klein: &Loaded) -> Result<Vec<Reference>, Error> {
    if job.references.len() > MAX_REFERENCES {
        return Err(Error::Request(format!(
            "{} reference pictures given; {} takes at most {MAX_REFERENCES}",
            job.references.len(),
            super::family().name()
        )));
    }
    let cell = klein.pipeline.cell();
    (job.references.iter())
        .map(|p| Reference::prepare(&p.image, cell, &p.label).map_err(Error::Request))
        .collect()
}

/// The strength an image task runs at when the job names none (diffusers' klein inpainting
/// default, for image-to-image too).
const DEFAULT_STRENGTH: f64 = 0.8;

/// The size of an image task's output: the picture's, scaled to at most 1024² pixels and
/// floored to whole tokens (klein-spec §9.1).
fn picture_size(picture: &Picture, cell: u32) -> Result<(u32, u32), Error> {
    let (w, h) = capped_size(picture.image.width(), picture.image.height());
    crate::image_in::default_size(w, h, cell).ok_or_else(|| {
        Error::Request(format!(
            "{} is {w}×{h}; a picture needs at least {cell} pixels each way",
            picture.label
        ))
    })
}

/// The job's request: what it says, else the model's recorded defaults, else klein's own
/// (distilled: 4 steps, guidance 1, i.e. none; base: 50 steps, guidance 4); the size, else the
/// input picture's, else the first reference's, else the VAE's sample size.
fn request(
    job: &Job,
    klein: &Loaded,
    references: &[Reference],
) -> Result<(Request, Option<MaskedArea>), Error> {
    let p = &klein.pipeline;
    let (steps, guidance) = klein::default_steps_and_guidance(p.configs.is_distilled);
    let d = &klein.defaults;
    let side = p.configs.vae.sample_size.unwrap_or(1024);
    let (width, height) = match &job.input {
        Some(i) => picture_size(&i.picture, p.cell())?,
        None => references
            .first()
            .map_or((side, side), |r| (r.width, r.height)),
    };
    let mut req = Request {
        prompt: job.prompt.clone(),
        negative_prompt: job
            .negative_prompt
            .clone()
            .or_else(|| d.negative_prompt.clone()),
        width: job.width.unwrap_or(width),
        height: job.height.unwrap_or(height),
        steps: job.steps.or(d.steps).unwrap_or(steps),
        guidance: job.guidance.or(d.guidance).unwrap_or(guidance),
        cfg_normalization: false,
        cfg_truncation: pipeline::NO_TRUNCATION,
        seed: job.seed,
        noise: None,
        input: None,
    };
    let mut area = None;
    if let Some(i) = &job.input {
        let (input, cut) = batch::picture_input(i, (req.width, req.height), DEFAULT_STRENGTH)?;
        req.input = Some(input);
        area = cut;
    }
    Ok((req, area))
}

/// The job's memory plan, before any weights load: `--memory-limit` (else
/// `ZIMAGE_MEMORY_LIMIT`, else the device's or the machine's memory) honoured, or the job
/// refused naming the smallest budget that runs it.
fn plan(
    job: &Job,
    klein: &Loaded,
    req: &Request,
    references: &[Reference],
) -> Result<MemoryPlan, Error> {
    let p = &klein.pipeline;
    let sizes = p.tensor_sizes()?;
    let shape = p.request_shape(req, references);
    batch::plan_for(
        &p.model_sizes(&sizes),
        &shape,
        p.can_stream(),
        job.memory_limit.as_deref(),
        job.residency,
    )
}

/// One pass of image `image` of the batch: `req` run under `plan`, with `references`.
fn pass<S: ModelSource>(
    p: &mut KleinPipeline<S>,
    req: &Request,
    references: &[Reference],
    plan: &MemoryPlan,
    image: usize,
    reporter: &mut Reporter,
    cancel: &Cancel,
) -> Result<pipeline::Generated, Error> {
    p.set_residency(plan.residency);
    p.set_tiling(plan.tiling);
    if let Some(limit) = plan.cache_limit {
        crate::mlx::memory::set_cache_limit(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    p.generate_from(req, references, &mut |progress| {
        reporter.pipeline(progress);
        match cancel.stops_image() {
            true => ControlFlow::Break(()),
            false => ControlFlow::Continue(()),
        }
    })
    .map_err(|e| match e {
        pipeline::Error::Stopped { step, total } => Error::Stopped { image, step, total },
        other => other.into(),
    })
}

/// Makes a klein job's images; the model is loaded.
fn run(
    job: &Job,
    klein: &mut Loaded,
    reporter: &mut Reporter,
    cancel: &Cancel,
    load: std::time::Duration,
) -> Result<Outcome, Error> {
    let dtype = klein.dtype;
    klein.bind(&job.loras, job.lora_lenient)?;
    let references = references(job, klein)?;
    let (mut first, area) = request(job, klein, &references)?;
    klein.pipeline.validate(&first)?;
    // The file holds what the seed would draw: `[1, C, h, w]` over the token grid, before
    // the tokens are packed (diffusers' `prepare_latents`).
    if let Some(path) = &job.noise {
        let (h, w) = klein.pipeline.grid(&first);
        let c = klein.pipeline.configs.transformer.in_channels;
        first.noise = Some(crate::jobs::noise::read(path, [c, h, w])?);
    }
    let plan = plan(job, klein, &first, &references)?;
    // The hires pass: image-to-image of each first picture at the larger size, the same
    // references beside it.
    let hires = match &job.hires {
        Some(h) => {
            let p = &klein.pipeline;
            let second = batch::hires_request(job, h, p.cell(), |r| p.validate(r), &first)?;
            let second_plan = self::plan(job, klein, &second, &references)?;
            Some((h, second, second_plan))
        }
        None => None,
    };
    let p = &mut klein.pipeline;
    p.set_previews(job.preview)?;
    let prompt_tokens = p.token_ids(&job.prompt)?.len();
    let model_name = p.source().name();
    let identity = p.source().identity();
    let mu = crate::scheduler::empirical_mu(
        {
            let (h, w) = p.grid(&first);
            (h * w) as usize
        },
        first.steps,
    );
    let reference_pictures: Vec<metadata::ReferenceProvenance> = (job.references.iter())
        .map(|p| metadata::ReferenceProvenance::of(&p.image))
        .collect();
    let mut out = Vec::with_capacity(job.count as usize);
    let mut ends = BatchEnds::default();
    for (image, seed) in job.images() {
        reporter.start_image(image);
        let req = Request {
            seed,
            ..first.clone()
        };
        let generated = pass(p, &req, &references, &plan, image, reporter, cancel);
        let Some(mut generated) = ends.pass(generated, cancel, seed, out.len())? else {
            if ends.stopped {
                break;
            }
            continue;
        };
        let mut steps_run = batch::steps_run_of(&req);
        let mut last_req = req.clone();
        let mut hires_from = None;
        if let Some((h, second, second_plan)) = &hires {
            reporter.phase("hires");
            let picture = (generated.rgb, generated.width, generated.height);
            let second = batch::hires_input(picture, second, seed)?;
            let refined = pass(
                p,
                &second,
                &references,
                second_plan,
                image,
                reporter,
                cancel,
            );
            let Some(refined) = ends.pass(refined, cancel, seed, out.len())? else {
                if ends.stopped {
                    break;
                }
                continue;
            };
            let mut phases = generated.phases;
            phases.extend(refined.phases);
            generated = pipeline::Generated { phases, ..refined };
            steps_run += batch::steps_run_of(&second);
            hires_from = Some(metadata::HiresProvenance::of(h, &req));
            last_req = second;
        }
        if let Some(area) = &area {
            let (w, h) = (generated.width, generated.height);
            generated.rgb = (area.paste(generated.rgb, w, h))
                .ok_or_else(|| Error::Png("the inpainted area has the wrong size".into()))?;
        }
        let from = Provenance {
            model_name: &model_name,
            identity: &identity,
            dtype,
            noise_file: job.noise.as_deref(),
            loras: &p.adapters().applied,
            // The exponential time shift by μ is the static shift e^μ.
            shift: mu.exp() as f32,
            only_masked: area
                .as_ref()
                .and(job.input.as_ref().and_then(|i| i.only_masked)),
            references: &reference_pictures,
            true_cfg: None,
        };
        // The metadata speaks of the request as asked: the first pass's size and schedule,
        // with the hires pass's settings beside them.
        let (infotext, json) = metadata::png_text_full(&req, &from, None, hires_from.as_ref());
        let png = crate::image_out::encode_png(
            &generated.rgb,
            generated.width,
            generated.height,
            &[
                (crate::image_out::PARAMETERS_KEY, &infotext),
                (crate::image_out::ZIMAGE_KEY, &json),
            ],
        )
        .map_err(Error::Png)?;
        out.push(Image {
            png,
            width: generated.width,
            height: generated.height,
            seed,
            steps: last_req.steps,
            steps_run,
            prompt_tokens,
            phases: generated.phases,
            control_seconds: None,
            infotext,
        });
    }
    let larger = match hires {
        Some((_, _, second)) if second.estimate.peak() > plan.estimate.peak() => second,
        _ => plan,
    };
    Ok(Outcome {
        loras: p.adapters().applied.clone(),
        ..ends.outcome(out, larger, load, model_name)
    })
}
