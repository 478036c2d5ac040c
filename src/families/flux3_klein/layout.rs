//! Black Forest Labs' names for FLUX.3 \[klein\]'s transformer, read into diffusers' and
//! written back (the spec §10.2): single files, GGUF files and `export` use them, and LoRA
//! layers answer to them (§10.3). Tensors are renamed one for one (q, k and v are already
//! apart), the output layer's modulation holds (shift, scale) where diffusers holds (scale,
//! shift), and the training-only REPA projectors are left out on import.

use crate::mapping::{ByName, Inferred, Joined, Layout, LayoutError, Mapped, Rows};
use crate::store::SourceTensor;

/// The prefixes a single file may put before every name.
const PREFIXES: [&str; 2] = ["model.diffusion_model.", "diffusion_model."];
const EXPECTED: &str = "diffusers names (`mode_blocks.image.N.attn.to_q.weight`, `single_transformer_blocks.N.attn.to_q.weight`, …) or the original FLUX.3 names (`content_mode_blocks.image.N.q_proj.weight`, `single_blocks.N.q_proj.weight`, …), optionally under `model.diffusion_model.`";

/// A name without the prefix a single file may give it.
fn stripped(name: &str) -> &str {
    (PREFIXES.iter())
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name)
}

/// Whether a single file's tensors are a FLUX.3 transformer's, in either naming.
pub fn is_flux3(tensors: &[SourceTensor]) -> bool {
    (tensors.iter()).any(|t| {
        let n = stripped(&t.name);
        n.starts_with("early_stream_modulations.")
            || n.starts_with("txt_mode_blocks.")
            || n.starts_with("content_mode_blocks.")
    })
}

/// A block's tensors: diffusers' name after `<block prefix><index>.`, and BFL's. The same for
/// every block kind; the first six are the linear layers a LoRA targets.
const BLOCK: [(&str, &str); 8] = [
    ("attn.to_q.weight", "q_proj.weight"),
    ("attn.to_k.weight", "k_proj.weight"),
    ("attn.to_v.weight", "v_proj.weight"),
    ("attn.to_out.0.weight", "attn_out.weight"),
    ("ff.linear_in.weight", "mlp_in.weight"),
    ("ff.linear_out.weight", "mlp_out.weight"),
    ("attn.norm_q.weight", "norm.query_norm.scale"),
    ("attn.norm_k.weight", "norm.key_norm.scale"),
];

/// The block kinds: diffusers' prefix and BFL's, each followed by the block index.
const BLOCK_KINDS: [(&str, &str); 4] = [
    ("mode_blocks.image.", "content_mode_blocks.image."),
    ("mode_blocks.image_cond.", "content_mode_blocks.image_cond."),
    ("txt_mode_blocks.", "txt_mode_blocks."),
    ("single_transformer_blocks.", "single_blocks."),
];

/// The tensors outside the blocks: diffusers' name and BFL's.
const TOP: [(&str, &str); 15] = [
    ("x_embedders.image.weight", "emb_in.image.weight"),
    ("x_embedders.image_cond.weight", "emb_in.image_cond.weight"),
    ("context_embedder.weight", "txt_in.weight"),
    (
        "timestep_embedder.linear_1.weight",
        "time_in.in_layer.weight",
    ),
    (
        "timestep_embedder.linear_2.weight",
        "time_in.out_layer.weight",
    ),
    (
        "target_timestep_embedder.linear_1.weight",
        "ref_time_in.in_layer.weight",
    ),
    (
        "target_timestep_embedder.linear_2.weight",
        "ref_time_in.out_layer.weight",
    ),
    (
        "early_stream_modulations.image.linear.weight",
        "early_stream_modulations.image.lin.weight",
    ),
    (
        "early_stream_modulations.image_cond.linear.weight",
        "early_stream_modulations.image_cond.lin.weight",
    ),
    (
        "early_stream_modulations.txt.linear.weight",
        "early_stream_modulations.txt.lin.weight",
    ),
    (
        "single_stream_modulations.image.linear.weight",
        "single_stream_modulations.image.lin.weight",
    ),
    (
        "single_stream_modulations.image_cond.linear.weight",
        "single_stream_modulations.image_cond.lin.weight",
    ),
    (
        "single_stream_modulations.txt.linear.weight",
        "single_stream_modulations.txt.lin.weight",
    ),
    (SWAPPED, "final_layer.image.adaLN_modulation.1.weight"),
    ("proj_out.weight", "final_layer.image.linear.weight"),
];

