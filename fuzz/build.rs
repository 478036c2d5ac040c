//! The main crate's build script sets the rpath to libmlx (and OpenBLAS) for its own binaries
//! only: cargo does not pass link arguments on to dependents. This finds the same libraries —
//! `MLX_DIR`, else the pinned version in zimage's cache folder, else an MLX installed for
//! `python3` — and sets the fuzz targets' rpath, so they start without `LD_LIBRARY_PATH`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    for var in ["MLX_DIR", "ZIMAGE_CACHE_DIR", "XDG_CACHE_HOME", "HOME"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=../build.rs");
    for dir in library_dirs() {
        if dir.is_dir() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
}

fn library_dirs() -> Vec<PathBuf> {
    if let Some(dir) = env::var_os("MLX_DIR") {
        return vec![PathBuf::from(dir).join("lib")];
    }
    let mut dirs = Vec::new();
    let pinned = std::fs::read_to_string("../build.rs")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("const MLX_VERSION: &str = \""))
                .and_then(|v| v.split('"').next().map(String::from))
        })
        .unwrap_or_default();
    let cache = env::var_os("ZIMAGE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("zimage")))
        .or_else(|| env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/zimage")));
    if let Some(entries) = cache.and_then(|c| std::fs::read_dir(c).ok()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !pinned.is_empty() && name.starts_with(&format!("mlx-{pinned}-")) {
                dirs.push(e.path().join("mlx/lib"));
            } else if name.starts_with("scipy-openblas32-") {
                dirs.push(e.path().join("scipy_openblas32/lib"));
            }
        }
    }
    let python = Command::new(env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .args(["-c", "import mlx, os; print(os.path.dirname(mlx.__file__))"])
        .output();
    if let Some(out) = python.ok().filter(|o| o.status.success()) {
        dirs.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("lib"));
    }
    dirs
}
