//! Everything that differs between platforms lives here: the default device and compute
//! dtype, the form of the model graph, and process limits.
//!
//! - macOS (Apple Silicon): MLX runs on the GPU through Metal; compute in bf16.
//! - Linux with a CUDA build of MLX: GPU, bf16.
//! - Linux CPU: MLX's CPU bf16/f16 matmuls do not use BLAS and run ~30× slower than f32
//!   through OpenBLAS, so compute in f32.
//!
//! The model graph comes in two forms ([`Graph`]): the CPU's (the shim's fused kernels, f32)
//! and the GPU's (MLX's own kernels, bf16, evaluated block by block). Each device runs its own
//! by default; `ZIMAGE_GRAPH=gpu` runs the GPU's form on MLX's CPU backend, so that the GPU
//! path's memory and images can be checked on a machine without a GPU.

use crate::mlx::{self, Device, Dtype};

/// The environment variable that picks the graph's form: `gpu` or `cpu`.
pub const GRAPH_VAR: &str = "ZIMAGE_GRAPH";

/// The environment variable that evaluates the transformer block by block and reports MLX's
/// memory after each block (any value but `0` or empty).
pub const DEBUG_BLOCKS_VAR: &str = "ZIMAGE_DEBUG_BLOCKS";

/// The form the model graph takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Graph {
    /// The CPU backend's: the shim's one-pass kernels in f32, convolutions as BLAS products,
    /// weights streamed when memory is short.
    Cpu,
    /// The GPU's: MLX's own kernels in bf16, MLX's attention (queries in chunks where MLX does
    /// not fuse it), evaluated block by block, quantized weights widened per layer for
    /// products over many rows.
    Gpu,
}

impl Graph {
    /// The form `value` names, or an error naming [`GRAPH_VAR`].
    pub fn parse(value: &str) -> Result<Graph, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "gpu" => Ok(Graph::Gpu),
            "cpu" => Ok(Graph::Cpu),
            _ => Err(format!(
                "{GRAPH_VAR}={value:?} is not a graph form; set it to `gpu` or `cpu`, or unset it \
                 (the device's own form)"
            )),
        }
    }
}

/// The form `ZIMAGE_GRAPH` asks for, `None` when it is unset or empty; an error naming the
/// variable when its value is neither `gpu` nor `cpu`.
pub fn graph_from_env() -> Result<Option<Graph>, String> {
    match std::env::var(GRAPH_VAR) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Graph::parse(&v).map(Some),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!(
            "{GRAPH_VAR}={v:?} is not a graph form; set it to `gpu` or `cpu`"
        )),
    }
}

/// The form this process runs: `ZIMAGE_GRAPH`'s, else the default device's. A value that is
/// neither is refused by [`use_default_device`] first; here it falls back to the device's.
pub fn graph() -> Graph {
    static CHOSEN: std::sync::OnceLock<Option<Graph>> = std::sync::OnceLock::new();
    let chosen = *CHOSEN.get_or_init(|| graph_from_env().ok().flatten());
    chosen.unwrap_or(match default_device() {
        Device::Gpu => Graph::Gpu,
        Device::Cpu => Graph::Cpu,
    })
}

/// The device zimage runs models on: the GPU when this MLX build has one.
pub fn default_device() -> Device {
    if mlx::gpu_available() {
        Device::Gpu
    } else {
        Device::Cpu
    }
}

/// Makes [`default_device`] MLX's default for new work, after checking `ZIMAGE_GRAPH`.
pub fn use_default_device() -> mlx::Result<()> {
    graph_from_env().map_err(|e| mlx::Error::new("settings", e))?;
    mlx::set_default_device(default_device())
}

/// The dtype models compute in unless the user asks otherwise: the graph's.
pub fn default_compute_dtype() -> Dtype {
    match graph() {
        Graph::Gpu => Dtype::BF16,
        Graph::Cpu => Dtype::F32,
    }
}

