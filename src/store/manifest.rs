//! Docker-v2 manifests as Ollama writes them for image models.
//!
//! `{"schemaVersion":2,"mediaType":…,"config":{layer},"layers":[{layer}…]}`: compact JSON, keys
//! in this order, with a trailing newline. Tensor layers have path-style names
//! (`text_encoder/model.layers.0.mlp.down_proj.weight`) and, as we write them, the tensor's
//! `dtype` and `shape`; readers accept layers without them, and unknown fields.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest manifest read or written. A real model's manifest is about 1 MB (a few thousand
/// layers); the bound keeps a hostile file from being read whole, and an import whose manifest
/// could not be read back is refused before it writes anything.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// The manifest's own `mediaType`.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The `config` layer's: Ollama's model config blob.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.docker.container.image.v1+json";
/// A tensor layer's: one tensor of the model, a safetensors blob.
pub const TENSOR_MEDIA_TYPE: &str = "application/vnd.ollama.image.tensor";
/// Config files (`model_index.json`, `*/config.json`, tokenizer files), as Ollama writes them.
pub const JSON_MEDIA_TYPE: &str = "application/vnd.ollama.image.json";
/// The same, as some writers name them; accepted on reading.
pub const CONFIG_FILE_MEDIA_TYPE_ALT: &str = "application/vnd.ollama.image.config";
/// One tensor of a LoRA a derived model carries (`lora/<n>/<key as in the file>`), a tensor
/// blob like any other; a type of its own, so that no reader takes it for a base weight.
pub const LORA_TENSOR_MEDIA_TYPE: &str = "application/vnd.zimage.lora.tensor";
/// The record of one LoRA a derived model carries (`lora/<n>/adapter.json`): its file, scale
/// and hash, and the file's metadata.
pub const LORA_JSON_MEDIA_TYPE: &str = "application/vnd.zimage.lora.json";

/// One blob of a model, as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layer {
    /// What the blob holds (a tensor, a config file, …): this module's `*_MEDIA_TYPE` constants name them.
    #[serde(rename = "mediaType")]
    pub media_type: String,
    /// `sha256:<hex>` of the blob's bytes: its file name in `blobs/`.
    pub digest: String,
    /// The blob's bytes.
    pub size: u64,
    /// Where the layer came from, when a writer recorded it (Ollama's field; unused here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Its path in diffusers layout: `component/tensor` for a tensor, the file's path for a
    /// config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A tensor's dtype (`BF16`), as we write tensor layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// A tensor's shape, as we write tensor layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
}

impl Layer {
    /// Whether it is one of the model's tensors.
    pub fn is_tensor(&self) -> bool {
        self.media_type == TENSOR_MEDIA_TYPE
    }
    /// Whether it is a tensor of a LoRA the model carries (not a base weight).
    pub fn is_lora_tensor(&self) -> bool {
        self.media_type == LORA_TENSOR_MEDIA_TYPE
    }
    /// Whether it is the record of a LoRA the model carries.
    pub fn is_lora_record(&self) -> bool {
        self.media_type == LORA_JSON_MEDIA_TYPE
    }
    /// Whether it is a config or tokenizer file (under either media type writers use).
    pub fn is_config_file(&self) -> bool {
        self.media_type == JSON_MEDIA_TYPE || self.media_type == CONFIG_FILE_MEDIA_TYPE_ALT
    }
    /// `("text_encoder", "model.layers.0.mlp.down_proj.weight")` for a path-style name.
    pub fn component_and_tensor(&self) -> Option<(&str, &str)> {
        self.name.as_deref()?.split_once('/')
    }
}

/// A model's manifest: its config blob and every other blob, each as a [`Layer`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always 2.
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    /// [`MANIFEST_MEDIA_TYPE`].
    #[serde(rename = "mediaType")]
    pub media_type: String,
    /// The model config blob (Ollama's `ConfigV2`).
    pub config: Layer,
    /// Tensors and config files, in the order written.
    pub layers: Vec<Layer>,
}

impl Manifest {
    /// A schema-2 manifest of these layers.
    pub fn new(config: Layer, layers: Vec<Layer>) -> Manifest {
        Manifest {
            schema_version: 2,
            media_type: MANIFEST_MEDIA_TYPE.into(),
            config,
            layers,
        }
    }

