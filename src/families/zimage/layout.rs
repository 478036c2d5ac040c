//! The Z-Image transformer: its original layout (ComfyUI's `z_image_turbo_bf16.safetensors`,
//! stable-diffusion.cpp's GGUF names) and diffusers' `ZImageTransformer2DModel`.
//!
//! The original names differ from diffusers' in five places: `x_embedder`/`final_layer`
//! (diffusers keys them by patch size, `all_x_embedder.2-1`), `attention.out` (`to_out.0`),
//! `attention.q_norm`/`k_norm` (`norm_q`/`norm_k`), and the fused `attention.qkv`, whose rows
//! are q's, then k's, then v's. An unused `norm_final.weight` is dropped, as diffusers does.

use crate::mapping::{
    rows, sample, strip_prefix, ByName, Inferred, Joined, Layout, LayoutError, Mapped,
};
use crate::store::SourceTensor;

const PREFIXES: [&str; 2] = ["model.diffusion_model.", "diffusion_model."];
const EXPECTED: &str = "diffusers names (`all_x_embedder.2-1.weight`, `layers.N.attention.to_q.weight`, …) or the original Z-Image names (`x_embedder.weight`, `layers.N.attention.qkv.weight`, …), optionally under `model.diffusion_model.`";

/// Simple renames, original → diffusers, applied anywhere in a name.
const RENAMES: [(&str, &str); 5] = [
    (".attention.out.", ".attention.to_out.0."),
    (".attention.q_norm.", ".attention.norm_q."),
    (".attention.k_norm.", ".attention.norm_k."),
    ("x_embedder.", "all_x_embedder.2-1."),
    ("final_layer.", "all_final_layer.2-1."),
];

pub fn to_diffusers(mut tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    strip_prefix(&mut tensors, &PREFIXES);
    // ggml drops trailing 1s from a tensor's dimensions (leading ones in torch's order), so a
    // GGUF file holds the `[1, dim]` pad tokens as `[dim]`.
    for t in &mut tensors {
        if (t.name == "x_pad_token" || t.name == "cap_pad_token") && t.shape.len() == 1 {
            t.shape.insert(0, 1);
        }
    }
    let has = |f: &dyn Fn(&str) -> bool| tensors.iter().any(|t| f(&t.name));
    let layout = if has(&|n| n == "all_x_embedder.2-1.weight") {
        Layout::Diffusers
    } else if has(&|n| n == "x_embedder.weight" || n.ends_with(".attention.qkv.weight")) {
        Layout::Original
    } else {
        return Err(LayoutError::Unknown {
            what: what.to_string(),
            component: "transformer",
            expected: EXPECTED,
            found: sample(&tensors),
        });
    };
    let mut dropped = Vec::new();
    let tensors = match layout {
        Layout::Diffusers => tensors,
        Layout::Original => {
            let mut out = Vec::with_capacity(tensors.len() + 64);
            let head_dim = head_dim_original(&tensors, what)?;
            let dim = ByName::new(what, "transformer", &tensors).dim("x_embedder.weight", 2, 0)?;
            for t in &tensors {
                if t.name == "norm_final.weight" {
                    dropped.push(t.name.clone());
                } else if let Some(stem) = t.name.strip_suffix(".attention.qkv.weight") {
                    out.extend(split_qkv(t, stem, dim, head_dim, what)?);
                } else {
                    out.push(crate::mapping::renamed(
                        t,
                        original_to_diffusers(&t.name),
                        None,
                    ));
                }
            }
            out
        }
    };
    let inferred = infer_config(&tensors, what)?;
    Ok(Mapped::new(
        crate::mapping::Component::Transformer,
        layout,
        tensors,
        inferred,
        dropped,
    ))
}

fn original_to_diffusers(name: &str) -> String {
    let mut n = name.to_string();
    for (from, to) in RENAMES {
        if from.starts_with('.') {
            n = n.replace(from, to);
        } else if let Some(rest) = n.strip_prefix(from) {
            n = format!("{to}{rest}");
        }
    }
    n
}

fn diffusers_to_original(name: &str) -> String {
    let mut n = name.to_string();
    for (from, to) in RENAMES {
        if to.starts_with('.') {
            n = n.replace(to, from);
        } else if let Some(rest) = n.strip_prefix(to) {
            n = format!("{from}{rest}");
        }
    }
    n
}

/// The head size, read off the first block's q-norm (one weight per head channel).
fn head_dim_original(tensors: &[SourceTensor], what: &str) -> Result<u64, LayoutError> {
    ByName::new(what, "transformer", tensors).dim("layers.0.attention.q_norm.weight", 1, 0)
}

/// `attention.qkv` holds `n_heads` query heads, then `n_kv` key and `n_kv` value heads.
fn split_qkv(
    t: &SourceTensor,
    stem: &str,
    dim: u64,
    head_dim: u64,
    what: &str,
) -> Result<[SourceTensor; 3], LayoutError> {
    let bad = |reason: String| LayoutError::Tensor {
        what: what.to_string(),
        tensor: t.name.clone(),
        reason,
    };
    let total = *t.shape.first().unwrap_or(&0);
    let q = dim;
    let kv2 = total.checked_sub(q).filter(|r| r % 2 == 0 && *r > 0);
    let Some(kv) = kv2
        .map(|r| r / 2)
        .filter(|kv| head_dim > 0 && kv % head_dim == 0)
    else {
        return Err(bad(format!(
            "has {total} rows, which is not the model width {dim} of queries plus two equal sets of whole {head_dim}-wide key and value heads"
        )));
    };
    let name = |p: &str| format!("{stem}.attention.to_{p}.weight");
    let cut = |s, e, p| rows(t, s, e, &name(p)).map_err(bad);
    Ok([
        cut(0, q, "q")?,
        cut(q, q + kv, "k")?,
        cut(q + kv, q + 2 * kv, "v")?,
    ])
}

