//! Where a ControlNet comes from: a diffusers directory (`config.json` and safetensors weights)
//! or one of the published single files, whose version is recognised from its tensors and
//! whose configuration zimage carries ([`ControlNetVersion::published_config`]).

use super::control::{ControlNetLoader, LoadAs};
use super::controlnet::ControlNet;
use super::controlnet_config::{ControlNetConfig, ControlNetVersion};
use super::transformer::DitConfig;
use crate::files::{open_regular, read_bounded, FileError};
use crate::loader::{ReadPath, StoreSource};
use crate::memory_plan::TensorSize;
use crate::mlx::{self, Dtype};
use crate::models::{Checkpoint, ModelError, Residency};
use crate::pipeline::{ModelSource, SourceError};
use crate::safetensors::{read_header_file, Header, TensorInfo};
use crate::store::import::{SourceTensor, TensorSource};
use crate::store::{Store, StoreError};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Why a ControlNet could not be opened or loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Safetensors(#[from] crate::safetensors::Error),
    #[error("`{}`: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("controlnet `{}`: {cause}", path.display())]
    Model { path: PathBuf, cause: ModelError },
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The component a stored ControlNet's tensors go under, its config at `controlnet/config.json`.
pub const COMPONENT: &str = "controlnet";
/// The stored config's path.
pub const CONFIG_PATH: &str = "controlnet/config.json";

/// A ControlNet on disk, its configuration read or recognised.
#[derive(Debug, Clone)]
pub struct ControlNetSource {
    pub path: PathBuf,
    pub config: ControlNetConfig,
    /// The published version a single file was recognised as (`None` for a directory, whose
    /// config says what it is: [`ControlNetConfig::version`]).
    pub recognised: Option<ControlNetVersion>,
    /// Its weight files with their headers.
    files: Vec<(PathBuf, Header)>,
}

/// The largest `config.json` read.
const CONFIG_LIMIT: u64 = 1 << 20;

impl ControlNetSource {
    /// Opens a diffusers directory or a single `.safetensors` file.
    pub fn open(path: &Path) -> Result<ControlNetSource, Error> {
        if path.is_dir() {
            Self::open_dir(path)
        } else {
            Self::open_file(path)
        }
    }

    fn open_dir(dir: &Path) -> Result<ControlNetSource, Error> {
        let config_path = dir.join("config.json");
        if !config_path.exists() {
            return Err(Error::Invalid {
                path: dir.to_path_buf(),
                reason: "is a directory without a ControlNet's `config.json`".into(),
            });
        }
        let bytes = read_bounded(&config_path, CONFIG_LIMIT, "controlnet config")?;
        let config: ControlNetConfig =
            serde_json::from_slice(&bytes).map_err(|e| Error::Invalid {
                path: config_path.clone(),
                reason: format!("not a ZImageControlNetModel config: {e}"),
            })?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(FileError::io(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        let files = (files.into_iter())
            .map(|f| Ok((f.clone(), read_header_file(&f)?)))
            .collect::<Result<Vec<_>, Error>>()?;
        if files.is_empty() {
            return Err(Error::Invalid {
                path: dir.to_path_buf(),
                reason: "holds no .safetensors weights next to its config.json".into(),
            });
        }
        Ok(ControlNetSource {
            path: dir.to_path_buf(),
            config,
            recognised: None,
            files,
        })
    }

    fn open_file(path: &Path) -> Result<ControlNetSource, Error> {
        let header = read_header_file(path)?;
        let version = recognise(path, &header)?.ok_or_else(|| Error::Invalid {
            path: path.to_path_buf(),
            reason: "is not a Z-Image ControlNet: it has no `control_all_x_embedder.2-1.weight`"
                .into(),
        })?;
        Ok(ControlNetSource {
            path: path.to_path_buf(),
            config: version.published_config(),
            recognised: Some(version),
            files: vec![(path.to_path_buf(), header)],
        })
    }

    /// The published version this ControlNet is.
    pub fn version(&self) -> ControlNetVersion {
        self.recognised.unwrap_or_else(|| self.config.version())
    }

    /// Loads it for a transformer of configuration `dit`, computing in `dtype`.
    pub fn load(
        &self,
        dit: &DitConfig,
        dtype: Dtype,
        residency: Residency,
    ) -> Result<ControlNet, Error> {
        let mut tensors = std::collections::HashMap::new();
        for (file, _) in &self.files {
            tensors.extend(mlx::io::load_safetensors(file)?.tensors);
        }
        let ckpt = Checkpoint::new(COMPONENT, tensors, dtype).with_residency(residency);
        ControlNet::new(&self.config, ckpt, dit).map_err(|cause| Error::Model {
            path: self.path.clone(),
            cause,
        })
    }
}

/// A ControlNet on disk as the pipeline loads it.
impl ControlNetLoader for ControlNetSource {
    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn version(&self) -> &'static str {
        ControlNetSource::version(self).name()
    }

    fn config(&self) -> &ControlNetConfig {
        &self.config
    }

    fn tensor_sizes(&self) -> Vec<TensorSize> {
        (self.files.iter())
            .flat_map(|(_, header)| header.tensors.iter())
            .map(|t| TensorSize {
                name: t.name.clone(),
                shape: t.shape.clone(),
                stored_bytes: t.nbytes(),
                packed: false,
            })
            .collect()
    }

    fn load(&self, at: LoadAs<'_>) -> Result<ControlNet, SourceError> {
        Ok(ControlNetSource::load(
            self,
            at.dit,
            at.dtype,
            at.residency,
        )?)
    }
}

/// A ControlNet in the store (any model source holding a `controlnet` component and its
/// config), its configuration read when it is opened.
pub struct StoredControlNet<S: ModelSource> {
    pub model: S,
    pub config: ControlNetConfig,
}

impl<S: ModelSource> StoredControlNet<S> {
    /// Opens `model` as a ControlNet; an error names it when it is no ControlNet.
    pub fn open(model: S) -> Result<StoredControlNet<S>, Error> {
        let invalid = |reason: String| Error::Invalid {
            path: PathBuf::from(model.name()),
            reason,
        };
        let config = stored_config(&model).map_err(invalid)?.ok_or_else(|| {
            invalid(format!(
                "is not a ControlNet: it has no `{CONFIG_PATH}` (a Z-Image model goes to --model)"
            ))
        })?;
        Ok(StoredControlNet { model, config })
    }
}

/// The ControlNet stored as `name` in `store`, read with MLX's loader.
pub fn open_stored(store: Store, name: &str) -> Result<StoredControlNet<StoreSource>, Error> {
    let model = store.open(name)?;
    StoredControlNet::open(StoreSource {
        store,
        model,
        read_path: ReadPath::MlxLoader,
    })
}

impl<S: ModelSource + Send> ControlNetLoader for StoredControlNet<S> {
    fn name(&self) -> String {
        self.model.name()
    }

    fn version(&self) -> &'static str {
        self.config.version().name()
    }

    fn config(&self) -> &ControlNetConfig {
        &self.config
    }

    fn tensor_sizes(&self) -> Vec<TensorSize> {
        self.model.tensor_sizes(COMPONENT).unwrap_or_default()
    }

    fn load(&self, at: LoadAs<'_>) -> Result<ControlNet, SourceError> {
        Ok(load_stored(&self.model, at.dit, at.dtype, at.residency)?)
    }
}

/// Importing a ControlNet into the store: its tensors under [`COMPONENT`] as they come, and its
/// configuration (read, or the recognised version's) as [`CONFIG_PATH`].
impl TensorSource for ControlNetSource {
    fn tensors(&self) -> Vec<SourceTensor> {
        (self.files.iter())
            .flat_map(|(file, header)| {
                let data = header.data_start();
                header.tensors.iter().map(move |t| SourceTensor {
                    component: COMPONENT.to_string(),
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    file: file.clone(),
                    offset: data + t.data_offsets.0,
                    nbytes: t.nbytes(),
                    encoding: crate::store::Encoding::Plain,
                    roll: 0,
                })
            })
            .collect()
    }

    fn config_files(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut config = serde_json::to_value(&self.config).expect("configs serialize");
        config["_class_name"] = "ZImageControlNetModel".into();
        let bytes = serde_json::to_vec_pretty(&config).expect("JSON values serialize");
        Ok(vec![(CONFIG_PATH.to_string(), bytes)])
    }
}

/// The configuration of a stored model that is a ControlNet; `None` for any other model.
pub fn stored_config(model: &dyn ModelSource) -> Result<Option<ControlNetConfig>, String> {
    let Some(bytes) = model.config_file(CONFIG_PATH).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("`{CONFIG_PATH}` of `{}`: {e}", model.name()))
}

