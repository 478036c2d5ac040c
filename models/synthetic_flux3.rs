//! A synthetic FLUX.3 \[klein\], step-distilled (a flow map) or base: the modular diffusers
//! layout FLUX.3 ships in, with the real widths (flux3-klein-spec §1.3–1.5, §10.1), random
//! weights and the depth asked for, written by the same streaming writer as the synthetic
//! Z-Image. Tensor names and shapes are the Hub checkpoint's: the transformer as diffusers saves
//! `Flux3Transformer2DModel` (no biases), the text encoder as the language model of a
//! `Qwen3VLForConditionalGeneration` save (`model.language_model.*`), the VAE as klein's
//! `AutoencoderKLFlux2`. The vision tower is left out: zimage never runs it, and its loader
//! lets it be absent. No scheduler folder: FLUX.3's blocks build theirs with a constant shift.

use super::{
    component_plan, klein, pretty, qwen3_tensors, summarize, write_parts_from, ComponentPlan, Defs,
    Options, Spec, Summary, TensorDef, TextWidths, Timing, WeightDtype, TEXT_HEAD_DIM, VOCAB,
};
use anyhow::Result;
use std::path::{Path, PathBuf};

/// A FLUX.3 model's size: its transformer's widths and depths, and its text encoder's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub heads: u64,
    /// Blocks of each of the three modes (`num_layers`).
    pub mode_layers: u32,
    /// Joint blocks (`num_single_layers`).
    pub single_layers: u32,
    pub text: TextWidths,
    pub text_layers: u32,
}

/// FLUX.3 \[klein\]: 3 × 5 mode blocks and 28 joint blocks of 24 heads × 128, over
/// Qwen3-VL-4B's language model (36 layers, of which the model reads the first 32).
pub const FLUX3_KLEIN: Size = Size {
    heads: 24,
    mode_layers: 5,
    single_layers: 28,
    text: super::QWEN3_4B,
    text_layers: 36,
};

/// Token features: 32 latent channels in 2×2 patches, for the image and the references alike.
const IN_CHANNELS: u64 = 4 * klein::LATENT;
const SINUSOID: u64 = 256;
const HEAD_DIM: u64 = 128;
/// The hidden states the transformer reads, stacked per token.
const STACKED_TEXT_LAYERS: u64 = 8;
/// The three modes, by the names of their blocks and modulation heads.
const MODES: [&str; 3] = ["image", "image_cond", "txt"];

/// What to write: the size, whether the transformer is a flow map (the step-distilled
/// checkpoint) or the base model, and the storage dtype and seed as for Z-Image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flux3Spec {
    pub size: Size,
    pub flow_map: bool,
    pub dtype: WeightDtype,
    pub seed: u64,
}

impl Flux3Spec {
    /// What the shared writer reads of a spec: the dtype and the seed.
    fn storage(&self) -> Spec {
        Spec {
            dtype: self.dtype,
            seed: self.seed,
            ..Spec::real()
        }
    }
}

/// The width of the stacked text features the transformer reads.
fn joint_attention_dim(size: &Size) -> u64 {
    STACKED_TEXT_LAYERS * size.text.hidden
}

