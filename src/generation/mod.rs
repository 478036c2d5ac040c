//! One path from a request to images. A front end (the command line, each server API, the
//! page) parses what it is given into a [`Job`]; [`run`] makes the images on an [`Engine`] that
//! keeps the model loaded between jobs, reporting [`Progress`] and stopping on [`Cancel`]; the
//! front end writes or encodes the [`Image`]s that come back. Nothing above this module calls
//! the pipeline to generate.

mod engine;
mod error;
mod job;
mod klein;
pub mod masked_area;
pub mod metadata;
mod noise;
mod progress;
mod run;
mod source;

pub use engine::{ControlNetChoice, Engine};
pub use error::{Error, ErrorClass};
pub use job::{
    ControlJob, Hires, Job, Picture, PictureInput, DEFAULT_MASKED_PADDING, MAX_COUNT,
    MAX_MASKED_PADDING, MAX_PROMPT_BYTES,
};
pub use metadata::{
    png_text, png_text_full, ControlProvenance, HiresProvenance, Provenance, ReferenceProvenance,
};
pub use progress::{Cancel, Progress};
pub use run::{run, Image, Outcome};
pub use source::{check_image_model, open_error, ModelChoice, ModelKey};

/// The ControlNet's conditioning scale when a job names none, and what is wrong with one.
pub use crate::pipeline::control::{
    scale_error as control_scale_error, DEFAULT_SCALE as DEFAULT_CONTROL_SCALE,
};

use crate::memory_plan::{self, MemoryPlan, ModelSizes, RequestShape};
use crate::mlx::fast::Products;
use crate::models::Residency;
use crate::pipeline::{ModelSource, Pipeline, Request};

pub use crate::generation_defaults::DEFAULT_STEPS;

/// Checks that the request fits the memory budget (`limit`, else `ZIMAGE_MEMORY_LIMIT`, else
/// most of the machine) and chooses how to hold the weights and decode; `residency` overrides
/// the choice of how weights are held.
pub fn plan_memory<S: ModelSource>(
    pipeline: &Pipeline<S>,
    req: &Request,
    limit: Option<&str>,
    residency: Option<Residency>,
) -> Result<MemoryPlan, Error> {
    let sizes = pipeline.tensor_sizes()?;
    let shape = pipeline.request_shape(req)?;
    let model = pipeline.model_sizes(&sizes);
    plan_for(&model, &shape, pipeline.can_stream(), limit, residency)
}

/// [`plan_memory`] for any family: the model's sizes and the request's shape, whether its
/// weights can stream.
pub(super) fn plan_for(
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