/// Whether convolutions run as matrix products (through the BLAS) rather than MLX's direct
/// convolution: on the CPU the products (3×3 kernels by Winograd's F(4×4, 3×3)) are 1.5–5×
/// faster (`cargo bench --bench conv`); on a GPU MLX's own kernels are the better choice. The
/// GPU graph on the CPU keeps the products too: MLX's CPU convolution unfolds its input into
/// k² copies (1.2 GB for one 3×3 convolution of a 512² decode), which no GPU kernel does, so
/// it would measure neither the GPU's memory nor a useful time.
pub fn convolutions_as_matmuls() -> bool {
    convolutions_as_matmuls_on(mlx::default_device())
}

/// [`convolutions_as_matmuls`] on `device`.
pub fn convolutions_as_matmuls_on(device: Device) -> bool {
    device == Device::Cpu
}

/// Whether the transformer runs its CPU form: q|k|v and w1|w3 weights joined at load into one
/// product each, and the shim's one-pass kernels for the norms, qk-norm with RoPE, attention and
/// the SiLU gate (`cargo bench --bench pipeline`). Only in the CPU graph in f32: the GPU graph
/// keeps MLX's own kernels, and a narrower dtype keeps the reference's rounding steps.
pub fn fused_transformer_kernels(dtype: Dtype) -> bool {
    graph() == Graph::Cpu && mlx::default_device() == Device::Cpu && dtype == Dtype::F32
}

/// Whether the models evaluate their graph after every block, so that no more than one
/// block's transients are alive at once: the GPU graph (whose queued kernels would otherwise
/// hold a whole step's buffers), and the block report of [`DEBUG_BLOCKS_VAR`].
pub fn evaluates_per_block() -> bool {
    graph() == Graph::Gpu || debug_blocks()
}

/// Whether `ZIMAGE_DEBUG_BLOCKS` asks for MLX's memory after each block.
pub fn debug_blocks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var(DEBUG_BLOCKS_VAR).is_ok_and(|v| !v.is_empty() && v.trim() != "0")
    })
}

/// Whether MLX's attention is fused on this device for head widths up to 128 (Metal's and
/// CUDA's kernels never write the `[heads, S, S]` scores). MLX's CPU backend composes it from
/// a product, a softmax and a product, so the GPU graph feeds it queries in chunks there.
pub fn attention_is_fused() -> bool {
    attention_is_fused_on(mlx::default_device())
}

/// [`attention_is_fused`] on `device`.
pub fn attention_is_fused_on(device: Device) -> bool {
    device == Device::Gpu
}

/// Bytes of scores one query chunk of the GPU graph's attention may hold where MLX's attention
/// is not fused ([`attention_is_fused`]).
pub const ATTENTION_CHUNK_BYTES: u64 = 64 << 20;

/// Whether a product of `rows` rows by a quantized weight widens the weight to the compute
/// dtype first (one layer's dense copy, dropped after the product) rather than running MLX's
/// quantized product: in the GPU graph for many rows (image tokens), where the dense product
/// is several times faster; the prompt's few rows keep the quantized product.
pub fn widens_quantized_for(rows: u64) -> bool {
    widens_quantized(graph(), rows)
}

/// [`widens_quantized_for`] in the graph `graph`: the one place the choice and its threshold
/// are made, for the products and for the memory estimate alike.
pub fn widens_quantized(graph: Graph, rows: u64) -> bool {
    graph == Graph::Gpu && rows >= WIDEN_QUANTIZED_ROWS
}

/// The fewest rows for which [`widens_quantized`] widens.
pub const WIDEN_QUANTIZED_ROWS: u64 = 256;

/// Bytes MLX holds for each value of a quantized weight (bf16 scales) it widens to values of
/// `compute_bytes`: on a GPU one kernel writes the values in the scales' dtype, then a cast
/// where the compute dtype is wider; MLX's CPU backend composes the widening, unpacking into
/// 32-bit integers and converting through f32 (measured on a 3840×10240 int4 weight: 10 bytes a
/// value into bf16, 13 into f32 with the cast).
pub fn widening_bytes_per_value(device: Device, compute_bytes: u64) -> u64 {
    match device {
        Device::Gpu if compute_bytes > 2 => 2 + compute_bytes,
        Device::Gpu => compute_bytes,
        Device::Cpu if compute_bytes > 2 => 13,
        Device::Cpu => 10,
    }
}

