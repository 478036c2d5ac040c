//! Helpers shared by the integration tests.

// Each test crate compiles this module and uses its own subset.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use zimage::safetensors::{self, Dtype, TensorSpec};

/// Runs the `zimage` binary with `args`.
pub fn zimage(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zimage"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs the `zimage` binary against the store at `store`.
pub fn zimage_in(store: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zimage"))
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .unwrap()
}

/// Copies a model's configs and links its weights (configs must lie inside the model).
pub fn copy_model(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_model(&path, &dest);
        } else if path.extension().is_some_and(|e| e == "safetensors") {
            std::os::unix::fs::symlink(&path, &dest).unwrap();
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}

/// A path as an argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Writes a safetensors file of `(name, dtype, shape, bytes)` with our writer.
pub fn write_safetensors(path: &Path, tensors: &[(&str, Dtype, Vec<u64>, Vec<u8>)]) {
    write_safetensors_with_metadata(path, tensors, None)
}

/// The same, with a `__metadata__` map.
pub fn write_safetensors_with_metadata(
    path: &Path,
    tensors: &[(&str, Dtype, Vec<u64>, Vec<u8>)],
    meta: Option<&BTreeMap<String, String>>,
) {
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(n, d, s, _)| TensorSpec {
            name: n.to_string(),
            dtype: *d,
            shape: s.clone(),
        })
        .collect();
    let mut bytes = safetensors::header_bytes(&specs, meta, 8).unwrap();
    for (_, _, _, data) in tensors {
        bytes.extend_from_slice(data);
    }
    std::fs::write(path, bytes).unwrap();
}
pub mod controlnet;
