//! One component's config from the places that can say it, each value with its origin: the
//! file's own metadata, then the `--from` directory's config, then the shapes, then the
//! defaults the binary carries. A value given by the file or `--from` that a shape contradicts is
//! refused, naming the tensor; the result is checked as `generate` checks it, so that a model
//! `create` stores is one `generate` runs.

use super::{Component, Joined, LayoutError, Mapped};
use crate::families::Family;
use crate::store::SourceTensor;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The config layer that records, per component config of a composed model, where each value
/// came from (`{"vae/config.json": {"norm_num_groups": "--from", …}}`).
pub const SOURCES_FILE: &str = "config_sources.json";

/// Where a config value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// The component file's own metadata.
    File,
    /// The `--from` directory's config.
    From,
    /// Read off the tensors' shapes.
    Inferred,
    /// The value the binary carries, which nothing else gave.
    Default,
}

impl Origin {
    pub fn describe(self) -> &'static str {
        match self {
            Origin::File => "file",
            Origin::From => "--from",
            Origin::Inferred => "inferred",
            Origin::Default => "default",
        }
    }
}

/// A component's config and where each of its values came from.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub config: Value,
    pub origins: BTreeMap<String, Origin>,
}

/// Whether two config values say the same (numbers compared as numbers: `1e-5` is `0.00001`,
/// `4` is `4.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        _ => a == b,
    }
}

/// `mapped`'s config: its file's metadata over `from` (the `--from` directory's config of the
/// component, `from_what` naming it) over the shapes over Turbo's values.
pub fn resolve(
    mapped: &Mapped,
    what: &str,
    from: Option<(&Value, &str)>,
) -> Result<Resolved, LayoutError> {
    let Value::Object(inferred) = &mapped.config else {
        unreachable!("inferred configs are objects")
    };
    let shape_tensor = |key: &str| {
        mapped
            .shape_keys
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, t)| t.as_str())
    };
    let mut config: Map<String, Value> = inferred.clone();
    let mut origins: BTreeMap<String, Origin> = inferred
        .keys()
        .map(|k| {
            let origin = match shape_tensor(k) {
                Some(_) => Origin::Inferred,
                None => Origin::Default,
            };
            (k.clone(), origin)
        })
        .collect();
    let given = [
        from.map(|(v, name)| (v, name.to_string(), Origin::From)),
        mapped
            .hint
            .as_ref()
            .map(|v| (v, format!("{what}'s metadata"), Origin::File)),
    ];
    // A config the model itself gives is whole: Turbo's values for keys it leaves out (a key
    // it spells differently, say) are not mixed into it.
    if given.iter().flatten().any(|(v, _, _)| v.is_object()) {
        origins.retain(|k, o| {
            let keep =
                *o != Origin::Default || given.iter().flatten().any(|(v, _, _)| v.get(k).is_some());
            if !keep {
                config.remove(k);
            }
            keep
        });
    }
    for (value, source, origin) in given.into_iter().flatten() {
        let Value::Object(given) = value else {
            continue;
        };
        for (key, v) in given {
            if let (Some(tensor), Some(shaped)) = (shape_tensor(key), inferred.get(key)) {
                if !same(v, shaped) {
                    return Err(LayoutError::Tensor {
                        what: what.to_string(),
                        tensor: tensor.to_string(),
                        reason: format!(
                            "gives `{key}` {shaped}, but {source} says {v}; the file is not the model that config describes"
                        ),
                    });
                }
            }
            config.insert(key.clone(), v.clone());
            origins.insert(key.clone(), origin);
        }
    }
    // A key no shape tells and no default fits must come from a config the model gives.
    if let Some(u) = (mapped.untold.iter()).find(|u| config.get(u.key).is_none_or(Value::is_null)) {
        return Err(LayoutError::Tensor {
            what: what.to_string(),
            tensor: u.tensor.clone(),
            reason: format!(
                "{}; give --from the model's directory, whose {}/config.json says `{}`",
                u.reason,
                mapped.component.dir(),
                u.key
            ),
        });
    }
    let resolved = Resolved {
        config: Value::Object(config),
        origins,
    };
    check_against_shapes(mapped, what, &resolved)?;
    Ok(resolved)
}

