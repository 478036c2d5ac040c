//! Component checkpoint files (one safetensors file, several shards, or a shard index) opened
//! as tensors, and a model composed from them: the source `zimage create --transformer FILE
//! --text-encoder FILE --vae FILE` imports.

use super::{resolve, Component, Layout, LayoutError, Mapped, CONFIG_METADATA_KEY};
use crate::diffusers_dir::{self, DiffusersDir};
use crate::families::Family;
use crate::formats::FileKind;
use crate::store::{SafetensorsFile, SourceTensor, StoreError, TensorSource};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Files(#[from] crate::files::FileError),
    #[error(transparent)]
    Dir(#[from] diffusers_dir::Error),
    #[error("`{}`: {reason}", path.display())]
    Bad { path: PathBuf, reason: String },
    #[error("{0}")]
    Compose(String),
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Bad {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The config a file's metadata carries under [`CONFIG_METADATA_KEY`].
fn config_from_metadata(f: &Path, text: &str) -> Result<serde_json::Value, Error> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        bad(
            f,
            format!("metadata `{CONFIG_METADATA_KEY}` is not JSON: {e}"),
        )
    })?;
    if !v.is_object() {
        return Err(bad(
            f,
            format!("metadata `{CONFIG_METADATA_KEY}` is not a JSON object"),
        ));
    }
    Ok(v)
}

/// The tensors of one component's checkpoint, with the config its metadata carries (if any).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The files read, for messages.
    pub files: Vec<PathBuf>,
    pub tensors: Vec<SourceTensor>,
    pub config_hint: Option<serde_json::Value>,
}

impl Checkpoint {
    /// Opens a checkpoint given as safetensors or GGUF files (shards of one component) or as a
    /// `*.safetensors.index.json` whose shards sit beside it.
    pub fn open(paths: &[PathBuf]) -> Result<Checkpoint, Error> {
        let mut files = Vec::new();
        for p in paths {
            if p.to_string_lossy().ends_with(".index.json") {
                files.extend(index_shards(p)?);
            } else {
                files.push(p.clone());
            }
        }
        let mut tensors = Vec::new();
        let mut config_hint = None;
        let mut seen: HashMap<String, PathBuf> = HashMap::new();
        for f in &files {
            let (_, len) = crate::files::open_regular(f)?;
            let mut add = |tensors: &mut Vec<SourceTensor>, t: SourceTensor| {
                if let Some(prev) = seen.insert(t.name.clone(), f.clone()) {
                    return Err(bad(
                        f,
                        format!("tensor `{}` is also in `{}`", t.name, prev.display()),
                    ));
                }
                tensors.push(t);
                Ok(())
            };
            match FileKind::of_file(f).map_err(|e| bad(f, e.to_string()))? {
                FileKind::Safetensors => {}
                // Quantized GGUF tensors keep their blocks; the import maps them per type.
                FileKind::Gguf => {
                    let gguf = crate::formats::gguf::GgufSource::open(f, "model")
                        .map_err(|e| bad(f, e.to_string()))?;
                    if let Some(text) = gguf.metadata_string(CONFIG_METADATA_KEY) {
                        config_hint = Some(config_from_metadata(f, text)?);
                    }
                    for t in gguf.tensors() {
                        add(&mut tensors, t)?;
                    }
                    continue;
                }
                other => {
                    return Err(bad(
                        f,
                        format!(
                            "is {}; a component file must be safetensors or GGUF",
                            other.describe()
                        ),
                    ))
                }
            }
            let st = SafetensorsFile::open(f, 0, len, "model")?;
            let names = st.header.tensors.iter().map(|t| t.name.as_str());
            if let Some(scale) = crate::fp8::unread_scale(names) {
                return Err(bad(
                    f,
                    format!("tensor `{scale}` {}", crate::fp8::SCALE_REFUSAL),
                ));
            }
            if let Some(text) = st
                .header
                .metadata
                .as_ref()
                .and_then(|m| m.get(CONFIG_METADATA_KEY))
            {
                config_hint = Some(config_from_metadata(f, text)?);
            }
            for t in st.tensors() {
                add(&mut tensors, t)?;
            }
        }
        Ok(Checkpoint {
            files,
            tensors,
            config_hint,
        })
    }

    /// What to call the checkpoint in messages.
    pub fn describe(&self) -> String {
        match self.files.as_slice() {
            [one] => format!("`{}`", one.display()),
            many => format!(
                "`{}` (+{} shards)",
                many.first()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                many.len().saturating_sub(1)
            ),
        }
    }

    /// The checkpoint's tensors as `component` under diffusers names.
    pub fn map(self, component: Component) -> Result<Mapped, LayoutError> {
        let what = self.describe();
        resolve::to_diffusers(component, self.tensors, &what, self.config_hint.as_ref())
    }
}

