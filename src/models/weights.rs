//! Binding checkpoint tensors to modules, and the leaf layers built from them.
//!
//! A [`Checkpoint`] holds one component's tensors by name. Modules take a [`Weights`] view
//! scoped to their prefix (`w.pp("layers").pp(3)`) and ask for tensors with the shape they
//! expect. A missing or mis-shaped tensor does not stop construction: it is recorded, a
//! stand-in is returned, and [`Checkpoint::finish`] reports every problem at once, together
//! with every tensor nothing asked for, so a wrong checkpoint is diagnosed in one run.

use crate::mlx::{self, ops, Array, Dtype};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

/// What is wrong with a checkpoint for the model being built.
#[derive(Debug, thiserror::Error)]
#[error("{component}: the checkpoint does not fit the model:\n{}", problems.join("\n"))]
pub struct LoadError {
    pub component: String,
    pub problems: Vec<String>,
}

/// One component's tensors, with bookkeeping of what the model used.
pub struct Checkpoint {
    component: String,
    tensors: HashMap<String, Array>,
    /// Weights are cast to this dtype as they are bound.
    dtype: Dtype,
    used: RefCell<BTreeSet<String>>,
    problems: RefCell<Vec<String>>,
    /// Names under these prefixes may go unused (parts of a checkpoint a pipeline never runs).
    unused_ok: Vec<String>,
}

impl Checkpoint {
    pub fn new(component: &str, tensors: HashMap<String, Array>, dtype: Dtype) -> Checkpoint {
        Checkpoint {
            component: component.to_string(),
            tensors,
            dtype,
            used: RefCell::default(),
            problems: RefCell::default(),
            unused_ok: Vec::new(),
        }
    }

    /// Renames every tensor by `f` (the one place checkpoint naming differences are absorbed).
    pub fn rename(mut self, f: impl Fn(&str) -> String) -> Checkpoint {
        self.tensors = self.tensors.into_iter().map(|(k, v)| (f(&k), v)).collect();
        self
    }

    /// Accepts that tensors under `prefix` are not used.
    pub fn allow_unused(&mut self, prefix: &str) {
        self.unused_ok.push(prefix.to_string());
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    pub fn root(&self) -> Weights<'_> {
        Weights {
            ckpt: self,
            prefix: String::new(),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Ends binding: errors with every missing, mis-shaped and unexpected tensor.
    pub fn finish(self) -> Result<(), LoadError> {
        let used = self.used.into_inner();
        let mut problems = self.problems.into_inner();
        let mut unused: Vec<&String> = self
            .tensors
            .keys()
            .filter(|k| {
                !used.contains(*k) && !self.unused_ok.iter().any(|p| k.starts_with(p.as_str()))
            })
            .collect();
        unused.sort();
        problems.extend(unused.into_iter().map(|k| format!("  unused tensor `{k}`")));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(LoadError {
                component: self.component,
                problems,
            })
        }
    }
}

/// A view of a checkpoint under a name prefix.
#[derive(Clone)]
pub struct Weights<'a> {
    ckpt: &'a Checkpoint,
    prefix: String,
}

impl<'a> Weights<'a> {
    /// Narrows to `prefix.name`.
    pub fn pp(&self, name: impl std::fmt::Display) -> Weights<'a> {
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        Weights {
            ckpt: self.ckpt,
            prefix,
        }
    }

    fn full_name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// The tensor `name` with exactly `shape`, cast to the compute dtype.
    pub fn get(&self, name: &str, shape: &[i32]) -> mlx::Result<Array> {
        let full = self.full_name(name);
        match self.ckpt.tensors.get(&full) {
            Some(t) if t.shape() == shape => {
                self.ckpt.used.borrow_mut().insert(full);
                if t.dtype() == self.ckpt.dtype {
                    Ok(t.clone())
                } else {
                    t.astype(self.ckpt.dtype)
                }
            }
            Some(t) => {
                self.ckpt.used.borrow_mut().insert(full.clone());
                self.ckpt.problems.borrow_mut().push(format!(
                    "  `{full}`: expected shape {shape:?}, got {:?}",
                    t.shape()
                ));
                Array::zeros(shape, self.ckpt.dtype)
            }
            None => {
                self.ckpt
                    .problems
                    .borrow_mut()
                    .push(format!("  missing tensor `{full}` (shape {shape:?})"));
                Array::zeros(shape, self.ckpt.dtype)
            }
        }
    }

    /// Whether `name` exists under this prefix.
    pub fn contains(&self, name: &str) -> bool {
        self.ckpt.contains(&self.full_name(name))
    }
}

/// `y = x·Wᵀ + b`, weights in PyTorch's `[out, in]` layout.
pub struct Linear {
    weight: Array,
    bias: Option<Array>,
}

impl Linear {
    pub fn new(w: &Weights, in_dim: i32, out_dim: i32, bias: bool) -> mlx::Result<Linear> {
        let weight = w.get("weight", &[out_dim, in_dim])?;
        let bias = if bias {
            Some(w.get("bias", &[out_dim])?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    pub fn forward(&self, x: &Array) -> mlx::Result<Array> {
        let wt = self.weight.transpose(&[1, 0])?;
        match &self.bias {
            Some(b) => ops::addmm(b, x, &wt, 1.0, 1.0),
            None => ops::matmul(x, &wt),
        }
    }
}

/// RMS norm over the last axis, statistics in f32. In f32 the fused kernel; in a narrower dtype
/// the reference's two steps, so that it rounds where the reference does: normalise in f32,
/// round to the activation dtype, then multiply by the weight.
pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    pub fn new(w: &Weights, dim: i32, eps: f32) -> mlx::Result<RmsNorm> {
        Ok(RmsNorm {
            weight: w.get("weight", &[dim])?,
            eps,
        })
    }

    pub fn forward(&self, x: &Array) -> mlx::Result<Array> {
        if x.dtype() == Dtype::F32 {
            return mlx::fast::rms_norm(x, Some(&self.weight), self.eps);
        }
        let x32 = x.astype(Dtype::F32)?;
        let inv_rms = (x32.square()?.mean(&[-1], true)? + self.eps)?.rsqrt()?;
        (x32 * inv_rms)?.astype(x.dtype())? * &self.weight
    }
}
