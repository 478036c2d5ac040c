//! A synthetic Z-Image-Turbo: a diffusers-layout directory with the real widths of every
//! component (zimage-spec §1) and random weights, at any depth, written without torch.
//!
//! Tensor names and shapes are exactly those of the Hub checkpoint (spec §2.6, §3.1, §5.7): the
//! transformer as diffusers saves `ZImageTransformer2DModel`, the text encoder as a
//! `Qwen3ForCausalLM` save (`model.`-prefixed, no `lm_head`: the embeddings are tied), the VAE as
//! its encoder and decoder. Only `n_layers`, `n_refiner_layers`
//! and the text encoder's `num_hidden_layers` follow the [`Spec`].
//!
//! Every file is streamed: the safetensors header is computed from the shapes, then the data is
//! generated in chunks of 2 Mi elements spread over the cores (rayon) and written in place with
//! positioned writes, never a whole tensor in memory. Each file lands atomically (a temp file
//! beside it, fsync unless [`Options::sync`] is off, rename), and `model_index.json` is written
//! last, so an interrupted run never leaves something that opens as a model.
//!
//! Values: matrices are uniform with standard deviation `1/sqrt(fan_in)` (so that deep stacks of
//! random layers keep finite activations), norm weights 1, biases 0, the transformer's pad tokens
//! uniform with std 0.02. The generator is counter-based (splitmix64's mixer applied to
//! `key + i·γ`, where the key hashes the seed and the tensor's name), so a tensor's values depend
//! only on the seed and its name, not on the depth, the sharding or the thread count; each
//! 16-bit quarter of a mixed word picks one of 65,536 uniform levels from a table. A bf16 model is
//! the f32 model of the same seed rounded to nearest even.
//!
//! Used by `models/make_synthetic.rs` and `tests/synthetic_model.rs` through `#[path]`.

#![allow(dead_code)]

use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zimage::safetensors::{self, TensorSpec};

#[path = "synthetic_klein.rs"]
pub mod klein;

#[path = "synthetic_flux3.rs"]
pub mod flux3;

#[path = "synthetic_flux1.rs"]
pub mod flux1;

// --- Real configuration (zimage-spec §1.3–1.6) -------------------------------------------------

/// Transformer hidden size, heads and head width.
pub const DIM: u64 = 3840;
pub const N_HEADS: u64 = 30;
pub const HEAD_DIM: u64 = 128;
/// `int(dim / 3 * 8)`.
pub const FFN_DIM: u64 = 10240;
/// Width of the timestep conditioning (`min(dim, 256)`) and of the sinusoid.
pub const ADALN_DIM: u64 = 256;
/// Hidden width of the timestep MLP.
pub const T_MLP_HIDDEN: u64 = 1024;
pub const IN_CHANNELS: u64 = 16;
/// Patch features: 2×2 patches of 16 channels.
pub const PATCH_FEATURES: u64 = 4 * IN_CHANNELS;
pub const CAP_FEAT_DIM: u64 = 2560;

/// Qwen3-4B.
pub const TEXT_HIDDEN: u64 = 2560;
pub const TEXT_INTERMEDIATE: u64 = 9728;
pub const TEXT_HEADS: u64 = 32;
pub const TEXT_KV_HEADS: u64 = 8;
pub const TEXT_HEAD_DIM: u64 = 128;
pub const VOCAB: u64 = 151936;

/// The FLUX.1 VAE.
pub const VAE_CHANNELS: [u64; 4] = [128, 256, 512, 512];
pub const VAE_LAYERS_PER_BLOCK: u64 = 2;
pub const VAE_GROUPS: u64 = 32;

/// Shards hold at most this many data bytes (Hugging Face's "4GB": 4·10⁹).
pub const MAX_SHARD_BYTES: u64 = 4_000_000_000;

/// Elements generated per work item: 2 Mi (4 MiB of bf16, 8 MiB of f32).
const CHUNK_ELEMS: u64 = 1 << 21;

/// Standard deviation of the pad tokens.
const PAD_TOKEN_STD: f32 = 0.02;

// --- The request ------------------------------------------------------------------------------

/// Storage dtype of every tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    Bf16,
    F32,
}

impl WeightDtype {
    pub fn bytes(self) -> u64 {
        match self {
            WeightDtype::Bf16 => 2,
            WeightDtype::F32 => 4,
        }
    }

    pub fn safetensors(self) -> safetensors::Dtype {
        match self {
            WeightDtype::Bf16 => safetensors::Dtype::BF16,
            WeightDtype::F32 => safetensors::Dtype::F32,
        }
    }

    /// The name `config.json` files use (`torch_dtype` / `dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            WeightDtype::Bf16 => "bfloat16",
            WeightDtype::F32 => "float32",
        }
    }
}

impl std::str::FromStr for WeightDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<WeightDtype, String> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(WeightDtype::Bf16),
            "f32" | "float32" => Ok(WeightDtype::F32),
            _ => Err(format!("unknown dtype `{s}` (bf16 or f32)")),
        }
    }
}

impl fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightDtype::Bf16 => "bf16",
            WeightDtype::F32 => "f32",
        })
    }
}

/// What to generate: the depth of each stack, the dtype and the seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Transformer `n_layers` (main blocks; real: 30).
    pub layers: u32,
    /// Transformer `n_refiner_layers` (noise and context refiners each; real: 2).
    pub refiner_layers: u32,
    /// Text encoder `num_hidden_layers` (real: 36; the pipeline runs all but the last).
    pub text_layers: u32,
    pub dtype: WeightDtype,
    pub seed: u64,
}