/// Loads the ControlNet stored as `model` (quantized weights stay packed) for a transformer of
/// configuration `dit`.
pub fn load_stored(
    model: &dyn ModelSource,
    dit: &DitConfig,
    dtype: Dtype,
    residency: Residency,
) -> Result<ControlNet, Error> {
    let path = PathBuf::from(model.name());
    let invalid = |reason: String| Error::Invalid {
        path: path.clone(),
        reason,
    };
    let config = stored_config(model)
        .map_err(invalid)?
        .ok_or_else(|| invalid("is not a ControlNet: it has no `controlnet/config.json`".into()))?;
    let weights = match residency {
        Residency::Streamed => model.mapped_component(COMPONENT),
        _ => model.component(COMPONENT),
    }
    .map_err(|e| invalid(e.to_string()))?;
    let ckpt = Checkpoint::new(COMPONENT, weights.tensors, dtype)
        .with_quantized(weights.quantized)
        .with_residency(residency)
        .with_release(weights.release);
    ControlNet::new(&config, ckpt, dit).map_err(|cause| Error::Model { path, cause })
}

/// The published version of the single file at `path`, read from its header (and, for a 2.x
/// file, its first refiner `before_proj`); `None` when it is no Z-Image ControlNet.
pub fn recognise_file(path: &Path) -> Result<Option<ControlNetVersion>, Error> {
    recognise(path, &read_header_file(path)?)
}

