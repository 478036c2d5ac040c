//! The model families zimage runs, and the one registry the rest of the code asks about them.
//!
//! A family is a folder here holding everything that is its own: its transformer, its pipeline
//! steps, its checkpoint names, its LoRA naming, its memory figures and its defaults. What
//! families share (Qwen3, the VAEs, attention, RoPE, the schedule, the denoise loop's and the
//! memory plan's machinery, LoRA's) lives outside, written once. The runner, the import, the
//! memory plan, the servers, the page and the command line ask a [`Family`] their questions and
//! never name one; [`FAMILIES`] is the only list. docs/families.md says how to add one.

#[doc(hidden)]
pub mod flux1;
#[doc(hidden)]
pub mod flux2_klein;
#[doc(hidden)]
pub mod flux3_klein;
#[doc(hidden)]
pub mod zimage;

pub use crate::jobs::feature::Feature;

use crate::jobs::loaded::LoadedModel;
use crate::jobs::source::Source;
use crate::lora::OriginalNames;
use crate::mapping::{Joined, LayoutError, Mapped};
use crate::memory_plan::RuntimeMemory;
use crate::mlx::Dtype;
use crate::models::Checkpoint;
use crate::pipeline::{Error, ModelSource};
use crate::store::import::TensorSourceSync;
use crate::store::SourceTensor;
use std::path::Path;

/// Every family zimage runs. The first is the one a `model_index.json` without a
/// `_class_name` is read as (the first family's early stores did not always keep it). Stored
/// transformers are told apart in this order, so a family whose tensor names include another's
/// comes before it.
pub static FAMILIES: &[&dyn ModelFamily] = &[
    &zimage::ZImage,
    &flux3_klein::Flux3Klein,
    &flux1::Flux1,
    &flux2_klein::Flux2Klein,
];

/// The steps and guidance a family runs a model with when neither the request nor the model
/// records any, and what kind of model that makes it (for `show`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OwnDefaults {
    /// Denoising steps.
    pub steps: usize,
    /// Guidance scale (what turns guidance off depends on the family).
    pub guidance: f32,
    /// `"distilled"`, `"base"`, …
    pub kind: &'static str,
}

/// What every family answers. Each family is a unit struct in its folder implementing this.
pub trait ModelFamily: Sync {
    /// The family as people call it.
    fn name(&self) -> &'static str;
    /// The `_class_name`s of its `model_index.json` (the first is the one zimage writes).
    fn class_names(&self) -> &'static [&'static str];
    /// Whether requests to this family may use `feature`.
    fn takes(&self, feature: Feature) -> bool;
    /// Whether requests to the model in `source` may use `feature`: what the family takes,
    /// unless only some of its models do (a family's editing models alone take references).
    fn model_takes(&self, _source: &dyn ModelSource, feature: Feature) -> bool {
        self.takes(feature)
    }
    /// What to use instead of a `feature` the model in `source` does not take, for the refusal.
    fn model_instead(&self, _source: &dyn ModelSource, feature: Feature) -> Option<&'static str> {
        self.instead(feature)
    }
    /// What to use instead of a `feature` the family does not take, for the refusal.
    fn instead(&self, _feature: Feature) -> Option<&'static str> {
        None
    }
    /// The pixels on a side of one token of the model in `source`: sizes are multiples of it.
    /// The default is the VAE's downscale times the 2×2 patch every family here packs.
    fn cell(&self, source: &dyn ModelSource) -> Result<u32, Error> {
        let vae: crate::models::VaeConfig =
            crate::pipeline::parse_config(source, "vae/config.json", |_| Ok(()))?;
        Ok(2 * vae.scale_factor() as u32)
    }
    /// The steps and guidance it runs with when nothing names them, if the family has its own.
    fn own_defaults(&self, _source: &dyn ModelSource) -> Option<OwnDefaults> {
        None
    }
    /// The model in `source` loaded (configs and tokenizer; weights load per phase) for the
    /// runner.
    fn load(
        &self,
        source: Source,
        dtype: Dtype,
        keep_models: bool,
    ) -> Result<Box<dyn LoadedModel>, crate::jobs::error::Error>;
    /// Checks that a model's component configs fit each other (an import's last check); the
    /// message names the file at fault.
    fn check_configs(&self, configs: &[(String, Vec<u8>)]) -> Result<(), String>;
    /// Builds every component of the model in `source` as `generate` builds them, so that an
    /// import that would not run is refused.
    fn check_model(&self, source: &dyn ModelSource) -> Result<(), Error>;
    /// Builds a transformer of this family from its diffusers `config` (bytes) and the
    /// tensors of `checkpoint`, as `generate` builds it.
    fn check_transformer(&self, config: &[u8], checkpoint: Checkpoint) -> Result<(), Misfit>;
    /// The memory `show` reports: the plan's figures at the model's own sample size.
    fn runtime_memory(&self, source: &dyn ModelSource, dtype: Dtype) -> Option<RuntimeMemory>;
    /// The original (non-diffusers) names its checkpoints and LoRAs give the transformer's
    /// linear layers, where it has any.
    fn original_names(&self) -> Option<OriginalNames> {
        None
    }
    /// The transformer's `_class_name` in diffusers' config.
    fn transformer_class(&self) -> &'static str;
    /// The `general.architecture` of a GGUF file of its transformer: the name ComfyUI-GGUF
    /// loads the family's original layout under.
    fn gguf_architecture(&self) -> &'static str;
    /// Whether a single-file transformer checkpoint with these tensors is this family's.
    fn claims_checkpoint(&self, tensors: &[SourceTensor]) -> bool;
    /// A transformer checkpoint's tensors under diffusers' names, with its config inferred.
    fn transformer_to_diffusers(
        &self,
        tensors: Vec<SourceTensor>,
        what: &str,
    ) -> Result<Mapped, LayoutError>;
    /// Whether a stored (diffusers-named) transformer is this family's.
    fn claims_stored(&self, tensors: &[(String, Vec<u64>)]) -> bool;
    /// The original layout of a stored transformer's tensors, for `export`.
    fn transformer_to_original(&self, tensors: &[(String, Vec<u64>)]) -> Vec<Joined>;
    /// The `model_index.json` and other files of a model composed from single files without a
    /// base directory, the transformer's file named `transformer_file` and its diffusers config
    /// (as its tensors and metadata tell it) `transformer_config`; `None` keeps the defaults
    /// every family shares.
    fn composed_files(
        &self,
        _transformer_file: &str,
        _transformer_config: &serde_json::Value,
    ) -> Option<Vec<(String, Vec<u8>)>> {
        None
    }
    /// Whether a model composed without a base directory reads the tokenizer the binary
    /// carries (Qwen's) when none is given; a family whose tokenizers are its own needs them
    /// given.
    fn reads_carried_tokenizer(&self) -> bool {
        true
    }
    /// What a LoRA whose target names contain what `has` finds is, when it looks like one of
    /// this family's (`Z-Image (S3-DiT: …)`).
    fn lora_guess(&self, _has: &dyn Fn(&str) -> bool) -> Option<&'static str> {
        None
    }
    /// The family's ControlNets, where it has any.
    fn controlnets(&self) -> Option<&'static dyn ControlNets> {
        None
    }
}