/// The one tensor whose rows are in another order in BFL's layout: diffusers' output
/// modulation holds (scale, shift), BFL's (shift, scale).
const SWAPPED: &str = "norm_out.linear.weight";

/// The two halves of a layer's rows, swapped (what [`SWAPPED`] holds of BFL's tensor).
const HALVES_SWAPPED: Rows = Rows {
    of: 2,
    parts: &[1, 0],
};

/// The naming a name is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Naming {
    Diffusers,
    Original,
}

/// `name`, which is in `naming`, in the other naming; `None` for a name that is no tensor of
/// a FLUX.3 transformer.
fn translated(name: &str, naming: Naming) -> Option<String> {
    let pick = |(d, o): (&'static str, &'static str)| match naming {
        Naming::Diffusers => (d, o),
        Naming::Original => (o, d),
    };
    if let Some((_, to)) = TOP.iter().map(|p| pick(*p)).find(|(f, _)| *f == name) {
        return Some(to.to_string());
    }
    BLOCK_KINDS
        .iter()
        .map(|p| pick(*p))
        .find_map(|(kind, to_kind)| {
            let (index, rest) = name.strip_prefix(kind)?.split_once('.')?;
            if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let (_, suffix) = BLOCK.iter().map(|p| pick(*p)).find(|(f, _)| *f == rest)?;
            Some(format!("{to_kind}{index}.{suffix}"))
        })
}

/// An original name's diffusers name, and whether its two row halves swap places.
fn diffusers_name(original: &str) -> Option<(String, bool)> {
    let name = translated(original, Naming::Original)?;
    let swap = name == SWAPPED;
    Some((name, swap))
}

/// The BFL layer a diffusers linear layer (`mode_blocks.image.0.attn.to_q`) is, and which of
/// its rows the diffusers layer holds; `None` for a name that is no linear layer of FLUX.3.
///
/// Every linear layer answers to its BFL name, outside the blocks too (`txt_in`,
/// `final_layer.image.adaLN_modulation.1` with its halves swapped): a LoRA trained on BFL's
/// layout means those layers, and ComfyUI applies them so. diffusers 0.42.1's converter renames
/// block layers only and ignores the rest (the spec §10.3); for LoRAs on block layers alone,
/// the two agree.
pub fn original_linear(module: &str) -> Option<(String, Rows)> {
    let diffusers = format!("{module}.weight");
    let original = translated(&diffusers, Naming::Diffusers)?;
    // Norm scales (`….scale`) are no linear layers.
    let layer = original.strip_suffix(".weight")?;
    let rows = match diffusers == SWAPPED {
        true => HALVES_SWAPPED,
        false => Rows::WHOLE,
    };
    Some((layer.to_string(), rows))
}

/// What a LoRA whose target names contain what `has` finds is, when they are FLUX.3's. Every
/// FLUX.3 naming has mode blocks (`mode_blocks`, `txt_mode_blocks`, `content_mode_blocks`); a
/// LoRA on the joint blocks alone is told by BFL's layer names, which FLUX.2 lacks.
pub fn lora_guess(has: &dyn Fn(&str) -> bool) -> Option<&'static str> {
    let original = has("content_mode_blocks")
        || (has("single_blocks") || has("txt_mode_blocks"))
            && (has("q_proj") || has("attn_out") || has("mlp_in"));
    if original {
        Some("FLUX.3, original names (`content_mode_blocks`/`txt_mode_blocks`/`single_blocks`): FLUX.3 [klein] if the widths fit")
    } else if has("mode_blocks") {
        Some("FLUX.3, diffusers names (`mode_blocks`/`txt_mode_blocks`/`single_transformer_blocks`): FLUX.3 [klein] if the widths fit")
    } else {
        None
    }
}

/// The original layout of stored (diffusers-named) tensors, for `export`: each renamed, the
/// output modulation's halves swapped back; a name the table lacks is kept as it is.
pub fn to_original(tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
    (tensors.iter())
        .map(|(name, shape)| {
            let original = translated(name, Naming::Diffusers).unwrap_or_else(|| name.clone());
            let roll_rows = match name == SWAPPED {
                true => shape.first().map_or(0, |rows| rows / 2),
                false => 0,
            };
            Joined {
                name: original,
                shape: shape.clone(),
                parts: vec![name.clone()],
                roll_rows,
            }
        })
        .collect()
}

