//! Where a pipeline's files and weights come from: a diffusers directory, or a stored model.

use super::{ComponentWeights, ModelSource, SourceError};
use crate::diffusers_dir::DiffusersDir;
use crate::loader::{self, StoreSource};
use crate::memory_plan::TensorSize;
use std::collections::HashMap;

/// Runs a pipeline straight from a diffusers directory (no store): what tests and
/// benchmarks compare against the reference with.
impl ModelSource for DiffusersDir {
    fn name(&self) -> String {
        self.root.display().to_string()
    }

    fn identity(&self) -> String {
        String::new()
    }

    fn config_file(&self, path: &str) -> Result<Option<Vec<u8>>, SourceError> {
        if let (Some(index), "model_index.json") = (&self.index, path) {
            return Ok(Some(index.clone()));
        }
        let p = self.root.join(path);
        if !p.exists() {
            return Ok(None);
        }
        let (limit, what) = crate::diffusers_dir::config_limit(path);
        Ok(Some(crate::files::read_bounded(&p, limit, what)?))
    }

    fn tensor_sizes(&self, component: &str) -> Result<Vec<TensorSize>, SourceError> {
        Ok(self
            .tensors
            .get(component)
            .map(|ts| {
                ts.iter()
                    .map(|t| TensorSize {
                        name: t.name.clone(),
                        shape: t.info.shape.clone(),
                        stored_bytes: t.info.nbytes(),
                        packed: false,
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    fn component(&self, component: &str) -> Result<ComponentWeights, SourceError> {
        let locations = self
            .tensors
            .get(component)
            .ok_or_else(|| format!("no component `{component}`"))?;
        let mut files: Vec<&std::path::PathBuf> = locations.iter().map(|t| &t.file).collect();
        files.dedup();
        let mut out = HashMap::new();
        for file in files {
            out.extend(crate::mlx::io::load_safetensors(file)?.tensors);
        }
        Ok(ComponentWeights {
            tensors: out,
            quantized: HashMap::new(),
            release: None,
        })
    }
}

/// A stored model as a pipeline source.
impl ModelSource for StoreSource {
    fn name(&self) -> String {
        self.model.name.short()
    }

    fn identity(&self) -> String {
        self.model.manifest.model_identity()
    }

    fn config_file(&self, path: &str) -> Result<Option<Vec<u8>>, SourceError> {
        Ok(self.store.config_file(&self.model, path)?)
    }

    fn tensor_sizes(&self, component: &str) -> Result<Vec<TensorSize>, SourceError> {
        Ok(loader::tensor_sizes(&self.model, component))
    }

    fn component(&self, component: &str) -> Result<ComponentWeights, SourceError> {
        let loaded =
            loader::materialise_component(&self.store, &self.model, component, self.read_path)?;
        Ok(loaded.into_weights())
    }

    fn maps_weights(&self) -> bool {
        true
    }

    fn mapped_component(&self, component: &str) -> Result<ComponentWeights, SourceError> {
        // Mapped arrays cost nothing until read: left lazy, they are paged in as blocks run.
        let loaded =
            loader::load_component(&self.store, &self.model, component, loader::ReadPath::Mmap)?;
        Ok(loaded.into_weights())
    }

    fn loras(&self) -> Result<Vec<crate::lora::Input>, crate::lora::Error> {
        crate::lora::stored::read(&self.store, &self.model)
    }

    fn component_digest(&self, component: &str) -> Option<String> {
        Some(self.model.manifest.component_identity(component))
    }
}
