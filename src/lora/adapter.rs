//! A LoRA file read and checked: its low-rank pairs by module, each with its rank and alpha,
//! and the pairs bound to a model as arrays with their scale.

use super::layout::{self, Component, Layout, ModuleKey, Part};
use super::Error;
use crate::mlx::{self, Array};
use crate::safetensors::{self, Dtype, TensorInfo};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The largest LoRA file read: well above the largest LoRAs in use (a few hundred MB for a
/// full-rank text-encoder adapter).
pub const MAX_LORA_BYTES: u64 = 4 << 30;
/// The highest rank accepted: far above any trained LoRA (they use 4 to 256).
pub const MAX_RANK: u64 = 8192;

/// One module's pair as the file holds it.
#[derive(Debug, Clone)]
pub struct StoredPair {
    /// `A` / `lora_down`, `[rank, in]`.
    pub down: TensorInfo,
    /// `B` / `lora_up`, `[out, rank]`.
    pub up: TensorInfo,
    pub alpha: Option<f64>,
}

impl StoredPair {
    pub fn rank(&self) -> u64 {
        self.down.shape[0]
    }
    pub fn in_features(&self) -> u64 {
        self.down.shape[1]
    }
    pub fn out_features(&self) -> u64 {
        self.up.shape[0]
    }
    /// `alpha / rank`, the trainer's scale (1 when the file gives no alpha).
    pub fn alpha_scale(&self) -> f64 {
        self.alpha.map_or(1.0, |a| a / self.rank() as f64)
    }
}

/// A LoRA file, read and checked.
#[derive(Debug)]
pub struct LoraFile {
    pub path: PathBuf,
    pub layout: Layout,
    pub pairs: BTreeMap<(Component, ModuleKey), StoredPair>,
    /// Keys that fit no layout or mix layouts, skipped when lenient (else an error).
    pub skipped: Vec<String>,
    /// The file's header: every tensor in file order, and its metadata.
    pub header: safetensors::Header,
    bytes: Vec<u8>,
}

/// The parts of one module's pair found so far.
#[derive(Default)]
struct Parts {
    down: Option<TensorInfo>,
    up: Option<TensorInfo>,
    alpha: Option<TensorInfo>,
}

impl LoraFile {
    /// Reads `path` (bounded by [`MAX_LORA_BYTES`]), detects its layout and pairs its keys.
    /// Keys that fit no layout are an error naming the first, unless `lenient`.
    pub fn read(path: &Path, lenient: bool) -> Result<LoraFile, Error> {
        let bytes = crate::files::read_bounded(path, MAX_LORA_BYTES, "LoRA file")?;
        LoraFile::from_bytes(path, bytes, lenient)
    }

    /// A LoRA file's bytes, read from `path` (named in errors) or rebuilt from a store.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>, lenient: bool) -> Result<LoraFile, Error> {
        let file = |reason: String| Error::File {
            path: path.to_path_buf(),
            reason,
        };
        let header = safetensors::parse(&bytes).map_err(|e| e.in_file(path))?;
        if let Some(t) = header
            .tensors
            .iter()
            .find(|t| layout::other_kind(&t.name).is_some())
        {
            let kind = layout::other_kind(&t.name).unwrap_or("LoKr");
            return Err(file(format!(
                "tensor `{}` is a {kind} adapter; only LoRA (low-rank A/B pairs) is supported: convert it to a LoRA or use a LoRA version of it",
                super::shown(&t.name)
            )));
        }
        let metadata_alpha = peft_metadata_alpha(header.metadata.as_ref());
        let mut layout = None;
        let mut parts: BTreeMap<(Component, ModuleKey), Parts> = BTreeMap::new();
        let mut skipped = Vec::new();
        for t in &header.tensors {
            let parsed = layout::parse_key(&t.name);
            let parsed = match (parsed, layout) {
                (Some(p), None) => {
                    layout = Some(p.layout);
                    p
                }
                (Some(p), Some(l)) if p.layout == l => p,
                (p, l) => {
                    if !lenient {
                        let why = match (p, l) {
                            (Some(p), Some(l)) => format!(
                                "is in the {} layout, the file's first keys in the {} layout",
                                p.layout.describe(),
                                l.describe()
                            ),
                            _ => "fits no LoRA layout (expected `transformer.<module>.lora_A.weight`, `diffusion_model.<module>.lora_A.weight` or `lora_unet_<module>.lora_down.weight` and their `lora_B`/`lora_up`/`alpha`)".into(),
                        };
                        return Err(file(format!(
                            "key `{}` {why}; pass --lora-lenient to skip such keys",
                            super::shown(&t.name)
                        )));
                    }
                    skipped.push(t.name.clone());
                    continue;
                }
            };
            let slot = parts.entry((parsed.component, parsed.module)).or_default();
            let place = match parsed.part {
                Part::Down => &mut slot.down,
                Part::Up => &mut slot.up,
                Part::Alpha => &mut slot.alpha,
            };
            if place.is_some() {
                return Err(file(format!(
                    "key `{}` names a part another key already gave (a `default.` and a plain spelling of one weight?); keep one",
                    super::shown(&t.name)
                )));
            }
            *place = Some(t.clone());
        }
        let Some(layout) = layout else {
            return Err(file(
                "has no LoRA keys (`…lora_A.weight`, `…lora_down.weight`); is it a LoRA file?"
                    .into(),
            ));
        };
        let mut pairs = BTreeMap::new();
        for (key, p) in parts {
            let pair =
                pair_of(&key.1, p, &bytes, header.data_start(), metadata_alpha).map_err(file)?;
            pairs.insert(key, pair);
        }
        Ok(LoraFile {
            path: path.to_path_buf(),
            layout,
            pairs,
            skipped,
            header,
            bytes,
        })
    }

    /// The bytes of tensor `t`, which the parser has checked lie inside the file.
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        tensor_bytes(&self.bytes, self.header.data_start(), t)
    }

    /// `t` as an f32 array of its own shape.
    pub(crate) fn array(&self, t: &TensorInfo) -> Result<Array, Error> {
        let shape: Vec<i32> = t.shape.iter().map(|&d| d as i32).collect();
        let data = self.data(t);
        let array = match t.dtype {
            Dtype::F32 => Array::from_bytes(data, &shape, mlx::Dtype::F32),
            Dtype::F16 => Array::from_bytes(data, &shape, mlx::Dtype::F16),
            Dtype::BF16 => Array::from_bytes(data, &shape, mlx::Dtype::BF16),
            Dtype::F64 => {
                let values: Vec<f32> = data
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
                    .collect();
                Array::from_slice(&values, &shape)
            }
            other => {
                return Err(Error::File {
                    path: self.path.clone(),
                    reason: format!(
                        "tensor `{}` is {other}; LoRA weights must be F32, F16, BF16 or F64",
                        super::shown(&t.name)
                    ),
                })
            }
        }?;
        Ok(array.astype(mlx::Dtype::F32)?)
    }
}

