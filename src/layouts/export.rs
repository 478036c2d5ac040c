//! A stored model written out as ComfyUI's files: the transformer in its family's original
//! layout (fused projections joined again), the text encoders in transformers' names (the
//! `model.`-prefixed Qwen3, or CLIP's text model and T5's encoder) and the LDM-layout VAE, each
//! carrying its diffusers config in its metadata so that importing the files again gives the
//! same model. Bytes are copied from the blobs as they are.

use crate::files::{FileError, TempFile};
use crate::mapping::{Component, Joined, CONFIG_METADATA_KEY};
use crate::safetensors::{self, Dtype, TensorSpec};
use crate::store::{blob, Store, StoreError, StoredModel};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Blob(#[from] blob::BlobError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Header(#[from] safetensors::Error),
    #[error("model `{model}`: {reason}")]
    Model { model: String, reason: String },
}

/// Where one exported component went.
#[derive(Debug, Clone)]
pub struct ExportedFile {
    pub component: Component,
    pub path: PathBuf,
    pub tensors: usize,
    pub bytes: u64,
}

/// The path of a component's file under a ComfyUI `models/` folder; a second text encoder goes
/// beside the first as `{stem}_2.safetensors`.
pub fn comfy_path(dir: &Path, component: Component, stem: &str) -> PathBuf {
    let (folder, suffix) = match component {
        Component::Transformer => ("diffusion_models", ""),
        Component::TextEncoder => ("text_encoders", ""),
        Component::TextEncoder2 => ("text_encoders", "_2"),
        Component::Vae => ("vae", ""),
    };
    dir.join(folder).join(format!("{stem}{suffix}.safetensors"))
}

/// One stored tensor's bytes.
#[derive(Debug, Clone)]
struct Stored {
    file: PathBuf,
    offset: u64,
    nbytes: u64,
    dtype: Dtype,
    shape: Vec<u64>,
}

/// Writes `model`'s components under `dir` (`diffusion_models/`, `text_encoders/`, `vae/`,
/// each `{stem}.safetensors`; a second text encoder `text_encoders/{stem}_2.safetensors`). All
/// are written to temporary files first and renamed into place together, so a failure leaves
/// no partial export. `with_config` writes each component's config into its file's metadata;
/// without it the files are as plain as those published elsewhere.
pub fn export_comfy(
    store: &Store,
    model: &StoredModel,
    dir: &Path,
    stem: &str,
    with_config: bool,
) -> Result<Vec<ExportedFile>, Error> {
    let name = model.name.short();
    let fail = |reason: String| Error::Model {
        model: name.clone(),
        reason,
    };
    let mut by_component: HashMap<&str, BTreeMap<String, Stored>> = HashMap::new();
    for layer in model.manifest.layers.iter().filter(|l| l.is_tensor()) {
        let Some((component, tensor)) = layer.component_and_tensor() else {
            continue;
        };
        let (path, header) = blob::read_blob_header(&store.root, &layer.digest)?;
        let [info] = header.tensors.as_slice() else {
            return Err(fail(format!(
                "`{component}/{tensor}` is stored quantized; ComfyUI files hold float tensors, so export a float model"
            )));
        };
        by_component.entry(component).or_default().insert(
            tensor.to_string(),
            Stored {
                file: path,
                offset: header.data_start() + info.data_offsets.0,
                nbytes: info.nbytes(),
                dtype: info.dtype,
                shape: info.shape.clone(),
            },
        );
    }
    let mut written = Vec::new();
    let mut pending = Vec::new();
    for component in Component::ALL {
        let Some(tensors) = by_component.get(component.dir()) else {
            if component.optional() {
                continue;
            }
            return Err(fail(format!("has no `{}` tensors", component.dir())));
        };
        let shapes: Vec<(String, Vec<u64>)> = tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.shape.clone()))
            .collect();
        let joined = match component {
            Component::Transformer => super::resolve::transformer_to_original(&shapes),
            Component::TextEncoder | Component::TextEncoder2 => {
                super::text_encoder::to_original(&shapes)
            }
            Component::Vae => super::vae::to_original(&shapes),
        };
        let config = store
            .config_file(model, &format!("{}/config.json", component.dir()))?
            .ok_or_else(|| fail(format!("has no `{}/config.json`", component.dir())))?;
        let config: serde_json::Value = serde_json::from_slice(&config).map_err(|e| {
            fail(format!(
                "`{}/config.json` is not JSON: {e}",
                component.dir()
            ))
        })?;
        let path = comfy_path(dir, component, stem);
        let config = with_config.then_some(&config);
        let (tmp, bytes) = write_file(&path, &joined, tensors, config, &fail)?;
        pending.push((tmp, path.clone()));
        written.push(ExportedFile {
            component,
            path,
            tensors: joined.len(),
            bytes,
        });
    }
    for (tmp, path) in pending {
        tmp.persist(&path)
            .map_err(|e| FileError::io(&path)(e.error))?;
    }
    Ok(written)
}

