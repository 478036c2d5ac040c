//! Ops that move, select or join elements without computing new values: reshaping, axis
//! permutations, broadcasting, slicing, gathering, joining, splitting and padding.

use crate::mlx::array::{call, check, shim_call, Array};
use crate::mlx::error::{Error, Result};
use crate::mlx::ffi;
use std::ptr::NonNull;

impl Array {
    /// The same elements in row-major order, as `shape` (one axis may be -1: what is left).
    #[track_caller]
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        shim_call!(
            "reshape",
            mlxs_reshape(self.as_ptr(), shape.as_ptr(), shape.len())
        )
    }

    /// The axes in the order `axes` gives.
    #[track_caller]
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        shim_call!(
            "transpose",
            mlxs_transpose(self.as_ptr(), axes.as_ptr(), axes.len())
        )
    }

    /// Axes `a` and `b` exchanged.
    #[track_caller]
    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        shim_call!("swapaxes", mlxs_swapaxes(self.as_ptr(), a, b))
    }

    /// A new axis of size 1 at `axis`.
    #[track_caller]
    pub fn expand_dims(&self, axis: i32) -> Result<Array> {
        shim_call!("expand_dims", mlxs_expand_dims(self.as_ptr(), axis))
    }

    /// Axis `axis`, of size 1, removed.
    #[track_caller]
    pub fn squeeze(&self, axis: i32) -> Result<Array> {
        shim_call!("squeeze", mlxs_squeeze(self.as_ptr(), axis))
    }

    /// The array repeated to `shape` by numpy's broadcasting rules, without copying.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        shim_call!(
            "broadcast_to",
            mlxs_broadcast_to(self.as_ptr(), shape.as_ptr(), shape.len())
        )
    }

    /// Repeats each element `repeats` times along `axis` (`[a, b]` → `[a, a, b, b]`).
    #[track_caller]
    pub fn repeat(&self, repeats: i32, axis: i32) -> Result<Array> {
        shim_call!("repeat", mlxs_repeat(self.as_ptr(), repeats, axis))
    }

    /// `self[start:stop:strides]`, one entry per axis.
    #[track_caller]
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        let n = self.ndim();
        if start.len() != n || stop.len() != n || strides.len() != n {
            return Err(Error::new(
                "slice",
                format!(
                    "needs {n} start, stop and stride values for shape {:?}",
                    self.shape()
                ),
            ));
        }
        call("slice", |out| {
            // SAFETY: `out` is `call`'s local; the handle is live for the call; the shim reads
            // `n` entries from each list, and all three were checked to have `n` above.
            unsafe {
                ffi::mlxs_slice(
                    out,
                    self.as_ptr(),
                    start.as_ptr(),
                    stop.as_ptr(),
                    strides.as_ptr(),
                    n,
                )
            }
        })
    }

    /// `self[..., start:stop, ...]` along one axis.
    #[track_caller]
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        let shape = self.shape();
        let n = shape.len() as i32;
        let ax = if axis < 0 { axis + n } else { axis };
        if ax < 0 || ax >= n {
            return Err(Error::new(
                "slice_axis",
                format!("axis {axis} out of range for shape {shape:?}"),
            ));
        }
        let mut lo = vec![0; shape.len()];
        let mut hi = shape.clone();
        lo[ax as usize] = start;
        hi[ax as usize] = stop;
        self.slice(&lo, &hi, &vec![1; shape.len()])
    }

    /// Gathers along `axis` with integer `indices`.
    #[track_caller]
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        shim_call!("take", mlxs_take(self.as_ptr(), indices.as_ptr(), axis))
    }

    /// Picks elements along `axis` with `indices` of the same rank (numpy's `take_along_axis`).
    #[track_caller]
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        shim_call!(
            "take_along_axis",
            mlxs_take_along_axis(self.as_ptr(), indices.as_ptr(), axis)
        )
    }
}

/// Joins arrays end to end along an existing `axis`.
#[track_caller]
pub fn concatenate(xs: &[&Array], axis: i32) -> Result<Array> {
    let ptrs: Vec<_> = xs.iter().map(|x| x.as_ptr()).collect();
    shim_call!(
        "concatenate",
        mlxs_concatenate(ptrs.as_ptr(), ptrs.len(), axis)
    )
}

/// Joins same-shaped arrays along a new `axis`.
#[track_caller]
pub fn stack(xs: &[&Array], axis: i32) -> Result<Array> {
    let ptrs: Vec<_> = xs.iter().map(|x| x.as_ptr()).collect();
    shim_call!("stack", mlxs_stack(ptrs.as_ptr(), ptrs.len(), axis))
}

/// Splits into `parts` equal pieces along `axis`.
#[track_caller]
pub fn split(a: &Array, parts: i32, axis: i32) -> Result<Vec<Array>> {
    split_impl(a, parts, &[], axis, parts.max(0) as usize)
}

/// Splits before each of `indices` along `axis` (`indices.len() + 1` pieces).
#[track_caller]
pub fn split_at(a: &Array, indices: &[i32], axis: i32) -> Result<Vec<Array>> {
    split_impl(a, 0, indices, axis, indices.len() + 1)
}

#[track_caller]
fn split_impl(a: &Array, parts: i32, indices: &[i32], axis: i32, max: usize) -> Result<Vec<Array>> {
    let mut outs = vec![std::ptr::null_mut(); max];
    let mut count = 0usize;
    // SAFETY: `outs` has room for `max` handles, the bound passed, and the shim refuses to
    // write more; `count` is a local; the handle and `indices` (with its own length) are live
    // for the call.
    let status = unsafe {
        ffi::mlxs_split(
            outs.as_mut_ptr(),
            max,
            &mut count,
            a.as_ptr(),
            parts,
            indices.as_ptr(),
            indices.len(),
            axis,
        )
    };
    check("split", status)?;
    Ok(outs[..count]
        .iter()
        .map(|&p| Array::from_raw(NonNull::new(p).expect("split filled every piece")))
        .collect())
}

/// Pads with a constant; one `(before, after)` pair per axis.
#[track_caller]
pub fn pad(a: &Array, widths: &[(i32, i32)], value: f32) -> Result<Array> {
    if widths.len() != a.ndim() {
        return Err(Error::new(
            "pad",
            format!(
                "needs {} (low, high) pairs for shape {:?}, got {}",
                a.ndim(),
                a.shape(),
                widths.len()
            ),
        ));
    }
    let low: Vec<i32> = widths.iter().map(|w| w.0).collect();
    let high: Vec<i32> = widths.iter().map(|w| w.1).collect();
    call("pad", |out| {
        // SAFETY: `out` is `call`'s local; the handle is live for the call; `low` and `high`
        // were both made from `widths`, so each holds the `low.len()` entries the shim reads.
        unsafe {
            ffi::mlxs_pad(
                out,
                a.as_ptr(),
                low.as_ptr(),
                high.as_ptr(),
                low.len(),
                value,
            )
        }
    })
}
