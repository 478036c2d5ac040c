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

/// The held-out model in `tmp`: the demo's text encoder, tokenizer and scheduler with the
/// held-out transformer and VAE (`models/z-image-heldout`).
pub fn heldout_dir(tmp: &Path) -> std::path::PathBuf {
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let dir = tmp.join("heldout");
    copy_model(&models.join("z-image-tiny"), &dir);
    for c in ["transformer", "vae"] {
        std::fs::remove_dir_all(dir.join(c)).unwrap();
        copy_model(&models.join("z-image-heldout").join(c), &dir.join(c));
    }
    dir
}

/// Installs Debian `packages` with apt unless every file of `needed` exists; fails (naming
/// `what` needs them), never skips.
pub fn apt_install(packages: &[&str], needed: &[&str], what: &str) {
    if needed.iter().all(|p| Path::new(p).exists()) {
        return;
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        assert!(
            install(),
            "cannot install {} with apt-get; {what} needs them",
            packages.join(" and ")
        );
    }
}

/// Where the tests keep what they install (Python venvs): `ZIMAGE_TEST_CACHE`, else
/// `~/.cache/zimage-tests`.
pub fn test_cache() -> std::path::PathBuf {
    std::env::var_os("ZIMAGE_TEST_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME or ZIMAGE_TEST_CACHE"))
                .join(".cache/zimage-tests")
        })
}

/// A Python with the packages the tests drive (the official `ollama` and `openai` clients, and
/// `webuiapi`, an AUTOMATIC1111 client), in a venv made once under the test cache and reused.
pub fn test_python() -> std::path::PathBuf {
    let cache = test_cache();
    let venv = cache.join("venv");
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import ollama, openai, webuiapi"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        std::fs::create_dir_all(&cache).unwrap();
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 is needed to run these tests");
        assert!(made.success(), "cannot create a venv at {}", venv.display());
        let installed = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "ollama==0.6.*",
                "openai",
                "webuiapi==0.9.17",
            ])
            .status()
            .unwrap();
        assert!(
            installed.success(),
            "pip could not install ollama, openai and webuiapi"
        );
    }
    python
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
pub mod browser;
pub mod controlnet;
pub mod ggml;
pub mod hub;
pub mod klein;
pub mod registry;
pub mod server;

/// The share of equal bytes and the largest difference between two pictures' bytes.
pub fn compare_pixels(ours: &[u8], theirs: &[u8]) -> (f64, u8) {
    assert_eq!(ours.len(), theirs.len(), "the pictures differ in size");
    let same = ours.iter().zip(theirs).filter(|(a, b)| a == b).count();
    let worst = ours.iter().zip(theirs).map(|(a, b)| a.abs_diff(*b)).max();
    (same as f64 / ours.len() as f64, worst.unwrap_or(0))
}

/// The picture a klein reference run made (`models/reference/klein-{case}.safetensors`).
pub fn klein_reference_image(case: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("models/reference/klein-{case}.safetensors"));
    let st = zimage::mlx::io::load_safetensors(&path).unwrap();
    st.tensors["image"].to_vec::<u8>().unwrap()
}

/// The output of `child` once it ends; if it is still running after `limit`, it is killed and
/// `hung` is called (which panics with what hung), so a test that would block fails instead.
pub fn output_within(
    mut child: std::process::Child,
    limit: std::time::Duration,
    hung: impl Fn(),
) -> std::process::Output {
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            hung();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
