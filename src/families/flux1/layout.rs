//! The FLUX.1 transformer: Black Forest Labs' original layout (`flux1-dev.safetensors`,
//! ComfyUI's `diffusion_models/` files, the GGUF files made from them, and LoRAs trained on
//! them) against diffusers' `FluxTransformer2DModel`, whose names the store and the pipeline
//! use (flux1-spec §11).
//!
//! One table says which original module each diffusers module comes from. Every linear layer
//! has a weight and a bias, which map alike; norm scales change `scale` for `weight`. Most
//! modules are renamed only. Three kinds hold several diffusers modules in their rows: a double
//! block's fused `img_attn.qkv` / `txt_attn.qkv` (q's rows, then k's, then v's), a single
//! block's `linear1` (q, k and v of the width each, then the 4× MLP's input: sevenths of its
//! rows), and the final layer's `adaLN_modulation.1`, whose rows are (shift, scale) where
//! diffusers' `norm_out.linear` has (scale, shift). Importing cuts the rows (or reads the
//! modulation's bytes rolled by half); exporting joins them back.

use crate::mapping::{
    layout_of, renamed, rows, strip_prefix, ByName, Component, Inferred, Joined, Layout,
    LayoutError, Mapped, Rows, Untold,
};
use crate::store::SourceTensor;

const PREFIXES: [&str; 2] = ["model.diffusion_model.", "diffusion_model."];
const EXPECTED: &str = "diffusers names (`transformer_blocks.N.norm1.linear.weight`, `time_text_embed.text_embedder.linear_1.weight`, …) or the original FLUX.1 names (`double_blocks.N.img_mod.lin.weight`, `vector_in.in_layer.weight`, …), optionally under `model.diffusion_model.`";

/// The RoPE axes of diffusers' config, which no tensor holds; they fill a head of 128 only.
const AXES_DIMS_ROPE: [u64; 3] = [16, 56, 56];

/// The thirds of a double block's fused `qkv`.
const Q: Rows = Rows { of: 3, parts: &[0] };
const K: Rows = Rows { of: 3, parts: &[1] };
const V: Rows = Rows { of: 3, parts: &[2] };

/// A single block's `linear1` holds q, k and v (the width each), then the MLP's input (four
/// times the width): its rows in sevenths.
const SINGLE_Q: Rows = Rows { of: 7, parts: &[0] };
const SINGLE_K: Rows = Rows { of: 7, parts: &[1] };
const SINGLE_V: Rows = Rows { of: 7, parts: &[2] };
const SINGLE_MLP: Rows = Rows {
    of: 7,
    parts: &[3, 4, 5, 6],
};

/// The two halves swapped: the final modulation's (shift, scale) read as (scale, shift).
const SWAPPED: Rows = Rows {
    of: 2,
    parts: &[1, 0],
};

/// How a diffusers module's tensors are named in the original: a linear layer keeps `weight`
/// and `bias`, an RMS norm's `weight` is the original's `scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Linear,
    Norm,
}

/// A module: diffusers' name, the original's, its kind and the original rows it holds.
type Module = (&'static str, &'static str, Kind, Rows);

const WHOLE: Rows = Rows::WHOLE;

/// A double block's modules: diffusers' names after `transformer_blocks.N.`, the original's
/// after `double_blocks.N.`.
const DOUBLE: [Module; 18] = [
    ("norm1.linear", "img_mod.lin", Kind::Linear, WHOLE),
    ("norm1_context.linear", "txt_mod.lin", Kind::Linear, WHOLE),
    ("attn.to_q", "img_attn.qkv", Kind::Linear, Q),
    ("attn.to_k", "img_attn.qkv", Kind::Linear, K),
    ("attn.to_v", "img_attn.qkv", Kind::Linear, V),
    ("attn.add_q_proj", "txt_attn.qkv", Kind::Linear, Q),
    ("attn.add_k_proj", "txt_attn.qkv", Kind::Linear, K),
    ("attn.add_v_proj", "txt_attn.qkv", Kind::Linear, V),
    ("attn.to_out.0", "img_attn.proj", Kind::Linear, WHOLE),
    ("attn.to_add_out", "txt_attn.proj", Kind::Linear, WHOLE),
    ("ff.net.0.proj", "img_mlp.0", Kind::Linear, WHOLE),
    ("ff.net.2", "img_mlp.2", Kind::Linear, WHOLE),
    ("ff_context.net.0.proj", "txt_mlp.0", Kind::Linear, WHOLE),
    ("ff_context.net.2", "txt_mlp.2", Kind::Linear, WHOLE),
    ("attn.norm_q", "img_attn.norm.query_norm", Kind::Norm, WHOLE),
    ("attn.norm_k", "img_attn.norm.key_norm", Kind::Norm, WHOLE),
    (
        "attn.norm_added_q",
        "txt_attn.norm.query_norm",
        Kind::Norm,
        WHOLE,
    ),
    (
        "attn.norm_added_k",
        "txt_attn.norm.key_norm",
        Kind::Norm,
        WHOLE,
    ),
];