    /// Parses and validates manifest bytes: schema version 2, and well-formed digests.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, String> {
        let manifest: Manifest = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if manifest.schema_version != 2 {
            return Err(format!(
                "`schemaVersion` is {}, expected 2",
                manifest.schema_version
            ));
        }
        for digest in manifest.digests() {
            super::blob::digest_hex(digest).map_err(|e| e.to_string())?;
        }
        Ok(manifest)
    }

    /// Bytes of every blob referenced (saturating: a hostile manifest cannot wrap it).
    pub fn total_size(&self) -> u64 {
        std::iter::once(&self.config)
            .chain(&self.layers)
            .fold(0u64, |n, l| n.saturating_add(l.size))
    }

    /// The bytes written to disk: compact JSON and a newline, as Go's encoder writes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("manifests serialize");
        v.push(b'\n');
        v
    }

    /// The layers that are the model's tensors.
    pub fn tensor_layers(&self) -> impl Iterator<Item = &Layer> {
        self.layers.iter().filter(|l| l.is_tensor())
    }

    /// Tensor layers of one component (`name` starting with `component/`).
    pub fn component_layers<'a>(
        &'a self,
        component: &'a str,
    ) -> impl Iterator<Item = &'a Layer> + 'a {
        self.tensor_layers().filter(move |l| {
            l.component_and_tensor()
                .is_some_and(|(c, _)| c == component)
        })
    }

    /// Components with tensors, in first-appearance order.
    pub fn components(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (c, _) in self
            .tensor_layers()
            .filter_map(|l| l.component_and_tensor())
        {
            if !out.iter().any(|x| x == c) {
                out.push(c.to_string());
            }
        }
        out
    }

    /// The config file layer at `path` (`transformer/config.json`), if the model has one.
    pub fn config_file(&self, path: &str) -> Option<&Layer> {
        self.layers
            .iter()
            .find(|l| l.is_config_file() && l.name.as_deref() == Some(path))
    }

    /// Every digest the manifest references (config blob included).
    pub fn digests(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.config.digest.as_str())
            .chain(self.layers.iter().map(|l| l.digest.as_str()))
    }

    /// The model's identity: it changes when any tensor changes and not when metadata or
    /// config layers do. sha256 over the tensor layers sorted by name, each contributing
    /// `name`, a NUL byte, the digest string (`sha256:<hex>`) and a newline.
    pub fn model_identity(&self) -> String {
        identity_of(self.tensor_layers())
    }

    /// The same identity over one component's tensor layers: it changes when a tensor of that
    /// component changes.
    pub fn component_identity(&self, component: &str) -> String {
        identity_of(self.component_layers(component))
    }
}

fn identity_of<'a>(layers: impl Iterator<Item = &'a Layer>) -> String {
    let mut pairs: Vec<(&str, &str)> = layers
        .map(|l| (l.name.as_deref().unwrap_or(""), l.digest.as_str()))
        .collect();
    pairs.sort();
    let mut h = Sha256::new();
    for (name, digest) in pairs {
        h.update(name.as_bytes());
        h.update([0u8]);
        h.update(digest.as_bytes());
        h.update(b"\n");
    }
    format!("{:x}", h.finalize())
}

/// The manifest's `config` blob (Ollama's `ConfigV2`), in Go's field order.
pub fn config_blob(file_type: &str) -> Vec<u8> {
    format!(
        "{{\"model_format\":\"safetensors\",\"model_family\":\"\",\"model_families\":null,\"model_type\":\"\",\"file_type\":{},\"requires\":\"0.14.0\",\"capabilities\":[\"image\"],\"architecture\":\"\",\"os\":\"\",\"rootfs\":{{\"type\":\"\",\"diff_ids\":null}}}}",
        serde_json::to_string(file_type).expect("strings serialize")
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &str, digest: &str) -> Layer {
        Layer {
            media_type: TENSOR_MEDIA_TYPE.into(),
            digest: digest.into(),
            size: 1,
            from: None,
            name: Some(name.into()),
            dtype: None,
            shape: None,
        }
    }

    #[test]
    fn identity_ignores_config_layers_and_order() {
        let cfg = layer("config", "sha256:00");
        let mut a = Manifest::new(
            cfg.clone(),
            vec![layer("vae/b", "sha256:2"), layer("vae/a", "sha256:1")],
        );
        let b = Manifest::new(
            cfg.clone(),
            vec![layer("vae/a", "sha256:1"), layer("vae/b", "sha256:2")],
        );
        assert_eq!(a.model_identity(), b.model_identity());
        a.layers.push(Layer {
            media_type: JSON_MEDIA_TYPE.into(),
            ..layer("vae/config.json", "sha256:9")
        });
        assert_eq!(a.model_identity(), b.model_identity());
        a.layers[0].digest = "sha256:3".into();
        assert_ne!(a.model_identity(), b.model_identity());
    }

    #[test]
    fn reads_ollama_manifests_without_dtype_and_with_unknown_fields() {
        let text = r#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:ab","size":213},"layers":[{"mediaType":"application/vnd.ollama.image.tensor","digest":"sha256:cd","size":88,"name":"vae/x","status":"ignored"}]}"#;
        let m: Manifest = serde_json::from_str(text).unwrap();
        assert_eq!(m.components(), vec!["vae"]);
        assert!(m.layers[0].dtype.is_none());
    }
}
