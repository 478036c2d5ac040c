//! A stored model's transformer written as a GGUF file in its family's original layout, as
//! stable-diffusion.cpp and ComfyUI-GGUF load it, each tensor in the ggml type nearest to how
//! the store holds it:
//!
//! | stored | written as | values |
//! |---|---|---|
//! | F32, F16, BF16 | the same type | identical |
//! | symmetric q4_0, q5_0, q8_0 (a GGUF import) | Q4_0, Q5_0, Q8_0 | identical: the source file's blocks, byte for byte |
//! | affine int4, int5 (group 32, 64 or 128) | Q4_1, Q5_1: `d = scale`, `m = bias` per 32 values, in f16 | identical where the scales and biases are f16 values computed in f32 (a Q4_1 or Q5_1 import); else nearest |
//! | affine int8 | Q8_0, re-quantized from the stored values | nearest |
//!
//! nvfp4, mxfp8 and mxfp4 weights have no ggml type and are refused. The file carries the
//! family's `general.architecture` (ComfyUI-GGUF's name for its models) and the transformer's
//! config under [`super::CONFIG_METADATA_KEY`], so importing it again gives the same model.

use crate::dtype::Dtype;
use crate::files::{FileError, TempFile};
use crate::formats::gguf::{self, GgmlType, TensorHead, Value};
use crate::ggml::{self, Group, GROUP};
use crate::mapping::CONFIG_METADATA_KEY;
use crate::mlx::QuantMode;
use crate::store::{blob, Store, StoredModel};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::export::Error;

/// Where the transformer went and what each tensor became.
#[derive(Debug, Clone)]
pub struct GgufExport {
    pub path: PathBuf,
    pub tensors: usize,
    pub bytes: u64,
    /// Stored tensors per conversion, e.g. `q4_0 → Q4_0 (exact)`.
    pub paths: BTreeMap<String, usize>,
    /// The largest `|written − stored|` value of any conversion that is not exact, and its
    /// tensor.
    pub max_error: Option<(String, f32)>,
}

/// The path of the transformer's GGUF file under a ComfyUI `models/` folder.
pub fn gguf_path(dir: &Path, stem: &str) -> PathBuf {
    dir.join("diffusion_models").join(format!("{stem}.gguf"))
}

/// One stored tensor's bytes in a blob.
#[derive(Debug, Clone)]
struct Part {
    file: PathBuf,
    offset: u64,
    nbytes: u64,
}

/// How one stored tensor is held.
#[derive(Debug, Clone)]
enum Held {
    Plain {
        data: Part,
        dtype: Dtype,
    },
    /// Affine (`scale·q + bias`) with biases, symmetric (`scale·(q − 2^(bits−1))`) without.
    Quantized {
        packed: Part,
        scales: Part,
        biases: Option<Part>,
        scale_dtype: Dtype,
        bits: u32,
        group: usize,
    },
}

/// One stored tensor: how it is held and its logical shape.
#[derive(Debug, Clone)]
struct Stored {
    held: Held,
    shape: Vec<u64>,
}

impl Stored {
    /// The ggml type it is written as, and the conversion's name.
    fn target(
        &self,
        tensor: &str,
        fail: &dyn Fn(String) -> Error,
    ) -> Result<(GgmlType, String), Error> {
        Ok(match &self.held {
            Held::Plain { dtype, .. } => {
                let ty = match dtype {
                    Dtype::F32 => GgmlType::F32,
                    Dtype::F16 => GgmlType::F16,
                    Dtype::BF16 => GgmlType::BF16,
                    other => {
                        return Err(fail(format!(
                            "`transformer/{tensor}` is {other}, which GGUF files do not hold"
                        )))
                    }
                };
                (ty, format!("{ty} → {ty} (exact)"))
            }
            Held::Quantized {
                biases: None, bits, ..
            } => {
                let ty = match bits {
                    4 => GgmlType::Q4_0,
                    5 => GgmlType::Q5_0,
                    _ => GgmlType::Q8_0,
                };
                (
                    ty,
                    format!("{} → {ty} (exact)", ty.name().to_ascii_lowercase()),
                )
            }
            Held::Quantized {
                bits,
                group,
                scale_dtype,
                ..
            } => {
                let ty = match bits {
                    4 => GgmlType::Q4_1,
                    5 => GgmlType::Q5_1,
                    _ => GgmlType::Q8_0,
                };
                let how = if ty == GgmlType::Q8_0 {
                    "re-quantized"
                } else {
                    "f16 scales and biases"
                };
                (
                    ty,
                    format!("int{bits} group {group} ({scale_dtype}) → {ty} ({how})"),
                )
            }
        })
    }
}