/// A single block's modules: after `single_transformer_blocks.N.` and `single_blocks.N.`.
const SINGLE: [Module; 8] = [
    ("norm.linear", "modulation.lin", Kind::Linear, WHOLE),
    ("attn.to_q", "linear1", Kind::Linear, SINGLE_Q),
    ("attn.to_k", "linear1", Kind::Linear, SINGLE_K),
    ("attn.to_v", "linear1", Kind::Linear, SINGLE_V),
    ("proj_mlp", "linear1", Kind::Linear, SINGLE_MLP),
    ("proj_out", "linear2", Kind::Linear, WHOLE),
    ("attn.norm_q", "norm.query_norm", Kind::Norm, WHOLE),
    ("attn.norm_k", "norm.key_norm", Kind::Norm, WHOLE),
];

/// The modules outside the blocks.
const TOP: [Module; 10] = [
    ("x_embedder", "img_in", Kind::Linear, WHOLE),
    ("context_embedder", "txt_in", Kind::Linear, WHOLE),
    (
        "time_text_embed.timestep_embedder.linear_1",
        "time_in.in_layer",
        Kind::Linear,
        WHOLE,
    ),
    (
        "time_text_embed.timestep_embedder.linear_2",
        "time_in.out_layer",
        Kind::Linear,
        WHOLE,
    ),
    (
        "time_text_embed.text_embedder.linear_1",
        "vector_in.in_layer",
        Kind::Linear,
        WHOLE,
    ),
    (
        "time_text_embed.text_embedder.linear_2",
        "vector_in.out_layer",
        Kind::Linear,
        WHOLE,
    ),
    // The guidance embedder is [dev]'s and Kontext's; [schnell] has none.
    (
        "time_text_embed.guidance_embedder.linear_1",
        "guidance_in.in_layer",
        Kind::Linear,
        WHOLE,
    ),
    (
        "time_text_embed.guidance_embedder.linear_2",
        "guidance_in.out_layer",
        Kind::Linear,
        WHOLE,
    ),
    ("proj_out", "final_layer.linear", Kind::Linear, WHOLE),
    (
        "norm_out.linear",
        "final_layer.adaLN_modulation.1",
        Kind::Linear,
        SWAPPED,
    ),
];

/// The table's three scopes: diffusers' prefix and the original's, each followed by a block
/// index unless empty, and their modules.
const SCOPES: [(&str, &str, &[Module]); 3] = [
    ("single_transformer_blocks.", "single_blocks.", &SINGLE),
    ("transformer_blocks.", "double_blocks.", &DOUBLE),
    ("", "", &TOP),
];

/// `name` split after `prefix` and a block index (`None` when it has neither); the empty
/// prefix takes names outside the blocks.
fn in_scope<'a>(name: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    if prefix.is_empty() {
        return Some(("", name));
    }
    let (index, rest) = name.strip_prefix(prefix)?.split_once('.')?;
    (!index.is_empty() && index.bytes().all(|b| b.is_ascii_digit())).then_some((index, rest))
}

/// `prefix` and `index` joined to a module name (no index outside the blocks).
fn scoped(prefix: &str, index: &str, module: &str) -> String {
    match prefix.is_empty() {
        true => module.to_string(),
        false => format!("{prefix}{index}.{module}"),
    }
}

/// The original module a diffusers module comes from, its kind and which of its rows it holds.
fn original_module(module: &str) -> Option<(String, Kind, Rows)> {
    SCOPES.iter().find_map(|(ours, theirs, modules)| {
        let (index, rest) = in_scope(module, ours)?;
        let (_, original, kind, rows) = modules.iter().find(|(d, ..)| *d == rest)?;
        Some((scoped(theirs, index, original), *kind, *rows))
    })
}

/// The original layer a diffusers linear layer of the transformer comes from, and which of its
/// rows it holds; `None` for a name that is no linear layer of FLUX.1.
///
/// Every linear layer answers to its original name, outside the blocks too (`txt_in`,
/// `final_layer.adaLN_modulation.1` with its halves swapped): kohya's and ComfyUI's LoRAs name
/// those layers so (flux1-spec §12.1).
pub fn original_linear(module: &str) -> Option<(String, Rows)> {
    match original_module(module)? {
        (original, Kind::Linear, rows) => Some((original, rows)),
        _ => None,
    }
}

/// The original suffix of a diffusers tensor of a module of `kind` (`weight`, `bias`).
fn original_suffix(kind: Kind, suffix: &str) -> Option<&'static str> {
    match (kind, suffix) {
        (Kind::Linear, "weight") => Some("weight"),
        (Kind::Linear, "bias") => Some("bias"),
        (Kind::Norm, "weight") => Some("scale"),
        _ => None,
    }
}

/// The diffusers suffix of an original tensor of a module of `kind`.
fn diffusers_suffix(kind: Kind, suffix: &str) -> Option<&'static str> {
    match (kind, suffix) {
        (Kind::Linear, "weight") => Some("weight"),
        (Kind::Linear, "bias") => Some("bias"),
        (Kind::Norm, "scale") => Some("weight"),
        _ => None,
    }
}

/// The original tensor a diffusers tensor comes from, and which of its rows it holds.
fn original_tensor(name: &str) -> Option<(String, Rows)> {
    let (module, suffix) = name.rsplit_once('.')?;
    let (original, kind, rows) = original_module(module)?;
    Some((
        format!("{original}.{}", original_suffix(kind, suffix)?),
        rows,
    ))
}

