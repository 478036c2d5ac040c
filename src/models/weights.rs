//! Binding checkpoint tensors to modules, and the leaf layers built from them.
//!
//! A [`Checkpoint`] holds one component's tensors by name. Modules take a [`Weights`] view
//! scoped to their prefix (`w.pp("layers").pp(3)`) and ask for tensors with the shape they
//! expect. A missing or mis-shaped tensor does not stop construction: it is recorded, a
//! stand-in is returned, and [`Checkpoint::finish`] reports every problem at once, together
//! with every tensor nothing asked for, so a wrong checkpoint is diagnosed in one run.
//!
//! Linear weights are bound as stored when asked ([`Residency::Stored`]): quantized weights
//! always stay packed, and bf16 weights stay bf16, widened a tile at a time as each layer runs.
//! Streamed weights ([`Residency::Streamed`]) are bound as stored too, from memory maps of the
//! store's files that the model lets go of after each block ([`Release`]).

use crate::mlx::fast::{self, Products};
use crate::mlx::{self, ops, Array, Dtype, QuantizedTensor};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

/// One pair bound to a linear layer: `y += scale · (x·Aᵀ)·Bᵀ`.
#[derive(Clone)]
pub struct LoraPair {
    /// `[rank, in]`, in the compute dtype.
    pub down: Array,
    /// `[out, rank]`, in the compute dtype.
    pub up: Array,
    /// The user's scale times `alpha / rank`.
    pub scale: f32,
}

impl LoraPair {
    /// This pair's term for input `x` (`[…, in]`): `scale · (x·Aᵀ)·Bᵀ`, scaled at the rank-wide
    /// product, where it costs least.
    pub fn delta(&self, x: &Array) -> mlx::Result<Array> {
        let low = x.matmul(&self.down.transpose(&[1, 0])?)?;
        (low * self.scale)?.matmul(&self.up.transpose(&[1, 0])?)
    }
}

/// One component's tensors as stored: plain arrays, and quantized weights kept packed.
#[derive(Default)]
pub struct ComponentWeights {
    pub tensors: HashMap<String, Array>,
    pub quantized: HashMap<String, QuantizedTensor>,
    /// Set when the arrays are mapped from files: lets go of their pages.
    pub release: Option<Release>,
}

/// Lets go of the pages of a component's mapped weights: the process stops holding them, and
/// the next read maps them again from the file (from the OS's page cache while it keeps them).
/// The arrays stay valid throughout.
#[derive(Clone)]
pub struct Release(std::sync::Arc<dyn Fn() + Send + Sync>);

impl Release {
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> Release {
        Release(std::sync::Arc::new(f))
    }

    /// Lets go of the pages now. Call only once what used them is evaluated.
    pub fn release(&self) {
        (self.0)()
    }
}

/// What is wrong with a checkpoint for the model being built.
#[derive(Debug, thiserror::Error)]
#[error("{component}: the checkpoint does not fit the model:\n{}", problems.join("\n"))]
pub struct LoadError {
    pub component: String,
    pub problems: Vec<String>,
}

/// How the unquantized weights of linear layers are held while a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Residency {
    /// Cast to the compute dtype when bound: the fastest products, at the compute dtype's size
    /// (f32 copies on the CPU).
    Compute,
    /// In their stored dtype, each layer widened a tile at a time as it runs.
    Stored,
    /// As stored, and the transformer's (and a ControlNet's) not held at all: mapped from the
    /// store's files and let go of block by block, so that the process holds one block's
    /// weights at a time; each step reads them again, from the OS's page cache while it keeps
    /// them. On the CPU from a store; elsewhere as [`Residency::Stored`].
    Streamed,
}

impl Residency {
    /// Whether linear weights stay in their stored dtype.
    pub fn as_stored(self) -> bool {
        self != Residency::Compute
    }
}

/// One component's tensors, with bookkeeping of what the model used.
pub struct Checkpoint {
    component: String,
    tensors: HashMap<String, Array>,
    /// Quantized weights, kept packed.
    quantized: HashMap<String, QuantizedTensor>,
    /// Weights are cast to this dtype as they are bound, linear weights only under
    /// [`Residency::Compute`].
    dtype: Dtype,
    residency: Residency,
    /// The inputs of the linear layers' products.
    products: Products,
    /// Set when the weights are mapped and let go of between uses.
    release: Option<Release>,
    used: RefCell<BTreeSet<String>>,
    problems: RefCell<Vec<String>>,
    /// Names under these prefixes may go unused (parts of a checkpoint a pipeline never runs).
    unused_ok: Vec<String>,
    /// LoRA pairs by the name of the linear layer they add to.
    adapters: HashMap<String, Vec<LoraPair>>,
    adapters_used: RefCell<BTreeSet<String>>,
}

