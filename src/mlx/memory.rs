//! MLX's allocator statistics, in bytes.

use super::{ffi, no_args};

/// Bytes held by live arrays.
pub fn active_memory() -> usize {
    no_args(ffi::mlxs_get_active_memory)
}
/// Highest `active_memory` since start or the last `reset_peak_memory`.
pub fn peak_memory() -> usize {
    no_args(ffi::mlxs_get_peak_memory)
}
/// Bytes MLX keeps cached for reuse.
pub fn cache_memory() -> usize {
    no_args(ffi::mlxs_get_cache_memory)
}
/// Starts `peak_memory` again from what is active now.
pub fn reset_peak_memory() {
    no_args(ffi::mlxs_reset_peak_memory)
}
/// Returns cached buffers to the system.
pub fn clear_cache() {
    no_args(ffi::mlxs_clear_cache)
}
/// MLX's limit on its allocations.
pub fn memory_limit() -> usize {
    no_args(ffi::mlxs_get_memory_limit)
}
/// Keeps at most `bytes` of freed buffers cached for reuse; returns the previous limit.
pub fn set_cache_limit(bytes: usize) -> usize {
    // SAFETY: sets an allocator setting; any value is accepted.
    unsafe { ffi::mlxs_set_cache_limit(bytes) }
}
/// Wires up to `bytes` of MLX's memory on Metal (kept resident); elsewhere nothing. Returns the
/// previous limit, or 0 where the system refuses this one.
pub fn set_wired_limit(bytes: usize) -> usize {
    // SAFETY: sets an allocator setting; the shim turns a refusal into 0.
    unsafe { ffi::mlxs_set_wired_limit(bytes) }
}
/// The memory of the GPU MLX runs on (Metal's recommended working set, a CUDA device's free
/// memory when MLX reports it, else its total), `None` without a GPU.
pub fn device_memory() -> Option<u64> {
    Some(no_args(ffi::mlxs_device_memory) as u64).filter(|&b| b > 0)
}
