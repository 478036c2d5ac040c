//! What FLUX.1 needs of its five components' configs together, and the files of a model
//! composed from single files.

use super::transformer::Flux1Config;
use crate::models::clip_text::ClipTextConfig;
use crate::models::t5::T5Config;
use crate::models::VaeConfig;
use crate::scheduler::SchedulerConfig;

/// The configs of a FLUX.1 model, read once.
pub struct Flux1Configs {
    pub clip: ClipTextConfig,
    pub t5: T5Config,
    pub transformer: Flux1Config,
    pub vae: VaeConfig,
    pub scheduler: SchedulerConfig,
    /// `FluxKontextPipeline`: edits a picture it is given.
    pub kontext: bool,
}

/// The pipeline classes of an editing (Kontext) model.
pub const KONTEXT_CLASSES: [&str; 2] = ["FluxKontextPipeline", "FluxKontextInpaintPipeline"];

/// What the transformer reads of the others, as the config file at fault and why: T5's rows,
/// CLIP's pooled vector, and 2×2 patches of the VAE's latents (flux1-spec §1).
pub fn check_configs(
    clip: &ClipTextConfig,
    t5: &T5Config,
    transformer: &Flux1Config,
    vae: &VaeConfig,
) -> Result<(), (&'static str, String)> {
    for (key, ours, theirs, value) in [
        (
            "joint_attention_dim",
            transformer.joint_attention_dim,
            "the T5 encoder's `d_model` (text_encoder_2)",
            t5.d_model,
        ),
        (
            "pooled_projection_dim",
            transformer.pooled_projection_dim,
            "the CLIP text model's `hidden_size` (text_encoder)",
            clip.hidden_size,
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
    if vae.batch_norm_eps.is_some() {
        return Err((
            "vae/config.json",
            "has `batch_norm_eps`: a FLUX.2 VAE, where this model needs an AutoencoderKL".into(),
        ));
    }
    Ok(())
}

/// Checks a FLUX.1 model's configs together (an import's last check), naming the file at fault.
pub fn check_files(configs: &[(String, Vec<u8>)]) -> Result<(), String> {
    use crate::pipeline::config_in;
    let clip: ClipTextConfig = config_in(
        configs,
        "text_encoder/config.json",
        ClipTextConfig::validate,
    )?;
    let t5: T5Config = config_in(configs, "text_encoder_2/config.json", T5Config::validate)?;
    let vae: VaeConfig = config_in(configs, "vae/config.json", VaeConfig::validate)?;
    let transformer: Flux1Config =
        config_in(configs, "transformer/config.json", Flux1Config::validate)?;
    let _: SchedulerConfig = config_in(
        configs,
        "scheduler/scheduler_config.json",
        SchedulerConfig::validate_shift_line,
    )?;
    check_configs(&clip, &t5, &transformer, &vae)
        .map_err(|(path, reason)| format!("`{path}` {reason}"))
}

/// The `model_index.json` and scheduler config of a FLUX.1 model composed from single files
/// (flux1-spec §1): `FluxKontextPipeline` when the transformer's file is named `…kontext…`
/// (nothing in its tensors tells Kontext from \[dev\]), else `FluxPipeline`; the scheduler is
/// \[dev\]'s dynamic shift when the transformer embeds the guidance scale, \[schnell\]'s static
/// shift 1.0 when it does not.
pub fn composed_files(
    transformer_source: &str,
    transformer_config: &serde_json::Value,
) -> Vec<(String, Vec<u8>)> {
    let kontext = transformer_source.to_ascii_lowercase().contains("kontext");
    let guidance = transformer_config["guidance_embeds"].as_bool() != Some(false);
    let class = match kontext {
        true => KONTEXT_CLASSES[0],
        false => "FluxPipeline",
    };
    let index = serde_json::json!({
        "_class_name": class,
        "_diffusers_version": "0.42.1",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "FluxTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    });
    let (shift, dynamic) = match guidance {
        true => (3.0, true),
        false => (1.0, false),
    };
    let scheduler = serde_json::json!({
        "_class_name": "FlowMatchEulerDiscreteScheduler",
        "_diffusers_version": "0.42.1",
        "base_image_seq_len": 256,
        "base_shift": 0.5,
        "max_image_seq_len": 4096,
        "max_shift": 1.15,
        "num_train_timesteps": 1000,
        "shift": shift,
        "use_dynamic_shifting": dynamic,
    });
    let json = |v: serde_json::Value| serde_json::to_vec_pretty(&v).expect("JSON values serialize");
    vec![
        ("model_index.json".into(), json(index)),
        ("scheduler/scheduler_config.json".into(), json(scheduler)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(files: &[(String, Vec<u8>)], path: &str) -> serde_json::Value {
        let (_, bytes) = files.iter().find(|(p, _)| p == path).unwrap();
        serde_json::from_slice(bytes).unwrap()
    }

    /// \[dev\] and \[schnell\] are told by the guidance embedder, Kontext by the file's name.
    #[test]
    fn composed_files_follow_the_transformer() {
        let dev = serde_json::json!({"guidance_embeds": true});
        let schnell = serde_json::json!({"guidance_embeds": false});
        for (name, config, class, dynamic, shift) in [
            ("flux1-dev.safetensors", &dev, "FluxPipeline", true, 3.0),
            (
                "flux1-schnell.safetensors",
                &schnell,
                "FluxPipeline",
                false,
                1.0,
            ),
            (
                "flux1-Kontext-dev.safetensors",
                &dev,
                "FluxKontextPipeline",
                true,
                3.0,
            ),
        ] {
            let files = composed_files(name, config);
            let index = file(&files, "model_index.json");
            assert_eq!(index["_class_name"], class, "{name}");
            assert_eq!(index["tokenizer_2"][1], "T5TokenizerFast");
            let scheduler = file(&files, "scheduler/scheduler_config.json");
            assert_eq!(scheduler["use_dynamic_shifting"], dynamic, "{name}");
            assert_eq!(scheduler["shift"], shift, "{name}");
            let parsed: SchedulerConfig = serde_json::from_value(scheduler).unwrap();
            parsed.validate_shift_line().unwrap();
        }
    }
}