impl Checkpoint {
    pub fn new(component: &str, tensors: HashMap<String, Array>, dtype: Dtype) -> Checkpoint {
        Checkpoint {
            component: component.to_string(),
            tensors,
            quantized: HashMap::new(),
            dtype,
            residency: Residency::Compute,
            products: Products::for_process(),
            release: None,
            used: RefCell::default(),
            problems: RefCell::default(),
            unused_ok: Vec::new(),
            adapters: HashMap::new(),
            adapters_used: RefCell::default(),
        }
    }

    /// Adds LoRA pairs, by the name of the linear layer each adds to (as the model names it,
    /// after any [`Checkpoint::rename`]).
    pub fn with_adapters(mut self, adapters: HashMap<String, Vec<LoraPair>>) -> Checkpoint {
        for (layer, pairs) in adapters {
            self.adapters.entry(layer).or_default().extend(pairs);
        }
        self
    }

    /// Adds quantized weights, which linear layers bind packed.
    pub fn with_quantized(mut self, quantized: HashMap<String, QuantizedTensor>) -> Checkpoint {
        self.quantized.extend(quantized);
        self
    }

    /// Chooses how unquantized linear weights are held.
    pub fn with_residency(mut self, residency: Residency) -> Checkpoint {
        self.residency = residency;
        self
    }

    /// Marks the weights as mapped: `release` lets go of their pages once a block has run.
    pub fn with_release(mut self, release: Option<Release>) -> Checkpoint {
        self.release = release;
        self
    }

    /// What lets go of the weights' pages, when they are mapped.
    pub fn release(&self) -> Option<Release> {
        self.release.clone()
    }

    /// Chooses the inputs of the linear layers' products (on the CPU).
    pub fn with_products(mut self, products: Products) -> Checkpoint {
        self.products = products;
        self
    }

    /// Renames every tensor by `f` (the one place checkpoint naming differences are absorbed).
    pub fn rename(mut self, f: impl Fn(&str) -> String) -> Checkpoint {
        self.tensors = self.tensors.into_iter().map(|(k, v)| (f(&k), v)).collect();
        self.quantized = self
            .quantized
            .into_iter()
            .map(|(k, v)| (f(&k), v))
            .collect();
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
        self.tensors.contains_key(name) || self.quantized.contains_key(name)
    }

    /// Ends binding: errors with every missing, mis-shaped and unexpected tensor.
    pub fn finish(self) -> Result<(), LoadError> {
        let used = self.used.into_inner();
        let mut problems = self.problems.into_inner();
        let mut unused: Vec<&String> = self
            .tensors
            .keys()
            .chain(self.quantized.keys())
            .filter(|k| {
                !used.contains(*k) && !self.unused_ok.iter().any(|p| k.starts_with(p.as_str()))
            })
            .collect();
        unused.sort();
        problems.extend(unused.into_iter().map(|k| format!("  unused tensor `{k}`")));
        let adapters_used = self.adapters_used.into_inner();
        let mut stray: Vec<&String> = (self.adapters.keys())
            .filter(|k| {
                !adapters_used.contains(*k)
                    && !self.unused_ok.iter().any(|p| k.starts_with(p.as_str()))
            })
            .collect();
        stray.sort();
        problems.extend(
            stray
                .into_iter()
                .map(|k| format!("  LoRA for `{k}`, which is not a linear layer of the model")),
        );
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
        match self.stored(name, shape)? {
            Some(t) if t.dtype() == self.ckpt.dtype => Ok(t),
            Some(t) => t.astype(self.ckpt.dtype),
            None => Array::zeros(shape, self.ckpt.dtype),
        }
    }

    /// The tensor `name` with exactly `shape`, cast to `dtype` rather than the compute dtype:
    /// for the few modules a model keeps in f32 whatever it computes in.
    pub fn get_as(&self, name: &str, shape: &[i32], dtype: Dtype) -> mlx::Result<Array> {
        match self.stored(name, shape)? {
            Some(t) if t.dtype() == dtype => Ok(t),
            Some(t) => t.astype(dtype),
            None => Array::zeros(shape, dtype),
        }
    }

