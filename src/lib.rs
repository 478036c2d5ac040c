//! zimage: diffusion image models (Z-Image) on Apple's MLX, from Rust.
//!
//! The crate is layered bottom-up:
//! - [`mlx`]: a safe wrapper over MLX's C++ API (through the `mlx-sys-shim` C shim);
//! - [`safetensors`]: a strict safetensors header parser and writer;
//! - [`ggml`]: ggml's tensor types and their exact or nearest MLX quantization;
//! - [`store`]: the Ollama-style model store (manifests and per-tensor blobs), import and gc;
//! - [`registry`]: models pulled from and pushed to a Docker-v2 registry, as Ollama moves them;
//! - [`loader`]: stored models to MLX arrays, with load profiling;
//! - [`formats`]: other model-file formats (zTensor, DFSN, weight-inspect hashing, model hashes, PNG metadata);
//! - [`lora`]: LoRA files in every layout, applied unfused to the linear layers;
//! - [`layouts`]: ComfyUI / original-layout checkpoints mapped to diffusers names, and back;
//! - [`models`], [`scheduler`], [`text`], [`pipeline`], [`image_in`], [`image_out`]: the Z-Image generation pipeline;
//! - [`preview`]: each denoising step's latents as a small picture, mapped linearly;
//! - [`generation`]: the path from a request to a PNG that the command line and the server share;
//! - [`server`]: `zimage serve`, Ollama's and OpenAI's image APIs over HTTP.

pub mod component;
pub mod controlnet_source;
pub mod diffusers_dir;
pub mod dtype;
pub mod embedded;
pub mod files;
pub mod formats;
pub mod generation;
pub mod generation_defaults;
pub mod ggml;
pub mod image_in;
pub mod image_out;
pub mod import_check;
pub mod input_budget;
pub mod layouts;
pub mod loader;
pub mod lora;
pub mod memory_plan;
pub mod mlx;
pub mod models;
pub mod pipeline;
pub mod platform;
pub mod preview;
pub mod registry;
pub mod safetensors;
pub mod scheduler;
pub mod server;
pub mod shown;
pub mod store;
pub mod text;
pub mod torch_rng;