/// The error of a ControlNet question, as its family words it.
pub type ControlNetError = Box<dyn std::error::Error + Send + Sync>;

/// What a family's ControlNets answer: how they are recognised, described and imported.
pub trait ControlNets: Sync {
    /// One line on a stored model that is one of them (`ControlNet 2.1 (…)`); `None` for any
    /// other model, `Some(Err)` when its config cannot be read.
    fn describe_stored(&self, source: &dyn ModelSource) -> Option<Result<String, String>>;
    /// Whether `from` (a diffusers directory, or with `component` `model` a published single
    /// file) is one of them.
    fn recognises(&self, from: &Path, component: &str) -> Result<bool, ControlNetError>;
    /// `from`, opened for import.
    fn open(&self, from: &Path) -> Result<Box<dyn TensorSourceSync>, ControlNetError>;
}

/// The model family an adapter's targets suggest, for `inspect`.
pub fn lora_base_guess(targets: &std::collections::BTreeMap<String, usize>) -> String {
    let has = |s: &str| targets.keys().any(|t| t.contains(s));
    if let Some(guess) = Family::all().find_map(|f| f.lora_guess(&has)) {
        return guess.to_string();
    }
    let guess = if has("down_blocks") || has("up_blocks") || has("input_blocks") {
        format!("Stable Diffusion UNet; not a LoRA of {}", names())
    } else if has("self_attn") || has("mlp") {
        "a text encoder only".into()
    } else {
        "unknown".into()
    };
    guess
}

/// What the ControlNets of any family say of a stored model (see [`ControlNets::describe_stored`]).
pub fn describe_stored_controlnet(source: &dyn ModelSource) -> Option<Result<String, String>> {
    (Family::all())
        .filter_map(|f| f.controlnets())
        .find_map(|c| c.describe_stored(source))
}

/// The ControlNets of the family whose ControlNet `from` is, if any.
pub fn controlnet_at(
    from: &Path,
    component: &str,
) -> Result<Option<&'static dyn ControlNets>, ControlNetError> {
    for c in Family::all().filter_map(|f| f.controlnets()) {
        if c.recognises(from, component)? {
            return Ok(Some(c));
        }
    }
    Ok(None)
}

/// Why a component does not fit its config.
#[derive(Debug)]
pub enum Misfit {
    /// The config itself is wrong (the message says why).
    Config(String),
    /// The tensors do not make the component the config describes.
    Model(crate::models::ModelError),
}

/// A config's bytes parsed and validated, as a [`Misfit::Config`] on failure.
pub(crate) fn parse_config<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    validate: impl Fn(&T) -> Result<(), String>,
) -> Result<T, Misfit> {
    let config: T = serde_json::from_slice(bytes).map_err(|e| Misfit::Config(e.to_string()))?;
    validate(&config).map_err(Misfit::Config)?;
    Ok(config)
}

