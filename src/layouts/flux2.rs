//! The FLUX.2 transformer's original (BFL) names for its linear layers, against diffusers'
//! `Flux2Transformer2DModel` names, which the store and the pipeline use (klein-spec §10.4).
//!
//! Most layers are renamed only. Two kinds hold several diffusers layers in their rows: a
//! double block's fused `img_attn.qkv` / `txt_attn.qkv` (q's rows, then k's, then v's), and the
//! final layer's `adaLN_modulation.1`, whose rows are shift then scale where diffusers'
//! `norm_out.linear` has scale then shift.

/// Which rows of an original layer a diffusers layer holds: the original's rows cut into `of`
/// equal parts, and these parts in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub of: u64,
    pub parts: &'static [u64],
}

impl Rows {
    /// All rows, in order.
    pub const WHOLE: Rows = Rows { of: 1, parts: &[0] };
    const Q: Rows = Rows { of: 3, parts: &[0] };
    const K: Rows = Rows { of: 3, parts: &[1] };
    const V: Rows = Rows { of: 3, parts: &[2] };
    /// The two halves swapped.
    const SWAPPED: Rows = Rows {
        of: 2,
        parts: &[1, 0],
    };

    /// The row ranges `[start, end)` this takes of an original layer of `rows` rows, in order;
    /// `None` when `rows` does not cut into `of` equal parts.
    pub fn ranges(self, rows: u64) -> Option<Vec<(u64, u64)>> {
        let part = rows.is_multiple_of(self.of).then(|| rows / self.of)?;
        Some(
            self.parts
                .iter()
                .map(|&p| (p * part, (p + 1) * part))
                .collect(),
        )
    }
}

/// A double block's layers: diffusers' name after `transformer_blocks.N.`, the original's after
/// `double_blocks.N.`.
const DOUBLE: [(&str, &str, Rows); 12] = [
    ("attn.to_q", "img_attn.qkv", Rows::Q),
    ("attn.to_k", "img_attn.qkv", Rows::K),
    ("attn.to_v", "img_attn.qkv", Rows::V),
    ("attn.add_q_proj", "txt_attn.qkv", Rows::Q),
    ("attn.add_k_proj", "txt_attn.qkv", Rows::K),
    ("attn.add_v_proj", "txt_attn.qkv", Rows::V),
    ("attn.to_out.0", "img_attn.proj", Rows::WHOLE),
    ("attn.to_add_out", "txt_attn.proj", Rows::WHOLE),
    ("ff.linear_in", "img_mlp.0", Rows::WHOLE),
    ("ff.linear_out", "img_mlp.2", Rows::WHOLE),
    ("ff_context.linear_in", "txt_mlp.0", Rows::WHOLE),
    ("ff_context.linear_out", "txt_mlp.2", Rows::WHOLE),
];

/// A single block's layers: after `single_transformer_blocks.N.` and `single_blocks.N.`.
const SINGLE: [(&str, &str); 2] = [
    ("attn.to_qkv_mlp_proj", "linear1"),
    ("attn.to_out", "linear2"),
];

/// The layers outside the blocks.
const TOP: [(&str, &str, Rows); 11] = [
    ("x_embedder", "img_in", Rows::WHOLE),
    ("proj_out", "final_layer.linear", Rows::WHOLE),
    ("context_embedder", "txt_in", Rows::WHOLE),
    (
        "time_guidance_embed.timestep_embedder.linear_1",
        "time_in.in_layer",
        Rows::WHOLE,
    ),
    (
        "time_guidance_embed.timestep_embedder.linear_2",
        "time_in.out_layer",
        Rows::WHOLE,
    ),
    (
        "time_guidance_embed.guidance_embedder.linear_1",
        "guidance_in.in_layer",
        Rows::WHOLE,
    ),
    (
        "time_guidance_embed.guidance_embedder.linear_2",
        "guidance_in.out_layer",
        Rows::WHOLE,
    ),
    (
        "double_stream_modulation_img.linear",
        "double_stream_modulation_img.lin",
        Rows::WHOLE,
    ),
    (
        "double_stream_modulation_txt.linear",
        "double_stream_modulation_txt.lin",
        Rows::WHOLE,
    ),
    (
        "single_stream_modulation.linear",
        "single_stream_modulation.lin",
        Rows::WHOLE,
    ),
    (
        "norm_out.linear",
        "final_layer.adaLN_modulation.1",
        Rows::SWAPPED,
    ),
];

/// The original layer a diffusers linear layer of the transformer comes from, and which of its
/// rows it holds; `None` for a name that is no linear layer of FLUX.2.
pub fn original_linear(module: &str) -> Option<(String, Rows)> {
    let block = |prefix: &str| {
        let (index, rest) = module.strip_prefix(prefix)?.split_once('.')?;
        index
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then_some((index, rest))
    };
    if let Some((b, rest)) = block("single_transformer_blocks.") {
        let (_, original) = SINGLE.iter().find(|(d, _)| *d == rest)?;
        return Some((format!("single_blocks.{b}.{original}"), Rows::WHOLE));
    }
    if let Some((b, rest)) = block("transformer_blocks.") {
        let (_, original, rows) = DOUBLE.iter().find(|(d, ..)| *d == rest)?;
        return Some((format!("double_blocks.{b}.{original}"), *rows));
    }
    let (_, original, rows) = TOP.iter().find(|(d, ..)| *d == module)?;
    Some((original.to_string(), *rows))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
