//! Finds MLX, compiles `mlx-sys-shim/`, links `libmlx` and sets the rpath.
//!
//! Where MLX comes from, in order:
//! 1. `MLX_DIR`: a directory with `include/` and `lib/` (a source build, a Homebrew prefix, …);
//! 2. an MLX already installed for `python3` (`python3 -m mlx --cmake-dir`), when its backend
//!    is the variant asked for (an MLX for the CPU never stands in for a CUDA build);
//! 3. the pinned PyPI wheels, installed with pip into a cache directory that zimage owns
//!    (`$ZIMAGE_CACHE_DIR`, else `$XDG_CACHE_HOME/zimage`, else `~/.cache/zimage`), never into the
//!    user's site-packages: `mlx` + `mlx-cpu` on Linux, `mlx-metal` on macOS, `mlx-cuda-12` with
//!    `ZIMAGE_MLX_VARIANT=cuda` (`cuda13` picks `mlx-cuda-13`). A CUDA wheel's own requirements
//!    (cuBLAS, cuDNN, NCCL, NVRTC, cuFFT, cuSOLVER and the CUDA runtime, as its METADATA lists
//!    them) go into the same directory, where libmlx's RPATH (`$ORIGIN/../../nvidia/…`) finds
//!    them: the build needs nothing of CUDA's but the driver at run time.
//!
//! The CUDA variants do not link libmlx into the program: the shim and libmlx become one shared
//! library that the program opens at start (`src/mlx/runtime.rs`), so that a machine without the
//! NVIDIA driver gets a one-line message instead of the dynamic loader's.
//!
//! On Linux's CPU backend the wheel's bundled reference BLAS is replaced by OpenBLAS (the
//! `scipy-openblas32` wheel, installed the same way) unless `ZIMAGE_BLAS=reference`.
//!
//! `ZIMAGE_CHECK_ONLY=1` is for checking a target this machine cannot link for (macOS from
//! Linux, with `cargo clippy --target aarch64-apple-darwin`): nothing is installed or linked,
//! MLX's headers come from an MLX already here, and the shim is compiled with clang for the
//! target's processor, warnings as errors, as Apple's compiler (a clang) would see it.

#[path = "build/mlx_install.rs"]
mod mlx_install;

use mlx_install::{backend_package, cache_dir, header_version, pip_install, pip_install_once};
use mlx_install::{python, Os, MLX_VERSION};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const OPENBLAS_WHEEL: &str = "scipy-openblas32==0.3.34.481.3";
/// The shim's sources; every one is compiled, the headers are watched.
const SHIM_SOURCES: &[&str] = &[
    "mlx-sys-shim/shim.h",
    "mlx-sys-shim/shim.cpp",
    "mlx-sys-shim/cpu_kernels.h",
    "mlx-sys-shim/cpu_common.h",
    "mlx-sys-shim/cpu_common.cpp",
    "mlx-sys-shim/cpu_norms.cpp",
    "mlx-sys-shim/cpu_attention.cpp",
    "mlx-sys-shim/cpu_conv.cpp",
    "mlx-sys-shim/cpu_linear.cpp",
    "mlx-sys-shim/cpu_panels.cpp",
];
/// The shared library the CUDA variants open at start: the shim linked against libmlx.
const RUNTIME_LIB: &str = "libzimage_mlx.so";

fn main() {
    for var in [
        "MLX_DIR",
        "ZIMAGE_MLX_VARIANT",
        "ZIMAGE_CACHE_DIR",
        "XDG_CACHE_HOME",
        "ZIMAGE_BLAS",
        "PYTHON",
        "CI",
        "ZIMAGE_CHECK_ONLY",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    for file in SHIM_SOURCES.iter().chain(&["mlx-sys-shim/blas.c"]) {
        println!("cargo:rerun-if-changed={file}");
    }
    if let Err(msg) = run().and_then(|()| embed_demo_model()) {
        eprintln!("\nzimage build: {msg}\n");
        panic!("zimage build: {msg}");
    }
}

/// Lists the demo model's files for `include_bytes!` (`$OUT_DIR/demo_files.rs`), so that the
/// binary carries the model wherever it is installed.
fn embed_demo_model() -> Result<(), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            if path.is_dir() {
                println!("cargo:rerun-if-changed={}", path.display());
                stack.push(path);
            } else {
                let rel = path.strip_prefix(&root).expect("below the root");
                files.push((rel.to_string_lossy().replace('\\', "/"), path));
            }
        }
    }
    files.sort();
    let mut out = String::from("/// The demo model's files: (path in the model, bytes).\n");
    out.push_str("pub const DEMO_FILES: &[(&str, &[u8])] = &[\n");
    for (rel, path) in &files {
        out.push_str(&format!(
            "    ({rel:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    out.push_str("];\n");
    let dest =
        PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?).join("demo_files.rs");
    std::fs::write(&dest, out).map_err(|e| format!("{}: {e}", dest.display()))
}

