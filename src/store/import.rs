//! Import: tensors from a source (a diffusers directory, or any [`TensorSource`]) become
//! per-tensor blobs and a manifest.
//!
//! Tensors are streamed from their files in bounded chunks (never a whole shard in memory),
//! hashed while written, spread over the cores, and an identical blob already in the store is
//! reused. Blobs land atomically; the manifest is written last, so an interrupted import leaves
//! no manifest and no partial blob, and a rerun completes it.

use super::blob::{self, BlobError, BlobWriter};
pub use super::import_ggml::GgmlReport;
use super::manifest::{
    config_blob, Layer, Manifest, CONFIG_MEDIA_TYPE, JSON_MEDIA_TYPE, MAX_MANIFEST_BYTES,
};
pub(crate) use super::source_tensor::{describe_non_finite, first_non_finite};
use super::source_tensor::{non_finite, open_range, tensor_layer};
pub use super::source_tensor::{Encoding, SourceTensor};
use super::{Store, StoreError};
use crate::diffusers_dir::DiffusersDir;
use crate::files::FileError;
use crate::mlx;
use crate::safetensors::{header_bytes, Dtype, TensorSpec};
use half::{bf16, f16};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

/// Anything an import can read: tensors as byte ranges of files, plus config files.
pub trait TensorSource {
    /// Every tensor to import, each under its component, with where its bytes are.
    fn tensors(&self) -> Vec<SourceTensor>;
    /// `(path in diffusers layout, bytes)`, e.g. `("transformer/config.json", …)`.
    fn config_files(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
}

impl TensorSource for DiffusersDir {
    fn tensors(&self) -> Vec<SourceTensor> {
        self.tensors
            .values()
            .flatten()
            .map(|t| SourceTensor {
                component: t.component.clone(),
                name: t.name.clone(),
                dtype: t.info.dtype,
                shape: t.info.shape.clone(),
                file: t.file.clone(),
                offset: t.offset,
                nbytes: t.info.nbytes(),
                encoding: Encoding::Plain,
                roll: 0,
            })
            .collect()
    }

    fn config_files(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        // A modular pipeline's index is stored as the classic one it reads as.
        let index = (self.index.iter()).map(|b| Ok(("model_index.json".to_string(), b.clone())));
        let files = self.configs.iter().map(|(rel, path)| {
            let (limit, what) = crate::diffusers_dir::config_limit(rel);
            let bytes = crate::files::read_bounded(path, limit, what)?;
            // Stored verbatim and read back by every load: a broken one is refused now,
            // not when the model is first run.
            if rel.ends_with(".json") {
                if let Err(e) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                    return Err(StoreError::ConfigNotJson {
                        path: path.clone(),
                        reason: e.to_string(),
                    });
                }
            }
            Ok((rel.clone(), bytes))
        });
        index.chain(files).collect()
    }
}

/// MLX affine quantization as Ollama writes it (group 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    /// 8 bits a weight (Ollama's `int8`).
    Int8,
    /// 4 bits a weight (Ollama's `int4`).
    Int4,
}

impl Quantization {
    /// Bits per quantized value.
    pub fn bits(self) -> i32 {
        match self {
            Quantization::Int8 => 8,
            Quantization::Int4 => 4,
        }
    }
    /// The name a stored blob's `quant_type` and `--quantize` give it.
    pub fn name(self) -> &'static str {
        match self {
            Quantization::Int8 => "int8",
            Quantization::Int4 => "int4",
        }
    }
    /// Weights per group sharing a scale and a bias.
    pub const GROUP_SIZE: i32 = 64;
}

/// How an import writes tensors; the default keeps them as they are in the source.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Convert float tensors to this dtype (BF16, F16 or F32); `None` keeps them as stored.
    pub dtype: Option<Dtype>,
    /// Quantize the weights Ollama's rule picks (float matrices outside the VAE, not embeddings
    /// or norms); `None` keeps every tensor a float.
    pub quantize: Option<Quantization>,
    /// Data offset alignment of written blobs (8, or a page size for zero-copy mapping).
    pub align: u64,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            dtype: None,
            quantize: None,
            align: 8,
        }
    }
}

/// What an import did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ImportSummary {
    /// Tensors imported.
    pub tensors: usize,
    /// Blobs written by this import.
    pub blobs_written: usize,
    /// Blobs the store already held (the same bytes), reused.
    pub blobs_present: usize,
    /// Bytes written.
    pub bytes_written: u64,
    /// Bytes reused.
    pub bytes_present: u64,
    /// What became of each ggml-encoded tensor.
    pub ggml: GgmlReport,
}