/// A transformer checkpoint's tensors under diffusers' names, with the config their shapes
/// tell.
pub fn to_diffusers(mut tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    for t in &mut tensors {
        t.name = stripped(&t.name).to_string();
    }
    let layout = crate::mapping::layout_of(
        &tensors,
        (
            &["mode_blocks.", "single_transformer_blocks."],
            &["content_mode_blocks.", "single_blocks."],
        ),
        what,
        ("transformer", EXPECTED),
    )?;
    let mut dropped = Vec::new();
    if layout == Layout::Original {
        let mut out = Vec::with_capacity(tensors.len());
        for t in &tensors {
            if t.name.starts_with("repa_projectors.") {
                dropped.push(t.name.clone());
                continue;
            }
            let (name, swap) = diffusers_name(&t.name).ok_or_else(|| LayoutError::Tensor {
                what: what.to_string(),
                tensor: t.name.clone(),
                reason: "is no tensor of a FLUX.3 transformer".into(),
            })?;
            let mut renamed = crate::mapping::renamed(t, name, None);
            if swap {
                if !t.nbytes.is_multiple_of(2) || t.shape.first().is_none_or(|r| r % 2 != 0) {
                    return Err(LayoutError::Tensor {
                        what: what.to_string(),
                        tensor: t.name.clone(),
                        reason: format!("has shape {:?}, not two halves (shift, scale)", t.shape),
                    });
                }
                renamed.roll = t.nbytes / 2;
            }
            out.push(renamed);
        }
        tensors = out;
    }
    let inferred = infer_config(&tensors, what)?;
    let transformer = crate::mapping::Component::Transformer;
    Ok(Mapped::new(transformer, layout, tensors, inferred, dropped))
}

