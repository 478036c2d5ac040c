//! Every input a fuzz target found (`fuzz/regressions/<target>/`), replayed through the binary:
//! each is refused with an error, never a panic, an abort or a run away.

mod common;

use common::{s, zimage_in};
use std::io::Read;
use std::path::{Path, PathBuf};
use zimage::store::manifest::{self, Layer, Manifest, TENSOR_MEDIA_TYPE};
use zimage::store::{blob, ModelName, Store};

fn regression(target: &str, name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target)
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit 0 or 2: anything but a panic (101) or an abort (134) or a signal.
fn assert_no_crash(out: &std::process::Output, what: &str) {
    assert!(
        matches!(out.status.code(), Some(0..=2)),
        "{what}: {:?}: {}",
        out.status,
        stderr_of(out)
    );
    assert!(
        !stderr_of(out).contains("panicked"),
        "{what}: {}",
        stderr_of(out)
    );
}

#[test]
fn a_manifest_whose_shape_product_overflows_is_no_panic() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let bytes = regression("manifest", "tensor_shape_product_overflows");
    let path = root.join(ModelName::parse("m").unwrap().manifest_path());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    for args in [["show", "m"], ["verify", "m"], ["profile", "m"]] {
        let out = zimage_in(root, &args);
        assert_no_crash(&out, &args.join(" "));
    }
    let out = zimage_in(root, &["generate", "x", "--model", "m", "-o", "/dev/null"]);
    assert_no_crash(&out, "generate");
}

#[test]
fn a_quantized_blob_whose_packed_columns_overflow_is_no_panic() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let input = regression("blob_classification", "packed_columns_overflow_i32");
    // The target's mode byte 0: one layer `c/w` holding the blob that follows.
    let (digest, size, _) = blob::write_blob(root, &input[1..]).unwrap();
    let config = manifest::config_blob("");
    let (config_digest, config_size, _) = blob::write_blob(root, &config).unwrap();
    let m = Manifest::new(
        Layer {
            media_type: manifest::CONFIG_MEDIA_TYPE.into(),
            digest: config_digest,
            size: config_size,
            from: None,
            name: None,
            dtype: None,
            shape: None,
        },
        vec![Layer {
            media_type: TENSOR_MEDIA_TYPE.into(),
            digest,
            size,
            from: None,
            name: Some("c/w".into()),
            dtype: None,
            shape: None,
        }],
    );
    Store::at(root)
        .write_manifest(&ModelName::parse("m").unwrap(), &m)
        .unwrap();
    let out = zimage_in(root, &["profile", "m"]);
    assert_no_crash(&out, "profile");
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
}

#[test]
fn a_csr_tensor_claiming_gigabytes_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let zt = dir.path().join("in.zt");
    std::fs::write(&zt, regression("ztensor", "csr_shape_claims_3_gib")).unwrap();
    let out_path = dir.path().join("out.safetensors");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zimage"))
        .args(["convert", s(&zt), s(&out_path)])
        .env("ZIMAGE_MAX_DENSE_BYTES", (64u64 << 20).to_string())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("ZIMAGE_MAX_DENSE_BYTES"),
        "{}",
        stderr_of(&out)
    );
    let left: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != &zt)
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_png_whose_text_inflates_to_a_gigabyte_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let gz = regression("png_text", "ztxt_1_gib_of_text.png.gz");
    let mut png = Vec::new();
    gunzip(&gz, &mut png);
    let path = dir.path().join("bomb.png");
    std::fs::write(&path, png).unwrap();
    let out = zimage_in(&dir.path().join("store"), &["inspect", s(&path)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
}

/// The committed file is gzipped; `gzip -dc` unpacks it (every machine that runs the tests
/// has gzip).
fn gunzip(gz: &[u8], out: &mut Vec<u8>) {
    let mut child = std::process::Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip runs");
    let mut stdin = child.stdin.take().unwrap();
    let gz = gz.to_vec();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &gz));
    child.stdout.take().unwrap().read_to_end(out).unwrap();
    writer.join().unwrap().unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_long_word_without_a_colon_parses_at_once() {
    let text = String::from_utf8(regression("infotext", "long_word_without_colon")).unwrap();
    // Quadratic parsing took 12 s on this input; linear parsing takes milliseconds.
    let start = std::time::Instant::now();
    let _ = zimage::formats::infotext::parse(&text);
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn a_gguf_tensor_whose_zero_dimension_hides_an_overflow_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.gguf");
    std::fs::write(
        &file,
        regression("gguf", "zero_dimension_hides_overflow.gguf"),
    )
    .unwrap();
    for args in [
        vec!["inspect", s(&file)],
        vec!["hash", "--structural", s(&file)],
        vec!["create", "m", "--transformer", s(&file)],
    ] {
        let out = zimage_in(&dir.path().join("store"), &args);
        assert_no_crash(&out, &args.join(" "));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr_of(&out));
        assert!(stderr_of(&out).contains("2^63"), "{}", stderr_of(&out));
    }
}
