//! Tongyi's Z-Image (Turbo and base): the Qwen3 text encoder, a single-stream transformer (the
//! S3-DiT, [`transformer`]), FLUX.1's VAE, and the Fun ControlNet Union ([`controlnet`]).
//!
//! - [`pipeline`]: text → image, image-to-image and inpainting as `ZImagePipeline` computes them;
//! - [`denoise`] and [`control`]: the denoise loop's guidance and the ControlNet's steering;
//! - [`run`]: a job's images on a loaded model; [`layout`]: the original checkpoint names.
//!
//! Mirrors diffusers 0.42.1 (zimage-spec).

pub mod control;
pub mod controlnet;
pub mod controlnet_config;
pub mod controlnet_source;
pub mod denoise;
pub mod layout;
pub mod pipeline;
pub mod run;
pub mod transformer;

pub use controlnet::ControlNet;
pub use controlnet_config::{ControlNetConfig, ControlNetVersion};
pub use pipeline::{ModelConfigs, Pipeline};
pub use transformer::{DitConfig, ZImageTransformer};

use super::{ControlNets, Feature, Misfit, ModelFamily};
use crate::jobs::loaded::LoadedModel;
use crate::jobs::source::Source;
use crate::mapping::{Joined, LayoutError, Mapped};
use crate::memory_plan::{Denoiser, RuntimeMemory};
use crate::mlx::Dtype;
use crate::models::Checkpoint;
use crate::models::{Qwen3Config, VaeConfig};
use crate::pipeline::{Error, ModelSource};
use crate::store::SourceTensor;

/// The Z-Image family.
pub struct ZImage;

/// The memory plan's figures of Z-Image's transformer: its image and caption tokens each padded
/// to 32, the feed-forward's gate, up projection, SiLU and product (`4·ffn`) as the widest
/// products, attention through the shim's kernel on the CPU; its text encoder runs all layers
/// but the last, whose one output is the last residual stream.
pub fn denoiser(t: &DitConfig, text: &Qwen3Config, vae: &VaeConfig) -> Denoiser {
    Denoiser {
        dim: t.dim as u64,
        heads: t.n_heads as u64,
        wide_values: 4 * (t.dim as f64 / 3.0 * 8.0) as u64,
        cell: 2 * vae.scale_factor() as u64,
        pad_to: transformer::SEQ_MULTI_OF as u64,
        text_layers: text.layers_used(),
        text_outputs: 0,
        shim_attention: true,
        kept_per_text_token: 0,
        kept_per_reference_token: 0,
        widest_apart: None,
    }
}

impl ModelFamily for ZImage {
    fn name(&self) -> &'static str {
        "Z-Image"
    }

    fn class_names(&self) -> &'static [&'static str] {
        &["ZImagePipeline"]
    }

    fn takes(&self, feature: Feature) -> bool {
        feature != Feature::References
    }

    fn load(
        &self,
        source: Source,
        dtype: Dtype,
        keep_models: bool,
    ) -> Result<Box<dyn LoadedModel>, crate::jobs::error::Error> {
        Ok(Box::new(run::Loaded::new(source, dtype, keep_models)?))
    }

    fn check_configs(&self, configs: &[(String, Vec<u8>)]) -> Result<(), String> {
        pipeline::check_configs(configs)
    }

    fn check_model(&self, source: &dyn ModelSource) -> Result<(), Error> {
        let pipeline = Pipeline::new(source, Dtype::F32, false)?;
        drop(pipeline.load_text_encoder()?);
        drop(pipeline.load_transformer()?);
        drop(pipeline.load_vae()?);
        drop(pipeline.load_vae_encoder()?);
        Ok(())
    }

    fn check_transformer(&self, config: &[u8], checkpoint: Checkpoint) -> Result<(), Misfit> {
        let cfg: DitConfig = super::parse_config(config, DitConfig::validate)?;
        ZImageTransformer::new(&cfg, checkpoint).map_err(Misfit::Model)?;
        Ok(())
    }

    fn runtime_memory(&self, source: &dyn ModelSource, dtype: Dtype) -> Option<RuntimeMemory> {
        let pipeline = Pipeline::new(source, dtype, false).ok()?;
        let side = pipeline.configs.vae.sample_size.unwrap_or(1024);
        let sizes = pipeline.tensor_sizes().ok()?;
        let model = pipeline.model_sizes(&sizes);
        Some(RuntimeMemory::of(
            &model,
            side,
            64,
            1,
            dtype,
            pipeline.can_stream(),
        ))
    }

    fn transformer_class(&self) -> &'static str {
        "ZImageTransformer2DModel"
    }

    fn gguf_architecture(&self) -> &'static str {
        // Z-Image is a Lumina 2 (NextDiT) model to ComfyUI.
        "lumina2"
    }

    fn claims_checkpoint(&self, _tensors: &[SourceTensor]) -> bool {
        true
    }

    fn transformer_to_diffusers(
        &self,
        tensors: Vec<SourceTensor>,
        what: &str,
    ) -> Result<Mapped, LayoutError> {
        layout::to_diffusers(tensors, what)
    }

    fn claims_stored(&self, _tensors: &[(String, Vec<u64>)]) -> bool {
        true
    }

    fn transformer_to_original(&self, tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
        layout::to_original(tensors)
    }

    fn lora_guess(&self, has: &dyn Fn(&str) -> bool) -> Option<&'static str> {
        (has("feed_forward") && (has("adaLN_modulation") || has("attention")))
            .then_some("Z-Image (S3-DiT: `layers.*.attention`, `feed_forward.w1..w3`)")
    }

    fn controlnets(&self) -> Option<&'static dyn ControlNets> {
        Some(&controlnet_source::FunControlNets)
    }
}
