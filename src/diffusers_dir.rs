//! A Hugging Face diffusers model directory: which files hold which component's tensors and
//! configuration.
//!
//! ```text
//! model_index.json  scheduler/scheduler_config.json  tokenizer/…
//! text_encoder/{config.json, model-0000N-of-0000M.safetensors, model.safetensors.index.json}
//! transformer/{config.json, diffusion_pytorch_model*.safetensors}   vae/{…}
//! ```
//! Shards are checked against `*.safetensors.index.json` when one is present: every tensor
//! the index names must be in the shard it names, and no shard may hold a tensor twice.

use crate::safetensors;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Components whose weights a pipeline stores, in the order Ollama writes them.
pub(crate) const WEIGHT_COMPONENTS: [&str; 4] =
    ["text_encoder", "text_encoder_2", "transformer", "vae"];

/// Components only some pipelines have (a second text encoder).
pub(crate) const OPTIONAL_COMPONENTS: [&str; 1] = ["text_encoder_2"];

/// zimage's record of the settings a model is meant to run with (see
/// `generation_defaults`), at the model's root.
pub(crate) const DEFAULTS_FILE: &str = "generation_defaults.json";

/// Files other than weights that a pipeline needs, relative to the model directory.
pub(crate) const CONFIG_FILES: [&str; 17] = [
    "model_index.json",
    DEFAULTS_FILE,
    "scheduler/scheduler_config.json",
    "text_encoder/config.json",
    "transformer/config.json",
    "vae/config.json",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
    "tokenizer/vocab.json",
    "tokenizer/merges.txt",
    "tokenizer/special_tokens_map.json",
    "tokenizer/chat_template.json",
    "tokenizer/chat_template.jinja",
    "text_encoder_2/config.json",
    "tokenizer_2/tokenizer.json",
    "tokenizer_2/tokenizer_config.json",
    "tokenizer_2/special_tokens_map.json",
];

/// The most bytes a model's JSON config (`model_index.json`, `*/config.json`, a shard index)
/// may hold: real ones are a few kilobytes, a shard index about 100 KB.
pub(crate) const CONFIG_LIMIT: u64 = 16 << 20;

/// The most bytes the config or tokenizer file at `path` (diffusers layout) may hold, and
/// what to call it in errors.
pub(crate) fn config_limit(path: &str) -> (u64, &'static str) {
    let tokenizer = (path.strip_prefix("tokenizer/")).or_else(|| path.strip_prefix("tokenizer_2/"));
    match tokenizer {
        Some(name) => crate::text::file_limit(name),
        None => (CONFIG_LIMIT, "config file"),
    }
}

/// Why a directory cannot be read as a diffusers model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The directory lacks what every diffusers model has (`model_index.json`, weights).
    #[error("`{}` is not a diffusers model directory: {reason}", dir.display())]
    NotAModel {
        /// The directory given.
        dir: PathBuf,
        /// What is missing or wrong.
        reason: String,
    },
    /// A shard index (`*.safetensors.index.json`) that does not match its shards.
    #[error("`{}`: {reason}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// How it disagrees with the shards.
        reason: String,
    },
    /// A safetensors file whose header cannot be read.
    #[error(transparent)]
    Header(#[from] safetensors::Error),
    /// A file or folder that cannot be read.
    #[error("`{}`: {cause}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The system's error.
        cause: std::io::Error,
    },
    /// A file that is too large, or not a regular file, or cannot be read.
    #[error(transparent)]
    File(#[from] crate::files::FileError),
}

/// One tensor of a component: where its bytes are.
#[derive(Debug, Clone)]
pub struct TensorLocation {
    /// The component folder it is in (`transformer`).
    pub component: String,
    /// Its name in the file (`layers.0.attention.qkv.weight`).
    pub name: String,
    /// The safetensors file that holds it.
    pub file: PathBuf,
    /// Its dtype, shape and byte range in the file's data section.
    pub info: safetensors::TensorInfo,
    /// File offset of the tensor's first byte.
    pub offset: u64,
}