impl Spec {
    /// The depth of Z-Image-Turbo (30 / 2 / 36), bf16, seed 0.
    pub fn real() -> Spec {
        Spec {
            layers: 30,
            refiner_layers: 2,
            text_layers: 36,
            dtype: WeightDtype::Bf16,
            seed: 0,
        }
    }
}

// --- Tensors ----------------------------------------------------------------------------------

/// How a tensor is filled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Uniform, zero mean, with this standard deviation.
    Uniform(f32),
    /// Every element this value (norm weights 1, biases 0).
    Const(f32),
}

/// One tensor of a component.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDef {
    pub name: String,
    pub shape: Vec<u64>,
    pub init: Init,
}

impl TensorDef {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// Collects tensor definitions in module order.
#[derive(Default)]
struct Defs(Vec<TensorDef>);

impl Defs {
    fn push(&mut self, name: String, shape: &[u64], init: Init) {
        self.0.push(TensorDef {
            name,
            shape: shape.to_vec(),
            init,
        });
    }
    /// A `Linear` weight `[out, in]`, std `1/sqrt(in)`, and its zero bias if any.
    fn linear(&mut self, prefix: &str, inp: u64, out: u64, bias: bool) {
        self.push(
            format!("{prefix}.weight"),
            &[out, inp],
            Init::Uniform(fan_in_std(inp)),
        );
        if bias {
            self.push(format!("{prefix}.bias"), &[out], Init::Const(0.0));
        }
    }
    /// A norm weight of ones.
    fn norm(&mut self, prefix: &str, dim: u64) {
        self.push(format!("{prefix}.weight"), &[dim], Init::Const(1.0));
    }
    /// A GroupNorm: weight ones, bias zeros.
    fn group_norm(&mut self, prefix: &str, dim: u64) {
        self.norm(prefix, dim);
        self.push(format!("{prefix}.bias"), &[dim], Init::Const(0.0));
    }
    /// A conv `[out, in, k, k]` with bias, std `1/sqrt(in·k·k)`.
    fn conv(&mut self, prefix: &str, inp: u64, out: u64, k: u64) {
        self.push(
            format!("{prefix}.weight"),
            &[out, inp, k, k],
            Init::Uniform(fan_in_std(inp * k * k)),
        );
        self.push(format!("{prefix}.bias"), &[out], Init::Const(0.0));
    }
}

fn fan_in_std(fan_in: u64) -> f32 {
    (1.0 / (fan_in as f64).sqrt()) as f32
}

/// The transformer's tensors (spec §3.1), in diffusers' module order.
pub fn transformer_tensors(spec: &Spec) -> Vec<TensorDef> {
    let mut d = Defs::default();
    d.push(
        "x_pad_token".into(),
        &[1, DIM],
        Init::Uniform(PAD_TOKEN_STD),
    );
    d.push(
        "cap_pad_token".into(),
        &[1, DIM],
        Init::Uniform(PAD_TOKEN_STD),
    );
    d.linear("all_x_embedder.2-1", PATCH_FEATURES, DIM, true);
    d.linear("all_final_layer.2-1.linear", DIM, PATCH_FEATURES, true);
    d.linear(
        "all_final_layer.2-1.adaLN_modulation.1",
        ADALN_DIM,
        DIM,
        true,
    );
    let block = |d: &mut Defs, p: String, modulated: bool| {
        for proj in ["to_q", "to_k", "to_v", "to_out.0"] {
            d.linear(&format!("{p}.attention.{proj}"), DIM, DIM, false);
        }
        d.norm(&format!("{p}.attention.norm_q"), HEAD_DIM);
        d.norm(&format!("{p}.attention.norm_k"), HEAD_DIM);
        d.linear(&format!("{p}.feed_forward.w1"), DIM, FFN_DIM, false);
        d.linear(&format!("{p}.feed_forward.w2"), FFN_DIM, DIM, false);
        d.linear(&format!("{p}.feed_forward.w3"), DIM, FFN_DIM, false);
        for n in [
            "attention_norm1",
            "ffn_norm1",
            "attention_norm2",
            "ffn_norm2",
        ] {
            d.norm(&format!("{p}.{n}"), DIM);
        }
        if modulated {
            d.linear(&format!("{p}.adaLN_modulation.0"), ADALN_DIM, 4 * DIM, true);
        }
    };
    for i in 0..spec.refiner_layers {
        block(&mut d, format!("noise_refiner.{i}"), true);
    }
    for i in 0..spec.refiner_layers {
        block(&mut d, format!("context_refiner.{i}"), false);
    }
    d.linear("t_embedder.mlp.0", ADALN_DIM, T_MLP_HIDDEN, true);
    d.linear("t_embedder.mlp.2", T_MLP_HIDDEN, ADALN_DIM, true);
    d.norm("cap_embedder.0", CAP_FEAT_DIM);
    d.linear("cap_embedder.1", CAP_FEAT_DIM, DIM, true);
    for i in 0..spec.layers {
        block(&mut d, format!("layers.{i}"), true);
    }
    d.0
}

/// A Qwen3 text encoder's widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextWidths {
    pub hidden: u64,
    pub intermediate: u64,
    pub heads: u64,
    pub kv_heads: u64,
}

/// Qwen3-4B's, Z-Image's text encoder (spec §1.4).
pub const QWEN3_4B: TextWidths = TextWidths {
    hidden: TEXT_HIDDEN,
    intermediate: TEXT_INTERMEDIATE,
    heads: TEXT_HEADS,
    kv_heads: TEXT_KV_HEADS,
};

