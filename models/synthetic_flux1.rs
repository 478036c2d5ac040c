//! A synthetic FLUX.1 \[dev\], \[schnell\] or Kontext \[dev\]: the diffusers layout the Hub
//! repositories ship (flux1-spec §1), with the real widths, random weights and the depths asked
//! for, written by the same streaming writer as the synthetic Z-Image. Tensor names and shapes
//! are the Hub checkpoint's: the transformer as diffusers saves `FluxTransformer2DModel` (every
//! linear with a bias; the guidance embedder but on \[schnell\]; §11's right column and its
//! shapes), CLIP-L's text tower as a `CLIPTextModel` save (`text_model.`, §2.3), T5 v1.1 XXL's
//! encoder as a `T5EncoderModel` save (`shared.weight` once, block 0's relative attention
//! table, §3.6), and the 16-channel AutoencoderKL Z-Image shares (§1.6).
//!
//! The tokenizers are stand-ins: the tiny text encoders' CLIP BPE and T5 unigram files (their
//! vocabularies are small, so ids stay small), CLIP's window set to the real 77. The configs
//! state the real vocabularies (49408, 32128).

use super::{
    component_plan, fan_in_std, pretty, summarize, vae_config, vae_tensors, write_parts_from,
    ComponentPlan, Defs, Init, Options, Spec, Summary, TensorDef, Timing, WeightDtype,
};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// Which FLUX.1: the guidance-distilled \[dev\], the step-distilled \[schnell\] (no guidance
/// embedder, a static shift) or Kontext \[dev\] (\[dev\]'s transformer under the editing
/// pipeline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Dev,
    Schnell,
    Kontext,
}

impl Variant {
    /// Whether the transformer embeds the guidance scale (`guidance_embeds`).
    pub fn guidance(self) -> bool {
        self != Variant::Schnell
    }

    /// The pipeline class `model_index.json` names.
    pub fn pipeline_class(self) -> &'static str {
        match self {
            Variant::Kontext => "FluxKontextPipeline",
            _ => "FluxPipeline",
        }
    }
}

impl std::str::FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Variant, String> {
        match s.to_ascii_lowercase().as_str() {
            "dev" => Ok(Variant::Dev),
            "schnell" => Ok(Variant::Schnell),
            "kontext" => Ok(Variant::Kontext),
            _ => Err(format!("unknown FLUX.1 `{s}` (dev, schnell or kontext)")),
        }
    }
}

/// The depths of a FLUX.1 model: its transformer's two kinds of blocks and its two text
/// encoders' layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Double-stream blocks (`num_layers`).
    pub double_layers: u32,
    /// Single-stream blocks (`num_single_layers`).
    pub single_layers: u32,
    /// CLIP's layers (`num_hidden_layers`).
    pub clip_layers: u32,
    /// T5's blocks (`num_layers`).
    pub t5_layers: u32,
}

/// FLUX.1's depths: 19 double- and 38 single-stream blocks, CLIP-L's 12 layers, T5-XXL's 24.
pub const FLUX1: Size = Size {
    double_layers: 19,
    single_layers: 38,
    clip_layers: 12,
    t5_layers: 24,
};

/// The transformer: 24 heads × 128, a 4× MLP, 2×2 patches of 16 latent channels.
const HEADS: u64 = 24;
const HEAD_DIM: u64 = 128;
const D: u64 = HEADS * HEAD_DIM;
const MLP: u64 = 4 * D;
const IN_CHANNELS: u64 = 4 * super::IN_CHANNELS;
const SINUSOID: u64 = 256;

/// CLIP-L's text tower (spec §1.3).
pub const CLIP_HIDDEN: u64 = 768;
pub const CLIP_INTERMEDIATE: u64 = 3072;
pub const CLIP_HEADS: u64 = 12;
pub const CLIP_VOCAB: u64 = 49408;
pub const CLIP_POSITIONS: u64 = 77;

/// T5 v1.1 XXL's encoder (spec §1.4).
pub const T5_D_MODEL: u64 = 4096;
pub const T5_D_KV: u64 = 64;
pub const T5_HEADS: u64 = 64;
pub const T5_D_FF: u64 = 10240;
pub const T5_VOCAB: u64 = 32128;
pub const T5_BUCKETS: u64 = 32;

/// What to write: the variant, the depths, and the storage dtype and seed as for Z-Image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flux1Spec {
    pub variant: Variant,
    pub size: Size,
    pub dtype: WeightDtype,
    pub seed: u64,
}

