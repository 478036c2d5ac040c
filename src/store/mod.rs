//! The model store, laid out as Ollama lays it out:
//!
//! ```text
//! <root>/blobs/sha256-<hex>                         content-addressed blobs
//! <root>/manifests/<host>/<namespace>/<model>/<tag> Docker-v2 manifests
//! ```
//! The root is `--store DIR`, else `$ZIMAGE_MODELS`, else `$OLLAMA_MODELS`, else
//! `~/.ollama/models`, so models Ollama pulled are found where they are.

#[doc(hidden)]
pub mod blob;
mod file_source;
pub mod import;
mod import_ggml;
mod lock;
pub mod manifest;
pub mod name;
#[doc(hidden)]
pub mod repair;
mod source_tensor;

pub use blob::BlobError;
pub use file_source::SafetensorsFile;
pub use import::{
    Encoding, ImportOptions, ImportSummary, Quantization, SourceTensor, TensorSource,
};
pub use lock::StoreLock;
pub use manifest::{Layer, Manifest, MAX_MANIFEST_BYTES};
pub use name::ModelName;

use crate::files::FileError;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Why a store operation failed; each message names the model, file or value, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A model name that is not `[host/][namespace/]model[:tag]`.
    #[error(transparent)]
    Name(#[from] name::NameError),
    /// No model of this name in the store; the name as shown.
    #[error("model `{0}` not found in the store (see `zimage list`)")]
    NotFound(String),
    /// A manifest file that is not a manifest (not JSON, a wrong schema, a bad digest).
    #[error("manifest `{}`: {reason}", path.display())]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// `gc` met a damaged manifest, so it cannot tell which blobs are in use.
    #[error(
        "model `{name}` has a damaged manifest (`{}`: {reason}), so its blobs cannot be told \
         from garbage; remove it with `zimage rm {name}`, or see every problem with `zimage doctor`",
        path.display()
    )]
    Damaged {
        /// The model its path names.
        name: String,
        /// The manifest file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file that cannot be read or written, or is too large, or is not a regular file.
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    /// A blob that is missing, malformed or not what its digest says.
    #[error(transparent)]
    Blob(blob::BlobError),
    /// A safetensors header (of a source file or a blob) that cannot be read.
    #[error(transparent)]
    Header(#[from] crate::safetensors::Error),
    /// MLX failed while loading or converting tensors.
    #[error(transparent)]
    Mlx(#[from] crate::mlx::Error),
    /// The model has no tensors of the component asked for.
    #[error(
        "model `{model}` has no `{component}` tensors (it has: {})",
        list_or_none(have)
    )]
    NoComponent {
        /// The model.
        model: String,
        /// The component asked for.
        component: String,
        /// The components it has.
        have: Vec<String>,
    },
    /// Loading a component would hold more blobs open than the process may open files.
    #[error(
        "model `{model}`: `{component}` has {blobs} blobs to hold open, but this process may \
         open only {limit} files (the hard limit); raise it, e.g. `ulimit -n {wanted}`"
    )]
    TooManyOpenFiles {
        /// The model.
        model: String,
        /// The component being loaded.
        component: String,
        /// Its blobs.
        blobs: usize,
        /// The process's hard limit on open files.
        limit: u64,
        /// A limit that would do.
        wanted: u64,
    },
    /// Ollama's first quantized layout (`X`, `X_scale`, `X_qbias`), with parts that do not fit.
    #[error("`{layer}` {problem}")]
    V1Quantized {
        /// The layer, `component/name` with its suffix.
        layer: String,
        /// What does not fit.
        problem: &'static str,
    },
    /// A tensor layer's blob whose header lists no tensor.
    #[error("blob `{digest}` holds no tensor")]
    EmptyBlob {
        /// The blob's digest.
        digest: String,
    },
    /// No store was given and neither the environment nor `HOME` says where one is.
    #[error("cannot find the store: set --store, ZIMAGE_MODELS or HOME")]
    NoStore,
    /// The store's path is a file, not a folder.
    #[error(
        "the store `{}` is not a directory; give `--store` (or ZIMAGE_MODELS) a folder",
        path.display()
    )]
    StoreNotDir {
        /// The path given.
        path: PathBuf,
    },
    /// The store is locked by another process and this one would not wait.
    #[error("another zimage process is using the store")]
    Busy,
    /// A leftover temporary file may be another process's work in progress: it is kept.
    #[error(
        "another zimage process is using the store, so `{}` may be its work in progress; run \
         `zimage doctor` again when it has finished",
        path.display()
    )]
    TemporaryInUse {
        /// The temporary file.
        path: PathBuf,
    },
    /// A manifest larger than [`MAX_MANIFEST_BYTES`]; it is not written.
    #[error(
        "the manifest of `{model}` would be {bytes} bytes, more than the {MAX_MANIFEST_BYTES} a \
         manifest may be; nothing was written"
    )]
    ManifestTooLarge {
        /// The model.
        model: String,
        /// The manifest's size.
        bytes: u64,
    },
    /// An import with so many tensors that its manifest would pass [`MAX_MANIFEST_BYTES`]; it
    /// is refused before it writes anything.
    #[error(
        "`{model}` would have {tensors} tensors and a manifest of about {} MiB, more than the {} \
         MiB a manifest may be; nothing was written (merge tensors, or import the components \
         one by one)",
        manifest_bytes >> 20,
        MAX_MANIFEST_BYTES >> 20
    )]
    ImportTooLarge {
        /// The model.
        model: String,
        /// Its tensors.
        tensors: usize,
        /// The manifest's estimated size.
        manifest_bytes: u64,
    },
    /// A source's JSON config file that does not parse; imports refuse it rather than store it.
    #[error("`{}` is not valid JSON ({reason}); fix or remove it and import again", path.display())]
    ConfigNotJson {
        /// The config file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// A source's config file that parses but cannot be used (too large, a wrong shape).
    #[error("`{}`: {reason}; fix or remove it and import again", path.display())]
    BadConfigFile {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A blob this import wrote was gone or changed before its manifest was written.
    #[error(
        "blob `{digest}` written by this import is {} (another program removed it from `{}`?); \
         no manifest was written: run the import again",
        found.map_or("missing".into(), |s| format!("{s} bytes, not {expected}")),
        blobs.display()
    )]
    BlobVanished {
        /// The blob's digest.
        digest: String,
        /// The size it was written with.
        expected: u64,
        /// Its size now; `None` when it is gone.
        found: Option<u64>,
        /// The store's `blobs` folder.
        blobs: PathBuf,
    },
    /// The disk filled up during an import; what was written is taken back.
    #[error(
        "no space left on the disk holding `{}`: the import needs up to {:.1} MB (less what the \
         store already holds), {} are free; no manifest was written and no partial blob is left; \
         free some space (or import with `--quantize`) and run it again",
        root.display(),
        *needed as f64 / 1e6,
        free.map_or("unknown".into(), |b| format!("{:.1} MB", b as f64 / 1e6))
    )]
    DiskFull {
        /// The store.
        root: PathBuf,
        /// Bytes the import needs at most.
        needed: u64,
        /// Bytes free on the disk, when known.
        free: Option<u64>,
    },
    /// A scaled-fp8 checkpoint: its weights need scales the import does not apply.
    #[error("`{}`: tensor `{tensor}` {}", file.display(), crate::fp8::SCALE_REFUSAL)]
    Fp8Scale {
        /// The source file.
        file: PathBuf,
        /// The scale tensor found.
        tensor: String,
    },
    /// An import asked to convert tensors to a dtype other than BF16, F16 or F32.
    #[error("`--dtype {}` is not supported; use bf16, f16 or f32", .0.lower_name())]
    UnsupportedDtype(crate::dtype::Dtype),
    /// An import asked for a blob alignment that is not a power of two of at least 8.
    #[error("alignment {0} must be a power of two ≥ 8")]
    BadAlignment(u64),
    /// A tensor to quantize with an axis longer than MLX can quantize.
    #[error(
        "`{}`: tensor `{tensor}` has shape {shape:?}, a dimension past what MLX can quantize \
         (2^31 - 1); import it without `--quantize`",
        file.display()
    )]
    Unquantizable {
        /// The source file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// A GGUF tensor in a ggml type that imports cannot decode.
    #[error("`{}`: tensor `{tensor}` is {ty}, which cannot be imported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K to Q6_K can)", file.display())]
    GgmlUnsupported {
        /// The GGUF file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its ggml type.
        ty: crate::ggml::GgmlType,
    },
    /// A source tensor holding NaN or an infinity: such a model draws only black, so the import
    /// stops.
    #[error(
        "`{}`: tensor `{}` ({component}) holds {value} at element {index}; a model with NaN or infinite weights draws nothing but black. Re-export it from a healthy checkpoint",
        crate::shown::path(file), crate::shown::text(tensor)
    )]
    NonFinite {
        /// The source file.
        file: PathBuf,
        /// The component being imported.
        component: String,
        /// The tensor.
        tensor: String,
        /// `NaN`, `+inf` or `-inf`.
        value: String,
        /// The first such element, counted row-major.
        index: u64,
    },
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