fn run() -> Result<(), String> {
    let os = match env::var("CARGO_CFG_TARGET_OS") {
        Ok(name) => Os::from_target(&name)?,
        Err(_) => return Err("CARGO_CFG_TARGET_OS is not set; run the build through cargo".into()),
    };
    println!("cargo:rustc-check-cfg=cfg(zimage_dlopen)");
    if env::var("ZIMAGE_CHECK_ONLY").is_ok_and(|v| !v.is_empty() && v != "0") {
        return check_only(os);
    }
    let variant = variant(os)?;
    let (root, source) = find_mlx(&variant)?;
    mlx_install::check_layout(&root, os, &variant).map_err(|e| format!("{e} ({source})"))?;
    let include = root.join("include");
    let lib = root.join("lib");

    let openblas = if os == Os::Linux
        && variant == "cpu"
        && env::var("ZIMAGE_BLAS").as_deref() != Ok("reference")
    {
        Some(find_openblas()?)
    } else {
        None
    };

    // CI builds treat the shim's warnings as errors; local builds only show them.
    let strict = env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    let (shim, mut blas) = shim_builds(&include, strict);
    if openblas.is_some() {
        blas.define("ZIMAGE_OPENBLAS", None);
    }

    if variant.starts_with("cuda") {
        // libmlx needs the driver's libcuda.so.1 to load at all: the program opens it (with the
        // shim) at start instead of linking it, and says so when the driver is missing.
        let mut objects = shim.compile_intermediates();
        objects.extend(blas.compile_intermediates());
        let runtime = link_runtime_library(&objects, &lib)?;
        println!("cargo:rustc-cfg=zimage_dlopen");
        println!("cargo:rustc-env=ZIMAGE_RUNTIME_LIB={}", runtime.display());
    } else {
        shim.compile("mlxs_shim");
        link_blas(&blas, openblas.as_deref(), os);
        for line in mlx_install::link_lines(os, &lib) {
            println!("{line}");
        }
        if let Some(dir) = &openblas {
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-lib=dylib=scipy_openblas");
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
            for sym in ["cblas_sgemm", "cblas_dgemm", "cblas_cgemm"] {
                println!("cargo:rustc-link-arg=-Wl,--export-dynamic-symbol={sym}");
            }
        }
    }
    describe_mlx(&lib, &variant, &include, &source)
}

/// The shim's two builds (its C++, and the C of its BLAS forwarders), configured alike for the
/// program and for [`check_only`].
fn shim_builds(include: &Path, strict: bool) -> (cc::Build, cc::Build) {
    let mut shim = cc::Build::new();
    shim.cpp(true)
        .std("c++20")
        .files(SHIM_SOURCES.iter().filter(|f| f.ends_with(".cpp")))
        // The kernels are meant to be vectorised, whatever the profile; with trapping maths
        // the compiler keeps their clamps as branches.
        .opt_level(3)
        .flag_if_supported("-fno-trapping-math")
        // MLX's headers as system headers: their warnings (unused parameters in inline virtual
        // defaults) are not ours to fix, and must not fail a strict build.
        .flag(format!("-isystem{}", include.display()))
        .include("mlx-sys-shim")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(strict);
    let mut blas = cc::Build::new();
    blas.file("mlx-sys-shim/blas.c")
        .include("mlx-sys-shim")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(strict);
    (shim, blas)
}

/// What the program says of the MLX it was built with (`zimage version`).
fn describe_mlx(lib: &Path, variant: &str, include: &Path, source: &str) -> Result<(), String> {
    println!("cargo:rustc-env=ZIMAGE_MLX_LIB_DIR={}", lib.display());
    println!("cargo:rustc-env=ZIMAGE_MLX_VARIANT={variant}");
    println!(
        "cargo:rustc-env=ZIMAGE_MLX_HEADER_VERSION={}",
        header_version(include)?
    );
    println!("cargo:rustc-env=ZIMAGE_MLX_SOURCE={source}");
    Ok(())
}

