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
