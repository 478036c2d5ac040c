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

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong; the message names the flag or field.
    #[error("{0}")]
    Request(String),
    #[error("{0}")]
    NotFound(String),
    /// The memory budget setting itself is wrong (`--memory-limit`, `ZIMAGE_MEMORY_LIMIT`).
    #[error("{0}")]
    Budget(String),
    #[error(transparent)]
    DoesNotFit(#[from] DoesNotFit),
    #[error(transparent)]
    Pipeline(#[from] pipeline::Error),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Source(#[from] crate::diffusers_dir::Error),
    #[error("{0}")]
    ControlNet(String),
    #[error("encoding the PNG: {0}")]
    Png(String),
    /// Cancelled at a step boundary: `image` (1-based) of the batch had run `step` of `total`.
    #[error("stopped after step {step} of {total} (image {image})")]
    Stopped {
        image: usize,
        step: usize,
        total: usize,
    },
}

impl Error {
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
