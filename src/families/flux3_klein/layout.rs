//! Black Forest Labs' names for FLUX.3 \[klein\]'s transformer, read into diffusers' (the spec
//! §10.2): block tensors are renamed one for one (q, k and v are already apart), the output
//! layer's modulation holds (shift, scale) where diffusers holds (scale, shift), and the
//! training-only REPA projectors are left out.

use crate::mapping::{ByName, Inferred, Layout, LayoutError, Mapped};
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

/// A block tensor's diffusers suffix.
fn block_suffix(original: &str) -> Option<&'static str> {
    Some(match original {
        "q_proj.weight" => "attn.to_q.weight",
        "k_proj.weight" => "attn.to_k.weight",
        "v_proj.weight" => "attn.to_v.weight",
        "attn_out.weight" => "attn.to_out.0.weight",
        "norm.query_norm.scale" => "attn.norm_q.weight",
        "norm.key_norm.scale" => "attn.norm_k.weight",
        "mlp_in.weight" => "ff.linear_in.weight",
        "mlp_out.weight" => "ff.linear_out.weight",
        _ => return None,
    })
}

/// An original name's diffusers name, and whether its two row halves swap places.
fn diffusers_name(original: &str) -> Option<(String, bool)> {
    let fixed = match original {
        "emb_in.image.weight" => Some("x_embedders.image.weight"),
        "emb_in.image_cond.weight" => Some("x_embedders.image_cond.weight"),
        "txt_in.weight" => Some("context_embedder.weight"),
        "time_in.in_layer.weight" => Some("timestep_embedder.linear_1.weight"),
        "time_in.out_layer.weight" => Some("timestep_embedder.linear_2.weight"),
        "ref_time_in.in_layer.weight" => Some("target_timestep_embedder.linear_1.weight"),
        "ref_time_in.out_layer.weight" => Some("target_timestep_embedder.linear_2.weight"),
        "final_layer.image.linear.weight" => Some("proj_out.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some((name.to_string(), false));
    }
    if original == "final_layer.image.adaLN_modulation.1.weight" {
        return Some(("norm_out.linear.weight".into(), true));
    }
    for stage in ["early_stream_modulations.", "single_stream_modulations."] {
        if let Some(rest) = original.strip_prefix(stage) {
            let mode = rest.strip_suffix(".lin.weight")?;
            return Some((format!("{stage}{mode}.linear.weight"), false));
        }
    }
    let (prefix, rest) = [
        ("content_mode_blocks.image.", "mode_blocks.image."),
        ("content_mode_blocks.image_cond.", "mode_blocks.image_cond."),
        ("txt_mode_blocks.", "txt_mode_blocks."),
        ("single_blocks.", "single_transformer_blocks."),
    ]
    .iter()
    .find_map(|(o, d)| original.strip_prefix(o).map(|rest| (*d, rest)))?;
    let (block, suffix) = rest.split_once('.')?;
    block.parse::<u32>().ok()?;
    Some((format!("{prefix}{block}.{}", block_suffix(suffix)?), false))
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
