//! The store under concurrent processes, kills and a full disk: imports, `gc`, `rm` and
//! `doctor` run as separate `zimage` processes on real files.

mod common;

use common::{s, write_safetensors, zimage_in};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zimage::safetensors::Dtype;
use zimage::store::{blob, Store};

/// A single-file source of `count` f32 tensors of `floats` values each, distinct per `seed`.
fn source(dir: &Path, name: &str, count: usize, floats: usize, seed: u32) -> PathBuf {
    let path = dir.join(format!("{name}.safetensors"));
    let names: Vec<String> = (0..count).map(|i| format!("blocks.{i}.weight")).collect();
    let tensors: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let data: Vec<u8> = (0..floats)
                .flat_map(|j| ((seed as f32) * 1000.0 + (i * floats + j) as f32).to_le_bytes())
                .collect();
            (n.as_str(), Dtype::F32, vec![floats as u64], data)
        })
        .collect();
    write_safetensors(&path, &tensors);
    path
}

fn spawn(root: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_zimage"))
        .arg("--store")
        .arg(root)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every complete blob hashes to its name; anything else in `blobs/` is a temporary file.
fn assert_blobs_intact(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root.join("blobs")) else {
        return;
    };
    for e in entries {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(hex) = name.strip_prefix("sha256-") {
            assert_eq!(
                blob::hash_file(&p).unwrap().0,
                format!("sha256:{hex}"),
                "corrupt blob {name}"
            );
        } else {
            assert!(
                name.starts_with(blob::PARTIAL_PREFIX),
                "unexpected file {name}"
            );
        }
    }
}

/// Every manifest in the store reads, and every blob it names is present and sound.
fn assert_manifests_verify(root: &Path) {
    let store = Store::at(root);
    let scan = store.scan().unwrap();
    assert!(scan.damaged.is_empty(), "{:?}", scan.damaged);
    for m in scan.models {
        let report = store.verify(&m.name.to_string()).unwrap();
        assert!(
            report.problems.is_empty(),
            "{}: {:?}",
            m.name,
            report.problems
        );
    }
}

