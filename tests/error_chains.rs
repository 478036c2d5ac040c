//! Every error says each of its causes once: a library error either shows its cause's text or
//! chains it as its source, never both, and `main` prints the chain as it is.

mod common;

use common::{copy_model, s, zimage, zimage_in};
use std::path::{Path, PathBuf};
use std::process::Output;

/// The one `error:` line of a failed run, after checking the exit code and that no part of the
/// line (the pieces between `: `) is said twice.
fn error_line(out: &Output) -> String {
    assert!(!out.status.success(), "the command should have failed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line expected:\n{stderr}");
    let line = lines[0].trim_start_matches("error: ").to_string();
    assert_each_part_once(&line);
    line
}

fn assert_each_part_once(line: &str) {
    let parts: Vec<&str> = line.split(": ").map(str::trim).collect();
    for (i, a) in parts.iter().enumerate() {
        for b in &parts[i + 1..] {
            assert!(
                a.len() < 6 || a != b,
                "`{a}` is said twice in the message: {line}"
            );
        }
    }
}

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny")
}

#[test]
fn a_missing_input_file_names_the_file_and_the_system_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.safetensors");
    let line = error_line(&zimage(&[
        "convert",
        s(&missing),
        s(&dir.path().join("o.zt")),
    ]));
    assert_eq!(line.matches("absent.safetensors").count(), 1, "{line}");
    assert_eq!(
        line.matches("No such file or directory").count(),
        1,
        "{line}"
    );
}

#[test]
fn a_malformed_config_in_an_import_says_the_parser_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    copy_model(&demo(), &model);
    let transformer = model.join("transformer");
    std::fs::remove_file(transformer.join("config.json")).unwrap();
    std::fs::write(transformer.join("config.json"), "{").unwrap();

    let store = dir.path().join("store");
    let line = error_line(&zimage_in(
        &store,
        &["create", "broken", "--from", s(&model)],
    ));
    assert!(line.contains("transformer/config.json"), "{line}");
    assert_eq!(line.matches("EOF while parsing").count(), 1, "{line}");
    assert!(!store.join("manifests").exists() || walk_files(&store.join("manifests")) == 0);
}

#[test]
fn a_damaged_manifest_says_its_parse_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let manifests = store.join("manifests/registry.ollama.ai/library/bad");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(manifests.join("latest"), "not json").unwrap();
    let line = error_line(&zimage_in(&store, &["show", "bad"]));
    assert!(
        line.contains("manifests/registry.ollama.ai/library/bad/latest"),
        "{line}"
    );
    assert_eq!(line.matches("expected").count(), 1, "{line}");
}

#[test]
fn a_missing_lora_file_says_the_system_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("style.safetensors");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zimage"))
        .current_dir(dir.path())
        .env("ZIMAGE_CACHE_DIR", dir.path().join("cache"))
        .args(["--store", s(&dir.path().join("store"))])
        .args([
            "generate",
            "--model",
            s(&demo()),
            "--lora",
            s(&missing),
            "a fox",
        ])
        .output()
        .unwrap();
    let line = error_line(&out);
    assert_eq!(line.matches("style.safetensors").count(), 1, "{line}");
    assert_eq!(
        line.matches("No such file or directory").count(),
        1,
        "{line}"
    );
}

/// The library side of the rule: walking each error's chain, no cause's text is already in
/// the message above it.
#[test]
fn library_errors_embed_or_chain_their_cause_never_both() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent");
    let errors: Vec<Box<dyn std::error::Error>> = vec![
        Box::new(zimage::files::read_bounded(&missing, 1024, "input").unwrap_err()),
        Box::new(zimage::safetensors::read_header_file(&missing).unwrap_err()),
        Box::new(
            zimage::formats::structural::read::listing_from_header("{", &missing).unwrap_err(),
        ),
        Box::new(zimage::formats::model_hash::hash_file(&missing).unwrap_err()),
        Box::new(zimage::lora::Error::from(
            zimage::files::read_bounded(&missing, 1024, "LoRA").unwrap_err(),
        )),
        Box::new(zimage::image_out::Error::from(
            zimage::files::read_bounded(&missing, 1024, "PNG").unwrap_err(),
        )),
        Box::new(
            zimage::store::Store::at(dir.path())
                .open("m")
                .map(|_| ())
                .unwrap_err(),
        ),
    ];
    for err in errors {
        let mut above = err.to_string();
        let mut cause = err.source();
        while let Some(c) = cause {
            let text = c.to_string();
            assert!(
                !above.contains(&text),
                "`{above}` shows its cause `{text}` and also chains it"
            );
            above = text;
            cause = c.source();
        }
    }
}

fn walk_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        walk_files(&p)
                    } else {
                        1
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}