/// The diffusers tensors an original tensor holds, each with its rows; empty for a name that
/// is no tensor of FLUX.1.
fn diffusers_tensors(original: &str) -> Vec<(String, Rows)> {
    let Some((module, suffix)) = original.rsplit_once('.') else {
        return Vec::new();
    };
    SCOPES
        .iter()
        .filter_map(|(ours, theirs, modules)| Some((ours, in_scope(module, theirs)?, modules)))
        .flat_map(|(ours, (index, rest), modules)| {
            (modules.iter())
                .filter(move |(_, o, ..)| *o == rest)
                .filter_map(move |(d, _, kind, rows)| {
                    let suffix = diffusers_suffix(*kind, suffix)?;
                    Some((format!("{}.{suffix}", scoped(ours, index, d)), *rows))
                })
        })
        .collect()
}

/// A name without the prefix a single file may give it.
fn stripped(name: &str) -> &str {
    (PREFIXES.iter())
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name)
}

/// Whether `name` is one only FLUX.1 has, in either layout: the pooled-text embedder, or a
/// double block's own modulation. FLUX.2 modulates every block from shared layers and embeds
/// no pooled text; FLUX.3 names its blocks otherwise.
fn is_flux1_name(name: &str) -> bool {
    let in_block = |prefix: &str, module: &str| {
        in_scope(name, prefix).is_some_and(|(_, rest)| rest.starts_with(module))
    };
    name.starts_with("vector_in.")
        || name.starts_with("time_text_embed.text_embedder.")
        || in_block("double_blocks.", "img_mod.lin.")
        || in_block("transformer_blocks.", "norm1.linear.")
}

/// Whether a single file's tensors are a FLUX.1 transformer's, in either layout.
pub fn is_flux1(tensors: &[SourceTensor]) -> bool {
    (tensors.iter()).any(|t| is_flux1_name(stripped(&t.name)))
}

/// Whether a stored (diffusers-named) transformer is FLUX.1's.
pub fn is_stored_flux1(tensors: &[(String, Vec<u64>)]) -> bool {
    (tensors.iter()).any(|(name, _)| is_flux1_name(name))
}

/// A transformer checkpoint's tensors under diffusers' names, with the config their shapes
/// tell.
pub fn to_diffusers(mut tensors: Vec<SourceTensor>, what: &str) -> Result<Mapped, LayoutError> {
    strip_prefix(&mut tensors, &PREFIXES);
    let layout = layout_of(
        &tensors,
        (
            &[
                "single_transformer_blocks.",
                "transformer_blocks.",
                "time_text_embed.",
            ],
            &["double_blocks.", "single_blocks.", "vector_in."],
        ),
        what,
        ("transformer", EXPECTED),
    )?;
    if layout == Layout::Original {
        tensors = from_original(&tensors, what)?;
    }
    let (inferred, untold) = infer(&tensors, what)?;
    let transformer = Component::Transformer;
    Ok(Mapped::new(transformer, layout, tensors, inferred, vec![]).with_untold(untold))
}

/// Original tensors under diffusers names, each fused one cut into the tensors it holds.
fn from_original(tensors: &[SourceTensor], what: &str) -> Result<Vec<SourceTensor>, LayoutError> {
    let mut out = Vec::with_capacity(tensors.len() + 64);
    for t in tensors {
        let held = diffusers_tensors(&t.name);
        if held.is_empty() {
            return Err(LayoutError::Tensor {
                what: what.to_string(),
                tensor: t.name.clone(),
                reason: "is no tensor of a FLUX.1 transformer".into(),
            });
        }
        for (name, part) in held {
            out.push(cut(t, name, part, what)?);
        }
    }
    Ok(out)
}

/// Row ranges, each that starts where the one before ends joined to it (the MLP's four
/// sevenths of `linear1` are one range).
fn merged(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(start, end) in ranges {
        match out.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => out.push((start, end)),
        }
    }
    out
}

/// The diffusers tensor `name` that holds `part` of the original tensor `t`: a range of its
/// rows, or its halves swapped (its bytes read rolled by half).
fn cut(
    t: &SourceTensor,
    name: String,
    part: Rows,
    what: &str,
) -> Result<SourceTensor, LayoutError> {
    let total = t.shape.first().copied().unwrap_or(0);
    let bad = |reason: String| LayoutError::Tensor {
        what: what.to_string(),
        tensor: t.name.clone(),
        reason,
    };
    let ranges = (part.ranges(total)).filter(|_| total > 0).ok_or_else(|| {
        bad(format!(
            "has {total} rows, which are not {} equal parts",
            part.of
        ))
    })?;
    match merged(&ranges).as_slice() {
        [(0, end)] if *end == total => Ok(renamed(t, name, None)),
        [(start, end)] => rows(t, *start, *end, &name).map_err(bad),
        _ if part == SWAPPED && t.nbytes.is_multiple_of(2) => {
            let mut out = renamed(t, name, None);
            out.roll = t.nbytes / 2;
            Ok(out)
        }
        _ => Err(bad(format!("cannot be read as `{name}`"))),
    }
}