fn read_part(p: &Part) -> Result<Vec<u8>, Error> {
    Ok(crate::files::read_range(&p.file, p.offset, p.nbytes)?)
}

/// Scale or bias values of one dtype as f32 (exact for f16, bf16 and f32).
fn floats(bytes: &[u8], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::F32 => (bytes.chunks_exact(4))
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect(),
        Dtype::F16 => (bytes.chunks_exact(2))
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => (bytes.chunks_exact(2))
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    }
}

/// A stored affine value as the store computes it: `scale·q + bias` rounded as MLX rounds in
/// the scales' dtype (each of product and sum).
fn affine_value(s: f32, b: f32, q: u8, dtype: Dtype) -> f32 {
    let p = s * f32::from(q);
    match dtype {
        Dtype::F32 => p + b,
        Dtype::F16 => half::f16::from_f32(half::f16::from_f32(p).to_f32() + b).to_f32(),
        _ => half::bf16::from_f32(half::bf16::from_f32(p).to_f32() + b).to_f32(),
    }
}

/// The tensor's bytes in `ty`, and the largest difference from the stored values.
fn convert(s: &Stored, ty: GgmlType) -> Result<(Vec<u8>, f32), Error> {
    let (packed, scales, biases, scale_dtype, bits, group) = match &s.held {
        Held::Plain { data, .. } => return Ok((read_part(data)?, 0.0)),
        Held::Quantized {
            packed,
            scales,
            biases,
            scale_dtype,
            bits,
            group,
        } => (packed, scales, biases, *scale_dtype, *bits, *group),
    };
    let cols = *s.shape.last().expect("a matrix") as usize;
    let rows = s.shape.iter().product::<u64>() as usize / cols.max(1);
    let q = ggml::unpack(&read_part(packed)?, bits, rows * cols);
    let scales = floats(&read_part(scales)?, scale_dtype);
    let biases = match biases {
        Some(b) => Some(floats(&read_part(b)?, scale_dtype)),
        None => None,
    };
    let groups_per_row = cols / group;
    // The stored scale and bias of the 32-value block `k` (blocks numbered over the whole
    // tensor): a group of 64 or 128 covers two or four blocks.
    let per_block = |k: usize| {
        let (row, block) = (k / (cols / GROUP), k % (cols / GROUP));
        let g = row * groups_per_row + block * GROUP / group;
        (scales[g], biases.as_ref().map(|b| b[g]))
    };
    let blocks = rows * cols / GROUP;
    let mut out = Vec::with_capacity(ty.nbytes((rows * cols) as u64).unwrap_or(0) as usize);
    let mut worst = 0f32;
    match (ty, biases.is_some()) {
        (GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0, false) => {
            for k in 0..blocks {
                let (d, _) = per_block(k);
                let group = Group {
                    d: half::f16::from_f32(d),
                    m: half::f16::ZERO,
                    q: &q[k * GROUP..(k + 1) * GROUP],
                };
                ggml::encode_block(ty, &group, &mut out);
            }
        }
        (GgmlType::Q4_1 | GgmlType::Q5_1, true) => {
            for k in 0..blocks {
                let (s, b) = per_block(k);
                let b = b.expect("affine");
                let (d, m) = (half::f16::from_f32(s), half::f16::from_f32(b));
                let values = &q[k * GROUP..(k + 1) * GROUP];
                for &v in values {
                    let written = d.to_f32() * f32::from(v) + m.to_f32();
                    worst = worst.max((written - affine_value(s, b, v, scale_dtype)).abs());
                }
                let group = Group { d, m, q: values };
                ggml::encode_block(ty, &group, &mut out);
            }
        }
        (GgmlType::Q8_0, true) => {
            let mut values = Vec::with_capacity(rows * cols);
            for k in 0..blocks {
                let (s, b) = per_block(k);
                let b = b.expect("affine");
                let block = &q[k * GROUP..(k + 1) * GROUP];
                values.extend(block.iter().map(|&v| affine_value(s, b, v, scale_dtype)));
            }
            out = ggml::quantize_q8_0(&values);
            let back = ggml::dequantize(GgmlType::Q8_0, &out).expect("Q8_0 is covered");
            worst = (back.iter().zip(&values)).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        }
        _ => unreachable!("targets follow the stored form"),
    }
    Ok((out, worst))
}

