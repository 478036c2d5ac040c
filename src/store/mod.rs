//! The model store, laid out as Ollama lays it out:
//!
//! ```text
//! <root>/blobs/sha256-<hex>                         content-addressed blobs
//! <root>/manifests/<host>/<namespace>/<model>/<tag> Docker-v2 manifests
//! ```
//! The root is `--store DIR`, else `$ZIMAGE_MODELS`, else `$OLLAMA_MODELS`, else
//! `~/.ollama/models`, so models Ollama pulled are found where they are.

pub mod blob;
pub mod file_source;
pub mod import;
pub mod manifest;
pub mod name;

pub use file_source::SafetensorsFile;
pub use import::{ImportOptions, ImportSummary, Quantization, SourceTensor, TensorSource};
pub use manifest::{Layer, Manifest};
pub use name::ModelName;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Name(#[from] name::NameError),
    #[error("model `{0}` not found in the store (see `zimage list`)")]
    NotFound(String),
    #[error("manifest `{}`: {reason}", path.display())]
    BadManifest { path: PathBuf, reason: String },
    #[error(transparent)]
    Blob(blob::BlobError),
    #[error(transparent)]
    Header(#[from] crate::safetensors::Error),
    #[error(transparent)]
    Mlx(#[from] crate::mlx::Error),
    #[error("`{}`: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// A store on disk.
#[derive(Debug, Clone)]
pub struct Store {
    pub root: PathBuf,
}

/// A model found in the store.
#[derive(Debug, Clone)]
pub struct StoredModel {
    pub name: ModelName,
    pub manifest: Manifest,
    /// sha256 of the manifest file's bytes (what `ollama list` shows as the ID).
    pub manifest_digest: String,
    pub modified: SystemTime,
}

impl StoredModel {
    /// Bytes of every blob the model references.
    pub fn size(&self) -> u64 {
        self.manifest.config.size + self.manifest.layers.iter().map(|l| l.size).sum::<u64>()
    }
}

/// What a check of a model found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VerifyReport {
    pub blobs_checked: usize,
    pub bytes_checked: u64,
    pub problems: Vec<String>,
}

impl Store {
    /// The store at `explicit`, or where the environment says.
    pub fn locate(explicit: Option<&Path>) -> Result<Store, StoreError> {
        let root = match explicit {
            Some(p) => p.to_path_buf(),
            None => match ["ZIMAGE_MODELS", "OLLAMA_MODELS"]
                .iter()
                .find_map(std::env::var_os)
            {
                Some(p) => PathBuf::from(p),
                None => {
                    let home = std::env::var_os("HOME").ok_or_else(|| {
                        StoreError::Invalid(
                            "cannot find the store: set --store, ZIMAGE_MODELS or HOME".into(),
                        )
                    })?;
                    PathBuf::from(home).join(".ollama/models")
                }
            },
        };
        Ok(Store { root })
    }

    pub fn at(root: &Path) -> Store {
        Store {
            root: root.to_path_buf(),
        }
    }

    fn io(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
        move |source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn blob_path(&self, digest: &str) -> Result<PathBuf, StoreError> {
        Ok(blob::blob_path(&self.root, digest)?)
    }

    /// Reads a model's manifest by name.
    pub fn open(&self, name: &str) -> Result<StoredModel, StoreError> {
        let parsed = ModelName::parse(name)?;
        let path = self.root.join(parsed.manifest_path());
        if !path.is_file() {
            return Err(StoreError::NotFound(parsed.short()));
        }
        self.read_manifest(parsed, &path)
    }

    fn read_manifest(&self, name: ModelName, path: &Path) -> Result<StoredModel, StoreError> {
        let bytes = std::fs::read(path).map_err(Self::io(path))?;
        let bad = |reason: String| StoreError::BadManifest {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() > 64 << 20 {
            return Err(bad("larger than 64 MiB".into()));
        }
        let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if manifest.schema_version != 2 {
            return Err(bad(format!(
                "`schemaVersion` is {}, expected 2",
                manifest.schema_version
            )));
        }
        for digest in manifest.digests() {
            blob::digest_hex(digest).map_err(|e| bad(e.to_string()))?;
        }
        let modified = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let manifest_digest = format!(
            "sha256:{:x}",
            <sha2::Sha256 as sha2::Digest>::digest(&bytes)
        );
        Ok(StoredModel {
            name,
            manifest,
            manifest_digest,
            modified,
        })
    }

    /// Writes a manifest atomically (temp file, fsync, rename).
    pub fn write_manifest(&self, name: &ModelName, manifest: &Manifest) -> Result<(), StoreError> {
        let path = self.root.join(name.manifest_path());
        let dir = path.parent().expect("manifest paths have parents");
        std::fs::create_dir_all(dir).map_err(Self::io(dir))?;
        write_atomic(&path, &manifest.to_bytes())
    }

    /// Every model in the store, sorted by name. Unreadable manifests are reported as errors.
    pub fn list(&self) -> Result<Vec<StoredModel>, StoreError> {
        let mut out = Vec::new();
        let base = self.root.join("manifests");
        if !base.is_dir() {
            return Ok(out);
        }
        for host in read_dirs(&base)? {
            for ns in read_dirs(&host)? {
                for model in read_dirs(&ns)? {
                    for tag in std::fs::read_dir(&model).map_err(Self::io(&model))? {
                        let tag = tag.map_err(Self::io(&model))?.path();
                        if !tag.is_file() {
                            continue;
                        }
                        let part = |p: &Path| {
                            p.file_name()
                                .map(|n| n.to_string_lossy().into_owned())
                                .unwrap_or_default()
                        };
                        let spelled = format!(
                            "{}/{}/{}:{}",
                            part(&host),
                            part(&ns),
                            part(&model),
                            part(&tag)
                        );
                        let Ok(name) = ModelName::parse(&spelled) else {
                            continue;
                        };
                        out.push(self.read_manifest(name, &tag)?);
                    }
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Deletes a model's manifest; its blobs stay until [`Store::gc`].
    pub fn remove(&self, name: &str) -> Result<ModelName, StoreError> {
        let model = self.open(name)?;
        let path = self.root.join(model.name.manifest_path());
        std::fs::remove_file(&path).map_err(Self::io(&path))?;
        // Tidy empty parent folders up to `manifests/`.
        let stop = self.root.join("manifests");
        let mut dir = path.parent();
        while let Some(d) = dir {
            if d == stop || std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
        Ok(model.name)
    }

    /// Deletes every blob no manifest references, and leftovers of interrupted writes.
    /// Returns (blobs deleted, bytes freed).
    pub fn gc(&self) -> Result<(usize, u64), StoreError> {
        let referenced: HashSet<String> = self
            .list()?
            .iter()
            .flat_map(|m| {
                m.manifest
                    .digests()
                    .map(|d| blob::digest_hex(d).map(|h| h.to_ascii_lowercase()))
                    .collect::<Vec<_>>()
            })
            .collect::<Result<_, _>>()?;
        self.remove_stale_partials();
        let dir = self.root.join("blobs");
        let (mut count, mut bytes) = (0, 0);
        if !dir.is_dir() {
            return Ok((0, 0));
        }
        for entry in std::fs::read_dir(&dir).map_err(Self::io(&dir))? {
            let path = entry.map_err(Self::io(&dir))?.path();
            let Some(hex) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("sha256-"))
            else {
                continue;
            };
            if blob::digest_hex(&format!("sha256:{hex}")).is_err()
                || referenced.contains(&hex.to_ascii_lowercase())
            {
                continue;
            }
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            std::fs::remove_file(&path).map_err(Self::io(&path))?;
            count += 1;
            bytes += size;
        }
        Ok((count, bytes))
    }

    /// Removes temporary blob files whose writing process is gone.
    pub fn remove_stale_partials(&self) {
        let Ok(entries) = std::fs::read_dir(self.root.join("blobs")) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(blob::PARTIAL_PREFIX) else {
                continue;
            };
            let pid = rest
                .trim_start_matches('q')
                .trim_start_matches('-')
                .split('-')
                .next()
                .and_then(|p| p.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| {
                p == std::process::id() || Path::new(&format!("/proc/{p}")).exists()
            });
            if !alive || !Path::new("/proc").is_dir() && pid != Some(std::process::id()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Re-hashes every blob of a model and checks every tensor blob's header against its layer.
    pub fn verify(&self, name: &str) -> Result<VerifyReport, StoreError> {
        let model = self.open(name)?;
        let mut report = VerifyReport::default();
        let m = &model.manifest;
        for layer in std::iter::once(&m.config).chain(m.layers.iter()) {
            let label = layer.name.clone().unwrap_or_else(|| "config".into());
            let path = self.blob_path(&layer.digest)?;
            if !path.is_file() {
                report
                    .problems
                    .push(format!("`{label}`: blob `{}` is missing", layer.digest));
                continue;
            }
            let (digest, size) = blob::hash_file(&path)?;
            report.blobs_checked += 1;
            report.bytes_checked += size;
            if size != layer.size {
                report.problems.push(format!(
                    "`{label}`: blob `{}` is {size} bytes, the manifest says {}",
                    layer.digest, layer.size
                ));
            }
            if !digest.eq_ignore_ascii_case(&layer.digest) {
                report.problems.push(format!(
                    "`{label}`: blob `{}` hashes to `{digest}`",
                    layer.digest
                ));
                continue;
            }
            if layer.is_tensor() {
                match crate::safetensors::read_header_file(&path) {
                    Err(e) => report.problems.push(format!("`{label}`: {e}")),
                    Ok(h) => {
                        if let Err(p) = check_layer_header(layer, &h) {
                            report.problems.push(format!("`{label}`: {p}"));
                        }
                    }
                }
            }
        }
        Ok(report)
    }

    /// Digest → names of the models that reference it, over the whole store.
    pub fn blob_users(&self) -> Result<HashMap<String, Vec<String>>, StoreError> {
        let mut users: HashMap<String, Vec<String>> = HashMap::new();
        for m in self.list()? {
            let mut seen = HashSet::new();
            for d in m.manifest.digests() {
                if seen.insert(d.to_string()) {
                    users.entry(d.to_string()).or_default().push(m.name.short());
                }
            }
        }
        Ok(users)
    }

    /// The bytes of a config layer (`transformer/config.json`) of a model.
    pub fn config_file(
        &self,
        model: &StoredModel,
        path: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(layer) = model.manifest.config_file(path) else {
            return Ok(None);
        };
        let p = self.blob_path(&layer.digest)?;
        Ok(Some(std::fs::read(&p).map_err(Self::io(&p))?))
    }
}

/// A tensor layer's declared dtype and shape (when present) must match its blob's header.
fn check_layer_header(layer: &Layer, header: &crate::safetensors::Header) -> Result<(), String> {
    let main = header
        .tensors
        .iter()
        .find(|t| !t.name.ends_with(".scale") && !t.name.ends_with(".bias"))
        .ok_or("blob holds no tensor")?;
    if let Some(d) = &layer.dtype {
        let quantized = header.tensors.len() > 1;
        if !quantized && d != main.dtype.name() {
            return Err(format!("layer says dtype {d}, blob holds {}", main.dtype));
        }
    }
    if let Some(s) = &layer.shape {
        if header.tensors.len() == 1 && s != &main.shape {
            return Err(format!(
                "layer says shape {s:?}, blob holds {:?}",
                main.shape
            ));
        }
    }
    Ok(())
}

fn read_dirs(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(Store::io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    Ok(v)
}

/// Writes a file atomically: a temp file in the same folder, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let io = Store::io(path);
    let mut tmp = crate::files::TempFile::beside(path, ".zimage-").map_err(&io)?;
    std::io::Write::write_all(&mut tmp, bytes).map_err(&io)?;
    tmp.as_file().sync_all().map_err(&io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// Per-component summary of a model, for `show`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ComponentSummary {
    pub tensors: usize,
    pub parameters: u64,
    pub bytes: u64,
    pub dtypes: BTreeMap<String, usize>,
    pub quantized_tensors: usize,
}

/// Tensors, parameters, dtypes and bytes per component, from the manifest and blob headers.
pub fn summarize(
    store: &Store,
    model: &StoredModel,
) -> Result<BTreeMap<String, ComponentSummary>, StoreError> {
    let mut out: BTreeMap<String, ComponentSummary> = BTreeMap::new();
    for layer in model.manifest.tensor_layers() {
        let Some((component, _)) = layer.component_and_tensor() else {
            continue;
        };
        let s = out.entry(component.to_string()).or_default();
        s.tensors += 1;
        s.bytes += layer.size;
        let (dtype, shape, quantized) = match (&layer.dtype, &layer.shape) {
            (Some(d), Some(sh)) => {
                let (_, h) = blob::read_blob_header(&store.root, &layer.digest)?;
                (d.clone(), sh.clone(), h.tensors.len() > 1)
            }
            _ => {
                let (_, h) = blob::read_blob_header(&store.root, &layer.digest)?;
                // A quantized blob holds `W` with its companions `W.scale` and `W.bias`; a
                // plain bias tensor (`x.bias`) is a main tensor in a blob of its own.
                let is_companion = |name: &str| {
                    [".scale", ".bias"].iter().any(|sfx| {
                        name.strip_suffix(sfx)
                            .is_some_and(|stem| h.tensors.iter().any(|o| o.name == stem))
                    })
                };
                let main = h.tensors.iter().find(|t| !is_companion(&t.name));
                let main = main.ok_or_else(|| {
                    StoreError::Invalid(format!("blob `{}` holds no tensor", layer.digest))
                })?;
                (
                    main.dtype.name().to_string(),
                    main.shape.clone(),
                    h.tensors.len() > 1 || h.metadata.is_some(),
                )
            }
        };
        s.parameters += shape.iter().product::<u64>();
        *s.dtypes.entry(dtype).or_default() += 1;
        if quantized {
            s.quantized_tensors += 1;
        }
    }
    Ok(out)
}
