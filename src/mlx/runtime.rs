//! Where this program's MLX lives, and opening it where the program does not link it.
//!
//! The CPU and Metal variants link the shim and libmlx into the program. The CUDA variants
//! cannot: libmlx needs the NVIDIA driver's `libcuda.so.1` to load at all, and a program that
//! links it dies in the dynamic loader on a machine without the driver. They build the shim and
//! libmlx into one shared library instead (`libzimage_mlx.so`), which [`start`] opens after
//! checking for the driver, so that its absence is one line of advice.

use std::path::{Path, PathBuf};

/// Why MLX could not be opened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StartError {
    #[error(
        "no NVIDIA driver found ({0}); install the NVIDIA driver, or build the CPU variant \
         (ZIMAGE_MLX_VARIANT=cpu cargo build --release)"
    )]
    /// A CUDA build on a machine whose NVIDIA driver (`libcuda.so.1`) cannot be loaded; the
    /// loader's reason.
    NoDriver(String),
    #[error("cannot open {path}: {reason}; rebuild zimage, or set ZIMAGE_MLX_RUNTIME to its libzimage_mlx.so")]
    /// The shared library holding MLX is missing or would not load.
    Library {
        /// The library looked for.
        path: PathBuf,
        /// The dynamic loader's reason.
        reason: String,
    },
    /// MLX opened, but the device could not be chosen (a bad `ZIMAGE_GRAPH`, say).
    #[error("{0}")]
    Device(String),
}

/// The environment variable MLX reads for its on-disk cache of compiled GPU kernels.
pub const KERNEL_CACHE_VAR: &str = "MLX_PTX_CACHE_DIR";

/// Whether this build opens MLX at start rather than linking it.
pub(crate) const OPENED_AT_START: bool = cfg!(zimage_dlopen);

/// Prepares MLX before its first use: in the variants that open MLX at start, points MLX's
/// kernel cache into `kernel_cache` (unless the user set [`KERNEL_CACHE_VAR`]) and opens the
/// library. Linked variants have nothing to open. Call first thing in `main`, before any thread
/// starts: it may set an environment variable.
pub fn start(kernel_cache: Option<&Path>) -> Result<(), StartError> {
    if !OPENED_AT_START {
        return Ok(());
    }
    if std::env::var_os(KERNEL_CACHE_VAR).is_none() {
        if let Some(dir) = kernel_cache {
            // MLX keys its cached kernels by module name alone; its own default folder names
            // its version, and so does this one, so that kernels of another MLX are never read.
            let folder = format!(
                "{}-{}",
                env!("ZIMAGE_MLX_VARIANT"),
                env!("ZIMAGE_MLX_HEADER_VERSION")
            );
            std::env::set_var(KERNEL_CACHE_VAR, dir.join(folder));
        }
    }
    opened().as_ref().map(|_| ()).map_err(Clone::clone)
}

/// MLX's kernel cache folder as this process sees it, when set.
pub fn kernel_cache_dir() -> Option<PathBuf> {
    std::env::var_os(KERNEL_CACHE_VAR).map(PathBuf::from)
}

/// The shared library this program opens at start, where it opens one.
pub fn library_path() -> Option<PathBuf> {
    OPENED_AT_START
        .then(candidates)?
        .into_iter()
        .find(|p| p.is_file())
}

/// Where the library is looked for: `ZIMAGE_MLX_RUNTIME`, beside the executable (an installed
/// copy), then where the build wrote it.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("ZIMAGE_MLX_RUNTIME") {
        out.push(PathBuf::from(p));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
    {
        out.push(dir.join("libzimage_mlx.so"));
    }
    if let Some(built) = option_env!("ZIMAGE_RUNTIME_LIB") {
        out.push(PathBuf::from(built));
    }
    out
}

/// The opened library's handle (as an address, to be shared between threads), opened once.
fn opened() -> &'static Result<usize, StartError> {
    static LIBRARY: std::sync::OnceLock<Result<usize, StartError>> = std::sync::OnceLock::new();
    LIBRARY.get_or_init(open)
}

fn open() -> Result<usize, StartError> {
    // The driver first, on its own, so that its absence is told as such and not as one of
    // libmlx's dependencies; it stays loaded for libmlx.
    dlopen(Path::new("libcuda.so.1")).map_err(StartError::NoDriver)?;
    let Some(path) = library_path() else {
        return Err(StartError::Library {
            path: candidates().pop().unwrap_or_default(),
            reason: "no such file".into(),
        });
    };
    // Global, so that the BLAS libmlx brings is the process-wide `cblas_sgemm` the shim's CPU
    // kernels look up.
    dlopen(&path).map_err(|reason| StartError::Library { path, reason })
}

fn dlopen(path: &Path) -> Result<usize, String> {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| "the path holds a NUL byte".to_string())?;
    // SAFETY: `name` is a NUL-terminated path that outlives the call; opening runs the
    // library's initialisers, which is what loading it at start would have done.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        return Err(last_dl_error());
    }
    Ok(handle as usize)
}

fn last_dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message that stays valid until the next
    // dl call on this thread; it is copied out at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { std::ffi::CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

/// The address of the opened shim's function `name` (NUL-terminated). A program that could not
/// open its MLX stops here with the reason: [`start`] in `main` tells it first, and cleanly.
#[cfg_attr(not(zimage_dlopen), allow(dead_code))]
pub(super) fn symbol(name: &str) -> *mut std::ffi::c_void {
    let handle = match opened() {
        Ok(h) => *h as *mut std::ffi::c_void,
        Err(e) => panic!("{e}"),
    };
    // SAFETY: `handle` came from a successful dlopen and is never closed; `name` is
    // NUL-terminated (every caller passes a `concat!` with "\0").
    let address = unsafe { libc::dlsym(handle, name.as_ptr().cast()) };
    assert!(
        !address.is_null(),
        "{} lacks {}: rebuild zimage",
        library_path().unwrap_or_default().display(),
        name.trim_end_matches('\0')
    );
    address
}
