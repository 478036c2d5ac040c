//! Stored models → MLX arrays, per component, and how long each stage takes.
//!
//! Every blob generation Ollama wrote is read:
//! - v1: one tensor keyed `"data"` (the seed format, and what we write);
//! - v1 quantized: three layers `X`, `X_scale`, `X_qbias`, each keyed `"data"` (group 32);
//! - v2: one tensor keyed by its name inside the component;
//! - v2 quantized: one blob with `component/X`, `component/X.scale`, `component/X.bias` and
//!   `__metadata__ {quant_type, group_size}`.
//!
//! Arrays come back lazy; [`LoadedComponent::eval`] materialises them in one batched
//! evaluation. Two paths read the bytes: MLX's own safetensors loader (it reads into fresh
//! buffers), and, for blobs whose data starts on a page boundary (`zimage create --align`), a
//! memory map handed to MLX without a copy where the backend allows it.

use crate::files::FileError;
use crate::mlx::{self, Array};
pub use crate::mlx::{QuantMode, QuantizedTensor};
use crate::models::weights::ComponentWeights;
use crate::safetensors::Header;
use crate::store::{blob, Layer, Store, StoreError, StoredModel};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// How blob bytes reach MLX.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ReadPath {
    /// MLX's `load_safetensors` (reads into fresh buffers).
    MlxLoader,
    /// A memory map wrapped without a copy where the data is page-aligned (and, on the CPU,
    /// wherever each tensor is aligned to its element size, every tensor of a quantized blob
    /// too), else MLX's loader.
    Mmap,
}

/// One component's tensors, lazy until evaluated.
pub struct LoadedComponent {
    /// Plain tensors by their name inside the component.
    pub tensors: BTreeMap<String, Array>,
    /// Quantized weights by name, kept packed as MLX multiplies them.
    pub quantized: BTreeMap<String, QuantizedTensor>,
    /// Blobs read.
    pub blobs: usize,
    /// Their bytes on disk.
    pub bytes: u64,
    /// Time spent reading and checking blob headers.
    pub header_seconds: f64,
    /// Blobs mapped without a copy.
    pub mapped: usize,
    /// The maps behind the mapped blobs' arrays.
    maps: Vec<Arc<memmap2::Mmap>>,
}

impl LoadedComponent {
    /// Evaluates every array in one batch.
    pub fn eval(&self) -> mlx::Result<()> {
        let mut all: Vec<&Array> = self.tensors.values().collect();
        for q in self.quantized.values() {
            all.extend(q.arrays());
        }
        mlx::eval(&all)
    }

    /// The tensors by name, quantized weights kept packed: what a model binds to.
    #[doc(hidden)]
    pub fn into_weights(self) -> ComponentWeights {
        let release = (!self.maps.is_empty()).then(|| release_maps(self.maps));
        ComponentWeights {
            tensors: self.tensors.into_iter().collect(),
            quantized: self.quantized.into_iter().collect(),
            release,
        }
    }

    /// Plain arrays by name, quantized weights dequantized.
    pub fn into_arrays(self) -> mlx::Result<HashMap<String, Array>> {
        let mut out: HashMap<String, Array> = self.tensors.into_iter().collect();
        for (name, q) in self.quantized {
            out.insert(name, q.dequantize()?);
        }
        Ok(out)
    }
}

/// Lets go of the pages of `maps`: the process's memory no longer counts them, and the next read
/// maps them again from the files.
fn release_maps(maps: Vec<Arc<memmap2::Mmap>>) -> crate::models::weights::Release {
    crate::models::weights::Release::new(move || {
        for map in &maps {
            // SAFETY: each map is a read-only shared map of a blob, and blobs never change once
            // in place: a page let go of reads back, from the file, as the same bytes, so no
            // array over the map sees other values. The result is only advice; a failure
            // leaves the pages held, which costs memory, not correctness.
            #[cfg(unix)]
            let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
            #[cfg(not(unix))]
            let _ = map;
        }
    })
}

/// Where the blobs a name needs are.
struct Pending {
    name: String,
    digest: String,
    path: PathBuf,
    header: Header,
}

