//! FLUX.3 \[klein\]'s runner: the model's defaults for what the job leaves unsaid, the
//! references prepared as FLUX.3 reads them, one image per seed, and the same PNG metadata as
//! every other image. Options FLUX.3 lacks are refused by name before any weights load.

use super::pipeline::{self as flux3, Flux3Pipeline};
use super::references::Prepared;
use crate::jobs::batch::{self, BatchEnds, Image, Outcome, Reporter};
use crate::jobs::error::Error;
use crate::jobs::job::Job;
use crate::jobs::loaded::{Held, LoadedModel};
use crate::jobs::metadata::{self, Provenance};
use crate::jobs::progress::Cancel;
use crate::jobs::source::Source;
use crate::memory_plan::MemoryPlan;
use crate::pipeline::{self, ModelSource, Request};
use std::ops::ControlFlow;

/// A loaded FLUX.3 model: its pipeline, its defaults and its LoRAs.
pub type Loaded = Held<Flux3Pipeline<Source>>;

impl Loaded {
    fn bind(&mut self, specs: &[crate::lora::LoraSpec], lenient: bool) -> Result<(), Error> {
        let (load, set) = (Flux3Pipeline::load_adapters, Flux3Pipeline::set_adapters);
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

/// The job's request and references: what it says, else the model's recorded defaults, else
/// FLUX.3's own (flow map: 16 steps, no guidance; base: 50 steps, guidance 3.5); the size,
/// else the first reference's (a single reference's canvas, the picture then cropped back to
/// it), else the VAE's sample size.
fn request(job: &Job, flux3: &Loaded) -> Result<(Request, Prepared), Error> {
    let p = &flux3.pipeline;
    let (steps, guidance) = flux3::default_steps_and_guidance(p.configs.transformer.flow_map);
    let d = &flux3.defaults;
    let side = p.configs.vae.sample_size.unwrap_or(1024);
    let pictures: Vec<(&image::DynamicImage, &str)> = (job.references.iter())
        .map(|r| (&r.image, r.label.as_str()))
        .collect();
    let mut references = Prepared::new(&pictures).map_err(Error::Request)?;
    let (width, height) = references
        .pictures
        .first()
        .map_or((side, side), |r| (r.width, r.height));
    // A size the job names is the picture's: nothing is cropped.
    if job.width.is_some() || job.height.is_some() {
        references.crop = None;
    }
    let req = Request {
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
    Ok((req, references))
}

/// The job's memory plan, before any weights load.
fn plan(
    job: &Job,
    flux3: &Loaded,
    req: &Request,
    references: &Prepared,
) -> Result<MemoryPlan, Error> {
    let p = &flux3.pipeline;
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

/// Makes a FLUX.3 job's images; the model is loaded.
fn run(
    job: &Job,
    flux3: &mut Loaded,
    reporter: &mut Reporter,
    cancel: &Cancel,
    load: std::time::Duration,
) -> Result<Outcome, Error> {
    let dtype = flux3.dtype;
    // The runner refuses these first; a caller of this model alone is held to them too.
    (super::family().refuse(&job.features())).map_err(Error::Request)?;
    flux3.bind(&job.loras, job.lora_lenient)?;
    let (mut first, references) = request(job, flux3)?;
    flux3.pipeline.validate(&first)?;
    // The file holds what the seed would draw: `[C, h, w]` over the token grid.
    if let Some(path) = &job.noise {
        let (h, w) = flux3.pipeline.grid(&first);
        let c = flux3.pipeline.configs.transformer.in_channels;
        first.noise = Some(crate::jobs::noise::read(path, [c, h, w])?);
    }
    let plan = plan(job, flux3, &first, &references)?;
    let p = &mut flux3.pipeline;
    let prompt_tokens = p.token_ids(&job.prompt)?.len();
    let model_name = p.source().name();
    let identity = p.source().identity();
    let shift = p.configs.shift;
    let reference_pictures: Vec<metadata::ReferenceProvenance> = (job.references.iter())
        .map(|p| metadata::ReferenceProvenance::of(&p.image))
        .collect();
    p.set_residency(plan.residency);
    p.set_tiling(plan.tiling);
    if let Some(limit) = plan.cache_limit {
        crate::mlx::memory::set_cache_limit(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    let mut out = Vec::with_capacity(job.count as usize);
    let mut ends = BatchEnds::default();
    for (image, seed) in job.images() {
        reporter.start_image(image);
        let req = Request {
            seed,
            ..first.clone()
        };
        let generated = p
            .generate_from(&req, &references, &mut |progress| {
                reporter.pipeline(progress);
                match cancel.stops_image() {
                    true => ControlFlow::Break(()),
                    false => ControlFlow::Continue(()),
                }
            })
            .map_err(|e| match e {
                pipeline::Error::Stopped { step, total } => Error::Stopped { image, step, total },
                other => other.into(),
            });
        let Some(generated) = ends.pass(generated, cancel, seed, out.len())? else {
            if ends.stopped {
                break;
            }
            continue;
        };
        let from = Provenance {
            model_name: &model_name,
            identity: &identity,
            dtype,
            noise_file: job.noise.as_deref(),
            loras: &p.adapters().applied,
            shift,
            only_masked: None,
            references: &reference_pictures,
            true_cfg: None,
        };
        let (infotext, json) = metadata::png_text_full(&req, &from, None, None);
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
            steps: req.steps,
            steps_run: batch::steps_run_of(&req),
            prompt_tokens,
            phases: generated.phases,
            control_seconds: None,
            infotext,
        });
    }
    Ok(Outcome {
        loras: p.adapters().applied.clone(),
        ..ends.outcome(out, plan, load, model_name)
    })
}
