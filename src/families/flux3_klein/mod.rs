//! Black Forest Labs' FLUX.3 \[klein\]: Qwen3-VL's language model read at eight depths, a
//! transformer whose image, reference and text tokens first run through blocks of their own
//! mode and then through joint blocks ([`transformer`], its 4-axis [`rope`]), FLUX.2's VAE with
//! its BatchNorm statistics, and reference pictures kept whole ([`references`]).
//!
//! - [`configs`]: what FLUX.3 reads of its components' configs, checked together;
//! - [`pipeline`]: text → image and editing as diffusers' modular FLUX.3 blocks compute them
//!   (the prompt upsampler left out); [`run`]: a job's images on a loaded model;
//! - [`layout`]: Black Forest Labs' original transformer names, for single files, GGUF, export
//!   and LoRAs.
//!
//! Mirrors diffusers 0.42.1 (flux3-klein-spec).

pub mod configs;
pub mod layout;
pub mod pipeline;
pub mod references;
pub mod rope;
pub mod run;
pub mod transformer;

pub use pipeline::Flux3Pipeline;
pub use transformer::{Flux3Config, Flux3Transformer};

use super::{Feature, Misfit, ModelFamily, OwnDefaults};
use crate::jobs::loaded::LoadedModel;
use crate::jobs::source::Source;
use crate::lora::OriginalNames;
use crate::mapping::{Joined, LayoutError, Mapped};
use crate::memory_plan::{Denoiser, RuntimeMemory};
use crate::mlx::Dtype;
use crate::models::Checkpoint;
use crate::pipeline::{Error, ModelSource};
use crate::store::SourceTensor;

/// The FLUX.3 \[klein\] family.
pub struct Flux3Klein;

/// The family, as the registry hands it out.
pub(crate) fn family() -> super::Family {
    super::Family::of_name(Flux3Klein.name())
}

/// The memory plan's figures of FLUX.3's transformer over `cell`-pixel tokens: the text
/// window, the image's and the references' tokens, unpadded; a block's q, k, v, the
/// feed-forward's `[gate | value]`, its gated product and the two outputs as the widest
/// products; MLX's attention on both graphs; the text features and the references' tokens
/// kept for every step; the text encoder run to the deepest of the eight layers it reads.
pub fn denoiser(t: &Flux3Config, cell: u32) -> Denoiser {
    let (d, m) = (t.dim() as u64, t.mlp_dim() as u64);
    Denoiser {
        dim: d,
        heads: t.num_attention_heads as u64,
        wide_values: 3 * d + 2 * m + m + 2 * d,
        cell: cell as u64,
        pad_to: 1,
        text_layers: *configs::TEXT_LAYERS.iter().max().expect("eight layers") as i32,
        text_outputs: configs::TEXT_LAYERS.len() as u64,
        shim_attention: false,
        kept_per_text_token: t.joint_attention_dim as u64,
        kept_per_reference_token: t.cond_in_channels as u64,
        widest_apart: None,
    }
}

/// Whether the model in `source` is a flow map (step-distilled), from its transformer config.
fn flow_map(source: &dyn ModelSource) -> Option<bool> {
    let bytes = crate::pipeline::read_config(source, "transformer/config.json").ok()??;
    let config: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    Some(config["flow_map"].as_bool().unwrap_or(false))
}