/// Reads one component of a stored model.
pub fn load_component(
    store: &Store,
    model: &StoredModel,
    component: &str,
    path: ReadPath,
) -> Result<LoadedComponent, StoreError> {
    let layers: Vec<&Layer> = model.manifest.component_layers(component).collect();
    if layers.is_empty() {
        return Err(StoreError::NoComponent {
            model: model.name.short(),
            component: component.to_string(),
            have: model.manifest.components(),
        });
    }
    // Blobs are opened under the store lock, so that no `gc` sweeps between a manifest read
    // and its blobs opened; once open, a blob outlives its removal.
    let _lock = store.lock_for_reading()?;
    ensure_open_file_limit(model, component, layers.len())?;
    let start = Instant::now();
    let pending = read_headers(store, &layers)?;
    let mut out = LoadedComponent {
        tensors: BTreeMap::new(),
        quantized: BTreeMap::new(),
        blobs: pending.len(),
        bytes: layers.iter().fold(0u64, |n, l| n.saturating_add(l.size)),
        header_seconds: start.elapsed().as_secs_f64(),
        mapped: 0,
        maps: Vec::new(),
    };
    let mut v1 = V1Companions::default();
    for p in &pending {
        let (arrays, map) = read_blob(p, path)?;
        if let Some(map) = map {
            out.mapped += 1;
            out.maps.push(map);
        }
        if p.header.tensors.len() == 1 {
            let arr = single_tensor(p, component, arrays)?;
            if let Some(base) = p.name.strip_suffix("_scale") {
                v1.scales.insert(base.to_string(), arr);
            } else if let Some(base) = p.name.strip_suffix("_qbias") {
                v1.biases.insert(base.to_string(), arr);
            } else {
                out.tensors.insert(p.name.clone(), arr);
            }
        } else {
            out.quantized
                .insert(p.name.clone(), v2_quantized(p, arrays)?);
        }
    }
    v1.join(component, &mut out)?;
    Ok(out)
}

/// Every blob of a component stays open until it is evaluated; a limit below that would fail
/// deep in MLX with a bare "failed to open file", so it is raised, or refused up front.
fn ensure_open_file_limit(
    model: &StoredModel,
    component: &str,
    blobs: usize,
) -> Result<(), StoreError> {
    let wanted = blobs as u64 + 256;
    if let Ok(limit) = crate::platform::raise_open_file_limit(wanted) {
        if limit < blobs as u64 + 32 {
            return Err(StoreError::TooManyOpenFiles {
                model: model.name.short(),
                component: component.to_string(),
                blobs,
                limit,
                wanted,
            });
        }
    }
    Ok(())
}

/// The validated header of every layer's blob.
fn read_headers(store: &Store, layers: &[&Layer]) -> Result<Vec<Pending>, StoreError> {
    layers
        .iter()
        .map(|layer| {
            let (_, name) = layer
                .component_and_tensor()
                .expect("component layers have names");
            let (path, header) = blob::read_blob_header(&store.root, &layer.digest)?;
            Ok(Pending {
                name: name.to_string(),
                digest: layer.digest.clone(),
                path,
                header,
            })
        })
        .collect()
}

fn layout_error(p: &Pending, reason: String) -> StoreError {
    StoreError::Blob(blob::BlobError::Layout {
        digest: p.digest.clone(),
        reason,
    })
}

/// The tensor of a one-tensor blob, keyed `data` (generation 1) or by its name (generation 2).
fn single_tensor(
    p: &Pending,
    component: &str,
    arrays: HashMap<String, Array>,
) -> Result<Array, StoreError> {
    let key = &p.header.tensors[0].name;
    if key != "data" && key != &p.name && key != &format!("{component}/{}", p.name) {
        return Err(layout_error(
            p,
            format!("holds `{key}`, expected `{}` or `data`", p.name),
        ));
    }
    Ok(arrays.into_values().next().expect("one tensor"))
}

