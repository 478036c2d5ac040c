//! What a command-line target names: a file on disk, or a model in the store (optionally one
//! of its components, `NAME --component transformer`).

use std::path::{Path, PathBuf};
use zimage::formats::{self, FileKind, Listing};
use zimage::store::{Store, StoredModel};

pub enum Target {
    File {
        path: PathBuf,
        kind: FileKind,
    },
    // Boxed: a model with its manifest is much larger than a path.
    Model {
        store: Store,
        model: Box<StoredModel>,
    },
}

/// A path that exists is a file; anything else is looked up as a model name.
pub fn resolve(store: Option<&Path>, target: &str) -> anyhow::Result<Target> {
    let path = Path::new(target);
    if path.exists() {
        if path.is_dir() {
            anyhow::bail!("`{target}` is a directory; give a model file, or import the directory with `zimage create NAME --from {target}`");
        }
        let kind = FileKind::of_file(path).map_err(|e| anyhow::anyhow!("`{target}`: {e}"))?;
        return Ok(Target::File {
            path: path.to_path_buf(),
            kind,
        });
    }
    let looks_like_path = target.starts_with(['/', '.', '~'])
        || path.extension().is_some_and(|e| {
            ["safetensors", "zt", "dfsn", "gguf", "png", "ckpt"]
                .contains(&e.to_string_lossy().as_ref())
        });
    if looks_like_path {
        anyhow::bail!("`{target}`: no such file");
    }
    let store = Store::locate(store)?;
    match store.open(target) {
        Ok(model) => Ok(Target::Model {
            store,
            model: Box::new(model),
        }),
        Err(e) => anyhow::bail!("`{target}` is neither a file nor a stored model: {e}"),
    }
}

impl Target {
    /// The structural view; `component` picks one component of a stored model.
    pub fn listing(&self, component: Option<&str>) -> anyhow::Result<Listing> {
        match self {
            Target::File { path, .. } => {
                if component.is_some() {
                    anyhow::bail!(
                        "`--component` applies to stored models, and `{}` is a file",
                        path.display()
                    );
                }
                Ok(formats::listing_of_file(path)?)
            }
            Target::Model { store, model } => {
                Ok(formats::listing_of_model(store, model, component)?)
            }
        }
    }
}