    /// The table `name` (`[rows, width]`) as stored, packed when quantized: for tables read a
    /// few rows at a time, such as token embeddings.
    pub fn table(&self, name: &str, shape: &[i32]) -> mlx::Result<Table> {
        let full = self.full_name(name);
        if let Some(q) = self.ckpt.quantized.get(&full) {
            if q.shape() == shape {
                self.ckpt.used.borrow_mut().insert(full);
                return Ok(Table::Quantized(q.clone()));
            }
        }
        Ok(Table::Dense(match self.stored(name, shape)? {
            Some(t) => t,
            None => Array::zeros(shape, self.ckpt.dtype)?,
        }))
    }

    /// The weight of a linear layer, `[out, in]`: packed when quantized; as stored under
    /// [`Residency::Stored`]; else cast to the compute dtype.
    pub fn linear_weight(&self, name: &str, shape: &[i32]) -> mlx::Result<LinearWeight> {
        let full = self.full_name(name);
        if let Some(q) = self.ckpt.quantized.get(&full) {
            if q.shape() == shape {
                self.ckpt.used.borrow_mut().insert(full);
                return Ok(LinearWeight::Quantized(q.clone()));
            }
        }
        if self.ckpt.residency.as_stored() {
            if let Some(t) = self.ckpt.tensors.get(&full) {
                let is_float = matches!(t.dtype(), Dtype::BF16 | Dtype::F16 | Dtype::F32);
                if is_float && t.shape() == shape {
                    self.ckpt.used.borrow_mut().insert(full);
                    return Ok(LinearWeight::Dense(t.clone()));
                }
            }
        }
        Ok(LinearWeight::Dense(self.get(name, shape)?))
    }

    /// `name` as stored, checked against `shape`; `None` (with the problem recorded) when it is
    /// missing or mis-shaped.
    fn stored(&self, name: &str, shape: &[i32]) -> mlx::Result<Option<Array>> {
        let full = self.full_name(name);
        let found = match self.ckpt.tensors.get(&full) {
            Some(t) => Some((t.clone(), t.shape())),
            None => match self.ckpt.quantized.get(&full) {
                Some(q) => Some((q.dequantize()?, q.shape())),
                None => None,
            },
        };
        match found {
            Some((t, got)) if got == shape => {
                self.ckpt.used.borrow_mut().insert(full);
                Ok(Some(t))
            }
            Some((_, got)) => {
                self.ckpt.used.borrow_mut().insert(full.clone());
                self.ckpt
                    .problems
                    .borrow_mut()
                    .push(format!("  `{full}`: expected shape {shape:?}, got {got:?}"));
                Ok(None)
            }
            None => {
                self.ckpt
                    .problems
                    .borrow_mut()
                    .push(format!("  missing tensor `{full}` (shape {shape:?})"));
                Ok(None)
            }
        }
    }

    /// The LoRA pairs that add to the linear layer at this prefix.
    pub fn adapters(&self) -> Vec<LoraPair> {
        match self.ckpt.adapters.get(&self.prefix) {
            Some(pairs) => {
                (self.ckpt.adapters_used.borrow_mut()).insert(self.prefix.clone());
                pairs.clone()
            }
            None => Vec::new(),
        }
    }

    /// Whether `name` exists under this prefix.
    pub fn contains(&self, name: &str) -> bool {
        self.ckpt.contains(&self.full_name(name))
    }
}

/// A table of rows (token embeddings) as it is held: a quantized one stays packed and only
/// the rows asked for are widened.
#[derive(Clone)]
pub enum Table {
    Dense(Array),
    Quantized(QuantizedTensor),
}

impl Table {
    /// Rows `ids` of the table, `[ids.len(), width]`, in the stored dtype (the widened one
    /// when quantized).
    pub fn rows(&self, ids: &Array) -> mlx::Result<Array> {
        match self {
            Table::Dense(t) => t.take(ids, 0),
            Table::Quantized(q) => {
                let gathered = QuantizedTensor {
                    weight: q.weight.take(ids, 0)?,
                    scales: q.scales.take(ids, 0)?,
                    biases: q.biases.as_ref().map(|b| b.take(ids, 0)).transpose()?,
                    ..q.clone()
                };
                gathered.dequantize()
            }
        }
    }
}