impl StoreError {
    /// A v1 quantized layer `component/base` + `suffix` and what is wrong with it.
    pub(crate) fn v1_quantized(
        component: &str,
        base: &str,
        suffix: &str,
        problem: &'static str,
    ) -> StoreError {
        StoreError::V1Quantized {
            layer: format!("{component}/{base}{suffix}"),
            problem,
        }
    }
}

/// A store on disk.
#[derive(Debug, Clone)]
pub struct Store {
    /// The folder holding `blobs/` and `manifests/`.
    pub root: PathBuf,
}

/// A model found in the store.
#[derive(Debug, Clone)]
pub struct StoredModel {
    /// Its full name.
    pub name: ModelName,
    /// Its manifest: every tensor and config file, as a layer naming a blob.
    pub manifest: Manifest,
    /// sha256 of the manifest file's bytes (what `ollama list` shows as the ID).
    pub manifest_digest: String,
    /// When the manifest was last written.
    pub modified: SystemTime,
}

impl StoredModel {
    /// Bytes of every blob the model references.
    pub fn size(&self) -> u64 {
        self.manifest.total_size()
    }
}

/// What a check of a model found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VerifyReport {
    /// Blobs re-hashed.
    pub blobs_checked: usize,
    /// Their bytes.
    pub bytes_checked: u64,
    /// One line per problem found, naming the layer; empty when the model is sound.
    pub problems: Vec<String>,
}