impl Flux1Spec {
    /// The real model of `variant`, bf16, seed 0.
    pub fn real(variant: Variant) -> Flux1Spec {
        Flux1Spec {
            variant,
            size: FLUX1,
            dtype: WeightDtype::Bf16,
            seed: 0,
        }
    }

    /// What the shared writer reads of a spec: the dtype and the seed.
    fn storage(&self) -> Spec {
        Spec {
            dtype: self.dtype,
            seed: self.seed,
            ..Spec::real()
        }
    }
}

/// A table read by rows (token or position embeddings): uniform, std `1/sqrt(width)`.
fn table(d: &mut Defs, name: &str, rows: u64, width: u64) {
    d.push(
        name.into(),
        &[rows, width],
        Init::Uniform(fan_in_std(width)),
    );
}

/// The transformer's tensors (spec §1.2, §11), in the module order of diffusers' class; with
/// `guidance` the guidance embedder (\[dev\], Kontext).
pub fn transformer_tensors(size: &Size, guidance: bool) -> Vec<TensorDef> {
    let mut t = Defs::default();
    let lin = |t: &mut Defs, name: &str, inp: u64, out: u64| t.linear(name, inp, out, true);
    let mut embedders = vec![("timestep_embedder", SINUSOID)];
    if guidance {
        embedders.push(("guidance_embedder", SINUSOID));
    }
    embedders.push(("text_embedder", CLIP_HIDDEN));
    for (e, width) in embedders {
        lin(&mut t, &format!("time_text_embed.{e}.linear_1"), width, D);
        lin(&mut t, &format!("time_text_embed.{e}.linear_2"), D, D);
    }
    lin(&mut t, "context_embedder", T5_D_MODEL, D);
    lin(&mut t, "x_embedder", IN_CHANNELS, D);
    for b in 0..size.double_layers {
        let p = format!("transformer_blocks.{b}");
        lin(&mut t, &format!("{p}.norm1.linear"), D, 6 * D);
        lin(&mut t, &format!("{p}.norm1_context.linear"), D, 6 * D);
        t.norm(&format!("{p}.attn.norm_q"), HEAD_DIM);
        t.norm(&format!("{p}.attn.norm_k"), HEAD_DIM);
        for n in ["to_q", "to_k", "to_v", "to_out.0"] {
            lin(&mut t, &format!("{p}.attn.{n}"), D, D);
        }
        t.norm(&format!("{p}.attn.norm_added_q"), HEAD_DIM);
        t.norm(&format!("{p}.attn.norm_added_k"), HEAD_DIM);
        for n in ["add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"] {
            lin(&mut t, &format!("{p}.attn.{n}"), D, D);
        }
        for ff in ["ff", "ff_context"] {
            lin(&mut t, &format!("{p}.{ff}.net.0.proj"), D, MLP);
            lin(&mut t, &format!("{p}.{ff}.net.2"), MLP, D);
        }
    }
    for b in 0..size.single_layers {
        let p = format!("single_transformer_blocks.{b}");
        lin(&mut t, &format!("{p}.norm.linear"), D, 3 * D);
        lin(&mut t, &format!("{p}.proj_mlp"), D, MLP);
        lin(&mut t, &format!("{p}.proj_out"), D + MLP, D);
        t.norm(&format!("{p}.attn.norm_q"), HEAD_DIM);
        t.norm(&format!("{p}.attn.norm_k"), HEAD_DIM);
        for n in ["to_q", "to_k", "to_v"] {
            lin(&mut t, &format!("{p}.attn.{n}"), D, D);
        }
    }
    lin(&mut t, "norm_out.linear", D, 2 * D);
    lin(&mut t, "proj_out", D, IN_CHANNELS);
    t.0
}

/// CLIP's text tower (spec §2.3) of `layers` layers, as a `CLIPTextModel` save names it.
pub fn clip_tensors(layers: u32) -> Vec<TensorDef> {
    let (h, i) = (CLIP_HIDDEN, CLIP_INTERMEDIATE);
    let mut t = Defs::default();
    let e = "text_model.embeddings";
    table(
        &mut t,
        &format!("{e}.token_embedding.weight"),
        CLIP_VOCAB,
        h,
    );
    table(
        &mut t,
        &format!("{e}.position_embedding.weight"),
        CLIP_POSITIONS,
        h,
    );
    for l in 0..layers {
        let p = format!("text_model.encoder.layers.{l}");
        for n in ["k_proj", "v_proj", "q_proj", "out_proj"] {
            t.linear(&format!("{p}.self_attn.{n}"), h, h, true);
        }
        t.group_norm(&format!("{p}.layer_norm1"), h);
        t.linear(&format!("{p}.mlp.fc1"), h, i, true);
        t.linear(&format!("{p}.mlp.fc2"), i, h, true);
        t.group_norm(&format!("{p}.layer_norm2"), h);
    }
    t.group_norm("text_model.final_layer_norm", h);
    t.0
}

