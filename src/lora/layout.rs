//! The key layouts LoRA files come in, and what each key names: the component, the linear
//! module (as our checkpoints name it) and the part of the adapter.
//!
//! - diffusers / PEFT: `transformer.<module>.lora_A.weight` and `.lora_B.weight`, optionally
//!   with a `default.` adapter segment before `weight`, or under PEFT's `base_model.model.`;
//!   the text encoder's under `text_encoder.`. Alpha is in the metadata or absent.
//! - ComfyUI: `diffusion_model.<module>.lora_A.weight` / `.lora_B.weight`, with an optional
//!   `<module>.alpha`.
//! - kohya: `lora_unet_<module with underscores for dots>.lora_down.weight`, `.lora_up.weight`
//!   and `.alpha`, some trainers writing `lora_unet__…`; the text encoder's under `lora_te_`.
//! - XLabs: `[diffusion_model.]double_blocks.N.processor.{qkv,proj}_lora{1,2}.{down,up}.weight`
//!   and `single_blocks.N.processor.{qkv,proj}_lora.…`, no alpha: the attention's fused
//!   projections in Black Forest Labs' names, `1` the image stream's and `2` the text's. A
//!   single block's `qkv_lora` covers the first three parts of its fused `linear1` (q, k and v;
//!   not the MLP's), named `single_blocks.N.linear1[:3]`.
//!
//! The module is whatever name the file gives; which names the model's layers answer to is the
//! model family's (a family's layers also answer to the original names its checkpoints use,
//! where it has them: see [`super::Modules`]).
//!
//! Alpha as trainers mean it: the update is `alpha / rank · B·A`, and an absent alpha means
//! alpha = rank (a scale of 1).

/// A file's key layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    Peft,
    Comfy,
    Kohya,
    #[serde(rename = "xlabs")]
    XLabs,
}

impl Layout {
    pub fn describe(self) -> &'static str {
        match self {
            Layout::Peft => "diffusers/PEFT (`transformer.<module>.lora_A/lora_B`)",
            Layout::Comfy => "ComfyUI (`diffusion_model.<module>.lora_A/lora_B`)",
            Layout::Kohya => "kohya (`lora_unet_<module>.lora_down/lora_up`)",
            Layout::XLabs => "XLabs (`double_blocks.N.processor.qkv_lora1.down/up`)",
        }
    }
}

/// The model component a key's module belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    TextEncoder,
    Transformer,
}

impl Component {
    /// The component's folder name in a diffusers directory and in the store.
    pub fn name(self) -> &'static str {
        match self {
            Component::TextEncoder => "text_encoder",
            Component::Transformer => "transformer",
        }
    }
}

/// Which half of a low-rank pair, or its alpha, a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// `A` / `lora_down`: `[rank, in]`.
    Down,
    /// `B` / `lora_up`: `[out, rank]`.
    Up,
    Alpha,
}

/// A module as a key spells it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ModuleKey {
    /// Dotted, as in our checkpoints: `layers.0.attention.to_q`.
    Dotted(String),
    /// kohya's, every dot an underscore: `layers_0_attention_to_q`. Which underscores were dots
    /// is only known against the model's modules.
    Flat(String),
}

impl ModuleKey {
    pub fn as_str(&self) -> &str {
        match self {
            ModuleKey::Dotted(s) | ModuleKey::Flat(s) => s,
        }
    }
}

/// What one key names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedKey {
    pub layout: Layout,
    pub component: Component,
    pub module: ModuleKey,
    pub part: Part,
}

/// The part suffixes, longest first so that `lora_A.default.weight` is not read as
/// `…default` + `weight`.
const PARTS: [(&str, Part); 7] = [
    (".lora_A.default.weight", Part::Down),
    (".lora_B.default.weight", Part::Up),
    (".lora_A.weight", Part::Down),
    (".lora_B.weight", Part::Up),
    (".lora_down.weight", Part::Down),
    (".lora_up.weight", Part::Up),
    (".alpha", Part::Alpha),
];

/// Prefixes, each with the layout and component it means.
const DOTTED_PREFIXES: [(&str, Layout, Component); 5] = [
    ("transformer.", Layout::Peft, Component::Transformer),
    ("base_model.model.", Layout::Peft, Component::Transformer),
    ("text_encoder.", Layout::Peft, Component::TextEncoder),
    ("diffusion_model.", Layout::Comfy, Component::Transformer),
    (
        "model.diffusion_model.",
        Layout::Comfy,
        Component::Transformer,
    ),
];
const FLAT_PREFIXES: [(&str, Component); 3] = [
    ("lora_unet_", Component::Transformer),
    ("lora_te1_", Component::TextEncoder),
    ("lora_te_", Component::TextEncoder),
];

