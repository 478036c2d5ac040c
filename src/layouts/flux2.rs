//! The FLUX.2 transformer: Black Forest Labs' original layout (`flux-2-klein-4b.safetensors`,
//! ComfyUI's `diffusion_models/` files and the GGUF files made from them) and diffusers'
//! `Flux2Transformer2DModel` (klein-spec §10.4).
//!
//! The original names differ from diffusers' in three ways: plain renames (`img_in` →
//! `x_embedder`, `…query_norm.scale` → `…norm_q.weight`), the fused `qkv` of each double
//! block's two attentions, whose rows are q's, k's and v's in equal thirds, and the final
//! modulation, whose rows hold (shift, scale) where diffusers holds (scale, shift): its halves
//! are swapped by reading its bytes rolled by half.

use super::{rows, sample, strip_prefix, ByName, Inferred, Joined, Layout, LayoutError, Mapped};
use crate::store::SourceTensor;

const PREFIXES: [&str; 2] = ["model.diffusion_model.", "diffusion_model."];
const EXPECTED: &str = "diffusers names (`transformer_blocks.N.attn.to_q.weight`, `single_transformer_blocks.N.attn.to_qkv_mlp_proj.weight`, …) or the original FLUX.2 names (`double_blocks.N.img_attn.qkv.weight`, `single_blocks.N.linear1.weight`, …), optionally under `model.diffusion_model.`";

/// Renames outside the blocks, original → diffusers.
const TOP: [(&str, &str); 11] = [
    ("img_in.weight", "x_embedder.weight"),
    ("txt_in.weight", "context_embedder.weight"),
    (
        "time_in.in_layer.weight",
        "time_guidance_embed.timestep_embedder.linear_1.weight",
    ),
    (
        "time_in.out_layer.weight",
        "time_guidance_embed.timestep_embedder.linear_2.weight",
    ),
    (
        "guidance_in.in_layer.weight",
        "time_guidance_embed.guidance_embedder.linear_1.weight",
    ),
    (
        "guidance_in.out_layer.weight",
        "time_guidance_embed.guidance_embedder.linear_2.weight",
    ),
    (
        "double_stream_modulation_img.lin.weight",
        "double_stream_modulation_img.linear.weight",
    ),
    (
        "double_stream_modulation_txt.lin.weight",
        "double_stream_modulation_txt.linear.weight",
    ),
    (
        "single_stream_modulation.lin.weight",
        "single_stream_modulation.linear.weight",
    ),
    (FINAL_MODULATION, "norm_out.linear.weight"),
    ("final_layer.linear.weight", "proj_out.weight"),
];

/// The final layer's modulation, whose two row halves diffusers holds the other way round.
const FINAL_MODULATION: &str = "final_layer.adaLN_modulation.1.weight";

/// Renames inside a double block (`double_blocks.N.` → `transformer_blocks.N.`).
const DOUBLE: [(&str, &str); 10] = [
    ("img_attn.norm.query_norm.scale", "attn.norm_q.weight"),
    ("img_attn.norm.key_norm.scale", "attn.norm_k.weight"),
    ("txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"),
    ("txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"),
    ("img_attn.proj.weight", "attn.to_out.0.weight"),
    ("txt_attn.proj.weight", "attn.to_add_out.weight"),
    ("img_mlp.0.weight", "ff.linear_in.weight"),
    ("img_mlp.2.weight", "ff.linear_out.weight"),
    ("txt_mlp.0.weight", "ff_context.linear_in.weight"),
    ("txt_mlp.2.weight", "ff_context.linear_out.weight"),
];

/// The fused projections of a double block and the three diffusers projections each holds.
const FUSED: [(&str, [&str; 3]); 2] = [
    (
        "img_attn.qkv.weight",
        ["attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight"],
    ),
    (
        "txt_attn.qkv.weight",
        [
            "attn.add_q_proj.weight",
            "attn.add_k_proj.weight",
            "attn.add_v_proj.weight",
        ],
    ),
];

