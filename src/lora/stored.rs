//! LoRAs kept in a stored model. `zimage create NAME --from BASE --lora FILE[:SCALE]` writes a
//! manifest that names every layer of BASE's (so every base blob is shared, and survives
//! `rm BASE` and `gc`) and adds, per LoRA:
//!
//! - each tensor of the file as a layer of type [`LORA_TENSOR_MEDIA_TYPE`] named
//!   `lora/<n>/<key as in the file>`, its blob a tensor blob like the base's (one tensor keyed
//!   `data`, in the file's dtype, bytes unchanged);
//! - a record of type [`LORA_JSON_MEDIA_TYPE`] named `lora/<n>/adapter.json`: the file it came
//!   from, the scale, whether unknown keys are skipped, its hash and the file's metadata.
//!
//! Loading rebuilds each file from its layers and applies it as `--lora` applies a file, so a
//! derived model makes the image its base makes with `--lora FILE:SCALE`. The LoRA layers are
//! not base weights: the model identity stays the base's, and images name the LoRAs in their
//! `Lora hashes`, as they do for `--lora`.

use super::{Error, Input, LoraFile, LoraSpec, Targets};
use crate::files;
use crate::safetensors::{self, TensorSpec};
use crate::store::blob;
use crate::store::manifest::{Layer, Manifest, LORA_JSON_MEDIA_TYPE, LORA_TENSOR_MEDIA_TYPE};
use crate::store::{ModelName, Store, StoreError, StoredModel};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The name of a LoRA's record layer.
const RECORD_NAME: &str = "adapter.json";
/// The largest record read: a trainer's metadata (tag counts, dataset notes) is at most a
/// few MB.
const RECORD_LIMIT: u64 = 64 << 20;

/// What a derived model records of one LoRA.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The file as it was given to `create`.
    pub file: String,
    pub scale: f32,
    /// Keys that name no layer of the model are skipped (`--lora-lenient`).
    pub lenient: bool,
    pub layout: super::Layout,
    /// A1111's LoRA hash of the file, first 12 hex.
    pub hash: String,
    /// Pairs applied to the base.
    pub pairs: usize,
    /// The file's `__metadata__`, kept for the alpha diffusers writes there.
    pub metadata: Option<BTreeMap<String, String>>,
}

/// The LoRAs a stored model carries, with the layers they came from.
pub fn records(store: &Store, model: &StoredModel) -> Result<Vec<(String, Record)>, Error> {
    model
        .manifest
        .layers
        .iter()
        .filter(|l| l.is_lora_record())
        .map(|l| {
            let name = l.name.clone().unwrap_or_default();
            let bytes = read_layer(store, model, l, RECORD_LIMIT)?;
            let record = serde_json::from_slice(&bytes).map_err(|e| Error::Stored {
                model: model.name.short(),
                layer: name.clone(),
                reason: format!("not a LoRA record ({e})"),
            })?;
            Ok((name, record))
        })
        .collect()
}

/// Whether a stored model carries LoRAs, from its manifest alone.
pub fn carries_loras(model: &StoredModel) -> bool {
    model.manifest.layers.iter().any(Layer::is_lora_record)
}

/// The LoRAs a stored model carries, read back from its layers, in the order they were added.
pub fn read(store: &Store, model: &StoredModel) -> Result<Vec<Input>, Error> {
    let mut inputs = Vec::new();
    for (record_name, record) in records(store, model)? {
        let prefix = record_name
            .strip_suffix(RECORD_NAME)
            .unwrap_or(&record_name)
            .to_string();
        let damaged = |reason: String| Error::Stored {
            model: model.name.short(),
            layer: record_name.clone(),
            reason,
        };
        let mut specs = Vec::new();
        let mut data = Vec::new();
        for layer in model.manifest.layers.iter().filter(|l| l.is_lora_tensor()) {
            let Some(key) = layer.name.as_deref().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            let left = super::adapter::MAX_LORA_BYTES.saturating_sub(data.len() as u64);
            let bytes = read_layer(store, model, layer, left)?;
            let header = safetensors::parse(&bytes).map_err(|e| Error::Stored {
                model: model.name.short(),
                layer: key.to_string(),
                reason: e.to_string(),
            })?;
            let [t] = header.tensors.as_slice() else {
                return Err(damaged(format!(
                    "blob of `{key}` holds {} tensors, not one",
                    header.tensors.len()
                )));
            };
            let start = header.data_start().saturating_add(t.data_offsets.0) as usize;
            let end = header.data_start().saturating_add(t.data_offsets.1) as usize;
            data.extend_from_slice(bytes.get(start..end).unwrap_or(&[]));
            specs.push(TensorSpec {
                name: key.to_string(),
                dtype: t.dtype,
                shape: t.shape.clone(),
            });
        }
        if specs.is_empty() {
            return Err(damaged("no tensor layers belong to it".into()));
        }
        let mut file = safetensors::header_bytes(&specs, record.metadata.as_ref(), 8)
            .map_err(|e| damaged(e.to_string()))?;
        file.extend_from_slice(&data);
        let path = PathBuf::from(&record.file);
        inputs.push(Input {
            file: LoraFile::from_bytes(&path, file, record.lenient)?,
            scale: record.scale,
            hash: record.hash,
            lenient: record.lenient,
        });
    }
    Ok(inputs)
}

