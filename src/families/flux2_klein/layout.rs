//! The FLUX.2 transformer: Black Forest Labs' original layout (`flux-2-klein-4b.safetensors`,
//! ComfyUI's `diffusion_models/` files, the GGUF files made from them, and LoRAs trained on
//! them) against diffusers' `Flux2Transformer2DModel`, whose names the store and the pipeline
//! use (klein-spec §10.4).
//!
//! One table says which original module each diffusers module comes from. Most are renamed
//! only (norm scales also change `scale` for `weight`). Two kinds hold several diffusers
//! modules in their rows: a double block's fused `img_attn.qkv` / `txt_attn.qkv` (q's rows, then
//! k's, then v's), and the final layer's `adaLN_modulation.1`, whose rows are (shift, scale)
//! where diffusers' `norm_out.linear` has (scale, shift). Importing cuts the rows (or reads
//! the modulation's bytes rolled by half); exporting joins them back.

use crate::mapping::{
    rows, strip_prefix, ByName, Inferred, Joined, Layout, LayoutError, Mapped, Rows,
};
use crate::store::SourceTensor;

const PREFIXES: [&str; 2] = ["model.diffusion_model.", "diffusion_model."];
const EXPECTED: &str = "diffusers names (`transformer_blocks.N.attn.to_q.weight`, `single_transformer_blocks.N.attn.to_qkv_mlp_proj.weight`, …) or the original FLUX.2 names (`double_blocks.N.img_attn.qkv.weight`, `single_blocks.N.linear1.weight`, …), optionally under `model.diffusion_model.`";

impl Rows {
    const Q: Rows = Rows { of: 3, parts: &[0] };
    const K: Rows = Rows { of: 3, parts: &[1] };
    const V: Rows = Rows { of: 3, parts: &[2] };
    /// The two halves swapped.
    const SWAPPED: Rows = Rows {
        of: 2,
        parts: &[1, 0],
    };
}

/// How a diffusers module's tensor is named in the original: a linear layer keeps `weight`,
/// an RMS norm's `weight` is the original's `scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Linear,
    Norm,
}

/// A module: diffusers' name, the original's, its kind and the original rows it holds.
type Module = (&'static str, &'static str, Kind, Rows);

/// A double block's modules: diffusers' names after `transformer_blocks.N.`, the original's
/// after `double_blocks.N.`.
const DOUBLE: [Module; 16] = [
    ("attn.to_q", "img_attn.qkv", Kind::Linear, Rows::Q),
    ("attn.to_k", "img_attn.qkv", Kind::Linear, Rows::K),
    ("attn.to_v", "img_attn.qkv", Kind::Linear, Rows::V),
    ("attn.add_q_proj", "txt_attn.qkv", Kind::Linear, Rows::Q),
    ("attn.add_k_proj", "txt_attn.qkv", Kind::Linear, Rows::K),
    ("attn.add_v_proj", "txt_attn.qkv", Kind::Linear, Rows::V),
    ("attn.to_out.0", "img_attn.proj", Kind::Linear, Rows::WHOLE),
    (
        "attn.to_add_out",
        "txt_attn.proj",
        Kind::Linear,
        Rows::WHOLE,
    ),
    ("ff.linear_in", "img_mlp.0", Kind::Linear, Rows::WHOLE),
    ("ff.linear_out", "img_mlp.2", Kind::Linear, Rows::WHOLE),
    (
        "ff_context.linear_in",
        "txt_mlp.0",
        Kind::Linear,
        Rows::WHOLE,
    ),
    (
        "ff_context.linear_out",
        "txt_mlp.2",
        Kind::Linear,
        Rows::WHOLE,
    ),
    (
        "attn.norm_q",
        "img_attn.norm.query_norm",
        Kind::Norm,
        Rows::WHOLE,
    ),
    (
        "attn.norm_k",
        "img_attn.norm.key_norm",
        Kind::Norm,
        Rows::WHOLE,
    ),
    (
        "attn.norm_added_q",
        "txt_attn.norm.query_norm",
        Kind::Norm,
        Rows::WHOLE,
    ),
    (
        "attn.norm_added_k",
        "txt_attn.norm.key_norm",
        Kind::Norm,
        Rows::WHOLE,
    ),
];