/// The text encoder's tensors (spec §2.6) as a `Qwen3ForCausalLM` save, in module order.
pub fn text_encoder_tensors(spec: &Spec) -> Vec<TensorDef> {
    qwen3_tensors(&QWEN3_4B, spec.text_layers)
}

/// A Qwen3 of widths `w` and `layers` layers, as a `Qwen3ForCausalLM` save, in module order.
pub fn qwen3_tensors(w: &TextWidths, layers: u32) -> Vec<TensorDef> {
    let (text_hidden, text_intermediate) = (w.hidden, w.intermediate);
    let mut d = Defs::default();
    d.push(
        "model.embed_tokens.weight".into(),
        &[VOCAB, text_hidden],
        Init::Uniform(fan_in_std(text_hidden)),
    );
    let (q, kv) = (w.heads * TEXT_HEAD_DIM, w.kv_heads * TEXT_HEAD_DIM);
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        d.linear(&format!("{p}.self_attn.q_proj"), text_hidden, q, false);
        d.linear(&format!("{p}.self_attn.k_proj"), text_hidden, kv, false);
        d.linear(&format!("{p}.self_attn.v_proj"), text_hidden, kv, false);
        d.linear(&format!("{p}.self_attn.o_proj"), q, text_hidden, false);
        d.norm(&format!("{p}.self_attn.q_norm"), TEXT_HEAD_DIM);
        d.norm(&format!("{p}.self_attn.k_norm"), TEXT_HEAD_DIM);
        let mlp = format!("{p}.mlp");
        d.linear(
            &format!("{mlp}.gate_proj"),
            text_hidden,
            text_intermediate,
            false,
        );
        d.linear(
            &format!("{mlp}.up_proj"),
            text_hidden,
            text_intermediate,
            false,
        );
        d.linear(
            &format!("{mlp}.down_proj"),
            text_intermediate,
            text_hidden,
            false,
        );
        d.norm(&format!("{p}.input_layernorm"), text_hidden);
        d.norm(&format!("{p}.post_attention_layernorm"), text_hidden);
    }
    d.norm("model.norm", text_hidden);
    d.0
}

/// The VAE's tensors (spec §5.2, §5.7): the encoder, then the decoder, in module order.
pub fn vae_tensors() -> Vec<TensorDef> {
    vae_tensors_with(IN_CHANNELS)
}

/// A FLUX VAE of `latent` channels (16: FLUX.1's, Z-Image's; 32: FLUX.2's), without the
/// 1×1 convolutions and statistics FLUX.2 adds.
pub fn vae_tensors_with(latent: u64) -> Vec<TensorDef> {
    let mut d = Defs::default();
    let g = |d: &mut Defs, p: &str, c: u64| d.group_norm(p, c);
    let resnet = |d: &mut Defs, p: &str, cin: u64, cout: u64| {
        g(d, &format!("{p}.norm1"), cin);
        d.conv(&format!("{p}.conv1"), cin, cout, 3);
        g(d, &format!("{p}.norm2"), cout);
        d.conv(&format!("{p}.conv2"), cout, cout, 3);
        if cin != cout {
            d.conv(&format!("{p}.conv_shortcut"), cin, cout, 1);
        }
    };
    // The encoder: image → 2 × 16 moments, halving the size after every block but the last.
    d.conv("encoder.conv_in", 3, VAE_CHANNELS[0], 3);
    for (i, &cout) in VAE_CHANNELS.iter().enumerate() {
        let cin = if i == 0 { cout } else { VAE_CHANNELS[i - 1] };
        for r in 0..VAE_LAYERS_PER_BLOCK {
            let p = format!("encoder.down_blocks.{i}.resnets.{r}");
            resnet(&mut d, &p, if r == 0 { cin } else { cout }, cout);
        }
        if i + 1 < VAE_CHANNELS.len() {
            let p = format!("encoder.down_blocks.{i}.downsamplers.0.conv");
            d.conv(&p, cout, cout, 3);
        }
    }
    let bottom = VAE_CHANNELS[VAE_CHANNELS.len() - 1];
    let a = "encoder.mid_block.attentions.0";
    g(&mut d, &format!("{a}.group_norm"), bottom);
    for proj in ["to_q", "to_k", "to_v", "to_out.0"] {
        d.linear(&format!("{a}.{proj}"), bottom, bottom, true);
    }
    for r in 0..2 {
        resnet(
            &mut d,
            &format!("encoder.mid_block.resnets.{r}"),
            bottom,
            bottom,
        );
    }
    g(&mut d, "encoder.conv_norm_out", bottom);
    d.conv("encoder.conv_out", bottom, 2 * latent, 3);

    let rev: Vec<u64> = VAE_CHANNELS.iter().rev().copied().collect();
    let top = rev[0];
    d.conv("decoder.conv_in", latent, top, 3);
    for (i, &cout) in rev.iter().enumerate() {
        let cin = if i == 0 { top } else { rev[i - 1] };
        for r in 0..=VAE_LAYERS_PER_BLOCK {
            let p = format!("decoder.up_blocks.{i}.resnets.{r}");
            resnet(&mut d, &p, if r == 0 { cin } else { cout }, cout);
        }
        if i + 1 < rev.len() {
            d.conv(
                &format!("decoder.up_blocks.{i}.upsamplers.0.conv"),
                cout,
                cout,
                3,
            );
        }
    }
    let a = "decoder.mid_block.attentions.0";
    g(&mut d, &format!("{a}.group_norm"), top);
    for proj in ["to_q", "to_k", "to_v", "to_out.0"] {
        d.linear(&format!("{a}.{proj}"), top, top, true);
    }
    for r in 0..2 {
        resnet(&mut d, &format!("decoder.mid_block.resnets.{r}"), top, top);
    }
    let last = rev[rev.len() - 1];
    g(&mut d, "decoder.conv_norm_out", last);
    d.conv("decoder.conv_out", last, 3, 3);
    d.0
}

