//! FLUX.1's runner: the model's defaults for what the job leaves unsaid, Kontext's picture
//! prepared as diffusers prepares it, true guidance's scale, one image per seed, and the same
//! PNG metadata as every other image. Options FLUX.1 lacks were refused by name before any
//! weights loaded.

use super::pipeline::{self as flux1, Flux1Pipeline};
use crate::jobs::batch::{self, Outcome, Reporter};
use crate::jobs::error::Error;
use crate::jobs::job::Job;
use crate::jobs::loaded::{Held, LoadedModel};
use crate::jobs::masked_area::MaskedArea;
use crate::jobs::passes;
use crate::jobs::progress::Cancel;
use crate::jobs::source::Source;
use crate::memory_plan::MemoryPlan;
use crate::pipeline::reference::Reference;
use crate::pipeline::{self, ModelSource, Request};
use std::ops::ControlFlow;

/// A loaded FLUX.1 model: its pipeline, its defaults and its LoRAs.
pub type Loaded = Held<Flux1Pipeline<Source>>;

impl Loaded {
    fn bind(&mut self, specs: &[crate::lora::LoraSpec], lenient: bool) -> Result<(), Error> {
        let (load, set) = (Flux1Pipeline::load_adapters, Flux1Pipeline::set_adapters);
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

/// Kontext's picture to edit (the job's one reference), prepared as diffusers prepares it.
fn reference(job: &Job, flux1: &Loaded) -> Result<Option<Reference>, Error> {
    let p = &flux1.pipeline;
    match job.references.as_slice() {
        [] => Ok(None),
        [picture] => {
            let side = p.configs.vae.sample_size.unwrap_or(1024);
            super::kontext::prepare(&picture.image, p.cell(), side, &picture.label)
                .map(Some)
                .map_err(Error::Request)
        }
        pictures => Err(Error::Request(format!(
            "{} pictures given; a Kontext model edits one (--ref once)",
            pictures.len()
        ))),
    }
}

/// The strength an image task runs at when the job names none (diffusers' FLUX.1
/// image-to-image default).
const DEFAULT_STRENGTH: f64 = pipeline::condition::DEFAULT_STRENGTH;

/// The job's request: what it says, else the model's recorded defaults, else FLUX.1's own
/// (\[dev\] and Kontext: 28 steps, guidance 3.5; \[schnell\]: 4 steps); the size, else the
/// input picture's, else the VAE's sample size (a Kontext edit's too, as diffusers sizes it).
fn request(job: &Job, flux1: &Loaded) -> Result<(Request, Option<MaskedArea>), Error> {
    let p = &flux1.pipeline;
    let own = flux1::default_steps_and_guidance(&p.configs.transformer);
    let side = p.configs.vae.sample_size.unwrap_or(1024);
    let (d, cell) = (&flux1.defaults, p.cell());
    passes::request(job, d, own, (side, side), cell, DEFAULT_STRENGTH)
}

/// The job's memory plan, before any weights load: `--memory-limit` (else
/// `ZIMAGE_MEMORY_LIMIT`, else the device's or the machine's memory) honoured, or the job
/// refused naming the smallest budget that runs it.
fn plan(
    job: &Job,
    flux1: &Loaded,
    req: &Request,
    reference: Option<&Reference>,
) -> Result<MemoryPlan, Error> {
    let p = &flux1.pipeline;
    let sizes = p.tensor_sizes()?;
    let shape = p.request_shape(req, reference);
    batch::plan_for(
        &p.model_sizes(&sizes),
        &shape,
        p.can_stream(),
        job.memory_limit.as_deref(),
        job.residency,
    )
}

/// `req` run under `plan`, editing `reference`, each step reported to `progress`.
fn pass<S: ModelSource>(
    p: &mut Flux1Pipeline<S>,
    req: &Request,
    reference: Option<&Reference>,
    plan: &MemoryPlan,
    progress: &mut dyn FnMut(pipeline::Progress) -> ControlFlow<()>,
) -> Result<pipeline::Generated, pipeline::Error> {
    p.set_residency(plan.residency);
    p.set_tiling(plan.tiling);
    if let Some(limit) = plan.cache_limit {
        crate::mlx::memory::set_cache_limit(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    p.generate_from(req, reference, progress)
}

/// Makes a FLUX.1 job's images; the model is loaded.
fn run(
    job: &Job,
    flux1: &mut Loaded,
    reporter: &mut Reporter,
    cancel: &Cancel,
    load: std::time::Duration,
) -> Result<Outcome, Error> {
    let dtype = flux1.dtype;
    // The runner refuses these first; a caller of this model alone is held to them too.
    let source = flux1.pipeline.source();
    (super::family().refuse_for(source, &job.features())).map_err(Error::Request)?;
    flux1.bind(&job.loras, job.lora_lenient)?;
    let reference = reference(job, flux1)?;
    let (mut first, area) = request(job, flux1)?;
    flux1.pipeline.set_true_cfg(job.true_cfg.unwrap_or(1.0));
    flux1.pipeline.validate(&first)?;
    // The file holds what the seed would draw: `[1, C, 2h, 2w]` over the VAE's latent grid,
    // before the tokens are packed (diffusers' `prepare_latents`).
    if let Some(path) = &job.noise {
        let (h, w) = flux1.pipeline.grid(&first);
        let c = flux1.pipeline.configs.vae.latent_channels;
        first.noise = Some(crate::jobs::noise::read(path, [c, 2 * h, 2 * w])?);
    }
    let plan = plan(job, flux1, &first, reference.as_ref())?;
    // The hires pass: image-to-image of each first picture at the larger size, the same
    // references beside it.
    let hires = match &job.hires {
        Some(h) => {
            let p = &flux1.pipeline;
            let second = batch::hires_request(job, h, p.cell(), |r| p.validate(r), &first)?;
            let second_plan = self::plan(job, flux1, &second, reference.as_ref())?;
            Some((h, second, second_plan))
        }
        None => None,
    };
    let p = &mut flux1.pipeline;
    p.set_previews(job.preview)?;
    let scheduler = &p.configs.scheduler;
    // The exponential time shift by μ is the static shift e^μ.
    let shift = match scheduler.use_dynamic_shifting {
        true => {
            let (h, w) = p.grid(&first);
            scheduler.line_mu((h * w) as usize).exp() as f32
        }
        false => scheduler.shift,
    };
    let stamp = passes::Stamp {
        model_name: p.source().name(),
        identity: p.source().identity(),
        dtype,
        shift,
        loras: p.adapters().applied.clone(),
        references: passes::reference_provenance(job),
        true_cfg: p.guided(&first).then_some(p.true_cfg()),
        prompt_tokens: p.prompt_tokens(&job.prompt)?,
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
        &mut |req, plan, progress| pass(p, req, reference.as_ref(), plan, progress),
    )?;
    // diffusers ignores a guidance scale a model has no embedder for; so does this, saying so.
    let notes = match (job.guidance, p.configs.transformer.guidance_embeds) {
        (Some(g), false) => vec![format!(
            "--guidance {g} does nothing on this [schnell] model (it has no guidance embedder); it was ignored, as diffusers ignores it"
        )],
        _ => Vec::new(),
    };
    Ok(Outcome {
        loras: stamp.loras,
        notes,
        ..ends.outcome(out, larger, load, stamp.model_name)
    })
}