fn tensor_bytes<'a>(bytes: &'a [u8], data_start: u64, t: &TensorInfo) -> &'a [u8] {
    let start = data_start.saturating_add(t.data_offsets.0) as usize;
    let end = data_start.saturating_add(t.data_offsets.1) as usize;
    bytes.get(start..end).unwrap_or(&[])
}

/// Checks one module's parts and reads its alpha.
fn pair_of(
    module: &ModuleKey,
    p: Parts,
    bytes: &[u8],
    data_start: u64,
    metadata_alpha: Option<f64>,
) -> Result<StoredPair, String> {
    let m = super::shown(module.as_str());
    let (down, up) = match (p.down, p.up) {
        (Some(d), Some(u)) => (d, u),
        (Some(d), None) => {
            return Err(format!(
                "`{}` has no up (`lora_B`/`lora_up`) partner; the file is incomplete",
                super::shown(&d.name)
            ))
        }
        (None, Some(u)) => {
            return Err(format!(
                "`{}` has no down (`lora_A`/`lora_down`) partner; the file is incomplete",
                super::shown(&u.name)
            ))
        }
        (None, None) => return Err(format!("module `{m}` has an alpha but no LoRA weights")),
    };
    for t in [&down, &up] {
        if !matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64) {
            return Err(format!(
                "tensor `{}` is {}; LoRA weights must be F32, F16, BF16 or F64",
                super::shown(&t.name),
                t.dtype
            ));
        }
        if t.shape.len() != 2 || t.shape.contains(&0) {
            return Err(format!(
                "tensor `{}` has shape {:?}; LoRA weights of a linear layer are 2-D with no empty axis",
                super::shown(&t.name),
                t.shape
            ));
        }
        if t.shape.iter().any(|&d| d > i32::MAX as u64) {
            return Err(format!(
                "tensor `{}` has shape {:?}, an axis longer than {}",
                super::shown(&t.name),
                t.shape,
                i32::MAX
            ));
        }
    }
    let rank = down.shape[0];
    if up.shape[1] != rank {
        return Err(format!(
            "module `{m}`: down has rank {rank} ({:?}), up has {} ({:?}); they must agree",
            down.shape, up.shape[1], up.shape
        ));
    }
    if rank > MAX_RANK {
        return Err(format!(
            "module `{m}` has rank {rank}, more than the {MAX_RANK} a LoRA may have"
        ));
    }
    let alpha = match p.alpha {
        Some(t) => Some(read_alpha(&t, tensor_bytes(bytes, data_start, &t))?),
        None => metadata_alpha,
    };
    Ok(StoredPair { down, up, alpha })
}

/// A scalar alpha in any float dtype, finite.
fn read_alpha(t: &TensorInfo, data: &[u8]) -> Result<f64, String> {
    let value = match (t.dtype, data.len()) {
        _ if t.numel() != 1 => None,
        (Dtype::F32, 4) => data.try_into().ok().map(f32::from_le_bytes).map(f64::from),
        (Dtype::F64, 8) => data.try_into().ok().map(f64::from_le_bytes),
        (Dtype::F16, 2) => data
            .try_into()
            .ok()
            .map(|b| half::f16::from_le_bytes(b).to_f64()),
        (Dtype::BF16, 2) => data
            .try_into()
            .ok()
            .map(|b| half::bf16::from_le_bytes(b).to_f64()),
        _ => None,
    };
    match value {
        Some(v) if v.is_finite() => Ok(v),
        Some(v) => Err(format!(
            "alpha `{}` is {v}; it must be a finite number",
            super::shown(&t.name)
        )),
        None => Err(format!(
            "alpha `{}` is {} of shape {:?}; it must be one F32, F16, BF16 or F64 value",
            super::shown(&t.name),
            t.dtype,
            t.shape
        )),
    }
}

/// diffusers (≥ 0.33) keeps the PEFT config in the metadata: `lora_alpha` over `r` scales
/// every pair of a file whose keys carry no alpha.
fn peft_metadata_alpha(metadata: Option<&BTreeMap<String, String>>) -> Option<f64> {
    let json = metadata?.get("lora_adapter_metadata")?;
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    ["transformer.lora_alpha", "lora_alpha"]
        .iter()
        .find_map(|k| v.get(*k).and_then(|a| a.as_f64()))
        .filter(|a| a.is_finite())
}
