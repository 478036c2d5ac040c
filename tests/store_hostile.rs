//! The store against hostile and damaged input: manifests too large to read back, damaged
//! manifests beside good ones, digests spelled two ways, sizes that would wrap, FIFOs given as
//! sources, and processes stopped mid-import.

mod common;

use common::{s, write_safetensors, zimage_in};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use zimage::safetensors::{self, Dtype, TensorSpec};
use zimage::store::{blob, manifest, Layer, Manifest, ModelName, Store};

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn small_source(dir: &Path, name: &str, seed: f32) -> PathBuf {
    let path = dir.join(format!("{name}.safetensors"));
    let data: Vec<u8> = (0..256)
        .flat_map(|i| (seed + i as f32).to_le_bytes())
        .collect();
    write_safetensors(
        &path,
        &[
            ("a.weight", Dtype::F32, vec![256], data.clone()),
            ("b.weight", Dtype::F32, vec![16, 16], data),
        ],
    );
    path
}

fn manifest_path(root: &Path, name: &str) -> PathBuf {
    root.join(ModelName::parse(name).unwrap().manifest_path())
}

/// Runs a command to its end; returns its exit code, stderr and peak resident bytes. The
/// child is reaped by `wait4`, which also reports its own peak (unlike `Child::wait`).
#[allow(clippy::zombie_processes)]
fn run_measured(cmd: &mut Command) -> (Option<i32>, String, u64) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is our own unwaited child; status and usage point to live locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (code, err, usage.ru_maxrss as u64 * 1024)
}

#[test]
fn an_import_whose_manifest_could_not_be_read_back_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.safetensors");
    let count = 400_000;
    let specs: Vec<TensorSpec> = (0..count)
        .map(|i| TensorSpec {
            name: format!("blocks.{i}.weight"),
            dtype: Dtype::F32,
            shape: vec![1],
        })
        .collect();
    let mut bytes = safetensors::header_bytes(&specs, None, 8).unwrap();
    bytes.resize(bytes.len() + 4 * count, 0);
    std::fs::write(&path, bytes).unwrap();
    let root = dir.path().join("store");
    let out = zimage_in(&root, &["create", "many", "--from", s(&path)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(err.contains("400000 tensors"), "{err}");
    assert!(
        err.contains("more than the 64 MiB a manifest may be"),
        "{err}"
    );
    assert!(!manifest_path(&root, "many").exists());
    let blobs = std::fs::read_dir(root.join("blobs")).map_or(0, |d| d.count());
    assert_eq!(blobs, 0, "nothing may be written");
}

#[test]
fn a_manifest_over_the_limit_is_refused_without_being_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_source(dir.path(), "src", 1.0);
    let root = dir.path().join("store");
    let out = zimage_in(&root, &["create", "good", "--from", s(&src)]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    // A sparse 256 MiB manifest: reading it whole would show in the peak RSS.
    let huge = manifest_path(&root, "huge");
    std::fs::create_dir_all(huge.parent().unwrap()).unwrap();
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let (code, err, peak) = run_measured(
        Command::new(env!("CARGO_BIN_EXE_zimage"))
            .arg("--store")
            .arg(&root)
            .arg("list"),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("more than the 67108864 bytes a manifest may be"),
        "{err}"
    );
    assert!(err.contains("`zimage rm huge`"), "{err}");
    assert!(peak < 128 << 20, "peak RSS {peak} bytes");
}

#[test]
fn a_damaged_manifest_does_not_hide_the_stored_model_generate_picks() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let out = zimage_in(&root, &["create", "mine", "--from", s(&demo)]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    // Sorted before `mine`, and unreadable.
    let bad = manifest_path(&root, "aaa");
    std::fs::create_dir_all(bad.parent().unwrap()).unwrap();
    std::fs::write(&bad, b"\x00\x01garbage").unwrap();
    let png = dir.path().join("out.png");
    let out = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .arg("--store")
        .arg(&root)
        .args(["generate", "a cat", "--steps", "1", "-o", s(&png)])
        .env("ZIMAGE_CACHE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let text = zimage::image_out::read_png_text(&png).unwrap();
    let params = text
        .iter()
        .find(|(k, _)| k == "parameters")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    assert!(params.contains("Model: mine"), "{params}");
    assert!(
        !dir.path().join("cache/demo-store").exists(),
        "the demo model was used instead of the stored one"
    );
}

#[test]
fn partial_blobs_of_a_running_import_are_never_removed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = Store::at(&root);
    // This process stands for an import in progress: it holds the store and has a blob
    // half written.
    let import = store.lock_for_writing().unwrap();
    std::fs::create_dir_all(root.join("blobs")).unwrap();
    let partial = root
        .join("blobs")
        .join(format!("{}4242-0", blob::PARTIAL_PREFIX));
    std::fs::write(&partial, b"half").unwrap();

    let out = zimage_in(&root, &["doctor", "--yes"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(partial.exists(), "doctor removed a running import's file");

    let mut gc = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .arg("--store")
        .arg(&root)
        .arg("gc")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        gc.try_wait().unwrap().is_none(),
        "gc must wait for the import"
    );
    assert!(partial.exists(), "gc removed a running import's file");
    drop(import);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = gc.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "gc never ran");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let mut err = String::new();
    gc.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("waiting for other zimage processes"), "{err}");
    assert!(
        !partial.exists(),
        "once the import is gone its leftovers are"
    );
}

