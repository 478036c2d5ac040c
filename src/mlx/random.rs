//! MLX's counter-based random numbers, always from an explicit key.

use super::array::{shim_call, Array};
use super::dtype::Dtype;
use super::error::Result;

/// A random key made from `seed`, for [`normal`]: the same seed gives the same draws.
#[track_caller]
pub fn key(seed: u64) -> Result<Array> {
    shim_call!("random::key", mlxs_random_key(seed))
}

/// Standard normal samples of `shape`, drawn from `key`.
#[track_caller]
pub fn normal(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    let code = dtype.code("random::normal")?;
    shim_call!(
        "random::normal",
        mlxs_random_normal(shape.as_ptr(), shape.len(), code, key.as_ptr())
    )
}