/// T5's encoder (spec §3.6) of `layers` blocks, as a `T5EncoderModel` save names it: the
/// token table once as `shared.weight` (`encoder.embed_tokens.weight` is the same tensor and
/// is not saved twice), block 0's relative attention table.
pub fn t5_tensors(layers: u32) -> Vec<TensorDef> {
    let (d, inner, ff) = (T5_D_MODEL, T5_HEADS * T5_D_KV, T5_D_FF);
    let mut t = Defs::default();
    table(&mut t, "shared.weight", T5_VOCAB, d);
    for b in 0..layers {
        let p = format!("encoder.block.{b}.layer");
        let a = format!("{p}.0.SelfAttention");
        for n in ["q", "k", "v"] {
            t.linear(&format!("{a}.{n}"), d, inner, false);
        }
        t.linear(&format!("{a}.o"), inner, d, false);
        if b == 0 {
            table(
                &mut t,
                &format!("{a}.relative_attention_bias.weight"),
                T5_BUCKETS,
                T5_HEADS,
            );
        }
        t.norm(&format!("{p}.0.layer_norm"), d);
        let f = format!("{p}.1.DenseReluDense");
        t.linear(&format!("{f}.wi_0"), d, ff, false);
        t.linear(&format!("{f}.wi_1"), d, ff, false);
        t.linear(&format!("{f}.wo"), ff, d, false);
        t.norm(&format!("{p}.1.layer_norm"), d);
    }
    t.norm("encoder.final_layer_norm", d);
    t.0
}

/// The files of every component, in the order the pipeline runs them.
pub fn plan_components(f: &Flux1Spec) -> Vec<ComponentPlan> {
    let spec = f.storage();
    let model = "diffusion_pytorch_model";
    let index = "diffusion_pytorch_model.safetensors.index.json";
    let text_index = "model.safetensors.index.json";
    vec![
        component_plan(
            "text_encoder",
            clip_tensors(f.size.clip_layers),
            "model",
            text_index,
            false,
            false,
            &spec,
        ),
        component_plan(
            "text_encoder_2",
            t5_tensors(f.size.t5_layers),
            "model",
            text_index,
            true,
            false,
            &spec,
        ),
        component_plan(
            "transformer",
            transformer_tensors(&f.size, f.variant.guidance()),
            model,
            index,
            false,
            false,
            &spec,
        ),
        component_plan("vae", vae_tensors(), model, index, false, false, &spec),
    ]
}

/// `text_encoder/config.json`: CLIP-L's text tower (spec §1.3), `layers` deep.
fn clip_config(layers: u32, dtype: WeightDtype) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["CLIPTextModel"],
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "dropout": 0.0,
        "dtype": dtype.torch_name(),
        "eos_token_id": 2,
        "hidden_act": "quick_gelu",
        "hidden_size": CLIP_HIDDEN,
        "initializer_factor": 1.0,
        "initializer_range": 0.02,
        "intermediate_size": CLIP_INTERMEDIATE,
        "layer_norm_eps": 1e-5,
        "max_position_embeddings": CLIP_POSITIONS,
        "model_type": "clip_text_model",
        "num_attention_heads": CLIP_HEADS,
        "num_hidden_layers": layers,
        "pad_token_id": 1,
        "projection_dim": 768,
        "transformers_version": "5.23.0",
        "vocab_size": CLIP_VOCAB,
    })
}

/// `text_encoder_2/config.json`: T5 v1.1 XXL's encoder (spec §1.4), `layers` deep.
fn t5_config(layers: u32, dtype: WeightDtype) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["T5EncoderModel"],
        "classifier_dropout": 0.0,
        "d_ff": T5_D_FF,
        "d_kv": T5_D_KV,
        "d_model": T5_D_MODEL,
        "decoder_start_token_id": 0,
        "dense_act_fn": "gelu_new",
        "dropout_rate": 0.1,
        "dtype": dtype.torch_name(),
        "eos_token_id": 1,
        "feed_forward_proj": "gated-gelu",
        "initializer_factor": 1.0,
        "is_encoder_decoder": true,
        "is_gated_act": true,
        "layer_norm_epsilon": 1e-6,
        "model_type": "t5",
        "num_decoder_layers": layers,
        "num_heads": T5_HEADS,
        "num_layers": layers,
        "pad_token_id": 0,
        "relative_attention_max_distance": 128,
        "relative_attention_num_buckets": T5_BUCKETS,
        "tie_word_embeddings": false,
        "transformers_version": "5.23.0",
        "use_cache": true,
        "vocab_size": T5_VOCAB,
    })
}

