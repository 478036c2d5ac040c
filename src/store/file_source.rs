//! A single safetensors file as an import source: every tensor goes under one component
//! (`zimage create NAME --from model.safetensors --component transformer`). The file may sit
//! inside a container at an offset, as the model of a DFSN container does.

use super::{SourceTensor, StoreError, TensorSource};
use crate::files::FileError;
use crate::safetensors;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// One safetensors file (or one inside a container) whose tensors all import as one component.
#[derive(Debug, Clone)]
pub struct SafetensorsFile {
    /// The file.
    pub path: PathBuf,
    /// The component its tensors go under (`transformer`).
    pub component: String,
    /// Where the safetensors bytes start in `path`.
    pub offset: u64,
    /// Its header, read and checked by [`SafetensorsFile::open`].
    pub header: safetensors::Header,
    /// Extra JSON to store as `<component>/metadata.json` (the container's metadata, say).
    pub extra_metadata: Option<serde_json::Value>,
}

impl SafetensorsFile {
    /// Reads and validates the header of the safetensors bytes at `offset..offset + len`.
    pub fn open(
        path: &Path,
        offset: u64,
        len: u64,
        component: &str,
    ) -> Result<SafetensorsFile, StoreError> {
        let io = FileError::io(path);
        let mut file = std::fs::File::open(path).map_err(&io)?;
        file.seek(SeekFrom::Start(offset)).map_err(&io)?;
        let header = safetensors::read_header(&mut Read::by_ref(&mut file).take(len), len)
            .map_err(|e| e.in_file(path))?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            component: component.to_string(),
            offset,
            header,
            extra_metadata: None,
        })
    }
}

impl TensorSource for SafetensorsFile {
    fn tensors(&self) -> Vec<SourceTensor> {
        let data = self.offset + self.header.data_start();
        self.header
            .tensors
            .iter()
            .map(|t| SourceTensor {
                component: self.component.clone(),
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                file: self.path.clone(),
                offset: data + t.data_offsets.0,
                nbytes: t.nbytes(),
                encoding: Default::default(),
                roll: 0,
            })
            .collect()
    }

    /// The file's `__metadata__` (and any extra metadata) as `<component>/metadata.json`, so
    /// that nothing the file said is lost on import.
    fn config_files(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut meta = serde_json::Map::new();
        if let Some(m) = &self.header.metadata {
            meta.insert(
                "__metadata__".into(),
                serde_json::to_value(m).expect("string maps serialize"),
            );
        }
        if let Some(extra) = &self.extra_metadata {
            meta.insert("container".into(), extra.clone());
        }
        if meta.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = serde_json::to_vec_pretty(&meta).expect("JSON values serialize");
        Ok(vec![(format!("{}/metadata.json", self.component), bytes)])
    }
}