#[test]
fn concurrent_imports_with_gc_in_a_loop_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = source(dir.path(), "a", 48, 32 << 10, 1);
    let b = source(dir.path(), "b", 48, 32 << 10, 2);
    let root = dir.path().join("store");
    let rounds = 20;
    let mut sweeps = 0;
    for round in 0..rounds {
        // The blobs of the last round stay until a sweep: an import that finds them present
        // and a `gc` that deletes them are the race this guards.
        for name in ["a", "b"] {
            let _ = zimage_in(&root, &["rm", name]);
        }
        let imports = [
            spawn(&root, &["create", "a", "--from", s(&a)]),
            spawn(&root, &["create", "b", "--from", s(&b)]),
        ];
        let mut imports: Vec<Option<Child>> = imports.into_iter().map(Some).collect();
        while imports.iter().any(Option::is_some) {
            let gc = zimage_in(&root, &["gc"]);
            assert!(gc.status.success(), "gc: {}", stderr_of(&gc));
            sweeps += 1;
            for slot in imports.iter_mut() {
                if let Some(child) = slot {
                    if child.try_wait().unwrap().is_some() {
                        let out = slot.take().unwrap().wait_with_output().unwrap();
                        assert!(
                            out.status.success(),
                            "round {round}: import failed: {}",
                            stderr_of(&out)
                        );
                    }
                }
            }
        }
        assert_manifests_verify(&root);
    }
    assert!(sweeps >= rounds);
    let out = zimage_in(&root, &["verify", "a"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = zimage_in(&root, &["verify", "b"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

/// A small deterministic generator, so a failing trial can be replayed.
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// Kills imports and sweeps at random points. Trials: `ZIMAGE_KILL_TRIALS` (default 24).
#[test]
fn killed_imports_and_sweeps_leave_a_sound_store_and_reruns_complete() {
    let trials: usize = std::env::var("ZIMAGE_KILL_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "src", 96, 16 << 10, 3);
    let other = source(dir.path(), "other", 8, 16 << 10, 4);
    let root = dir.path().join("store");
    // Another model stays in the store throughout: no kill may touch it.
    let out = zimage_in(&root, &["create", "keep", "--from", s(&other)]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    // How long an uninterrupted import takes, to spread the kills over it.
    let start = Instant::now();
    let out = zimage_in(&root, &["create", "m", "--from", s(&src)]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let span = start.elapsed().as_millis().max(20) as u64;
    let mut rng = Lcg(0x5eed);
    // [killed mid-import, killed after the manifest landed], and kills that left partials.
    let mut tally = [0usize; 2];
    let mut with_partials = 0;
    for trial in 0..trials {
        // Half the trials start from an empty slot, so the import writes every blob again.
        let _ = zimage_in(&root, &["rm", "m"]);
        if trial % 2 == 0 {
            let out = zimage_in(&root, &["gc"]);
            assert!(out.status.success(), "{}", stderr_of(&out));
        }
        let mut child = spawn(&root, &["create", "m", "--from", s(&src)]);
        std::thread::sleep(Duration::from_millis(rng.below(span)));
        let _ = child.kill(); // SIGKILL
        child.wait().unwrap();
        let completed = Store::at(&root).open("m").is_ok();
        let partials = std::fs::read_dir(root.join("blobs"))
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().starts_with(blob::PARTIAL_PREFIX)
            })
            .count();
        tally[usize::from(completed)] += 1;
        with_partials += usize::from(partials > 0);
        assert_blobs_intact(&root);
        assert_manifests_verify(&root);
        if trial % 3 == 0 {
            let mut gc = spawn(&root, &["gc"]);
            std::thread::sleep(Duration::from_millis(rng.below(span / 4 + 1)));
            let _ = gc.kill();
            gc.wait().unwrap();
            assert_blobs_intact(&root);
            assert_manifests_verify(&root);
        }
    }
    eprintln!(
        "{trials} kills: {} mid-import, {} after it completed; {with_partials} left partial blobs",
        tally[0], tally[1]
    );
    let out = zimage_in(&root, &["create", "m", "--from", s(&src)]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    for name in ["m", "keep"] {
        let out = zimage_in(&root, &["verify", name]);
        assert!(out.status.success(), "{name}: {}", stderr_of(&out));
    }
    // A sweep clears every leftover of the kills.
    let out = zimage_in(&root, &["gc"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let leftovers: Vec<_> = std::fs::read_dir(root.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("sha256-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The manifest path of `name` in the store at `root`.
fn manifest_path(root: &Path, name: &str) -> PathBuf {
    let parsed = zimage::store::ModelName::parse(name).unwrap();
    root.join(parsed.manifest_path())
}

#[test]
fn a_damaged_manifest_can_be_removed_and_stops_gc_with_a_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "src", 4, 256, 5);
    let root = dir.path().join("store");
    for name in ["good", "bad"] {
        let out = zimage_in(&root, &["create", name, "--from", s(&src)]);
        assert!(out.status.success(), "{}", stderr_of(&out));
    }
    std::fs::write(manifest_path(&root, "bad"), b"{\"schemaVersion\":2,").unwrap();

    // `list` shows the readable models and names the damaged one.
    let out = zimage_in(&root, &["list"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("good"));
    assert!(
        stderr_of(&out).contains("`zimage rm bad`"),
        "{}",
        stderr_of(&out)
    );

    // `gc` refuses, naming the manifest and the command that removes it.
    let out = zimage_in(&root, &["gc"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_of(&out);
    assert!(err.contains("`zimage rm bad`"), "{err}");
    assert!(
        err.contains(&manifest_path(&root, "bad").display().to_string()),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // `rm` removes it, saying it was damaged; then `gc` runs.
    let out = zimage_in(&root, &["rm", "bad"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("damaged"), "{}", stderr_of(&out));
    assert!(!manifest_path(&root, "bad").exists());
    let out = zimage_in(&root, &["gc"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = zimage_in(&root, &["verify", "good"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

#[test]
fn doctor_lists_damage_and_removes_what_is_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "src", 4, 256, 6);
    let other = source(dir.path(), "other", 4, 256, 7);
    let root = dir.path().join("store");
    for (name, from) in [("good", &src), ("bad", &src), ("hollow", &other)] {
        let out = zimage_in(&root, &["create", name, "--from", s(from)]);
        assert!(out.status.success(), "{}", stderr_of(&out));
    }
    std::fs::write(manifest_path(&root, "bad"), b"not json").unwrap();
    // `hollow` loses a blob no other model shares.
    let store = Store::at(&root);
    let hollow = store.open("hollow").unwrap();
    let lost = &hollow.manifest.tensor_layers().next().unwrap().digest;
    std::fs::remove_file(store.blob_path(lost).unwrap()).unwrap();
    // Leftovers of a killed import and a killed manifest write.
    let partial = root
        .join("blobs")
        .join(format!("{}999-1", blob::PARTIAL_PREFIX));
    std::fs::write(&partial, b"half a blob").unwrap();
    let temp_manifest = manifest_path(&root, "good").with_file_name(".zimage-abc123");
    std::fs::write(&temp_manifest, b"{").unwrap();

    // Declined: everything is listed, nothing removed, and the exit says damage remains.
    let mut child = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .arg("--store")
        .arg(&root)
        .arg("doctor")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"n\nn\nn\nn\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{listed}");
    for needle in ["`bad`", "`hollow`", ".partial-999-1", ".zimage-abc123"] {
        assert!(listed.contains(needle), "{needle} not in {listed}");
    }
    assert!(partial.exists() && manifest_path(&root, "bad").exists());

    // Confirmed for scripts: all of it goes, and the good model is untouched.
    let out = zimage_in(&root, &["doctor", "--yes"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(!partial.exists() && !temp_manifest.exists());
    assert!(!manifest_path(&root, "bad").exists());
    assert!(!manifest_path(&root, "hollow").exists());
    let out = zimage_in(&root, &["doctor"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no damage found"));
    let out = zimage_in(&root, &["verify", "good"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

/// A tmpfs mounted for the test's life (the test runs as root, as CI does).
struct Tmpfs(PathBuf);
impl Tmpfs {
    fn mount(at: &Path, bytes: u64) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}")])
            .arg("tmpfs")
            .arg(at)
            .output()
            .expect("`mount` runs");
        assert!(
            out.status.success(),
            "mounting a small tmpfs needs root (or CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at.to_path_buf())
    }
}
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn an_import_onto_a_full_disk_fails_cleanly_and_says_what_it_needed() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "src", 24, 128 << 10, 8); // 12.6 MB
    let small = source(dir.path(), "small", 2, 1024, 9);
    let disk = Tmpfs::mount(&dir.path().join("disk"), 4 << 20);
    let root = disk.0.join("store");
    let out = zimage_in(&root, &["create", "fits", "--from", s(&small)]);
    assert!(out.status.success(), "{}", stderr_of(&out));

    let out = zimage_in(&root, &["create", "big", "--from", s(&src)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_of(&out);
    assert!(err.contains("no space left"), "{err}");
    assert!(err.contains("12.6 MB"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // No manifest, no partial blob; what was there is intact and the disk is usable again.
    assert!(!manifest_path(&root, "big").exists());
    let partials: Vec<_> = std::fs::read_dir(root.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("sha256-"))
        .collect();
    assert!(partials.is_empty(), "{partials:?}");
    assert_blobs_intact(&root);
    assert_manifests_verify(&root);
    let out = zimage_in(&root, &["gc"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = zimage_in(&root, &["verify", "fits"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}