/// The checks that tie values no shape gives to the shapes: the RoPE axes fill a head, and
/// the VAE's groups divide its channels.
fn check_against_shapes(mapped: &Mapped, what: &str, r: &Resolved) -> Result<(), LayoutError> {
    let get = |k: &str| r.config.get(k);
    let origin = |k: &str| r.origins.get(k).map_or("default", |o| o.describe());
    let bad = |tensor: String, reason: String| LayoutError::Tensor {
        what: what.to_string(),
        tensor,
        reason,
    };
    let head = |name: &str| {
        mapped
            .tensors
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.shape.first().copied())
    };
    match mapped.component {
        Component::Transformer => {
            let norm = "layers.0.attention.norm_q.weight";
            let axes: Option<u64> = get("axes_dims")
                .and_then(|a| a.as_array())
                .map(|a| a.iter().filter_map(|v| v.as_u64()).sum());
            if let (Some(head), Some(axes)) = (head(norm), axes) {
                if head != axes {
                    return Err(bad(
                        norm.into(),
                        format!(
                            "gives a head size of {head}, but `axes_dims` ({}) {} add up to {axes}; give --from the model's directory, whose transformer/config.json says its RoPE axes",
                            origin("axes_dims"),
                            get("axes_dims").map(|v| v.to_string()).unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        Component::Vae => {
            let groups = get("norm_num_groups").and_then(|v| v.as_u64()).unwrap_or(0);
            for t in &mapped.tensors {
                let Some(c) = t
                    .name
                    .strip_prefix("encoder.down_blocks.")
                    .filter(|n| n.ends_with(".resnets.0.norm1.weight"))
                    .and(t.shape.first())
                else {
                    continue;
                };
                if groups == 0 || c % groups != 0 {
                    return Err(bad(
                        t.name.clone(),
                        format!(
                            "has {c} channels, which `norm_num_groups` {groups} ({}) does not divide into groups; give --from the model's directory, whose vae/config.json says its group count",
                            origin("norm_num_groups")
                        ),
                    ));
                }
            }
        }
        Component::TextEncoder | Component::TextEncoder2 => {}
    }
    Ok(())
}

/// Checks a model's three configs as `generate` does before it loads anything: each on its
/// own, and the widths that join them, as the model's family reads them. `configs` holds
/// `(path, bytes)` in diffusers layout.
pub fn check_model_configs(configs: &[(String, Vec<u8>)]) -> Result<(), String> {
    let index = configs
        .iter()
        .find(|(p, _)| p == "model_index.json")
        .ok_or("the model would have no `model_index.json`")?;
    Family::from_model_index(&index.1)?.check_configs(configs)
}

/// Maps a component's tensors (any names, from any file) onto diffusers names and infers its
/// config. `what` names the source in errors (a file path); `hint` is a config carried in
/// the file's metadata, kept for [`resolve`].
pub fn to_diffusers(
    component: Component,
    tensors: Vec<SourceTensor>,
    what: &str,
    hint: Option<&serde_json::Value>,
) -> Result<Mapped, LayoutError> {
    let mut mapped = match component {
        Component::Transformer => {
            Family::of_checkpoint(&tensors).transformer_to_diffusers(tensors, what)?
        }
        Component::TextEncoder => super::text_encoder::to_diffusers(tensors, what)?,
        Component::TextEncoder2 => super::text_encoder::second_to_diffusers(tensors, what)?,
        Component::Vae => super::vae::to_diffusers(tensors, what)?,
    };
    crate::mapping::check_unique(&mapped.tensors, what)?;
    for t in &mut mapped.tensors {
        t.component = component.dir().to_string();
    }
    mapped.hint = hint.cloned();
    Ok(mapped)
}

/// The original layout of a stored transformer's (diffusers-named) tensors, its family's.
pub fn transformer_to_original(tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
    Family::of_stored(tensors).transformer_to_original(tensors)
}

/// One value of a stored model's component config and where it came from.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SourcedValue {
    pub key: String,
    pub value: Value,
    pub origin: Origin,
}

/// Each component config of a stored model, value by value, with where each came from: as
/// `create` recorded it for a model composed from component files, else the model's own
/// config file.
pub fn stored_origins(
    store: &crate::store::Store,
    model: &crate::store::StoredModel,
) -> Result<Vec<(String, Vec<SourcedValue>)>, crate::store::StoreError> {
    let recorded: BTreeMap<String, BTreeMap<String, Origin>> = store
        .config_file(model, SOURCES_FILE)?
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let mut out = Vec::new();
    for component in Component::ALL {
        let path = format!("{}/config.json", component.dir());
        let Some(bytes) = store.config_file(model, &path)? else {
            continue;
        };
        let Ok(Value::Object(config)) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        let origins = recorded.get(&path);
        let values = config
            .into_iter()
            .map(|(key, value)| SourcedValue {
                origin: origins
                    .and_then(|o| o.get(&key))
                    .copied()
                    .unwrap_or(Origin::File),
                key,
                value,
            })
            .collect();
        out.push((path, values));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_compare_as_numbers() {
        assert!(same(&json!(1e-5), &json!(0.00001)));
        assert!(same(&json!(4), &json!(4.0)));
        assert!(same(&json!([8, 12, 12]), &json!([8.0, 12, 12])));
        assert!(!same(&json!([8, 12]), &json!([8, 12, 12])));
        assert!(!same(&json!(true), &json!(1)));
    }
}
