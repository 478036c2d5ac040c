//! The VAE: the LDM/Flux layout (`ae.safetensors`: `encoder.down.N.block.M`, `mid.attn_1`,
//! `decoder.up.N` counted from the lowest resolution) and diffusers' `AutoencoderKL`.
//!
//! Renames per block kind, as diffusers' `convert_ldm_vae_checkpoint` does: resnets
//! (`nin_shortcut` → `conv_shortcut`), down/up samplers, the mid block's two resnets
//! (`block_1`, `block_2`) and attention (`norm`, `q`, `k`, `v`, `proj_out`, stored as 1×1
//! convolutions, whose weights drop their unit axes to become linear weights), and the outer
//! `norm_out` → `conv_norm_out`. Decoder up blocks are numbered in reverse.

use crate::mapping::{strip_prefix, ByName, Inferred, Joined, Layout, LayoutError, Mapped};
use crate::store::SourceTensor;

const PREFIXES: [&str; 2] = ["first_stage_model.", "vae."];
const EXPECTED: &str = "diffusers names (`decoder.up_blocks.N.resnets.M.conv1.weight`, …) or the LDM/Flux names (`decoder.up.N.block.M.conv1.weight`, `decoder.mid.attn_1.q.weight`, …)";

const ATTENTION: [(&str, &str); 5] = [
    ("norm.", "group_norm."),
    ("q.", "to_q."),
    ("k.", "to_k."),
    ("v.", "to_v."),
    ("proj_out.", "to_out.0."),
];

pub fn to_diffusers(mut tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    strip_prefix(&mut tensors, &PREFIXES);
    let layout = crate::mapping::layout_of(
        &tensors,
        (&["decoder.up_blocks."], &["decoder.up."]),
        what,
        ("VAE", EXPECTED),
    )?;
    let tensors = match layout {
        Layout::Diffusers => tensors,
        Layout::Original => {
            let ups = ByName::new(what, "VAE", &tensors).count("decoder.up.");
            let mut out = Vec::with_capacity(tensors.len());
            for t in &tensors {
                let name = ldm_to_diffusers(&t.name, ups).ok_or_else(|| LayoutError::Tensor {
                    what: what.to_string(),
                    tensor: t.name.clone(),
                    reason: "is no tensor of an LDM/Flux VAE".into(),
                })?;
                let linear = name.contains(".attentions.0.to_") && name.ends_with(".weight");
                let shape = (linear && t.shape.len() > 2 && t.shape[2..].iter().all(|&d| d == 1))
                    .then(|| t.shape[..2].to_vec());
                out.push(crate::mapping::renamed(t, name, shape));
            }
            out
        }
    };
    let inferred = infer_config(&tensors, what)?;
    Ok(Mapped::new(
        crate::mapping::Component::Vae,
        layout,
        tensors,
        inferred,
        Vec::new(),
    ))
}

/// One LDM name in diffusers' spelling; `ups` is the decoder's number of up blocks.
fn ldm_to_diffusers(name: &str, ups: u64) -> Option<String> {
    let (half, rest) = name.split_once('.')?;
    if !matches!(half, "encoder" | "decoder") {
        // FLUX.2's VAE normalises latents with a BatchNorm's running statistics.
        return matches!(half, "quant_conv" | "post_quant_conv" | "bn").then(|| name.to_string());
    }
    let mapped = if let Some(r) = rest.strip_prefix("norm_out.") {
        format!("conv_norm_out.{r}")
    } else if rest.starts_with("conv_in.") || rest.starts_with("conv_out.") {
        rest.to_string()
    } else if let Some(r) = rest.strip_prefix("mid.") {
        let (part, r) = r.split_once('.')?;
        match part {
            "block_1" => format!("mid_block.resnets.0.{}", resnet(r)),
            "block_2" => format!("mid_block.resnets.1.{}", resnet(r)),
            "attn_1" => format!("mid_block.attentions.0.{}", attention(r)?),
            _ => return None,
        }
    } else {
        let (kind, r) = rest.split_once('.')?;
        let (i, r) = r.split_once('.')?;
        let i: u64 = i.parse().ok()?;
        let (block, diffusers_kind, sampler) = match kind {
            "down" if half == "encoder" => (i, "down_blocks", "downsamplers"),
            "up" if half == "decoder" && i < ups => (ups - 1 - i, "up_blocks", "upsamplers"),
            _ => return None,
        };
        let inner = if let Some(r) = r.strip_prefix("block.") {
            let (j, r) = r.split_once('.')?;
            format!("resnets.{}.{}", j.parse::<u64>().ok()?, resnet(r))
        } else if let Some(r) = r
            .strip_prefix("downsample.")
            .or(r.strip_prefix("upsample."))
        {
            format!("{sampler}.0.{r}")
        } else {
            return None;
        };
        format!("{diffusers_kind}.{block}.{inner}")
    };
    Some(format!("{half}.{mapped}"))
}

