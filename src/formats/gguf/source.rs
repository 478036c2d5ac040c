//! A GGUF file as an import source: `zimage create NAME --from model.gguf --component C`.
//! F32, F16 and BF16 tensors are plain bytes; quantized ones carry their ggml type, and the
//! import decides per type (see [`crate::ggml`]). A text encoder in llama.cpp's naming gets
//! the Hugging Face names our Qwen3 loads.

use super::*;
use crate::store::{Encoding, SourceTensor, StoreError, TensorSource};

pub struct GgufSource {
    tensors: Vec<SourceTensor>,
    configs: Vec<(String, Vec<u8>)>,
    /// The file's string-valued metadata.
    strings: std::collections::BTreeMap<String, String>,
}

/// Metadata arrays longer than this are summarised in `metadata.json` (a tokenizer's
/// vocabulary would otherwise be megabytes of JSON).
const MAX_JSON_ARRAY: usize = 64;

impl GgufSource {
    pub fn open(path: &Path, component: &str) -> Result<GgufSource> {
        let g = read_file(path)?;
        let rename = is_llama_naming(g.tensors.iter().map(|t| t.name.as_str()));
        let mut tensors = Vec::with_capacity(g.tensors.len());
        for t in &g.tensors {
            let name = if rename {
                hf_name_for_llama(&t.name).ok_or_else(|| {
                    Error::BadTensor {
                        name: t.name.clone(),
                        reason:
                            "is in llama.cpp's naming but names no part of a Qwen3 text encoder"
                                .into(),
                    }
                    .in_file(path)
                })?
            } else {
                t.name.clone()
            };
            let (dtype, encoding) = match t.ggml_type.plain_dtype() {
                Some(d) if d.is_float() && d != crate::dtype::Dtype::F64 => (d, Encoding::Plain),
                _ => (crate::dtype::Dtype::F32, Encoding::Ggml(t.ggml_type)),
            };
            if encoding != Encoding::Plain && t.ggml_type.import_path().is_none() {
                return Err(Error::UnsupportedType {
                    name: t.name.clone(),
                    ty: t.ggml_type,
                }
                .in_file(path));
            }
            tensors.push(SourceTensor {
                component: component.to_string(),
                name,
                dtype,
                shape: t.shape.clone(),
                file: path.to_path_buf(),
                offset: t.offset,
                nbytes: t.nbytes,
                encoding,
                roll: 0,
            });
        }
        let meta: serde_json::Map<String, serde_json::Value> = g
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.to_json(MAX_JSON_ARRAY)))
            .collect();
        let json = serde_json::json!({ "gguf": meta });
        let configs = vec![(
            format!("{component}/metadata.json"),
            serde_json::to_vec_pretty(&json).expect("JSON values serialize"),
        )];
        let strings = (g.metadata.iter())
            .filter_map(|(k, v)| match v {
                Value::String(text) => Some((k.clone(), text.clone())),
                _ => None,
            })
            .collect();
        Ok(GgufSource {
            tensors,
            configs,
            strings,
        })
    }

    /// The string metadata under `key`, if the file has one.
    pub fn metadata_string(&self, key: &str) -> Option<&str> {
        self.strings.get(key).map(String::as_str)
    }
}

impl TensorSource for GgufSource {
    fn tensors(&self) -> Vec<SourceTensor> {
        self.tensors.clone()
    }
    fn config_files(&self) -> std::result::Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self.configs.clone())
    }
}
