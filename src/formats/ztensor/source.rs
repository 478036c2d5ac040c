//! A .zt file as an import source: `zimage create NAME --from model.zt`.

use super::{Error, ZtFile};
use crate::files::TempFile;
use crate::store::{SourceTensor, StoreError, TensorSource};
use std::io::Write;
use std::path::Path;

/// A .zt file as a source for `zimage create`: every tensor under one component, dense and
/// little-endian. Raw dense tensors are read in place; compressed or sparse ones are decoded
/// into a temporary file that lives as long as the source. Digests are checked on open, since
/// the import reads raw bytes straight from the file.
pub struct ZtSource {
    tensors: Vec<SourceTensor>,
    configs: Vec<(String, Vec<u8>)>,
    /// Holds the decoded tensors; removed when the source is dropped.
    _decoded: Option<TempFile>,
}

impl ZtSource {
    pub fn open(path: &Path, component: &str) -> Result<ZtSource, Error> {
        if component.is_empty() || component.contains('/') {
            return Err(Error::Invalid {
                path: path.to_path_buf(),
                reason: format!("component name `{component}` must be non-empty and have no `/` (e.g. `transformer`)"),
            });
        }
        let zt = ZtFile::open(path)?;
        let mut decoded: Option<(TempFile, u64)> = None;
        let mut tensors = Vec::with_capacity(zt.len());
        for t in zt.tensors() {
            let (file, offset) = if let Some((offset, _)) = zt.raw_dense_range(t) {
                zt.copy_dense(&t.name, &mut std::io::sink())?;
                (path.to_path_buf(), offset)
            } else {
                let (tmp, end) = match &mut decoded {
                    Some(d) => d,
                    none => none.insert((
                        TempFile::in_temp_dir(".zimage-zt-decoded-").map_err(Error::io(path))?,
                        0,
                    )),
                };
                // Streamed: a sparse or compressed tensor is never whole in memory.
                {
                    let mut out = std::io::BufWriter::new(tmp.as_file_mut());
                    zt.copy_dense(&t.name, &mut out)?;
                    out.flush().map_err(Error::io(path))?;
                }
                let at = *end;
                *end += t.dense_len;
                (tmp.path().to_path_buf(), at)
            };
            tensors.push(SourceTensor {
                component: component.to_string(),
                name: t.name.clone(),
                dtype: t.dtype.safetensors(),
                shape: t.shape.clone(),
                file,
                offset,
                nbytes: t.dense_len,
                encoding: Default::default(),
                roll: 0,
            });
        }
        if let Some((tmp, _)) = &mut decoded {
            tmp.flush().map_err(Error::io(tmp.path()))?;
        }
        let mut configs = Vec::new();
        if !zt.attributes().is_empty() {
            let json = serde_json::to_vec_pretty(zt.attributes()).expect("string maps serialize");
            configs.push((format!("{component}/metadata.json"), json));
        }
        Ok(ZtSource {
            tensors,
            configs,
            _decoded: decoded.map(|(f, _)| f),
        })
    }
}

impl TensorSource for ZtSource {
    fn tensors(&self) -> Vec<SourceTensor> {
        self.tensors.clone()
    }
    fn config_files(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self.configs.clone())
    }
}
