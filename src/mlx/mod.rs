//! A safe wrapper over MLX, through the C shim in `mlx-sys-shim/`.
//!
//! Ops build a lazy graph; work runs in [`eval`] (and in [`Array::to_vec`], [`Array::item`],
//! [`Array::to_bytes`], which evaluate what they read). Every op returns [`Result`], the
//! arithmetic operators too, carrying MLX's own message and the name of the op.
//!
//! Every `unsafe` block and impl here says, in a safety comment, what makes it sound.
#![deny(clippy::undocumented_unsafe_blocks)]

mod array;
mod dtype;
mod error;
pub mod fast;
mod ffi;
pub mod io;
pub mod memory;
pub mod ops;
mod quantized;
pub mod random;
pub mod runtime;

pub use array::Array;
pub use dtype::{ArrayElement, Dtype};
pub use error::{Error, Result};
pub use quantized::{QuantMode, QuantizedTensor};

use std::ffi::CStr;

/// Where MLX runs new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend (BLAS and MLX's own kernels).
    Cpu,
    /// The GPU backend: Metal, or CUDA.
    Gpu,
}

/// Calls one of the shim's functions that take no arguments.
fn no_args<T>(f: unsafe extern "C" fn() -> T) -> T {
    // SAFETY: none of the shim's argument-less functions has a precondition: each reads or
    // resets process-wide state (default device, allocator counters, the BLAS lookup) or
    // returns a pointer, and a returned pointer is only read under its own SAFETY reasoning.
    unsafe { f() }
}

/// Makes `device` where new arrays and ops run; fails where this build or machine has no such
/// device.
#[track_caller]
pub fn set_default_device(device: Device) -> Result<()> {
    let gpu = (device == Device::Gpu) as i32;
    // SAFETY: the one argument is a plain int; the shim reports an unavailable device as a
    // failed status.
    array::check("set_default_device", unsafe {
        ffi::mlxs_set_default_device(gpu)
    })
}

/// Where new work runs now.
pub fn default_device() -> Device {
    if no_args(ffi::mlxs_default_device_is_gpu) != 0 {
        Device::Gpu
    } else {
        Device::Cpu
    }
}

/// Whether this MLX build has a GPU backend (Metal or CUDA) and a device to run it.
pub fn gpu_available() -> bool {
    no_args(ffi::mlxs_gpu_available) != 0
}

/// Whether this CPU can multiply with bf16 inputs (`fast::Products::Bf16`): AVX512-BF16.
#[doc(hidden)]
pub fn bf16_products_available() -> bool {
    no_args(ffi::mlxs_bf16_products_available) != 0
}

/// MLX's version string.
pub fn version() -> String {
    // SAFETY: MLX's version is a static NUL-terminated string.
    unsafe { CStr::from_ptr(no_args(ffi::mlxs_version)) }
        .to_string_lossy()
        .into_owned()
}

/// How many explicit evaluations ([`eval`] and [`Array::eval`]) this thread has run, and of how
/// many arrays in all: what tells two code paths' materialisation apart.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvalCount {
    pub calls: u64,
    pub arrays: u64,
}

thread_local! {
    static EVALS: std::cell::Cell<EvalCount> = const {
        std::cell::Cell::new(EvalCount { calls: 0, arrays: 0 })
    };
}

/// This thread's `EvalCount` so far.
#[doc(hidden)]
pub fn eval_count() -> EvalCount {
    EVALS.with(|c| c.get())
}

/// Evaluates the graphs of `xs` together.
#[track_caller]
pub fn eval(xs: &[&Array]) -> Result<()> {
    EVALS.with(|c| {
        let n = c.get();
        c.set(EvalCount {
            calls: n.calls + 1,
            arrays: n.arrays + xs.len() as u64,
        })
    });
    let ptrs: Vec<_> = xs
        .iter()
        .map(|x| x.as_ptr() as *mut ffi::mlxs_array)
        .collect();
    // SAFETY: `ptrs` holds `ptrs.len()` handles of arrays borrowed for the call; the shim only
    // reads them (the `*mut` is how shim.h spells its `mlxs_array* const*`).
    array::check("eval", unsafe { ffi::mlxs_eval(ptrs.as_ptr(), ptrs.len()) })
}

/// How this binary was linked against MLX.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    /// `cpu`, `metal`, `cuda12` or `cuda13`.
    pub variant: &'static str,
    /// Directory holding the libmlx this binary loads.
    pub lib_dir: &'static str,
    /// Where the build found MLX.
    pub source: &'static str,
}

/// Which MLX this binary was built against, and where it loads it from.
pub fn build_info() -> BuildInfo {
    BuildInfo {
        variant: env!("ZIMAGE_MLX_VARIANT"),
        lib_dir: env!("ZIMAGE_MLX_LIB_DIR"),
        source: env!("ZIMAGE_MLX_SOURCE"),
    }
}

/// The BLAS library that serves MLX's CPU f32 matmuls, as the dynamic linker resolved it.
#[doc(hidden)]
pub fn blas_description() -> String {
    // SAFETY: the shim returns a NUL-terminated text in a buffer of this thread's own, valid
    // until its next call on this thread; it is copied out at once.
    unsafe { CStr::from_ptr(no_args(ffi::mlxs_blas_description)) }
        .to_string_lossy()
        .into_owned()
}

/// Calls that BLAS's `sgemm` directly: `c = a @ b` for row-major `a [m, k]`, `b [k, n]`.
/// The baseline that matmul benchmarks compare MLX against.
#[doc(hidden)]
pub fn blas_sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) -> std::result::Result<(), String> {
    let fits = |x: usize, y: usize, len: usize| x.checked_mul(y) == Some(len);
    if !fits(m, k, a.len()) || !fits(k, n, b.len()) || !fits(m, n, c.len()) {
        return Err(format!("sgemm operands do not match {m}×{k} @ {k}×{n}"));
    }
    let int = |x: usize| i32::try_from(x).map_err(|_| format!("sgemm size {x} exceeds a C int"));
    let (m, n, k) = (int(m)?, int(n)?, int(k)?);
    // SAFETY: `a`, `b` and `c` hold exactly m·k, k·n and m·n floats (checked above), the extents
    // the row-major, untransposed sgemm reads and writes; `c` is borrowed mutably.
    let status = unsafe { ffi::mlxs_blas_sgemm(m, n, k, a.as_ptr(), b.as_ptr(), c.as_mut_ptr()) };
    if status == 0 {
        Ok(())
    } else {
        Err("no cblas_sgemm in this process".into())
    }
}
