//! The demo model travels inside the binary: a copy of `zimage` elsewhere, run where the source
//! tree cannot be seen, still generates the demo image.

use std::path::Path;
use std::process::Command;

#[test]
fn a_copied_binary_runs_the_demo_with_the_source_tree_out_of_reach() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin/zimage");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_zimage"), &bin).unwrap();
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    // In a mount namespace of its own, an empty tmpfs hides `models/` from the binary (and
    // from nothing else on the machine); the test runs as root, as CI does.
    let script = format!(
        "mount -t tmpfs tmpfs '{models}' && test -z \"$(ls '{models}')\" && cd '{work}' && \
         exec '{bin}' --store '{work}/store' generate 'a red fox' --steps 1 -o out.png",
        models = models.display(),
        work = dir.path().display(),
        bin = bin.display(),
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("ZIMAGE_CACHE_DIR", dir.path().join("cache"))
        .env("HOME", dir.path())
        .output()
        .expect("`unshare` runs (util-linux)");
    assert!(
        out.status.success(),
        "needs root for a private mount namespace; {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = dir.path().join("out.png");
    let text = zimage::image_out::read_png_text(&png).unwrap();
    assert!(text
        .iter()
        .any(|(k, v)| k == "parameters" && v.contains("z-image-tiny")));
    // The source tree is untouched, and the demo was unpacked into the cache.
    assert!(models.join("z-image-tiny/model_index.json").is_file());
    let unpacked = std::fs::read_dir(dir.path().join("cache"))
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("demo-model-"));
    assert!(unpacked);
}