/// `ZIMAGE_CHECK_ONLY`: the Rust code is only type-checked, so nothing is installed or linked.
/// The shim is compiled, not linked, by clang for the target's processor with the Linux
/// headers of that processor (Debian's cross packages): the same compiler family and
/// architecture as a Mac's build, warnings as errors.
fn check_only(os: Os) -> Result<(), String> {
    let variant = variant(os)?;
    let root = installed_headers().ok_or(
        "ZIMAGE_CHECK_ONLY: no MLX headers here; build once for this machine first (`cargo \
         build`, which installs MLX), or set MLX_DIR",
    )?;
    let include = root.join("include");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").map_err(|e| e.to_string())?;
    let host = env::var("HOST").map_err(|e| e.to_string())?;
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?).join("shim-check");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    // A Linux triple for the target's processor: clang then takes the C and C++ headers of
    // Debian's cross packages, where an Apple triple would want Apple's SDK.
    let triple = format!("{arch}-unknown-linux-gnu");
    let (mut shim, mut blas) = shim_builds(&include, true);
    for (build, compiler) in [(&mut shim, "clang++"), (&mut blas, "clang")] {
        build
            .compiler(compiler)
            .target(&triple)
            .host(&host)
            .debug(false)
            .cargo_metadata(false)
            .out_dir(&out);
        build.try_compile_intermediates().map_err(|e| {
            format!(
                "ZIMAGE_CHECK_ONLY: compiling the shim with {compiler} for {triple} failed: {e}\n\
                 (it needs clang and the {arch} cross headers: on Debian `apt-get install clang \
                 libstdc++-12-dev-arm64-cross libc6-dev-arm64-cross`)"
            )
        })?;
    }
    describe_mlx(
        &root.join("lib"),
        &variant,
        &include,
        "headers only (ZIMAGE_CHECK_ONLY: type-checked, not linked)",
    )
}

/// An MLX whose headers are already on this machine, without installing one: `MLX_DIR`, else a
/// tree of the pinned version that an earlier build installed into the cache, any variant.
fn installed_headers() -> Option<PathBuf> {
    if let Ok(dir) = env::var("MLX_DIR") {
        return Some(PathBuf::from(dir));
    }
    let cache = cache_dir().ok()?;
    let prefix = format!("mlx-{MLX_VERSION}-");
    let mut trees: Vec<PathBuf> = std::fs::read_dir(&cache)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path().join("mlx"))
        .filter(|root| root.join("include/mlx/mlx.h").is_file())
        .collect();
    trees.sort();
    trees.into_iter().next()
}

/// Links the BLAS forwarders as a plain object, so the linker always keeps them even though
/// nothing in the program calls them directly: libmlx does, through the dynamic linker.
fn link_blas(blas: &cc::Build, openblas: Option<&Path>, os: Os) {
    for obj in blas.compile_intermediates() {
        println!("cargo:rustc-link-arg={}", obj.display());
    }
    // The object goes into every binary, those that never use the library crate too (and so
    // never get its link-lib lines): what it calls must come with it.
    if let Some(dir) = openblas {
        println!("cargo:rustc-link-arg=-L{}", dir.display());
        println!("cargo:rustc-link-arg=-lscipy_openblas");
    }
    if os == Os::Linux {
        println!("cargo:rustc-link-arg=-ldl");
    }
}

/// Links the shim's objects and libmlx into `$OUT_DIR/libzimage_mlx.so`, which finds libmlx by
/// an absolute RPATH (and libmlx its CUDA libraries by its own).
fn link_runtime_library(objects: &[PathBuf], lib: &Path) -> Result<PathBuf, String> {
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let dest = out.join(RUNTIME_LIB);
    let compiler = cc::Build::new().cpp(true).get_compiler();
    let mut cmd = compiler.to_command();
    cmd.arg("-shared")
        .arg(format!("-Wl,-soname,{RUNTIME_LIB}"))
        // Every symbol the shim uses must resolve now, not when a user first calls it.
        .arg("-Wl,--no-undefined")
        .arg("-o")
        .arg(&dest)
        .args(objects)
        .arg(format!("-L{}", lib.display()))
        .arg("-lmlx")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-ldl");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run the C++ linker ({e})"))?;
    if !status.success() {
        return Err(format!("linking {} failed", dest.display()));
    }
    Ok(dest)
}

