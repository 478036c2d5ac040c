//! Black Forest Labs' FLUX.1 (\[dev\], \[schnell\], Krea \[dev\], Kontext \[dev\]): CLIP's pooled vector
//! and T5's rows as the prompt (the shared `models::clip_text` and `models::t5`), FLUX.1's
//! double- then single-stream transformer ([`transformer`], its 3-axis [`rope`]) and the 16-channel
//! AutoencoderKL.
//!
//! - [`transformer`]: `FluxTransformer2DModel` as diffusers computes it, from the config and the
//!   checkpoint in diffusers' names; \[dev\] and Kontext embed the guidance scale, \[schnell\] does
//!   not;
//! - [`rope`]: the position ids (text all zero, the image `(0, i, j)`, a Kontext picture
//!   `(1, i, j)`) and their rotary tables;
//! - [`configs`]: what the five components' configs must say of each other;
//! - [`layout`]: Black Forest Labs' original checkpoint names, for single files, GGUF, export
//!   and LoRAs;
//! - [`pipeline`]: text → image, Kontext editing, image-to-image and inpainting as diffusers'
//!   Flux pipelines compute them; [`kontext`]: the picture Kontext edits, sized as diffusers
//!   sizes it; [`run`]: a job's images on a loaded model.
//!
//! Mirrors diffusers 0.42.1 (flux1-spec).

pub mod configs;
pub mod kontext;
pub mod layout;
pub mod pipeline;
pub mod rope;
pub mod run;
pub mod transformer;

pub use pipeline::Flux1Pipeline;
pub use transformer::{Flux1Config, Flux1Transformer};

use super::{Feature, Misfit, ModelFamily, OwnDefaults};
use crate::jobs::loaded::LoadedModel;
use crate::jobs::source::Source;
use crate::lora::OriginalNames;
use crate::mapping::{Joined, LayoutError, Mapped};
use crate::memory_plan::RuntimeMemory;
use crate::mlx::Dtype;
use crate::models::Checkpoint;
use crate::pipeline::{Error, ModelSource};
use crate::store::SourceTensor;

/// The FLUX.1 family.
pub struct Flux1;

/// The family, as the registry hands it out.
pub(crate) fn family() -> super::Family {
    super::Family::of_name(Flux1.name())
}

/// The original names FLUX.1's checkpoints and LoRAs give its transformer's layers.
pub(crate) fn original_names() -> Option<OriginalNames> {
    Some(layout::original_linear)
}

/// The transformer config of the model in `source`.
fn transformer_config(source: &dyn ModelSource) -> Option<Flux1Config> {
    let bytes = crate::pipeline::read_config(source, "transformer/config.json").ok()??;
    serde_json::from_slice(&bytes).ok()
}

/// Whether the model in `source` edits a picture (Kontext).
pub fn is_kontext(source: &dyn ModelSource) -> bool {
    let index = crate::pipeline::read_config(source, "model_index.json")
        .ok()
        .flatten();
    let class = index
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["_class_name"].as_str().map(str::to_string));
    class.is_some_and(|c| configs::KONTEXT_CLASSES.contains(&c.as_str()))
}

