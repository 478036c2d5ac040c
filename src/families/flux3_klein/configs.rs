//! What FLUX.3 \[klein\] reads of its components' configs, read once and checked together.

use super::transformer::Flux3Config;
use crate::models::{Qwen3Config, VaeConfig};
use crate::pipeline::{parse_config, read_config, Error, ModelSource};
use crate::scheduler::{Schedule, SchedulerConfig};

/// The Qwen3-VL hidden states FLUX.3 stacks into its prompt features (transformers'
/// `hidden_states[k]`: after `k` layers, no final norm; the spec §2.5).
pub const TEXT_LAYERS: [usize; 8] = [4, 8, 12, 16, 20, 24, 28, 32];

/// The text window is the prompt's length rounded up to a multiple of this (the spec §2.2).
pub const PAD_MULTIPLE: usize = 80;

/// The scheduler's shift when the model ships no scheduler config (the blocks' default).
pub const DEFAULT_SHIFT: f32 = 6.93;

/// `text_encoder/config.json` of a Qwen3-VL model: the language model's keys under
/// `text_config` (the vision tower never runs).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct VisionLanguageConfig {
    pub text_config: Qwen3Config,
}

/// A FLUX.3 model's configuration, read once from its json files.
pub struct Flux3Configs {
    pub text_encoder: Qwen3Config,
    pub transformer: Flux3Config,
    pub vae: VaeConfig,
    /// The schedule's constant shift.
    pub shift: f32,
}

impl Flux3Configs {
    /// Reads every config `source` holds and checks them together, naming the file at fault.
    pub fn read(source: &(impl ModelSource + ?Sized)) -> Result<Flux3Configs, Error> {
        let text: VisionLanguageConfig = parse_config(
            source,
            "text_encoder/config.json",
            |c: &VisionLanguageConfig| {
                c.text_config
                    .validate()
                    .map_err(|e| format!("`text_config`: {e}"))
            },
        )?;
        let configs = Flux3Configs {
            text_encoder: text.text_config,
            transformer: parse_config(source, "transformer/config.json", Flux3Config::validate)?,
            vae: parse_config(source, "vae/config.json", VaeConfig::validate)?,
            shift: match read_config(source, "scheduler/scheduler_config.json")? {
                None => DEFAULT_SHIFT,
                Some(_) => {
                    let s: SchedulerConfig =
                        parse_config(source, "scheduler/scheduler_config.json", check_scheduler)?;
                    s.shift
                }
            },
        };
        let (t, e, v) = (&configs.transformer, &configs.text_encoder, &configs.vae);
        check_configs(e, t, v).map_err(|(path, reason)| Error::BadConfig {
            model: source.name(),
            path: path.into(),
            reason,
        })?;
        Ok(configs)
    }
}

/// A scheduler config FLUX.3 can run: a static shift.
fn check_scheduler(s: &SchedulerConfig) -> Result<(), String> {
    s.validate()?;
    match s.use_dynamic_shifting {
        true => Err("`use_dynamic_shifting` is true; FLUX.3 [klein] runs a constant shift".into()),
        false => Ok(()),
    }
}

/// What FLUX.3 needs of its three components' configs together, as the config file at fault
/// and why: the transformer reads the eight stacked hidden states and 2×2 patches of the VAE's
/// latents (for the image and the references), and the text encoder is deep enough.
pub fn check_configs(
    text: &Qwen3Config,
    transformer: &Flux3Config,
    vae: &VaeConfig,
) -> Result<(), (&'static str, String)> {
    let stacked = TEXT_LAYERS.len() as i32;
    for (key, ours, theirs, value) in [
        (
            "joint_attention_dim",
            transformer.joint_attention_dim,
            format!("{stacked} × the text encoder's `hidden_size`"),
            stacked * text.hidden_size,
        ),
        (
            "in_channels",
            transformer.in_channels,
            "4 × the VAE's `latent_channels`".into(),
            4 * vae.latent_channels,
        ),
        (
            "cond_in_channels",
            transformer.cond_in_channels,
            "4 × the VAE's `latent_channels`".into(),
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
    let layers = *TEXT_LAYERS.iter().max().expect("eight layers") as i32;
    if text.num_hidden_layers < layers {
        return Err((
            "text_encoder/config.json",
            format!(
                "`text_config.num_hidden_layers` is {}; FLUX.3 [klein] reads the hidden state after layer {layers}",
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

/// Checks a FLUX.3 model's three configs together (an import's last check), naming the file
/// at fault.
pub fn check_files(configs: &[(String, Vec<u8>)]) -> Result<(), String> {
    use crate::pipeline::config_in;
    let text: VisionLanguageConfig = config_in(
        configs,
        "text_encoder/config.json",
        |c: &VisionLanguageConfig| c.text_config.validate(),
    )?;
    let vae: VaeConfig = config_in(configs, "vae/config.json", VaeConfig::validate)?;
    let transformer: Flux3Config =
        config_in(configs, "transformer/config.json", Flux3Config::validate)?;
    check_configs(&text.text_config, &transformer, &vae)
        .map_err(|(path, reason)| format!("`{path}` {reason}"))
}

/// The sigmas of `steps`: numpy's f64 `linspace(1, 1/n, n)` rounded once to f32, then
/// `shift·σ / (1 + (shift − 1)·σ)` in f32; timesteps `σ·1000` (the spec §6.2).
pub fn shifted_schedule(steps: usize, shift: f32) -> Schedule {
    assert!(steps >= 1, "at least one step");
    let n = steps;
    let raw: Vec<f32> = (0..n)
        .map(|i| match i + 1 == n {
            true => (1.0 / n as f64) as f32,
            false => (1.0 + i as f64 * ((1.0 / n as f64 - 1.0) / (n as f64 - 1.0))) as f32,
        })
        .collect();
    let mut sigmas: Vec<f32> = raw
        .iter()
        .map(|&s| shift * s / (1.0 + (shift - 1.0) * s))
        .collect();
    let timesteps = sigmas.iter().map(|&s| s * 1000.0).collect();
    sigmas.push(0.0);
    Schedule { sigmas, timesteps }
}

/// The `model_index.json` of a model composed from single files without a directory, as the
/// classic index zimage stores a modular pipeline's under. Whether the model is a flow map
/// comes from its transformer's config; the class names follow the file's name (`…base…` the
/// guided base model's), as nothing else tells them. No scheduler config: the blocks' constant
/// shift applies.
pub fn composed_files(transformer_source: &str) -> Vec<(String, Vec<u8>)> {
    let base = transformer_source.to_ascii_lowercase().contains("base");
    let (class, blocks) = match base {
        true => ("Flux3ModularPipeline", "Flux3AutoBlocks"),
        false => ("Flux3DistilledModularPipeline", "Flux3DistilledAutoBlocks"),
    };
    let index = serde_json::json!({
        "_class_name": class,
        "_blocks_class_name": blocks,
        "_diffusers_version": "0.42.1",
        "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
        "tokenizer": ["transformers", "AutoProcessor"],
        "transformer": ["diffusers", "Flux3Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    });
    let json = serde_json::to_vec_pretty(&index).expect("JSON values serialize");
    vec![("model_index.json".into(), json)]
}
