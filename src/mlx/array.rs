//! `Array`: an owned handle to one node of MLX's lazy graph.

use super::dtype::{ArrayElement, Dtype};
use super::error::{Error, Result};
use super::ffi;
use std::cell::Cell;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};
use std::ptr::{null, null_mut, NonNull};

/// A handle to an MLX array. Cloning makes a new handle to the same node (cheap); dropping the
/// last handle lets MLX free the buffer. Handles may move between threads but not be shared
/// by reference across them, as MLX's graph is not built for concurrent mutation.
pub struct Array {
    ptr: NonNull<ffi::mlxs_array>,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the handle owns its mlxs_array outright (nothing else frees it), and MLX's arrays are
// reference-counted with atomic counts, so the handle may be used and dropped on another thread;
// `_not_sync` keeps it from being shared by reference.
unsafe impl Send for Array {}

/// Takes the per-thread message the shim recorded for the call that just failed.
#[track_caller]
pub(crate) fn last_error(op: &'static str) -> Error {
    // SAFETY: the shim returns this thread's NUL-terminated message, which stays valid until the
    // next shim call on this thread; it is copied out before any other call.
    let msg = unsafe { CStr::from_ptr(ffi::mlxs_last_error()) }
        .to_string_lossy()
        .into_owned();
    Error::new(op, msg)
}

/// The number of elements `shape` describes, refusing negative dimensions (which MLX would take
/// as given) and counts that overflow, before any of it reaches the shim.
#[track_caller]
fn element_count(op: &'static str, shape: &[i32]) -> Result<usize> {
    shape.iter().try_fold(1usize, |n, &d| {
        let d = usize::try_from(d)
            .map_err(|_| Error::new(op, format!("shape {shape:?} has a negative dimension")))?;
        n.checked_mul(d).ok_or_else(|| {
            Error::new(
                op,
                format!("shape {shape:?} holds more elements than memory can address"),
            )
        })
    })
}

/// Runs one shim call that produces an array; every wrapper goes through here.
#[track_caller]
pub(crate) fn call(
    op: &'static str,
    f: impl FnOnce(*mut *mut ffi::mlxs_array) -> c_int,
) -> Result<Array> {
    let mut out = null_mut();
    let status = f(&mut out);
    match NonNull::new(out) {
        Some(ptr) if status == 0 => Ok(Array::from_raw(ptr)),
        _ => Err(last_error(op)),
    }
}

/// Calls shim function `$f` with a fresh out-pointer before `$args`, through [`call`].
///
/// The arguments are not checked, so every use must pass only: handles of `Array`s borrowed for
/// the whole call (`x.as_ptr()`), `Array::opt_ptr` where shim.h says the parameter may be null,
/// a slice's `as_ptr()` with that same slice's `len()`, C strings that outlive the call, and
/// plain numbers. An argument of any other kind needs its own `unsafe` block and reasoning.
macro_rules! shim_call {
    ($op:expr, $f:ident($($arg:expr),* $(,)?)) => {
        $crate::mlx::array::call($op, |out| {
            // SAFETY: `out` points to `call`'s own local, which the shim writes once. By this
            // macro's contract every other argument is a live handle borrowed for the call, a
            // null the shim accepts, a pointer with its own slice's length, a C string that
            // outlives the call, or a number; the shim only reads them, and keeps no pointer to
            // them past the call (arrays it keeps, it keeps by reference count). The Rust
            // declaration of `$f` is checked against shim.h by tests/ffi_signatures.rs.
            unsafe { $crate::mlx::ffi::$f(out, $($arg),*) }
        })
    };
}
pub(crate) use shim_call;

/// Runs one shim call that produces nothing but a status.
#[track_caller]
pub(crate) fn check(op: &'static str, status: c_int) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(last_error(op))
    }
}

impl Array {
    pub(crate) fn from_raw(ptr: NonNull<ffi::mlxs_array>) -> Array {
        Array {
            ptr,
            _not_sync: PhantomData,
        }
    }

    pub(crate) fn as_ptr(&self) -> *const ffi::mlxs_array {
        self.ptr.as_ptr()
    }

    pub(crate) fn opt_ptr(a: Option<&Array>) -> *const ffi::mlxs_array {
        a.map_or(null(), Array::as_ptr)
    }