/// The q norm whose length is the head size: a double block's, else a single block's.
fn head_norm(t: &ByName) -> &'static str {
    let double = "transformer_blocks.0.attn.norm_q.weight";
    match t.map.contains_key(double) {
        true => double,
        false => "single_transformer_blocks.0.attn.norm_q.weight",
    }
}

/// The RoPE axes of a head of `head_dim`: diffusers' \[16, 56, 56\], which the file does not
/// hold and which fill a head of 128 only. Any other head size has no axes the shapes could
/// tell: a config the model gives (`--from`'s, the file's metadata) must say them.
fn rope_axes(q_norm: &str, head_dim: u64) -> Result<[u64; 3], Untold> {
    if AXES_DIMS_ROPE.iter().sum::<u64>() == head_dim {
        return Ok(AXES_DIMS_ROPE);
    }
    Err(Untold {
        key: "axes_dims_rope",
        tensor: q_norm.to_string(),
        reason: format!(
            "gives a head size of {head_dim}; FLUX.1's RoPE axes {AXES_DIMS_ROPE:?} fill a head of {}, and the file does not say how a head of {head_dim} is split",
            AXES_DIMS_ROPE.iter().sum::<u64>()
        ),
    })
}

/// The single blocks' `linear1` was cut in sevenths, which holds only for q, k and v of the
/// width each and an MLP of four times the width: the parts must have those rows.
fn check_single_block(t: &ByName, inner: u64) -> Result<(), LayoutError> {
    if t.count("single_transformer_blocks.") == 0 {
        return Ok(());
    }
    let parts = [
        ("single_transformer_blocks.0.attn.to_q.weight", inner),
        ("single_transformer_blocks.0.proj_mlp.weight", 4 * inner),
    ];
    for (name, want) in parts {
        let rows = t.dim(name, 2, 0)?;
        if rows != want {
            return Err(t.bad(
                name,
                format!("has {rows} rows where a width of {inner} asks {want}: FLUX.1's single blocks hold q, k and v of the width and an MLP of four times it"),
            ));
        }
    }
    Ok(())
}

/// `transformer/config.json` from the (diffusers-named) shapes; the RoPE axes, which no shape
/// tells, are diffusers' default where they fit the head, else left to a given config.
pub fn infer_config(tensors: &[SourceTensor], what: &str) -> Result<Inferred, LayoutError> {
    infer(tensors, what).map(|(inferred, _)| inferred)
}

/// [`infer_config`], and the keys it leaves to a given config.
fn infer(tensors: &[SourceTensor], what: &str) -> Result<(Inferred, Vec<Untold>), LayoutError> {
    let t = ByName::new(what, "transformer", tensors);
    let x = "x_embedder.weight";
    let inner = t.dim(x, 2, 0)?;
    let q_norm = head_norm(&t);
    let head_dim = t.dim(q_norm, 1, 0)?;
    if head_dim == 0 || inner % head_dim != 0 {
        return Err(t.bad(
            q_norm,
            format!("gives a head size of {head_dim}, which does not divide the width {inner}"),
        ));
    }
    let axes = rope_axes(q_norm, head_dim);
    check_single_block(&t, inner)?;
    let pooled = "time_text_embed.text_embedder.linear_1.weight";
    let guidance = "time_text_embed.guidance_embedder.linear_1.weight";
    let mut config = serde_json::json!({
        "_class_name": "FluxTransformer2DModel",
        "_diffusers_version": "0.42.1",
        "attention_head_dim": head_dim,
        "guidance_embeds": t.map.contains_key(guidance),
        "in_channels": t.dim(x, 2, 1)?,
        "joint_attention_dim": t.dim("context_embedder.weight", 2, 1)?,
        "num_attention_heads": inner / head_dim,
        "num_layers": t.count("transformer_blocks."),
        "num_single_layers": t.count("single_transformer_blocks."),
        "out_channels": null,
        "patch_size": 1,
        "pooled_projection_dim": t.dim(pooled, 2, 1)?,
    });
    let shape_keys = [
        ("attention_head_dim", q_norm),
        ("guidance_embeds", guidance),
        ("in_channels", x),
        ("joint_attention_dim", "context_embedder.weight"),
        ("num_attention_heads", x),
        ("num_layers", "transformer_blocks.N"),
        ("num_single_layers", "single_transformer_blocks.N"),
        ("pooled_projection_dim", pooled),
    ];
    let untold = match axes {
        Ok(axes) => {
            config["axes_dims_rope"] = serde_json::json!(axes);
            Vec::new()
        }
        Err(untold) => vec![untold],
    };
    let inferred = Inferred {
        config,
        shape_keys: shape_keys.map(|(k, t)| (k, t.to_string())).to_vec(),
    };
    Ok((inferred, untold))
}

/// One tensor of an export and, per part, which part of the original's rows it holds.
type Joining = (Joined, Vec<u64>);

/// The original layout of stored (diffusers-named) tensors, for `export`: renamed, each fused
/// layer joined from its parts in row order, the final modulation's halves swapped back; a
/// name the table lacks is kept as it is.
pub fn to_original(tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
    let mut joined: Vec<Joining> = Vec::new();
    for (name, shape) in tensors {
        match original_tensor(name) {
            Some((original, rows)) => join(&mut joined, original, rows, name, shape),
            None => joined.push((
                Joined {
                    name: name.clone(),
                    shape: shape.clone(),
                    parts: vec![name.clone()],
                    roll_rows: 0,
                },
                vec![0],
            )),
        }
    }
    joined.into_iter().map(|(j, _)| j).collect()
}

