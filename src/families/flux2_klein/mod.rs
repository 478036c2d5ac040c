//! Black Forest Labs' FLUX.2 \[klein\]: the Qwen3 text encoder read at three depths, FLUX.2's
//! double- then single-stream transformer ([`transformer`], its 4-axis [`rope`]), FLUX.2's VAE
//! with its BatchNorm statistics, and reference pictures the model sees while it draws.
//!
//! - [`configs`]: what klein needs of its components' configs together;
//! - [`pipeline`]: text → image, editing, image-to-image and inpainting as diffusers'
//!   `Flux2KleinPipeline` computes them; [`run`]: a job's images on a loaded model;
//! - [`layout`]: Black Forest Labs' original checkpoint names, for single files, GGUF and LoRAs.
//!
//! Mirrors diffusers 0.42.1 (flux2-klein-spec).

pub mod configs;
pub mod layout;
pub mod pipeline;
pub mod rope;
pub mod run;
pub mod transformer;

pub use configs::TEXT_LAYERS;
pub use pipeline::{KleinConfigs, KleinPipeline};
pub use transformer::{Flux2Config, Flux2Transformer};

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

/// The FLUX.2 \[klein\] family.
pub struct Flux2Klein;

/// The family, as the registry hands it out.
pub(crate) fn family() -> super::Family {
    super::Family::of_name(Flux2Klein.name())
}

/// The memory plan's figures of klein's transformer over `cell`-pixel tokens: the 512 padded
/// text rows, the image's and the references' tokens, unpadded; the single block's fused
/// projection `[q k v | gate up]`, the gated MLP and the `[attention | MLP]` input of its output
/// projection (`3d + 2m + m + d + m`) as the widest products, that projection running apart from
/// the block's transients (its input, normed, and its output `[S, 3d + 2m]` beside it); MLX's
/// attention on both graphs; the projected text features and the references' tokens kept for
/// every step; the text encoder run to the deepest of the three layers it reads.
pub fn denoiser(t: &Flux2Config, cell: u32) -> Denoiser {
    let (d, m) = (t.dim() as u64, t.mlp_dim() as u64);
    Denoiser {
        dim: d,
        heads: t.num_attention_heads as u64,
        wide_values: 4 * (d + m),
        cell: cell as u64,
        pad_to: 1,
        text_layers: *TEXT_LAYERS.iter().max().expect("three layers") as i32,
        text_outputs: TEXT_LAYERS.len() as u64,
        shim_attention: false,
        kept_per_text_token: t.joint_attention_dim as u64,
        kept_per_reference_token: t.in_channels as u64,
        widest_apart: Some(2 * d + 3 * d + 2 * m),
    }
}

impl ModelFamily for Flux2Klein {
    fn name(&self) -> &'static str {
        "FLUX.2 [klein]"
    }

    fn class_names(&self) -> &'static [&'static str] {
        &["Flux2KleinPipeline"]
    }

    fn takes(&self, feature: Feature) -> bool {
        use Feature::*;
        matches!(
            feature,
            References | NegativePrompt | ImageInput | Mask | Hires
        )
    }

    fn own_defaults(&self, source: &dyn ModelSource) -> Option<OwnDefaults> {
        let (steps, guidance, distilled) = pipeline::family_defaults(source)?;
        let kind = if distilled { "distilled" } else { "base" };
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
            pipeline::KleinPipeline::new,
        )?))
    }

    fn check_configs(&self, configs: &[(String, Vec<u8>)]) -> Result<(), String> {
        configs::check_files(configs)
    }

    fn check_model(&self, source: &dyn ModelSource) -> Result<(), Error> {
        let klein = KleinPipeline::new(source, Dtype::F32)?;
        drop(klein.load_text_encoder()?);
        drop(klein.load_transformer()?);
        drop(klein.load_vae()?);
        drop(klein.load_vae_encoder()?);
        drop(klein.latent_statistics()?);
        Ok(())
    }

    fn check_transformer(&self, config: &[u8], checkpoint: Checkpoint) -> Result<(), Misfit> {
        let cfg: Flux2Config = super::parse_config(config, Flux2Config::validate)?;
        Flux2Transformer::new(&cfg, checkpoint).map_err(Misfit::Model)?;
        Ok(())
    }

    fn runtime_memory(&self, source: &dyn ModelSource, dtype: Dtype) -> Option<RuntimeMemory> {
        let klein = KleinPipeline::new(source, dtype).ok()?;
        let c = &klein.configs;
        let side = c.vae.sample_size.unwrap_or(1024);
        let prompts = if c.is_distilled { 1 } else { 2 };
        let tokens = pipeline::MAX_SEQUENCE_LENGTH as u32;
        let sizes = klein.tensor_sizes().ok()?;
        let model = klein.model_sizes(&sizes);
        Some(RuntimeMemory::of(
            &model,
            side,
            tokens,
            prompts,
            dtype,
            klein.can_stream(),
        ))
    }

    fn original_names(&self) -> Option<OriginalNames> {
        Some(layout::original_linear)
    }

    fn transformer_class(&self) -> &'static str {
        "Flux2Transformer2DModel"
    }

    fn gguf_architecture(&self) -> &'static str {
        // The FLUX line shares one name.
        "flux"
    }

    fn claims_checkpoint(&self, tensors: &[SourceTensor]) -> bool {
        layout::is_flux2(tensors)
    }

    fn transformer_to_diffusers(
        &self,
        tensors: Vec<SourceTensor>,
        what: &str,
    ) -> Result<Mapped, LayoutError> {
        layout::to_diffusers(tensors, what)
    }

    fn claims_stored(&self, tensors: &[(String, Vec<u64>)]) -> bool {
        (tensors.iter()).any(|(n, _)| n.starts_with("single_transformer_blocks."))
    }

    fn transformer_to_original(&self, tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
        layout::to_original(tensors)
    }

    fn lora_guess(&self, has: &dyn Fn(&str) -> bool) -> Option<&'static str> {
        if has("double_blocks") || has("single_blocks") {
            Some("FLUX, original names (`double_blocks`/`single_blocks`): FLUX.2 [klein] if the widths fit")
        } else if has("transformer_blocks") {
            Some("FLUX, diffusers names (`transformer_blocks`/`single_transformer_blocks`): FLUX.2 [klein] if the widths fit")
        } else {
            None
        }
    }

    fn composed_files(
        &self,
        transformer_file: &str,
        _transformer_config: &serde_json::Value,
    ) -> Option<Vec<(String, Vec<u8>)>> {
        Some(configs::composed_files(transformer_file))
    }
}
