//! The text encoders: Qwen3 in transformers' names under `model.` (diffusers' `text_encoder/`,
//! ComfyUI's `qwen_3_4b.safetensors`) or the same names without the prefix; CLIP's text model
//! (ComfyUI's `clip_l.safetensors`); and, as a pipeline's second text encoder, T5's encoder in
//! transformers' names (`t5xxl_fp16.safetensors`) or llama.cpp's (a GGUF file).
//!
//! The pipeline reads the hidden states, so a language-model head (`lm_head.weight`) is left out.
//!
//! A Qwen3-VL checkpoint in transformers' names (`model.language_model.*`, `model.visual.*`) is
//! kept as it is; its config nests the language model's under `text_config`, read off the
//! shapes where they tell it and Qwen3-VL-8B's values elsewhere.
//!
//! CLIP's and T5's files keep transformers' names, which diffusers' folders use too; their
//! configs come from the shapes, CLIP ViT-L/14's and T5 v1.1 XXL's values for the rest. CLIP's
//! head count is in no shape: a width of 768 is CLIP-L's 12 heads, any other width needs a config
//! the model gives. An encoder given in the other encoder's place is refused, saying which it is.

use crate::mapping::{
    renamed, sample, ByName, Component, Inferred, Joined, Layout, LayoutError, Mapped, Untold,
};
use crate::store::SourceTensor;

const EXPECTED: &str = "Qwen3 names (`model.embed_tokens.weight`, `model.layers.N.self_attn.q_proj.weight`, …), with or without the `model.` prefix, Qwen3-VL's (`model.language_model.embed_tokens.weight`, …) or CLIP's text model (`text_model.encoder.layers.N.self_attn.q_proj.weight`, …)";

const EXPECTED_2: &str = "T5's encoder in transformers' names (`encoder.block.N.layer.0.SelfAttention.q.weight`, `shared.weight`, …) or llama.cpp's (`enc.blk.N.attn_q.weight`, `token_embd.weight`, …)";

/// The token table of a Qwen3-VL checkpoint in transformers' names, whose language model sits
/// under `model.language_model.` beside the vision tower's `model.visual.`.
const VL_EMBED: &str = "model.language_model.embed_tokens.weight";

/// Which text encoder a file holds, told from its names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoder {
    /// CLIP's text model, transformers' names.
    Clip,
    /// T5's encoder, transformers' names.
    T5,
    /// T5's encoder, llama.cpp's names (a GGUF file).
    T5Gguf,
    /// Anything else: read as Qwen3.
    Other,
}

impl Encoder {
    fn of(tensors: &[SourceTensor]) -> Encoder {
        let has = |p: &str| tensors.iter().any(|t| t.name.starts_with(p));
        if has("text_model.encoder.layers.") || has("text_model.embeddings.") {
            Encoder::Clip
        } else if has("encoder.block.") {
            Encoder::T5
        } else if has("enc.blk.") {
            Encoder::T5Gguf
        } else {
            Encoder::Other
        }
    }

    /// What the file is, for a refusal.
    fn describe(self) -> &'static str {
        match self {
            Encoder::Clip => "CLIP's text model (`text_model.encoder.layers.N.…`)",
            Encoder::T5 => "T5's encoder (`encoder.block.N.…`)",
            Encoder::T5Gguf => "T5's encoder in llama.cpp's names (`enc.blk.N.…`)",
            Encoder::Other => "a Qwen3 text encoder",
        }
    }
}

/// The refusal of an encoder given in the other encoder's place.
fn wrong_slot(what: &str, found: Encoder, component: Component) -> LayoutError {
    LayoutError::WrongSlot {
        what: what.to_string(),
        found: found.describe(),
        flag: component.flag(),
    }
}