/// A manifest file that cannot be read as a model.
#[derive(Debug, Clone)]
pub struct DamagedModel {
    /// The name its path spells.
    pub name: String,
    /// The manifest file.
    pub path: PathBuf,
    /// Why it cannot be read.
    pub reason: String,
}

/// Everything under `manifests/`.
#[derive(Debug, Default)]
pub struct Scan {
    /// Models whose manifests read well, sorted by name.
    pub models: Vec<StoredModel>,
    /// Manifests that cannot be read.
    pub damaged: Vec<DamagedModel>,
    /// Manifests that read well at a path that is no model name we accept (another tool's
    /// spelling): their blobs are in use all the same.
    pub foreign: Vec<(PathBuf, Manifest)>,
    /// Temporary files of interrupted manifest writes.
    pub temporaries: Vec<PathBuf>,
}

impl Scan {
    /// The hex digest (lowercase) of every blob some readable manifest references.
    pub(crate) fn referenced(&self) -> HashSet<String> {
        self.models
            .iter()
            .map(|m| &m.manifest)
            .chain(self.foreign.iter().map(|(_, m)| m))
            .flat_map(|m| m.digests())
            .filter_map(|d| blob::digest_hex(d).ok().map(|h| h.to_ascii_lowercase()))
            .collect()
    }
}