/// The transformer's tensors (spec §10.1), in the module order of diffusers' class.
pub fn transformer_tensors(size: &Size, flow_map: bool) -> Vec<TensorDef> {
    let d = size.heads * HEAD_DIM;
    let m = 3 * d;
    let mut t = Defs::default();
    let lin = |t: &mut Defs, name: &str, inp: u64, out: u64| t.linear(name, inp, out, false);
    lin(&mut t, "x_embedders.image", IN_CHANNELS, d);
    lin(&mut t, "x_embedders.image_cond", IN_CHANNELS, d);
    lin(&mut t, "context_embedder", joint_attention_dim(size), d);
    let mut embedders = vec!["timestep_embedder"];
    if flow_map {
        embedders.push("target_timestep_embedder");
    }
    for e in embedders {
        lin(&mut t, &format!("{e}.linear_1"), SINUSOID, d);
        lin(&mut t, &format!("{e}.linear_2"), d, d);
    }
    for stage in ["early_stream_modulations", "single_stream_modulations"] {
        for mode in MODES {
            lin(&mut t, &format!("{stage}.{mode}.linear"), d, 3 * d);
        }
    }
    // Every block, of either stage, has the same tensors.
    let block = |t: &mut Defs, p: &str| {
        for n in ["to_q", "to_k", "to_v", "to_out.0"] {
            lin(t, &format!("{p}.attn.{n}"), d, d);
        }
        t.norm(&format!("{p}.attn.norm_q"), HEAD_DIM);
        t.norm(&format!("{p}.attn.norm_k"), HEAD_DIM);
        lin(t, &format!("{p}.ff.linear_in"), d, 2 * m);
        lin(t, &format!("{p}.ff.linear_out"), m, d);
    };
    for mode in ["image", "image_cond"] {
        for b in 0..size.mode_layers {
            block(&mut t, &format!("mode_blocks.{mode}.{b}"));
        }
    }
    for b in 0..size.mode_layers {
        block(&mut t, &format!("txt_mode_blocks.{b}"));
    }
    for b in 0..size.single_layers {
        block(&mut t, &format!("single_transformer_blocks.{b}"));
    }
    lin(&mut t, "norm_out.linear", d, 2 * d);
    lin(&mut t, "proj_out", d, IN_CHANNELS);
    t.0
}

/// The text encoder's tensors (spec §1.4): a Qwen3 language model under the names a
/// `Qwen3VLForConditionalGeneration` save gives it.
pub fn text_encoder_tensors(size: &Size) -> Vec<TensorDef> {
    let mut tensors = qwen3_tensors(&size.text, size.text_layers);
    for t in &mut tensors {
        let rest = t.name.strip_prefix("model.").expect("a causal-LM name");
        t.name = format!("model.language_model.{rest}");
    }
    tensors
}

/// The files of every component.
pub fn plan_components(f: &Flux3Spec) -> Vec<ComponentPlan> {
    let spec = f.storage();
    let model = "diffusion_pytorch_model";
    let index = "diffusion_pytorch_model.safetensors.index.json";
    vec![
        component_plan(
            "text_encoder",
            text_encoder_tensors(&f.size),
            "model",
            "model.safetensors.index.json",
            true,
            true,
            &spec,
        ),
        component_plan(
            "transformer",
            transformer_tensors(&f.size, f.flow_map),
            model,
            index,
            false,
            false,
            &spec,
        ),
        component_plan(
            "vae",
            klein::vae_tensors(),
            model,
            index,
            false,
            false,
            &spec,
        ),
    ]
}

/// The pipeline and blocks classes of the variant (spec §1.1).
fn pipeline_classes(flow_map: bool) -> (&'static str, &'static str) {
    match flow_map {
        true => ("Flux3DistilledModularPipeline", "Flux3DistilledAutoBlocks"),
        false => ("Flux3ModularPipeline", "Flux3AutoBlocks"),
    }
}

/// `modular_model_index.json`: every component `[library, class, {…}]`, loaded from its own
/// folder of this repository, as diffusers' modular pipelines save it.
fn modular_index(flow_map: bool, version: &str) -> serde_json::Value {
    let (pipeline, blocks) = pipeline_classes(flow_map);
    let mut index = serde_json::json!({
        "_class_name": pipeline,
        "_blocks_class_name": blocks,
        "_diffusers_version": version,
    });
    for (component, library, class) in [
        (
            "text_encoder",
            "transformers",
            "Qwen3VLForConditionalGeneration",
        ),
        ("tokenizer", "transformers", "AutoProcessor"),
        ("transformer", "diffusers", "Flux3Transformer2DModel"),
        ("vae", "diffusers", "AutoencoderKLFlux2"),
    ] {
        index[component] = serde_json::json!([library, class, {
            "pretrained_model_name_or_path": null,
            "subfolder": component,
            "type_hint": [library, class],
            "revision": null,
            "variant": null,
        }]);
    }
    index
}

