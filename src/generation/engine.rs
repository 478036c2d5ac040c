//! The engine: the model a front end keeps loaded between jobs (the command line's `--runs`
//! and batches, the server's keep-alive), loaded by its family as the registry reads it.

use crate::families::Family;
use crate::jobs::error::Error;
use crate::jobs::loaded::LoadedModel;
use crate::jobs::source::{ModelChoice, ModelKey, Source};
use crate::mlx::Dtype;
use crate::pipeline::ModelSource;
use crate::store::{Store, StoredModel};
use std::path::Path;

/// Keeps one model loaded between jobs.
pub struct Engine {
    dtype: Dtype,
    /// Keep the transformer and VAE between images (more memory, no reload).
    keep_models: bool,
    loaded: Option<(Family, ModelKey, Box<dyn LoadedModel>)>,
}

impl Engine {
    /// An engine computing in `dtype` (`None`: bf16 on a GPU, f32 on the CPU).
    pub fn new(dtype: Option<Dtype>, keep_models: bool) -> Engine {
        Engine {
            dtype: dtype.unwrap_or_else(crate::platform::default_compute_dtype),
            keep_models,
            loaded: None,
        }
    }

    /// The dtype the engine computes in.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The stored model loaded, if any.
    pub fn stored_model(&self) -> Option<&StoredModel> {
        self.loaded
            .as_ref()
            .and_then(|(_, _, l)| l.source().stored())
    }

    /// Whether the model `key` names is the one loaded.
    pub fn holds(&self, key: &ModelKey) -> bool {
        self.loaded.as_ref().is_some_and(|(_, k, _)| k == key)
    }

    /// Lets go of the loaded model and returns its memory to the system.
    pub fn unload(&mut self) {
        if self.loaded.take().is_some() {
            crate::mlx::memory::clear_cache();
            crate::platform::trim_freed_memory();
        }
    }

    /// Makes `model` the loaded one, loading it if another (or none) is loaded; reports
    /// whether it loaded anything.
    pub fn load(&mut self, model: &ModelChoice) -> Result<bool, Error> {
        if model.key().is_some_and(|k| self.holds(&k)) {
            return Ok(false);
        }
        self.unload();
        let source = Source::open(model)?;
        let key = source.key();
        let family = match (model, &source) {
            (ModelChoice::Stored { store, .. }, Source::Stored(s)) => {
                image_model_family(store, &s.model)?
            }
            (ModelChoice::Directory(dir), source) => directory_family(source, dir)?,
            _ => unreachable!("a source is opened as its choice names it"),
        };
        self.loaded = Some((
            family,
            key,
            family.load(source, self.dtype, self.keep_models)?,
        ));
        Ok(true)
    }

    /// The loaded model and its family; [`Engine::load`] first.
    pub(super) fn loaded(&mut self) -> (Family, &mut dyn LoadedModel) {
        let (family, _, model) = self
            .loaded
            .as_mut()
            .expect("a model is loaded before it is used");
        (*family, model.as_mut())
    }
}

/// Whether a stored model is one zimage generates with: a pipeline of a family it runs (see
/// [`crate::families`]). Text models (and other image pipelines) in the same store are refused
/// by name.
pub fn check_image_model(store: &Store, model: &StoredModel) -> Result<(), Error> {
    image_model_family(store, model).map(|_| ())
}

fn image_model_family(store: &Store, model: &StoredModel) -> Result<Family, Error> {
    let name = model.name.short();
    let Some(index) = store.config_file(model, "model_index.json")? else {
        return Err(Error::Request(format!(
            "model `{name}` is not an image model (it has no model_index.json); zimage runs {} models only, so run text models with Ollama",
            crate::families::names()
        )));
    };
    Family::from_model_index(&index).map_err(|e| Error::Request(format!("model `{name}`: {e}")))
}

fn directory_family(source: &Source, dir: &Path) -> Result<Family, Error> {
    let path = dir.join("model_index.json");
    let index = source
        .config_file("model_index.json")
        .map_err(|e| Error::Request(format!("`{}`: {e}", path.display())))?
        .unwrap_or_default();
    Family::from_model_index(&index)
        .map_err(|e| Error::Request(format!("`{}`: {e}", dir.display())))
}
