//! The structural difference of two artifacts, shaped like weight-inspect's `diff --json`.
//! Tensors are matched by name and compared by dtype, shape and byte length, so files of
//! different formats compare as long as they spell dtypes the same way.

use super::{Artifact, CanonicalValue};
use crate::formats::TensorEntry;
use std::collections::BTreeMap;

/// weight-inspect's diff result; field order is its JSON's order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StructuralDiff {
    /// Always 1.
    pub schema: u32,
    pub format_equal: bool,
    pub hash_equal: bool,
    pub tensor_count_equal: bool,
    pub metadata_count_equal: bool,
    /// Keys only in B, sorted.
    pub metadata_added: Vec<String>,
    /// Keys only in A, sorted.
    pub metadata_removed: Vec<String>,
    pub metadata_changed: Vec<MetadataChange>,
    /// Tensors only in B, sorted.
    pub tensors_added: Vec<String>,
    /// Tensors only in A, sorted.
    pub tensors_removed: Vec<String>,
    pub tensor_changes: Vec<TensorChange>,
}

/// A key in both artifacts whose value differs; values are canonical strings (`"x"` quoted).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MetadataChange {
    pub key: String,
    pub old_value: String,
    pub new_value: String,
}

/// A tensor in both artifacts that differs; each pair is `None` where that property is equal.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TensorChange {
    pub name: String,
    pub dtype_old: Option<String>,
    pub dtype_new: Option<String>,
    pub shape_old: Option<Vec<u64>>,
    pub shape_new: Option<Vec<u64>>,
    pub byte_length_old: Option<u64>,
    pub byte_length_new: Option<u64>,
}

impl StructuralDiff {
    /// Whether anything but the format or the hash differs: weight-inspect's DIFFERENT verdict.
    /// Two files of different formats with equal contents are IDENTICAL with a changed hash.
    pub fn has_changes(&self) -> bool {
        !(self.metadata_added.is_empty()
            && self.metadata_removed.is_empty()
            && self.metadata_changed.is_empty()
            && self.tensors_added.is_empty()
            && self.tensors_removed.is_empty()
            && self.tensor_changes.is_empty())
    }
}

/// `a` is the old side, `b` the new one.
pub fn diff(a: &Artifact, b: &Artifact) -> StructuralDiff {
    let meta = |x: &Artifact| -> BTreeMap<String, CanonicalValue> {
        x.listing
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), CanonicalValue::from_json(v)))
            .collect()
    };
    let (meta_a, meta_b) = (meta(a), meta(b));
    // Later entries win for a repeated name, as in the canonical JSON.
    let (tensors_a, tensors_b) = (tensors_by_name(a), tensors_by_name(b));

    let metadata_changed = meta_a
        .iter()
        .filter_map(|(k, old)| {
            let new = meta_b.get(k)?;
            (old != new).then(|| MetadataChange {
                key: k.clone(),
                old_value: old.canonical(),
                new_value: new.canonical(),
            })
        })
        .collect();
    let tensor_changes = tensors_a
        .iter()
        .filter_map(|(name, old)| {
            let new = tensors_b.get(name)?;
            let (dtype_old, dtype_new) =
                pair(old.dtype != new.dtype, old.dtype.clone(), new.dtype.clone());
            let (shape_old, shape_new) =
                pair(old.shape != new.shape, old.shape.clone(), new.shape.clone());
            let (byte_length_old, byte_length_new) = pair(
                old.byte_length != new.byte_length,
                old.byte_length,
                new.byte_length,
            );
            let changed = dtype_old.is_some() || shape_old.is_some() || byte_length_old.is_some();
            changed.then(|| TensorChange {
                name: name.to_string(),
                dtype_old,
                dtype_new,
                shape_old,
                shape_new,
                byte_length_old,
                byte_length_new,
            })
        })
        .collect();

    StructuralDiff {
        schema: 1,
        format_equal: a.listing.format == b.listing.format,
        hash_equal: a.hash() == b.hash(),
        tensor_count_equal: tensors_a.len() == tensors_b.len(),
        metadata_count_equal: meta_a.len() == meta_b.len(),
        metadata_added: meta_b
            .keys()
            .filter(|k| !meta_a.contains_key(*k))
            .cloned()
            .collect(),
        metadata_removed: meta_a
            .keys()
            .filter(|k| !meta_b.contains_key(*k))
            .cloned()
            .collect(),
        metadata_changed,
        tensors_added: tensors_b
            .keys()
            .filter(|k| !tensors_a.contains_key(*k))
            .map(|k| k.to_string())
            .collect(),
        tensors_removed: tensors_a
            .keys()
            .filter(|k| !tensors_b.contains_key(*k))
            .map(|k| k.to_string())
            .collect(),
        tensor_changes,
    }
}

