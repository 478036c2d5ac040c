//! Which model family a model is, read once from the model itself: a diffusers directory's
//! `model_index.json` `_class_name` (`ZImagePipeline`, `Flux2KleinPipeline`), which a stored
//! model keeps as its config. The runner asks the family what a request may use; the family's
//! own networks and steps live in its folder (`models::flux2`, `pipeline::klein`).

/// A model family zimage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Family {
    /// Tongyi's Z-Image (Turbo and base): a Qwen3 text encoder, a single-stream transformer,
    /// Flux's VAE.
    ZImage,
    /// Black Forest Labs' FLUX.2 \[klein\]: a Qwen3 text encoder, FLUX.2's transformer and
    /// VAE, reference images.
    Flux2Klein,
}

/// A request option some families do not take, named as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Steering by a control image through a ControlNet.
    ControlNet,
    /// Guidance switched off once the model time passes a threshold (`--cfg-truncation`).
    CfgTruncation,
    /// Each guided prediction capped at the norm of the prompt's own (`--cfg-normalization`).
    CfgNormalization,
    /// A prompt to steer away from.
    NegativePrompt,
    /// Reference images the model sees while it draws.
    References,
}

impl Feature {
    /// The command-line option that asks for the feature, for messages.
    pub fn flag(self) -> &'static str {
        match self {
            Feature::ControlNet => "--controlnet/--control",
            Feature::CfgTruncation => "--cfg-truncation",
            Feature::CfgNormalization => "--cfg-normalization",
            Feature::NegativePrompt => "--negative-prompt",
            Feature::References => "--ref",
        }
    }
}

impl Family {
    /// The family of a `model_index.json`; one without `_class_name` is Z-Image's (the first
    /// family, whose early stores did not always keep it).
    pub fn from_model_index(bytes: &[u8]) -> Result<Family, String> {
        let index: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| format!("`model_index.json` is not JSON: {e}"))?;
        match index.get("_class_name").and_then(|v| v.as_str()) {
            None | Some("ZImagePipeline") => Ok(Family::ZImage),
            Some("Flux2KleinPipeline") => Ok(Family::Flux2Klein),
            Some(other) => Err(format!(
                "`model_index.json` `_class_name` is `{other}`; zimage runs `ZImagePipeline` (Z-Image) and `Flux2KleinPipeline` (FLUX.2 [klein])"
            )),
        }
    }

    /// The family as people call it.
    pub fn name(self) -> &'static str {
        match self {
            Family::ZImage => "Z-Image",
            Family::Flux2Klein => "FLUX.2 [klein]",
        }
    }

    /// Whether requests to this family may use `feature`.
    pub fn takes(self, feature: Feature) -> bool {
        match self {
            Family::ZImage => feature != Feature::References,
            Family::Flux2Klein => matches!(feature, Feature::References | Feature::NegativePrompt),
        }
    }

    /// The refusal of the first of `used` this family does not take, naming its flag.
    pub fn refuse(self, used: &[Feature]) -> Result<(), String> {
        match used.iter().find(|f| !self.takes(**f)) {
            Some(f) => Err(format!(
                "{} is not available for {} models",
                f.flag(),
                self.name()
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_name_picks_the_family() {
        let klein = br#"{"_class_name": "Flux2KleinPipeline", "is_distilled": true}"#;
        assert_eq!(Family::from_model_index(klein), Ok(Family::Flux2Klein));
        assert_eq!(
            Family::from_model_index(br#"{"_class_name": "ZImagePipeline"}"#),
            Ok(Family::ZImage)
        );
        let err = Family::from_model_index(br#"{"_class_name": "FluxPipeline"}"#).unwrap_err();
        assert!(err.contains("FluxPipeline"), "{err}");
    }

    #[test]
    fn options_a_family_lacks_are_refused_by_name() {
        let err = Family::Flux2Klein
            .refuse(&[Feature::CfgTruncation])
            .unwrap_err();
        assert!(
            err.contains("--cfg-truncation") && err.contains("klein"),
            "{err}"
        );
        assert!(Family::ZImage.refuse(&[Feature::References]).is_err());
        assert!(Family::ZImage.refuse(&[Feature::ControlNet]).is_ok());
    }
}
