//! A synthetic FLUX.2 \[klein\] 4B or 9B: a diffusers-layout directory with the real widths
//! (klein-spec §1.3–1.5, §10), random weights and the depth asked for, written by the same
//! streaming writer as the synthetic Z-Image. Tensor names and shapes are the Hub checkpoint's:
//! the transformer as diffusers saves `Flux2Transformer2DModel` (no biases), the text encoder as
//! a `Qwen3ForCausalLM` save, the VAE as `AutoencoderKLFlux2` (FLUX.1's with 32 latent channels,
//! the two 1×1 quant convolutions and the BatchNorm statistics, mean 0 and variance 1).

use super::{
    component_plan, pretty, qwen3_config, qwen3_tensors, summarize, vae_tensors_with, write_parts,
    ComponentPlan, Defs, Init, Options, Spec, Summary, TensorDef, TextWidths, Timing, WeightDtype,
};
use anyhow::Result;
use std::path::Path;

/// A klein model's size: its transformer's widths and its text encoder's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub heads: u64,
    pub joint_attention_dim: u64,
    pub double_layers: u32,
    pub single_layers: u32,
    pub text: TextWidths,
    pub text_layers: u32,
}

/// FLUX.2 \[klein\] 4B: 5 double + 20 single blocks of 24 heads × 128, Qwen3-4B.
pub const KLEIN_4B: Size = Size {
    heads: 24,
    joint_attention_dim: 7680,
    double_layers: 5,
    single_layers: 20,
    text: super::QWEN3_4B,
    text_layers: 36,
};

/// FLUX.2 \[klein\] 9B: 8 double + 24 single blocks of 32 heads × 128, Qwen3-8B.
pub const KLEIN_9B: Size = Size {
    heads: 32,
    joint_attention_dim: 12288,
    double_layers: 8,
    single_layers: 24,
    text: TextWidths {
        hidden: 4096,
        intermediate: 12288,
        heads: 32,
        kv_heads: 8,
    },
    text_layers: 36,
};

/// The VAE's latent channels; tokens are 2×2 patches of them.
pub const LATENT: u64 = 32;
const IN_CHANNELS: u64 = 4 * LATENT;
const SINUSOID: u64 = 256;
const HEAD_DIM: u64 = 128;

/// What to write: the size, and the storage dtype and seed as for Z-Image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KleinSpec {
    pub size: Size,
    pub dtype: WeightDtype,
    pub seed: u64,
}

impl KleinSpec {
    /// What the shared writer reads of a spec: the dtype and the seed.
    fn storage(&self) -> Spec {
        Spec {
            dtype: self.dtype,
            seed: self.seed,
            ..Spec::real()
        }
    }
}

/// The transformer's tensors (klein-spec §10.1), blocks in order.
pub fn transformer_tensors(size: &Size) -> Vec<TensorDef> {
    let d = size.heads * HEAD_DIM;
    let m = 3 * d;
    let mut t = Defs::default();
    let lin = |t: &mut Defs, name: &str, inp: u64, out: u64| t.linear(name, inp, out, false);
    lin(&mut t, "x_embedder", IN_CHANNELS, d);
    lin(&mut t, "context_embedder", size.joint_attention_dim, d);
    let time = "time_guidance_embed.timestep_embedder";
    lin(&mut t, &format!("{time}.linear_1"), SINUSOID, d);
    lin(&mut t, &format!("{time}.linear_2"), d, d);
    lin(&mut t, "double_stream_modulation_img.linear", d, 6 * d);
    lin(&mut t, "double_stream_modulation_txt.linear", d, 6 * d);
    lin(&mut t, "single_stream_modulation.linear", d, 3 * d);
    for b in 0..size.double_layers {
        let p = format!("transformer_blocks.{b}");
        for n in [
            "to_q",
            "to_k",
            "to_v",
            "to_out.0",
            "add_q_proj",
            "add_k_proj",
            "add_v_proj",
            "to_add_out",
        ] {
            lin(&mut t, &format!("{p}.attn.{n}"), d, d);
        }
        for n in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
            t.norm(&format!("{p}.attn.{n}"), HEAD_DIM);
        }
        for f in ["ff", "ff_context"] {
            lin(&mut t, &format!("{p}.{f}.linear_in"), d, 2 * m);
            lin(&mut t, &format!("{p}.{f}.linear_out"), m, d);
        }
    }
    for b in 0..size.single_layers {
        let p = format!("single_transformer_blocks.{b}.attn");
        lin(&mut t, &format!("{p}.to_qkv_mlp_proj"), d, 3 * d + 2 * m);
        lin(&mut t, &format!("{p}.to_out"), d + m, d);
        t.norm(&format!("{p}.norm_q"), HEAD_DIM);
        t.norm(&format!("{p}.norm_k"), HEAD_DIM);
    }
    lin(&mut t, "norm_out.linear", d, 2 * d);
    lin(&mut t, "proj_out", d, IN_CHANNELS);
    t.0
}

