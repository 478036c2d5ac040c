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
