//! Z-Image's runner: the job's request settled against the model's defaults, the memory
//! plan, LoRAs and the ControlNet bound, each image of the batch from its own seed, the hires
//! pass, and each PNG's metadata.

use super::control::ControlNetLoader;
use super::controlnet_source::{self, ControlNetSource};
use super::pipeline::Pipeline;
use crate::generation_defaults::GenerationDefaults;
use crate::jobs::batch::{self, BatchEnds, Image, Outcome, Reporter};
use crate::jobs::error::Error;
use crate::jobs::job::ControlNetChoice;
use crate::jobs::job::Job;
use crate::jobs::loaded::{BoundLoras, LoadedModel};
use crate::jobs::masked_area::MaskedArea;
use crate::jobs::metadata::{self, ControlProvenance, HiresProvenance, Provenance};
use crate::jobs::progress::Cancel;
use crate::jobs::source::Source;
use crate::memory_plan::MemoryPlan;
use crate::mlx::Dtype;
use crate::models::Residency;
use crate::pipeline::{self, ControlInput, ModelSource, Request};
use std::ops::ControlFlow;

/// A loaded Z-Image model: its pipeline, its defaults, the LoRAs and the ControlNet bound.
pub struct Loaded {
    pipeline: Pipeline<Source>,
    dtype: Dtype,
    /// What the model says a request should use when it names nothing.
    defaults: GenerationDefaults,
    loras: BoundLoras,
    /// The ControlNet set on the pipeline; it stays with the model until a job names another.
    controlnet: Option<String>,
}

impl Loaded {
    /// The model in `source`, its configs and tokenizer read.
    pub fn new(source: Source, dtype: Dtype, keep_models: bool) -> Result<Loaded, Error> {
        let mut pipeline = Pipeline::new(source, dtype, keep_models)?;
        let defaults = GenerationDefaults::of(pipeline.source())?;
        if let Some(shift) = defaults.shift {
            pipeline.configs.scheduler.shift = shift;
        }
        Ok(Loaded {
            pipeline,
            dtype,
            defaults,
            loras: BoundLoras::default(),
            controlnet: None,
        })
    }

    /// Binds the model's own LoRAs and `specs` to the pipeline, unless those are bound already.
    fn bind_loras(&mut self, specs: &[crate::lora::LoraSpec], lenient: bool) -> Result<(), Error> {
        let (load, set) = (Pipeline::load_adapters, Pipeline::set_adapters);
        (self.loras).bind(&mut self.pipeline, (specs, lenient), load, set)
    }

    /// Sets the ControlNet `choice` names on the pipeline, unless it is set already.
    fn set_controlnet(&mut self, choice: &ControlNetChoice) -> Result<(), Error> {
        let key = choice.key();
        if self.controlnet.as_deref() == Some(key.as_str()) {
            return Ok(());
        }
        let net = open_controlnet(choice)?;
        self.controlnet = None;
        self.pipeline.set_controlnet(Some(net))?;
        self.controlnet = Some(key);
        Ok(())
    }
}

/// The ControlNet `choice` names, opened (its weights load with the transformer).
fn open_controlnet(choice: &ControlNetChoice) -> Result<Box<dyn ControlNetLoader>, Error> {
    match choice {
        ControlNetChoice::Path(path) => ControlNetSource::open(path)
            .map(|s| Box::new(s) as Box<dyn ControlNetLoader>)
            .map_err(|e| Error::ControlNet(format!("--controlnet: {e}"))),
        ControlNetChoice::Stored { store, name } => {
            match controlnet_source::open_stored(store.clone(), name) {
                Ok(s) => Ok(Box::new(s)),
                Err(controlnet_source::Error::Store(e)) => match crate::jobs::source::open_error(e)
                {
                    Error::NotFound(m) => Err(Error::NotFound(format!("--controlnet: {m}"))),
                    other => Err(Error::ControlNet(format!("--controlnet: {other}"))),
                },
                Err(e) => Err(Error::ControlNet(format!("--controlnet: {e}"))),
            }
        }
    }
}

/// What `pipeline`'s ControlNet and `control` say of the steering; `None` without either.
fn control_provenance<S: ModelSource>(
    pipeline: &Pipeline<S>,
    control: Option<&ControlInput>,
) -> Option<ControlProvenance> {
    let (net, c) = pipeline.controlnet().zip(control)?;
    Some(ControlProvenance {
        controlnet: net.name(),
        version: net.version().to_string(),
        scale: c.scale,
    })
}

/// Checks that the request fits the memory budget (`limit`, else `ZIMAGE_MEMORY_LIMIT`, else
/// most of the machine) and chooses how to hold the weights and decode; `residency` overrides
/// the choice of how weights are held.
fn plan_memory<S: ModelSource>(
    pipeline: &Pipeline<S>,
    req: &Request,
    limit: Option<&str>,
    residency: Option<Residency>,
) -> Result<MemoryPlan, Error> {
    let sizes = pipeline.tensor_sizes()?;
    let shape = pipeline.request_shape(req)?;
    let model = pipeline.model_sizes(&sizes);
    batch::plan_for(&model, &shape, pipeline.can_stream(), limit, residency)
}

/// One pass of one image: the request and the control input at its size.
struct Pass {
    /// An only-masked inpaint's cut-out, pasted back into each image made.
    area: Option<MaskedArea>,
    req: Request,
    control: Option<ControlInput>,
}

impl LoadedModel for Loaded {
    fn source(&self) -> &Source {
        self.pipeline.source()
    }

    fn run(&mut self, job: &Job, report: &mut Reporter, cancel: &Cancel) -> Result<Outcome, Error> {
        run(job, self, report, cancel)
    }
}

/// Makes a Z-Image job's images; the model is loaded.
fn run(
    job: &Job,
    loaded: &mut Loaded,
    reporter: &mut Reporter,
    cancel: &Cancel,
) -> Result<Outcome, Error> {
    let dtype = loaded.dtype;
    loaded.bind_loras(&job.loras, job.lora_lenient)?;
    if let Some(c) = &job.control {
        loaded.set_controlnet(&c.net)?;
    }
    let load = reporter.elapsed();

    let first = first_pass(job, &loaded.pipeline, &loaded.defaults)?;
    let pipeline = &mut loaded.pipeline;
    pipeline.set_previews(job.preview)?;
    let hires = match &job.hires {
        Some(h) => {
            let cell = 2 * pipeline.configs.vae.scale_factor() as u32;
            let validate = |r: &Request| pipeline.validate(r);
            Some(batch::hires_request(job, h, cell, validate, &first.req)?)
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
        let mut steps_run = batch::steps_run_of(&req);
        let mut control_seconds = generated.control_seconds;
        let (rgb, width, height, last_req, hires_from) = match (&hires, &job.hires, &hires_plan) {
            (Some(second), Some(h), Some(plan)) => {
                reporter.phase("hires");
                let first = (generated.rgb, generated.width, generated.height);
                let second = batch::hires_input(first, second, seed)?;
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
                steps_run += batch::steps_run_of(&second);
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
        let steered = control_provenance(pipeline, first.control.as_ref());
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
            true_cfg: None,
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
        let (input, cut) = batch::picture_input(i, (req.width, req.height), strength)?;
        req.input = Some(input);
        area = cut;
        pipeline.validate(&req)?;
    }
    if let Some(path) = &job.noise {
        req.noise = Some(crate::jobs::noise::read(path, pipeline.latent_shape(&req))?);
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