// --- Planning: files, headers, sizes ----------------------------------------------------------

/// One safetensors file of a component.
#[derive(Debug, Clone)]
pub struct FilePlan {
    /// File name inside the component folder.
    pub name: String,
    /// Indices into the component's tensors, in file order (sorted by name).
    pub tensors: Vec<usize>,
    /// Length prefix + header JSON + padding.
    pub header: Vec<u8>,
    /// Absolute file offset of each tensor's data, parallel to `tensors`.
    pub offsets: Vec<u64>,
    pub len: u64,
}

/// One component's tensors and files.
#[derive(Debug, Clone)]
pub struct ComponentPlan {
    pub component: &'static str,
    pub tensors: Vec<TensorDef>,
    pub files: Vec<FilePlan>,
    /// `(file name, JSON)` of the shard index, if the component is sharded.
    pub index: Option<(String, String)>,
}

/// Per-component totals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentSummary {
    pub component: &'static str,
    pub tensors: usize,
    pub params: u64,
    /// Tensor data bytes (the index's `total_size`).
    pub data_bytes: u64,
    /// Bytes of the safetensors files, headers included.
    pub file_bytes: u64,
    pub files: usize,
}

/// What a model is (or would be) on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub spec_dtype: WeightDtype,
    pub components: Vec<ComponentSummary>,
}

impl Summary {
    pub fn params(&self) -> u64 {
        self.components.iter().map(|c| c.params).sum()
    }
    pub fn data_bytes(&self) -> u64 {
        self.components.iter().map(|c| c.data_bytes).sum()
    }
    pub fn file_bytes(&self) -> u64 {
        self.components.iter().map(|c| c.file_bytes).sum()
    }
    pub fn component(&self, name: &str) -> Option<&ComponentSummary> {
        self.components.iter().find(|c| c.component == name)
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<14}{:>8}{:>16}{:>18}{:>7}",
            "component", "tensors", "params", "bytes", "files"
        )?;
        for c in &self.components {
            writeln!(
                f,
                "{:<14}{:>8}{:>16}{:>18}{:>7}",
                c.component,
                c.tensors,
                group(c.params),
                group(c.file_bytes),
                c.files
            )?;
        }
        write!(
            f,
            "{:<14}{:>8}{:>16}{:>18}{:>7}   ({} of tensor data, {})",
            "total",
            self.components.iter().map(|c| c.tensors).sum::<usize>(),
            group(self.params()),
            group(self.file_bytes()),
            self.components.iter().map(|c| c.files).sum::<usize>(),
            group(self.data_bytes()),
            self.spec_dtype
        )
    }
}

/// `12345678` → `12,345,678`.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Splits tensors (in order) into runs of at most `max` data bytes; a tensor larger than `max`
/// gets a shard of its own.
fn shard(tensors: &[TensorDef], esize: u64, max: u64) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut size = 0;
    for (i, t) in tensors.iter().enumerate() {
        let n = t.numel() * esize;
        if shards.is_empty() || (size + n > max && size > 0) {
            shards.push(Vec::new());
            size = 0;
        }
        shards.last_mut().expect("pushed").push(i);
        size += n;
    }
    shards
}

fn file_plan(name: String, tensors: &[TensorDef], mut idx: Vec<usize>, spec: &Spec) -> FilePlan {
    idx.sort_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name));
    let specs: Vec<TensorSpec> = idx
        .iter()
        .map(|&i| TensorSpec {
            name: tensors[i].name.clone(),
            dtype: spec.dtype.safetensors(),
            shape: tensors[i].shape.clone(),
        })
        .collect();
    let header = safetensors::header_bytes(&specs, None, 8).expect("valid tensor specs");
    let mut offsets = Vec::with_capacity(idx.len());
    let mut at = header.len() as u64;
    for &i in &idx {
        offsets.push(at);
        at += tensors[i].numel() * spec.dtype.bytes();
    }
    FilePlan {
        name,
        tensors: idx,
        header,
        offsets,
        len: at,
    }
}

/// A component's files: `stem.safetensors` when `always_index` is false and it fits one shard,
/// else `stem-0000i-of-0000n.safetensors` with `index_name`.
fn component_plan(
    component: &'static str,
    tensors: Vec<TensorDef>,
    stem: &str,
    index_name: &str,
    always_index: bool,
    extra_index_metadata: bool,
    spec: &Spec,
) -> ComponentPlan {
    let shards = shard(&tensors, spec.dtype.bytes(), MAX_SHARD_BYTES);
    let n = shards.len();
    if n == 1 && !always_index {
        let f = file_plan(
            format!("{stem}.safetensors"),
            &tensors,
            shards[0].clone(),
            spec,
        );
        return ComponentPlan {
            component,
            tensors,
            files: vec![f],
            index: None,
        };
    }
    let files: Vec<FilePlan> = shards
        .into_iter()
        .enumerate()
        .map(|(i, idx)| {
            let name = format!("{stem}-{:05}-of-{n:05}.safetensors", i + 1);
            file_plan(name, &tensors, idx, spec)
        })
        .collect();
    let mut weight_map = BTreeMap::new();
    for f in &files {
        for &i in &f.tensors {
            weight_map.insert(tensors[i].name.clone(), f.name.clone());
        }
    }
    let total_size: u64 = tensors.iter().map(|t| t.numel() * spec.dtype.bytes()).sum();
    let mut metadata = serde_json::Map::new();
    if extra_index_metadata {
        let params: u64 = tensors.iter().map(|t| t.numel()).sum();
        metadata.insert("total_parameters".into(), params.into());
    }
    metadata.insert("total_size".into(), total_size.into());
    let json = serde_json::json!({ "metadata": metadata, "weight_map": weight_map });
    let text = serde_json::to_string_pretty(&json).expect("JSON serializes") + "\n";
    ComponentPlan {
        component,
        tensors,
        files,
        index: Some((index_name.to_string(), text)),
    }
}