fn variant(os: Os) -> Result<String, String> {
    match (os, env::var("ZIMAGE_MLX_VARIANT").ok().as_deref()) {
        (Os::MacOs, None | Some("metal")) => Ok("metal".into()),
        (Os::Linux, None | Some("cpu")) => Ok("cpu".into()),
        (Os::Linux, Some("cuda") | Some("cuda12")) => Ok("cuda12".into()),
        (Os::Linux, Some("cuda13")) => Ok("cuda13".into()),
        (_, Some(other)) => Err(format!(
            "ZIMAGE_MLX_VARIANT=`{other}` is not available on this OS; use `cpu`, `cuda` or `cuda13` on Linux, `metal` on macOS"
        )),
    }
}

fn find_mlx(variant: &str) -> Result<(PathBuf, String), String> {
    if let Ok(dir) = env::var("MLX_DIR") {
        let dir = PathBuf::from(dir);
        if !dir.join("lib").is_dir() || !dir.join("include").is_dir() {
            return Err(format!(
                "MLX_DIR={} must contain include/ and lib/",
                dir.display()
            ));
        }
        return Ok((dir, "MLX_DIR".into()));
    }
    if let Some(root) = python_mlx(variant) {
        return Ok((root, "python3's installed mlx".into()));
    }
    let target = cache_dir()?.join(format!("mlx-{MLX_VERSION}-{variant}"));
    let backend = backend_package(variant);
    let wheels = mlx_install::wheels(variant);
    if variant.starts_with("cuda") {
        // A cache from before the CUDA libraries were installed beside libmlx is incomplete.
        if !target.join("nvidia").is_dir() {
            let _ = std::fs::remove_file(target.join(".complete"));
        }
        pip_install_once(&target, &wheels, None, |tmp| {
            let requires = requirements(tmp, backend)?;
            pip_install(tmp, &requires, true, None)
        })?;
    } else {
        pip_install_once(&target, &wheels, None, |_| Ok(()))?;
    }
    Ok((
        target.join("mlx"),
        format!("mlx {MLX_VERSION} wheels in {}", target.display()),
    ))
}

/// The `Requires-Dist` lines of an installed wheel's METADATA, those for extras left out.
fn requirements(target: &Path, package: &str) -> Result<Vec<String>, String> {
    let prefix = format!("{}-{MLX_VERSION}", package.replace('-', "_"));
    let metadata = target.join(format!("{prefix}.dist-info")).join("METADATA");
    let text = std::fs::read_to_string(&metadata)
        .map_err(|e| format!("cannot read {}: {e}", metadata.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("Requires-Dist:"))
        .map(str::trim)
        .filter(|r| !r.contains("extra =="))
        .map(String::from)
        .collect())
}

/// The MLX that `python3 -m mlx --cmake-dir` names, taken only when its backend package is the
/// one `variant` needs.
fn python_mlx(variant: &str) -> Option<PathBuf> {
    let probe = format!(
        "import importlib.metadata as m; m.version({:?})",
        backend_package(variant)
    );
    let has_backend = Command::new(python())
        .args(["-c", &probe])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_backend {
        return None;
    }
    let out = Command::new(python())
        .args(["-m", "mlx", "--cmake-dir"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    // Older MLX prints `<root>/share/cmake/MLX`, newer the package folder `<root>` itself.
    let cmake = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    let share = cmake.ancestors().nth(3).map(Path::to_path_buf);
    [Some(cmake), share]
        .into_iter()
        .flatten()
        .find(|root| root.join("include/mlx/mlx.h").is_file() && root.join("lib").is_dir())
}

fn find_openblas() -> Result<PathBuf, String> {
    let version = OPENBLAS_WHEEL.split("==").nth(1).unwrap_or("latest");
    let target = cache_dir()?.join(format!("scipy-openblas32-{version}"));
    pip_install_once(&target, &[OPENBLAS_WHEEL.to_string()], None, |_| Ok(()))?;
    let lib = target.join("scipy_openblas32/lib");
    if !lib.join("libscipy_openblas.so").is_file() {
        return Err(format!(
            "{} has no libscipy_openblas.so; delete {} and rebuild, or set ZIMAGE_BLAS=reference",
            lib.display(),
            target.display()
        ));
    }
    Ok(lib)
}