/// Key fragments of adapter kinds that are not low-rank pairs, with their names.
const OTHER_KINDS: [(&str, &str); 6] = [
    ("lokr_w1", "LoKr"),
    ("lokr_w2", "LoKr"),
    ("hada_w1", "LoHa"),
    ("hada_w2", "LoHa"),
    ("dora_scale", "DoRA"),
    ("lora_magnitude_vector", "DoRA"),
];

/// The adapter kind a key belongs to when it is not a plain LoRA (`LoKr`, `LoHa`, `DoRA`).
pub fn other_kind(key: &str) -> Option<&'static str> {
    OTHER_KINDS
        .iter()
        .find(|(fragment, _)| key.contains(fragment))
        .map(|&(_, kind)| kind)
}

/// What `key` names, or `None` when it fits no layout.
pub fn parse_key(key: &str) -> Option<ParsedKey> {
    if let Some(parsed) = parse_xlabs(key) {
        return Some(parsed);
    }
    let (stem, part) = PARTS
        .iter()
        .find_map(|&(suffix, part)| key.strip_suffix(suffix).map(|s| (s, part)))?;
    for (prefix, component) in FLAT_PREFIXES {
        if let Some(rest) = stem.strip_prefix(prefix) {
            // `lora_unet__layers_0_…`: the module began with a separator the trainer kept.
            let rest = rest.trim_start_matches('_');
            let rest = match component {
                Component::TextEncoder => rest.strip_prefix("model_").unwrap_or(rest),
                Component::Transformer => rest.strip_prefix("diffusion_model_").unwrap_or(rest),
            };
            return non_empty(rest).map(|m| ParsedKey {
                layout: Layout::Kohya,
                component,
                module: ModuleKey::Flat(m.to_string()),
                part,
            });
        }
    }
    let (layout, component, module) = DOTTED_PREFIXES
        .iter()
        .find_map(|&(prefix, layout, component)| {
            stem.strip_prefix(prefix).map(|m| (layout, component, m))
        })
        // Saved from the bare transformer, with no prefix at all.
        .unwrap_or((Layout::Peft, Component::Transformer, stem));
    let module = match component {
        Component::TextEncoder => module.strip_prefix("model.").unwrap_or(module),
        Component::Transformer => module,
    };
    non_empty(module).map(|m| ParsedKey {
        layout,
        component,
        module: ModuleKey::Dotted(m.to_string()),
        part,
    })
}

/// An XLabs key: its processor's LoRA as the fused layer of the block it adapts.
fn parse_xlabs(key: &str) -> Option<ParsedKey> {
    let key = key.strip_prefix("diffusion_model.").unwrap_or(key);
    let (stem, part) = [(".down.weight", Part::Down), (".up.weight", Part::Up)]
        .into_iter()
        .find_map(|(suffix, part)| key.strip_suffix(suffix).map(|s| (s, part)))?;
    let (block, lora) = stem.split_once(".processor.")?;
    let (kind, index) = block.split_once('.')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let layer = match (kind, lora) {
        ("double_blocks", "qkv_lora1") => "img_attn.qkv",
        ("double_blocks", "qkv_lora2") => "txt_attn.qkv",
        ("double_blocks", "proj_lora1") => "img_attn.proj",
        ("double_blocks", "proj_lora2") => "txt_attn.proj",
        ("single_blocks", "qkv_lora") => "linear1[:3]",
        ("single_blocks", "proj_lora") => "linear2",
        _ => return None,
    };
    Some(ParsedKey {
        layout: Layout::XLabs,
        component: Component::Transformer,
        module: ModuleKey::Dotted(format!("{block}.{layer}")),
        part,
    })
}

/// `layer[:n]`: the first `n` parts of a fused layer (see [`parse_xlabs`]).
pub(crate) fn leading_parts(module: &str) -> Option<(&str, u64)> {
    let (base, n) = module.strip_suffix(']')?.rsplit_once("[:")?;
    Some((base, n.parse().ok().filter(|&n| n > 0)?))
}

fn non_empty(s: &str) -> Option<&str> {
    Some(s).filter(|s| !s.is_empty() && !s.starts_with('.') && !s.ends_with('.'))
}

/// A module name with every dot an underscore, as kohya spells it.
pub fn flatten(module: &str) -> String {
    module.replace('.', "_")
}

/// The longest name compared by edit distance: longer names are cut, so that a hostile key
/// costs no more than a plausible one.
const MAX_COMPARED: usize = 256;