impl ModelFamily for Flux1 {
    fn name(&self) -> &'static str {
        "FLUX.1"
    }

    fn class_names(&self) -> &'static [&'static str] {
        &[
            "FluxPipeline",
            "FluxKontextPipeline",
            "FluxImg2ImgPipeline",
            "FluxInpaintPipeline",
            "FluxKontextInpaintPipeline",
        ]
    }

    fn takes(&self, feature: Feature) -> bool {
        use Feature::*;
        matches!(
            feature,
            TrueCfg | NegativePrompt | References | ImageInput | Mask | Hires
        )
    }

    /// Only Kontext edits a picture given as a reference, and it only edits: \[dev\] and
    /// \[schnell\] start from a picture (`--image`, with a mask, or a hires pass's) instead.
    fn model_takes(&self, source: &dyn ModelSource, feature: Feature) -> bool {
        match feature {
            Feature::References => is_kontext(source),
            Feature::ImageInput | Feature::Mask | Feature::Hires => !is_kontext(source),
            other => self.takes(other),
        }
    }

    fn model_instead(&self, source: &dyn ModelSource, feature: Feature) -> Option<&'static str> {
        match (feature, is_kontext(source)) {
            (Feature::References, false) => {
                Some("only Kontext models edit a picture given; start from one with --image")
            }
            (Feature::ImageInput | Feature::Mask | Feature::Hires, true) => {
                Some("it edits the picture given with --ref")
            }
            _ => None,
        }
    }

    fn own_defaults(&self, source: &dyn ModelSource) -> Option<OwnDefaults> {
        let t = transformer_config(source)?;
        let (steps, guidance) = pipeline::default_steps_and_guidance(&t);
        let kind = match (t.guidance_embeds, is_kontext(source)) {
            (_, true) => "Kontext [dev]",
            (true, false) => "[dev]",
            (false, false) => "[schnell]",
        };
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
            Flux1Pipeline::new,
        )?))
    }

    fn check_configs(&self, configs: &[(String, Vec<u8>)]) -> Result<(), String> {
        configs::check_files(configs)
    }

    fn check_model(&self, source: &dyn ModelSource) -> Result<(), Error> {
        let p = Flux1Pipeline::new(source, Dtype::F32)?;
        drop(p.load_clip()?);
        drop(p.load_t5()?);
        drop(p.load_transformer()?);
        drop(p.load_vae()?);
        drop(p.load_vae_encoder()?);
        Ok(())
    }

    fn check_transformer(&self, config: &[u8], checkpoint: Checkpoint) -> Result<(), Misfit> {
        let cfg: Flux1Config = super::parse_config(config, Flux1Config::validate)?;
        Flux1Transformer::new(&cfg, checkpoint).map_err(Misfit::Model)?;
        Ok(())
    }

    fn runtime_memory(&self, source: &dyn ModelSource, dtype: Dtype) -> Option<RuntimeMemory> {
        let p = Flux1Pipeline::new(source, dtype).ok()?;
        let side = p.configs.vae.sample_size.unwrap_or(1024);
        let tokens = pipeline::text_length(&p.configs.transformer) as u32;
        let sizes = p.tensor_sizes().ok()?;
        let model = p.model_sizes(&sizes);
        Some(RuntimeMemory::of(
            &model,
            side,
            tokens,
            1,
            dtype,
            p.can_stream(),
        ))
    }

    fn original_names(&self) -> Option<OriginalNames> {
        original_names()
    }

    fn transformer_class(&self) -> &'static str {
        "FluxTransformer2DModel"
    }

    fn gguf_architecture(&self) -> &'static str {
        "flux"
    }

    fn claims_checkpoint(&self, tensors: &[SourceTensor]) -> bool {
        layout::is_flux1(tensors)
    }

    fn transformer_to_diffusers(
        &self,
        tensors: Vec<SourceTensor>,
        what: &str,
    ) -> Result<Mapped, LayoutError> {
        layout::to_diffusers(tensors, what)
    }

    fn claims_stored(&self, tensors: &[(String, Vec<u64>)]) -> bool {
        layout::is_stored_flux1(tensors)
    }

    /// FLUX.1's own layers: per-block modulation, the pooled-text and guidance embedders, XLabs'
    /// processors; a LoRA on attention alone is told by the next FLUX family's guess.
    fn lora_guess(&self, has: &dyn Fn(&str) -> bool) -> Option<&'static str> {
        let ours = [
            "img_mod",
            "txt_mod",
            "modulation_lin",
            "modulation.lin",
            "vector_in",
        ]
        .iter()
        .chain(&[
            "guidance_in",
            "time_text_embed",
            "norm1_context",
            "norm1.linear",
        ])
        .any(|s| has(s));
        if has("processor") || has("linear1[:") {
            Some("FLUX.1, XLabs names (`double_blocks.N.processor.qkv_lora1`): FLUX.1 if the widths fit")
        } else if ours && (has("double_blocks") || has("single_blocks")) {
            Some("FLUX.1, original names (`double_blocks.N.img_mod`/`single_blocks`): FLUX.1 if the widths fit")
        } else if ours {
            Some("FLUX.1, diffusers names (`transformer_blocks.N.norm1`/`time_text_embed`): FLUX.1 if the widths fit")
        } else {
            None
        }
    }

    fn transformer_to_original(&self, tensors: &[(String, Vec<u64>)]) -> Vec<Joined> {
        layout::to_original(tensors)
    }

    fn composed_files(
        &self,
        transformer_file: &str,
        transformer_config: &serde_json::Value,
    ) -> Option<Vec<(String, Vec<u8>)>> {
        Some(configs::composed_files(
            transformer_file,
            transformer_config,
        ))
    }

    /// CLIP's and T5's tokenizers are FLUX.1's own: a model composed without a directory is
    /// given them (`--tokenizer`, `--tokenizer-2`).
    fn reads_carried_tokenizer(&self) -> bool {
        false
    }
}