/// Whether a quantized import quantizes a tensor of this name, by Ollama's rule: a weight, not
/// an embedding table (`embed`) nor a norm's own (`norm`, `ln_`). A linear layer named after
/// the norm it modulates (an AdaLN's `norm1.linear`, `norm_out.linear`) is a linear layer like
/// any other: in the double-stream transformers these hold a quarter of the parameters.
pub(crate) fn quantizes_name(n: &str) -> bool {
    let norm = (n.contains("norm") || n.contains("ln_")) && !n.ends_with(".linear.weight");
    // T5's relative position table is looked up, not multiplied: a few KB whose every value
    // is an attention bias, kept as it is.
    let table = n.contains("relative_attention_bias");
    n.ends_with(".weight") && !n.contains("embed") && !norm && !table
}

/// Ollama's rule for which tensors a quantized import quantizes ([`quantizes_name`]): matrices
/// of a plain float dtype whose rows split into groups, outside the VAE.
pub(crate) fn should_quantize(t: &SourceTensor) -> bool {
    let n = t.name.as_str();
    t.component != "vae"
        && quantizes_name(n)
        && t.shape.len() >= 2
        && t.shape
            .last()
            .is_some_and(|&c| c % Quantization::GROUP_SIZE as u64 == 0)
        && (matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) || crate::fp8::is_fp8(t.dtype))
        && t.encoding == Encoding::Plain
}

fn convertible(d: Dtype) -> bool {
    matches!(d, Dtype::F32 | Dtype::F16 | Dtype::BF16)
}

/// The dtype a tensor is stored in: the one asked for, for a float tensor; bf16 for an fp8
/// one (MLX has no 8-bit floats, and bf16 holds every fp8 value exactly); else as it is.
fn stored_dtype(from: Dtype, asked: Option<Dtype>) -> Dtype {
    match asked {
        Some(d) if convertible(from) || crate::fp8::is_fp8(from) => d,
        None if crate::fp8::is_fp8(from) => Dtype::BF16,
        _ => from,
    }
}

/// Refuses, before anything is written, a source whose manifest could not be read back: the
/// manifest of its tensors, with every digest and size at full length, over the limit.
fn check_manifest_fits(
    name: &super::ModelName,
    tensors: &[SourceTensor],
) -> Result<(), StoreError> {
    let digest = format!("sha256:{}", "0".repeat(64));
    let layers: Vec<Layer> = tensors
        .iter()
        .map(|t| tensor_layer(t, digest.clone(), u64::MAX, t.dtype, t.shape.clone()))
        .collect();
    let config = Layer {
        media_type: CONFIG_MEDIA_TYPE.into(),
        digest: digest.clone(),
        size: u64::MAX,
        from: None,
        name: None,
        dtype: None,
        shape: None,
    };
    // Config files add a few layers; a margin covers them.
    let predicted = Manifest::new(config, layers).to_bytes().len() as u64 + (64 << 10);
    if predicted > MAX_MANIFEST_BYTES {
        return Err(StoreError::ImportTooLarge {
            model: name.short(),
            tensors: tensors.len(),
            manifest_bytes: predicted,
        });
    }
    Ok(())
}

impl Store {
    /// Every blob `manifest` references is in place with its size, and the blobs folder is
    /// synced, so the manifest about to be written never names a blob that is not there.
    pub(crate) fn check_blobs_present(&self, manifest: &Manifest) -> Result<(), StoreError> {
        for layer in std::iter::once(&manifest.config).chain(&manifest.layers) {
            let path = self.blob_path(&layer.digest)?;
            let size = std::fs::metadata(&path).map(|m| m.len()).ok();
            if size != Some(layer.size) {
                return Err(StoreError::BlobVanished {
                    digest: layer.digest.clone(),
                    expected: layer.size,
                    found: size,
                    blobs: self.root.join("blobs"),
                });
            }
        }
        sync_dir(&self.root.join("blobs"))
    }

