//! Which model a job runs and how it is opened: a stored model or a diffusers directory, both
//! behind one [`ModelSource`]; the engine asks the registry which family it is.

use super::error::Error;
use crate::diffusers_dir::DiffusersDir;
use crate::loader::{ReadPath, StoreSource};
use crate::memory_plan::TensorSize;
use crate::pipeline::{ComponentWeights, ModelSource, SourceError};
use crate::store::{Store, StoredModel};
use std::path::PathBuf;

/// The model a job names.
#[derive(Debug, Clone)]
pub enum ModelChoice {
    /// A model in `store`, by name.
    Stored {
        /// The store holding it.
        store: Store,
        /// Its name there.
        name: String,
    },
    /// A diffusers directory, read in place.
    Directory(PathBuf),
}

/// What tells one loaded model from another: a model re-created under the same name is
/// another model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelKey {
    /// A stored model: its store, its name and the manifest it was loaded from.
    Stored {
        /// The store's root.
        root: PathBuf,
        /// The model's full name.
        name: String,
        /// The digest of its manifest file.
        manifest_digest: String,
    },
    /// A diffusers directory, by its path.
    Directory(PathBuf),
}

/// A job's model, opened.
pub enum Source {
    Stored(Box<StoreSource>),
    Directory(DiffusersDir),
}

impl Source {
    /// Opens `choice`.
    pub fn open(choice: &ModelChoice) -> Result<Source, Error> {
        match choice {
            ModelChoice::Stored { store, name } => {
                let model = store.open(name).map_err(open_error)?;
                Ok(Source::Stored(Box::new(StoreSource {
                    store: store.clone(),
                    model,
                    read_path: ReadPath::MlxLoader,
                })))
            }
            ModelChoice::Directory(dir) => Ok(Source::Directory(DiffusersDir::open(dir)?)),
        }
    }

    pub fn key(&self) -> ModelKey {
        match self {
            Source::Stored(s) => ModelKey::Stored {
                root: s.store.root.clone(),
                name: s.model.name.to_string(),
                manifest_digest: s.model.manifest_digest.clone(),
            },
            Source::Directory(d) => ModelKey::Directory(d.root.clone()),
        }
    }

    /// The stored model, when it is one.
    pub fn stored(&self) -> Option<&StoredModel> {
        match self {
            Source::Stored(s) => Some(&s.model),
            Source::Directory(_) => None,
        }
    }
}

impl ModelChoice {
    /// The key the model would have once opened, read without loading anything; `None` when
    /// it cannot be read (opening it then says why).
    pub fn key(&self) -> Option<ModelKey> {
        match self {
            ModelChoice::Stored { store, name } => {
                let model = store.open(name).ok()?;
                Some(ModelKey::Stored {
                    root: store.root.clone(),
                    name: model.name.to_string(),
                    manifest_digest: model.manifest_digest,
                })
            }
            ModelChoice::Directory(dir) => Some(ModelKey::Directory(dir.clone())),
        }
    }
}

/// A store lookup's failure, with what to do about a missing model.
pub fn open_error(e: crate::store::StoreError) -> Error {
    match e {
        crate::store::StoreError::NotFound(_) => {
            Error::NotFound(format!("{e}; import it with `zimage create`"))
        }
        other => Error::Store(other),
    }
}

/// Each call goes to the source it is.
macro_rules! either {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            Source::Stored($s) => $e,
            Source::Directory($s) => $e,
        }
    };
}

impl ModelSource for Source {
    fn name(&self) -> String {
        either!(self, s => s.name())
    }
    fn identity(&self) -> String {
        either!(self, s => s.identity())
    }
    fn config_file(&self, path: &str) -> Result<Option<Vec<u8>>, SourceError> {
        either!(self, s => s.config_file(path))
    }
    fn component(&self, component: &str) -> Result<ComponentWeights, SourceError> {
        either!(self, s => s.component(component))
    }
    fn maps_weights(&self) -> bool {
        either!(self, s => s.maps_weights())
    }
    fn mapped_component(&self, component: &str) -> Result<ComponentWeights, SourceError> {
        either!(self, s => s.mapped_component(component))
    }
    fn tensor_sizes(&self, component: &str) -> Result<Vec<TensorSize>, SourceError> {
        either!(self, s => s.tensor_sizes(component))
    }
    fn loras(&self) -> Result<Vec<crate::lora::Input>, crate::lora::Error> {
        either!(self, s => s.loras())
    }
    fn component_digest(&self, component: &str) -> Option<String> {
        either!(self, s => s.component_digest(component))
    }
}