/// `scheduler/scheduler_config.json` (spec §1.7): \[dev\]'s (and Kontext's) shift on the line
/// of the image's token count; \[schnell\]'s static shift 1.
fn scheduler_config(variant: Variant, version: &str) -> serde_json::Value {
    let dynamic = variant != Variant::Schnell;
    serde_json::json!({
        "_class_name": "FlowMatchEulerDiscreteScheduler",
        "_diffusers_version": version,
        "base_image_seq_len": 256,
        "base_shift": 0.5,
        "max_image_seq_len": 4096,
        "max_shift": 1.15,
        "num_train_timesteps": 1000,
        "shift": if dynamic { 3.0 } else { 1.0 },
        "use_dynamic_shifting": dynamic,
    })
}

/// `(path, contents)` of every JSON configuration file (spec §1.1–1.7); `model_index.json`
/// last, so that the directory opens as a model only once everything else is in place.
pub fn config_files(f: &Flux1Spec) -> Vec<(String, String)> {
    use serde_json::json;
    let version = "0.42.1";
    let s = &f.size;
    let model_index = json!({
        "_class_name": f.variant.pipeline_class(),
        "_diffusers_version": version,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "FluxTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    });
    let transformer = json!({
        "_class_name": "FluxTransformer2DModel",
        "_diffusers_version": version,
        "attention_head_dim": HEAD_DIM,
        "axes_dims_rope": [16, 56, 56],
        "guidance_embeds": f.variant.guidance(),
        "in_channels": IN_CHANNELS,
        "joint_attention_dim": T5_D_MODEL,
        "num_attention_heads": HEADS,
        "num_layers": s.double_layers,
        "num_single_layers": s.single_layers,
        "out_channels": null,
        "patch_size": 1,
        "pooled_projection_dim": CLIP_HIDDEN,
    });
    vec![
        (
            "scheduler/scheduler_config.json".into(),
            pretty(scheduler_config(f.variant, version)),
        ),
        (
            "text_encoder/config.json".into(),
            pretty(clip_config(s.clip_layers, f.dtype)),
        ),
        (
            "text_encoder_2/config.json".into(),
            pretty(t5_config(s.t5_layers, f.dtype)),
        ),
        ("transformer/config.json".into(), pretty(transformer)),
        ("vae/config.json".into(), pretty(vae_config(version))),
        ("model_index.json".into(), pretty(model_index)),
    ]
}

/// The tokenizer folders written beside the model, `(folder, source)`: the tiny text
/// encoders' CLIP BPE (`tokenizer`) and T5 unigram (`tokenizer_2`) files.
pub fn tokenizer_sources() -> [(&'static str, PathBuf); 2] {
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/text-encoders-tiny");
    [
        ("tokenizer", tiny.join("tokenizer")),
        ("tokenizer_2", tiny.join("tokenizer_2")),
    ]
}

/// `tokenizer/tokenizer_config.json`: the stand-in's, with CLIP's real window (77).
pub fn clip_tokenizer_config() -> Result<String> {
    let path = tokenizer_sources()[0].1.join("tokenizer_config.json");
    let bytes =
        std::fs::read(&path).with_context(|| format!("cannot read `{}`", path.display()))?;
    let mut config: serde_json::Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("cannot parse `{}`", path.display()))?;
    config["model_max_length"] = CLIP_POSITIONS.into();
    Ok(pretty(config))
}

/// The summary of what [`write_with`] would write, without writing anything.
pub fn plan(f: &Flux1Spec) -> Summary {
    summarize(&f.storage(), &plan_components(f))
}

/// Writes the FLUX.1 model of `f` into `dir`, which must not exist or be empty.
pub fn write_with(dir: &Path, f: &Flux1Spec, opts: &Options) -> Result<(Summary, Timing)> {
    let mut configs = config_files(f);
    // Before the model index, which stays last.
    configs.insert(
        0,
        (
            "tokenizer/tokenizer_config.json".into(),
            clip_tokenizer_config()?,
        ),
    );
    let plans = plan_components(f);
    write_parts_from(
        dir,
        &f.storage(),
        plans,
        configs,
        &tokenizer_sources(),
        opts,
    )
}