/// Renames inside a single block (`single_blocks.N.` → `single_transformer_blocks.N.`).
const SINGLE: [(&str, &str); 4] = [
    ("linear1.weight", "attn.to_qkv_mlp_proj.weight"),
    ("linear2.weight", "attn.to_out.weight"),
    ("norm.query_norm.scale", "attn.norm_q.weight"),
    ("norm.key_norm.scale", "attn.norm_k.weight"),
];

/// Original → diffusers names, each a pair.
type Renames = &'static [(&'static str, &'static str)];

/// The blocks' prefixes, original and diffusers, with their renames.
const BLOCKS: [(&str, &str, Renames); 2] = [
    ("double_blocks.", "transformer_blocks.", &DOUBLE),
    ("single_blocks.", "single_transformer_blocks.", &SINGLE),
];

/// Whether the tensors are a FLUX.2 transformer's, in either layout.
pub fn is_flux2(tensors: &[SourceTensor]) -> bool {
    let names = || {
        tensors.iter().map(|t| {
            PREFIXES
                .iter()
                .find_map(|p| t.name.strip_prefix(p))
                .unwrap_or(&t.name)
        })
    };
    names().any(|n| {
        n.starts_with("double_blocks.")
            || n.starts_with("single_transformer_blocks.")
            || n.starts_with("double_stream_modulation_img.")
    })
}

pub fn to_diffusers(mut tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    strip_prefix(&mut tensors, &PREFIXES);
    let has = |p: &str| tensors.iter().any(|t| t.name.starts_with(p));
    let layout = if has("single_transformer_blocks.") || has("transformer_blocks.") {
        Layout::Diffusers
    } else if has("double_blocks.") || has("single_blocks.") {
        Layout::Original
    } else {
        return Err(LayoutError::Unknown {
            what: what.to_string(),
            component: "transformer",
            expected: EXPECTED,
            found: sample(&tensors),
        });
    };
    let tensors = match layout {
        Layout::Diffusers => tensors,
        Layout::Original => {
            let mut out = Vec::with_capacity(tensors.len() + 32);
            for t in &tensors {
                let unknown = || LayoutError::Tensor {
                    what: what.to_string(),
                    tensor: t.name.clone(),
                    reason: "is no tensor of a FLUX.2 transformer".into(),
                };
                if let Some(parts) = fused_parts(&t.name) {
                    out.extend(split_thirds(t, &parts, what)?);
                } else if t.name == FINAL_MODULATION {
                    out.push(swapped_halves(t, what)?);
                } else {
                    let name = original_to_diffusers(&t.name).ok_or_else(unknown)?;
                    out.push(super::renamed(t, name, None));
                }
            }
            out
        }
    };
    let inferred = infer_config(&tensors, what)?;
    Ok(Mapped {
        component: super::Component::Transformer,
        layout,
        tensors,
        config: inferred.config,
        shape_keys: inferred.shape_keys,
        hint: None,
        dropped: Vec::new(),
    })
}

/// One original name in diffusers' spelling (the fused and the final modulation aside).
fn original_to_diffusers(name: &str) -> Option<String> {
    if let Some((_, to)) = TOP.iter().find(|(from, _)| *from == name) {
        return Some(to.to_string());
    }
    BLOCKS.iter().find_map(|(from, to, renames)| {
        let (index, rest) = name.strip_prefix(from)?.split_once('.')?;
        index.parse::<u64>().ok()?;
        let (_, mapped) = renames.iter().find(|(f, _)| *f == rest)?;
        Some(format!("{to}{index}.{mapped}"))
    })
}

/// One diffusers name in the original spelling (the fused projections aside).
fn diffusers_to_original(name: &str) -> Option<String> {
    if let Some((from, _)) = TOP.iter().find(|(_, to)| *to == name) {
        return Some(from.to_string());
    }
    // The single blocks' prefix ends with the double blocks', so it is tried first.
    BLOCKS.iter().rev().find_map(|(from, to, renames)| {
        let (index, rest) = name.strip_prefix(to)?.split_once('.')?;
        index.parse::<u64>().ok()?;
        let (original, _) = renames.iter().find(|(_, t)| *t == rest)?;
        Some(format!("{from}{index}.{original}"))
    })
}