/// Writes one safetensors file to a temporary file beside `path`; returns it and its size.
fn write_file(
    path: &Path,
    joined: &[Joined],
    stored: &BTreeMap<String, Stored>,
    config: Option<&serde_json::Value>,
    fail: &dyn Fn(String) -> Error,
) -> Result<(TempFile, u64), Error> {
    let mut specs = Vec::with_capacity(joined.len());
    let mut sources = Vec::with_capacity(joined.len());
    for j in joined {
        let parts = j
            .parts
            .iter()
            .map(|p| {
                stored
                    .get(p)
                    .ok_or_else(|| fail(format!("has no tensor `{p}` to make `{}`", j.name)))
            })
            .collect::<Result<Vec<&Stored>, _>>()?;
        let dtype = parts[0].dtype;
        if parts
            .iter()
            .any(|p| p.dtype != dtype || p.shape.get(1..) != parts[0].shape.get(1..))
        {
            return Err(fail(format!(
                "the tensors that make `{}` ({}) differ in dtype or row shape",
                j.name,
                j.parts.join(", ")
            )));
        }
        specs.push(TensorSpec {
            name: j.name.clone(),
            dtype,
            shape: j.shape.clone(),
        });
        sources.push(parts);
    }
    let mut meta = BTreeMap::new();
    if let Some(config) = config {
        meta.insert(CONFIG_METADATA_KEY.to_string(), config.to_string());
    }
    meta.insert("format".to_string(), "pt".to_string());
    let header = safetensors::header_bytes(&specs, Some(&meta), 8)?;
    let parent = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(FileError::io(parent))?;
    let io = FileError::io(path);
    let mut tmp = TempFile::beside(path, ".zimage-export-").map_err(&io)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, &mut tmp);
    out.write_all(&header).map_err(&io)?;
    let mut total = header.len() as u64;
    for ((spec, parts), j) in specs.iter().zip(&sources).zip(joined) {
        let mut n = 0;
        if j.roll_rows > 0 {
            // A rolled tensor (a small one: a modulation) is put together in memory.
            let mut bytes = Vec::new();
            for p in parts {
                bytes.extend(crate::files::read_range(&p.file, p.offset, p.nbytes)?);
            }
            let rows = spec.shape.first().copied().unwrap_or(1);
            crate::mapping::roll_rows(&mut bytes, rows, j.roll_rows);
            out.write_all(&bytes).map_err(&io)?;
            n = bytes.len() as u64;
        }
        for p in parts.iter().filter(|_| j.roll_rows == 0) {
            let pio = FileError::io(&p.file);
            let mut f = std::fs::File::open(&p.file).map_err(&pio)?;
            f.seek(SeekFrom::Start(p.offset)).map_err(&pio)?;
            let copied = std::io::copy(&mut f.take(p.nbytes), &mut out).map_err(&io)?;
            if copied != p.nbytes {
                return Err(fail(format!("blob `{}` ended early", p.file.display())));
            }
            n += copied;
        }
        if n != spec.nbytes()? {
            return Err(fail(format!(
                "`{}` has {n} bytes for shape {:?}",
                spec.name, spec.shape
            )));
        }
        total += n;
    }
    out.flush().map_err(&io)?;
    drop(out);
    tmp.as_file().sync_all().map_err(&io)?;
    Ok((tmp, total))
}