/// A scanned diffusers directory.
#[derive(Debug, Clone)]
pub struct DiffusersDir {
    /// The directory, as given.
    pub root: PathBuf,
    /// Per component, its tensors sorted by (file, name).
    pub tensors: BTreeMap<String, Vec<TensorLocation>>,
    /// Config files present, relative path → absolute path.
    pub configs: Vec<(String, PathBuf)>,
    /// A modular pipeline's `modular_model_index.json` read as the `model_index.json` the
    /// directory lacks (see [`classic_index`]); `None` when it has its own.
    pub index: Option<Vec<u8>>,
}

/// The file a modular pipeline (diffusers' `ModularPipeline`) keeps its index in.
pub const MODULAR_INDEX: &str = "modular_model_index.json";

/// A `modular_model_index.json` as the classic `model_index.json`: the pipeline's
/// `_class_name`, `_diffusers_version` and `_blocks_class_name`, and each component as
/// `[library, class]`. Refused, naming the component, when a component lives anywhere but its
/// own folder of this directory (another repository or subfolder), which the classic layout
/// cannot say.
pub fn classic_index(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let index: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("`{MODULAR_INDEX}` is not JSON: {e}"))?;
    let entries = index
        .as_object()
        .ok_or_else(|| format!("`{MODULAR_INDEX}` is not a JSON object"))?;
    let mut out = serde_json::Map::new();
    for (key, value) in entries {
        if key.starts_with('_') {
            out.insert(key.clone(), value.clone());
            continue;
        }
        let spec = value.as_array().filter(|a| a.len() >= 2);
        let Some(spec) = spec else {
            return Err(format!(
                "`{MODULAR_INDEX}` `{key}` is not `[library, class, {{…}}]`"
            ));
        };
        if let Some(place) = spec.get(2).and_then(|p| p.as_object()) {
            let repo = ["pretrained_model_name_or_path", "repo"]
                .iter()
                .find_map(|k| place.get(*k).filter(|v| !v.is_null()));
            if let Some(repo) = repo {
                return Err(format!(
                    "`{MODULAR_INDEX}` `{key}` is loaded from {repo}; zimage reads components from the model's own folders only"
                ));
            }
            let subfolder = place.get("subfolder").and_then(|v| v.as_str());
            if subfolder.is_some_and(|s| s != key) {
                return Err(format!(
                    "`{MODULAR_INDEX}` `{key}` is in subfolder `{}`; zimage reads each component from its own folder",
                    subfolder.unwrap_or_default()
                ));
            }
        }
        out.insert(key.clone(), serde_json::Value::Array(spec[..2].to_vec()));
    }
    Ok(serde_json::to_vec_pretty(&serde_json::Value::Object(out)).expect("JSON values serialize"))
}

impl DiffusersDir {
    /// Scans a model directory: its config files and every tensor's place, checking shards
    /// against their indexes. Reads headers, never tensor data.
    pub fn open(root: &Path) -> Result<DiffusersDir, Error> {
        let not_a_model = |reason: String| Error::NotAModel {
            dir: root.to_path_buf(),
            reason,
        };
        let index = root.join("model_index.json");
        let modular = root.join(MODULAR_INDEX);
        let classic = match (index.exists(), modular.exists()) {
            (true, _) => None,
            (false, true) => {
                check_confined(root, &modular)?;
                let bytes = crate::files::read_bounded(&modular, CONFIG_LIMIT, "config file")?;
                Some(classic_index(&bytes).map_err(not_a_model)?)
            }
            (false, false) => return Err(not_a_model("no `model_index.json`".into())),
        };
        // A FIFO or a device in a model's place is named, not read or taken as absent.
        if classic.is_none() {
            crate::files::open_regular(&index)?;
        }
        let mut tensors = BTreeMap::new();
        for component in WEIGHT_COMPONENTS {
            let dir = root.join(component);
            if !dir.is_dir() && OPTIONAL_COMPONENTS.contains(&component) {
                continue;
            }
            if !dir.is_dir() {
                return Err(not_a_model(format!("no `{component}/` directory")));
            }
            tensors.insert(component.to_string(), scan_component(component, &dir)?);
        }
        // Whatever sits at a config's path is taken (a FIFO or a device is refused when read),
        // and must not lead outside the model.
        let configs: Vec<(String, PathBuf)> = CONFIG_FILES
            .iter()
            .map(|rel| (rel.to_string(), root.join(rel)))
            .filter(|(_, p)| p.symlink_metadata().is_ok())
            .collect();
        for (_, path) in &configs {
            check_confined(root, path)?;
        }
        Ok(DiffusersDir {
            root: root.to_path_buf(),
            tensors,
            configs,
            index: classic,
        })
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        cause: source,
    }
}