/// The files of every component, in the order they are listed (`text_encoder`, `transformer`,
/// `vae`).
pub fn plan_components(spec: &Spec) -> Vec<ComponentPlan> {
    vec![
        component_plan(
            "text_encoder",
            text_encoder_tensors(spec),
            "model",
            "model.safetensors.index.json",
            true,
            true,
            spec,
        ),
        component_plan(
            "transformer",
            transformer_tensors(spec),
            "diffusion_pytorch_model",
            "diffusion_pytorch_model.safetensors.index.json",
            false,
            false,
            spec,
        ),
        component_plan(
            "vae",
            vae_tensors(),
            "diffusion_pytorch_model",
            "diffusion_pytorch_model.safetensors.index.json",
            false,
            false,
            spec,
        ),
    ]
}

fn summarize(spec: &Spec, plans: &[ComponentPlan]) -> Summary {
    Summary {
        spec_dtype: spec.dtype,
        components: plans
            .iter()
            .map(|p| ComponentSummary {
                component: p.component,
                tensors: p.tensors.len(),
                params: p.tensors.iter().map(|t| t.numel()).sum(),
                data_bytes: p
                    .tensors
                    .iter()
                    .map(|t| t.numel() * spec.dtype.bytes())
                    .sum(),
                file_bytes: p.files.iter().map(|f| f.len).sum(),
                files: p.files.len(),
            })
            .collect(),
    }
}

/// The summary of what [`write`] would write for `spec`, without writing anything.
pub fn plan(spec: &Spec) -> Summary {
    summarize(spec, &plan_components(spec))
}

// --- Configuration files ----------------------------------------------------------------------

fn pretty(v: serde_json::Value) -> String {
    serde_json::to_string_pretty(&v).expect("JSON serializes") + "\n"
}

/// The `config.json` of a Qwen3 of widths `w` and `layers` layers, stored in `dtype`.
pub fn qwen3_config(w: &TextWidths, layers: u32, dtype: WeightDtype) -> serde_json::Value {
    use serde_json::json;
    json!({
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "dtype": dtype.torch_name(),
        "eos_token_id": 151645,
        "head_dim": TEXT_HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": w.hidden,
        "initializer_range": 0.02,
        "intermediate_size": w.intermediate,
        "layer_types": vec!["full_attention"; layers as usize],
        "max_position_embeddings": 40960,
        "max_window_layers": 36,
        "model_type": "qwen3",
        "num_attention_heads": w.heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": w.kv_heads,
        "pad_token_id": null,
        "rms_norm_eps": 1e-6,
        "rope_parameters": { "rope_theta": 1000000.0, "rope_type": "default" },
        "sliding_window": null,
        "tie_word_embeddings": true,
        "transformers_version": "5.23.0",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": VOCAB,
    })
}

/// `(path relative to the model directory, contents)` of every JSON configuration file.
pub fn config_files(spec: &Spec) -> Vec<(String, String)> {
    use serde_json::json;
    let diffusers_version = "0.36.0.dev0";
    let model_index = json!({
        "_class_name": "ZImagePipeline",
        "_diffusers_version": diffusers_version,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3Model"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "ZImageTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    });
    let scheduler = json!({
        "_class_name": "FlowMatchEulerDiscreteScheduler",
        "_diffusers_version": diffusers_version,
        "num_train_timesteps": 1000,
        "use_dynamic_shifting": false,
        "shift": 3.0,
    });
    let text_encoder = qwen3_config(&QWEN3_4B, spec.text_layers, spec.dtype);
    let transformer = json!({
        "_class_name": "ZImageTransformer2DModel",
        "_diffusers_version": diffusers_version,
        "all_f_patch_size": [1],
        "all_patch_size": [2],
        "axes_dims": [32, 48, 48],
        "axes_lens": [1536, 512, 512],
        "cap_feat_dim": CAP_FEAT_DIM,
        "dim": DIM,
        "in_channels": IN_CHANNELS,
        "n_heads": N_HEADS,
        "n_kv_heads": N_HEADS,
        "n_layers": spec.layers,
        "n_refiner_layers": spec.refiner_layers,
        "norm_eps": 1e-5,
        "qk_norm": true,
        "rope_theta": 256.0,
        "siglip_feat_dim": null,
        "t_scale": 1000.0,
    });
    let vae = vae_config(diffusers_version);
    vec![
        ("scheduler/scheduler_config.json".into(), pretty(scheduler)),
        ("text_encoder/config.json".into(), pretty(text_encoder)),
        ("transformer/config.json".into(), pretty(transformer)),
        ("vae/config.json".into(), pretty(vae)),
        ("model_index.json".into(), pretty(model_index)),
    ]
}