    /// Copies `data` into a new array of the given shape.
    #[track_caller]
    pub fn from_slice<T: ArrayElement>(data: &[T], shape: &[i32]) -> Result<Array> {
        let expected = element_count("from_slice", shape)?;
        if expected != data.len() {
            return Err(Error::new(
                "from_slice",
                format!(
                    "shape {shape:?} holds {expected} elements, the slice has {}",
                    data.len()
                ),
            ));
        }
        // SAFETY: ArrayElement types are plain data with the layout MLX expects for T::DTYPE.
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data))
        };
        Array::from_bytes(bytes, shape, T::DTYPE)
    }

    /// Copies little-endian raw bytes into a new array of `dtype`.
    #[track_caller]
    pub fn from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        let code = dtype.code("from_bytes")?;
        let needed = element_count("from_bytes", shape)?
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| {
                Error::new(
                    "from_bytes",
                    format!(
                        "shape {shape:?} of {} needs more bytes than memory can address",
                        dtype.lower_name()
                    ),
                )
            })?;
        if needed != bytes.len() {
            return Err(Error::new(
                "from_bytes",
                format!(
                    "shape {shape:?} of {} needs {needed} bytes, got {}",
                    dtype.lower_name(),
                    bytes.len()
                ),
            ));
        }
        // The shim reads exactly `bytes.len()` bytes: numel × dtype size, checked above.
        shim_call!(
            "from_bytes",
            mlxs_array_from_bytes(
                bytes.as_ptr() as *const c_void,
                shape.as_ptr(),
                shape.len(),
                code,
            )
        )
    }

    /// Wraps external memory without a copy where the backend allows it (MLX copies otherwise).
    /// `owner` keeps the memory alive and is dropped exactly once, when MLX lets go of it.
    ///
    /// # Safety
    /// `ptr` must point to at least `numel × dtype size` readable bytes that stay valid and
    /// unchanged for as long as `owner` lives.
    #[track_caller]
    pub unsafe fn from_external(
        ptr: *const u8,
        shape: &[i32],
        dtype: Dtype,
        owner: Box<dyn std::any::Any + Send>,
    ) -> Result<Array> {
        // SAFETY: forwarded to the caller.
        unsafe { Array::wrap_external(false, ptr, shape, dtype, owner) }
    }

    /// [`Array::from_external`] for mapped file data, wrapped without a copy on the CPU
    /// wherever it lies (the GPUs' rules otherwise). The array never lends its memory to an
    /// output.
    ///
    /// # Safety
    /// As [`Array::from_external`], and the 8 bytes before `ptr` must be readable too (a
    /// tensor's data in a mapped safetensors file always has its header before it).
    #[track_caller]
    pub unsafe fn from_mapped(
        ptr: *const u8,
        shape: &[i32],
        dtype: Dtype,
        owner: Box<dyn std::any::Any + Send>,
    ) -> Result<Array> {
        // SAFETY: forwarded to the caller.
        unsafe { Array::wrap_external(true, ptr, shape, dtype, owner) }
    }

    #[track_caller]
    unsafe fn wrap_external(
        mapped: bool,
        ptr: *const u8,
        shape: &[i32],
        dtype: Dtype,
        owner: Box<dyn std::any::Any + Send>,
    ) -> Result<Array> {
        unsafe extern "C" fn release(ctx: *mut c_void) {
            // SAFETY: `ctx` is the box made below, and the shim calls the deleter exactly once
            // (when MLX frees the buffer, or at once if the array could not be made).
            drop(unsafe { Box::from_raw(ctx as *mut Box<dyn std::any::Any + Send>) });
        }
        // Checked before the owner is handed over, so an error cannot leak it.
        let code = dtype.code("from_external")?;
        let ctx = Box::into_raw(Box::new(owner)) as *mut c_void;
        call("from_external", |out| {
            // SAFETY: `out` is `call`'s local; `ptr` holds numel × dtype size bytes kept valid by
            // `owner` (this function's contract), and MLX only reads them; `ctx` is handed over
            // with `release`, which the shim calls exactly once.
            unsafe {
                ffi::mlxs_array_wrap(
                    out,
                    ptr as *mut c_void,
                    shape.as_ptr(),
                    shape.len(),
                    code,
                    c_int::from(mapped),
                    release,
                    ctx,
                )
            }
        })
    }

    /// A 0-dimensional array holding `v`.
    #[track_caller]
    pub fn scalar<T: ArrayElement>(v: T) -> Result<Array> {
        Array::from_slice(&[v], &[])
    }

    /// An array of `shape` with every element `value`, as `dtype`.
    #[track_caller]
    pub fn full(shape: &[i32], value: f32, dtype: Dtype) -> Result<Array> {
        let code = dtype.code("full")?;
        shim_call!(
            "full",
            mlxs_full(shape.as_ptr(), shape.len(), value as f64, code)
        )
    }

    /// An array of `shape` filled with 0.
    #[track_caller]
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Array::full(shape, 0.0, dtype)
    }

    /// An array of `shape` filled with 1.
    #[track_caller]
    pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Array::full(shape, 1.0, dtype)
    }

    /// `start, start + step, …` up to but not including `stop`, as a 1-D array.
    #[track_caller]
    pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
        let code = dtype.code("arange")?;
        shim_call!("arange", mlxs_arange(start, stop, step, code))
    }

    /// The size of each axis.
    pub fn shape(&self) -> Vec<i32> {
        let n = self.ndim();
        if n == 0 {
            return Vec::new();
        }
        // SAFETY: the shim returns the array's own shape, `ndim` i32s that live as long as the
        // array and do not change; they are copied while `self` is borrowed.
        unsafe { std::slice::from_raw_parts(ffi::mlxs_array_shape(self.as_ptr()), n).to_vec() }
    }

    /// One of the shim's facts about an array: a function of the handle alone.
    fn fact<T>(&self, f: unsafe extern "C" fn(*const ffi::mlxs_array) -> T) -> T {
        // SAFETY: `f` only reads the array behind the handle, which `self` keeps alive.
        unsafe { f(self.as_ptr()) }
    }

    /// Size of one axis (negative axes count from the end). Panics on an axis out of range,
    /// like slice indexing: callers know the rank of what they built.
    pub fn dim(&self, axis: i32) -> i32 {
        let shape = self.shape();
        let i = if axis < 0 {
            shape.len() as i32 + axis
        } else {
            axis
        };
        shape[i as usize]
    }

    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.fact(ffi::mlxs_array_ndim)
    }

    /// The number of elements.
    pub fn size(&self) -> usize {
        self.fact(ffi::mlxs_array_size)
    }

    /// The bytes the elements take.
    pub fn nbytes(&self) -> usize {
        self.fact(ffi::mlxs_array_nbytes)
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        Dtype::from_code(self.fact(ffi::mlxs_array_dtype))
    }

    /// Runs the graph that makes this array, so that its data exists.
    #[track_caller]
    pub fn eval(&self) -> Result<()> {
        super::eval(&[self])
    }

    /// Evaluates and copies the elements out, row-major. `T` must match the dtype.
    #[track_caller]
    pub fn to_vec<T: ArrayElement>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::new(
                "to_vec",
                format!(
                    "array holds {}, asked for {}",
                    self.dtype().lower_name(),
                    T::DTYPE.lower_name()
                ),
            ));
        }
        let n = self.size();
        let mut v = vec![T::default(); n];
        // SAFETY: `v` owns n × size_of::<T>() writable bytes, the length passed; the shim checks
        // it against the array's byte size before it writes.
        let status = unsafe {
            ffi::mlxs_to_bytes(
                self.as_ptr(),
                v.as_mut_ptr() as *mut c_void,
                n * std::mem::size_of::<T>(),
            )
        };
        check("to_vec", status)?;
        Ok(v)
    }

    /// Evaluates and returns the only element.
    #[track_caller]
    pub fn item<T: ArrayElement>(&self) -> Result<T> {
        if self.size() != 1 {
            return Err(Error::new(
                "item",
                format!(
                    "array of shape {:?} has {} elements",
                    self.shape(),
                    self.size()
                ),
            ));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// Evaluates and returns the raw little-endian bytes, row-major.
    #[track_caller]
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.nbytes()];
        // SAFETY: `v` owns `v.len()` writable bytes, the length passed.
        let status =
            unsafe { ffi::mlxs_to_bytes(self.as_ptr(), v.as_mut_ptr() as *mut c_void, v.len()) };
        check("to_bytes", status)?;
        Ok(v)
    }
}

impl Clone for Array {
    fn clone(&self) -> Array {
        let mut out = null_mut();
        // SAFETY: `out` is a local the shim writes once; the handle is live for the call.
        let status = unsafe { ffi::mlxs_array_clone(&mut out, self.as_ptr()) };
        // Cloning copies a shared pointer; it fails only when the process is out of memory.
        match NonNull::new(out) {
            Some(ptr) if status == 0 => Array::from_raw(ptr),
            _ => panic!("out of memory cloning an MLX array handle"),
        }
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        // SAFETY: this handle owns the pointer, which nothing else frees, and drop runs once.
        unsafe { ffi::mlxs_array_free(self.ptr.as_ptr()) }
    }
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Array({:?}, {})",
            self.shape(),
            self.dtype().lower_name()
        )
    }
}