/// The VAE's tensors (klein-spec §1.5): FLUX.1's at 32 latent channels, the quant
/// convolutions and the BatchNorm statistics over the packed channels.
pub fn vae_tensors() -> Vec<TensorDef> {
    let mut t = Defs(vae_tensors_with(LATENT));
    t.conv("quant_conv", 2 * LATENT, 2 * LATENT, 1);
    t.conv("post_quant_conv", LATENT, LATENT, 1);
    t.push("bn.running_mean".into(), &[IN_CHANNELS], Init::Const(0.0));
    t.push("bn.running_var".into(), &[IN_CHANNELS], Init::Const(1.0));
    t.0
}

/// The files of every component.
pub fn plan_components(k: &KleinSpec) -> Vec<ComponentPlan> {
    let spec = k.storage();
    let text = qwen3_tensors(&k.size.text, k.size.text_layers);
    let model = "diffusion_pytorch_model";
    let index = "diffusion_pytorch_model.safetensors.index.json";
    vec![
        component_plan(
            "text_encoder",
            text,
            "model",
            "model.safetensors.index.json",
            true,
            true,
            &spec,
        ),
        component_plan(
            "transformer",
            transformer_tensors(&k.size),
            model,
            index,
            false,
            false,
            &spec,
        ),
        component_plan("vae", vae_tensors(), model, index, false, false, &spec),
    ]
}

/// `(path, contents)` of every JSON configuration file (klein-spec §1).
pub fn config_files(k: &KleinSpec) -> Vec<(String, String)> {
    use serde_json::json;
    let version = "0.42.1";
    let s = &k.size;
    let model_index = json!({
        "_class_name": "Flux2KleinPipeline",
        "_diffusers_version": version,
        "is_distilled": true,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    });
    let scheduler = json!({
        "_class_name": "FlowMatchEulerDiscreteScheduler",
        "_diffusers_version": version,
        "num_train_timesteps": 1000,
        "use_dynamic_shifting": true,
        "shift": 3.0,
        "time_shift_type": "exponential",
    });
    let transformer = json!({
        "_class_name": "Flux2Transformer2DModel",
        "_diffusers_version": version,
        "attention_head_dim": HEAD_DIM,
        "axes_dims_rope": [32, 32, 32, 32],
        "eps": 1e-6,
        "guidance_embeds": false,
        "in_channels": IN_CHANNELS,
        "joint_attention_dim": s.joint_attention_dim,
        "mlp_ratio": 3.0,
        "num_attention_heads": s.heads,
        "num_layers": s.double_layers,
        "num_single_layers": s.single_layers,
        "out_channels": null,
        "patch_size": 1,
        "rope_theta": 2000,
        "timestep_guidance_channels": SINUSOID,
    });
    let text = qwen3_config(&s.text, s.text_layers, k.dtype);
    vec![
        ("scheduler/scheduler_config.json".into(), pretty(scheduler)),
        ("text_encoder/config.json".into(), pretty(text)),
        ("transformer/config.json".into(), pretty(transformer)),
        ("vae/config.json".into(), pretty(vae_config(version))),
        ("model_index.json".into(), pretty(model_index)),
    ]
}

/// `vae/config.json` of FLUX.2's VAE (klein-spec §1.5), as diffusers `version` saves it.
pub fn vae_config(version: &str) -> serde_json::Value {
    serde_json::json!({
        "_class_name": "AutoencoderKLFlux2",
        "_diffusers_version": version,
        "act_fn": "silu",
        "batch_norm_eps": 1e-4,
        "batch_norm_momentum": 0.1,
        "block_out_channels": super::VAE_CHANNELS,
        "down_block_types": vec!["DownEncoderBlock2D"; 4],
        "force_upcast": true,
        "in_channels": 3,
        "latent_channels": LATENT,
        "layers_per_block": super::VAE_LAYERS_PER_BLOCK,
        "mid_block_add_attention": true,
        "norm_num_groups": super::VAE_GROUPS,
        "out_channels": 3,
        "patch_size": [2, 2],
        "sample_size": 1024,
        "up_block_types": vec!["UpDecoderBlock2D"; 4],
        "use_post_quant_conv": true,
        "use_quant_conv": true,
    })
}

/// The summary of what [`write_with`] would write, without writing anything.
pub fn plan(k: &KleinSpec) -> Summary {
    summarize(&k.storage(), &plan_components(k))
}

/// Writes the klein model of `k` into `dir`, which must not exist or be empty.
pub fn write_with(dir: &Path, k: &KleinSpec, opts: &Options) -> Result<(Summary, Timing)> {
    write_parts(dir, &k.storage(), plan_components(k), config_files(k), opts)
}