/// `transformer/config.json` from the shapes (diffusers names), Turbo's values for the rest.
pub fn infer_config(tensors: &[SourceTensor], what: &str) -> Result<Inferred, LayoutError> {
    let t = ByName::new(what, "transformer", tensors);
    let x = "all_x_embedder.2-1.weight";
    let dim = t.dim(x, 2, 0)?;
    let patch_in = t.dim(x, 2, 1)?;
    if patch_in % 4 != 0 {
        return Err(t.bad(
            x,
            format!("has {patch_in} input features, not 2×2 patches of latent channels"),
        ));
    }
    let head_dim = t.dim("layers.0.attention.norm_q.weight", 1, 0)?;
    let q_rows = t.dim("layers.0.attention.to_q.weight", 2, 0)?;
    let kv_rows = t.dim("layers.0.attention.to_k.weight", 2, 0)?;
    if head_dim == 0 || q_rows % head_dim != 0 || kv_rows % head_dim != 0 || head_dim % 16 != 0 {
        return Err(t.bad(
            "layers.0.attention.norm_q.weight",
            format!("gives a head size of {head_dim}, which does not divide the projections ({q_rows}, {kv_rows} rows) into RoPE axes"),
        ));
    }
    let k_norm = "layers.0.attention.norm_k.weight";
    if t.dim(k_norm, 1, 0)? != head_dim {
        return Err(t.bad(
            k_norm,
            format!(
                "has {} weights, but the query norm gives a head size of {head_dim}",
                t.dim(k_norm, 1, 0)?
            ),
        ));
    }
    let cap_feat_dim = t.dim("cap_embedder.1.weight", 2, 1)?;
    // Turbo splits its 128-wide heads 32/48/48 between the frame, height and width axes; other
    // head sizes keep the same proportions.
    let axes = [head_dim / 4, head_dim * 3 / 8, head_dim * 3 / 8];
    let config = serde_json::json!({
        "_class_name": "ZImageTransformer2DModel",
        "_diffusers_version": "0.42.1",
        "all_f_patch_size": [1],
        "all_patch_size": [2],
        "axes_dims": axes,
        "axes_lens": [1536, 512, 512],
        "cap_feat_dim": cap_feat_dim,
        "dim": dim,
        "in_channels": patch_in / 4,
        "n_heads": q_rows / head_dim,
        "n_kv_heads": kv_rows / head_dim,
        "n_layers": t.count("layers."),
        "n_refiner_layers": t.count("noise_refiner."),
        "norm_eps": 1e-5,
        "qk_norm": true,
        "rope_theta": 256.0,
        "siglip_feat_dim": null,
        "t_scale": 1000.0,
    });
    let q = "layers.0.attention.to_q.weight";
    let shape_keys = [
        ("dim", x),
        ("in_channels", x),
        ("n_heads", q),
        ("n_kv_heads", "layers.0.attention.to_k.weight"),
        ("n_layers", "layers.N"),
        ("n_refiner_layers", "noise_refiner.N"),
        ("cap_feat_dim", "cap_embedder.1.weight"),
    ];
    Ok(Inferred {
        config,
        shape_keys: shape_keys.map(|(k, t)| (k, t.to_string())).to_vec(),
    })
}

/// The original layout of stored (diffusers-named) tensors: renamed, q/k/v fused.
pub fn to_original(tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
    let mut out = Vec::with_capacity(tensors.len());
    for (name, shape) in tensors {
        if let Some(stem) = name.strip_suffix(".attention.to_q.weight") {
            let part = |p: &str| format!("{stem}.attention.to_{p}.weight");
            let rows: u64 = ["q", "k", "v"]
                .iter()
                .filter_map(|p| tensors.iter().find(|(n, _)| *n == part(p)))
                .map(|(_, s)| s[0])
                .sum();
            let mut fused = shape.clone();
            fused[0] = rows;
            out.push(Joined {
                name: format!("{stem}.attention.qkv.weight"),
                shape: fused,
                parts: vec![part("q"), part("k"), part("v")],
                roll_rows: 0,
            });
        } else if name.ends_with(".attention.to_k.weight")
            || name.ends_with(".attention.to_v.weight")
        {
            continue; // fused with its q above
        } else {
            out.push(Joined {
                name: diffusers_to_original(name),
                shape: shape.clone(),
                parts: vec![name.clone()],
                roll_rows: 0,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_are_inverse() {
        for n in [
            "x_embedder.weight",
            "final_layer.adaLN_modulation.1.bias",
            "layers.3.attention.out.weight",
            "noise_refiner.0.attention.q_norm.weight",
            "context_refiner.1.attention.k_norm.weight",
            "t_embedder.mlp.0.weight",
            "cap_pad_token",
        ] {
            assert_eq!(diffusers_to_original(&original_to_diffusers(n)), n);
        }
        assert_eq!(
            original_to_diffusers("layers.3.attention.out.weight"),
            "layers.3.attention.to_out.0.weight"
        );
        assert_eq!(
            original_to_diffusers("final_layer.linear.weight"),
            "all_final_layer.2-1.linear.weight"
        );
    }
}
