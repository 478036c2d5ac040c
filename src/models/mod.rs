//! The Z-Image model components on MLX.
//!
//! - [`qwen3`]: the Qwen3 text encoder (prompt → caption features);
//! - [`transformer`]: the S3-DiT that predicts the flow velocity (with [`rope`]);
//! - [`vae`]: the AutoencoderKL decoder (latents → pixels);
//! - [`weights`]: binding checkpoint tensors to modules, strictly.
//!
//! Every dimension comes from the model's own `config.json` files; each component's
//! `validate()` rejects what the port does not support, up front, with the key at fault.

pub mod qwen3;
pub mod rope;
pub mod transformer;
pub mod vae;
pub mod vae_tiling;
pub mod weights;

pub use qwen3::{Qwen3Config, Qwen3Encoder};
pub use transformer::{DitConfig, ZImageTransformer};
pub use vae::{VaeConfig, VaeDecoder};
pub use weights::{Checkpoint, LoadError, Residency};

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