/// The transformer's config as its (diffusers-named) shapes tell it; the RoPE split is the
/// head size in four equal axes and θ diffusers' default, which shapes cannot tell.
pub fn infer_config(tensors: &[SourceTensor], what: &str) -> Result<Inferred, LayoutError> {
    let t = ByName::new(what, "transformer", tensors);
    let x = "x_embedders.image.weight";
    let inner = t.dim(x, 2, 0)?;
    let q_norm = "single_transformer_blocks.0.attn.norm_q.weight";
    let head_dim = t.dim(q_norm, 1, 0)?;
    if head_dim == 0 || inner % head_dim != 0 || head_dim % 8 != 0 {
        return Err(t.bad(
            q_norm,
            format!("gives a head size of {head_dim}, which does not divide the width {inner} into four RoPE axes"),
        ));
    }
    let ff_out = "single_transformer_blocks.0.ff.linear_out.weight";
    let mlp = t.dim(ff_out, 2, 1)?;
    let time = "timestep_embedder.linear_1.weight";
    let quarter = head_dim / 4;
    let config = serde_json::json!({
        "_class_name": "Flux3Transformer2DModel",
        "_diffusers_version": "0.42.1",
        "attention_head_dim": head_dim,
        "axes_dims_rope": [quarter, quarter, quarter, quarter],
        "cond_in_channels": t.dim("x_embedders.image_cond.weight", 2, 1)?,
        "eps": 1e-6,
        "flow_map": t.map.contains_key("target_timestep_embedder.linear_1.weight"),
        "in_channels": t.dim(x, 2, 1)?,
        "joint_attention_dim": t.dim("context_embedder.weight", 2, 1)?,
        "mlp_ratio": mlp as f64 / inner as f64,
        "num_attention_heads": inner / head_dim,
        "num_layers": t.count("txt_mode_blocks."),
        "num_single_layers": t.count("single_transformer_blocks."),
        "rope_theta": 10000,
        "timestep_channels": t.dim(time, 2, 1)?,
    });
    let shape_keys = [
        ("attention_head_dim", q_norm),
        ("cond_in_channels", "x_embedders.image_cond.weight"),
        ("in_channels", x),
        ("joint_attention_dim", "context_embedder.weight"),
        ("mlp_ratio", ff_out),
        ("num_attention_heads", x),
        ("num_layers", "txt_mode_blocks.N"),
        ("num_single_layers", "single_transformer_blocks.N"),
        ("timestep_channels", time),
    ];
    Ok(Inferred {
        config,
        shape_keys: shape_keys
            .iter()
            .map(|(k, n)| (*k, n.to_string()))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's table (§10.2), both ways, and what LoRA names answer to (§10.3).
    #[test]
    fn names_map_both_ways() {
        for (original, diffusers) in [
            ("emb_in.image_cond.weight", "x_embedders.image_cond.weight"),
            (
                "ref_time_in.out_layer.weight",
                "target_timestep_embedder.linear_2.weight",
            ),
            (
                "single_stream_modulations.txt.lin.weight",
                "single_stream_modulations.txt.linear.weight",
            ),
            ("final_layer.image.linear.weight", "proj_out.weight"),
            (
                "content_mode_blocks.image_cond.1.norm.key_norm.scale",
                "mode_blocks.image_cond.1.attn.norm_k.weight",
            ),
            (
                "content_mode_blocks.image.0.attn_out.weight",
                "mode_blocks.image.0.attn.to_out.0.weight",
            ),
            (
                "txt_mode_blocks.4.mlp_in.weight",
                "txt_mode_blocks.4.ff.linear_in.weight",
            ),
            (
                "single_blocks.27.v_proj.weight",
                "single_transformer_blocks.27.attn.to_v.weight",
            ),
        ] {
            assert_eq!(
                diffusers_name(original),
                Some((diffusers.to_string(), false))
            );
            let back = to_original(&[(diffusers.to_string(), vec![4, 4])]);
            assert_eq!((back[0].name.as_str(), back[0].roll_rows), (original, 0));
        }
        let swapped = "final_layer.image.adaLN_modulation.1.weight";
        assert_eq!(diffusers_name(swapped), Some((SWAPPED.to_string(), true)));
        let back = to_original(&[(SWAPPED.to_string(), vec![12, 4])]);
        assert_eq!((back[0].name.as_str(), back[0].roll_rows), (swapped, 6));
        for stranger in [
            "single_blocks.x.q_proj.weight",
            "single_blocks..q_proj.weight",
            "content_mode_blocks.txt.0.q_proj.weight",
            "txt_mode_blocks.0.q_proj.scale",
            "early_stream_modulations.other.lin.weight",
        ] {
            assert_eq!(diffusers_name(stranger), None, "{stranger}");
        }
    }

    #[test]
    fn lora_layers_answer_to_their_original_names() {
        let whole = |name: &str| Some((name.to_string(), Rows::WHOLE));
        assert_eq!(
            original_linear("mode_blocks.image.1.attn.to_q"),
            whole("content_mode_blocks.image.1.q_proj")
        );
        assert_eq!(
            original_linear("single_transformer_blocks.2.ff.linear_out"),
            whole("single_blocks.2.mlp_out")
        );
        assert_eq!(original_linear("context_embedder"), whole("txt_in"));
        let (name, rows) = original_linear("norm_out.linear").unwrap();
        assert_eq!(name, "final_layer.image.adaLN_modulation.1");
        assert_eq!(rows.ranges(8), Some(vec![(4, 8), (0, 4)]));
        assert_eq!(original_linear("txt_mode_blocks.0.attn.norm_q"), None);
        assert_eq!(original_linear("mode_blocks.image.0.attn.to_out"), None);
    }

    #[test]
    fn lora_names_tell_their_naming() {
        let guess = |names: &[&str]| {
            let has = |s: &str| names.iter().any(|n| n.contains(s));
            lora_guess(&has).map(|g| g.split(':').next().unwrap().to_string())
        };
        let original = Some(
            "FLUX.3, original names (`content_mode_blocks`/`txt_mode_blocks`/`single_blocks`)"
                .to_string(),
        );
        assert_eq!(guess(&["content_mode_blocks.image.0.q_proj"]), original);
        assert_eq!(guess(&["single_blocks.0.mlp_in"]), original);
        assert!(guess(&["txt_mode_blocks.0.attn.to_q"])
            .unwrap()
            .contains("diffusers"));
        // FLUX.2's names are not FLUX.3's.
        assert_eq!(
            guess(&["single_blocks.0.linear1", "double_blocks.0.img_attn.qkv"]),
            None
        );
        assert_eq!(guess(&["transformer_blocks.0.attn.to_q"]), None);
    }
}
