//! llama.cpp's tensor names for Qwen3 (`blk.N.attn_q.weight`, `token_embd.weight` …) and the
//! Hugging Face names the text encoder loads (`model.layers.N.self_attn.q_proj.weight` …).
//!
//! llama.cpp's converter renames Qwen3's tensors without permuting any (it permutes q and k
//! only for the LLaMA family's interleaved rotary layout), so the bytes map unchanged.

/// Whether these tensor names are llama.cpp's for a decoder-only model (they name blocks
/// `blk.N`). An encoder's (T5's `enc.blk.N`, which shares `token_embd.weight`) are not: the
/// layout of the component it is given as reads them.
pub fn is_llama_naming<'a>(names: impl Iterator<Item = &'a str>) -> bool {
    let mut llama = false;
    for n in names {
        if n.starts_with("enc.") || n.starts_with("dec.") {
            return false;
        }
        llama |= n.starts_with("blk.") || n == "token_embd.weight" || n == "output_norm.weight";
    }
    llama
}

/// The Hugging Face name of a llama.cpp Qwen3 tensor, `None` for a name it does not know.
pub fn hf_name_for_llama(name: &str) -> Option<String> {
    let (stem, suffix) = name.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let whole = match stem {
        "token_embd" => Some("model.embed_tokens"),
        "output_norm" => Some("model.norm"),
        "output" => Some("lm_head"),
        _ => None,
    };
    if let Some(w) = whole {
        return Some(format!("{w}.{suffix}"));
    }
    let rest = stem.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoders_names_are_not_qwen3s() {
        assert!(is_llama_naming(
            ["token_embd.weight", "blk.0.attn_q.weight"].into_iter()
        ));
        let t5 = [
            "token_embd.weight",
            "enc.blk.0.attn_q.weight",
            "enc.output_norm.weight",
        ];
        assert!(!is_llama_naming(t5.into_iter()));
    }

    #[test]
    fn maps_qwen3_names() {
        let m = |n| hf_name_for_llama(n).unwrap();
        assert_eq!(m("token_embd.weight"), "model.embed_tokens.weight");
        assert_eq!(
            m("blk.7.attn_q.weight"),
            "model.layers.7.self_attn.q_proj.weight"
        );
        assert_eq!(
            m("blk.0.attn_k_norm.weight"),
            "model.layers.0.self_attn.k_norm.weight"
        );
        assert_eq!(
            m("blk.35.ffn_down.weight"),
            "model.layers.35.mlp.down_proj.weight"
        );
        assert_eq!(
            m("blk.1.ffn_norm.weight"),
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert_eq!(m("output_norm.weight"), "model.norm.weight");
        assert_eq!(hf_name_for_llama("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name_for_llama("blk.0.ssm_a"), None);
    }
}