/// Adds the stored tensor `name`, which holds `rows` of `original`, to that tensor's parts.
fn join(joined: &mut Vec<Joining>, original: String, rows: Rows, name: &str, shape: &[u64]) {
    let at = match joined.iter().position(|(j, _)| j.name == original) {
        Some(at) => at,
        None => {
            let empty = Joined {
                name: original,
                shape: shape.to_vec(),
                parts: Vec::new(),
                roll_rows: 0,
            };
            joined.push((empty, Vec::new()));
            joined.len() - 1
        }
    };
    let (j, order) = &mut joined[at];
    // Each part goes where its rows lie in the original.
    let slot = order.partition_point(|&p| p < rows.parts[0]);
    order.insert(slot, rows.parts[0]);
    j.parts.insert(slot, name.to_string());
    if j.parts.len() > 1 {
        j.shape[0] += shape[0];
    }
    if rows == SWAPPED {
        j.roll_rows = shape[0] / 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::{flux2_klein, flux3_klein};
    use crate::lora::{ModuleKey, Modules};
    use crate::memory_plan::TensorSize;
    use crate::store::Encoding;

    /// The tiny model's width: two heads of 128.
    const D: u64 = 256;

    /// A tensor of bf16 values at `offset` of one file.
    fn tensor(name: &str, shape: &[u64], offset: u64) -> SourceTensor {
        SourceTensor {
            component: "transformer".into(),
            name: name.into(),
            dtype: crate::safetensors::Dtype::BF16,
            shape: shape.to_vec(),
            file: "flux1.safetensors".into(),
            offset,
            nbytes: 2 * shape.iter().product::<u64>(),
            encoding: Encoding::Plain,
            roll: 0,
        }
    }

    /// A linear layer's weight and bias, `[out, in]`.
    fn linear(out: &mut Vec<(String, Vec<u64>)>, name: &str, rows: u64, cols: u64) {
        out.push((format!("{name}.weight"), vec![rows, cols]));
        out.push((format!("{name}.bias"), vec![rows]));
    }

    /// A tiny FLUX.1 in diffusers names: width 256, 64 latent channels, 32-wide text rows, a
    /// 16-wide pooled vector, two double and three single blocks; \[dev\]'s guidance embedder
    /// when `guidance`, else \[schnell\]'s tensors.
    fn diffusers_shapes(guidance: bool) -> Vec<(String, Vec<u64>)> {
        let mut out = Vec::new();
        linear(&mut out, "x_embedder", D, 64);
        linear(&mut out, "context_embedder", D, 32);
        let mut embedders = vec![("timestep_embedder", 256), ("text_embedder", 16)];
        if guidance {
            embedders.push(("guidance_embedder", 256));
        }
        for (embedder, width) in embedders {
            let e = format!("time_text_embed.{embedder}");
            linear(&mut out, &format!("{e}.linear_1"), D, width);
            linear(&mut out, &format!("{e}.linear_2"), D, D);
        }
        for i in 0..2 {
            let b = format!("transformer_blocks.{i}");
            for m in ["norm1.linear", "norm1_context.linear"] {
                linear(&mut out, &format!("{b}.{m}"), 6 * D, D);
            }
            for p in [
                "to_q",
                "to_k",
                "to_v",
                "add_q_proj",
                "add_k_proj",
                "add_v_proj",
            ] {
                linear(&mut out, &format!("{b}.attn.{p}"), D, D);
            }
            for p in ["to_out.0", "to_add_out"] {
                linear(&mut out, &format!("{b}.attn.{p}"), D, D);
            }
            for ff in ["ff", "ff_context"] {
                linear(&mut out, &format!("{b}.{ff}.net.0.proj"), 4 * D, D);
                linear(&mut out, &format!("{b}.{ff}.net.2"), D, 4 * D);
            }
            for n in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
                out.push((format!("{b}.attn.{n}.weight"), vec![128]));
            }
        }
        for i in 0..3 {
            let b = format!("single_transformer_blocks.{i}");
            linear(&mut out, &format!("{b}.norm.linear"), 3 * D, D);
            for p in ["to_q", "to_k", "to_v"] {
                linear(&mut out, &format!("{b}.attn.{p}"), D, D);
            }
            linear(&mut out, &format!("{b}.proj_mlp"), 4 * D, D);
            linear(&mut out, &format!("{b}.proj_out"), D, 5 * D);
            for n in ["norm_q", "norm_k"] {
                out.push((format!("{b}.attn.{n}.weight"), vec![128]));
            }
        }
        linear(&mut out, "norm_out.linear", 2 * D, D);
        linear(&mut out, "proj_out", 64, D);
        out
    }

    /// The exported tensors laid one after another in a file, under ComfyUI's prefix.
    fn original_file(joined: &[Joined]) -> Vec<SourceTensor> {
        let mut offset = 0;
        (joined.iter())
            .map(|j| {
                let name = format!("model.diffusion_model.{}", j.name);
                let t = tensor(&name, &j.shape, offset);
                offset += t.nbytes;
                t
            })
            .collect()
    }

    /// The spec's table (flux1-spec §11), both ways.
    #[test]
    fn names_map_both_ways() {
        for (original, diffusers) in [
            ("img_in.bias", "x_embedder.bias"),
            (
                "vector_in.out_layer.weight",
                "time_text_embed.text_embedder.linear_2.weight",
            ),
            (
                "guidance_in.in_layer.bias",
                "time_text_embed.guidance_embedder.linear_1.bias",
            ),
            ("final_layer.linear.weight", "proj_out.weight"),
            (
                "double_blocks.3.txt_mod.lin.bias",
                "transformer_blocks.3.norm1_context.linear.bias",
            ),
            (
                "double_blocks.3.txt_attn.norm.key_norm.scale",
                "transformer_blocks.3.attn.norm_added_k.weight",
            ),
            (
                "double_blocks.0.img_attn.proj.weight",
                "transformer_blocks.0.attn.to_out.0.weight",
            ),
            (
                "double_blocks.7.txt_mlp.0.bias",
                "transformer_blocks.7.ff_context.net.0.proj.bias",
            ),
            (
                "single_blocks.19.modulation.lin.weight",
                "single_transformer_blocks.19.norm.linear.weight",
            ),
            (
                "single_blocks.37.linear2.bias",
                "single_transformer_blocks.37.proj_out.bias",
            ),
            (
                "single_blocks.2.norm.query_norm.scale",
                "single_transformer_blocks.2.attn.norm_q.weight",
            ),
        ] {
            assert_eq!(
                diffusers_tensors(original),
                vec![(diffusers.to_string(), Rows::WHOLE)],
                "{original}"
            );
            let back = to_original(&[(diffusers.to_string(), vec![4, 4])]);
            assert_eq!(back[0].name, original, "{diffusers}");
        }
        for stranger in [
            "double_blocks.x.img_mlp.0.weight",
            "double_blocks..img_mlp.0.weight",
            "double_blocks.0.img_mlp.0.scale",
            "single_blocks.0.norm.query_norm.weight",
            "single_blocks.0.norm.query_norm.bias",
            "double_stream_modulation_img.lin.weight",
        ] {
            assert!(diffusers_tensors(stranger).is_empty(), "{stranger}");
        }
        let linear1 = diffusers_tensors("single_blocks.4.linear1.bias");
        let held: Vec<&str> = linear1.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            held,
            [
                "single_transformer_blocks.4.attn.to_q.bias",
                "single_transformer_blocks.4.attn.to_k.bias",
                "single_transformer_blocks.4.attn.to_v.bias",
                "single_transformer_blocks.4.proj_mlp.bias",
            ]
        );
        let swapped = diffusers_tensors("final_layer.adaLN_modulation.1.bias");
        assert_eq!(swapped, vec![("norm_out.linear.bias".into(), SWAPPED)]);
    }

    /// diffusers → original → diffusers gives back every name and shape, for \[dev\] and
    /// \[schnell\], and the config their shapes tell.
    #[test]
    fn a_model_goes_to_the_original_layout_and_back() {
        for guidance in [true, false] {
            let stored = diffusers_shapes(guidance);
            let joined = to_original(&stored);
            // Nothing stays in diffusers' names; 12 layers of each double block and 5 of each
            // single block join into fewer.
            assert!(joined.iter().all(|j| !j.parts.contains(&j.name)));
            assert_eq!(joined.len(), stored.len() - 2 * 2 * (2 * 2) - 3 * 2 * 3);
            let mapped = to_diffusers(original_file(&joined), "flux1.safetensors").unwrap();
            assert_eq!(mapped.layout, Layout::Original);
            let mut back: Vec<(String, Vec<u64>)> = (mapped.tensors.iter())
                .map(|t| (t.name.clone(), t.shape.clone()))
                .collect();
            let mut want = stored.clone();
            back.sort();
            want.sort();
            assert_eq!(back, want, "guidance {guidance}");
            let c = &mapped.config;
            assert_eq!(c["guidance_embeds"], guidance);
            assert_eq!(c["num_layers"], 2);
            assert_eq!(c["num_single_layers"], 3);
            assert_eq!(c["attention_head_dim"], 128);
            assert_eq!(c["num_attention_heads"], 2);
            assert_eq!(c["in_channels"], 64);
            assert_eq!(c["joint_attention_dim"], 32);
            assert_eq!(c["pooled_projection_dim"], 16);
            assert_eq!(c["axes_dims_rope"], serde_json::json!([16, 56, 56]));
            assert_eq!(c["patch_size"], 1);
            assert_eq!(c["_class_name"], "FluxTransformer2DModel");
        }
    }

    /// A fused layer's parts are joined in row order whatever order they come in, and cut back
    /// at their rows: a double block's thirds, a single block's sevenths.
    #[test]
    fn fused_layers_are_cut_at_their_rows() {
        let stored: Vec<(String, Vec<u64>)> = ["proj_mlp", "attn.to_v", "attn.to_q", "attn.to_k"]
            .iter()
            .map(|p| (format!("single_transformer_blocks.0.{p}.bias"), vec![D]))
            .collect();
        let joined = to_original(&stored);
        assert_eq!(joined.len(), 1);
        assert_eq!(joined[0].name, "single_blocks.0.linear1.bias");
        assert_eq!(joined[0].shape, vec![D + D + D + D]);
        let order: Vec<&str> = (joined[0].parts.iter())
            .map(|p| p.strip_prefix("single_transformer_blocks.0.").unwrap())
            .collect();
        assert_eq!(
            order,
            [
                "attn.to_q.bias",
                "attn.to_k.bias",
                "attn.to_v.bias",
                "proj_mlp.bias"
            ]
        );

        let qkv = tensor("double_blocks.1.txt_attn.qkv.weight", &[3 * D, D], 1000);
        let linear1 = tensor("single_blocks.0.linear1.bias", &[7 * D], 5000);
        let cut = from_original(&[qkv, linear1], "f").unwrap();
        let at = |name: &str| {
            let t = cut.iter().find(|t| t.name == name).unwrap();
            (t.offset, t.shape.clone())
        };
        let row = 2 * D;
        assert_eq!(
            at("transformer_blocks.1.attn.add_k_proj.weight"),
            (1000 + D * row, vec![D, D])
        );
        assert_eq!(
            at("transformer_blocks.1.attn.add_v_proj.weight"),
            (1000 + 2 * D * row, vec![D, D])
        );
        assert_eq!(
            at("single_transformer_blocks.0.attn.to_v.bias"),
            (5000 + 2 * D * 2, vec![D])
        );
        assert_eq!(
            at("single_transformer_blocks.0.proj_mlp.bias"),
            (5000 + 3 * D * 2, vec![4 * D])
        );
        let odd = tensor("single_blocks.0.linear1.weight", &[7 * D + 1, D], 0);
        let err = from_original(&[odd], "f").unwrap_err().to_string();
        assert!(err.contains("not 7 equal parts"), "{err}");
    }

    /// `bytes` as a tensor's reader gives them: from its roll on, then its first bytes.
    fn read(bytes: &[u8], t: &SourceTensor) -> Vec<u8> {
        let mut out = bytes[t.offset as usize..(t.offset + t.nbytes) as usize].to_vec();
        out.rotate_left(t.roll as usize);
        out
    }

    /// The final modulation's (shift, scale) is read as diffusers' (scale, shift), weight and
    /// bias, and written back as it was.
    #[test]
    fn the_final_modulation_swaps_its_halves_both_ways() {
        // Four rows of one bf16 value each: shift 1, 2 and scale 3, 4.
        let original: Vec<u8> = [1u16, 2, 3, 4]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        for suffix in ["weight", "bias"] {
            let shape: &[u64] = if suffix == "weight" { &[4, 1] } else { &[4] };
            let name = format!("final_layer.adaLN_modulation.1.{suffix}");
            let held = from_original(&[tensor(&name, shape, 0)], "f").unwrap();
            assert_eq!(held[0].name, format!("norm_out.linear.{suffix}"));
            let mut diffusers = read(&original, &held[0]);
            let values: Vec<u16> = (diffusers.chunks(2))
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            assert_eq!(values, [3, 4, 1, 2], "{suffix}");
            let joined = to_original(&[(held[0].name.clone(), shape.to_vec())]);
            assert_eq!(joined[0].name, name);
            crate::mapping::roll_rows(&mut diffusers, 4, joined[0].roll_rows);
            assert_eq!(diffusers, original, "{suffix}");
        }
    }

    #[test]
    fn the_config_is_read_off_diffusers_names_too() {
        let schnell = diffusers_shapes(false);
        let mut offset = 0;
        let file: Vec<SourceTensor> = (schnell.iter())
            .map(|(n, s)| {
                let t = tensor(n, s, offset);
                offset += t.nbytes;
                t
            })
            .collect();
        let mapped = to_diffusers(file.clone(), "f").unwrap();
        assert_eq!(mapped.layout, Layout::Diffusers);
        assert_eq!(mapped.config["guidance_embeds"], false);
        assert!(mapped.tensors.iter().all(|t| t.roll == 0));
        assert!(mapped.untold.is_empty());
        // A head of 64 has no RoPE axes the file or diffusers' default could give: a config
        // the model gives must say them.
        let halved: Vec<SourceTensor> = (file.iter())
            .map(
                |t| match t.name.contains("norm_") && !t.name.contains(".linear") {
                    true => tensor(&t.name, &[64], t.offset),
                    false => t.clone(),
                },
            )
            .collect();
        let mapped = to_diffusers(halved, "small.safetensors").unwrap();
        assert!(mapped.config.get("axes_dims_rope").is_none());
        let [untold] = mapped.untold.as_slice() else {
            panic!("{:?}", mapped.untold)
        };
        assert_eq!(untold.key, "axes_dims_rope");
        assert_eq!(untold.tensor, "transformer_blocks.0.attn.norm_q.weight");
        assert!(
            untold.reason.starts_with("gives a head size of 64"),
            "{untold:?}"
        );
        let unknown = vec![tensor("layers.0.attention.to_q.weight", &[4, 4], 0)];
        assert!(to_diffusers(unknown, "f").is_err());
    }

    /// FLUX.1 is told from FLUX.2 and FLUX.3 in both layouts.
    #[test]
    fn flux1_names_are_told_apart() {
        let file = |names: &[&str]| -> Vec<SourceTensor> {
            names.iter().map(|n| tensor(n, &[4, 4], 0)).collect()
        };
        let flux1_original = file(&[
            "model.diffusion_model.double_blocks.0.img_attn.qkv.weight",
            "model.diffusion_model.double_blocks.0.img_mod.lin.weight",
            "model.diffusion_model.vector_in.in_layer.weight",
        ]);
        let flux1_diffusers = file(&[
            "single_transformer_blocks.0.attn.to_q.weight",
            "transformer_blocks.0.norm1.linear.weight",
            "time_text_embed.text_embedder.linear_1.weight",
        ]);
        let flux2_original = file(&[
            "model.diffusion_model.double_blocks.0.img_attn.qkv.weight",
            "model.diffusion_model.double_stream_modulation_img.lin.weight",
            "model.diffusion_model.single_blocks.0.linear1.weight",
            "model.diffusion_model.time_in.in_layer.weight",
        ]);
        let flux2_diffusers = file(&[
            "transformer_blocks.0.attn.to_q.weight",
            "double_stream_modulation_img.linear.weight",
            "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight",
            "time_guidance_embed.timestep_embedder.linear_1.weight",
        ]);
        let flux3 = file(&[
            "content_mode_blocks.image.0.q_proj.weight",
            "txt_mode_blocks.0.q_proj.weight",
            "single_blocks.0.q_proj.weight",
        ]);
        for flux1 in [&flux1_original, &flux1_diffusers] {
            assert!(is_flux1(flux1));
            assert!(!flux3_klein::layout::is_flux3(flux1));
        }
        for other in [&flux2_original, &flux2_diffusers, &flux3] {
            assert!(!is_flux1(other), "{:?}", other[0].name);
        }
        assert!(flux2_klein::layout::is_flux2(&flux2_original));
        let names = |t: &[SourceTensor]| -> Vec<(String, Vec<u64>)> {
            t.iter()
                .map(|t| (t.name.clone(), t.shape.clone()))
                .collect()
        };
        assert!(is_stored_flux1(&names(&flux1_diffusers)));
        assert!(!is_stored_flux1(&names(&flux2_diffusers)));
        assert!(!is_stored_flux1(&names(&flux3)));
    }

    #[test]
    fn lora_layers_answer_to_their_original_names() {
        let (name, rows) = original_linear("transformer_blocks.1.attn.add_k_proj").unwrap();
        assert_eq!(name, "double_blocks.1.txt_attn.qkv");
        assert_eq!(rows.ranges(3 * D), Some(vec![(D, 2 * D)]));
        let (name, rows) = original_linear("single_transformer_blocks.5.proj_mlp").unwrap();
        assert_eq!(name, "single_blocks.5.linear1");
        let mlp: u64 = (rows.ranges(7 * D).unwrap().iter())
            .map(|(s, e)| e - s)
            .sum();
        assert_eq!(mlp, 4 * D);
        let (name, rows) = original_linear("norm_out.linear").unwrap();
        assert_eq!(name, "final_layer.adaLN_modulation.1");
        assert_eq!(rows.ranges(2 * D), Some(vec![(D, 2 * D), (0, D)]));
        let whole = |n: &str| Some((n.to_string(), Rows::WHOLE));
        assert_eq!(
            original_linear("single_transformer_blocks.12.proj_out"),
            whole("single_blocks.12.linear2")
        );
        assert_eq!(original_linear("proj_out"), whole("final_layer.linear"));
        assert_eq!(
            original_linear("time_text_embed.text_embedder.linear_1"),
            whole("vector_in.in_layer")
        );
        assert_eq!(original_linear("transformer_blocks.0.attn.norm_q"), None);
        assert_eq!(original_linear("transformer_blocks.0.proj_out"), None);

        // kohya's flat spelling of `linear1` reaches its four layers, each with its rows.
        let sizes: Vec<TensorSize> = (diffusers_shapes(true).into_iter())
            .map(|(name, shape)| TensorSize {
                name,
                shape,
                stored_bytes: 0,
                packed: false,
            })
            .collect();
        let modules = Modules::from_sizes(
            crate::lora::Component::Transformer,
            Some(original_linear),
            &sizes,
        );
        let targets = modules.resolve(&ModuleKey::Flat("single_blocks_0_linear1".into()));
        let mut layers: Vec<(&str, Vec<(u64, u64)>)> = (targets.iter())
            .map(|t| (t.layer, t.rows.ranges(7 * D).unwrap()))
            .collect();
        layers.sort();
        assert_eq!(
            layers,
            [
                ("single_transformer_blocks.0.attn.to_k", vec![(D, 2 * D)]),
                ("single_transformer_blocks.0.attn.to_q", vec![(0, D)]),
                (
                    "single_transformer_blocks.0.attn.to_v",
                    vec![(2 * D, 3 * D)]
                ),
                (
                    "single_transformer_blocks.0.proj_mlp",
                    vec![
                        (3 * D, 4 * D),
                        (4 * D, 5 * D),
                        (5 * D, 6 * D),
                        (6 * D, 7 * D)
                    ]
                ),
            ]
        );
        let modulation = modules.resolve(&ModuleKey::Flat("double_blocks_1_img_mod_lin".into()));
        assert_eq!(modulation[0].layer, "transformer_blocks.1.norm1.linear");
    }
}
