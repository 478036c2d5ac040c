//! What can go wrong with a generation job, and whose fault it is: every front end (the
//! command line, each server API, the page) answers the same class the same way.

use crate::memory_plan::DoesNotFit;
use crate::pipeline;

/// Whose fault an error is, and so how a front end answers it: the command line exits 2 for
/// all of them; a server answers 400, 404, 413, 499 or 500.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request is wrong (a bound, a picture, a file, a combination of options).
    BadRequest,
    /// A model or ControlNet it names is not in the store.
    NotFound,
    /// It does not fit the memory budget.
    DoesNotFit,
    /// Cancelled (the client left, or asked to stop).
    Stopped,
    /// Not the request's fault: a broken store, MLX.
    Internal,
}

/// Why a job failed; [`Error::class`] says whose fault it is.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong; the message names the flag or field.
    #[error("{0}")]
    Request(String),
    /// A model or ControlNet the job names is not where it says.
    #[error("{0}")]
    NotFound(String),
    /// The memory budget setting itself is wrong (`--memory-limit`, `ZIMAGE_MEMORY_LIMIT`).
    #[error("{0}")]
    Budget(String),
    /// The job needs more memory than the budget allows; the message gives each phase's need.
    #[error(transparent)]
    DoesNotFit(#[from] DoesNotFit),
    /// The model's steps failed: a bad input picture or LoRA, a cancel, or MLX.
    #[error(transparent)]
    Pipeline(#[from] pipeline::Error),
    /// The store could not give the model.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// A diffusers directory that cannot be read as a model.
    #[error(transparent)]
    Source(#[from] crate::diffusers_dir::Error),
    /// A ControlNet that cannot be used with this job or model.
    #[error("{0}")]
    ControlNet(String),
    /// The finished image could not be written as a PNG.
    #[error("encoding the PNG: {0}")]
    Png(String),
    /// Cancelled at a step boundary: `image` (1-based) of the batch had run `step` of `total`.
    #[error("stopped after step {step} of {total} (image {image})")]
    Stopped {
        /// The image being made, 1-based.
        image: usize,
        /// The steps it had run.
        step: usize,
        /// Its steps in all.
        total: usize,
    },
}

impl Error {
    /// Whose fault the error is, and so how a front end answers it.
    pub fn class(&self) -> ErrorClass {
        use crate::store::StoreError;
        match self {
            Error::Request(_) | Error::Budget(_) | Error::ControlNet(_) => ErrorClass::BadRequest,
            Error::NotFound(_) => ErrorClass::NotFound,
            Error::DoesNotFit(_) => ErrorClass::DoesNotFit,
            Error::Stopped { .. } | Error::Pipeline(pipeline::Error::Stopped { .. }) => {
                ErrorClass::Stopped
            }
            Error::Pipeline(
                pipeline::Error::Request(_)
                | pipeline::Error::Lora(
                    crate::lora::Error::File { .. }
                    | crate::lora::Error::Read(_)
                    | crate::lora::Error::Format(_)
                    | crate::lora::Error::Spec(..),
                ),
            ) => ErrorClass::BadRequest,
            Error::Store(StoreError::NotFound(_)) => ErrorClass::NotFound,
            Error::Store(StoreError::Name(_)) => ErrorClass::BadRequest,
            Error::Source(_) => ErrorClass::BadRequest,
            _ => ErrorClass::Internal,
        }
    }
}
