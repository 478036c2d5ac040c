//! A parsed header: its tensors (with a name index) and its metadata.

use super::*;
use std::collections::{BTreeMap, HashMap};

/// One tensor entry of a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// `[begin, end)` relative to the start of the data area.
    pub data_offsets: (u64, u64),
}

impl TensorInfo {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
    pub fn nbytes(&self) -> u64 {
        self.data_offsets.1 - self.data_offsets.0
    }
}

/// A parsed and validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Tensors in the order the header lists them.
    pub tensors: Vec<TensorInfo>,
    /// `None` when `__metadata__` is absent or `null`.
    pub metadata: Option<BTreeMap<String, String>>,
    /// `N`, the JSON length including any padding.
    pub header_len: u64,
    /// Position of each tensor in `tensors`, built once at parsing so that a lookup by name does
    /// not scan a header of many tensors.
    pub(super) index: HashMap<String, usize>,
}

impl Header {
    /// File offset where the data area starts (`8 + N`).
    pub fn data_start(&self) -> u64 {
        LEN_PREFIX + self.header_len
    }
    /// Bytes in the data area.
    pub fn data_len(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.data_offsets.1)
            .max()
            .unwrap_or(0)
    }
    /// Total file size this header describes.
    pub fn file_len(&self) -> u64 {
        // Offsets come from the file: a sum past 64 bits is no file's length.
        self.data_start().saturating_add(self.data_len())
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let indexed = self.index.get(name).and_then(|&i| self.tensors.get(i));
        match indexed {
            Some(t) if t.name == name => Some(t),
            // `tensors` is public: when it no longer matches the index, it is searched.
            _ if self.index.len() != self.tensors.len() || indexed.is_some() => {
                self.tensors.iter().find(|t| t.name == name)
            }
            _ => None,
        }
    }
}
