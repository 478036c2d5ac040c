//! How the store tells Ollama's blob generations apart from a blob's bytes: `verify` (layer
//! against header), `summarize` (main tensor and companions) and `load_component` (v1 `data`,
//! v1 quantized `_scale`/`_qbias` layers, v2 named, v2 quantized `.scale`/`.bias` with
//! `__metadata__`), on a one-model store built from the input.
//!
//! Input: one mode byte, then up to three blobs separated by `@@BLOB@@`, given in turn to the
//! layers the mode names (cycling when there are fewer blobs than layers).
//! - bits 0-1: the layers of component `c`: `w`; `w`, `w_scale`, `w_qbias` (v1 quantized);
//!   `w`, `w_scale` (a scale without its bias); `w_qbias` alone;
//! - bit 2: layers state the dtype and shape of their blob's first tensor, as we write them;
//! - bit 3: read through a memory map instead of MLX's loader.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::loader::{self, ReadPath};
use zimage::store::manifest::{self, Layer, Manifest, TENSOR_MEDIA_TYPE};
use zimage::store::{ModelName, Store};

const SEPARATOR: &[u8] = b"@@BLOB@@";

fn split(mut rest: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while out.len() < 2 {
        let Some(at) = rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) else {
            break;
        };
        out.push(&rest[..at]);
        rest = &rest[at + SEPARATOR.len()..];
    }
    out.push(rest);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let blobs = split(rest);
    let names: &[&str] = match mode & 3 {
        0 => &["w"],
        1 => &["w", "w_scale", "w_qbias"],
        2 => &["w", "w_scale"],
        _ => &["w_qbias"],
    };
    let declare = mode & 4 != 0;
    let read_path = if mode & 8 != 0 {
        ReadPath::Mmap
    } else {
        ReadPath::MlxLoader
    };

    let root = zimage_fuzz::fresh_store();
    let config = manifest::config_blob("bf16");
    let config = Layer {
        media_type: manifest::CONFIG_MEDIA_TYPE.into(),
        digest: zimage_fuzz::put_blob(&root, &config),
        size: config.len() as u64,
        from: None,
        name: None,
        dtype: None,
        shape: None,
    };
    let layers = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let bytes = blobs[i % blobs.len()];
            let first = zimage::safetensors::parse(bytes)
                .ok()
                .and_then(|h| h.tensors.into_iter().next())
                .filter(|_| declare);
            Layer {
                media_type: TENSOR_MEDIA_TYPE.into(),
                digest: zimage_fuzz::put_blob(&root, bytes),
                size: bytes.len() as u64,
                from: None,
                name: Some(format!("c/{name}")),
                dtype: first.as_ref().map(|t| t.dtype.name().to_string()),
                shape: first.map(|t| t.shape),
            }
        })
        .collect();
    let m = Manifest::new(config, layers);
    zimage_fuzz::put_manifest(&root, &m.to_bytes());

    let store = Store::at(&root);
    let model = store.open("m").expect("the manifest we wrote opens");
    assert_eq!(model.name, ModelName::parse("m").unwrap());
    let _ = store.verify("m");
    let _ = zimage::store::summarize(&store, &model);
    let _ = loader::tensor_sizes(&model, "c");
    let Ok(loaded) = loader::load_component(&store, &model, "c", read_path) else {
        return;
    };
    if loaded.eval().is_err() {
        return;
    }
    if let Ok(arrays) = loaded.into_arrays() {
        let all: Vec<_> = arrays.values().collect();
        let _ = zimage::mlx::eval(&all);
    }
});