/// A fused projection's three diffusers names, if `name` is one.
fn fused_parts(name: &str) -> Option<[String; 3]> {
    let (index, rest) = name.strip_prefix("double_blocks.")?.split_once('.')?;
    index.parse::<u64>().ok()?;
    let (_, parts) = FUSED.iter().find(|(fused, _)| *fused == rest)?;
    Some(parts.map(|p| format!("transformer_blocks.{index}.{p}")))
}

/// A fused `qkv` cut into its three projections, a third of the rows each.
fn split_thirds(
    t: &SourceTensor,
    names: &[String; 3],
    what: &str,
) -> Result<[SourceTensor; 3], LayoutError> {
    let bad = |reason: String| LayoutError::Tensor {
        what: what.to_string(),
        tensor: t.name.clone(),
        reason,
    };
    let total = t.shape.first().copied().unwrap_or(0);
    if total == 0 || !total.is_multiple_of(3) {
        return Err(bad(format!(
            "has {total} rows, which are not three equal projections"
        )));
    }
    let third = total / 3;
    let cut = |k: u64| rows(t, k * third, (k + 1) * third, &names[k as usize]).map_err(bad);
    Ok([cut(0)?, cut(1)?, cut(2)?])
}

/// The final modulation with its (shift, scale) halves read as diffusers' (scale, shift).
fn swapped_halves(t: &SourceTensor, what: &str) -> Result<SourceTensor, LayoutError> {
    let total = t.shape.first().copied().unwrap_or(0);
    if total == 0 || !total.is_multiple_of(2) || !t.nbytes.is_multiple_of(2) {
        return Err(LayoutError::Tensor {
            what: what.to_string(),
            tensor: t.name.clone(),
            reason: format!("has {total} rows, which are not a shift and a scale half"),
        });
    }
    let mut out = super::renamed(t, "norm_out.linear.weight".into(), None);
    out.roll = t.nbytes / 2;
    Ok(out)
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

/// The original layout of stored (diffusers-named) tensors: renamed, each double block's
/// projections fused, the final modulation's halves swapped back.
pub fn to_original(tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
    let shape_of = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, s)| s);
    let mut out = Vec::with_capacity(tensors.len());
    for (name, shape) in tensors {
        let fused = FUSED.iter().find_map(|(fused, parts)| {
            let (index, rest) = name.strip_prefix("transformer_blocks.")?.split_once('.')?;
            (rest == parts[0]).then_some((index, *fused, parts))
        });
        if let Some((index, fused, parts)) = fused {
            let parts = parts.map(|p| format!("transformer_blocks.{index}.{p}"));
            let rows = parts.iter().filter_map(|p| shape_of(p)).map(|s| s[0]).sum();
            let mut shape = shape.clone();
            shape[0] = rows;
            out.push(Joined {
                name: format!("double_blocks.{index}.{fused}"),
                shape,
                parts: parts.to_vec(),
                roll_rows: 0,
            });
            continue;
        }
        let is_fused_rest = FUSED.iter().any(|(_, parts)| {
            parts[1..].iter().any(|p| {
                name.ends_with(&format!(".{p}")) && name.starts_with("transformer_blocks.")
            })
        });
        if is_fused_rest {
            continue; // fused with its q above
        }
        let original = diffusers_to_original(name).unwrap_or_else(|| name.clone());
        let roll_rows = match original == FINAL_MODULATION {
            true => shape[0] / 2,
            false => 0,
        };
        out.push(Joined {
            name: original,
            shape: shape.clone(),
            parts: vec![name.clone()],
            roll_rows,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
                original_to_diffusers(original).as_deref(),
                Some(diffusers),
                "{original}"
            );
            assert_eq!(
                diffusers_to_original(diffusers).as_deref(),
                Some(original),
                "{diffusers}"
            );
        }
        assert_eq!(
            original_to_diffusers("double_blocks.x.img_mlp.0.weight"),
            None
        );
        assert_eq!(
            original_to_diffusers("single_blocks.0.modulation.lin.weight"),
            None
        );
        assert_eq!(
            fused_parts("double_blocks.4.txt_attn.qkv.weight").unwrap()[2],
            "transformer_blocks.4.attn.add_v_proj.weight"
        );
    }
}
