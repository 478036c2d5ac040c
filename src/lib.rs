//! zimage: diffusion image models (Z-Image, FLUX.2 \[klein\]) on Apple's MLX, from Rust.
//!
//! The crate is layered bottom-up:
//! - [`mlx`]: a safe wrapper over MLX's C++ API (through the `mlx-sys-shim` C shim);
//! - [`safetensors`]: a strict safetensors header parser and writer;
//! - [`ggml`]: ggml's tensor types and their exact or nearest MLX quantization;
//! - [`store`]: the Ollama-style model store (manifests and per-tensor blobs), import and gc;
//! - [`registry`]: models pulled from and pushed to a Docker-v2 registry, as Ollama moves them;
//! - [`hub`]: diffusers models pulled from a Hugging Face Hub through its cache;
//! - [`loader`]: stored models to MLX arrays, with load profiling;
//! - [`formats`]: other model-file formats (zTensor, DFSN, weight-inspect hashing, model hashes, PNG metadata);
//! - [`lora`]: LoRA files in every layout, applied unfused to the linear layers;
//! - [`layouts`]: ComfyUI / original-layout checkpoints mapped to diffusers names, and back;
//! - [`models`], [`scheduler`], [`text`], [`pipeline`], [`image_in`], [`image_out`]: the generation pipelines of both families (Z-Image, FLUX.2 \[klein\], told apart by [`family`]);
//! - [`number`]: the one check of the numbers a request gives;
//! - [`preview`]: each denoising step's latents as a small picture, mapped linearly;
//! - [`generation`]: the path from a request to a PNG that the command line and the server share;
//! - [`server`]: `zimage serve`, Ollama's and OpenAI's image APIs over HTTP.
//!
//! # Making an image
//!
//! A [`generation::Job`] says what to make, an [`generation::Engine`] keeps the model loaded
//! between jobs, and [`generation::run`] makes the images, each a PNG with its settings:
//!
//! ```no_run
//! use zimage::generation::{self, Cancel, Engine, Job, ModelChoice};
//!
//! # fn main() -> anyhow::Result<()> {
//! zimage::start()?;
//! let store = zimage::store::Store::locate(None)?; // ZIMAGE_MODELS, else ~/.ollama/models
//! let model = ModelChoice::Stored { store, name: "z-image-turbo".into() };
//! let mut job = Job::new(model, "a red fox in the snow");
//! job.seed = 7;
//! let mut engine = Engine::new(None, false);
//! let outcome = generation::run(&job, &mut engine, &mut |p| eprintln!("{p:?}"), &Cancel::new())?;
//! std::fs::write("fox.png", &outcome.images[0].png)?;
//! # Ok(())
//! # }
//! ```
//!
//! `examples/generate.rs` is the same program with arguments, and `examples/load_weights.rs`
//! loads one component's tensors from the store as MLX arrays.

pub mod component;
pub mod controlnet_source;
pub mod diffusers_dir;
pub mod dtype;
pub mod embedded;
pub mod family;
pub mod files;
pub mod formats;
pub mod generation;
pub mod generation_defaults;
pub mod ggml;
pub mod hub;
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
pub mod number;
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

/// Prepares MLX for this process: opens MLX where the build opens it at start (the CUDA
/// variants; its kernel cache under zimage's cache folder), hands freed memory back to the
/// system between phases, and makes the device zimage runs on (the GPU where there is one)
/// MLX's default. Call once, first, before any thread starts.
pub fn start() -> Result<(), mlx::runtime::StartError> {
    let kernel_cache = platform::cache_dir().map(|d| d.join("mlx-kernels"));
    mlx::runtime::start(kernel_cache.as_deref())?;
    platform::return_freed_memory_to_the_system();
    platform::use_default_device().map_err(|e| mlx::runtime::StartError::Device(e.to_string()))
}