/// A store with one model whose only tensor is a generation-2 blob: keyed by its full
/// path-style name, which ends in `.bias`; the digest is spelled as `spell` makes it.
fn store_with_bias_blob(root: &Path, spell: impl Fn(&str) -> String) -> Store {
    let store = Store::at(root);
    let spec = TensorSpec {
        name: "vae/decoder.conv_in.bias".into(),
        dtype: Dtype::F32,
        shape: vec![4],
    };
    let mut bytes = safetensors::header_bytes(&[spec], None, 8).unwrap();
    bytes.extend((0..4).flat_map(|i| (i as f32).to_le_bytes()));
    let (digest, size, _) = blob::write_blob(root, &bytes).unwrap();
    let (config_digest, config_size, _) =
        blob::write_blob(root, &manifest::config_blob("")).unwrap();
    let config = Layer {
        media_type: manifest::CONFIG_MEDIA_TYPE.into(),
        digest: spell(&config_digest),
        size: config_size,
        from: None,
        name: None,
        dtype: None,
        shape: None,
    };
    let layer = Layer {
        media_type: manifest::TENSOR_MEDIA_TYPE.into(),
        digest: spell(&digest),
        size,
        from: None,
        name: Some("vae/decoder.conv_in.bias".into()),
        dtype: Some("F32".into()),
        shape: Some(vec![4]),
    };
    store
        .write_manifest(
            &ModelName::parse("bias").unwrap(),
            &Manifest::new(config, vec![layer]),
        )
        .unwrap();
    store
}