/// `vae/config.json` of the FLUX.1 VAE Z-Image shares (zimage-spec §1.6, flux1-spec §1.6), as
/// diffusers `version` saves it.
pub fn vae_config(version: &str) -> serde_json::Value {
    serde_json::json!({
        "_class_name": "AutoencoderKL",
        "_diffusers_version": version,
        "act_fn": "silu",
        "block_out_channels": VAE_CHANNELS,
        "down_block_types": vec!["DownEncoderBlock2D"; 4],
        "force_upcast": true,
        "in_channels": 3,
        "latent_channels": IN_CHANNELS,
        "latents_mean": null,
        "latents_std": null,
        "layers_per_block": VAE_LAYERS_PER_BLOCK,
        "mid_block_add_attention": true,
        "norm_num_groups": VAE_GROUPS,
        "out_channels": 3,
        "sample_size": 1024,
        "scaling_factor": 0.3611,
        "shift_factor": 0.1159,
        "up_block_types": vec!["UpDecoderBlock2D"; 4],
        "use_post_quant_conv": false,
        "use_quant_conv": false,
    })
}

/// The demo model's tokenizer folder: the real Qwen vocabulary.
pub fn tokenizer_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny/tokenizer")
}

// --- Values -----------------------------------------------------------------------------------

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output mixer.
#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The stream key of one tensor: the seed and the tensor's `component/name` (FNV-1a).
pub fn tensor_key(seed: u64, component: &str, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in component.bytes().chain([b'/']).chain(name.bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(seed ^ mix(h))
}

/// 65,536 uniform levels in (-a, a), a = std·√3, as bit patterns of the storage dtype. A
/// fixed-size array, so that indexing it with a masked 16-bit value is cheap even unoptimized.
struct Table(Box<[u32; 65536]>);

impl Table {
    fn new(std: f32, dtype: WeightDtype) -> Table {
        let a = std as f64 * 3f64.sqrt();
        let mut t = Box::new([0u32; 65536]);
        for (i, bits) in t.iter_mut().enumerate() {
            let v = ((i as f64 + 0.5) / 32768.0 - 1.0) * a;
            *bits = match dtype {
                WeightDtype::F32 => (v as f32).to_bits(),
                WeightDtype::Bf16 => half::bf16::from_f32(v as f32).to_bits() as u32,
            };
        }
        Table(t)
    }
}

/// The bit pattern of a constant.
fn const_bits(v: f32, dtype: WeightDtype) -> u64 {
    match dtype {
        WeightDtype::F32 => {
            let b = v.to_bits() as u64;
            b | b << 32
        }
        WeightDtype::Bf16 => {
            let b = half::bf16::from_f32(v).to_bits() as u64;
            b | b << 16 | b << 32 | b << 48
        }
    }
}

/// Fills `words` (little-endian u64s packing 4 bf16 or 2 f32 elements) with elements
/// `start..` of the tensor whose stream is `key`. Element `j` takes 16-bit quarter `j % 4` of
/// `mix(key + (j / 4)·γ)`; `start` is a multiple of 4.
fn fill_uniform(key: u64, start: u64, table: &Table, dtype: WeightDtype, words: &mut [u64]) {
    debug_assert_eq!(start % 4, 0);
    let t: &[u32; 65536] = &table.0;
    let mut k = key.wrapping_add((start / 4).wrapping_mul(GAMMA));
    let n = words.len();
    let mut i = 0;
    // Plain indexed loops: a debug build (the tests) runs them at over 1 GB/s too.
    match dtype {
        WeightDtype::Bf16 => {
            while i < n {
                let z = mix(k);
                k = k.wrapping_add(GAMMA);
                words[i] = t[(z & 0xffff) as usize] as u64
                    | (t[((z >> 16) & 0xffff) as usize] as u64) << 16
                    | (t[((z >> 32) & 0xffff) as usize] as u64) << 32
                    | (t[(z >> 48) as usize] as u64) << 48;
                i += 1;
            }
        }
        WeightDtype::F32 => {
            while i < n {
                let z = mix(k);
                k = k.wrapping_add(GAMMA);
                words[i] = t[(z & 0xffff) as usize] as u64
                    | (t[((z >> 16) & 0xffff) as usize] as u64) << 32;
                if i + 1 < n {
                    words[i + 1] = t[((z >> 32) & 0xffff) as usize] as u64
                        | (t[(z >> 48) as usize] as u64) << 32;
                }
                i += 2;
            }
        }
    }
}

/// The little-endian bytes of `words`.
fn le_bytes(words: &[u64]) -> std::borrow::Cow<'_, [u8]> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: u64 has no padding and u8 has alignment 1; the length is in bytes.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(words.as_ptr() as *const u8, std::mem::size_of_val(words))
        })
    }
    #[cfg(not(target_endian = "little"))]
    {
        std::borrow::Cow::Owned(words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }
}

/// Elements `start..start + count` of a tensor, as stored bytes (for checks).
pub fn tensor_bytes(
    spec: &Spec,
    component: &str,
    t: &TensorDef,
    start: u64,
    count: u64,
) -> Vec<u8> {
    assert_eq!(start % 4, 0, "start must be a multiple of 4");
    let esize = spec.dtype.bytes();
    let mut words = vec![0u64; (count * esize).div_ceil(8) as usize];
    match t.init {
        Init::Const(v) => words.fill(const_bits(v, spec.dtype)),
        Init::Uniform(std) => fill_uniform(
            tensor_key(spec.seed, component, &t.name),
            start,
            &Table::new(std, spec.dtype),
            spec.dtype,
            &mut words,
        ),
    }
    let mut bytes = le_bytes(&words).into_owned();
    bytes.truncate((count * esize) as usize);
    bytes
}

