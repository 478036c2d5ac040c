//! weight-inspect v0.1.0's structural identity: a hash over a model's header (format, file
//! metadata, tensor names, dtypes, shapes and byte lengths, never the weights), and the diff of
//! two such headers. Both are byte-compatible with that tool, so a hash or a `--json` diff made
//! here can be checked against one made there.
//!
//! - [`read`]: a safetensors header read the way weight-inspect reads it;
//! - [`canonical`]: metadata values and the canonical JSON the hash covers;
//! - [`diff`](mod@diff): the difference of two artifacts, as plain data;
//! - [`render`]: the text, Markdown and JSON renderings of `id` and `diff`.

pub mod canonical;
pub mod diff;
pub mod read;
pub mod render;

pub use canonical::CanonicalValue;
pub use diff::{diff, MetadataChange, StructuralDiff, TensorChange};
pub use read::{read_safetensors_listing, MAX_HEADER_LEN};
pub use render::{
    render_diff_json, render_diff_markdown, render_diff_text, render_id_json, render_id_text,
};

use super::Listing;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{}`: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("`{}`: file is {len} bytes, too small for the 8-byte header length", path.display())]
    TooSmall { path: PathBuf, len: u64 },
    #[error("`{}`: header length {header_len} exceeds the {MAX_HEADER_LEN}-byte limit", path.display())]
    HeaderTooLarge { path: PathBuf, header_len: u64 },
    #[error("`{}`: header length {header_len} runs past the end of the {file_len}-byte file", path.display())]
    HeaderPastEnd {
        path: PathBuf,
        header_len: u64,
        file_len: u64,
    },
    #[error("`{}`: header is not valid UTF-8: {cause}", path.display())]
    NotUtf8 {
        path: PathBuf,
        cause: std::str::Utf8Error,
    },
    #[error("`{}`: header is not JSON: {cause}", path.display())]
    NotJson {
        path: PathBuf,
        cause: serde_json::Error,
    },
    #[error("`{}`: tensor `{tensor}`: field `{field}` {reason}", path.display())]
    BadTensor {
        path: PathBuf,
        tensor: String,
        field: String,
        reason: String,
    },
    #[error(transparent)]
    File(#[from] crate::files::FileError),
}

/// weight-inspect's `Artifact`: what the structural hash covers.
#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    pub listing: Listing,
}

/// The JSON shape weight-inspect serialises; its maps are sorted, which is what makes the
/// hash independent of the order of a file's header.
#[derive(serde::Serialize)]
struct CanonicalArtifact<'a> {
    format: &'a str,
    metadata: BTreeMap<&'a str, String>,
    tensors: BTreeMap<&'a str, CanonicalTensor<'a>>,
}

#[derive(serde::Serialize)]
struct CanonicalTensor<'a> {
    name: &'a str,
    dtype: &'a str,
    shape: &'a [u64],
    byte_length: u64,
}

impl Artifact {
    pub fn from_listing(listing: &Listing) -> Artifact {
        Artifact {
            listing: listing.clone(),
        }
    }

    /// The compact JSON the hash is taken over.
    pub fn canonical_json(&self) -> String {
        let l = &self.listing;
        let metadata = l
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), CanonicalValue::from_json(v).canonical()))
            .collect();
        // A name listed twice keeps its last entry, as a JSON object read into a map would.
        let tensors = l
            .tensors
            .iter()
            .map(|t| {
                let c = CanonicalTensor {
                    name: &t.name,
                    dtype: &t.dtype,
                    shape: &t.shape,
                    byte_length: t.byte_length,
                };
                (t.name.as_str(), c)
            })
            .collect();
        let c = CanonicalArtifact {
            format: &l.format,
            metadata,
            tensors,
        };
        serde_json::to_string(&c).expect("maps of strings and integers always serialise")
    }

    /// `sha256(canonical_json)`, 64 lowercase hex.
    pub fn hash(&self) -> String {
        let digest = Sha256::digest(self.canonical_json().as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// `wi:<format>:<version>:<first 8 hex of the hash>`.
    pub fn id(&self) -> String {
        let hash = self.hash();
        format!(
            "wi:{}:{}:{}",
            self.listing.format,
            self.version(),
            &hash[..8]
        )
    }

    /// The GGUF version in weight-inspect's id; no format read here has one, so always 0.
    pub fn version(&self) -> u64 {
        0
    }

    /// Distinct tensor names, as weight-inspect counts them.
    pub fn tensor_count(&self) -> usize {
        let names: BTreeSet<&str> = self
            .listing
            .tensors
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        names.len()
    }

    pub fn metadata_count(&self) -> usize {
        self.listing.metadata.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::TensorEntry;
    use serde_json::json;

    fn tensor(name: &str, dtype: &str, shape: &[u64], byte_length: u64) -> TensorEntry {
        TensorEntry {
            name: name.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
            byte_length,
        }
    }

    fn golden() -> Listing {
        let mut metadata = BTreeMap::new();
        metadata.insert("note".to_string(), json!("x"));
        metadata.insert("format".to_string(), json!("pt"));
        Listing {
            format: "safetensors".into(),
            tensors: vec![
                tensor("b.bias", "f16", &[3], 6),
                tensor("a.weight", "f32", &[2, 3], 24),
            ],
            metadata,
        }
    }

    #[test]
    fn golden_canonical_json_and_hash() {
        let a = Artifact::from_listing(&golden());
        assert_eq!(
            a.canonical_json(),
            r#"{"format":"safetensors","metadata":{"format":"\"pt\"","note":"\"x\""},"tensors":{"a.weight":{"name":"a.weight","dtype":"f32","shape":[2,3],"byte_length":24},"b.bias":{"name":"b.bias","dtype":"f16","shape":[3],"byte_length":6}}}"#
        );
        assert_eq!(
            a.hash(),
            "7d22ce7f2e131b433e24684d4ff9592bf08a0e5e27ff92381d67f309e3f13378"
        );
        assert_eq!(a.id(), "wi:safetensors:0:7d22ce7f");
        assert_eq!((a.tensor_count(), a.metadata_count()), (2, 2));
    }

    #[test]
    fn empty_listing() {
        let a = Artifact::from_listing(&Listing {
            format: "ztensor".into(),
            tensors: vec![],
            metadata: BTreeMap::new(),
        });
        assert_eq!(
            a.canonical_json(),
            r#"{"format":"ztensor","metadata":{},"tensors":{}}"#
        );
        assert!(a.id().starts_with("wi:ztensor:0:"));
        assert_eq!(a.id().len(), "wi:ztensor:0:".len() + 8);
    }

    #[test]
    fn tensor_order_does_not_matter() {
        let mut l = golden();
        let h = Artifact::from_listing(&l).hash();
        l.tensors.reverse();
        assert_eq!(Artifact::from_listing(&l).hash(), h);
    }

    #[test]
    fn zero_size_and_scalar_tensors() {
        let l = Listing {
            format: "safetensors".into(),
            tensors: vec![
                tensor("empty", "f32", &[0, 4], 0),
                tensor("scalar", "bf16", &[], 2),
            ],
            metadata: BTreeMap::new(),
        };
        assert_eq!(
            Artifact::from_listing(&l).canonical_json(),
            r#"{"format":"safetensors","metadata":{},"tensors":{"empty":{"name":"empty","dtype":"f32","shape":[0,4],"byte_length":0},"scalar":{"name":"scalar","dtype":"bf16","shape":[],"byte_length":2}}}"#
        );
    }
}