/// `text_encoder/config.json`: Qwen3-VL's, the language model's keys under `text_config`
/// (Qwen3-VL-4B-Instruct's values, spec §1.4), the depth from the size.
fn text_encoder_config(w: &TextWidths, layers: u32, dtype: WeightDtype) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "dtype": dtype.torch_name(),
        "image_token_id": 151655,
        "model_type": "qwen3_vl",
        "text_config": {
            "attention_bias": false,
            "attention_dropout": 0.0,
            "head_dim": TEXT_HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": w.hidden,
            "initializer_range": 0.02,
            "intermediate_size": w.intermediate,
            "max_position_embeddings": 262144,
            "model_type": "qwen3_vl_text",
            "num_attention_heads": w.heads,
            "num_hidden_layers": layers,
            "num_key_value_heads": w.kv_heads,
            "pad_token_id": null,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "mrope_interleaved": true,
                "mrope_section": [24, 20, 20],
                "rope_theta": 5000000.0,
                "rope_type": "default",
            },
            "use_cache": true,
            "vocab_size": VOCAB,
        },
        "tie_word_embeddings": true,
        "transformers_version": "5.23.0",
        "video_token_id": 151656,
        "vision_end_token_id": 151653,
        "vision_start_token_id": 151652,
    })
}

/// `(path, contents)` of every JSON configuration file (spec §1.2–1.5); the modular index
/// last, so that the directory opens as a model only once everything else is in place.
pub fn config_files(f: &Flux3Spec) -> Vec<(String, String)> {
    let version = "0.42.1";
    let s = &f.size;
    let transformer = serde_json::json!({
        "_class_name": "Flux3Transformer2DModel",
        "_diffusers_version": version,
        "attention_head_dim": HEAD_DIM,
        "axes_dims_rope": [32, 32, 32, 32],
        "cond_in_channels": IN_CHANNELS,
        "eps": 1e-6,
        "flow_map": f.flow_map,
        "in_channels": IN_CHANNELS,
        "joint_attention_dim": joint_attention_dim(s),
        "mlp_ratio": 3.0,
        "num_attention_heads": s.heads,
        "num_layers": s.mode_layers,
        "num_single_layers": s.single_layers,
        "rope_theta": 10000,
        "timestep_channels": SINUSOID,
    });
    let text = text_encoder_config(&s.text, s.text_layers, f.dtype);
    vec![
        ("text_encoder/config.json".into(), pretty(text)),
        ("transformer/config.json".into(), pretty(transformer)),
        ("vae/config.json".into(), pretty(klein::vae_config(version))),
        (
            zimage::diffusers_dir::MODULAR_INDEX.into(),
            pretty(modular_index(f.flow_map, version)),
        ),
    ]
}

/// The tokenizer folder written beside the model: the tiny FLUX.3's, the real Qwen
/// vocabulary with Qwen3-VL's processor files.
pub fn tokenizer_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/flux3-klein-tiny/tokenizer")
}

/// The summary of what [`write_with`] would write, without writing anything.
pub fn plan(f: &Flux3Spec) -> Summary {
    summarize(&f.storage(), &plan_components(f))
}

/// Writes the FLUX.3 model of `f` into `dir`, which must not exist or be empty.
pub fn write_with(dir: &Path, f: &Flux3Spec, opts: &Options) -> Result<(Summary, Timing)> {
    let (plans, configs) = (plan_components(f), config_files(f));
    let tokenizers = [("tokenizer", tokenizer_source())];
    write_parts_from(dir, &f.storage(), plans, configs, &tokenizers, opts)
}
