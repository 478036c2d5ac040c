//! The building blocks every family shares, on MLX; each family's own networks live in its
//! folder under `crate::families`.
//!
//! - [`qwen3`]: the Qwen3 text encoder (prompt → caption features);
//! - [`clip_text`] and [`t5`]: CLIP's text model and T5's encoder (the first FLUX models' two encoders);
//! - [`blocks`]: what the transformers share (timestep sinusoids, attention, the RoPE
//!   rotation, the evaluation point after a block), with [`rope`]'s tables;
//! - [`vae`]: the AutoencoderKL decoder (latents → pixels);
//! - [`vae_encoder`]: its encoder (pixels → latent distribution), for image-to-image;
//! - [`weights`]: binding checkpoint tensors to modules, strictly.
//!
//! Every dimension comes from the model's own `config.json` files; each component's
//! `validate()` rejects what the port does not support, up front, with the key at fault.

pub mod blocks;
pub mod clip_text;
pub mod qwen3;
pub mod rope;
pub mod t5;
pub mod vae;
pub mod vae_encoder;
pub mod vae_tiling;
pub mod weights;

pub use clip_text::{ClipTextConfig, ClipTextModel};
pub use qwen3::{Qwen3Config, Qwen3Encoder};
pub use t5::{T5Config, T5Encoder};
pub use vae::{VaeConfig, VaeDecoder};
pub use vae_encoder::{LatentDistribution, VaeEncoder};
pub use weights::{Checkpoint, LoadError, Residency};

/// Checks that `key` of `what`'s config lies within `range`: every count, width and length a
/// config gives is bounded, so that the products of them (shapes, table sizes, memory
/// estimates) cannot overflow and no allocation is sized by an absurd value.
pub(crate) fn check_range(
    what: &str,
    key: &str,
    value: i32,
    range: std::ops::RangeInclusive<i32>,
) -> Result<(), String> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(format!(
        "{what} `{key}` is {value}; it must be within {}..={}",
        range.start(),
        range.end()
    ))
}

/// Parses a component's JSON config; an error names `file` and the key at fault.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    file: &str,
) -> Result<T, ModelError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let at = e.path().to_string();
        let at = match at.as_str() {
            "." | "" => String::new(),
            key => format!(" at `{key}`"),
        };
        ModelError::Config(format!("`{file}`{at}: {}", e.into_inner()))
    })
}

/// Checks that a floating-point `key` is finite and, when `positive`, above 0.
pub(crate) fn check_finite(
    what: &str,
    key: &str,
    value: f64,
    positive: bool,
) -> Result<(), String> {
    if !value.is_finite() {
        return Err(format!(
            "{what} `{key}` is {value}; it must be a finite number"
        ));
    }
    if positive && value <= 0.0 {
        return Err(format!("{what} `{key}` is {value}; it must be above 0"));
    }
    Ok(())
}

/// The widest or tallest image a request may ask for: the position tables end at 8192 pixels.
pub const MAX_IMAGE_SIDE: u32 = 8192;
/// The most pixels a request may ask for (4096², 16 MP: 16× what the models were trained at),
/// which keeps every latent, token and pixel count far inside `i32`.
pub const MAX_IMAGE_PIXELS: u64 = 4096 * 4096;

/// The widest hidden size, channel count or head width a config may give: 4× the widest
/// model zimage runs, and small enough that a product of two stays within `i32`.
pub(crate) const MAX_WIDTH: i32 = 1 << 15;
/// The most layers or heads a config may give.
pub(crate) const MAX_COUNT: i32 = 1024;

/// Why a component could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unsupported configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Mlx(#[from] crate::mlx::Error),
}