// --- Writing ----------------------------------------------------------------------------------

/// One chunk of one tensor: where it goes and how to make it.
struct Job {
    file: usize,
    offset: u64,
    key: u64,
    init: Init,
    table: Option<Arc<Table>>,
    start: u64,
    count: u64,
}

/// A file written in place through a temp file beside its final path.
struct PendingFile {
    path: PathBuf,
    tmp: zimage::files::TempFile,
}

fn temp_beside(path: &Path) -> Result<zimage::files::TempFile> {
    zimage::files::TempFile::beside(path, ".zimage-synthetic-")
        .with_context(|| format!("cannot create a temp file beside `{}`", path.display()))
}

/// Writes `bytes` to `path` atomically: temp file, fsync (if `sync`), rename.
fn write_atomic(path: &Path, bytes: &[u8], sync: bool) -> Result<()> {
    use std::io::Write;
    let mut tmp = temp_beside(path)?;
    tmp.write_all(bytes)
        .and_then(|_| {
            if sync {
                tmp.as_file().sync_all()
            } else {
                Ok(())
            }
        })
        .with_context(|| format!("cannot write `{}`", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("cannot rename into `{}`", path.display()))?;
    Ok(())
}

/// How [`write_with`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// fsync every file before its rename (durable as well as atomic). Off only for scratch
    /// models that are deleted right after use: the rename stays atomic either way.
    pub sync: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options { sync: true }
    }
}

/// Where the time of a [`write_with`] went.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    /// Generating the tensor data and writing it into the temp files (to the page cache).
    pub generate_s: f64,
    /// fsync of the weight files (0 without [`Options::sync`]).
    pub sync_s: f64,
    /// The whole call.
    pub total_s: f64,
}

/// Writes a synthetic Z-Image-Turbo for `spec` into `dir`, which must not exist or be empty,
/// every file fsynced before its rename. Returns what was written.
pub fn write(dir: &Path, spec: &Spec) -> Result<Summary> {
    write_with(dir, spec, &Options::default()).map(|(s, _)| s)
}

/// [`write`] with options, also returning where the time went.
pub fn write_with(dir: &Path, spec: &Spec, opts: &Options) -> Result<(Summary, Timing)> {
    write_parts(dir, spec, plan_components(spec), config_files(spec), opts)
}

/// Writes the components `plans` and the JSON files `configs` into `dir` (the demo model's
/// tokenizer copied), the values in `spec`'s dtype from its seed.
fn write_parts(
    dir: &Path,
    spec: &Spec,
    plans: Vec<ComponentPlan>,
    configs: Vec<(String, String)>,
    opts: &Options,
) -> Result<(Summary, Timing)> {
    let tokenizers = [("tokenizer", tokenizer_source())];
    write_parts_from(dir, spec, plans, configs, &tokenizers, opts)
}