/// A single block's modules: after `single_transformer_blocks.N.` and `single_blocks.N.`.
const SINGLE: [Module; 4] = [
    ("attn.to_qkv_mlp_proj", "linear1", Kind::Linear, Rows::WHOLE),
    ("attn.to_out", "linear2", Kind::Linear, Rows::WHOLE),
    ("attn.norm_q", "norm.query_norm", Kind::Norm, Rows::WHOLE),
    ("attn.norm_k", "norm.key_norm", Kind::Norm, Rows::WHOLE),
];

/// The modules outside the blocks.
const TOP: [Module; 11] = [
    ("x_embedder", "img_in", Kind::Linear, Rows::WHOLE),
    ("proj_out", "final_layer.linear", Kind::Linear, Rows::WHOLE),
    ("context_embedder", "txt_in", Kind::Linear, Rows::WHOLE),
    (
        "time_guidance_embed.timestep_embedder.linear_1",
        "time_in.in_layer",
        Kind::Linear,
        Rows::WHOLE,
    ),
    (
        "time_guidance_embed.timestep_embedder.linear_2",
        "time_in.out_layer",
        Kind::Linear,
        Rows::WHOLE,
    ),
    (
        "time_guidance_embed.guidance_embedder.linear_1",
        "guidance_in.in_layer",
        Kind::Linear,
        Rows::WHOLE,
    ),
    (
        "time_guidance_embed.guidance_embedder.linear_2",
        "guidance_in.out_layer",
        Kind::Linear,
        Rows::WHOLE,
    ),
    (
        "double_stream_modulation_img.linear",
        "double_stream_modulation_img.lin",
        Kind::Linear,
        Rows::WHOLE,
    ),
    (
        "double_stream_modulation_txt.linear",
        "double_stream_modulation_txt.lin",
        Kind::Linear,
        Rows::WHOLE,
    ),
    (
        "single_stream_modulation.linear",
        "single_stream_modulation.lin",
        Kind::Linear,
        Rows::WHOLE,
    ),
    (
        "norm_out.linear",
        "final_layer.adaLN_modulation.1",
        Kind::Linear,
        Rows::SWAPPED,
    ),
];

/// The table's three scopes: diffusers' prefix and the original's, each followed by a block
/// index unless empty, and their modules.
const SCOPES: [(&str, &str, &[Module]); 3] = [
    ("single_transformer_blocks.", "single_blocks.", &SINGLE),
    ("transformer_blocks.", "double_blocks.", &DOUBLE),
    ("", "", &TOP),
];

/// `name` split after `prefix` and a block index (`None` when it has neither); the empty
/// prefix takes names outside the blocks.
fn in_scope<'a>(name: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    if prefix.is_empty() {
        return Some(("", name));
    }
    let (index, rest) = name.strip_prefix(prefix)?.split_once('.')?;
    index
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then_some((index, rest))
}

/// `prefix` and `index` joined to a module name (no index outside the blocks).
fn scoped(prefix: &str, index: &str, module: &str) -> String {
    match prefix.is_empty() {
        true => module.to_string(),
        false => format!("{prefix}{index}.{module}"),
    }
}

/// The original module a diffusers module comes from, its kind and which of its rows it holds.
fn original_module(module: &str) -> Option<(String, Kind, Rows)> {
    SCOPES.iter().find_map(|(ours, theirs, modules)| {
        let (index, rest) = in_scope(module, ours)?;
        let (_, original, kind, rows) = modules.iter().find(|(d, ..)| *d == rest)?;
        Some((scoped(theirs, index, original), *kind, *rows))
    })
}

