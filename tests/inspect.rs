//! `zimage inspect` on every kind of target it describes, through the JSON report.

mod common;

use common::zimage_in as zimage;
use serde_json::Value;
use std::path::Path;

fn report(store: &Path, target: &str, extra: &[&str]) -> Value {
    let mut args = vec!["inspect", target, "--json"];
    args.extend_from_slice(extra);
    let out = zimage(store, &args);
    assert!(
        out.status.success(),
        "inspect {target}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

const VAE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/models/z-image-tiny/vae/diffusion_pytorch_model.safetensors"
);

#[test]
fn model_files_containers_blobs_and_stored_models() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let st = report(&store, VAE, &[]);
    assert_eq!(st["format"], "safetensors");
    assert_eq!(st["tensor_count"], 176);
    assert_eq!(st["metadata"]["format"], "pt");
    let conv_in = st["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "decoder.conv_in.weight")
        .unwrap();
    assert_eq!(
        (conv_in["dtype"].as_str(), conv_in["byte_length"].as_u64()),
        (Some("bf16"), Some(64 * 16 * 9 * 2))
    );

    let zt = dir.path().join("vae.zt");
    assert!(zimage(
        &store,
        &["convert", VAE, zt.to_str().unwrap(), "--compress"]
    )
    .status
    .success());
    let z = report(&store, zt.to_str().unwrap(), &[]);
    assert_eq!(z["format"], "zTensor 1.0");
    assert_eq!(
        z["tensors"], st["tensors"],
        "a .zt lists the tensors of its source"
    );
    assert_eq!(z["components"]["dense data zstd crc32c"], 176);

    let dfsn = dir.path().join("vae.dfsn");
    let meta = dir.path().join("meta.json");
    std::fs::write(&meta, r#"{"name":"tiny vae"}"#).unwrap();
    let out = zimage(
        &store,
        &[
            "dfsn",
            "pack",
            VAE,
            "--meta",
            meta.to_str().unwrap(),
            "-o",
            dfsn.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = report(&store, dfsn.to_str().unwrap(), &[]);
    assert_eq!(d["format"], "DFSN container");
    assert_eq!(d["model_type"], "safetensors");
    assert_eq!(d["container_metadata"]["name"], "tiny vae");
    assert_eq!(d["model_offset"], 0x200100);
    assert_eq!(d["tensors"], st["tensors"]);

    let out = zimage(
        &store,
        &[
            "create",
            "vae",
            "--from",
            dfsn.to_str().unwrap(),
            "--component",
            "vae",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = report(&store, "vae", &["--component", "vae"]);
    assert_eq!(m["format"], "stored model (manifest and per-tensor blobs)");
    assert_eq!(m["tensors"], st["tensors"]);
    let manifest = zimage::store::Store::at(&store)
        .open("vae")
        .unwrap()
        .manifest;
    let blob = store.join("blobs").join(
        manifest
            .tensor_layers()
            .next()
            .unwrap()
            .digest
            .replace(':', "-"),
    );
    let b = report(&store, blob.to_str().unwrap(), &[]);
    assert_eq!(b["format"], "store blob: one tensor keyed `data`");
    assert_eq!(b["data_offset"].as_u64().unwrap() % 8, 0);
}

#[test]
fn generated_png_metadata_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let png = dir.path().join("fox.png");
    let out = zimage(
        &store,
        &[
            "generate",
            "a red fox, in the snow",
            "--width",
            "64",
            "--height",
            "48",
            "--steps",
            "2",
            "-o",
            png.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&store, png.to_str().unwrap(), &[]);
    assert_eq!(r["format"], "PNG image");
    // Written atomically through a temp file, yet readable by all like any written file.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&png).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let chunks = r["text"]
        .as_array()
        .expect("the text chunks, in file order");
    let params = chunks
        .iter()
        .find(|c| c["key"] == "parameters")
        .expect("a parameters chunk");
    assert_eq!(params["prompt"], "a red fox, in the snow");
    assert_eq!(params["parameters"]["Steps"], "2");
    assert_eq!(params["parameters"]["Size"], "64x48");
    let ours = chunks
        .iter()
        .find(|c| c["key"] == "zimage")
        .expect("a zimage chunk");
    assert_eq!(ours["json"]["request"]["steps"], 2);
}

#[test]
fn what_cannot_be_inspected_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let out = zimage(&store, &["inspect", readme]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("README.md"));
    let out = zimage(&store, &["inspect", "no-such-model"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-model"));
}
