//! The generation settings a model is meant to be run with (a base model: 28–50 steps,
//! guidance 3–5, a negative prompt), kept beside its configs as `generation_defaults.json`,
//! and used where a request names none. A model without the file (a distilled one) keeps zimage's own
//! defaults: 8 steps, no guidance, the scheduler config's shift.
//!
//! ```json
//! {"steps": 28, "guidance": 4.0, "negative_prompt": "blurry", "shift": 6.0,
//!  "cfg_normalization": true, "cfg_truncation": 0.9}
//! ```
//! Every key is optional; an unknown key is refused, so a misspelt one is not silently ignored.

use crate::pipeline::{self, ModelSource};
use crate::store::{SourceTensor, StoreError, TensorSource};
use std::path::PathBuf;

/// Denoising steps when neither a request, its model nor its family names any.
pub const DEFAULT_STEPS: usize = 8;

/// The file, at the model's root (a diffusers directory's, or a config layer of the store).
pub(crate) use crate::diffusers_dir::DEFAULTS_FILE;

/// What a model says a request should use when it names nothing (`None`: zimage's default).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guidance: Option<f32>,
    /// Replaces the scheduler config's `shift`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shift: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub negative_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cfg_normalization: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cfg_truncation: Option<f64>,
}

impl GenerationDefaults {
    pub fn is_empty(&self) -> bool {
        *self == GenerationDefaults::default()
    }

    /// Parses and checks the file's bytes; the error names the field.
    pub fn parse(bytes: &[u8]) -> Result<GenerationDefaults, String> {
        let d: GenerationDefaults = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        d.validate()?;
        Ok(d)
    }

    /// The bounds a request keeps, checked on each value given.
    pub fn validate(&self) -> Result<(), String> {
        let max = crate::scheduler::MAX_STEPS;
        if let Some(s) = self.steps.filter(|s| !(1..=max).contains(s)) {
            return Err(format!("`steps` is {s}; it must be within 1..={max}"));
        }
        if let Some(g) = self.guidance.filter(|g| !g.is_finite() || *g < 0.0) {
            return Err(format!("`guidance` is {g}; it must be a finite number ≥ 0"));
        }
        if let Some(s) = self.shift.filter(|s| !s.is_finite() || *s <= 0.0) {
            return Err(format!(
                "`shift` is {s}; it must be a finite number above 0"
            ));
        }
        if let Some(t) = self.cfg_truncation {
            if pipeline::cfg_truncation_error(t).is_some() {
                return Err(format!("`cfg_truncation` is {t}; it must be within [0, 1]"));
            }
        }
        Ok(())
    }

    /// `self`'s values where it has them, `base`'s elsewhere.
    pub fn over(self, base: GenerationDefaults) -> GenerationDefaults {
        GenerationDefaults {
            steps: self.steps.or(base.steps),
            guidance: self.guidance.or(base.guidance),
            shift: self.shift.or(base.shift),
            negative_prompt: self.negative_prompt.or(base.negative_prompt),
            cfg_normalization: self.cfg_normalization.or(base.cfg_normalization),
            cfg_truncation: self.cfg_truncation.or(base.cfg_truncation),
        }
    }

    /// The defaults a model records (a stored model, or a diffusers directory): empty when it
    /// records none.
    pub fn of(source: &impl ModelSource) -> Result<GenerationDefaults, pipeline::Error> {
        let bytes = source
            .config_file(DEFAULTS_FILE)
            .map_err(|cause| pipeline::Error::Source {
                model: source.name(),
                cause,
            })?;
        match bytes {
            None => Ok(GenerationDefaults::default()),
            Some(b) => GenerationDefaults::parse(&b).map_err(|reason| pipeline::Error::BadConfig {
                model: source.name(),
                path: DEFAULTS_FILE.into(),
                reason,
            }),
        }
    }

    /// The steps, guidance, negative prompt and guidance options of a request that named
    /// `steps`, `guidance` and `negative` (or not): what it named, else these defaults, else
    /// zimage's (Turbo's).
    pub fn resolve(
        &self,
        steps: Option<usize>,
        guidance: Option<f32>,
        negative: Option<String>,
    ) -> (usize, f32, Option<String>) {
        (
            steps.or(self.steps).unwrap_or(DEFAULT_STEPS),
            guidance.or(self.guidance).unwrap_or(0.0),
            negative.or_else(|| self.negative_prompt.clone()),
        )
    }
}

/// An import source with the defaults `given` laid over those the source records: what
/// `create --default-…` stores.
pub struct WithDefaults<'a, S: ?Sized> {
    pub inner: &'a S,
    pub given: GenerationDefaults,
    /// Where the source is, for an error in the file it carries.
    pub source_name: PathBuf,
}

impl<S: TensorSource + ?Sized> TensorSource for WithDefaults<'_, S> {
    fn tensors(&self) -> Vec<SourceTensor> {
        self.inner.tensors()
    }

    fn config_files(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut files = self.inner.config_files()?;
        let recorded = match files.iter().find(|(p, _)| p == DEFAULTS_FILE) {
            Some((_, bytes)) => {
                GenerationDefaults::parse(bytes).map_err(|reason| StoreError::BadConfigFile {
                    path: self.source_name.join(DEFAULTS_FILE),
                    reason,
                })?
            }
            None => GenerationDefaults::default(),
        };
        let merged = self.given.clone().over(recorded);
        files.retain(|(p, _)| p != DEFAULTS_FILE);
        if !merged.is_empty() {
            let bytes = serde_json::to_vec_pretty(&merged).expect("defaults serialize");
            files.push((DEFAULTS_FILE.to_string(), bytes));
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_or_out_of_range_value_is_refused_by_name() {
        let e = GenerationDefaults::parse(br#"{"step": 28}"#).unwrap_err();
        assert!(e.contains("unknown field `step`"), "{e}");
        let e = GenerationDefaults::parse(br#"{"cfg_truncation": 1.5}"#).unwrap_err();
        assert!(e.contains("`cfg_truncation` is 1.5"), "{e}");
        let d = GenerationDefaults::parse(br#"{"steps": 28, "guidance": 4}"#).unwrap();
        assert_eq!(d.resolve(None, None, None), (28, 4.0, None));
        assert_eq!(d.resolve(Some(9), Some(0.0), None), (9, 0.0, None));
    }

    #[test]
    fn given_values_lie_over_recorded_ones() {
        let recorded = GenerationDefaults {
            steps: Some(50),
            negative_prompt: Some("blurry".into()),
            ..Default::default()
        };
        let given = GenerationDefaults {
            steps: Some(28),
            ..Default::default()
        };
        let merged = given.over(recorded);
        assert_eq!(merged.steps, Some(28));
        assert_eq!(merged.negative_prompt.as_deref(), Some("blurry"));
        assert!(GenerationDefaults::default().is_empty());
        assert_eq!(
            GenerationDefaults::default().resolve(None, None, None),
            (DEFAULT_STEPS, 0.0, None)
        );
    }
}