/// A generation-2 quantized blob: the main tensor with `.scale` and (affine) `.bias`, its mode
/// and group from `__metadata__` (or inferred from the shapes, as the first writers left it).
fn v2_quantized(
    p: &Pending,
    mut arrays: HashMap<String, Array>,
) -> Result<QuantizedTensor, StoreError> {
    let bad = |reason: String| layout_error(p, reason);
    let main = blob::main_tensor(&p.header)
        .ok_or_else(|| bad("holds no main tensor".into()))?
        .name
        .clone();
    let mut take = |key: &str| {
        arrays
            .remove(key)
            .ok_or_else(|| bad(format!("has no `{key}`")))
    };
    let weight = take(&main)?;
    let scales = take(&format!("{main}.scale"))?;
    let biases = take(&format!("{main}.bias")).ok();
    let meta = p.header.metadata.clone().unwrap_or_default();
    let stated_group = meta.get("group_size").and_then(|g| g.parse().ok());
    let (mode, group_size, bits) = match meta.get("quant_type") {
        Some(t) => {
            let (mode, group, bits) = QuantMode::from_quant_type(t).ok_or_else(|| {
                bad(format!(
                    "quantization `{t}` is not supported (int4, int5, int8, q4_0, q5_0, q8_0, nvfp4, mxfp8 and mxfp4 are)"
                ))
            })?;
            (mode, stated_group.unwrap_or(group), bits)
        }
        None => {
            let group = stated_group.unwrap_or(64);
            let bits = infer_bits(&weight, &scales, group)
                .ok_or_else(|| bad("cannot tell the bit width".into()))?;
            (QuantMode::Affine, group, bits)
        }
    };
    if mode == QuantMode::Affine && biases.is_none() {
        return Err(bad(format!(
            "has no `{main}.bias` (affine quantization needs one)"
        )));
    }
    if mode == QuantMode::Symmetric && biases.is_some() {
        return Err(bad(format!(
            "has `{main}.bias`, but symmetric quantization has none"
        )));
    }
    Ok(QuantizedTensor {
        weight,
        scales,
        biases,
        group_size,
        bits,
        mode,
    })
}

/// Generation-1 quantized companions (`X_scale`, `X_qbias` layers), keyed by the base name,
/// joined to their weights once every blob is read.
#[derive(Default)]
struct V1Companions {
    scales: HashMap<String, Array>,
    biases: HashMap<String, Array>,
}

impl V1Companions {
    fn join(mut self, component: &str, out: &mut LoadedComponent) -> Result<(), StoreError> {
        for (base, scales) in self.scales {
            let weight = out.tensors.remove(&base).ok_or_else(|| {
                StoreError::v1_quantized(component, &base, "_scale", "has no weight layer")
            })?;
            let biases = self.biases.remove(&base).ok_or_else(|| {
                StoreError::v1_quantized(component, &base, "", "has no `_qbias` layer")
            })?;
            // Ollama's first quantized imports used group 32.
            let group_size = 32;
            let bits = infer_bits(&weight, &scales, group_size).ok_or_else(|| {
                StoreError::v1_quantized(
                    component,
                    &base,
                    "",
                    "packed shape does not match its scales",
                )
            })?;
            let q = QuantizedTensor {
                weight,
                scales,
                biases: Some(biases),
                group_size,
                bits,
                mode: QuantMode::Affine,
            };
            out.quantized.insert(base, q);
        }
        match self.biases.keys().next() {
            Some(base) => Err(StoreError::v1_quantized(
                component,
                base,
                "_qbias",
                "has no matching `_scale` layer",
            )),
            None => Ok(()),
        }
    }
}

/// Packed u32 columns × 32 / bits = columns = scale columns × group.
/// In i64: the shapes come from a blob's header, and `packed × 32` overflows an i32.
fn infer_bits(weight: &Array, scales: &Array, group: i32) -> Option<i32> {
    let packed = i64::from(*weight.shape().last()?);
    let cols = i64::from(*scales.shape().last()?) * i64::from(group);
    [4, 8, 2, 3, 5, 6]
        .into_iter()
        .find(|&b| packed * 32 == cols * i64::from(b))
}