/// The shard files a `*.safetensors.index.json` names, in order, each once.
fn index_shards(index: &Path) -> Result<Vec<PathBuf>, Error> {
    let text = crate::files::read_text_bounded(index, diffusers_dir::CONFIG_LIMIT, "shard index")?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(index, format!("invalid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad(index, "no `weight_map` object"))?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut shards: Vec<String> = Vec::new();
    for (name, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(index, format!("`weight_map.{name}` is not a file name")))?;
        // A shard is a file beside the index, never a path elsewhere.
        if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
            return Err(bad(
                index,
                format!("`weight_map.{name}` names `{shard}`, not a file beside the index"),
            ));
        }
        if !shards.iter().any(|s| s == shard) {
            shards.push(shard.to_string());
        }
    }
    if shards.is_empty() {
        return Err(bad(index, "`weight_map` is empty"));
    }
    shards.sort();
    Ok(shards.into_iter().map(|s| dir.join(s)).collect())
}

/// Tokenizer files from a folder (those of them a diffusers `tokenizer/`, or with `folder`
/// `tokenizer_2` a `tokenizer_2/`, holds) or one file named as such a file, as
/// `(FOLDER/NAME, bytes)`.
pub fn read_tokenizer(path: &Path, folder: &str) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let prefix = format!("{folder}/");
    let names: Vec<&str> = diffusers_dir::CONFIG_FILES
        .iter()
        .filter_map(|f| f.strip_prefix(prefix.as_str()))
        .collect();
    let read = |name: &str, file: &Path| -> Result<(String, Vec<u8>), Error> {
        let rel = format!("{prefix}{name}");
        let (limit, what) = diffusers_dir::config_limit(&rel);
        let bytes = crate::files::read_bounded(file, limit, what)?;
        if name.ends_with(".json") {
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .map_err(|e| bad(file, format!("is not JSON: {e}")))?;
        }
        Ok((rel, bytes))
    };
    if path.is_dir() {
        let found: Vec<_> = names
            .iter()
            .filter(|n| path.join(n).is_file())
            .map(|n| read(n, &path.join(n)))
            .collect::<Result<_, _>>()?;
        if found.is_empty() {
            return Err(bad(
                path,
                format!("holds none of the tokenizer files ({})", names.join(", ")),
            ));
        }
        return Ok(found);
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    if !names.contains(&name.as_str()) {
        return Err(bad(
            path,
            format!(
                "is no tokenizer file: the tokenizer is a folder, or one of {}",
                names.join(", ")
            ),
        ));
    }
    Ok(vec![read(&name, path)?])
}

/// What one component of a composed model came from, for `create`'s report.
#[derive(Debug, Clone)]
pub struct ComponentOrigin {
    pub component: Component,
    pub source: String,
    pub layout: Layout,
    pub tensors: usize,
    pub dropped: Vec<String>,
}

/// A model assembled from component checkpoints over a base (a diffusers directory, or when
/// there is none the files of the transformer's family and, where the family reads it, Qwen's
/// tokenizer).
#[derive(Debug, Clone)]
pub struct ComposedModel {
    pub tensors: Vec<SourceTensor>,
    pub configs: Vec<(String, Vec<u8>)>,
    pub origins: Vec<ComponentOrigin>,
}

/// The files a model needs besides its weights that the demo model's are used for when no base
/// directory gives them: `model_index.json`, the scheduler config and the tokenizer.
pub fn turbo_defaults(embedded: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
    embedded
        .iter()
        .filter(|(p, _)| {
            *p == "model_index.json" || p.starts_with("scheduler/") || p.starts_with("tokenizer/")
        })
        .map(|(p, b)| (p.to_string(), b.to_vec()))
        .collect()
}

