//! Before `create` stores anything: the components of an import are built the way `generate`
//! builds them, from their configs and their tensors' names, shapes and dtypes, so that a
//! component `generate` would refuse (a missing, extra or transposed tensor, a config that does
//! not fit, a vocabulary or a block count the other files contradict) is refused now, in one
//! line naming the file and the tensor, and never stored.
//!
//! Nothing is read or computed: each tensor stands in as a lazy array of its shape that is never
//! evaluated, so the check costs no memory whatever the model's size.

use crate::families::{Family, Misfit};
use crate::memory_plan::TensorSize;
use crate::mlx::Array;
use crate::models::weights::{Checkpoint, ComponentWeights};
use crate::models::{Qwen3Config, VaeConfig};
use crate::pipeline::{ModelSource, SourceError};
use crate::store::import::{Encoding, SourceTensor, TensorSource};
use std::collections::HashMap;
use std::path::PathBuf;

/// A component that does not fit its config or the model.
#[derive(Debug, thiserror::Error)]
#[error("{}{reason}{}; nothing was stored", file.as_ref().map(|f| format!("`{}`: ", crate::shown::path(f))).unwrap_or_default(), more_text(*more))]
pub struct DoesNotFit {
    /// The file of the tensor at fault, when one is.
    pub file: Option<PathBuf>,
    pub reason: String,
    /// Further problems found in the same component.
    pub more: usize,
}

fn more_text(more: usize) -> String {
    match more {
        0 => String::new(),
        1 => " (and 1 more problem)".into(),
        n => format!(" (and {n} more problems)"),
    }
}

/// What an import is about to store, as a pipeline source.
struct Preview {
    name: String,
    tensors: Vec<SourceTensor>,
    configs: HashMap<String, Vec<u8>>,
}

impl Preview {
    fn of(component: &str, t: &SourceTensor) -> bool {
        t.component == component
    }

    /// The logical dtype a tensor is held in (ggml blocks widen to f32, fp8 to bf16).
    fn dtype(t: &SourceTensor) -> crate::mlx::Dtype {
        match t.encoding {
            Encoding::Plain if crate::fp8::is_fp8(t.dtype) => crate::mlx::Dtype::BF16,
            Encoding::Plain => t.dtype,
            Encoding::Ggml(_) => crate::mlx::Dtype::F32,
        }
    }
}

impl ModelSource for Preview {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn identity(&self) -> String {
        String::new()
    }

    fn config_file(&self, path: &str) -> Result<Option<Vec<u8>>, SourceError> {
        Ok(self.configs.get(path).cloned())
    }

    fn component(&self, component: &str) -> Result<ComponentWeights, SourceError> {
        let mut tensors = HashMap::new();
        for t in self.tensors.iter().filter(|t| Preview::of(component, t)) {
            let shape = t
                .shape
                .iter()
                .map(|&d| i32::try_from(d))
                .collect::<Result<Vec<i32>, _>>()
                .map_err(|_| {
                    format!(
                        "tensor `{}` has shape {:?}, too large for any model",
                        crate::shown::text(&t.name),
                        t.shape
                    )
                })?;
            // Lazy: never evaluated, so it holds no memory.
            let stand_in = Array::zeros(&shape, Preview::dtype(t)).map_err(|e| e.to_string())?;
            tensors.insert(t.name.clone(), stand_in);
        }
        Ok(ComponentWeights {
            tensors,
            quantized: HashMap::new(),
            release: None,
        })
    }

    fn tensor_sizes(&self, component: &str) -> Result<Vec<TensorSize>, SourceError> {
        Ok((self.tensors.iter())
            .filter(|t| Preview::of(component, t))
            .map(|t| TensorSize {
                name: t.name.clone(),
                shape: t.shape.clone(),
                stored_bytes: t.nbytes,
                packed: false,
            })
            .collect())
    }
}

/// Whether a config says which model it configures, as diffusers' (`_class_name`) and
/// transformers' (`architectures`, `model_type`) configs do. A config that does not is a file
/// the store keeps as it is, with tensors it holds for other programs.
fn declares_model(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes).is_ok_and(|v| {
        ["_class_name", "architectures", "model_type"]
            .iter()
            .any(|k| v.get(k).is_some())
    })
}