/// [`write_parts`] with tokenizer folders copied from elsewhere: each `(folder, source)` gets
/// the files of `source`, but for those the configs write themselves. The folders made are
/// those the components and configs name, and the tokenizers'.
fn write_parts_from(
    dir: &Path,
    spec: &Spec,
    plans: Vec<ComponentPlan>,
    configs: Vec<(String, String)>,
    tokenizers: &[(&str, PathBuf)],
    opts: &Options,
) -> Result<(Summary, Timing)> {
    let started = std::time::Instant::now();
    #[cfg(unix)]
    use std::os::unix::fs::FileExt;

    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("cannot read `{}`", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "`{}` is not empty; remove it or choose another directory",
                dir.display()
            );
        }
    }
    let config_dirs = (configs.iter()).filter_map(|(rel, _)| Path::new(rel).parent());
    let subs: std::collections::BTreeSet<&Path> = (plans.iter())
        .map(|p| Path::new(p.component))
        .chain(config_dirs)
        .chain(tokenizers.iter().map(|(folder, _)| Path::new(*folder)))
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    for sub in subs {
        let p = dir.join(sub);
        std::fs::create_dir_all(&p).with_context(|| format!("cannot create `{}`", p.display()))?;
    }

    // Temp files with their headers, sized to their final length.
    let mut pending = Vec::new();
    let mut jobs = Vec::new();
    let mut tables: HashMap<u32, Arc<Table>> = HashMap::new();
    for p in &plans {
        for f in &p.files {
            let path = dir.join(p.component).join(&f.name);
            let tmp = temp_beside(&path)?;
            let io =
                |e| anyhow::Error::new(e).context(format!("cannot write `{}`", path.display()));
            tmp.as_file().set_len(f.len).map_err(io)?;
            tmp.as_file().write_all_at(&f.header, 0).map_err(io)?;
            let file = pending.len();
            for (&i, &offset) in f.tensors.iter().zip(&f.offsets) {
                let t = &p.tensors[i];
                let table = match t.init {
                    Init::Uniform(std) => Some(
                        tables
                            .entry(std.to_bits())
                            .or_insert_with(|| Arc::new(Table::new(std, spec.dtype)))
                            .clone(),
                    ),
                    Init::Const(_) => None,
                };
                let key = tensor_key(spec.seed, p.component, &t.name);
                let n = t.numel();
                let mut start = 0;
                while start < n {
                    let count = CHUNK_ELEMS.min(n - start);
                    jobs.push(Job {
                        file,
                        offset: offset + start * spec.dtype.bytes(),
                        key,
                        init: t.init,
                        table: table.clone(),
                        start,
                        count,
                    });
                    start += count;
                }
            }
            pending.push(PendingFile { path, tmp });
        }
    }

    // The data, chunks spread over the cores.
    let generating = std::time::Instant::now();
    let esize = spec.dtype.bytes();
    jobs.par_iter()
        .try_for_each_init(Vec::<u64>::new, |buf, job| -> Result<()> {
            let nbytes = job.count * esize;
            let nwords = nbytes.div_ceil(8) as usize;
            if buf.len() < nwords {
                *buf = vec![0; nwords];
            }
            let words = &mut buf[..nwords];
            match (job.init, &job.table) {
                (Init::Uniform(_), Some(table)) => {
                    fill_uniform(job.key, job.start, table, spec.dtype, words)
                }
                (Init::Const(v), _) => words.fill(const_bits(v, spec.dtype)),
                (Init::Uniform(_), None) => unreachable!("tables are made for uniform tensors"),
            }
            let bytes = le_bytes(words);
            let f = &pending[job.file];
            f.tmp
                .as_file()
                .write_all_at(&bytes[..nbytes as usize], job.offset)
                .with_context(|| format!("cannot write `{}`", f.path.display()))
        })?;

    let generate_s = generating.elapsed().as_secs_f64();

    // Land the weight files, then the indexes, configs and tokenizer; `model_index.json` last.
    let syncing = std::time::Instant::now();
    for f in pending {
        if opts.sync {
            f.tmp
                .as_file()
                .sync_all()
                .with_context(|| format!("cannot write `{}`", f.path.display()))?;
        }
        f.tmp
            .persist(&f.path)
            .with_context(|| format!("cannot rename into `{}`", f.path.display()))?;
    }
    let sync_s = if opts.sync {
        syncing.elapsed().as_secs_f64()
    } else {
        0.0
    };
    for p in &plans {
        if let Some((name, json)) = &p.index {
            write_atomic(
                &dir.join(p.component).join(name),
                json.as_bytes(),
                opts.sync,
            )?;
        }
    }
    for (folder, tokenizer) in tokenizers {
        let mut tok_files: Vec<PathBuf> = std::fs::read_dir(tokenizer)
            .with_context(|| format!("cannot read `{}`", tokenizer.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        tok_files.sort();
        for src in tok_files {
            let name = src.file_name().expect("a file has a name");
            let rel = Path::new(folder).join(name);
            if configs.iter().any(|(c, _)| Path::new(c) == rel) {
                continue;
            }
            let bytes =
                std::fs::read(&src).with_context(|| format!("cannot read `{}`", src.display()))?;
            write_atomic(&dir.join(rel), &bytes, opts.sync)?;
        }
    }
    for (rel, text) in configs {
        write_atomic(&dir.join(rel), text.as_bytes(), opts.sync)?;
    }
    let timing = Timing {
        generate_s,
        sync_s,
        total_s: started.elapsed().as_secs_f64(),
    };
    Ok((summarize(spec, &plans), timing))
}

// --- A ControlNet -----------------------------------------------------------------------------

/// Writes a Z-Image-Turbo Fun ControlNet Union of `version` at the real widths as its authors
/// publish it: one safetensors file, the tensors under diffusers' names, no config (zimage tells
/// the version from the tensors), bf16. Values as the model's: matrices uniform with std
/// `1/sqrt(fan_in)`, norm weights 1, biases 0, seeded by `spec.seed` and each name.
pub fn write_controlnet(
    path: &Path,
    version: zimage::families::zimage::ControlNetVersion,
    spec: &Spec,
) -> Result<u64> {
    use std::io::Write;
    let spec = Spec {
        dtype: WeightDtype::Bf16,
        ..spec.clone()
    };
    let defs: Vec<TensorDef> = (version.published_config().tensor_shapes().into_iter())
        .map(|(name, shape)| {
            let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
            let init = match shape.as_slice() {
                [_, fan_in] => Init::Uniform(fan_in_std(*fan_in)),
                _ if name.contains("norm") => Init::Const(1.0),
                _ => Init::Const(0.0),
            };
            TensorDef { name, shape, init }
        })
        .collect();
    let specs: Vec<TensorSpec> = (defs.iter())
        .map(|d| TensorSpec {
            name: d.name.clone(),
            dtype: safetensors::Dtype::BF16,
            shape: d.shape.clone(),
        })
        .collect();
    let header = safetensors::header_bytes(&specs, None, 8)?;
    let mut tmp = temp_beside(path)?;
    let mut out = std::io::BufWriter::with_capacity(8 << 20, tmp.as_file_mut());
    let io = |e| anyhow::anyhow!("cannot write `{}`: {e}", path.display());
    out.write_all(&header).map_err(io)?;
    let mut total = header.len() as u64;
    const CHUNK: u64 = 1 << 22;
    for d in &defs {
        let mut start = 0;
        while start < d.numel() {
            let count = CHUNK.min(d.numel() - start);
            out.write_all(&tensor_bytes(&spec, "controlnet", d, start, count))
                .map_err(io)?;
            start += count;
        }
        total += d.numel() * 2;
    }
    out.flush().map_err(io)?;
    drop(out);
    tmp.persist(path)
        .with_context(|| format!("cannot rename into `{}`", path.display()))?;
    Ok(total)
}