fn recognise(path: &Path, header: &Header) -> Result<Option<ControlNetVersion>, Error> {
    let data_start = header.data_start();
    ControlNetVersion::recognise(header, |t| all_zero(path, data_start + t.data_offsets.0, t))
}

/// Whether every element of tensor `t` (at `offset` in the file) is +0 or −0.
fn all_zero(path: &Path, offset: u64, t: &TensorInfo) -> Result<bool, Error> {
    let width = t.dtype.size_bytes().max(1);
    let (mut file, _) = open_regular(path)?;
    file.seek(SeekFrom::Start(offset))
        .map_err(FileError::io(path))?;
    let mut reader = file.take(t.nbytes());
    let mut buf = vec![0u8; width * 65536];
    loop {
        let n = read_full(&mut reader, &mut buf).map_err(FileError::io(path))?;
        // Little-endian elements: the sign bit is the top bit of each element's last byte.
        let nonzero = buf[..n].chunks(width).any(|e| {
            let (last, rest) = e.split_last().unwrap_or((&0, &[]));
            last & 0x7F != 0 || rest.iter().any(|&b| b != 0)
        });
        if nonzero {
            return Ok(false);
        }
        if n < buf.len() {
            return Ok(true);
        }
    }
}

/// Reads until `buf` is full or the input ends; the count read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Z-Image's ControlNets (the Fun ControlNet Union, every published version), as the registry
/// asks about them.
pub struct FunControlNets;

impl crate::families::ControlNets for FunControlNets {
    fn describe_stored(&self, source: &dyn ModelSource) -> Option<Result<String, String>> {
        Some(match stored_config(source) {
            Ok(Some(c)) => Ok(format!(
                "ControlNet {} ({} control layers, {} control channels)",
                c.version().name(),
                c.control_layers_places.len(),
                c.control_in_dim
            )),
            Ok(None) => return None,
            Err(e) => Err(format!("ControlNet, config unreadable: {e}")),
        })
    }

    fn recognises(
        &self,
        from: &Path,
        component: &str,
    ) -> Result<bool, crate::families::ControlNetError> {
        if from.is_dir() {
            let config = from.join("config.json");
            if !config.is_file() {
                return Ok(false);
            }
            let bytes = crate::files::read_bounded(&config, 1 << 20, "config")?;
            let json: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| format!("`{}` is not JSON: {e}", config.display()))?;
            return Ok(json["_class_name"] == "ZImageControlNetModel");
        }
        if component != "model" || !from.is_file() {
            return Ok(false);
        }
        let kind = crate::formats::FileKind::of_file(from)
            .map_err(|e| format!("cannot read `{}`: {e}", from.display()))?;
        Ok(kind == crate::formats::FileKind::Safetensors && recognise_file(from)?.is_some())
    }

    fn open(
        &self,
        from: &Path,
    ) -> Result<Box<dyn crate::store::import::TensorSourceSync>, crate::families::ControlNetError>
    {
        Ok(Box::new(ControlNetSource::open(from)?))
    }
}
