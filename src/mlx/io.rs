//! MLX's own safetensors reader and writer.
//!
//! `load_safetensors` returns lazy arrays: the file is read (into fresh buffers, not mapped)
//! when they are evaluated. `save_safetensors` writes MLX's layout: keys sorted, header not
//! padded, `__metadata__` always present (`null` when empty).

use super::array::{check, Array};
use super::error::{Error, Result};
use super::ffi;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::path::Path;

/// Tensors and metadata of one safetensors file.
#[derive(Debug)]
pub struct Safetensors {
    /// Each tensor by its name in the file, lazy until evaluated.
    pub tensors: HashMap<String, Array>,
    /// The file's `__metadata__` entries.
    pub metadata: HashMap<String, String>,
}

fn c_path(op: &'static str, path: &Path) -> Result<CString> {
    CString::new(path.to_string_lossy().as_bytes())
        .map_err(|_| Error::new(op, format!("path `{}` contains a NUL byte", path.display())))
}

/// Reads a safetensors file's header now and its tensors when they are evaluated.
#[track_caller]
pub fn load_safetensors(path: &Path) -> Result<Safetensors> {
    let cpath = c_path("load_safetensors", path)?;
    let (mut names, mut arrays, mut n) = (std::ptr::null_mut(), std::ptr::null_mut(), 0usize);
    let (mut mk, mut mv, mut nm) = (std::ptr::null_mut(), std::ptr::null_mut(), 0usize);
    // SAFETY: the six out-pointers are locals the shim writes on success; `cpath` is a live
    // NUL-terminated path.
    let status = unsafe {
        ffi::mlxs_load_safetensors(
            cpath.as_ptr(),
            &mut names,
            &mut arrays,
            &mut n,
            &mut mk,
            &mut mv,
            &mut nm,
        )
    };
    check("load_safetensors", status).map_err(|e| Error {
        message: format!("`{}`: {}", path.display(), e.message),
        ..e
    })?;
    let take = |p: *mut c_char| {
        // SAFETY: `p` is one of the NUL-terminated strings the loader allocated, which stay
        // valid until they are freed below, after the last `take`.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    };
    let mut tensors = HashMap::with_capacity(n);
    let mut metadata = HashMap::with_capacity(nm);
    // SAFETY: on success the loader filled `n` names and `n` array handles, and `nm` keys and
    // values; each handle is taken over exactly once, and each list is freed once, with the
    // shim's own functions, after its last read.
    unsafe {
        for i in 0..n {
            let a = Array::from_raw(
                std::ptr::NonNull::new(*arrays.add(i)).expect("loader filled every slot"),
            );
            tensors.insert(take(*names.add(i)), a);
        }
        for i in 0..nm {
            metadata.insert(take(*mk.add(i)), take(*mv.add(i)));
        }
        ffi::mlxs_free_strings(names, n);
        ffi::mlxs_free_array_list(arrays);
        ffi::mlxs_free_strings(mk, nm);
        ffi::mlxs_free_strings(mv, nm);
    }
    Ok(Safetensors { tensors, metadata })
}

/// Evaluates `tensors` and writes them, with `metadata`, as one safetensors file.
#[track_caller]
pub fn save_safetensors(
    path: &Path,
    tensors: &[(&str, &Array)],
    metadata: &[(&str, &str)],
) -> Result<()> {
    let cpath = c_path("save_safetensors", path)?;
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| {
            Error::new(
                "save_safetensors",
                format!("name `{s}` contains a NUL byte"),
            )
        })
    };
    let names = tensors
        .iter()
        .map(|(n, _)| cstr(n))
        .collect::<Result<Vec<_>>>()?;
    let keys = metadata
        .iter()
        .map(|(k, _)| cstr(k))
        .collect::<Result<Vec<_>>>()?;
    let values = metadata
        .iter()
        .map(|(_, v)| cstr(v))
        .collect::<Result<Vec<_>>>()?;
    let name_ptrs: Vec<_> = names.iter().map(|c| c.as_ptr()).collect();
    let key_ptrs: Vec<_> = keys.iter().map(|c| c.as_ptr()).collect();
    let value_ptrs: Vec<_> = values.iter().map(|c| c.as_ptr()).collect();
    let arrays: Vec<_> = tensors.iter().map(|(_, a)| a.as_ptr()).collect();
    // SAFETY: the names and handles, and the keys and values, are parallel lists of the
    // lengths passed, borrowed from CStrings and Arrays that live until the call returns.
    let status = unsafe {
        ffi::mlxs_save_safetensors(
            cpath.as_ptr(),
            name_ptrs.as_ptr(),
            arrays.as_ptr(),
            arrays.len(),
            key_ptrs.as_ptr(),
            value_ptrs.as_ptr(),
            key_ptrs.len(),
        )
    };
    check("save_safetensors", status).map_err(|e| Error {
        message: format!("`{}`: {}", path.display(), e.message),
        ..e
    })
}