/// What a `remove` took away.
#[derive(Debug, Clone)]
pub struct Removed {
    /// The model removed.
    pub name: ModelName,
    /// Why the manifest could not be read, when it could not.
    pub damaged: Option<String>,
}

/// What a `gc` swept.
#[derive(Debug, Clone, Default)]
pub struct Swept {
    /// Blobs deleted.
    pub blobs: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Leftover temporary files deleted.
    pub temporaries: usize,
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
                    let home = std::env::var_os("HOME").ok_or(StoreError::NoStore)?;
                    PathBuf::from(home).join(".ollama/models")
                }
            },
        };
        if root.exists() && !root.is_dir() {
            return Err(StoreError::StoreNotDir { path: root });
        }
        Ok(Store { root })
    }

    /// The store at `root`, as it is (nothing is checked or created).
    pub fn at(root: &Path) -> Store {
        Store {
            root: root.to_path_buf(),
        }
    }

    fn io(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
        move |e| FileError::io(path)(e).into()
    }

    /// Where the blob of `digest` is (or would be); refuses a malformed digest.
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
        let bad = |reason: String| StoreError::BadManifest {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = crate::files::read_bounded(path, MAX_MANIFEST_BYTES, "manifest").map_err(
            |e| match e {
                crate::files::FileError::Io { cause: source, .. } => bad(source.to_string()),
                other => bad(other.to_string()),
            },
        )?;
        let manifest = Manifest::parse(&bytes).map_err(bad)?;
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
        let bytes = manifest.to_bytes();
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(StoreError::ManifestTooLarge {
                model: name.short(),
                bytes: bytes.len() as u64,
            });
        }
        write_atomic(&path, &bytes)
    }

    /// Every readable model in the store, sorted by name. Damaged manifests are left out:
    /// [`Store::scan`] reports them.
    pub fn list(&self) -> Result<Vec<StoredModel>, StoreError> {
        Ok(self.scan()?.models)
    }

    /// Every manifest in the store, read: models, damaged manifests, manifests at paths that
    /// are no model name, and temporaries of interrupted writes.
    pub fn scan(&self) -> Result<Scan, StoreError> {
        let mut out = Scan::default();
        let base = self.root.join("manifests");
        if !base.is_dir() {
            return Ok(out);
        }
        for host in read_dirs(&base, &mut out.temporaries)? {
            for ns in read_dirs(&host, &mut out.temporaries)? {
                for model in read_dirs(&ns, &mut out.temporaries)? {
                    let mut tags: Vec<PathBuf> = Vec::new();
                    for tag in std::fs::read_dir(&model).map_err(Self::io(&model))? {
                        tags.push(tag.map_err(Self::io(&model))?.path());
                    }
                    tags.sort();
                    for tag in tags {
                        let part = |p: &Path| {
                            p.file_name()
                                .map(|n| n.to_string_lossy().into_owned())
                                .unwrap_or_default()
                        };
                        if is_temporary(&part(&tag)) {
                            out.temporaries.push(tag);
                            continue;
                        }
                        if !tag.is_file() {
                            continue;
                        }
                        let spelled = format!(
                            "{}/{}/{}:{}",
                            part(&host),
                            part(&ns),
                            part(&model),
                            part(&tag)
                        );
                        let parsed = ModelName::parse(&spelled).ok();
                        let short = parsed.as_ref().map_or(spelled.clone(), |n| n.short());
                        let named = parsed.is_some();
                        let placeholder = || ModelName::parse("unnamed").expect("a valid name");
                        match self.read_manifest(parsed.unwrap_or_else(placeholder), &tag) {
                            Ok(m) if named => out.models.push(m),
                            Ok(m) => out.foreign.push((tag, m.manifest)),
                            Err(e) => out.damaged.push(DamagedModel {
                                name: short,
                                path: tag,
                                reason: match e {
                                    StoreError::BadManifest { reason, .. } => reason,
                                    other => other.to_string(),
                                },
                            }),
                        }
                    }
                }
            }
        }
        out.models.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Deletes a model's manifest; its blobs stay until [`Store::gc`]. A manifest that cannot
    /// be read is removed all the same, and the reason returned.
    pub fn remove(&self, name: &str) -> Result<Removed, StoreError> {
        let parsed = ModelName::parse(name)?;
        let path = self.root.join(parsed.manifest_path());
        if !path.is_file() {
            return Err(StoreError::NotFound(parsed.short()));
        }
        let _lock = self.lock_for_writing()?;
        let damaged = match self.read_manifest(parsed.clone(), &path) {
            Ok(_) => None,
            Err(StoreError::BadManifest { reason, .. }) => Some(reason),
            Err(e) => return Err(e),
        };
        std::fs::remove_file(&path).map_err(Self::io(&path))?;
        self.tidy_manifest_dirs(&path);
        Ok(Removed {
            name: parsed,
            damaged,
        })
    }

    /// Removes the folders a removed manifest leaves empty, up to `manifests/`.
    fn tidy_manifest_dirs(&self, removed: &Path) {
        let stop = self.root.join("manifests");
        let mut dir = removed.parent();
        while let Some(d) = dir {
            if d == stop || std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }

    /// Deletes every blob no manifest references, and the leftovers of interrupted writes.
    /// Holds the store exclusively; `waiting` is called if other processes hold it first.
    /// Refuses to run while a manifest is damaged, since the blobs it references are unknown.
    pub fn gc(&self, waiting: &dyn Fn()) -> Result<Swept, StoreError> {
        let _lock = self.lock_for_sweeping(waiting)?;
        let scan = self.scan()?;
        if let Some(d) = scan.damaged.first() {
            return Err(StoreError::Damaged {
                name: d.name.clone(),
                path: d.path.clone(),
                reason: d.reason.clone(),
            });
        }
        let referenced = scan.referenced();
        let mut swept = Swept::default();
        for t in scan.temporaries.iter().chain(&self.partial_blobs()) {
            if remove_if_present(t)? {
                swept.temporaries += 1;
            }
        }
        let dir = self.root.join("blobs");
        if !dir.is_dir() {
            return Ok(swept);
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
            if remove_if_present(&path)? {
                swept.blobs += 1;
                swept.bytes = swept.bytes.saturating_add(size);
            }
        }
        Ok(swept)
    }

    /// Temporary blob files: an import's, until it renames them into place. Only a holder of
    /// the exclusive lock may take them for leftovers.
    pub(crate) fn partial_blobs(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(self.root.join("blobs")) else {
            return Vec::new();
        };
        let mut out: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(blob::PARTIAL_PREFIX)
            })
            .map(|e| e.path())
            .collect();
        out.sort();
        out
    }

    /// Re-hashes every blob of a model and checks every tensor blob's header against its layer.
    pub fn verify(&self, name: &str) -> Result<VerifyReport, StoreError> {
        let _lock = self.lock_for_reading()?;
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
            if let Err(e) = blob::check_inside_store(&self.root, &layer.digest, &path) {
                report.problems.push(format!("`{label}`: {e}"));
                continue;
            }
            let (digest, size) = blob::hash_file(&path)?;
            report.blobs_checked += 1;
            report.bytes_checked = report.bytes_checked.saturating_add(size);
            if size != layer.size {
                report.problems.push(format!(
                    "`{label}`: blob `{}` is {size} bytes, the manifest says {}",
                    layer.digest, layer.size
                ));
            }
            if !same_digest(&digest, &layer.digest) {
                report.problems.push(format!(
                    "`{label}`: blob `{}` hashes to `{digest}`",
                    layer.digest
                ));
                continue;
            }
            if layer.is_tensor() || layer.is_lora_tensor() {
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
        blob::check_inside_store(&self.root, &layer.digest, &p)?;
        // Config layers are JSON and tokenizer files: a real one is a few MB.
        Ok(Some(crate::files::read_bounded(
            &p,
            CONFIG_LAYER_LIMIT,
            "config layer",
        )?))
    }
}

