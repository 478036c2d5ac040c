//! A job's images, one per seed, as the families that start from pictures make them: each
//! image's pass, then a hires pass of it when the job asks (image-to-image of the picture made,
//! at the larger size), an only-masked inpaint pasted back into the whole picture, and the PNG
//! with the same metadata as every image. The family gives the pass; this is the rest.

use super::batch::{self, BatchEnds, Image, Reporter};
use super::error::Error;
use super::job::{Hires, Job, Picture};
use super::masked_area::MaskedArea;
use super::metadata::{self, Provenance, ReferenceProvenance};
use super::progress::Cancel;
use crate::generation_defaults::GenerationDefaults;
use crate::lora::Applied;
use crate::memory_plan::MemoryPlan;
use crate::mlx::Dtype;
use crate::pipeline::reference::capped_size;
use crate::pipeline::{self, Generated, Request};
use std::ops::ControlFlow;

/// What the passes run: the first pass's request and plan, the hires pass's, and the area an
/// only-masked inpaint cut out.
pub struct Passes<'a> {
    pub first: Request,
    pub plan: MemoryPlan,
    pub hires: Option<(&'a Hires, Request, MemoryPlan)>,
    pub area: Option<MaskedArea>,
}

/// What every image's metadata says besides its request.
pub struct Stamp {
    pub model_name: String,
    pub identity: String,
    pub dtype: Dtype,
    /// The schedule's shift (the static shift an exponential one amounts to).
    pub shift: f32,
    pub loras: Vec<Applied>,
    pub references: Vec<ReferenceProvenance>,
    /// True guidance's scale, when it runs.
    pub true_cfg: Option<f32>,
    /// The prompt's tokens, for the report.
    pub prompt_tokens: usize,
}

/// One pass: `req` run under the plan given, for image `image` of the batch, each step
/// reported and the stop asked after it.
pub type Pass<'p> = dyn FnMut(
        &Request,
        &MemoryPlan,
        &mut dyn FnMut(pipeline::Progress) -> ControlFlow<()>,
    ) -> Result<Generated, pipeline::Error>
    + 'p;

/// Makes the job's images with `pass`; the images, how the batch ended, and the plan of its
/// largest pass.
pub fn make(
    job: &Job,
    reporter: &mut Reporter,
    cancel: &Cancel,
    passes: Passes,
    stamp: &Stamp,
    pass: &mut Pass,
) -> Result<(Vec<Image>, BatchEnds, MemoryPlan), Error> {
    let Passes {
        first,
        plan,
        hires,
        area,
    } = passes;
    let mut out = Vec::with_capacity(job.count as usize);
    let mut ends = BatchEnds::default();
    let mut run = |req: &Request, plan: &MemoryPlan, image: usize, reporter: &mut Reporter| {
        let mut progress = |p: pipeline::Progress| {
            reporter.pipeline(p);
            match cancel.stops_image() {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        };
        pass(req, plan, &mut progress).map_err(|e| match e {
            pipeline::Error::Stopped { step, total } => Error::Stopped { image, step, total },
            other => other.into(),
        })
    };
    for (image, seed) in job.images() {
        reporter.start_image(image);
        let req = Request {
            seed,
            ..first.clone()
        };
        let generated = run(&req, &plan, image, reporter);
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
            let refined = run(&second, second_plan, image, reporter);
            let Some(refined) = ends.pass(refined, cancel, seed, out.len())? else {
                if ends.stopped {
                    break;
                }
                continue;
            };
            let mut phases = generated.phases;
            phases.extend(refined.phases);
            generated = Generated { phases, ..refined };
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
            model_name: &stamp.model_name,
            identity: &stamp.identity,
            dtype: stamp.dtype,
            noise_file: job.noise.as_deref(),
            loras: &stamp.loras,
            shift: stamp.shift,
            only_masked: area
                .as_ref()
                .and(job.input.as_ref().and_then(|i| i.only_masked)),
            references: &stamp.references,
            true_cfg: stamp.true_cfg,
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
            prompt_tokens: stamp.prompt_tokens,
            phases: generated.phases,
            control_seconds: None,
            infotext,
        });
    }
    let larger = match hires {
        Some((_, _, second)) if second.estimate.peak() > plan.estimate.peak() => second,
        _ => plan,
    };
    Ok((out, ends, larger))
}

/// The size of an image task's output: the picture's, scaled to at most 1024² pixels and
/// floored to whole `cell`-pixel tokens.
pub fn picture_size(picture: &Picture, cell: u32) -> Result<(u32, u32), Error> {
    let (w, h) = capped_size(picture.image.width(), picture.image.height());
    crate::image_in::default_size(w, h, cell).ok_or_else(|| {
        Error::Request(format!(
            "{} is {w}×{h}; a picture needs at least {cell} pixels each way",
            picture.label
        ))
    })
}

/// The job's request: what it says, else the model's recorded `defaults`, else the family's
/// `own` steps and guidance; the size, else the input picture's (see [`picture_size`]), else
/// `fallback`; the picture (and mask) at that size, at `strength` unless the job names one.
/// With it, the area an only-masked inpaint cuts out.
pub fn request(
    job: &Job,
    defaults: &GenerationDefaults,
    (steps, guidance): (usize, f32),
    fallback: (u32, u32),
    cell: u32,
    strength: f64,
) -> Result<(Request, Option<MaskedArea>), Error> {
    let (width, height) = match &job.input {
        Some(i) => picture_size(&i.picture, cell)?,
        None => fallback,
    };
    let mut req = Request {
        prompt: job.prompt.clone(),
        negative_prompt: (job.negative_prompt.clone()).or_else(|| defaults.negative_prompt.clone()),
        width: job.width.unwrap_or(width),
        height: job.height.unwrap_or(height),
        steps: job.steps.or(defaults.steps).unwrap_or(steps),
        guidance: job.guidance.or(defaults.guidance).unwrap_or(guidance),
        cfg_normalization: false,
        cfg_truncation: pipeline::NO_TRUNCATION,
        seed: job.seed,
        noise: None,
        input: None,
    };
    let mut area = None;
    if let Some(i) = &job.input {
        let (input, cut) = batch::picture_input(i, (req.width, req.height), strength)?;
        req.input = Some(input);
        area = cut;
    }
    Ok((req, area))
}

/// The job's references as their metadata records them.
pub fn reference_provenance(job: &Job) -> Vec<ReferenceProvenance> {
    (job.references.iter())
        .map(|p| ReferenceProvenance::of(&p.image))
        .collect()
}