/// Where the files of a model directory may lead: the directory itself or, for a snapshot of
/// Hugging Face's cache (`models--org--name/snapshots/<rev>/`, whose files are symlinks into
/// `models--org--name/blobs/`), the cached repository.
fn confinement(root: &Path) -> PathBuf {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    match root.parent() {
        Some(snapshots) if snapshots.file_name().is_some_and(|n| n == "snapshots") => {
            snapshots.parent().unwrap_or(snapshots).to_path_buf()
        }
        _ => root,
    }
}

/// A config or tokenizer file of an imported model must not be a symlink that leads outside
/// it: a downloaded directory could otherwise carry `tokenizer/vocab.json -> ~/.ssh/id_ed25519`
/// into the store verbatim, and from there to a registry. (Weight files may live anywhere, as
/// people link them from a shared disk: they are stored only if they parse as safetensors.)
fn check_confined(root: &Path, path: &Path) -> Result<(), Error> {
    let Ok(target) = std::fs::canonicalize(path) else {
        return Ok(()); // a dangling link fails with a clear error when it is read
    };
    let allowed = confinement(root);
    if target.starts_with(&allowed) {
        return Ok(());
    }
    Err(Error::NotAModel {
        dir: root.to_path_buf(),
        reason: format!(
            "`{}` leads to `{}`, outside the model; copy the file in if it belongs to it",
            path.display(),
            target.display()
        ),
    })
}

/// The `.safetensors` files of one component, in lexical order, with their headers.
fn scan_component(component: &str, dir: &Path) -> Result<Vec<TensorLocation>, Error> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::NotAModel {
            dir: dir.to_path_buf(),
            reason: format!("no `.safetensors` files in `{component}/`"),
        });
    }
    let mut out = Vec::new();
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    for file in &files {
        crate::files::open_regular(file)?;
        let header = safetensors::read_header_file(file)?;
        let mut names: Vec<&safetensors::TensorInfo> = header.tensors.iter().collect();
        names.sort_by(|a, b| a.name.cmp(&b.name));
        for info in names {
            if let Some(prev) = seen.insert(info.name.clone(), file.clone()) {
                return Err(Error::Index {
                    path: file.clone(),
                    reason: format!("tensor `{}` is also in `{}`", info.name, prev.display()),
                });
            }
            out.push(TensorLocation {
                component: component.to_string(),
                name: info.name.clone(),
                file: file.clone(),
                offset: header.data_start() + info.data_offsets.0,
                info: info.clone(),
            });
        }
    }
    check_index(dir, &seen)?;
    Ok(out)
}

/// Checks `*.safetensors.index.json` (if any) against where the tensors really are.
fn check_index(dir: &Path, found: &HashMap<String, PathBuf>) -> Result<(), Error> {
    let Some(index) = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".safetensors.index.json"))
    else {
        return Ok(());
    };
    let bad = |reason: String| Error::Index {
        path: index.clone(),
        reason,
    };
    let text = crate::files::read_text_bounded(&index, CONFIG_LIMIT, "shard index")?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    for (name, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(format!("`weight_map.{name}` is not a file name")))?;
        match found.get(name) {
            None => {
                return Err(bad(format!(
                    "names tensor `{name}` in `{shard}`, which no shard holds"
                )))
            }
            Some(actual) if actual.file_name().is_some_and(|f| f != shard) => {
                return Err(bad(format!(
                    "puts `{name}` in `{shard}`, but it is in `{}`",
                    actual.display()
                )))
            }
            _ => {}
        }
    }
    if let Some(extra) = found.keys().find(|k| !map.contains_key(*k)) {
        return Err(bad(format!("does not list tensor `{extra}`")));
    }
    Ok(())
}