/// Checks that every component of `source` fits its config and the model. A whole pipeline
/// (`model_index.json` and component configs that say which model they configure) is checked
/// as `generate` opens it: configs, tokenizer and every component. Otherwise each component is
/// checked against its own config when the import has one that says what it is.
pub fn check<S: TensorSource + ?Sized>(source: &S) -> Result<(), DoesNotFit> {
    let tensors = source.tensors();
    if let Some(scale) = crate::fp8::unread_scale(tensors.iter().map(|t| t.name.as_str())) {
        let t = tensors
            .iter()
            .find(|t| t.name == scale)
            .expect("found among them");
        return Err(DoesNotFit {
            file: Some(t.file.clone()),
            reason: format!("tensor `{scale}` {}", crate::fp8::SCALE_REFUSAL),
            more: 0,
        });
    }
    for t in &tensors {
        if t.name.is_empty() || t.name.chars().any(char::is_control) {
            return Err(DoesNotFit {
                file: Some(t.file.clone()),
                reason: format!(
                    "tensor `{}` ({}) has an empty name or a control character in it",
                    crate::shown::text(&t.name),
                    t.component
                ),
                more: 0,
            });
        }
    }
    let configs: HashMap<String, Vec<u8>> = match source.config_files() {
        Ok(c) => c.into_iter().collect(),
        Err(e) => {
            return Err(DoesNotFit {
                file: None,
                reason: e.to_string(),
                more: 0,
            })
        }
    };
    let preview = Preview {
        name: "the import".into(),
        tensors,
        configs,
    };
    let declared = |path: &str| preview.configs.get(path).is_some_and(|b| declares_model(b));
    let parts = ["transformer", "text_encoder", "vae"].map(|c| format!("{c}/config.json"));
    if preview.configs.contains_key("model_index.json") && parts.iter().all(|p| declared(p)) {
        return check_pipeline(preview);
    }
    let failed = |e: crate::pipeline::Error| explain(&preview.tensors, e);
    let has = |c: &str| preview.tensors.iter().any(|t| t.component == c);
    let config = |path: &str| preview.configs.get(path).filter(|b| declares_model(b));
    let model_err = |e: crate::models::ModelError| failed(e.into());
    let bad_config = |path: &str, reason: String| DoesNotFit {
        file: None,
        reason: format!("{path}: {reason}"),
        more: 0,
    };
    let checkpoint = |c: &str| -> Result<Checkpoint, DoesNotFit> {
        let w = preview.component(c).map_err(|e| DoesNotFit {
            file: None,
            reason: e.to_string(),
            more: 0,
        })?;
        Ok(Checkpoint::new(c, w.tensors, crate::mlx::Dtype::F32))
    };
    if let (true, Some(bytes)) = (has("transformer"), config("transformer/config.json")) {
        let class = serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .and_then(|v| v["_class_name"].as_str().map(String::from));
        let family = (class.as_deref())
            .and_then(Family::of_transformer_class)
            .unwrap_or_else(Family::default_family);
        match family.check_transformer(bytes, checkpoint("transformer")?) {
            Ok(()) => {}
            Err(Misfit::Config(r)) => return Err(bad_config("transformer/config.json", r)),
            Err(Misfit::Model(e)) => return Err(model_err(e)),
        }
    }
    if let (true, Some(bytes)) = (has("text_encoder"), config("text_encoder/config.json")) {
        let cfg: Qwen3Config = parse(bytes, Qwen3Config::validate)
            .map_err(|r| bad_config("text_encoder/config.json", r))?;
        drop(
            crate::models::qwen3::Qwen3Encoder::new(&cfg, checkpoint("text_encoder")?)
                .map_err(model_err)?,
        );
    }
    if let (true, Some(bytes)) = (has("vae"), config("vae/config.json")) {
        let cfg: VaeConfig =
            parse(bytes, VaeConfig::validate).map_err(|r| bad_config("vae/config.json", r))?;
        drop(crate::models::vae::VaeDecoder::new(&cfg, checkpoint("vae")?).map_err(model_err)?);
        drop(
            crate::models::vae_encoder::VaeEncoder::new(&cfg, checkpoint("vae")?)
                .map_err(model_err)?,
        );
    }
    Ok(())
}

/// A whole pipeline, opened and built as `generate` opens and builds it.
fn check_pipeline(preview: Preview) -> Result<(), DoesNotFit> {
    let tensors = preview.tensors.clone();
    let failed = |e: crate::pipeline::Error| explain(&tensors, e);
    let family = Family::of(&preview).map_err(failed)?;
    family.check_model(&preview).map_err(failed)
}

fn parse<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    validate: impl Fn(&T) -> Result<(), String>,
) -> Result<T, String> {
    let config: T = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    validate(&config)?;
    Ok(config)
}

/// A pipeline's refusal as one line: the first problem, the file of the tensor it names, and
/// how many more there are.
fn explain(tensors: &[SourceTensor], e: crate::pipeline::Error) -> DoesNotFit {
    let load = match &e {
        crate::pipeline::Error::Model(crate::models::ModelError::Load(l)) => Some(l),
        _ => None,
    };
    let Some(load) = load else {
        return DoesNotFit {
            file: None,
            reason: e.to_string().replace('\n', " "),
            more: 0,
        };
    };
    let first = load.problems.first().map(|p| p.trim()).unwrap_or_default();
    // Problems quote the tensor first: `name`.
    let named = first.split('`').nth(1).unwrap_or_default();
    let file = tensors
        .iter()
        .find(|t| t.component == load.component && t.name == named)
        .or_else(|| tensors.iter().find(|t| t.component == load.component))
        .map(|t| t.file.clone());
    DoesNotFit {
        file,
        reason: format!("{}: {}", load.component, crate::shown::text(first)),
        more: load.problems.len().saturating_sub(1),
    }
}