/// The arrays of one blob, keyed as in its header, and the map behind them when they were
/// mapped without a copy.
#[allow(clippy::type_complexity)]
fn read_blob(
    p: &Pending,
    path: ReadPath,
) -> Result<(HashMap<String, Array>, Option<Arc<memmap2::Mmap>>), StoreError> {
    let tensors = &p.header.tensors;
    let data_start = p.header.data_start();
    // A GPU takes a map without a copy only page-aligned; the CPU reads any tensor aligned to
    // its element size.
    let page_aligned = tensors.len() == 1 && data_start.is_multiple_of(page_size());
    let elements_aligned = mlx::default_device() == mlx::Device::Cpu
        && tensors.iter().all(|t| {
            (data_start + t.data_offsets.0).is_multiple_of(t.dtype.size_bytes().max(1) as u64)
        });
    if path == ReadPath::Mmap
        && (page_aligned || elements_aligned)
        && tensors.iter().all(|t| t.dtype.in_mlx())
    {
        let file = std::fs::File::open(&p.path).map_err(FileError::io(&p.path))?;
        // SAFETY: blobs are immutable once renamed into place; the map is read-only.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(FileError::io(&p.path))?;
        let map = Arc::new(map);
        let mut arrays = HashMap::with_capacity(tensors.len());
        for t in tensors {
            let start = (data_start + t.data_offsets.0) as usize;
            let shape: Vec<i32> = t.shape.iter().map(|&d| d as i32).collect();
            let ptr = map[start..].as_ptr();
            // SAFETY: the header was validated against the file size, so the tensor's bytes are
            // inside the map, aligned to its element size as checked above, with the 8-byte
            // length prefix and the header before them; the Arc keeps the map alive for as long
            // as MLX holds the array.
            let arr = unsafe { Array::from_mapped(ptr, &shape, t.dtype, Box::new(map.clone())) }?;
            arrays.insert(t.name.clone(), arr);
        }
        return Ok((arrays, Some(map)));
    }
    let st = mlx::io::load_safetensors(&p.path)?;
    Ok((st.tensors, None))
}

fn page_size() -> u64 {
    // Apple Silicon uses 16 KiB pages, x86-64 Linux 4 KiB; 16 KiB alignment serves both.
    #[cfg(target_os = "macos")]
    {
        16384
    }
    #[cfg(not(target_os = "macos"))]
    {
        4096
    }
}

/// One component's tensors read and materialised in one batched evaluation, before any
/// computation asks for them: the path both a pipeline (`StoreSource`) and [`profile`] take,
/// so that what `profile` measures is what a generation pays.
pub(crate) fn materialise_component(
    store: &Store,
    model: &StoredModel,
    component: &str,
    path: ReadPath,
) -> Result<LoadedComponent, StoreError> {
    let loaded = load_component(store, model, component, path)?;
    loaded.eval()?;
    Ok(loaded)
}

/// One component's load profile.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ComponentProfile {
    /// The component (`transformer`).
    pub component: String,
    /// Blobs it is stored in.
    pub blobs: usize,
    /// Their bytes on disk.
    pub bytes: u64,
    /// Blobs mapped without a copy (the `Mmap` path on aligned blobs).
    pub mapped_blobs: usize,
    /// Time spent reading and checking blob headers.
    pub header_seconds: f64,
    /// Time from the headers to every array evaluated.
    pub materialise_seconds: f64,
    /// `bytes` over `materialise_seconds`, in GB/s.
    pub materialise_gbps: f64,
    /// A plain sequential read of the same blobs into fresh memory: the disk's pace, to compare.
    pub sequential_read_seconds: f64,
    /// `bytes` over `sequential_read_seconds`, in GB/s.
    pub sequential_read_gbps: f64,
    /// The same reads through one reused buffer (no fresh memory).
    pub streaming_read_seconds: f64,
}