/// A family zimage runs, as the registry hands it out.
#[derive(Clone, Copy)]
pub struct Family(&'static dyn ModelFamily);

impl std::ops::Deref for Family {
    type Target = dyn ModelFamily;
    fn deref(&self) -> &Self::Target {
        self.0
    }
}

impl PartialEq for Family {
    fn eq(&self, other: &Family) -> bool {
        self.0.name() == other.0.name()
    }
}

impl Eq for Family {}

impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name())
    }
}

impl serde::Serialize for Family {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.name())
    }
}

/// Every family's name, for messages ("A, B and C").
pub fn names() -> String {
    let names: Vec<&str> = FAMILIES.iter().map(|f| f.name()).collect();
    match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

impl Family {
    /// Every family, in the registry's order.
    pub fn all() -> impl Iterator<Item = Family> {
        FAMILIES.iter().map(|f| Family(*f))
    }

    /// The family called `name` (as [`ModelFamily::name`] gives it).
    pub(crate) fn of_name(name: &str) -> Family {
        Family::all()
            .find(|f| f.name() == name)
            .expect("every family is in the registry")
    }

    /// The family a model without `_class_name` is read as.
    pub fn default_family() -> Family {
        Family(FAMILIES[0])
    }

    /// Whether this is the family a model without `_class_name` is read as (`list` names the
    /// others).
    pub fn is_default(self) -> bool {
        self == Family::default_family()
    }

    /// The family of a `model_index.json`.
    pub fn from_model_index(bytes: &[u8]) -> Result<Family, String> {
        let index: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| format!("`model_index.json` is not JSON: {e}"))?;
        let Some(class) = index.get("_class_name").and_then(|v| v.as_str()) else {
            return Ok(Family::default_family());
        };
        Family::all()
            .find(|f| f.class_names().contains(&class))
            .ok_or_else(|| {
                let known: Vec<String> = Family::all()
                    .map(|f| format!("`{}` ({})", f.class_names()[0], f.name()))
                    .collect();
                format!(
                    "`model_index.json` `_class_name` is `{class}`; zimage runs {}",
                    known.join(" and ")
                )
            })
    }

    /// The family of the model `source` holds, from its `model_index.json`.
    pub fn of(source: &(impl ModelSource + ?Sized)) -> Result<Family, Error> {
        let index = crate::pipeline::read_config(source, "model_index.json")?.ok_or_else(|| {
            Error::MissingConfig {
                model: source.name(),
                path: "model_index.json".into(),
            }
        })?;
        Family::from_model_index(&index).map_err(|reason| Error::BadConfig {
            model: source.name(),
            path: "model_index.json".into(),
            reason,
        })
    }

    /// The family whose transformer's diffusers config has this `_class_name`.
    pub fn of_transformer_class(class: &str) -> Option<Family> {
        Family::all().find(|f| f.transformer_class() == class)
    }

    /// The family a single-file transformer checkpoint is, told from its tensors; the default
    /// family's mapping reports what it expected when none claims it.
    pub fn of_checkpoint(tensors: &[SourceTensor]) -> Family {
        Family::all()
            .find(|f| !f.is_default() && f.claims_checkpoint(tensors))
            .unwrap_or_else(Family::default_family)
    }

    /// The family a stored transformer's (diffusers-named) tensors are, else the default.
    pub fn of_stored(tensors: &[(String, Vec<u64>)]) -> Family {
        Family::all()
            .find(|f| !f.is_default() && f.claims_stored(tensors))
            .unwrap_or_else(Family::default_family)
    }

    /// The refusal of the first of `used` the model in `source` does not take, naming its flag
    /// and, where the family takes it for other models, the kind of model this one is.
    pub fn refuse_for(self, source: &dyn ModelSource, used: &[Feature]) -> Result<(), String> {
        let Some(f) = used.iter().find(|f| !self.model_takes(source, **f)) else {
            return Ok(());
        };
        let kind = (self.takes(*f))
            .then(|| self.own_defaults(source).map(|d| d.kind))
            .flatten();
        let models = match kind {
            Some(kind) => format!("{} {kind}", self.name()),
            None => self.name().to_string(),
        };
        let mut refusal = format!("{} is not available for {models} models", f.flag());
        if let Some(instead) = self.model_instead(source, *f) {
            refusal += &format!(" ({instead})");
        }
        Err(refusal)
    }

    /// The refusal of the first of `used` this family does not take, naming its flag.
    pub fn refuse(self, used: &[Feature]) -> Result<(), String> {
        let Some(f) = used.iter().find(|f| !self.takes(**f)) else {
            return Ok(());
        };
        let mut refusal = format!("{} is not available for {} models", f.flag(), self.name());
        if let Some(instead) = self.instead(*f) {
            refusal += &format!(" ({instead})");
        }
        Err(refusal)
    }
}