#[test]
fn verify_accepts_a_generation_two_blob_whose_tensor_ends_in_bias() {
    let dir = tempfile::tempdir().unwrap();
    store_with_bias_blob(dir.path(), |d| d.to_string());
    let out = zimage_in(dir.path(), &["verify", "bias"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = zimage_in(dir.path(), &["show", "bias"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

#[test]
fn a_digest_spelled_with_a_dash_verifies() {
    let dir = tempfile::tempdir().unwrap();
    store_with_bias_blob(dir.path(), |d| d.replacen("sha256:", "sha256-", 1));
    let out = zimage_in(dir.path(), &["verify", "bias"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

#[test]
fn concurrent_sweeps_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    for (name, seed) in [("a", 1.0), ("b", 2.0)] {
        let src = small_source(dir.path(), name, seed);
        let out = zimage_in(&root, &["create", name, "--from", s(&src)]);
        assert!(out.status.success(), "{}", stderr_of(&out));
    }
    assert!(zimage_in(&root, &["rm", "b"]).status.success());
    let sweeps: Vec<_> = (0..4)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_zimage"))
                .arg("--store")
                .arg(&root)
                .arg("gc")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for gc in sweeps {
        let out = gc.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr_of(&out));
    }
    assert!(zimage_in(&root, &["verify", "a"]).status.success());
}

#[test]
fn sizes_that_would_wrap_are_listed_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_bias_blob(dir.path(), |d| d.to_string());
    let mut m = store.open("bias").unwrap().manifest;
    m.config.size = u64::MAX - 1;
    m.layers[0].size = u64::MAX - 1;
    store
        .write_manifest(&ModelName::parse("bias").unwrap(), &m)
        .unwrap();
    let out = zimage_in(dir.path(), &["list"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = zimage_in(dir.path(), &["show", "bias"]);
    assert_ne!(out.status.code(), Some(101), "{}", stderr_of(&out));
}

#[test]
fn a_fifo_given_as_a_source_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.safetensors");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only reads it.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let child = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .arg("--store")
        .arg(dir.path().join("store"))
        .args(["create", "m", "--from", s(&fifo)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::output_within(child, Duration::from_secs(10), || {
        panic!("`create --from FIFO` hangs")
    });
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_of(&out);
    assert!(err.contains("is a FIFO, not a regular file"), "{err}");
    assert!(err.contains(fifo.to_str().unwrap()), "{err}");
}

#[test]
fn a_source_of_no_known_format_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("model.bin");
    std::fs::write(&odd, b"\x01\x02\x03 this is no model").unwrap();
    let out = zimage_in(
        &dir.path().join("store"),
        &["create", "m", "--from", s(&odd)],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_of(&out);
    assert!(!err.contains("unknown"), "{err}");
    assert!(err.contains("match no format"), "{err}");
    // The same words from every command that tells files apart, for an empty file too.
    let empty = dir.path().join("empty.safetensors");
    std::fs::write(&empty, b"").unwrap();
    let out_zt = dir.path().join("out.zt");
    for args in [
        vec!["inspect", s(&odd)],
        vec!["inspect", s(&empty)],
        vec!["convert", s(&empty), s(&out_zt)],
    ] {
        let out = zimage_in(&dir.path().join("store"), &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr_of(&out);
        assert!(!err.contains("unknown"), "{args:?}: {err}");
        assert!(err.contains("match no format"), "{args:?}: {err}");
    }
}

#[test]
fn an_import_stopped_by_sigterm_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.safetensors");
    let names: Vec<String> = (0..64).map(|i| format!("blocks.{i}.weight")).collect();
    let tensors: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let data: Vec<u8> = (0..(256 << 10))
                .flat_map(|j| ((i * 7 + j) as f32).to_le_bytes())
                .collect();
            (n.as_str(), Dtype::F32, vec![256 << 10], data)
        })
        .collect();
    write_safetensors(&path, &tensors);
    let root = dir.path().join("store");
    let child = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .arg("--store")
        .arg(&root)
        .args(["create", "big", "--from", s(&path)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !std::fs::read_dir(root.join("blobs")).is_ok_and(|mut d| d.next().is_some()) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "import never started"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: signalling our own child, which has not been waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(!manifest_path(&root, "big").exists());
    let leftovers: Vec<String> = std::fs::read_dir(root.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("sha256-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_quantized_import_of_a_dimension_past_i32_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.safetensors");
    let wide = (1u64 << 31) + 64;
    write_safetensors(
        &path,
        &[("proj.weight", Dtype::F32, vec![0, wide], Vec::new())],
    );
    let out = zimage_in(
        &dir.path().join("store"),
        &[
            "create",
            "w",
            "--from",
            s(&path),
            "--component",
            "transformer",
            "--quantize",
            "int8",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(err.contains("proj.weight"), "{err}");
    assert!(err.contains("without `--quantize`"), "{err}");
}

#[test]
fn too_few_open_files_is_named_with_the_limit_to_raise() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.safetensors");
    let names: Vec<String> = (0..48).map(|i| format!("blocks.{i}.weight")).collect();
    let tensors: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), Dtype::F32, vec![4], vec![i as u8; 16]))
        .collect();
    write_safetensors(&path, &tensors);
    let root = dir.path().join("store");
    let out = zimage_in(&root, &["create", "m", "--from", s(&path)]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zimage"));
    cmd.arg("--store").arg(&root).args(["profile", "m"]);
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let lim = libc::rlimit {
                rlim_cur: 24,
                rlim_max: 24,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(err.contains("48 blobs to hold open"), "{err}");
    assert!(err.contains("ulimit -n"), "{err}");
}

#[test]
fn a_blob_that_links_outside_the_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = store_with_bias_blob(&root, |d| d.to_string());
    let digest = store.open("bias").unwrap().manifest.layers[0]
        .digest
        .clone();
    let blob = store.blob_path(&digest).unwrap();
    let outside = dir.path().join("secret");
    std::fs::copy(&blob, &outside).unwrap();
    std::fs::remove_file(&blob).unwrap();
    std::os::unix::fs::symlink(&outside, &blob).unwrap();
    for args in [["verify", "bias"], ["show", "bias"]] {
        let out = zimage_in(&root, &args);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        let err = stderr_of(&out) + &String::from_utf8_lossy(&out.stdout);
        assert!(err.contains("outside the store"), "{args:?}: {err}");
    }
}

#[test]
fn layer_sizes_near_the_top_of_u64_are_planned_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let out = zimage_in(&root, &["create", "huge", "--from", s(&demo)]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let store = Store::at(&root);
    let mut m = store.open("huge").unwrap().manifest;
    for l in &mut m.layers {
        l.size = u64::MAX;
    }
    store
        .write_manifest(&ModelName::parse("huge").unwrap(), &m)
        .unwrap();
    let png = dir.path().join("o.png");
    for args in [
        vec!["show", "huge"],
        vec![
            "generate",
            "x",
            "--model",
            "huge",
            "--steps",
            "1",
            "-o",
            s(&png),
        ],
    ] {
        let out = zimage_in(&root, &args);
        assert!(
            matches!(out.status.code(), Some(0 | 2)),
            "{args:?}: {}",
            stderr_of(&out)
        );
    }
}

/// A copy of the demo model laid out as Hugging Face's cache lays out a snapshot: every file a
/// symlink into the cached repository's `blobs/`.
fn hf_cache_snapshot(at: &Path) -> PathBuf {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let repo = at.join("models--org--tiny");
    let snapshot = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    let mut stack = vec![demo.clone()];
    let mut n = 0;
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(&demo).unwrap();
            let blob = repo.join("blobs").join(format!("blob{n}"));
            n += 1;
            std::fs::copy(&p, &blob).unwrap();
            let link = snapshot.join(rel);
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            let depth = rel.components().count() + 1;
            let up = "../".repeat(depth);
            std::os::unix::fs::symlink(
                format!("{up}blobs/{}", blob.file_name().unwrap().to_str().unwrap()),
                &link,
            )
            .unwrap();
        }
    }
    snapshot
}

#[test]
fn a_hugging_face_cache_snapshot_imports_but_a_link_out_of_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = hf_cache_snapshot(dir.path());
    let root = dir.path().join("store");
    let out = zimage_in(&root, &["create", "hf", "--from", s(&snapshot)]);
    assert!(out.status.success(), "{}", stderr_of(&out));

    let secret = dir.path().join("id_ed25519");
    std::fs::write(&secret, b"PRIVATE KEY").unwrap();
    let vocab = snapshot.join("tokenizer/vocab.json");
    std::fs::remove_file(&vocab).unwrap();
    std::os::unix::fs::symlink(&secret, &vocab).unwrap();
    let out = zimage_in(&root, &["create", "leak", "--from", s(&snapshot)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(err.contains("outside the model"), "{err}");
    assert!(!manifest_path(&root, "leak").exists());
}

#[test]
fn a_config_file_that_is_a_fifo_is_refused_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = hf_cache_snapshot(dir.path());
    let merges = snapshot.join("tokenizer/merges.txt");
    std::fs::remove_file(&merges).unwrap();
    let c = std::ffi::CString::new(merges.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only reads it.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let root = dir.path().join("store");
    let out = zimage_in(&root, &["create", "m", "--from", s(&snapshot)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("is a FIFO"), "{}", stderr_of(&out));
}

#[test]
fn a_config_file_that_is_not_json_is_refused_at_import() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = hf_cache_snapshot(dir.path());
    let index = snapshot.join("model_index.json");
    std::fs::remove_file(&index).unwrap();
    std::fs::write(&index, b"{").unwrap();
    let root = dir.path().join("store");
    let out = zimage_in(&root, &["create", "m", "--from", s(&snapshot)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains("model_index.json") && err.contains("not valid JSON"),
        "{err}"
    );
    assert!(!manifest_path(&root, "m").exists());
}

#[test]
fn every_component_flag_takes_one_rule() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_source(dir.path(), "src", 1.0);
    let root = dir.path().join("store");
    for bad in ["", "a/b", "..", "UPPER", ".hidden"] {
        for args in [
            vec!["create", "m", "--from", s(&src), "--component", bad],
            vec!["inspect", s(&src), "--component", bad],
            vec!["hash", "--structural", s(&src), "--component", bad],
        ] {
            let out = zimage_in(&root, &args);
            assert_eq!(out.status.code(), Some(2), "{args:?}");
            assert!(
                stderr_of(&out).contains("component name"),
                "{args:?}: {}",
                stderr_of(&out)
            );
        }
    }
    assert!(!manifest_path(&root, "m").exists());
}