/// The original layer a diffusers linear layer of the transformer comes from, and which of its
/// rows it holds; `None` for a name that is no linear layer of FLUX.2.
pub fn original_linear(module: &str) -> Option<(String, Rows)> {
    match original_module(module)? {
        (original, Kind::Linear, rows) => Some((original, rows)),
        _ => None,
    }
}

/// The tensor suffix of a module of `kind` in the original layout.
fn original_suffix(kind: Kind) -> &'static str {
    match kind {
        Kind::Linear => "weight",
        Kind::Norm => "scale",
    }
}

/// The diffusers tensors an original tensor holds, each with its rows; empty for a name that
/// is no tensor of FLUX.2.
fn diffusers_tensors(original: &str) -> Vec<(String, Rows)> {
    let Some((module, suffix)) = original.rsplit_once('.') else {
        return Vec::new();
    };
    SCOPES
        .iter()
        .filter_map(|(ours, theirs, modules)| Some((ours, in_scope(module, theirs)?, modules)))
        .flat_map(|(ours, (index, rest), modules)| {
            modules
                .iter()
                .filter(move |(_, o, kind, _)| *o == rest && original_suffix(*kind) == suffix)
                .map(move |(d, _, _, rows)| (format!("{}.weight", scoped(ours, index, d)), *rows))
        })
        .collect()
}

/// Whether the tensors are a FLUX.2 transformer's, in either layout.
pub fn is_flux2(tensors: &[SourceTensor]) -> bool {
    tensors.iter().any(|t| {
        let name = (PREFIXES.iter())
            .find_map(|p| t.name.strip_prefix(p))
            .unwrap_or(&t.name);
        name.starts_with("double_blocks.")
            || name.starts_with("single_transformer_blocks.")
            || name.starts_with("double_stream_modulation_img.")
    })
}

pub fn to_diffusers(mut tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    strip_prefix(&mut tensors, &PREFIXES);
    let layout = crate::mapping::layout_of(
        &tensors,
        (
            &["single_transformer_blocks.", "transformer_blocks."],
            &["double_blocks.", "single_blocks."],
        ),
        what,
        ("transformer", EXPECTED),
    )?;
    if layout == Layout::Original {
        tensors = from_original(&tensors, what)?;
    }
    let shapes_say = infer_config(&tensors, what)?;
    let transformer = crate::mapping::Component::Transformer;
    Ok(Mapped::new(
        transformer,
        layout,
        tensors,
        shapes_say,
        vec![],
    ))
}

/// Original tensors under diffusers names, each fused one cut into the tensors it holds.
fn from_original(tensors: &[SourceTensor], what: &str) -> Result<Vec<SourceTensor>, LayoutError> {
    let mut out = Vec::with_capacity(tensors.len() + 32);
    for t in tensors {
        let held = diffusers_tensors(&t.name);
        if held.is_empty() {
            return Err(LayoutError::Tensor {
                what: what.to_string(),
                tensor: t.name.clone(),
                reason: "is no tensor of a FLUX.2 transformer".into(),
            });
        }
        for (name, part) in held {
            out.push(cut(t, name, part, what)?);
        }
    }
    Ok(out)
}

/// The diffusers tensor `name` that holds `part` of the original tensor `t`: a range of its
/// rows, or its halves swapped (its bytes read rolled by half).
fn cut(
    t: &SourceTensor,
    name: String,
    part: Rows,
    what: &str,
) -> Result<SourceTensor, LayoutError> {
    let total = t.shape.first().copied().unwrap_or(0);
    let bad = |reason: String| LayoutError::Tensor {
        what: what.to_string(),
        tensor: t.name.clone(),
        reason,
    };
    let ranges = (part.ranges(total)).filter(|_| total > 0).ok_or_else(|| {
        bad(format!(
            "has {total} rows, which are not {} equal parts",
            part.of
        ))
    })?;
    match ranges.as_slice() {
        [(0, end)] if *end == total => Ok(crate::mapping::renamed(t, name, None)),
        [(start, end)] => rows(t, *start, *end, &name).map_err(bad),
        _ if part == Rows::SWAPPED && t.nbytes.is_multiple_of(2) => {
            let mut out = crate::mapping::renamed(t, name, None);
            out.roll = t.nbytes / 2;
            Ok(out)
        }
        _ => Err(bad(format!("cannot be read as `{name}`"))),
    }
}