/// The transformer's tensors as the store holds them, by name.
fn stored_transformer(
    store: &Store,
    model: &StoredModel,
    fail: &dyn Fn(String) -> Error,
) -> Result<BTreeMap<String, Stored>, Error> {
    let mut out = BTreeMap::new();
    // Ollama's first quantized generation keeps scales and biases as layers of their own.
    let mut v1: HashMap<String, (PathBuf, crate::safetensors::Header)> = HashMap::new();
    for layer in model.manifest.layers.iter().filter(|l| l.is_tensor()) {
        let Some(("transformer", tensor)) = layer.component_and_tensor() else {
            continue;
        };
        let (path, header) = blob::read_blob_header(&store.root, &layer.digest)?;
        let part = |info: &crate::safetensors::TensorInfo| Part {
            file: path.clone(),
            offset: header.data_start() + info.data_offsets.0,
            nbytes: info.nbytes(),
        };
        if let [info] = header.tensors.as_slice() {
            if tensor.ends_with("_scale") || tensor.ends_with("_qbias") || info.dtype == Dtype::U32
            {
                v1.insert(tensor.to_string(), (path.clone(), header.clone()));
                continue;
            }
            let held = Held::Plain {
                data: part(info),
                dtype: info.dtype,
            };
            out.insert(
                tensor.to_string(),
                Stored {
                    held,
                    shape: info.shape.clone(),
                },
            );
            continue;
        }
        let main = blob::main_tensor(&header).ok_or_else(|| {
            fail(format!(
                "`transformer/{tensor}`'s blob holds no main tensor"
            ))
        })?;
        let companion = |suffix: &str| header.tensor(&format!("{}{suffix}", main.name));
        let scales = companion(".scale")
            .ok_or_else(|| fail(format!("`transformer/{tensor}` has no `.scale`")))?;
        let meta = header.metadata.clone().unwrap_or_default();
        let (mode, group, bits) = match meta.get("quant_type") {
            Some(t) => QuantMode::from_quant_type(t)
                .ok_or_else(|| fail(format!("`transformer/{tensor}` is quantized as `{t}`")))?,
            None => (QuantMode::Affine, 64, 0),
        };
        if !matches!(mode, QuantMode::Affine | QuantMode::Symmetric) {
            return Err(fail(format!(
                "`transformer/{tensor}` is quantized as {mode:?}, which no ggml type holds; export a model quantized to int4 or int8, or a float one"
            )));
        }
        if (mode == QuantMode::Symmetric) != companion(".bias").is_none() {
            return Err(fail(format!(
                "`transformer/{tensor}` is {mode:?} {} biases",
                if mode == QuantMode::Symmetric {
                    "with"
                } else {
                    "without"
                }
            )));
        }
        let group = meta
            .get("group_size")
            .and_then(|g| g.parse().ok())
            .unwrap_or(group as usize);
        let parts = (part(main), part(scales), companion(".bias").map(part));
        let stored = quantized(parts, scales, main, group, bits as u32)
            .map_err(|reason| fail(format!("`transformer/{tensor}`: {reason}")))?;
        out.insert(tensor.to_string(), stored);
    }
    for (tensor, (path, header)) in v1
        .iter()
        .filter(|(n, _)| !n.ends_with("_scale") && !n.ends_with("_qbias"))
    {
        let main = &header.tensors[0];
        let companion = |suffix: &str| {
            v1.get(&format!("{tensor}{suffix}")).map(|(p, h)| {
                let info = &h.tensors[0];
                (
                    Part {
                        file: p.clone(),
                        offset: h.data_start() + info.data_offsets.0,
                        nbytes: info.nbytes(),
                    },
                    info.clone(),
                )
            })
        };
        let ((scales, scale_info), (biases, _)) = companion("_scale")
            .zip(companion("_qbias"))
            .ok_or_else(|| {
                fail(format!(
                    "`transformer/{tensor}` has no `_scale` and `_qbias` layers"
                ))
            })?;
        let packed = Part {
            file: path.clone(),
            offset: header.data_start() + main.data_offsets.0,
            nbytes: main.nbytes(),
        };
        // Ollama's first quantized imports used group 32.
        let stored = quantized((packed, scales, Some(biases)), &scale_info, main, 32, 0)
            .map_err(|reason| fail(format!("`transformer/{tensor}`: {reason}")))?;
        out.insert(tensor.clone(), stored);
    }
    Ok(out)
}