/// A layer's blob, read whole, checked to be in the store and within `limit`.
fn read_layer(
    store: &Store,
    model: &StoredModel,
    layer: &Layer,
    limit: u64,
) -> Result<Vec<u8>, Error> {
    let path = store.blob_path(&layer.digest)?;
    blob::check_inside_store(&store.root, &layer.digest, &path).map_err(|e| Error::Stored {
        model: model.name.short(),
        layer: layer.name.clone().unwrap_or_default(),
        reason: e.to_string(),
    })?;
    files::read_bounded(&path, limit, "LoRA layer").map_err(|e| Error::Stored {
        model: model.name.short(),
        layer: layer.name.clone().unwrap_or_default(),
        reason: e.to_string(),
    })
}

/// What [`create`] wrote.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Derived {
    /// Layers shared with the base, blobs unchanged.
    pub shared_layers: usize,
    pub loras: usize,
    pub lora_tensors: usize,
    pub blobs_written: usize,
    pub bytes_written: u64,
}

impl Derived {
    /// Stores `bytes` as a blob, counting it if it is new, and returns its layer.
    fn put(
        &mut self,
        store: &Store,
        bytes: &[u8],
        media_type: &str,
        name: String,
    ) -> Result<Layer, StoreError> {
        let (digest, size, new) = blob::write_blob(&store.root, bytes)?;
        if new {
            self.blobs_written += 1;
            self.bytes_written += size;
        }
        Ok(Layer {
            media_type: media_type.into(),
            digest,
            size,
            from: None,
            name: Some(name),
            dtype: None,
            shape: None,
        })
    }
}

/// Reads a `model_index.json` into the original names its family's layers answer to.
pub type NamesOfIndex = dyn Fn(&[u8]) -> Result<Option<super::OriginalNames>, String>;

/// Stores `name`: every layer of stored model `base`, plus the LoRAs `specs` as layers of their
/// own. Every file is read and resolved against the base's layers before anything is written,
/// so a file that would not apply writes nothing. The store is held (shared) throughout, so a
/// `gc` cannot take the base's blobs before the new manifest names them. `original_names`
/// reads the base's `model_index.json` into the original names its family's layers answer to.
pub fn create(
    store: &Store,
    name: &str,
    base: &str,
    specs: &[LoraSpec],
    lenient: bool,
    original_names: &NamesOfIndex,
) -> Result<Derived, Error> {
    let name = ModelName::parse(name).map_err(crate::store::StoreError::from)?;
    let _lock = store.lock_for_writing()?;
    let base = store.open(base)?;
    let model_error = |reason: String| Error::Model {
        model: base.name.short(),
        reason,
    };
    let index = (store.config_file(&base, "model_index.json")?)
        .ok_or_else(|| model_error("has no `model_index.json`".into()))?;
    let targets = Targets::new(
        original_names(&index).map_err(model_error)?,
        &crate::loader::tensor_sizes(&base, "text_encoder"),
        &crate::loader::tensor_sizes(&base, "transformer"),
    );
    let mut checked = Vec::new();
    for spec in specs {
        let input = Input::read(spec, lenient)?;
        let (bound, _) = targets.resolve(&input)?;
        if bound.is_empty() {
            return Err(Error::File {
                path: spec.path.clone(),
                reason: format!(
                    "no pair names a layer of `{}`; is the LoRA for another model?",
                    base.name.short()
                ),
            });
        }
        let pairs = bound.len();
        checked.push((spec, input, pairs));
    }
    let first = base
        .manifest
        .layers
        .iter()
        .filter(|l| l.is_lora_record())
        .count();
    let mut layers = base.manifest.layers.clone();
    let mut out = Derived {
        shared_layers: layers.len(),
        loras: checked.len(),
        ..Default::default()
    };
    for (n, (spec, input, pairs)) in checked.into_iter().enumerate() {
        let prefix = format!("lora/{}/", first + n);
        let file = &input.file;
        for t in &file.header.tensors {
            let mut bytes = blob::tensor_blob_header(t.dtype, &t.shape, 8)?;
            bytes.extend_from_slice(file.data(t));
            let mut layer = out.put(
                store,
                &bytes,
                LORA_TENSOR_MEDIA_TYPE,
                format!("{prefix}{}", t.name),
            )?;
            layer.dtype = Some(t.dtype.name().into());
            layer.shape = Some(t.shape.clone());
            out.lora_tensors += 1;
            layers.push(layer);
        }
        let record = Record {
            file: spec.path.to_string_lossy().into_owned(),
            scale: spec.scale,
            lenient,
            layout: file.layout,
            hash: input.hash.clone(),
            pairs,
            metadata: file.header.metadata.clone(),
        };
        let json = serde_json::to_vec(&record).expect("records serialize");
        layers.push(out.put(
            store,
            &json,
            LORA_JSON_MEDIA_TYPE,
            format!("{prefix}{RECORD_NAME}"),
        )?);
    }
    let manifest = Manifest::new(base.manifest.config.clone(), layers);
    store.check_blobs_present(&manifest)?;
    store.write_manifest(&name, &manifest)?;
    Ok(out)
}

/// `style.safetensors ×0.8`, as listings show a LoRA.
pub fn describe(record: &Record) -> String {
    let stem = Path::new(&record.file)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| record.file.clone());
    format!("{stem} ×{}", record.scale)
}