/// `transformer/config.json` from the shapes (diffusers names), klein 4B's values for the rest.
pub fn infer_config(tensors: &[SourceTensor], what: &str) -> Result<Inferred, LayoutError> {
    let t = ByName::new(what, "transformer", tensors);
    let x = "x_embedder.weight";
    let inner = t.dim(x, 2, 0)?;
    let in_channels = t.dim(x, 2, 1)?;
    let q_norm = "single_transformer_blocks.0.attn.norm_q.weight";
    let head_dim = t.dim(q_norm, 1, 0)?;
    if head_dim == 0 || inner % head_dim != 0 || head_dim % 8 != 0 {
        return Err(t.bad(
            q_norm,
            format!("gives a head size of {head_dim}, which does not divide the width {inner} into four RoPE axes"),
        ));
    }
    // A single block's fused projection holds q, k, v and the feed-forward's gate and value.
    let fused = "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight";
    let mlp = t
        .dim(fused, 2, 0)?
        .checked_sub(3 * inner)
        .filter(|r| *r > 0 && r % 2 == 0)
        .ok_or_else(|| {
            t.bad(
                fused,
                format!("is not q, k, v ({inner} rows each) and a gated feed-forward"),
            )
        })?
        / 2;
    let time = "time_guidance_embed.timestep_embedder.linear_1.weight";
    let quarter = head_dim / 4;
    let config = serde_json::json!({
        "_class_name": "Flux2Transformer2DModel",
        "_diffusers_version": "0.42.1",
        "attention_head_dim": head_dim,
        "axes_dims_rope": [quarter, quarter, quarter, quarter],
        "eps": 1e-6,
        "guidance_embeds": t.map.contains_key("time_guidance_embed.guidance_embedder.linear_1.weight"),
        "in_channels": in_channels,
        "joint_attention_dim": t.dim("context_embedder.weight", 2, 1)?,
        "mlp_ratio": mlp as f64 / inner as f64,
        "num_attention_heads": inner / head_dim,
        "num_layers": t.count("transformer_blocks."),
        "num_single_layers": t.count("single_transformer_blocks."),
        "out_channels": null,
        "patch_size": 1,
        "rope_theta": 2000,
        "timestep_guidance_channels": t.dim(time, 2, 1)?,
    });
    let shape_keys = [
        ("attention_head_dim", q_norm),
        ("in_channels", x),
        ("joint_attention_dim", "context_embedder.weight"),
        ("mlp_ratio", fused),
        ("num_attention_heads", x),
        ("num_layers", "transformer_blocks.N"),
        ("num_single_layers", "single_transformer_blocks.N"),
        ("timestep_guidance_channels", time),
    ];
    Ok(Inferred {
        config,
        shape_keys: shape_keys.map(|(k, t)| (k, t.to_string())).to_vec(),
    })
}