/// A linear layer's weight as it is held.
#[derive(Clone)]
pub enum LinearWeight {
    Dense(Array),
    Quantized(QuantizedTensor),
    /// Layers joined without copying their weights (mapped ones, which a copy would hold):
    /// one product each, outputs side by side.
    Side(Vec<LinearWeight>),
}

/// `y = x·Wᵀ + b + Σ sᵢ·(x·Aᵢᵀ)·Bᵢᵀ`, weights in PyTorch's `[out, in]` layout, with any LoRA
/// pairs applied unfused: the base weight is used as held (packed, as stored or cast), never
/// merged into a copy.
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Array>,
    adapters: Vec<LoraPair>,
    products: Products,
    /// Whether the weight is mapped from a file and let go of between uses.
    mapped: bool,
}

impl Linear {
    pub fn new(w: &Weights, in_dim: i32, out_dim: i32, bias: bool) -> mlx::Result<Linear> {
        let weight = w.linear_weight("weight", &[out_dim, in_dim])?;
        let bias = if bias {
            Some(w.get("bias", &[out_dim])?)
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            adapters: w.adapters(),
            products: w.ckpt.products,
            mapped: w.ckpt.release.is_some(),
        })
    }

    /// One layer whose outputs are the outputs of `parts` side by side, their weights' rows
    /// joined (packed rows too: quantization groups run along a row): one product instead of
    /// several. `None` when they cannot join: a LoRA or a bias on any, or weights held
    /// differently.
    pub fn join(parts: &[&Linear]) -> mlx::Result<Option<Linear>> {
        if parts.is_empty()
            || parts
                .iter()
                .any(|p| p.bias.is_some() || !p.adapters.is_empty())
        {
            return Ok(None);
        }
        if parts.iter().any(|p| p.mapped) {
            return Ok(Some(Linear {
                weight: LinearWeight::Side(parts.iter().map(|p| p.weight.clone()).collect()),
                bias: None,
                adapters: Vec::new(),
                products: parts[0].products,
                mapped: true,
            }));
        }
        let dense: Option<Vec<&Array>> = (parts.iter())
            .map(|p| match &p.weight {
                LinearWeight::Dense(w) => Some(w),
                _ => None,
            })
            .collect();
        if let Some(ws) = dense {
            if ws.iter().any(|w| w.dtype() != ws[0].dtype()) {
                return Ok(None);
            }
            return Ok(Some(Linear {
                weight: LinearWeight::Dense(ops::concatenate(&ws, 0)?),
                bias: None,
                adapters: Vec::new(),
                products: parts[0].products,
                mapped: false,
            }));
        }
        let quantized: Option<Vec<&QuantizedTensor>> = (parts.iter())
            .map(|p| match &p.weight {
                LinearWeight::Quantized(q) => Some(q),
                _ => None,
            })
            .collect();
        let Some(qs) = quantized else {
            return Ok(None);
        };
        let first = qs[0];
        let alike = |q: &&QuantizedTensor| {
            q.group_size == first.group_size
                && q.bits == first.bits
                && q.mode == first.mode
                && q.scales.dtype() == first.scales.dtype()
                && q.biases.is_some() == first.biases.is_some()
        };
        if !qs.iter().all(alike) {
            return Ok(None);
        }
        let rows = |pick: fn(&QuantizedTensor) -> Option<&Array>| -> mlx::Result<Option<Array>> {
            let arrays: Option<Vec<&Array>> = qs.iter().map(|q| pick(q)).collect();
            arrays.map(|a| ops::concatenate(&a, 0)).transpose()
        };
        let weight = rows(|q| Some(&q.weight))?.expect("every part has a weight");
        let scales = rows(|q| Some(&q.scales))?.expect("every part has scales");
        Ok(Some(Linear {
            weight: LinearWeight::Quantized(QuantizedTensor {
                weight,
                scales,
                biases: rows(|q| q.biases.as_ref())?,
                group_size: first.group_size,
                bits: first.bits,
                mode: first.mode,
            }),
            bias: None,
            adapters: Vec::new(),
            products: parts[0].products,
            mapped: false,
        }))
    }

    pub fn forward(&self, x: &Array) -> mlx::Result<Array> {
        let base = self.forward_base(x)?;
        self.adapters
            .iter()
            .try_fold(base, |y, pair| y + pair.delta(x)?)
    }

    fn forward_base(&self, x: &Array) -> mlx::Result<Array> {
        product(&self.weight, x, self.bias.as_ref(), self.products)
    }
}

