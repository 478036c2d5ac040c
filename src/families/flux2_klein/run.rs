//! FLUX.2 \[klein\]'s runner: the model's defaults for what the job leaves unsaid, the
//! references prepared at the model's token cell, one image per seed, and the same PNG metadata
//! as every other image. Options klein lacks were refused by name before any weights loaded.

use super::pipeline::{self as klein, KleinPipeline};
use crate::jobs::batch::{self, Outcome, Reporter};
use crate::jobs::error::Error;
use crate::jobs::job::Job;
use crate::jobs::loaded::{Held, LoadedModel};
use crate::jobs::masked_area::MaskedArea;
use crate::jobs::passes;
use crate::jobs::progress::Cancel;
use crate::jobs::source::Source;
use crate::memory_plan::MemoryPlan;
use crate::pipeline::reference::{Reference, MAX_REFERENCES};
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

/// The job's request: what it says, else the model's recorded defaults, else klein's own
/// (distilled: 4 steps, guidance 1, i.e. none; base: 50 steps, guidance 4); the size, else the
/// input picture's, else the first reference's, else the VAE's sample size.
fn request(
    job: &Job,
    klein: &Loaded,
    references: &[Reference],
) -> Result<(Request, Option<MaskedArea>), Error> {
    let p = &klein.pipeline;
    let own = klein::default_steps_and_guidance(p.configs.is_distilled);
    let side = p.configs.vae.sample_size.unwrap_or(1024);
    let fallback = references
        .first()
        .map_or((side, side), |r| (r.width, r.height));
    let (d, cell) = (&klein.defaults, p.cell());
    passes::request(job, d, own, fallback, cell, DEFAULT_STRENGTH)
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

/// `req` run under `plan` with `references`, each step reported to `progress`.
fn pass<S: ModelSource>(
    p: &mut KleinPipeline<S>,
    req: &Request,
    references: &[Reference],
    plan: &MemoryPlan,
    progress: &mut dyn FnMut(pipeline::Progress) -> ControlFlow<()>,
) -> Result<pipeline::Generated, pipeline::Error> {
    p.set_residency(plan.residency);
    p.set_tiling(plan.tiling);
    if let Some(limit) = plan.cache_limit {
        crate::mlx::memory::set_cache_limit(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    p.generate_from(req, references, progress)
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
    let (h, w) = p.grid(&first);
    let mu = crate::scheduler::empirical_mu((h * w) as usize, first.steps);
    let stamp = passes::Stamp {
        model_name: p.source().name(),
        identity: p.source().identity(),
        dtype,
        // The exponential time shift by μ is the static shift e^μ.
        shift: mu.exp() as f32,
        loras: p.adapters().applied.clone(),
        references: passes::reference_provenance(job),
        true_cfg: None,
        prompt_tokens: p.token_ids(&job.prompt)?.len(),
    };
    let runs = passes::Passes {
        first,
        plan,
        hires,
        area,
    };
    let (out, ends, larger) = passes::make(
        job,
        reporter,
        cancel,
        runs,
        &stamp,
        &mut |req, plan, progress| pass(p, req, &references, plan, progress),
    )?;
    Ok(Outcome {
        loras: stamp.loras,
        ..ends.outcome(out, larger, load, stamp.model_name)
    })
}