    /// Imports `source` as `name`; `progress` receives source bytes processed so far. A
    /// failed import writes no manifest; the blobs it completed stay for a rerun to reuse.
    pub fn create(
        &self,
        name: &str,
        source: &dyn TensorSourceSync,
        opts: &ImportOptions,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<ImportSummary, StoreError> {
        let name = super::ModelName::parse(name)?;
        self.import(&name, source, opts, progress)
            .map_err(|e| self.explain_full_disk(e, source))
    }

    /// A full disk, said with the sizes that let the user act.
    fn explain_full_disk(&self, e: StoreError, source: &dyn TensorSourceSync) -> StoreError {
        if !is_disk_full(&e) {
            return e;
        }
        StoreError::DiskFull {
            root: self.root.clone(),
            needed: source
                .tensors()
                .iter()
                .fold(0u64, |n, t| n.saturating_add(t.nbytes)),
            free: crate::platform::free_disk_bytes(&self.root),
        }
    }

    fn import(
        &self,
        name: &super::ModelName,
        source: &dyn TensorSourceSync,
        opts: &ImportOptions,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<ImportSummary, StoreError> {
        if let Some(d) = opts.dtype {
            if !convertible(d) {
                return Err(StoreError::UnsupportedDtype(d));
            }
        }
        if !opts.align.is_power_of_two() || opts.align < 8 {
            return Err(StoreError::BadAlignment(opts.align));
        }
        let tensors = source.tensors();
        if let Some(scale) = crate::fp8::unread_scale(tensors.iter().map(|t| t.name.as_str())) {
            let t = tensors
                .iter()
                .find(|t| t.name == scale)
                .expect("found among them");
            return Err(StoreError::Fp8Scale {
                file: t.file.clone(),
                tensor: t.name.clone(),
            });
        }
        check_manifest_fits(name, &tensors)?;
        // Held until the manifest is written: a `gc` cannot sweep the blobs written so far,
        // which no manifest references yet.
        let _lock = self.lock_for_writing()?;
        let done = AtomicU64::new(0);
        let ggml = std::sync::Mutex::new(GgmlReport::default());
        let layers: Vec<Vec<(Layer, bool)>> = tensors
            .par_iter()
            .map(|t| {
                let out = if let Encoding::Ggml(ty) = t.encoding {
                    self.write_ggml(t, ty, opts.align, &ggml)
                } else if opts.quantize.is_some_and(|_| should_quantize(t)) {
                    self.write_quantized(t, opts.quantize.expect("checked"), opts.align)
                } else {
                    self.write_tensor(t, opts)
                }?;
                progress(done.fetch_add(t.nbytes, Ordering::Relaxed) + t.nbytes);
                Ok(out)
            })
            .collect::<Result<_, StoreError>>()?;
        let mut summary = ImportSummary {
            tensors: tensors.len(),
            ggml: ggml.into_inner().unwrap_or_else(|e| e.into_inner()),
            ..Default::default()
        };
        let mut all = Vec::new();
        for (layer, new) in layers.into_iter().flatten() {
            if new {
                summary.blobs_written += 1;
                summary.bytes_written += layer.size;
            } else {
                summary.blobs_present += 1;
                summary.bytes_present += layer.size;
            }
            all.push(layer);
        }
        for (path, bytes) in source.config_files()? {
            let (digest, size, new) = blob::write_blob(&self.root, &bytes)?;
            if new {
                summary.bytes_written += size;
            } else {
                summary.bytes_present += size;
            }
            all.push(Layer {
                media_type: JSON_MEDIA_TYPE.into(),
                digest,
                size,
                from: None,
                name: Some(path),
                dtype: None,
                shape: None,
            });
        }
        let file_type = opts.quantize.map(|q| q.name()).unwrap_or("");
        let (digest, size, _) = blob::write_blob(&self.root, &config_blob(file_type))?;
        let config = Layer {
            media_type: CONFIG_MEDIA_TYPE.into(),
            digest,
            size,
            from: None,
            name: None,
            dtype: None,
            shape: None,
        };
        let manifest = Manifest::new(config, all);
        self.check_blobs_present(&manifest)?;
        self.write_manifest(name, &manifest)?;
        Ok(summary)
    }

    /// One tensor as a seed-format blob, converting the dtype on the way if asked.
    fn write_tensor(
        &self,
        t: &SourceTensor,
        opts: &ImportOptions,
    ) -> Result<Vec<(Layer, bool)>, StoreError> {
        let target = stored_dtype(t.dtype, opts.dtype);
        let mut w = BlobWriter::new(&self.root)?;
        w.write(&blob::tensor_blob_header(target, &t.shape, opts.align)?)?;
        let mut reader = open_range(t)?;
        let src_size = t.dtype.bits() as usize / 8;
        // Chunks hold whole elements of the source type.
        let mut buf = vec![0u8; (4 << 20) / 4 * 4];
        let mut left = t.nbytes;
        let mut elements_before = 0u64;
        while left > 0 {
            let n = (buf.len() as u64).min(left) as usize;
            reader
                .read_exact(&mut buf[..n])
                .map_err(FileError::io(&t.file))?;
            // Found while the blob is hashed, before it is kept.
            if let Some((i, value)) = first_non_finite(&buf[..n], t.dtype) {
                return Err(non_finite(t, elements_before + i, value));
            }
            elements_before += (n / src_size.max(1)) as u64;
            if target == t.dtype {
                w.write(&buf[..n])?;
            } else {
                debug_assert_eq!(n % src_size.max(1), 0);
                w.write(&convert(&buf[..n], t.dtype, target))?;
            }
            left -= n as u64;
        }
        let (digest, size, new) = w.finish()?;
        Ok(vec![(
            tensor_layer(t, digest, size, target, t.shape.clone()),
            new,
        )])
    }

    /// One tensor quantized with MLX into Ollama's v2 quantized blob: one blob holding the
    /// packed weight, `.scale` and `.bias` (in MLX's order, by name), keyed by the full
    /// path-style name, with `quant_type` and `group_size` in the metadata. Its header is padded
    /// so that the data starts on a multiple of `align` (at least 8), which lets the loader map
    /// every tensor of it without a copy.
    fn write_quantized(
        &self,
        t: &SourceTensor,
        q: Quantization,
        align: u64,
    ) -> Result<Vec<(Layer, bool)>, StoreError> {
        let mut bytes = vec![0u8; t.nbytes as usize];
        open_range(t)?
            .read_exact(&mut bytes)
            .map_err(FileError::io(&t.file))?;
        if let Some((i, value)) = first_non_finite(&bytes, t.dtype) {
            return Err(non_finite(t, i, value));
        }
        // fp8 is widened (exactly) to bf16 first: MLX quantizes only the arrays it holds.
        let (bytes, dtype) = match crate::fp8::is_fp8(t.dtype) {
            true => (convert(&bytes, t.dtype, Dtype::BF16), Dtype::BF16),
            false => (bytes, t.dtype),
        };
        let shape = t
            .shape
            .iter()
            .map(|&d| i32::try_from(d))
            .collect::<Result<Vec<i32>, _>>()
            .map_err(|_| StoreError::Unquantizable {
                file: t.file.clone(),
                tensor: t.name.clone(),
                shape: t.shape.clone(),
            })?;
        let full = format!("{}/{}", t.component, t.name);
        let quantized = (|| -> Result<Vec<(String, mlx::Array)>, mlx::Error> {
            let w = mlx::Array::from_bytes(&bytes, &shape, dtype)?;
            let w = if dtype == mlx::Dtype::F32 {
                w
            } else {
                w.astype(mlx::Dtype::BF16)?
            };
            let (wq, scales, biases) = mlx::ops::quantize(&w, Quantization::GROUP_SIZE, q.bits())?;
            mlx::eval(&[&wq, &scales, &biases])?;
            Ok(vec![
                (full.clone(), wq),
                (format!("{full}.bias"), biases),
                (format!("{full}.scale"), scales),
            ])
        })()
        .map_err(StoreError::Mlx)?;
        drop(bytes);
        let specs: Vec<TensorSpec> = (quantized.iter())
            .map(|(name, a)| TensorSpec {
                name: name.clone(),
                dtype: a.dtype(),
                shape: a.shape().iter().map(|&d| d as u64).collect(),
            })
            .collect();
        let meta = BTreeMap::from([
            ("quant_type".to_string(), q.name().to_string()),
            (
                "group_size".to_string(),
                Quantization::GROUP_SIZE.to_string(),
            ),
        ]);
        let header = header_bytes(&specs, Some(&meta), align.max(8)).map_err(StoreError::Header)?;
        let mut w = BlobWriter::new(&self.root)?;
        w.write(&header)?;
        for (_, a) in &quantized {
            w.write(&a.to_bytes().map_err(StoreError::Mlx)?)?;
        }
        let (digest, size, new) = w.finish()?;
        Ok(vec![(
            tensor_layer(t, digest, size, t.dtype, t.shape.clone()),
            new,
        )])
    }
}

/// The error is the disk being full.
fn is_disk_full(e: &StoreError) -> bool {
    let io = match e {
        StoreError::File(crate::files::FileError::Io { cause, .. }) => Some(cause),
        StoreError::Blob(blob::BlobError::File(crate::files::FileError::Io { cause, .. })) => {
            Some(cause)
        }
        StoreError::Header(crate::safetensors::Error::Io(cause)) => Some(cause),
        _ => None,
    };
    io.is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull)
}

/// Makes the renames into a folder durable (on Unix a folder is synced through a handle on it).
fn sync_dir(dir: &std::path::Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(FileError::io(dir))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Imports run their tensors on rayon's pool, so sources are shared between threads.
pub trait TensorSourceSync: TensorSource + Sync {}
impl<T: TensorSource + Sync> TensorSourceSync for T {}

/// Little-endian float conversion from F32, F16, BF16 or fp8 to F32, F16 or BF16 (round to
/// nearest even; fp8 widens exactly).
fn convert(bytes: &[u8], from: Dtype, to: Dtype) -> Vec<u8> {
    let values: Vec<f32> = match from {
        d if crate::fp8::is_fp8(d) => bytes.iter().map(|&b| crate::fp8::to_f32(b, d)).collect(),
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => unreachable!("only float types convert"),
    };
    match to {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => unreachable!("only float types convert"),
    }
}

impl From<BlobError> for StoreError {
    fn from(e: BlobError) -> Self {
        StoreError::Blob(e)
    }
}