/// A tensor layer's declared dtype and shape (when present) must match its blob's header.
fn check_layer_header(layer: &Layer, header: &crate::safetensors::Header) -> Result<(), String> {
    let main = blob::main_tensor(header).ok_or("blob holds no tensor")?;
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

/// The folders in `dir`, sorted; temporary files met on the way go to `temporaries`.
fn read_dirs(dir: &Path, temporaries: &mut Vec<PathBuf>) -> Result<Vec<PathBuf>, StoreError> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).map_err(Store::io(dir))? {
        let e = e.map_err(Store::io(dir))?;
        let p = e.path();
        if p.is_dir() {
            v.push(p);
        } else if is_temporary(&e.file_name().to_string_lossy()) {
            temporaries.push(p);
        }
    }
    v.sort();
    Ok(v)
}

/// The largest config layer read (`tokenizer.json` of Qwen3 is 11 MB).
const CONFIG_LAYER_LIMIT: u64 = 64 << 20;

/// Prefix of the temporary files manifests are written to before they are renamed.
const MANIFEST_TEMP_PREFIX: &str = ".zimage-";

fn is_temporary(file_name: &str) -> bool {
    file_name.starts_with(MANIFEST_TEMP_PREFIX)
}

/// Removes a file another process may have removed first; says whether this one did.
fn remove_if_present(path: &Path) -> Result<bool, StoreError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(StoreError::from(FileError::Io {
            path: path.to_path_buf(),
            cause: source,
        })),
    }
}

