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
pub fn reset_peak_memory() {
    no_args(ffi::mlxs_reset_peak_memory)
}
/// Returns cached buffers to the system.
pub fn clear_cache() {
    no_args(ffi::mlxs_clear_cache)
}