/// `x·Wᵀ (+ b)` for a weight as it is held.
fn product(
    weight: &LinearWeight,
    x: &Array,
    bias: Option<&Array>,
    products: Products,
) -> mlx::Result<Array> {
    match weight {
        LinearWeight::Dense(w) if w.dtype() == x.dtype() && products == Products::F32 => {
            let wt = w.transpose(&[1, 0])?;
            match bias {
                Some(b) => ops::addmm(b, x, &wt, 1.0, 1.0),
                None => ops::matmul(x, &wt),
            }
        }
        LinearWeight::Dense(w) => fast::linear_with(x, w, None, bias, products),
        LinearWeight::Quantized(q) if crate::platform::widens_quantized_for(rows(x)) => {
            // One layer's dense copy, alive for this product only: int4's memory at the dense
            // product's speed. Widened in the scales' dtype, as the quantized product's values
            // are (bit for bit on the CPU). Evaluated here: left lazy, MLX widens every layer of
            // a block before it runs the block's first product (at the real widths 1.5 GB at
            // once instead of one layer's 160 MB).
            let w = q.dequantize()?;
            let w = match w.dtype() == x.dtype() {
                true => w,
                false => w.astype(x.dtype())?,
            };
            let y = fast::linear_with(x, &w, None, bias, products)?;
            y.eval()?;
            Ok(y)
        }
        LinearWeight::Quantized(q) => {
            fast::linear_with(x, &q.weight, Some(q.packing()), bias, products)
        }
        LinearWeight::Side(parts) => {
            let outs = (parts.iter())
                .map(|p| product(p, x, None, products))
                .collect::<mlx::Result<Vec<_>>>()?;
            let y = ops::concatenate(&outs.iter().collect::<Vec<_>>(), -1)?;
            match bias {
                Some(b) => &y + b,
                None => Ok(y),
            }
        }
    }
}

/// The rows of a product's input `x` (`[..., K]`).
fn rows(x: &Array) -> u64 {
    let k = x.shape().last().copied().unwrap_or(1).max(1);
    (x.size() / k as usize) as u64
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

    /// A norm whose weight stays f32 in every compute dtype (diffusers' `_keep_in_fp32_modules`).
    pub fn new_f32(w: &Weights, dim: i32, eps: f32) -> mlx::Result<RmsNorm> {
        Ok(RmsNorm {
            weight: w.get_as("weight", &[dim], Dtype::F32)?,
            eps,
        })
    }

    pub fn weight(&self) -> &Array {
        &self.weight
    }

    pub fn eps(&self) -> f32 {
        self.eps
    }

    /// `x / rms(x) · weight`, normalised in f32 and rounded to `x`'s dtype before the weight
    /// multiplies it, as the reference rounds. MLX's fused norm computes exactly that (its
    /// CPU backend composes these very steps; a GPU runs one kernel where the composition
    /// would run seven, with two f32 copies of `x`), so it serves whenever the weight has
    /// `x`'s dtype; a weight of another dtype multiplies the rounded values by itself.
    pub fn forward(&self, x: &Array) -> mlx::Result<Array> {
        if x.dtype() == Dtype::F32 || self.weight.dtype() == x.dtype() {
            return mlx::fast::rms_norm(x, Some(&self.weight), self.eps);
        }
        let x32 = x.astype(Dtype::F32)?;
        let inv_rms = (x32.square()?.mean(&[-1], true)? + self.eps)?.rsqrt()?;
        (x32 * inv_rms)?.astype(x.dtype())? * &self.weight
    }
}

/// Layer norm over the last axis with a weight and a bias (`torch.nn.LayerNorm`).
pub struct LayerNorm {
    weight: Array,
    bias: Array,
    eps: f32,
}

impl LayerNorm {
    pub fn new(w: &Weights, dim: i32, eps: f32) -> mlx::Result<LayerNorm> {
        Ok(LayerNorm {
            weight: w.get("weight", &[dim])?,
            bias: w.get("bias", &[dim])?,
            eps,
        })
    }

    pub fn forward(&self, x: &Array) -> mlx::Result<Array> {
        fast::layer_norm(x, Some(&self.weight), Some(&self.bias), self.eps)
    }
}
