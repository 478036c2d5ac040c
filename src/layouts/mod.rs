//! Checkpoint layouts other than diffusers', mapped onto the diffusers names the store and the
//! pipeline use, with each component's config inferred from its tensors' shapes.
//!
//! A family's original transformer layout (as ComfyUI and stable-diffusion.cpp ship it), the
//! Qwen3 text encoder with or without its `model.` prefix, and the LDM/Flux VAE layout are
//! recognised from their tensor names, as diffusers' single-file loader recognises them
//! (`diffusers/loaders/single_file_utils.py`, 0.42.1). Every mapping works on byte ranges
//! ([`crate::store::SourceTensor`]s): a rename keeps the range, a fused `q|k|v` projection becomes three
//! row ranges, a 1×1 convolution used as a linear layer drops its trailing unit axes. No
//! tensor is read, so any source that can say where a tensor's rows are (a safetensors file,
//! a GGUF file) goes through the same mapping.
//!
//! What shapes cannot tell (norm epsilons, RoPE theta and axes, the VAE's group count and
//! latent scaling) comes, in this order, from a config written into the file's metadata by
//! `zimage export` (key [`CONFIG_METADATA_KEY`]), from the `--from` directory's config, or
//! from the defaults the binary carries; a given value that contradicts a shape is refused
//! ([`resolve`]).

pub mod export;
pub mod export_gguf;
pub mod files;
pub mod resolve;
pub mod text_encoder;
pub mod vae;

pub use crate::mapping::{
    rows, Component, Inferred, Joined, Layout, LayoutError, Mapped, Rows, CONFIG_METADATA_KEY,
};
