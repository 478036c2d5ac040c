//! Where MLX's pieces are and how they are installed and linked: the build script's logic that
//! depends on the target OS, kept free of the `cc` crate so that a test on Linux can run it for
//! macOS (`tests/build_script.rs` installs the real macOS wheels and checks them with it).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The MLX release zimage is built against.
pub const MLX_VERSION: &str = "0.32.4";

/// The operating systems zimage builds for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Os {
    Linux,
    MacOs,
}

impl Os {
    /// The OS cargo names in `CARGO_CFG_TARGET_OS`.
    pub fn from_target(name: &str) -> Result<Os, String> {
        match name {
            "linux" => Ok(Os::Linux),
            "macos" => Ok(Os::MacOs),
            other => Err(format!(
                "unsupported target OS `{other}`: zimage builds on Linux and macOS"
            )),
        }
    }

    /// The file name of libmlx on this OS.
    pub fn libmlx(self) -> &'static str {
        match self {
            Os::Linux => "libmlx.so",
            Os::MacOs => "libmlx.dylib",
        }
    }
}

/// The PyPI package that carries libmlx for `variant`.
pub fn backend_package(variant: &str) -> &'static str {
    match variant {
        "metal" => "mlx-metal",
        "cuda12" => "mlx-cuda-12",
        "cuda13" => "mlx-cuda-13",
        _ => "mlx-cpu",
    }
}

/// The pinned wheels that make an MLX tree for `variant`: the headers (`mlx`) and libmlx.
pub fn wheels(variant: &str) -> [String; 2] {
    [
        format!("mlx=={MLX_VERSION}"),
        format!("{}=={MLX_VERSION}", backend_package(variant)),
    ]
}

/// Checks that `root` (a folder with `include/` and `lib/`) is an MLX the program can build and
/// run against on `os`: the headers, libmlx, and on Metal the kernel library that MLX loads from
/// beside libmlx at run time (without it every GPU operation fails on the user's machine).
pub fn check_layout(root: &Path, os: Os, variant: &str) -> Result<(), String> {
    let mut wanted = vec![
        root.join("include/mlx/mlx.h"),
        root.join("lib").join(os.libmlx()),
    ];
    if variant == "metal" {
        wanted.push(root.join("lib/mlx.metallib"));
    }
    match wanted.iter().find(|p| !p.is_file()) {
        None => Ok(()),
        Some(missing) => Err(format!(
            "{} is missing from the MLX at {}; point MLX_DIR at a complete MLX install{}",
            missing.display(),
            root.display(),
            if variant == "metal" {
                " (MLX on Metal loads its kernels from mlx.metallib beside libmlx.dylib)"
            } else {
                ""
            }
        )),
    }
}

/// MLX's version as its headers state it (`include/mlx/version.h`).
pub fn header_version(include: &Path) -> Result<String, String> {
    let path = include.join("mlx/version.h");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let part = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("#define MLX_VERSION_{name} ")))
            .map(|v| v.trim().to_string())
            .ok_or_else(|| format!("{} has no MLX_VERSION_{name}", path.display()))
    };
    Ok(format!(
        "{}.{}.{}",
        part("MAJOR")?,
        part("MINOR")?,
        part("PATCH")?
    ))
}

/// The cargo lines that link the program to libmlx in `lib` and let it find libmlx there at run
/// time. libmlx names itself `@rpath/libmlx.dylib` on macOS and by its soname on Linux: an rpath
/// to `lib` serves both linkers (`-rpath` is spelled the same for Apple's `ld` and GNU's).
pub fn link_lines(os: Os, lib: &Path) -> Vec<String> {
    let mut lines = vec![
        format!("cargo:rustc-link-search=native={}", lib.display()),
        "cargo:rustc-link-lib=dylib=mlx".to_string(),
        format!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display()),
    ];
    if os == Os::Linux {
        lines.push("cargo:rustc-link-lib=dylib=dl".to_string());
    }
    lines
}

/// A wheel platform to install for instead of this machine's (`pip --platform`), with the
/// Python version whose wheels to take.
pub struct ForPlatform<'a> {
    pub platform: &'a str,
    pub python_version: &'a str,
}

/// The Python that installs wheels: `$PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// zimage's cache folder for the build: `$ZIMAGE_CACHE_DIR`, else `$XDG_CACHE_HOME/zimage`, else
/// `~/.cache/zimage`.
pub fn cache_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("ZIMAGE_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Ok(dir) = std::env::var("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("zimage"));
    }
    match std::env::var("HOME") {
        Ok(home) => Ok(PathBuf::from(home).join(".cache/zimage")),
        Err(_) => {
            Err("cannot place the MLX cache: set ZIMAGE_CACHE_DIR (or HOME), or MLX_DIR".into())
        }
    }
}

/// Installs `packages` with pip into `target` unless it is already there, then lets `more` add
/// to the same tree. The install goes to a temporary sibling first and is renamed into place, so
/// an interrupted build never leaves a half-installed tree that a later build would trust.
pub fn pip_install_once(
    target: &Path,
    packages: &[String],
    for_platform: Option<&ForPlatform>,
    more: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(), String> {
    if target.join(".complete").is_file() {
        return Ok(());
    }
    let parent = target.parent().ok_or("cache directory has no parent")?;
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let tmp = parent.join(format!(
        ".{}.tmp-{}",
        target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("install"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let installed = pip_install(&tmp, packages, false, for_platform).and_then(|()| more(&tmp));
    if let Err(e) = installed {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    std::fs::write(tmp.join(".complete"), packages.join("\n")).map_err(|e| e.to_string())?;
    if target.exists() && !target.join(".complete").is_file() {
        // An incomplete tree from an older build.
        let _ = std::fs::remove_dir_all(target);
    }
    match std::fs::rename(&tmp, target) {
        Ok(()) => Ok(()),
        // Another build finished the same install first: use theirs.
        Err(_) if target.join(".complete").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(())
        }
        Err(e) => Err(format!("cannot move {} into place: {e}", tmp.display())),
    }
}

/// One `pip install --target`: `packages` alone, or with what they depend on; for this
/// machine, or for `for_platform`'s (binary wheels only, as pip requires).
pub fn pip_install(
    target: &Path,
    packages: &[String],
    with_deps: bool,
    for_platform: Option<&ForPlatform>,
) -> Result<(), String> {
    let mut cmd = Command::new(python());
    cmd.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-compile",
    ]);
    if !with_deps {
        cmd.arg("--no-deps");
    }
    if let Some(p) = for_platform {
        cmd.args(["--only-binary=:all:", "--platform", p.platform])
            .args(["--python-version", p.python_version]);
    }
    let status = cmd
        .arg("--target")
        .arg(target)
        .args(packages)
        .status()
        .map_err(|e| {
            format!(
                "cannot run `{} -m pip` ({e}); install Python 3 with pip, or set MLX_DIR",
                python()
            )
        })?;
    if !status.success() {
        return Err(format!(
            "`pip install {}` failed; check network access to PyPI, or set MLX_DIR to an MLX install",
            packages.join(" ")
        ));
    }
    Ok(())
}