/// A pipeline's (first) text encoder: Qwen3 or CLIP's text model.
pub fn to_diffusers(tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    match Encoder::of(&tensors) {
        Encoder::Clip => return clip(tensors, what),
        found @ (Encoder::T5 | Encoder::T5Gguf) => {
            return Err(wrong_slot(what, found, Component::TextEncoder2))
        }
        Encoder::Other => {}
    }
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

/// CLIP's text model in transformers' names, as diffusers' `text_encoder/` holds it; a
/// `text_projection` (a `CLIPTextModelWithProjection` save) and the `position_ids` buffer of
/// older saves are left out.
fn clip(tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    let unused = |n: &str| n == "text_projection.weight" || n.ends_with("embeddings.position_ids");
    let projection = (tensors.iter())
        .find(|t| t.name == "text_projection.weight")
        .and_then(|t| t.shape.first().copied());
    let (dropped, kept): (Vec<SourceTensor>, Vec<SourceTensor>) =
        (tensors.into_iter()).partition(|t| unused(&t.name));
    let (inferred, untold) = clip_config(&kept, projection, what)?;
    let mapped = Mapped::new(
        Component::TextEncoder,
        Layout::Diffusers,
        kept,
        inferred,
        dropped.into_iter().map(|t| t.name).collect(),
    );
    Ok(mapped.with_untold(untold))
}

/// CLIP-L's head count, for its width: the one head count a width of 768 is taken to have.
const CLIP_L: (u64, u64) = (768, 12);

/// `text_encoder/config.json` of a CLIP text model from the shapes, CLIP ViT-L/14's values (as
/// FLUX's `text_encoder/` gives them) for the rest; the head count, which no shape tells, is
/// CLIP-L's for its width and left to a given config for any other.
fn clip_config(
    tensors: &[SourceTensor],
    projection: Option<u64>,
    what: &str,
) -> Result<(Inferred, Vec<Untold>), LayoutError> {
    let t = ByName::new(what, "text encoder", tensors);
    let tokens = "text_model.embeddings.token_embedding.weight";
    let positions = "text_model.embeddings.position_embedding.weight";
    let fc1 = "text_model.encoder.layers.0.mlp.fc1.weight";
    let hidden = t.dim(tokens, 2, 1)?;
    let mut config = serde_json::json!({
        "architectures": ["CLIPTextModel"],
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "dropout": 0.0,
        "eos_token_id": 2,
        "hidden_act": "quick_gelu",
        "hidden_size": hidden,
        "initializer_factor": 1.0,
        "initializer_range": 0.02,
        "intermediate_size": t.dim(fc1, 2, 0)?,
        "layer_norm_eps": 1e-5,
        "max_position_embeddings": t.dim(positions, 2, 0)?,
        "model_type": "clip_text_model",
        "num_hidden_layers": t.count("text_model.encoder.layers."),
        "pad_token_id": 1,
        "projection_dim": projection.unwrap_or(CLIP_L.0),
        "vocab_size": t.dim(tokens, 2, 0)?,
    });
    let mut untold = Vec::new();
    match hidden == CLIP_L.0 {
        true => config["num_attention_heads"] = CLIP_L.1.into(),
        false => untold.push(Untold {
            key: "num_attention_heads",
            tensor: tokens.to_string(),
            reason: format!(
                "gives a width of {hidden}, not CLIP-L's {}, and no shape says how many heads it has",
                CLIP_L.0
            ),
        }),
    }
    let mut shape_keys = vec![
        ("hidden_size", tokens),
        ("vocab_size", tokens),
        ("max_position_embeddings", positions),
        ("intermediate_size", fc1),
        ("num_hidden_layers", "text_model.encoder.layers.N"),
    ];
    if projection.is_some() {
        shape_keys.push(("projection_dim", "text_projection.weight"));
    }
    let inferred = Inferred {
        config,
        shape_keys: (shape_keys.into_iter())
            .map(|(k, t)| (k, t.to_string()))
            .collect(),
    };
    Ok((inferred, untold))
}

/// A pipeline's second text encoder: T5's encoder in transformers' names, or in llama.cpp's
/// (a GGUF file's, renamed to transformers'); a decoder, a language-model head and a second
/// copy of the token table are left out.
pub fn second_to_diffusers(tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    let (layout, tensors) = match Encoder::of(&tensors) {
        Encoder::T5 => (Layout::Diffusers, tensors),
        Encoder::T5Gguf => (Layout::Original, from_llama_cpp(tensors, what)?),
        Encoder::Clip => return Err(wrong_slot(what, Encoder::Clip, Component::TextEncoder)),
        Encoder::Other => {
            let qwen = |n: &str| {
                n == "model.embed_tokens.weight" || n == "embed_tokens.weight" || n == VL_EMBED
            };
            if tensors.iter().any(|t| qwen(&t.name)) {
                return Err(wrong_slot(what, Encoder::Other, Component::TextEncoder));
            }
            return Err(LayoutError::Unknown {
                what: what.to_string(),
                component: "second text encoder",
                expected: EXPECTED_2,
                found: sample(&tensors),
            });
        }
    };
    // The token table is `shared.weight`, which saves tie `encoder.embed_tokens.weight` to: one
    // is kept, under diffusers' name.
    let shared = tensors.iter().any(|t| t.name == "shared.weight");
    let mut dropped = Vec::new();
    let mut kept = Vec::with_capacity(tensors.len());
    for t in tensors {
        let name = t.name.as_str();
        if name == "encoder.embed_tokens.weight" && !shared {
            kept.push(renamed(&t, "shared.weight".into(), None));
        } else if name == "encoder.embed_tokens.weight"
            || name.starts_with("decoder.")
            || name.starts_with("lm_head.")
        {
            dropped.push(t.name);
        } else {
            kept.push(t);
        }
    }
    let inferred = t5_config(&kept, what)?;
    Ok(Mapped::new(
        Component::TextEncoder2,
        layout,
        kept,
        inferred,
        dropped,
    ))
}

/// llama.cpp's T5 encoder names (`gguf` 0.19's `MODEL_ARCH.T5ENCODER`) and transformers' for
/// the same tensors; a block's after `enc.blk.N.` and `encoder.block.N.layer.`.
const LLAMA_CPP_BLOCK: [(&str, &str); 10] = [
    ("attn_norm", "0.layer_norm"),
    ("attn_q", "0.SelfAttention.q"),
    ("attn_k", "0.SelfAttention.k"),
    ("attn_v", "0.SelfAttention.v"),
    ("attn_o", "0.SelfAttention.o"),
    ("attn_rel_b", "0.SelfAttention.relative_attention_bias"),
    ("ffn_norm", "1.layer_norm"),
    ("ffn_gate", "1.DenseReluDense.wi_0"),
    ("ffn_up", "1.DenseReluDense.wi_1"),
    ("ffn_down", "1.DenseReluDense.wo"),
];

/// One llama.cpp T5 name in transformers' spelling (`None`: no tensor of T5's encoder).
fn llama_cpp_name(name: &str) -> Option<String> {
    let module = name.strip_suffix(".weight")?;
    let renamed = match module {
        "token_embd" => "shared".to_string(),
        "enc.output_norm" => "encoder.final_layer_norm".to_string(),
        // The head of an encoder–decoder file, which the encoder does not use.
        "output" => "lm_head".to_string(),
        _ => {
            let (block, layer) = module.strip_prefix("enc.blk.")?.split_once('.')?;
            block.parse::<u64>().ok()?;
            let (_, ours) = LLAMA_CPP_BLOCK.iter().find(|(l, _)| *l == layer)?;
            format!("encoder.block.{block}.layer.{ours}")
        }
    };
    Some(format!("{renamed}.weight"))
}

/// A llama.cpp T5 file's tensors under transformers' names; its decoder's (`dec.`) are left to
/// be dropped as transformers' decoder is.
fn from_llama_cpp(
    tensors: Vec<SourceTensor>,
    what: &str,
) -> Result<Vec<SourceTensor>, LayoutError> {
    (tensors.into_iter())
        .map(|t| {
            if let Some(rest) = t.name.strip_prefix("dec.") {
                return Ok(renamed(&t, format!("decoder.{rest}"), None));
            }
            match llama_cpp_name(&t.name) {
                Some(name) => Ok(renamed(&t, name, None)),
                None => Err(LayoutError::Tensor {
                    what: what.to_string(),
                    tensor: t.name.clone(),
                    reason: "is no tensor of T5's encoder in llama.cpp's names".into(),
                }),
            }
        })
        .collect()
}

/// `text_encoder_2/config.json` of T5's encoder from the shapes (the head count and bucket
/// count from block 0's relative attention table, `[buckets, heads]`), T5 v1.1 XXL's values
/// for the rest (the longest relative distance 128).
fn t5_config(tensors: &[SourceTensor], what: &str) -> Result<Inferred, LayoutError> {
    let t = ByName::new(what, "second text encoder", tensors);
    let shared = "shared.weight";
    let bias = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";
    let q = "encoder.block.0.layer.0.SelfAttention.q.weight";
    let wi = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight";
    let heads = t.dim(bias, 2, 1)?;
    let inner = t.dim(q, 2, 0)?;
    if heads == 0 || inner % heads != 0 {
        return Err(t.bad(
            q,
            format!("has {inner} rows, which the {heads} heads of `{bias}` do not divide"),
        ));
    }
    let layers = t.count("encoder.block.");
    let config = serde_json::json!({
        "architectures": ["T5EncoderModel"],
        "classifier_dropout": 0.0,
        "d_ff": t.dim(wi, 2, 0)?,
        "d_kv": inner / heads,
        "d_model": t.dim(shared, 2, 1)?,
        "decoder_start_token_id": 0,
        "dense_act_fn": "gelu_new",
        "dropout_rate": 0.1,
        "eos_token_id": 1,
        "feed_forward_proj": "gated-gelu",
        "initializer_factor": 1.0,
        "is_encoder_decoder": true,
        "is_gated_act": true,
        "layer_norm_epsilon": 1e-6,
        "model_type": "t5",
        "num_decoder_layers": layers,
        "num_heads": heads,
        "num_layers": layers,
        "pad_token_id": 0,
        "relative_attention_max_distance": 128,
        "relative_attention_num_buckets": t.dim(bias, 2, 0)?,
        "tie_word_embeddings": false,
        "vocab_size": t.dim(shared, 2, 0)?,
    });
    let shape_keys = [
        ("d_ff", wi),
        ("d_kv", q),
        ("d_model", shared),
        ("num_heads", bias),
        ("num_layers", "encoder.block.N"),
        ("relative_attention_num_buckets", bias),
        ("vocab_size", shared),
    ];
    Ok(Inferred {
        config,
        shape_keys: shape_keys.map(|(k, t)| (k, t.to_string())).to_vec(),
    })
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

    fn encoder(names: &[(&str, &[u64])]) -> Vec<SourceTensor> {
        names.iter().map(|(n, s)| tensor(n, s)).collect()
    }

    /// CLIP-L's shapes (12 layers of width 768 cut to 2), with a projection and the old
    /// `position_ids` buffer, which are left out.
    fn clip_l(hidden: u64) -> Vec<SourceTensor> {
        let mut names: Vec<(String, Vec<u64>)> = vec![
            (
                "text_model.embeddings.token_embedding.weight".into(),
                vec![49408, hidden],
            ),
            (
                "text_model.embeddings.position_embedding.weight".into(),
                vec![77, hidden],
            ),
            ("text_model.embeddings.position_ids".into(), vec![1, 77]),
            ("text_model.final_layer_norm.weight".into(), vec![hidden]),
            ("text_projection.weight".into(), vec![hidden, hidden]),
        ];
        for l in 0..2 {
            let at = |n: &str| format!("text_model.encoder.layers.{l}.{n}");
            names.push((at("self_attn.q_proj.weight"), vec![hidden, hidden]));
            names.push((at("mlp.fc1.weight"), vec![4 * hidden, hidden]));
            names.push((at("mlp.fc2.weight"), vec![hidden, 4 * hidden]));
        }
        names.iter().map(|(n, s)| tensor(n, s)).collect()
    }

    #[test]
    fn clip_keeps_its_names_and_reads_its_config_off_the_shapes() {
        let mapped = to_diffusers(clip_l(768), "clip_l.safetensors").unwrap();
        assert_eq!(mapped.component, Component::TextEncoder);
        let mut dropped = mapped.dropped.clone();
        dropped.sort();
        assert_eq!(
            dropped,
            [
                "text_model.embeddings.position_ids",
                "text_projection.weight"
            ]
        );
        assert!(mapped
            .tensors
            .iter()
            .all(|t| t.name.starts_with("text_model.")));
        let c = &mapped.config;
        for (key, value) in [
            ("hidden_size", 768),
            ("num_attention_heads", 12),
            ("num_hidden_layers", 2),
            ("intermediate_size", 3072),
            ("max_position_embeddings", 77),
            ("vocab_size", 49408),
            ("projection_dim", 768),
            ("eos_token_id", 2),
        ] {
            assert_eq!(c[key], value, "{key}");
        }
        assert!(mapped.untold.is_empty());
        // Another width's heads are in no shape: a given config must say them.
        let mapped = to_diffusers(clip_l(48), "small.safetensors").unwrap();
        assert!(mapped.config.get("num_attention_heads").is_none());
        assert_eq!(mapped.untold[0].key, "num_attention_heads");
    }

    /// T5 v1.1's shapes at a small width: 4 heads of 12, 20 buckets, a gated feed-forward.
    fn t5(names: &dyn Fn(&str) -> String, embed: &[&str]) -> Vec<SourceTensor> {
        let mut out: Vec<(String, Vec<u64>)> = embed
            .iter()
            .map(|e| (e.to_string(), vec![320, 40]))
            .collect();
        out.push((names("encoder.final_layer_norm.weight"), vec![40]));
        out.push((
            names("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
            vec![20, 4],
        ));
        for b in 0..3 {
            let at = |n: &str| names(&format!("encoder.block.{b}.layer.{n}"));
            for p in ["q", "k", "v"] {
                out.push((at(&format!("0.SelfAttention.{p}.weight")), vec![48, 40]));
            }
            out.push((at("0.SelfAttention.o.weight"), vec![40, 48]));
            out.push((at("0.layer_norm.weight"), vec![40]));
            out.push((at("1.layer_norm.weight"), vec![40]));
            for p in ["wi_0", "wi_1"] {
                out.push((at(&format!("1.DenseReluDense.{p}.weight")), vec![72, 40]));
            }
            out.push((at("1.DenseReluDense.wo.weight"), vec![40, 72]));
        }
        out.iter().map(|(n, s)| tensor(n, s)).collect()
    }

    fn t5_checked(mapped: &Mapped) {
        assert_eq!(mapped.component, Component::TextEncoder2);
        let c = &mapped.config;
        for (key, value) in [
            ("d_model", 40),
            ("d_kv", 12),
            ("d_ff", 72),
            ("num_heads", 4),
            ("num_layers", 3),
            ("relative_attention_num_buckets", 20),
            ("relative_attention_max_distance", 128),
            ("vocab_size", 320),
        ] {
            assert_eq!(c[key], value, "{key}");
        }
        let parsed: crate::models::t5::T5Config = serde_json::from_value(c.clone()).unwrap();
        parsed.validate().unwrap();
        assert!(mapped.tensors.iter().any(|t| t.name == "shared.weight"));
        assert!(!(mapped.tensors.iter()).any(|t| t.name == "encoder.embed_tokens.weight"));
    }

    #[test]
    fn t5_reads_its_config_off_the_shapes_and_keeps_one_token_table() {
        let same = |n: &str| n.to_string();
        let both = t5(&same, &["shared.weight", "encoder.embed_tokens.weight"]);
        let mapped = second_to_diffusers(both, "t5xxl_fp16.safetensors").unwrap();
        assert_eq!(mapped.layout, Layout::Diffusers);
        assert_eq!(mapped.dropped, ["encoder.embed_tokens.weight"]);
        t5_checked(&mapped);
        let only_encoder = t5(&same, &["encoder.embed_tokens.weight"]);
        let mapped = second_to_diffusers(only_encoder, "t5.safetensors").unwrap();
        assert!(mapped.dropped.is_empty());
        t5_checked(&mapped);
    }

    /// llama.cpp's names (`gguf`'s `MODEL_ARCH.T5ENCODER`) become transformers' one for one.
    #[test]
    fn llama_cpp_names_are_t5s() {
        let llama_cpp = |n: &str| -> String {
            let table = [
                ("layer.0.layer_norm", "attn_norm"),
                ("layer.0.SelfAttention.q", "attn_q"),
                ("layer.0.SelfAttention.k", "attn_k"),
                ("layer.0.SelfAttention.v", "attn_v"),
                ("layer.0.SelfAttention.o", "attn_o"),
                (
                    "layer.0.SelfAttention.relative_attention_bias",
                    "attn_rel_b",
                ),
                ("layer.1.layer_norm", "ffn_norm"),
                ("layer.1.DenseReluDense.wi_0", "ffn_gate"),
                ("layer.1.DenseReluDense.wi_1", "ffn_up"),
                ("layer.1.DenseReluDense.wo", "ffn_down"),
            ];
            if n == "shared.weight" {
                return "token_embd.weight".into();
            }
            if n == "encoder.final_layer_norm.weight" {
                return "enc.output_norm.weight".into();
            }
            let rest = n.strip_prefix("encoder.block.").unwrap();
            let (b, rest) = rest.split_once('.').unwrap();
            let module = rest.strip_suffix(".weight").unwrap();
            let (_, ours) = table.iter().find(|(t, _)| *t == module).unwrap();
            format!("enc.blk.{b}.{ours}.weight")
        };
        let mut file = t5(&llama_cpp, &["token_embd.weight"]);
        file.push(tensor("output.weight", &[320, 40]));
        let mapped = second_to_diffusers(file, "t5-q8_0.gguf").unwrap();
        assert_eq!(mapped.layout, Layout::Original);
        assert_eq!(mapped.dropped, ["lm_head.weight"]);
        t5_checked(&mapped);
        let same = |n: &str| n.to_string();
        let mut want: Vec<String> = t5(&same, &["shared.weight"])
            .into_iter()
            .map(|t| t.name)
            .collect();
        let mut got: Vec<String> = mapped.tensors.iter().map(|t| t.name.clone()).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want);
        let stranger = encoder(&[("enc.blk.0.attn_qkv.weight", &[3, 3])]);
        let err = second_to_diffusers(stranger, "x.gguf")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`enc.blk.0.attn_qkv.weight` is no tensor of T5"),
            "{err}"
        );
    }

    /// Each encoder in the other's place is refused, saying which it is and where it goes.
    #[test]
    fn an_encoder_in_the_other_place_is_refused() {
        let same = |n: &str| n.to_string();
        let err = to_diffusers(t5(&same, &["shared.weight"]), "`t5xxl_fp16.safetensors`")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "`t5xxl_fp16.safetensors` is T5's encoder (`encoder.block.N.…`), which is given as --text-encoder-2"
        );
        let err = second_to_diffusers(clip_l(768), "`clip_l.safetensors`")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "`clip_l.safetensors` is CLIP's text model (`text_model.encoder.layers.N.…`), which is given as --text-encoder"
        );
        let qwen = encoder(&[("model.embed_tokens.weight", &[10, 4])]);
        let err = second_to_diffusers(qwen, "q").unwrap_err().to_string();
        assert!(err.contains("given as --text-encoder"), "{err}");
    }
}
