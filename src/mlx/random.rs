//! MLX's counter-based random numbers, always from an explicit key.

use super::array::{call, Array};
use super::dtype::Dtype;
use super::error::Result;
use super::ffi;

#[track_caller]
pub fn key(seed: u64) -> Result<Array> {
    call("random::key", |out| unsafe {
        ffi::mlxs_random_key(out, seed)
    })
}

/// Standard normal samples of `shape`, drawn from `key`.
#[track_caller]
pub fn normal(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    call("random::normal", |out| unsafe {
        ffi::mlxs_random_normal(out, shape.as_ptr(), shape.len(), dtype.code(), key.as_ptr())
    })
}