/// Whether weights can be streamed from the store's files (mapped and let go of block by
/// block): in the CPU graph on the CPU, where mapped memory is the memory the products read.
pub fn can_stream_weights() -> bool {
    graph() == Graph::Cpu && mlx::default_device() == Device::Cpu
}

/// The memory MLX may use on this device, as the preflight's budget: its recommended working
/// set (Metal: what the GPU may hold without the system paging), the device's free memory
/// (CUDA), `None` on the CPU (the machine's memory).
/// What [`device_memory`] is, for messages.
pub const DEVICE_MEMORY_NAME: &str = match cfg!(target_os = "macos") {
    true => "recommended working set",
    false => "free memory",
};

pub fn device_memory() -> Option<u64> {
    if mlx::default_device() != Device::Gpu {
        return None;
    }
    mlx::memory::device_memory().filter(|&b| b > 0)
}

/// What the budget's memory holds now, before a job's model loads: where the models compute in
/// the machine's memory (the CPU, and a Mac's unified memory), the process's resident memory or
/// MLX's live arrays, whichever is more (Metal's buffers need not count as resident); nothing
/// on a discrete GPU, whose memory the process has not touched yet. What it holds now, not its
/// peak: a server's earlier large job has given its memory back.
pub fn held_before_loading() -> u64 {
    if device_memory().is_some() && !cfg!(target_os = "macos") {
        return 0;
    }
    let mlx = mlx::memory::active_memory() as u64;
    resident_bytes().unwrap_or(0).max(mlx)
}

/// The memory this process holds resident now, in bytes.
#[cfg(target_os = "linux")]
pub fn resident_bytes() -> Option<u64> {
    // statm: total and resident sizes in pages.
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a process-independent system value and has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (page > 0).then(|| pages * page as u64)
}

/// The memory this process holds resident now, in bytes.
#[cfg(target_os = "macos")]
pub fn resident_bytes() -> Option<u64> {
    let mut info = std::mem::MaybeUninit::<libc::mach_task_basic_info>::zeroed();
    let mut count = libc::MACH_TASK_BASIC_INFO_COUNT;
    // SAFETY: `info` is writable memory of the struct's size, and `count` says how many
    // natural_t words it holds; task_info writes at most that many into it.
    #[allow(deprecated)]
    // libc points to the mach2 crate for mach_task_self, a dependency for one call
    let rc = unsafe {
        libc::task_info(
            libc::mach_task_self(),
            libc::MACH_TASK_BASIC_INFO,
            info.as_mut_ptr().cast(),
            &mut count,
        )
    };
    if rc != libc::KERN_SUCCESS {
        return None;
    }
    // SAFETY: task_info succeeded, so it filled the struct.
    let info = unsafe { info.assume_init() };
    Some(info.resident_size)
}

/// The memory this process holds resident now, in bytes; unknown on this platform.
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub fn resident_bytes() -> Option<u64> {
    None
}

/// Prepares MLX's allocator for a run of the GPU graph: on Metal, wires up to the recommended
/// working set so that the weights are not paged out between steps (a no-op elsewhere).
pub fn prepare_device_memory() {
    if graph() == Graph::Gpu && cfg!(target_os = "macos") {
        if let Some(limit) = device_memory() {
            mlx::memory::set_wired_limit(limit as usize);
        }
    }
}

/// Whether MLX is about to compile GPU kernels in this process for the first time on this
/// machine: a CUDA build whose kernel cache folder is missing or empty. Returns that folder.
pub fn kernels_compile_first(kernel_cache: Option<&std::path::Path>) -> Option<std::path::PathBuf> {
    if !mlx::runtime::OPENED_AT_START || mlx::default_device() != Device::Gpu {
        return None;
    }
    let dir = kernel_cache?.to_path_buf();
    let empty = match std::fs::read_dir(&dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(_) => true,
    };
    empty.then_some(dir)
}