/// Two digests name the same blob, however they are spelled (`sha256:` or `sha256-`, case).
pub(crate) fn same_digest(a: &str, b: &str) -> bool {
    match (blob::digest_hex(a), blob::digest_hex(b)) {
        (Ok(x), Ok(y)) => x.eq_ignore_ascii_case(y),
        _ => false,
    }
}

/// Writes a file atomically: a temp file in the same folder, fsync, rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let io = Store::io(path);
    let mut tmp = crate::files::TempFile::beside(path, MANIFEST_TEMP_PREFIX).map_err(&io)?;
    std::io::Write::write_all(&mut tmp, bytes).map_err(&io)?;
    tmp.as_file().sync_all().map_err(&io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// Per-component summary of a model, for `show`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ComponentSummary {
    /// Tensor layers.
    pub tensors: usize,
    /// Values in them: the product of each tensor's shape, as its layer or blob gives it.
    pub parameters: u64,
    /// Their blobs' bytes.
    pub bytes: u64,
    /// Tensors per dtype, as the layer (else the blob's header) names it.
    pub dtypes: BTreeMap<String, usize>,
    /// Tensors stored quantized.
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
        s.bytes = s.bytes.saturating_add(layer.size);
        let (dtype, shape, quantized) = match (&layer.dtype, &layer.shape) {
            (Some(d), Some(sh)) => {
                let (_, h) = blob::read_blob_header(&store.root, &layer.digest)?;
                (d.clone(), sh.clone(), h.tensors.len() > 1)
            }
            _ => {
                let (_, h) = blob::read_blob_header(&store.root, &layer.digest)?;
                let main = blob::main_tensor(&h).ok_or_else(|| StoreError::EmptyBlob {
                    digest: layer.digest.clone(),
                })?;
                (
                    main.dtype.name().to_string(),
                    main.shape.clone(),
                    h.tensors.len() > 1 || h.metadata.is_some(),
                )
            }
        };
        let count = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        s.parameters = s.parameters.saturating_add(count.unwrap_or(u64::MAX));
        *s.dtypes.entry(dtype).or_default() += 1;
        if quantized {
            s.quantized_tensors += 1;
        }
    }
    Ok(out)
}
