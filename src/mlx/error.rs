//! MLX errors: the op that failed, MLX's own message, and where in our code it was called.

use std::panic::Location;

/// An MLX operation failed. `message` is MLX's text (`"[reshape] Cannot reshape array of size 6
/// into shape (4)."`), `op` names the wrapper that called it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{op}: {message} (at {location})")]
pub struct Error {
    /// The wrapper that called MLX (`reshape`, `random::normal`).
    pub op: &'static str,
    /// MLX's own text of what went wrong.
    pub message: String,
    /// Where our code called the op: the line to look at.
    pub location: &'static Location<'static>,
}

/// What every MLX op returns.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    #[track_caller]
    pub(crate) fn new(op: &'static str, message: impl Into<String>) -> Error {
        Error {
            op,
            message: message.into(),
            location: Location::caller(),
        }
    }
}
