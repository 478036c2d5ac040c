//! zimage: diffusion image models (Z-Image) on Apple's MLX, from Rust.
//!
//! The crate is layered bottom-up:
//! - [`mlx`]: a safe wrapper over MLX's C++ API (through the `mlx-sys-shim` C shim);
//! - [`safetensors`]: a strict safetensors header parser and writer;
//! - [`store`]: the Ollama-style model store (manifests and per-tensor blobs), import and gc;
//! - [`loader`]: stored models to MLX arrays, with load profiling;
//! - [`formats`]: other model-file formats (zTensor, DFSN, weight-inspect hashing, model hashes, PNG metadata);
//! - [`lora`]: LoRA files in every layout, applied unfused to the linear layers;
//! - [`models`], [`scheduler`], [`text`], [`pipeline`], [`image_out`]: the Z-Image generation pipeline.

pub mod component;
pub mod diffusers_dir;
pub mod files;
pub mod formats;
pub mod image_out;
pub mod loader;
pub mod lora;
pub mod memory_plan;
pub mod mlx;
pub mod models;
pub mod pipeline;
pub mod platform;
pub mod safetensors;
pub mod scheduler;
pub mod store;
pub mod text;
pub mod torch_rng;