/// A quantized tensor from its parts (packed values, scales, biases), checked against each
/// other; `bits` 0 infers the width from the shapes.
fn quantized(
    (packed, scales, biases): (Part, Part, Option<Part>),
    scale_info: &crate::safetensors::TensorInfo,
    main: &crate::safetensors::TensorInfo,
    group: usize,
    bits: u32,
) -> Result<Stored, String> {
    let ([rows, words], [srows, ngroups]) = (main.shape.as_slice(), scale_info.shape.as_slice())
    else {
        return Err("a quantized tensor that is not a matrix".into());
    };
    let cols = ngroups * group as u64;
    let bits = match bits {
        0 => [4u32, 8, 5, 2, 3, 6]
            .into_iter()
            .find(|b| words * 32 == cols * u64::from(*b))
            .ok_or("the packed shape does not match its scales")?,
        b => b,
    };
    if rows != srows
        || words * 32 != cols * u64::from(bits)
        || !matches!(bits, 4 | 5 | 8)
        || !(group as u64).is_multiple_of(GROUP as u64)
        || main.dtype != Dtype::U32
        || !matches!(scale_info.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16)
    {
        return Err(format!(
            "{bits}-bit weight [{rows}, {words}] with {} scales [{srows}, {ngroups}] at group {group}: GGUF holds 4, 5 and 8 bits in groups of 32, 64 or 128",
            scale_info.dtype
        ));
    }
    Ok(Stored {
        held: Held::Quantized {
            packed,
            scales,
            biases,
            scale_dtype: scale_info.dtype,
            bits,
            group,
        },
        shape: vec![*rows, cols],
    })
}