impl ModelFamily for Flux3Klein {
    fn name(&self) -> &'static str {
        "FLUX.3 [klein]"
    }

    fn class_names(&self) -> &'static [&'static str] {
        &["Flux3DistilledModularPipeline", "Flux3ModularPipeline"]
    }

    fn takes(&self, feature: Feature) -> bool {
        matches!(feature, Feature::References | Feature::NegativePrompt)
    }

    // diffusers' FLUX.3 blocks have no image-to-image or inpainting, so neither a picture to
    // start from nor a mask, nor a hires pass (an image-to-image of the first picture).
    fn instead(&self, feature: Feature) -> Option<&'static str> {
        (matches!(
            feature,
            Feature::ImageInput | Feature::Mask | Feature::Hires
        ))
        .then_some("it edits from reference pictures, --ref")
    }

    fn own_defaults(&self, source: &dyn ModelSource) -> Option<OwnDefaults> {
        let flow_map = flow_map(source)?;
        let (steps, guidance) = pipeline::default_steps_and_guidance(flow_map);
        let kind = if flow_map { "distilled" } else { "base" };
        Some(OwnDefaults {
            steps,
            guidance,
            kind,
        })
    }

    fn load(
        &self,
        source: Source,
        dtype: Dtype,
        _keep_models: bool,
    ) -> Result<Box<dyn LoadedModel>, crate::jobs::error::Error> {
        Ok(Box::new(run::Loaded::new(
            source,
            dtype,
            Flux3Pipeline::new,
        )?))
    }

    fn check_configs(&self, configs: &[(String, Vec<u8>)]) -> Result<(), String> {
        configs::check_files(configs)
    }

    fn check_model(&self, source: &dyn ModelSource) -> Result<(), Error> {
        let p = Flux3Pipeline::new(source, Dtype::F32)?;
        drop(p.load_text_encoder()?);
        drop(p.load_transformer()?);
        drop(p.load_vae()?);
        drop(p.load_vae_encoder()?);
        drop(p.latent_statistics()?);
        Ok(())
    }

    fn check_transformer(&self, config: &[u8], checkpoint: Checkpoint) -> Result<(), Misfit> {
        let cfg: Flux3Config = super::parse_config(config, Flux3Config::validate)?;
        Flux3Transformer::new(&cfg, checkpoint).map_err(Misfit::Model)?;
        Ok(())
    }

    fn runtime_memory(&self, source: &dyn ModelSource, dtype: Dtype) -> Option<RuntimeMemory> {
        let p = Flux3Pipeline::new(source, dtype).ok()?;
        let c = &p.configs;
        let side = c.vae.sample_size.unwrap_or(1024);
        let prompts = if c.transformer.flow_map { 1 } else { 2 };
        // A short prompt's window.
        let tokens = configs::PAD_MULTIPLE as u32;
        let sizes = p.tensor_sizes().ok()?;
        let model = p.model_sizes(&sizes);
        Some(RuntimeMemory::of(
            &model,
            side,
            tokens,
            prompts,
            dtype,
            p.can_stream(),
        ))
    }

    fn transformer_class(&self) -> &'static str {
        "Flux3Transformer2DModel"
    }

    fn gguf_architecture(&self) -> &'static str {
        // The FLUX line shares one name; ComfyUI tells the models apart by their tensors.
        "flux"
    }

    fn claims_checkpoint(&self, tensors: &[SourceTensor]) -> bool {
        layout::is_flux3(tensors)
    }

    fn transformer_to_diffusers(
        &self,
        tensors: Vec<SourceTensor>,
        what: &str,
    ) -> Result<Mapped, LayoutError> {
        layout::to_diffusers(tensors, what)
    }

    fn claims_stored(&self, tensors: &[(String, Vec<u64>)]) -> bool {
        (tensors.iter()).any(|(n, _)| n.starts_with("txt_mode_blocks."))
    }

    fn transformer_to_original(&self, tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
        layout::to_original(tensors)
    }

    fn original_names(&self) -> Option<OriginalNames> {
        Some(layout::original_linear)
    }

    fn lora_guess(&self, has: &dyn Fn(&str) -> bool) -> Option<&'static str> {
        layout::lora_guess(has)
    }

    fn composed_files(
        &self,
        transformer_file: &str,
        _transformer_config: &serde_json::Value,
    ) -> Option<Vec<(String, Vec<u8>)>> {
        Some(configs::composed_files(transformer_file))
    }
}