impl ComposedModel {
    /// `base`: the directory whose components the given ones replace; without one every
    /// weight component the model's family lists must be given and `defaults` (with the
    /// family's own files) supply the other files. `tokenizers` are the given tokenizers'
    /// files, each under its folder (`tokenizer/`, `tokenizer_2/`).
    pub fn compose(
        base: Option<&DiffusersDir>,
        defaults: Vec<(String, Vec<u8>)>,
        components: Vec<(Mapped, String)>,
        tokenizers: Vec<Vec<(String, Vec<u8>)>>,
    ) -> Result<ComposedModel, Error> {
        let (mut tensors, mut configs) = match base {
            Some(dir) => (dir.tensors(), dir.config_files()?),
            None => (
                Vec::new(),
                without_base(defaults, &components, &tokenizers)?,
            ),
        };
        let mut origins = Vec::new();
        let mut sources = BTreeMap::new();
        for (mapped, source) in components {
            let dir = mapped.component.dir();
            let path = format!("{dir}/config.json");
            // The directory's own config of the component, which says what shapes cannot.
            let given = match base {
                Some(b) => configs
                    .iter()
                    .find(|(p, _)| *p == path)
                    .map(|(_, bytes)| {
                        serde_json::from_slice::<serde_json::Value>(bytes)
                            .map_err(|e| bad(&b.root.join(&path), format!("is not JSON: {e}")))
                    })
                    .transpose()?
                    .map(|v| (v, format!("`{}`", b.root.join(&path).display()))),
                None => None,
            };
            let resolved = resolve::resolve(
                &mapped,
                &source,
                given.as_ref().map(|(v, name)| (v, name.as_str())),
            )?;
            tensors.retain(|t| t.component != dir);
            configs.retain(|(p, _)| *p != path);
            let config =
                serde_json::to_vec_pretty(&resolved.config).expect("JSON values serialize");
            configs.push((path.clone(), config));
            sources.insert(path, resolved.origins);
            origins.push(ComponentOrigin {
                component: mapped.component,
                source,
                layout: mapped.layout,
                tensors: mapped.tensors.len(),
                dropped: mapped.dropped,
            });
            tensors.extend(mapped.tensors);
        }
        for files in tokenizers {
            let folders: Vec<String> = (files.iter())
                .filter_map(|(p, _)| Some(format!("{}/", p.split_once('/')?.0)))
                .collect();
            configs.retain(|(p, _)| !folders.iter().any(|f| p.starts_with(f.as_str())));
            configs.extend(files);
        }
        // Refused now, before anything is stored, rather than by the first `generate`.
        resolve::check_model_configs(&configs)
            .map_err(|e| Error::Compose(format!("the composed model would not run: {e}")))?;
        configs.retain(|(p, _)| p != resolve::SOURCES_FILE);
        let sources = serde_json::to_vec_pretty(&sources).expect("JSON values serialize");
        configs.push((resolve::SOURCES_FILE.to_string(), sources));
        configs.sort_by(|a, b| a.0.cmp(&b.0));
        let order: BTreeMap<&str, usize> = diffusers_dir::WEIGHT_COMPONENTS
            .iter()
            .enumerate()
            .map(|(i, c)| (*c, i))
            .collect();
        tensors.sort_by(|a, b| {
            (order.get(a.component.as_str()), &a.name)
                .cmp(&(order.get(b.component.as_str()), &b.name))
        });
        Ok(ComposedModel {
            tensors,
            configs,
            origins,
        })
    }
}

/// The files besides weights of a model composed without a base directory: the family's own
/// (its `model_index.json`, its scheduler) over `defaults`, the carried tokenizer kept where the
/// family reads it. Refused when a weight component or a tokenizer the model's index lists is
/// not given, naming the option that gives it.
fn without_base(
    defaults: Vec<(String, Vec<u8>)>,
    components: &[(Mapped, String)],
    tokenizers: &[Vec<(String, Vec<u8>)>],
) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let transformer = (components.iter()).find(|(m, _)| m.component == Component::Transformer);
    let family = transformer.and_then(|(m, source)| {
        let class = m.config["_class_name"].as_str();
        Some((class.and_then(Family::of_transformer_class)?, m, source))
    });
    let mut defaults = defaults;
    if let Some((family, m, source)) = family {
        if let Some(files) = family.composed_files(source, &m.config) {
            // The tokenizer is shared where the family reads it; the rest is the family's own.
            let carried = family.reads_carried_tokenizer();
            defaults.retain(|(p, _)| carried && p.starts_with("tokenizer/"));
            defaults.extend(files);
        }
    }
    let index: serde_json::Value = (defaults.iter())
        .find(|(p, _)| p == "model_index.json")
        .and_then(|(_, b)| serde_json::from_slice(b).ok())
        .unwrap_or_default();
    let listed = |dir: &str| index.get(dir).is_some();
    let needed: Vec<Component> = (Component::ALL.into_iter())
        .filter(|c| !c.optional() || listed(c.dir()))
        .collect();
    let missing: Vec<&str> = (needed.iter())
        .filter(|c| !components.iter().any(|(m, _)| m.component == **c))
        .map(|c| c.dir())
        .collect();
    if !missing.is_empty() {
        let flags: Vec<&str> = needed.iter().map(|c| c.flag()).collect();
        let (last, rest) = flags
            .split_last()
            .expect("the transformer is always needed");
        return Err(Error::Compose(format!(
            "without --from, a model needs every component: {} missing (give {} and {last})",
            missing.join(", "),
            rest.join(", ")
        )));
    }
    for (folder, flag) in [
        ("tokenizer", "--tokenizer"),
        ("tokenizer_2", "--tokenizer-2"),
    ] {
        let prefix = format!("{folder}/");
        let has = |files: &[(String, Vec<u8>)]| files.iter().any(|(p, _)| p.starts_with(&prefix));
        if listed(folder) && !has(&defaults) && !tokenizers.iter().any(|t| has(t)) {
            let class = index[folder][1].as_str().unwrap_or("its tokenizer");
            return Err(Error::Compose(format!(
                "without --from, the model's `{folder}` ({class}) must be given: {flag} DIR|FILE, a folder of its files or one of them"
            )));
        }
    }
    Ok(defaults)
}

impl TensorSource for ComposedModel {
    fn tensors(&self) -> Vec<SourceTensor> {
        self.tensors.clone()
    }

    fn config_files(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self.configs.clone())
    }
}
