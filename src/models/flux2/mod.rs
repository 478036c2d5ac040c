//! FLUX.2 \[klein\]'s own networks on MLX: the [`transformer`] (double-stream then single-stream
//! blocks with shared modulation) and its 4-axis [`rope`] tables. What klein shares with
//! Z-Image (Qwen3, the VAE blocks, attention, the interleaved rotation) lives one level up.
//!
//! Mirrors diffusers 0.42.1 `models/transformers/transformer_flux2.py` (klein-spec §5).

pub mod rope;
pub mod transformer;

pub use transformer::{Flux2Config, Flux2Transformer};

/// The Qwen3 hidden states klein stacks into its prompt features (transformers'
/// `hidden_states[k]`: after `k` layers, no final norm; klein-spec §2.3).
pub const TEXT_LAYERS: [usize; 3] = [9, 18, 27];

/// What klein needs of its three components' configs together (klein-spec §2–§4), as the
/// config file at fault and why: the transformer reads the three stacked hidden states, 2×2
/// patches of the VAE's latents, and the text encoder is deep enough for the last layer read.
pub fn check_configs(
    text: &super::Qwen3Config,
    transformer: &Flux2Config,
    vae: &super::VaeConfig,
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
