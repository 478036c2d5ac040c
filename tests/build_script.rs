//! The build script's macOS paths, run on Linux: the `mlx-metal` wheels installed as a Mac's
//! build installs them (pip for macOS on arm64), the tree it then builds against checked by the
//! build script's own code, and the link lines it would give Apple's linker.

#[path = "../build/mlx_install.rs"]
#[allow(dead_code)]
mod mlx_install;

mod common;

use mlx_install::{ForPlatform, Os};
use std::path::Path;

/// The wheels a Mac's build installs, for the oldest macOS that MLX's wheels support and the
/// Python this machine's tests use (the libraries and headers are the same in every one).
fn macos_mlx() -> std::path::PathBuf {
    let target = common::test_cache().join(format!("mlx-{}-macos-arm64", mlx_install::MLX_VERSION));
    let mac = ForPlatform {
        platform: "macosx_14_0_arm64",
        python_version: "3.11",
    };
    mlx_install::pip_install_once(&target, &mlx_install::wheels("metal"), Some(&mac), |_| {
        Ok(())
    })
    .unwrap_or_else(|e| panic!("installing the macOS wheels failed: {e}"));
    target.join("mlx")
}

#[test]
fn the_macos_wheels_carry_what_a_mac_build_links_and_runs_with() {
    let root = macos_mlx();
    mlx_install::check_layout(&root, Os::MacOs, "metal").unwrap();
    assert_eq!(
        mlx_install::header_version(&root.join("include")).unwrap(),
        mlx_install::MLX_VERSION
    );

    // libmlx is a 64-bit arm64 Mach-O library that names itself by the rpath, so the program's
    // one `-rpath` to this folder is what finds it (and MLX finds mlx.metallib beside it).
    let dylib = std::fs::read(root.join("lib/libmlx.dylib")).unwrap();
    assert_eq!(
        &dylib[..4],
        &0xfeed_facf_u32.to_le_bytes(),
        "not a 64-bit Mach-O"
    );
    assert_eq!(&dylib[4..8], &0x0100_000c_u32.to_le_bytes(), "not arm64");
    let install_name = b"@rpath/libmlx.dylib";
    assert!(
        dylib.windows(install_name.len()).any(|w| w == install_name),
        "libmlx.dylib does not name itself @rpath/libmlx.dylib"
    );

    let lib = root.join("lib");
    let lines = mlx_install::link_lines(Os::MacOs, &lib);
    assert!(lines.contains(&format!(
        "cargo:rustc-link-arg=-Wl,-rpath,{}",
        lib.display()
    )));
    assert!(lines.contains(&"cargo:rustc-link-lib=dylib=mlx".to_string()));
    // Apple's linker has no libdl (dlopen is in libSystem) and no GNU-only options.
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("=dl") && !l.contains("--")),
        "{lines:?}"
    );
}

#[test]
fn a_metal_tree_without_its_kernel_library_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for file in ["include/mlx/mlx.h", "lib/libmlx.dylib"] {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }
    let err = mlx_install::check_layout(root, Os::MacOs, "metal").unwrap_err();
    assert!(err.contains("mlx.metallib"), "{err}");
    assert!(err.contains("MLX_DIR"), "{err}");
    // The same tree serves a Linux build of another variant, which has no kernel library.
    assert!(mlx_install::check_layout(root, Os::Linux, "cpu").is_err());
    std::fs::write(root.join("lib/libmlx.so"), b"").unwrap();
    mlx_install::check_layout(root, Os::Linux, "cpu").unwrap();
}

#[test]
fn the_target_os_comes_from_cargo_and_others_are_refused() {
    assert_eq!(Os::from_target("macos").unwrap(), Os::MacOs);
    assert_eq!(Os::from_target("linux").unwrap(), Os::Linux);
    let err = Os::from_target("windows").unwrap_err();
    assert!(err.contains("`windows`"), "{err}");
    assert!(mlx_install::link_lines(Os::Linux, Path::new("/x"))
        .contains(&"cargo:rustc-link-lib=dylib=dl".to_string()));
}