/// The line that says MLX is about to compile its GPU kernels into `dir` for the first time.
pub fn first_compile_note(dir: &std::path::Path) -> String {
    format!(
        "note: first GPU run on this machine: MLX compiles its kernels into {} before the first \
         image (once per machine; up to a couple of minutes, later runs start at once)",
        dir.display()
    )
}

/// Raises the soft limit on open files to at least `wanted` (capped at the hard limit), since
/// a stored model can have thousands of blobs open while it loads. Returns the limit in force.
#[cfg(unix)]
// rlim_t is u64 on the platforms we build for, but not on every Unix.
#[allow(clippy::unnecessary_cast)]
pub fn raise_open_file_limit(wanted: u64) -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a live, writable rlimit; getrlimit writes only into it.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let current = lim.rlim_cur as u64;
    if current >= wanted {
        return Ok(current);
    }
    lim.rlim_cur = wanted
        .min(lim.rlim_max as u64)
        .min(open_file_ceiling().unwrap_or(u64::MAX)) as libc::rlim_t;
    // SAFETY: `lim` is a live rlimit; setrlimit only reads it.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(lim.rlim_cur as u64)
}

/// The most open files the system lets one process have, where that is below what
/// `RLIMIT_NOFILE`'s hard limit says: macOS's `setrlimit` refuses a soft limit above
/// `kern.maxfilesperproc` even when the hard limit is "unlimited". `None` elsewhere.
#[cfg(target_os = "macos")]
fn open_file_ceiling() -> Option<u64> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>();
    // SAFETY: the name is a NUL-terminated C string; `value` and `len` are live and writable,
    // and `len` holds `value`'s size, which is all sysctlbyname writes; no new value is set.
    let status = unsafe {
        libc::sysctlbyname(
            c"kern.maxfilesperproc".as_ptr(),
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    // Darwin's <sys/syslimits.h> OPEN_MAX (10240), the documented ceiling, should the sysctl fail.
    Some(if status == 0 && value > 0 {
        value as u64
    } else {
        10240
    })
}

#[cfg(not(target_os = "macos"))]
fn open_file_ceiling() -> Option<u64> {
    None
}

/// Bytes an unprivileged process may still write on the file system holding `path`.
#[cfg(unix)]
pub fn free_disk_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` points to writable memory of the struct's
    // size; statvfs fills it completely when it returns 0.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so the struct is initialised.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(not(unix))]
pub fn free_disk_bytes(_path: &std::path::Path) -> Option<u64> {
    None
}

/// The memory this machine has, in bytes: physical memory, or a smaller cgroup limit on Linux.
pub fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf reads process-independent system values and has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let physical = (pages > 0 && page > 0).then(|| pages as u64 * page as u64)?;
    #[cfg(target_os = "linux")]
    {
        let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if let Some(limit) = cgroup {
            return Some(physical.min(limit));
        }
    }
    Some(physical)
}

/// The most memory this process has held resident so far (its peak RSS), in bytes.
pub fn peak_resident_bytes() -> Option<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given, which is valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: getrusage returned 0, so it filled the struct.
    let max = unsafe { usage.assume_init() }.ru_maxrss as u64;
    // Linux reports KiB, macOS bytes.
    if cfg!(target_os = "macos") {
        Some(max)
    } else {
        Some(max * 1024)
    }
}

/// Makes freed memory go back to the system instead of staying in the allocator's free
/// lists, so that one phase's weights do not stay resident under the next phase's. glibc's
/// dynamic mmap threshold would otherwise rise to 32 MiB after the first large free, serving
/// later weights from a heap that never shrinks. Call once at start.
pub fn return_freed_memory_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator tuning; any value is accepted or refused.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, RETURN_MMAP_THRESHOLD);
        }
        RETURNS_FREED_MEMORY.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The mmap threshold of [`return_freed_memory_to_the_system`], and glibc's default trim
/// threshold, which an explicit mmap threshold leaves in force.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const RETURN_MMAP_THRESHOLD: i32 = 1 << 20;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const DEFAULT_TRIM_THRESHOLD: i32 = 128 << 10;
/// glibc's largest mmap threshold on 64-bit targets.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MAX_MMAP_THRESHOLD: i32 = 32 << 20;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static RETURNS_FREED_MEMORY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// While it lives, buffers of up to 32 MiB freed by MLX stay in the allocator's heap for the
/// next ones, where [`return_freed_memory_to_the_system`] would unmap each one. A denoising step
/// frees and allocates the same activations as the step before; mapped afresh, each costs its
/// page faults and zeroing again (about 60 000 faults per step of the 512² "big" test model on
/// the CPU, `perf stat`). Dropping it restores the thresholds and trims the heap, so the memory
/// goes back after the phase as before. Does nothing unless the process asked for
/// [`return_freed_memory_to_the_system`].
pub struct ReuseFreedMemory(());

impl ReuseFreedMemory {
    pub fn start() -> ReuseFreedMemory {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if RETURNS_FREED_MEMORY.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: mallopt only changes allocator tuning; any value is accepted or refused.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MAX_MMAP_THRESHOLD);
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            }
        }
        ReuseFreedMemory(())
    }
}

impl Drop for ReuseFreedMemory {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if RETURNS_FREED_MEMORY.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: mallopt only changes allocator tuning; malloc_trim only releases free
            // memory of the allocator.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, RETURN_MMAP_THRESHOLD);
                libc::mallopt(libc::M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD);
                libc::malloc_trim(0);
            }
        }
    }
}

/// Gives memory the allocator holds free back to the system (after a phase ends).
pub fn trim_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Lets a write to a closed pipe end the process quietly, as in every Unix tool (`zimage list |
/// head -0`): Rust ignores SIGPIPE, so `println!` would panic on the broken pipe instead. Call
/// first thing in `main`, before anything writes.
pub fn end_quietly_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: `signal` is safe to call from any thread (the disposition is the process's, set
    // atomically by the kernel); restoring SIGPIPE's default touches no memory of ours.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Asks the kernel to start writing `file` to the disk without waiting for it, so that one
/// sync after many files finds most of their bytes already written. Only a hint: its failure
/// leaves the work, and the error, to that sync. Linux only; elsewhere nothing.
pub fn start_writeback(file: &std::fs::File) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `file` is an open file descriptor for the duration of the call, and offset 0
        // with length 0 names the whole file; the call only schedules writeback.
        let _ = unsafe {
            libc::sync_file_range(
                std::os::fd::AsRawFd::as_raw_fd(file),
                0,
                0,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Makes every file written under `root` durable: one `syncfs` of its filesystem on Linux,
/// elsewhere an fsync of each of `paths`. The error names the path it failed on.
pub fn sync_filesystem(
    root: &std::path::Path,
    paths: &[std::path::PathBuf],
) -> Result<(), (std::path::PathBuf, std::io::Error)> {
    #[cfg(target_os = "linux")]
    {
        let _ = paths;
        let dir = std::fs::File::open(root).map_err(|e| (root.to_path_buf(), e))?;
        // SAFETY: `dir` is an open file descriptor for the duration of the call; syncfs only
        // flushes the filesystem that holds it.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
            return Err((root.to_path_buf(), std::io::Error::last_os_error()));
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = root;
        for p in paths {
            std::fs::File::open(p)
                .and_then(|f| f.sync_all())
                .map_err(|e| (p.clone(), e))?;
        }
        Ok(())
    }
}

/// zimage's cache folder: `$ZIMAGE_CACHE_DIR`, else `~/.cache/zimage`.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("ZIMAGE_CACHE_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/zimage"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_weights_widen_for_many_rows_on_the_gpu_graph_only() {
        let few = WIDEN_QUANTIZED_ROWS - 1;
        assert!(widens_quantized(Graph::Gpu, WIDEN_QUANTIZED_ROWS));
        assert!(widens_quantized(Graph::Gpu, 4096));
        assert!(!widens_quantized(Graph::Gpu, few));
        assert!(!widens_quantized(Graph::Gpu, 1));
        assert!(!widens_quantized(Graph::Cpu, WIDEN_QUANTIZED_ROWS));
        assert!(!widens_quantized(Graph::Cpu, few));
    }
}
