//! `zimage create NAME --from FILE` for single model files: a safetensors file and a .zt file
//! import under one component, load back bit for bit, and keep the file's metadata.

mod common;

use common::zimage_in as zimage;
use std::path::Path;
use zimage::loader::{self, ReadPath};
use zimage::store::Store;

fn demo_vae() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/z-image-tiny/vae/diffusion_pytorch_model.safetensors")
}

/// Every tensor of the stored component equals the source file's, byte for byte.
fn assert_same_tensors(store: &Store, name: &str, component: &str, source: &Path) {
    let bytes = std::fs::read(source).unwrap();
    let header = zimage::safetensors::parse(&bytes).unwrap();
    let model = store.open(name).unwrap();
    let loaded = loader::load_component(store, &model, component, ReadPath::MlxLoader)
        .unwrap()
        .into_arrays()
        .unwrap();
    assert_eq!(loaded.len(), header.tensors.len());
    for t in &header.tensors {
        let start = (header.data_start() + t.data_offsets.0) as usize;
        let want = &bytes[start..start + t.nbytes() as usize];
        assert_eq!(loaded[&t.name].to_bytes().unwrap(), want, "{}", t.name);
    }
}

#[test]
fn a_safetensors_file_imports_under_its_component() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let out = zimage(
        &root,
        &[
            "create",
            "vae-only",
            "--from",
            demo_vae().to_str().unwrap(),
            "--component",
            "vae",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = Store::at(&root);
    assert_same_tensors(&store, "vae-only", "vae", &demo_vae());
    let model = store.open("vae-only").unwrap();
    let manifest = root.join("manifests/registry.ollama.ai/library/vae-only/latest");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&manifest).unwrap().permissions().mode() & 0o777,
        0o644,
        "manifests are readable by all, as Ollama writes them"
    );
    let meta = store
        .config_file(&model, "vae/metadata.json")
        .unwrap()
        .expect("the file's __metadata__ is kept");
    let meta: serde_json::Value = serde_json::from_slice(&meta).unwrap();
    assert_eq!(meta["__metadata__"]["format"], "pt");
    // The same tensors imported from the diffusers directory are the same blobs.
    let out = zimage(
        &root,
        &[
            "create",
            "tiny",
            "--from",
            demo_vae()
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .to_str()
                .unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("176 already present"), "{stdout}");
}

#[test]
fn a_ztensor_file_imports_and_loads_the_same_values() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let zt = dir.path().join("vae.zt");
    let out = zimage(
        &root,
        &[
            "convert",
            demo_vae().to_str().unwrap(),
            zt.to_str().unwrap(),
            "--compress",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = zimage(
        &root,
        &[
            "create",
            "vae-zt",
            "--from",
            zt.to_str().unwrap(),
            "--component",
            "vae",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same_tensors(&Store::at(&root), "vae-zt", "vae", &demo_vae());
}

#[test]
fn a_file_that_is_no_model_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let out = zimage(&root, &["create", "x", "--from", readme.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("README.md") && err.contains("--from"), "{err}");
    assert!(
        !root.join("manifests").exists(),
        "no manifest for a refused import"
    );
}