/// Levenshtein distance between `a` and `b` (each cut at `MAX_COMPARED` bytes).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a = &a.as_bytes()[..a.len().min(MAX_COMPARED)];
    let b = &b.as_bytes()[..b.len().min(MAX_COMPARED)];
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(key: &str) -> (Layout, Component, ModuleKey, Part) {
        let p = parse_key(key).unwrap();
        (p.layout, p.component, p.module, p.part)
    }

    #[test]
    fn xlabs_keys_name_the_fused_layers_they_adapt() {
        let dotted = |s: &str| ModuleKey::Dotted(s.into());
        use Component::*;
        use Layout::*;
        use Part::*;
        for (key, want) in [
            (
                "double_blocks.3.processor.qkv_lora1.down.weight",
                (
                    XLabs,
                    Transformer,
                    dotted("double_blocks.3.img_attn.qkv"),
                    Down,
                ),
            ),
            (
                "diffusion_model.double_blocks.0.processor.proj_lora2.up.weight",
                (
                    XLabs,
                    Transformer,
                    dotted("double_blocks.0.txt_attn.proj"),
                    Up,
                ),
            ),
            (
                "single_blocks.12.processor.qkv_lora.up.weight",
                (
                    XLabs,
                    Transformer,
                    dotted("single_blocks.12.linear1[:3]"),
                    Up,
                ),
            ),
            (
                "single_blocks.1.processor.proj_lora.down.weight",
                (XLabs, Transformer, dotted("single_blocks.1.linear2"), Down),
            ),
        ] {
            assert_eq!(parsed(key), want, "{key}");
        }
        for bad in [
            "double_blocks.x.processor.qkv_lora1.down.weight",
            "double_blocks.0.processor.other_lora.down.weight",
            "single_blocks.0.processor.qkv_lora1.down.weight",
        ] {
            assert!(parse_xlabs(bad).is_none(), "{bad}");
        }
        assert_eq!(
            leading_parts("single_blocks.1.linear1[:3]"),
            Some(("single_blocks.1.linear1", 3))
        );
        assert_eq!(leading_parts("single_blocks.1.linear1[:0]"), None);
    }

    #[test]
    fn every_layout_maps_its_keys_to_modules() {
        let dotted = |s: &str| ModuleKey::Dotted(s.into());
        let flat = |s: &str| ModuleKey::Flat(s.into());
        use Component::*;
        use Layout::*;
        use Part::*;
        let cases = [
            (
                "transformer.layers.0.attention.to_q.lora_A.weight",
                (Peft, Transformer, dotted("layers.0.attention.to_q"), Down),
            ),
            (
                "transformer.layers.0.attention.to_out.0.lora_B.default.weight",
                (Peft, Transformer, dotted("layers.0.attention.to_out.0"), Up),
            ),
            (
                "base_model.model.layers.1.feed_forward.w2.lora_A.weight",
                (Peft, Transformer, dotted("layers.1.feed_forward.w2"), Down),
            ),
            (
                "text_encoder.model.layers.0.self_attn.q_proj.lora_A.weight",
                (Peft, TextEncoder, dotted("layers.0.self_attn.q_proj"), Down),
            ),
            (
                "diffusion_model.layers.0.adaLN_modulation.0.alpha",
                (
                    Comfy,
                    Transformer,
                    dotted("layers.0.adaLN_modulation.0"),
                    Alpha,
                ),
            ),
            (
                "lora_unet_layers_0_attention_to_q.lora_down.weight",
                (Kohya, Transformer, flat("layers_0_attention_to_q"), Down),
            ),
            (
                "lora_unet__layers_0_attention_to_q.lora_up.weight",
                (Kohya, Transformer, flat("layers_0_attention_to_q"), Up),
            ),
            (
                "lora_te_model_layers_0_mlp_up_proj.alpha",
                (Kohya, TextEncoder, flat("layers_0_mlp_up_proj"), Alpha),
            ),
        ];
        for (key, want) in cases {
            assert_eq!(parsed(key), want, "{key}");
        }
        assert_eq!(
            parse_key("transformer.layers.0.attention.to_q.weight"),
            None
        );
        assert_eq!(parse_key(".lora_A.weight"), None);
        assert_eq!(parse_key("lora_unet___.alpha"), None);
    }

    #[test]
    fn other_adapter_kinds_are_named() {
        assert_eq!(other_kind("lora_unet_layers_0_w1.lokr_w1_a"), Some("LoKr"));
        assert_eq!(other_kind("lora_unet_layers_0_w1.hada_w2_b"), Some("LoHa"));
        assert_eq!(other_kind("lora_unet_layers_0_w1.lora_up.weight"), None);
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("to_q", "to_q"), 0);
        assert_eq!(edit_distance("to_q", "to_k"), 1);
        assert_eq!(edit_distance("layers.0.w1", "layers.0.w12"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
