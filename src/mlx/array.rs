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

unsafe impl Send for Array {}

/// Takes the per-thread message the shim recorded for the call that just failed.
#[track_caller]
pub(crate) fn last_error(op: &'static str) -> Error {
    let msg = unsafe { CStr::from_ptr(ffi::mlxs_last_error()) }
        .to_string_lossy()
        .into_owned();
    Error::new(op, msg)
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
        let expected: i64 = shape.iter().map(|&d| d as i64).product();
        if expected != data.len() as i64 {
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
        let numel: i64 = shape.iter().map(|&d| d as i64).product();
        if numel < 0 || numel as usize * dtype.size_bytes() != bytes.len() {
            return Err(Error::new(
                "from_bytes",
                format!(
                    "shape {shape:?} of {dtype} needs {} bytes, got {}",
                    numel.max(0) as usize * dtype.size_bytes(),
                    bytes.len()
                ),
            ));
        }
        call("from_bytes", |out| unsafe {
            ffi::mlxs_array_from_bytes(
                out,
                bytes.as_ptr() as *const c_void,
                shape.as_ptr(),
                shape.len(),
                dtype.code(),
            )
        })
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
        unsafe extern "C" fn release(ctx: *mut c_void) {
            drop(Box::from_raw(ctx as *mut Box<dyn std::any::Any + Send>));
        }
        let ctx = Box::into_raw(Box::new(owner)) as *mut c_void;
        call("from_external", |out| {
            ffi::mlxs_array_from_external(
                out,
                ptr as *mut c_void,
                shape.as_ptr(),
                shape.len(),
                dtype.code(),
                release,
                ctx,
            )
        })
    }

    #[track_caller]
    pub fn scalar<T: ArrayElement>(v: T) -> Result<Array> {
        Array::from_slice(&[v], &[])
    }

    #[track_caller]
    pub fn full(shape: &[i32], value: f32, dtype: Dtype) -> Result<Array> {
        call("full", |out| unsafe {
            ffi::mlxs_full(out, shape.as_ptr(), shape.len(), value as f64, dtype.code())
        })
    }

    #[track_caller]
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Array::full(shape, 0.0, dtype)
    }

    #[track_caller]
    pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Array::full(shape, 1.0, dtype)
    }

    #[track_caller]
    pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
        call("arange", |out| unsafe {
            ffi::mlxs_arange(out, start, stop, step, dtype.code())
        })
    }

    pub fn shape(&self) -> Vec<i32> {
        unsafe {
            let n = ffi::mlxs_array_ndim(self.as_ptr());
            if n == 0 {
                return Vec::new();
            }
            std::slice::from_raw_parts(ffi::mlxs_array_shape(self.as_ptr()), n).to_vec()
        }
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

    pub fn ndim(&self) -> usize {
        unsafe { ffi::mlxs_array_ndim(self.as_ptr()) }
    }

    pub fn size(&self) -> usize {
        unsafe { ffi::mlxs_array_size(self.as_ptr()) }
    }

    pub fn nbytes(&self) -> usize {
        unsafe { ffi::mlxs_array_nbytes(self.as_ptr()) }
    }

    pub fn dtype(&self) -> Dtype {
        Dtype::from_code(unsafe { ffi::mlxs_array_dtype(self.as_ptr()) })
    }

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
                format!("array holds {}, asked for {}", self.dtype(), T::DTYPE),
            ));
        }
        let n = self.size();
        let mut v = vec![T::default(); n];
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
        let status =
            unsafe { ffi::mlxs_to_bytes(self.as_ptr(), v.as_mut_ptr() as *mut c_void, v.len()) };
        check("to_bytes", status)?;
        Ok(v)
    }
}

impl Clone for Array {
    fn clone(&self) -> Array {
        let mut out = null_mut();
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
        unsafe { ffi::mlxs_array_free(self.ptr.as_ptr()) }
    }
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Array({:?}, {})", self.shape(), self.dtype())
    }
}