/// Writes `model`'s transformer to `gguf_path(dir, stem)` through a temporary file renamed into
/// place when whole; `with_config` writes the transformer's config into the metadata.
pub fn export_gguf(
    store: &Store,
    model: &StoredModel,
    dir: &Path,
    stem: &str,
    with_config: bool,
) -> Result<GgufExport, Error> {
    let name = model.name.short();
    let fail = |reason: String| Error::Model {
        model: name.clone(),
        reason,
    };
    let stored = stored_transformer(store, model, &fail)?;
    if stored.is_empty() {
        return Err(fail("has no `transformer` tensors".into()));
    }
    let shapes: Vec<(String, Vec<u64>)> = (stored.iter())
        .map(|(n, t)| (n.clone(), t.shape.clone()))
        .collect();
    let joined = super::resolve::transformer_to_original(&shapes);

    // Every tensor's type, decided before anything is written: the header comes first.
    let mut heads = Vec::with_capacity(joined.len());
    let mut paths = BTreeMap::new();
    for j in &joined {
        let mut ty = None;
        for p in &j.parts {
            let s = stored
                .get(p)
                .ok_or_else(|| fail(format!("has no tensor `{p}` to make `{}`", j.name)))?;
            let (t, path) = s.target(p, &fail)?;
            if ty.is_some_and(|ty| ty != t) {
                return Err(fail(format!(
                    "the tensors that make `{}` ({}) are held in different forms",
                    j.name,
                    j.parts.join(", ")
                )));
            }
            ty = Some(t);
            *paths.entry(path).or_default() += 1;
        }
        heads.push(TensorHead {
            name: j.name.clone(),
            ggml_type: ty.expect("a joined tensor has parts"),
            shape: j.shape.clone(),
        });
    }
    let config = store
        .config_file(model, "transformer/config.json")?
        .ok_or_else(|| fail("has no `transformer/config.json`".into()))?;
    let config: serde_json::Value = serde_json::from_slice(&config)
        .map_err(|e| fail(format!("`transformer/config.json` is not JSON: {e}")))?;
    let architecture = crate::families::Family::of_stored(&shapes).gguf_architecture();
    let mut metadata = vec![
        (
            "general.architecture".to_string(),
            Value::String(architecture.into()),
        ),
        ("general.quantization_version".to_string(), Value::U32(2)),
    ];
    if with_config {
        metadata.push((
            CONFIG_METADATA_KEY.to_string(),
            Value::String(config.to_string()),
        ));
    }
    let (header, alignment) = gguf::header(&metadata, &heads)
        .map_err(|e| fail(format!("cannot lay out the GGUF file: {e}")))?;

    let path = gguf_path(dir, stem);
    let parent = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(FileError::io(parent))?;
    let io = FileError::io(&path);
    let mut tmp = TempFile::beside(&path, ".zimage-export-").map_err(&io)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, &mut tmp);
    out.write_all(&header).map_err(&io)?;
    let mut total = header.len() as u64;
    let mut max_error: Option<(String, f32)> = None;
    for (j, head) in joined.iter().zip(&heads) {
        let mut n = 0u64;
        let mut rolled = Vec::new();
        for p in &j.parts {
            let (bytes, err) = convert(&stored[p], head.ggml_type)?;
            if err > 0.0 && max_error.as_ref().is_none_or(|(_, e)| err > *e) {
                max_error = Some((p.clone(), err));
            }
            n += bytes.len() as u64;
            match j.roll_rows {
                0 => out.write_all(&bytes).map_err(&io)?,
                _ => rolled.extend(bytes),
            }
        }
        if j.roll_rows > 0 {
            // ggml rows are whole blocks, so the rows roll as bytes.
            let rows = head.shape.first().copied().unwrap_or(1);
            crate::mapping::roll_rows(&mut rolled, rows, j.roll_rows);
            out.write_all(&rolled).map_err(&io)?;
        }
        let want = head.nbytes().map_err(|e| fail(e.to_string()))?;
        if n != want {
            return Err(fail(format!(
                "`{}` came to {n} bytes, its type and shape need {want}",
                j.name
            )));
        }
        let pad = gguf::padding(n, alignment);
        out.write_all(&vec![0u8; pad as usize]).map_err(&io)?;
        total += n + pad;
    }
    out.flush().map_err(&io)?;
    drop(out);
    tmp.as_file().sync_all().map_err(&io)?;
    tmp.persist(&path).map_err(|e| io(e.error))?;
    drop(io);
    Ok(GgufExport {
        path,
        tensors: joined.len(),
        bytes: total,
        paths,
        max_error,
    })
}
