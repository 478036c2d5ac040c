//! What FLUX.2 \[klein\] needs of its components' configs together, and the files of a model
//! composed from single files.

use super::transformer::Flux2Config;
use crate::models::{Qwen3Config, VaeConfig};

/// The Qwen3 hidden states klein stacks into its prompt features (transformers'
/// `hidden_states[k]`: after `k` layers, no final norm; klein-spec §2.3).
pub const TEXT_LAYERS: [usize; 3] = [9, 18, 27];

/// What klein needs of its three components' configs together (klein-spec §2–§4), as the
/// config file at fault and why: the transformer reads the three stacked hidden states, 2×2
/// patches of the VAE's latents, and the text encoder is deep enough for the last layer read.
pub fn check_configs(
    text: &Qwen3Config,
    transformer: &Flux2Config,
    vae: &VaeConfig,
) -> Result<(), (&'static str, String)> {
    for (key, ours, theirs, value) in [
        (
            "joint_attention_dim",
            transformer.joint_attention_dim,
            "3 × the text encoder's `hidden_size`",
            3 * text.hidden_size,
        ),
        (
            "in_channels",
            transformer.in_channels,
            "4 × the VAE's `latent_channels`",
            4 * vae.latent_channels,
        ),
    ] {
        if ours != value {
            return Err((
                "transformer/config.json",
                format!("`{key}` {ours} differs from {theirs} {value}"),
            ));
        }
    }
    let layers = *TEXT_LAYERS.iter().max().expect("three layers") as i32;
    if text.num_hidden_layers < layers {
        return Err((
            "text_encoder/config.json",
            format!(
                "`num_hidden_layers` is {}; FLUX.2 [klein] reads the hidden state after layer {layers}",
                text.num_hidden_layers
            ),
        ));
    }
    if vae.batch_norm_eps.is_none() {
        return Err((
            "vae/config.json",
            "has no `batch_norm_eps`: not a FLUX.2 VAE (AutoencoderKLFlux2)".into(),
        ));
    }
    Ok(())
}

/// Checks a klein model's three configs together (an import's last check), naming the file at
/// fault.
pub fn check_files(configs: &[(String, Vec<u8>)]) -> Result<(), String> {
    use crate::pipeline::config_in;
    let text: Qwen3Config = config_in(configs, "text_encoder/config.json", Qwen3Config::validate)?;
    let vae: VaeConfig = config_in(configs, "vae/config.json", VaeConfig::validate)?;
    let transformer: Flux2Config =
        config_in(configs, "transformer/config.json", Flux2Config::validate)?;
    check_configs(&text, &transformer, &vae).map_err(|(path, reason)| format!("`{path}` {reason}"))
}

/// `model_index.json` and the scheduler config of a FLUX.2 \[klein\] model composed without a
/// base directory: a base model when the transformer's file says so in its name, as Black
/// Forest Labs names them (`flux-2-klein-base-4b.safetensors`), else the step-distilled one.
pub fn composed_files(transformer_source: &str) -> Vec<(String, Vec<u8>)> {
    let distilled = !transformer_source.to_ascii_lowercase().contains("base");
    let index = serde_json::json!({
        "_class_name": "Flux2KleinPipeline",
        "_diffusers_version": "0.42.1",
        "is_distilled": distilled,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    });
    let scheduler = serde_json::json!({
        "_class_name": "FlowMatchEulerDiscreteScheduler",
        "_diffusers_version": "0.42.1",
        "num_train_timesteps": 1000,
        "shift": 3.0,
        "time_shift_type": "exponential",
        "use_dynamic_shifting": true,
    });
    let json = |v: serde_json::Value| serde_json::to_vec_pretty(&v).expect("JSON values serialize");
    vec![
        ("model_index.json".into(), json(index)),
        ("scheduler/scheduler_config.json".into(), json(scheduler)),
    ]
}
