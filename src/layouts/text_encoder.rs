//! The Qwen3 text encoder: transformers' names under `model.` (diffusers' `text_encoder/`,
//! ComfyUI's `qwen_3_4b.safetensors`), or the same names without the prefix.
//!
//! The pipeline reads the hidden states, so a language-model head (`lm_head.weight`) is left out.
//!
//! A Qwen3-VL checkpoint in transformers' names (`model.language_model.*`, `model.visual.*`) is
//! kept as it is; its config nests the language model's under `text_config`, read off the
//! shapes where they tell it and Qwen3-VL-8B's values elsewhere.

use crate::mapping::{sample, ByName, Inferred, Joined, Layout, LayoutError, Mapped};
use crate::store::SourceTensor;

const EXPECTED: &str = "Qwen3 names (`model.embed_tokens.weight`, `model.layers.N.self_attn.q_proj.weight`, …), with or without the `model.` prefix, or Qwen3-VL's (`model.language_model.embed_tokens.weight`, …)";

/// The token table of a Qwen3-VL checkpoint in transformers' names, whose language model sits
/// under `model.language_model.` beside the vision tower's `model.visual.`.
const VL_EMBED: &str = "model.language_model.embed_tokens.weight";

pub fn to_diffusers(tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    if tensors.iter().any(|t| t.name == VL_EMBED) {
        return vision_language(tensors, what);
    }
    let prefixed = tensors
        .iter()
        .any(|t| t.name == "model.embed_tokens.weight");
    let bare = tensors.iter().any(|t| t.name == "embed_tokens.weight");
    let layout = match (prefixed, bare) {
        (true, false) => Layout::Diffusers,
        (false, true) => Layout::Original,
        _ => {
            return Err(LayoutError::Unknown {
                what: what.to_string(),
                component: "text encoder",
                expected: EXPECTED,
                found: sample(&tensors),
            })
        }
    };
    let mut dropped = Vec::new();
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let name = match layout {
            Layout::Diffusers => t.name.clone(),
            Layout::Original => format!("model.{}", t.name),
        };
        if name == "model.lm_head.weight" || name == "lm_head.weight" {
            dropped.push(t.name.clone());
            continue;
        }
        out.push(crate::mapping::renamed(&t, name, None));
    }
    let inferred = infer_config(&out, what)?;
    Ok(Mapped::new(
        crate::mapping::Component::TextEncoder,
        layout,
        out,
        inferred,
        dropped,
    ))
}

/// `text_encoder/config.json` from the shapes, Qwen3-4B's values for the rest.
pub fn infer_config(tensors: &[SourceTensor], what: &str) -> Result<Inferred, LayoutError> {
    let t = ByName::new(what, "text encoder", tensors);
    let vocab = t.dim("model.embed_tokens.weight", 2, 0)?;
    let hidden = t.dim("model.embed_tokens.weight", 2, 1)?;
    let norm = "model.layers.0.self_attn.q_norm.weight";
    let head_dim = t.dim(norm, 1, 0)?;
    let q = t.dim("model.layers.0.self_attn.q_proj.weight", 2, 0)?;
    let kv = t.dim("model.layers.0.self_attn.k_proj.weight", 2, 0)?;
    if head_dim == 0 || q % head_dim != 0 || kv % head_dim != 0 {
        return Err(t.bad(
            norm,
            format!("gives a head size of {head_dim}, which does not divide the projections ({q}, {kv} rows)"),
        ));
    }
    let k_norm = "model.layers.0.self_attn.k_norm.weight";
    if t.map.contains_key(k_norm) && t.dim(k_norm, 1, 0)? != head_dim {
        return Err(t.bad(
            k_norm,
            format!(
                "has {} weights, but the query norm gives a head size of {head_dim}",
                t.dim(k_norm, 1, 0)?
            ),
        ));
    }
    let layers = t.count("model.layers.");
    let intermediate = t.dim("model.layers.0.mlp.gate_proj.weight", 2, 0)?;
    let config = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "max_position_embeddings": 40960,
        "model_type": "qwen3",
        "num_attention_heads": q / head_dim,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv / head_dim,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "tie_word_embeddings": true,
        "use_sliding_window": false,
        "vocab_size": vocab,
    });
    let embed = "model.embed_tokens.weight";
    let shape_keys = [
        ("vocab_size", embed),
        ("hidden_size", embed),
        ("head_dim", norm),
        (
            "num_attention_heads",
            "model.layers.0.self_attn.q_proj.weight",
        ),
        (
            "num_key_value_heads",
            "model.layers.0.self_attn.k_proj.weight",
        ),
        ("num_hidden_layers", "model.layers.N"),
        ("intermediate_size", "model.layers.0.mlp.gate_proj.weight"),
    ];
    Ok(Inferred {
        config,
        shape_keys: shape_keys.map(|(k, t)| (k, t.to_string())).to_vec(),
    })
}