fn resnet(r: &str) -> String {
    match r.strip_prefix("nin_shortcut.") {
        Some(p) => format!("conv_shortcut.{p}"),
        None => r.to_string(),
    }
}

fn attention(r: &str) -> Option<String> {
    ATTENTION
        .iter()
        .find_map(|(from, to)| r.strip_prefix(from).map(|p| format!("{to}{p}")))
}

/// One diffusers name in LDM spelling; `ups` is the decoder's number of up blocks.
fn diffusers_to_ldm(name: &str, ups: u64) -> String {
    let Some((half, rest)) = name.split_once('.') else {
        return name.to_string();
    };
    if !matches!(half, "encoder" | "decoder") {
        return name.to_string();
    }
    let unresnet = |r: &str| match r.strip_prefix("conv_shortcut.") {
        Some(p) => format!("nin_shortcut.{p}"),
        None => r.to_string(),
    };
    let mapped = if let Some(r) = rest.strip_prefix("conv_norm_out.") {
        format!("norm_out.{r}")
    } else if let Some(r) = rest.strip_prefix("mid_block.resnets.") {
        let (j, r) = r.split_once('.').unwrap_or((r, ""));
        let block = if j == "0" { "block_1" } else { "block_2" };
        format!("mid.{block}.{}", unresnet(r))
    } else if let Some(r) = rest.strip_prefix("mid_block.attentions.0.") {
        let attn = ATTENTION
            .iter()
            .find_map(|(from, to)| r.strip_prefix(to).map(|p| format!("{from}{p}")))
            .unwrap_or_else(|| r.to_string());
        format!("mid.attn_1.{attn}")
    } else if let Some((kind, r)) = rest
        .strip_prefix("down_blocks.")
        .map(|r| ("down", r))
        .or_else(|| rest.strip_prefix("up_blocks.").map(|r| ("up", r)))
    {
        let (i, r) = r.split_once('.').unwrap_or((r, ""));
        let i: u64 = i.parse().unwrap_or(0);
        let block = if kind == "up" {
            ups.saturating_sub(1 + i)
        } else {
            i
        };
        let inner = if let Some(r) = r.strip_prefix("resnets.") {
            let (j, r) = r.split_once('.').unwrap_or((r, ""));
            format!("block.{j}.{}", unresnet(r))
        } else if let Some(r) = r
            .strip_prefix("downsamplers.0.")
            .or(r.strip_prefix("upsamplers.0."))
        {
            format!("{kind}sample.{r}")
        } else {
            r.to_string()
        };
        format!("{kind}.{block}.{inner}")
    } else {
        rest.to_string()
    };
    format!("{half}.{mapped}")
}

/// `vae/config.json` from the shapes (diffusers names), the Flux VAE's values for the rest.
pub fn infer_config(tensors: &[SourceTensor], what: &str) -> Result<Inferred, LayoutError> {
    let t = ByName::new(what, "VAE", tensors);
    let blocks = t.count("encoder.down_blocks.");
    let ups = t.count("decoder.up_blocks.");
    if blocks == 0 || blocks != ups {
        return Err(t.bad(
            "encoder.down_blocks.0.resnets.0.conv1.weight",
            format!("the encoder has {blocks} down blocks and the decoder {ups} up blocks; they must be as many, and at least one"),
        ));
    }
    let channels = (0..blocks)
        .map(|i| {
            t.dim(
                &format!("encoder.down_blocks.{i}.resnets.0.conv2.weight"),
                4,
                0,
            )
        })
        .collect::<Result<Vec<u64>, _>>()?;
    let layers = t.count("encoder.down_blocks.0.resnets.");
    let latent = t.dim("decoder.conv_in.weight", 4, 1)?;
    let kind = |k: &'static str| vec![k; blocks as usize];
    // FLUX.2's VAE: 2×2 patches normalised by a BatchNorm's statistics, no scale or shift.
    if t.map.contains_key("bn.running_mean") {
        let config = serde_json::json!({
            "_class_name": "AutoencoderKLFlux2",
            "_diffusers_version": "0.42.1",
            "act_fn": "silu",
            "batch_norm_eps": 1e-4,
            "batch_norm_momentum": 0.1,
            "block_out_channels": channels,
            "decoder_block_out_channels": null,
            "down_block_types": kind("DownEncoderBlock2D"),
            "force_upcast": true,
            "in_channels": t.dim("encoder.conv_in.weight", 4, 1)?,
            "latent_channels": latent,
            "layers_per_block": layers,
            "mid_block_add_attention": t.map.contains_key("decoder.mid_block.attentions.0.to_q.weight"),
            "norm_num_groups": 32,
            "out_channels": t.dim("decoder.conv_out.weight", 4, 0)?,
            "patch_size": [2, 2],
            "sample_size": 1024,
            "up_block_types": kind("UpDecoderBlock2D"),
            "use_post_quant_conv": t.map.contains_key("post_quant_conv.weight"),
            "use_quant_conv": t.map.contains_key("quant_conv.weight"),
        });
        return Ok(Inferred {
            config,
            shape_keys: shape_keys().to_vec(),
        });
    }
    let config = serde_json::json!({
        "_class_name": "AutoencoderKL",
        "_diffusers_version": "0.42.1",
        "act_fn": "silu",
        "block_out_channels": channels,
        "down_block_types": kind("DownEncoderBlock2D"),
        "force_upcast": true,
        "in_channels": t.dim("encoder.conv_in.weight", 4, 1)?,
        "latent_channels": latent,
        "latents_mean": null,
        "latents_std": null,
        "layers_per_block": layers,
        "mid_block_add_attention": t.map.contains_key("decoder.mid_block.attentions.0.to_q.weight"),
        "norm_num_groups": 32,
        "out_channels": t.dim("decoder.conv_out.weight", 4, 0)?,
        "sample_size": 1024,
        "scaling_factor": 0.3611,
        "shift_factor": 0.1159,
        "up_block_types": kind("UpDecoderBlock2D"),
        "use_post_quant_conv": t.map.contains_key("post_quant_conv.weight"),
        "use_quant_conv": t.map.contains_key("quant_conv.weight"),
    });
    Ok(Inferred {
        config,
        shape_keys: shape_keys().to_vec(),
    })
}