fn tensors_by_name(a: &Artifact) -> BTreeMap<&str, &TensorEntry> {
    a.listing
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect()
}

fn pair<T>(differ: bool, old: T, new: T) -> (Option<T>, Option<T>) {
    if differ {
        (Some(old), Some(new))
    } else {
        (None, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::Listing;
    use serde_json::json;

    fn artifact(
        format: &str,
        tensors: &[(&str, &str, &[u64], u64)],
        meta: &[(&str, serde_json::Value)],
    ) -> Artifact {
        Artifact {
            listing: Listing {
                format: format.into(),
                tensors: tensors
                    .iter()
                    .map(|(n, d, s, b)| TensorEntry {
                        name: n.to_string(),
                        dtype: d.to_string(),
                        shape: s.to_vec(),
                        byte_length: *b,
                    })
                    .collect(),
                metadata: meta
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
            },
        }
    }

    #[test]
    fn identical() {
        let a = artifact(
            "safetensors",
            &[("w", "f32", &[2], 8)],
            &[("k", json!("v"))],
        );
        let d = diff(&a, &a);
        assert!(!d.has_changes());
        assert!(d.format_equal && d.hash_equal && d.tensor_count_equal && d.metadata_count_equal);
    }

    #[test]
    fn added_removed_changed() {
        let a = artifact(
            "safetensors",
            &[
                ("keep", "f32", &[2], 8),
                ("gone", "f16", &[1], 2),
                ("mod", "f32", &[2, 3], 24),
            ],
            &[
                ("same", json!(1)),
                ("old", json!(true)),
                ("chg", json!("x")),
            ],
        );
        let b = artifact(
            "safetensors",
            &[
                ("keep", "f32", &[2], 8),
                ("new", "u8", &[4], 4),
                ("mod", "f16", &[2, 3], 12),
            ],
            &[
                ("same", json!(1)),
                ("chg", json!("y")),
                ("add", json!(null)),
            ],
        );
        let d = diff(&a, &b);
        assert!(
            d.has_changes()
                && !d.hash_equal
                && d.format_equal
                && d.tensor_count_equal
                && d.metadata_count_equal
        );
        assert_eq!(
            (d.tensors_added.clone(), d.tensors_removed.clone()),
            (vec!["new".to_string()], vec!["gone".to_string()])
        );
        assert_eq!(
            (d.metadata_added.clone(), d.metadata_removed.clone()),
            (vec!["add".to_string()], vec!["old".to_string()])
        );
        assert_eq!(
            d.metadata_changed,
            vec![MetadataChange {
                key: "chg".into(),
                old_value: "\"x\"".into(),
                new_value: "\"y\"".into()
            }]
        );
        assert_eq!(
            d.tensor_changes,
            vec![TensorChange {
                name: "mod".into(),
                dtype_old: Some("f32".into()),
                dtype_new: Some("f16".into()),
                shape_old: None,
                shape_new: None,
                byte_length_old: Some(24),
                byte_length_new: Some(12),
            }]
        );
    }

    #[test]
    fn format_alone_changes_only_the_hash() {
        let a = artifact("safetensors", &[("w", "f32", &[2], 8)], &[]);
        let b = artifact("ztensor", &[("w", "f32", &[2], 8)], &[]);
        let d = diff(&a, &b);
        assert!(!d.has_changes() && !d.format_equal && !d.hash_equal);
    }

    #[test]
    fn int_and_float_with_equal_text_differ() {
        let bits = 1.0f64.to_bits();
        let a = artifact("safetensors", &[], &[("k", json!(bits as i64))]);
        let b = artifact("safetensors", &[], &[("k", json!(1.0))]);
        let d = diff(&a, &b);
        assert_eq!(d.metadata_changed.len(), 1);
        assert!(
            d.hash_equal,
            "the canonical strings, and so the hashes, are equal"
        );
    }
}