/// Times loading every component of `model`, next to a plain sequential read of the same
/// blobs into memory measured in the same run. Each blob is read once beforehand so that both
/// measurements see a warm page cache.
pub fn profile(
    store: &Store,
    model: &StoredModel,
    path: ReadPath,
) -> Result<(f64, Vec<ComponentProfile>), StoreError> {
    let t = Instant::now();
    let model = store.open(&model.name.to_string())?;
    let manifest_seconds = t.elapsed().as_secs_f64();
    // MLX starts its threads and allocator on first use: pay for that before timing anything.
    if let Some(layer) = model.manifest.tensor_layers().next() {
        let warm = mlx::io::load_safetensors(&store.blob_path(&layer.digest)?)?;
        mlx::eval(&warm.tensors.values().collect::<Vec<_>>())?;
    }
    let mut out = Vec::new();
    for component in model.manifest.components() {
        let paths: Vec<PathBuf> = model
            .manifest
            .component_layers(&component)
            .map(|l| store.blob_path(&l.digest))
            .collect::<Result<_, _>>()?;
        // The baseline holds every blob in memory until all are read, as a loaded component
        // does: both then pay for the same fresh memory.
        let read_all = || -> Result<Vec<Vec<u8>>, StoreError> {
            paths
                .iter()
                .map(|p| std::fs::read(p).map_err(|e| FileError::io(p)(e).into()))
                .collect()
        };
        drop(read_all()?);
        let t = Instant::now();
        let resident = read_all()?;
        let seq = t.elapsed().as_secs_f64();
        let bytes = resident.iter().map(|b| b.len() as u64).sum::<u64>();
        drop(resident);
        // A second baseline streams the same bytes through one reused buffer: the cost of the
        // reads alone, without fresh memory.
        let t = Instant::now();
        let mut buf = Vec::new();
        for p in &paths {
            buf.clear();
            let mut f = std::fs::File::open(p).map_err(FileError::io(p))?;
            std::io::Read::read_to_end(&mut f, &mut buf).map_err(FileError::io(p))?;
        }
        let streaming = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let loaded = materialise_component(store, &model, &component, path)?;
        let total = t.elapsed().as_secs_f64();
        out.push(ComponentProfile {
            component: component.clone(),
            blobs: loaded.blobs,
            bytes,
            mapped_blobs: loaded.mapped,
            header_seconds: loaded.header_seconds,
            materialise_seconds: total,
            materialise_gbps: bytes as f64 / total / 1e9,
            sequential_read_seconds: seq,
            sequential_read_gbps: bytes as f64 / seq / 1e9,
            streaming_read_seconds: streaming,
        });
        drop(loaded);
        mlx::memory::clear_cache();
    }
    Ok((manifest_seconds, out))
}

/// The sizes of one component's tensors from the manifest alone. A layer is packed when it is
/// not a float dtype, is a v1 companion (`_scale`, `_qbias`), or its blob is much smaller than
/// its logical float tensor (a v2 quantized blob lists the tensor it stands for).
#[doc(hidden)]
pub fn tensor_sizes(model: &StoredModel, component: &str) -> Vec<crate::memory_plan::TensorSize> {
    model
        .manifest
        .component_layers(component)
        .filter_map(|layer| {
            let (_, name) = layer.component_and_tensor()?;
            let shape = layer.shape.clone().unwrap_or_default();
            let dtype = layer.dtype.as_deref().unwrap_or("");
            let float_bytes = match dtype {
                "F32" => 4,
                "F16" | "BF16" => 2,
                _ => 0,
            };
            // Saturating: the manifest is input, and its numbers may be anything.
            let numel = shape.iter().fold(1u64, |n, &d| n.saturating_mul(d));
            let companion = name.ends_with("_scale") || name.ends_with("_qbias");
            let packed = float_bytes == 0
                || companion
                || layer.size.saturating_mul(3) < numel.saturating_mul(float_bytes * 2);
            Some(crate::memory_plan::TensorSize {
                name: name.to_string(),
                shape,
                stored_bytes: layer.size,
                packed,
            })
        })
        .collect()
}

/// A stored model as a pipeline source.
#[doc(hidden)]
pub struct StoreSource {
    pub store: Store,
    pub model: StoredModel,
    pub read_path: ReadPath,
}

impl StoreSource {
    /// `model` read through MLX's loader, as generation reads it.
    pub fn new(store: &Store, model: &StoredModel) -> StoreSource {
        StoreSource {
            store: store.clone(),
            model: model.clone(),
            read_path: ReadPath::MlxLoader,
        }
    }
}
