//! zimage: diffusion image models on Apple's MLX, from Rust.
//!
//! # The API
//!
//! - [`start`]: prepares MLX for the process; call it first;
//! - [`generation`]: a [`generation::Job`] (what to make) run on an [`generation::Engine`] (the
//!   loaded model), reporting [`generation::Progress`] with [`preview`]s, giving PNGs;
//! - [`store`]: the Ollama-style model store (manifests and per-tensor blobs): names, imports,
//!   [`store::Store::locate`];
//! - [`diffusers_dir`]: a diffusers directory read in place, as a model source;
//! - [`loader`]: a stored model's components as MLX arrays, with load profiling;
//! - [`mlx`]: the safe wrapper over MLX's C++ API those arrays live in;
//! - [`families`]: the model families zimage runs, each in its folder, and the registry the
//!   rest of the code asks about them.
//!
//! The other modules are the `zimage` program's and its tests': the formats, layouts,
//! pipelines, servers and the rest. They are hidden from this documentation and are not a
//! stable API.
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

#![warn(missing_docs)]

pub mod chat_template;
#[doc(hidden)]
pub mod clip_tokenizer;
#[doc(hidden)]
pub mod component;
pub mod diffusers_dir;
#[doc(hidden)]
pub mod dtype;
#[doc(hidden)]
pub mod embedded;
pub mod families;
#[doc(hidden)]
pub mod files;
#[doc(hidden)]
pub mod formats;
#[doc(hidden)]
pub mod fp8;
pub mod generation;
#[doc(hidden)]
pub mod generation_defaults;
#[doc(hidden)]
pub mod ggml;
#[doc(hidden)]
pub mod hub;
#[doc(hidden)]
pub mod image_in;
#[doc(hidden)]
pub mod image_out;
#[doc(hidden)]
pub mod import_check;
#[doc(hidden)]
pub mod input_budget;
#[doc(hidden)]
pub mod jobs;
#[doc(hidden)]
pub mod layouts;
pub mod loader;
#[doc(hidden)]
pub mod lora;
#[doc(hidden)]
pub mod mapping;
#[doc(hidden)]
pub mod memory_plan;
pub mod mlx;
#[doc(hidden)]
pub mod models;
mod number;
#[doc(hidden)]
pub mod pipeline;
#[doc(hidden)]
pub mod platform;
pub mod preview;
#[doc(hidden)]
pub mod registry;
#[doc(hidden)]
pub mod resample;
#[doc(hidden)]
pub mod safetensors;
#[doc(hidden)]
pub mod scheduler;
#[doc(hidden)]
pub mod server;
#[doc(hidden)]
pub mod shown;
pub mod store;
#[doc(hidden)]
pub mod t5_tokenizer;
mod text;
#[doc(hidden)]
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
