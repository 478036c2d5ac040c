//! One path from a request to images. A front end (the command line, each server API, the
//! page) parses what it is given into a [`Job`]; [`run`] makes the images on an [`Engine`] that
//! keeps the model loaded between jobs (loaded by its family, as the registry in
//! `crate::families` reads it), reporting [`Progress`] and stopping on [`Cancel`]; the front end
//! writes or encodes the [`Image`]s that come back. Nothing above this module calls a pipeline
//! to generate.

mod engine;
mod run;

pub use crate::jobs::batch::{Image, Outcome};
pub use crate::jobs::error::{Error, ErrorClass};
pub use crate::jobs::job::{
    ControlJob, ControlNetChoice, Hires, Job, Picture, PictureInput, DEFAULT_MASKED_PADDING,
    MAX_COUNT, MAX_MASKED_PADDING, MAX_PROMPT_BYTES,
};
pub use crate::jobs::metadata::{
    png_text, png_text_full, ControlProvenance, HiresProvenance, Provenance, ReferenceProvenance,
};
pub use crate::jobs::progress::{Cancel, Progress};
pub use crate::jobs::source::{open_error, ModelChoice, ModelKey};
pub use crate::jobs::{masked_area, metadata};
pub use engine::{check_image_model, Engine};
pub use run::run;

/// The ControlNet's conditioning scale when a job names none, and what is wrong with one.
pub use crate::pipeline::control::{
    scale_error as control_scale_error, DEFAULT_SCALE as DEFAULT_CONTROL_SCALE,
};

pub use crate::generation_defaults::DEFAULT_STEPS;