/// A Qwen3-VL checkpoint's tensors, named as they are (the head left out), with its config.
fn vision_language(tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    let (dropped, kept): (Vec<SourceTensor>, Vec<SourceTensor>) =
        (tensors.into_iter()).partition(|t| t.name == "lm_head.weight");
    // The language model's shapes under the names the Qwen3 reading expects.
    let language: Vec<SourceTensor> = (kept.iter())
        .filter_map(|t| {
            let rest = t.name.strip_prefix("model.language_model.")?;
            Some(crate::mapping::renamed(t, format!("model.{rest}"), None))
        })
        .collect();
    let text = infer_config(&language, what)?.config;
    let mut text_config = serde_json::json!({
        "attention_bias": false,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_vl_text",
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "mrope_interleaved": true,
            "mrope_section": [24, 20, 20],
            "rope_theta": 5000000.0,
            "rope_type": "default",
        },
        "vocab_size": text["vocab_size"],
    });
    for key in [
        "head_dim",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_hidden_layers",
        "num_key_value_heads",
    ] {
        text_config[key] = text[key].clone();
    }
    let config = serde_json::json!({
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": text_config,
        "tie_word_embeddings": true,
    });
    Ok(Mapped::new(
        crate::mapping::Component::TextEncoder,
        Layout::Diffusers,
        kept,
        // The shapes tell nested values only, which a file's own config is not checked
        // against here: building the encoder checks them.
        Inferred {
            config,
            shape_keys: Vec::new(),
        },
        dropped.into_iter().map(|t| t.name).collect(),
    ))
}

/// ComfyUI keeps transformers' `model.`-prefixed names: the stored names as they are.
pub fn to_original(tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
    tensors
        .iter()
        .map(|(name, shape)| Joined {
            name: name.clone(),
            shape: shape.clone(),
            parts: vec![name.clone()],
            roll_rows: 0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Encoding;

    fn tensor(name: &str, shape: &[u64]) -> SourceTensor {
        SourceTensor {
            component: "text_encoder".into(),
            name: name.into(),
            dtype: crate::safetensors::Dtype::BF16,
            shape: shape.to_vec(),
            file: "te.safetensors".into(),
            offset: 0,
            nbytes: 2 * shape.iter().product::<u64>(),
            encoding: Encoding::Plain,
            roll: 0,
        }
    }

    /// A Qwen3-VL checkpoint keeps its names (the vision tower's too), leaves the head out, and
    /// nests the language model's shapes under `text_config`.
    #[test]
    fn a_vision_language_checkpoint_keeps_its_names_and_nests_its_config() {
        let lm = "model.language_model.";
        let mut tensors = vec![
            tensor(&format!("{lm}embed_tokens.weight"), &[1000, 64]),
            tensor(&format!("{lm}norm.weight"), &[64]),
            tensor("model.visual.patch_embed.proj.weight", &[16, 3, 2, 16, 16]),
            tensor("lm_head.weight", &[1000, 64]),
        ];
        for layer in 0..3 {
            let at = |n: &str| format!("{lm}layers.{layer}.{n}.weight");
            tensors.extend([
                tensor(&at("self_attn.q_proj"), &[128, 64]),
                tensor(&at("self_attn.k_proj"), &[32, 64]),
                tensor(&at("self_attn.q_norm"), &[16]),
                tensor(&at("self_attn.k_norm"), &[16]),
                tensor(&at("mlp.gate_proj"), &[96, 64]),
            ]);
        }
        let mapped = to_diffusers(tensors, "te.safetensors").unwrap();
        assert_eq!(mapped.layout, Layout::Diffusers);
        assert_eq!(mapped.dropped, ["lm_head.weight"]);
        assert!(mapped
            .tensors
            .iter()
            .any(|t| t.name.starts_with("model.visual.")));
        assert!(mapped.tensors.iter().all(|t| t.name.starts_with("model.")));
        let text = &mapped.config["text_config"];
        assert_eq!(mapped.config["model_type"], "qwen3_vl");
        for (key, value) in [
            ("hidden_size", 64),
            ("head_dim", 16),
            ("num_attention_heads", 8),
            ("num_key_value_heads", 2),
            ("num_hidden_layers", 3),
            ("intermediate_size", 96),
            ("vocab_size", 1000),
        ] {
            assert_eq!(text[key], value, "{key}");
        }
    }
}