/// The original layout of stored (diffusers-named) tensors: renamed, each fused projection
/// joined from its parts in row order, the final modulation's halves swapped back.
pub fn to_original(tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
    let mut joined: Vec<(Joined, Vec<u64>)> = Vec::new();
    for (name, shape) in tensors {
        let original = name
            .strip_suffix(".weight")
            .and_then(original_module)
            .map(|(o, kind, rows)| (format!("{o}.{}", original_suffix(kind)), rows));
        let Some((original, rows)) = original else {
            joined.push((
                Joined {
                    name: name.clone(),
                    shape: shape.clone(),
                    parts: vec![name.clone()],
                    roll_rows: 0,
                },
                vec![0],
            ));
            continue;
        };
        let at = match joined.iter().position(|(j, _)| j.name == original) {
            Some(at) => at,
            None => {
                let empty = Joined {
                    name: original,
                    shape: shape.clone(),
                    parts: Vec::new(),
                    roll_rows: 0,
                };
                joined.push((empty, Vec::new()));
                joined.len() - 1
            }
        };
        let (j, order) = &mut joined[at];
        // Each part goes where its rows lie in the original.
        let slot = order.partition_point(|&p| p < rows.parts[0]);
        order.insert(slot, rows.parts[0]);
        j.parts.insert(slot, name.clone());
        if j.parts.len() > 1 {
            j.shape[0] += shape[0];
        }
        if rows == Rows::SWAPPED {
            j.roll_rows = shape[0] / 2;
        }
    }
    joined.into_iter().map(|(j, _)| j).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::{Component, ModuleKey, Modules};
    use crate::memory_plan::TensorSize;

    /// The spec's table (klein-spec §10.4), both ways.
    #[test]
    fn names_map_both_ways() {
        for (original, diffusers) in [
            ("img_in.weight", "x_embedder.weight"),
            (
                "time_in.out_layer.weight",
                "time_guidance_embed.timestep_embedder.linear_2.weight",
            ),
            (
                "single_stream_modulation.lin.weight",
                "single_stream_modulation.linear.weight",
            ),
            ("final_layer.linear.weight", "proj_out.weight"),
            (
                "double_blocks.3.txt_attn.norm.key_norm.scale",
                "transformer_blocks.3.attn.norm_added_k.weight",
            ),
            (
                "double_blocks.0.img_attn.proj.weight",
                "transformer_blocks.0.attn.to_out.0.weight",
            ),
            (
                "double_blocks.7.txt_mlp.2.weight",
                "transformer_blocks.7.ff_context.linear_out.weight",
            ),
            (
                "single_blocks.19.linear1.weight",
                "single_transformer_blocks.19.attn.to_qkv_mlp_proj.weight",
            ),
            (
                "single_blocks.2.norm.query_norm.scale",
                "single_transformer_blocks.2.attn.norm_q.weight",
            ),
        ] {
            assert_eq!(
                diffusers_tensors(original),
                vec![(diffusers.to_string(), Rows::WHOLE)],
                "{original}"
            );
            let back = to_original(&[(diffusers.to_string(), vec![4, 4])]);
            assert_eq!(back[0].name, original, "{diffusers}");
        }
        assert!(diffusers_tensors("double_blocks.x.img_mlp.0.weight").is_empty());
        assert!(diffusers_tensors("single_blocks.0.modulation.lin.weight").is_empty());
        assert!(diffusers_tensors("double_blocks.0.img_mlp.0.scale").is_empty());
        let qkv = diffusers_tensors("double_blocks.4.txt_attn.qkv.weight");
        assert_eq!(
            qkv[2],
            (
                "transformer_blocks.4.attn.add_v_proj.weight".into(),
                Rows::V
            )
        );
    }

    /// A fused projection is joined from its parts in row order whatever order they come in,
    /// and the final modulation is rolled back by half.
    #[test]
    fn exports_join_fused_layers_in_row_order() {
        let shape = vec![8, 8];
        let stored: Vec<(String, Vec<u64>)> = ["to_v", "to_q", "to_k"]
            .iter()
            .map(|p| {
                (
                    format!("transformer_blocks.0.attn.{p}.weight"),
                    shape.clone(),
                )
            })
            .chain([("norm_out.linear.weight".to_string(), vec![6, 3])])
            .collect();
        let joined = to_original(&stored);
        assert_eq!(joined.len(), 2);
        assert_eq!(joined[0].name, "double_blocks.0.img_attn.qkv.weight");
        assert_eq!(joined[0].shape, vec![24, 8]);
        assert!(
            joined[0].parts[0].ends_with("to_q.weight"),
            "{:?}",
            joined[0].parts
        );
        assert!(joined[0].parts[2].ends_with("to_v.weight"));
        assert_eq!(joined[1].name, "final_layer.adaLN_modulation.1.weight");
        assert_eq!(joined[1].roll_rows, 3);
    }

    #[test]
    fn fused_layers_give_each_diffusers_layer_its_rows() {
        let (name, rows) = original_linear("transformer_blocks.1.attn.add_k_proj").unwrap();
        assert_eq!(name, "double_blocks.1.txt_attn.qkv");
        assert_eq!(rows.ranges(384), Some(vec![(128, 256)]));
        let (name, rows) = original_linear("norm_out.linear").unwrap();
        assert_eq!(name, "final_layer.adaLN_modulation.1");
        assert_eq!(rows.ranges(256), Some(vec![(128, 256), (0, 128)]));
        assert_eq!(
            original_linear("single_transformer_blocks.12.attn.to_out").unwrap(),
            ("single_blocks.12.linear2".into(), Rows::WHOLE)
        );
        assert_eq!(original_linear("proj_out").unwrap().0, "final_layer.linear");
        assert_eq!(Rows::Q.ranges(100), None);
        assert_eq!(original_linear("transformer_blocks.x.attn.to_q"), None);
        assert_eq!(original_linear("transformer_blocks.0.attn.norm_q"), None);
    }

    #[test]
    fn layers_answer_to_their_original_names_in_every_spelling() {
        let size = |name: &str, shape: [u64; 2]| TensorSize {
            name: format!("{name}.weight"),
            shape: shape.to_vec(),
            stored_bytes: 0,
            packed: false,
        };
        let sizes = [
            size("transformer_blocks.0.attn.to_q", [128, 128]),
            size("transformer_blocks.0.attn.to_k", [128, 128]),
            size("transformer_blocks.0.attn.to_v", [128, 128]),
            size("single_transformer_blocks.1.attn.to_out", [448, 128]),
        ];
        let klein = Modules::from_sizes(Component::Transformer, Some(original_linear), &sizes);
        let layers = |key: ModuleKey| -> Vec<(String, Vec<(u64, u64)>)> {
            (klein.resolve(&key).into_iter())
                .map(|t| (t.layer.to_string(), t.rows.ranges(384).unwrap()))
                .collect()
        };
        let qkv = vec![
            (
                "transformer_blocks.0.attn.to_k".to_string(),
                vec![(128, 256)],
            ),
            ("transformer_blocks.0.attn.to_q".to_string(), vec![(0, 128)]),
            (
                "transformer_blocks.0.attn.to_v".to_string(),
                vec![(256, 384)],
            ),
        ];
        assert_eq!(
            layers(ModuleKey::Dotted("double_blocks.0.img_attn.qkv".into())),
            qkv
        );
        assert_eq!(
            layers(ModuleKey::Flat("double_blocks_0_img_attn_qkv".into())),
            qkv
        );
        let single = layers(ModuleKey::Flat("single_blocks_1_linear2".into()));
        assert_eq!(single[0].0, "single_transformer_blocks.1.attn.to_out");
        let direct = layers(ModuleKey::Dotted("transformer_blocks.0.attn.to_q".into()));
        assert_eq!(direct, vec![(qkv[1].0.clone(), vec![(0, 384)])]);
        // A family without original names answers to its diffusers names only.
        let plain = Modules::from_sizes(Component::Transformer, None, &sizes);
        let key = ModuleKey::Dotted("double_blocks.0.img_attn.qkv".into());
        assert!(plain.resolve(&key).is_empty());
    }
}