/// The VAE config keys the shapes tell, each with the tensor that tells it.
fn shape_keys() -> [(&'static str, String); 8] {
    [
        (
            "block_out_channels",
            "encoder.down_blocks.N.resnets.0.conv2.weight",
        ),
        ("in_channels", "encoder.conv_in.weight"),
        ("latent_channels", "decoder.conv_in.weight"),
        ("layers_per_block", "encoder.down_blocks.0.resnets.N"),
        (
            "mid_block_add_attention",
            "decoder.mid_block.attentions.0.to_q.weight",
        ),
        ("out_channels", "decoder.conv_out.weight"),
        ("use_post_quant_conv", "post_quant_conv.weight"),
        ("use_quant_conv", "quant_conv.weight"),
    ]
    .map(|(k, t)| (k, t.to_string()))
}

/// The LDM layout of stored (diffusers-named) tensors; attention weights become 1×1 convolutions.
pub fn to_original(tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
    let ups = (0..)
        .take_while(|i| {
            let p = format!("decoder.up_blocks.{i}.");
            tensors.iter().any(|(n, _)| n.starts_with(&p))
        })
        .count() as u64;
    tensors
        .iter()
        .map(|(name, shape)| {
            let conv =
                name.contains(".attentions.0.to_") && name.ends_with(".weight") && shape.len() == 2;
            let mut shape = shape.clone();
            if conv {
                shape.extend([1, 1]);
            }
            Joined {
                name: diffusers_to_ldm(name, ups),
                shape,
                parts: vec![name.clone()],
                roll_rows: 0,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldm_names_map_both_ways() {
        let ups = 4;
        for (ldm, diffusers) in [
            (
                "encoder.down.2.block.0.nin_shortcut.weight",
                "encoder.down_blocks.2.resnets.0.conv_shortcut.weight",
            ),
            (
                "encoder.down.0.downsample.conv.bias",
                "encoder.down_blocks.0.downsamplers.0.conv.bias",
            ),
            (
                "decoder.up.3.block.1.conv2.weight",
                "decoder.up_blocks.0.resnets.1.conv2.weight",
            ),
            (
                "decoder.up.1.upsample.conv.weight",
                "decoder.up_blocks.2.upsamplers.0.conv.weight",
            ),
            (
                "decoder.mid.block_2.norm1.bias",
                "decoder.mid_block.resnets.1.norm1.bias",
            ),
            (
                "encoder.mid.attn_1.proj_out.weight",
                "encoder.mid_block.attentions.0.to_out.0.weight",
            ),
            (
                "encoder.mid.attn_1.norm.bias",
                "encoder.mid_block.attentions.0.group_norm.bias",
            ),
            (
                "decoder.mid.attn_1.q.bias",
                "decoder.mid_block.attentions.0.to_q.bias",
            ),
            ("decoder.norm_out.weight", "decoder.conv_norm_out.weight"),
            ("encoder.conv_in.weight", "encoder.conv_in.weight"),
            ("quant_conv.weight", "quant_conv.weight"),
        ] {
            assert_eq!(
                ldm_to_diffusers(ldm, ups).as_deref(),
                Some(diffusers),
                "{ldm}"
            );
            assert_eq!(diffusers_to_ldm(diffusers, ups), ldm, "{diffusers}");
        }
        assert_eq!(
            ldm_to_diffusers("decoder.up.4.block.0.conv1.weight", ups),
            None
        );
        assert_eq!(ldm_to_diffusers("encoder.bogus.weight", ups), None);
    }
}
