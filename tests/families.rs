//! A family is a folder: everything that is one family's own lives under `src/families/<family>/`,
//! and outside that folder no Rust file names a particular family. The runner, the import, the
//! memory plan, the servers, the page and the command line ask the registry
//! (`src/families/mod.rs`, one line per family) instead.

use std::path::{Path, PathBuf};
use zimage::families::Family;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The family folders under `src/families/`.
fn folders() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(src().join("families"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// What names a family: what the registry says of each (its name, its pipelines' and its
/// transformer's class names), its folder as a module path, and the spellings its own code
/// uses for itself.
fn family_words() -> Vec<String> {
    let mut words = Vec::new();
    for f in Family::all() {
        words.push(f.name().to_string());
        words.extend(f.class_names().iter().map(|c| c.to_string()));
        words.push(f.transformer_class().to_string());
    }
    for folder in folders() {
        words.push(format!("families::{folder}"));
    }
    words.extend(
        [
            "ZImage", "Z-Image", "z_image", "klein", "Klein", "Flux3", "flux3", "FLUX.3",
        ]
        .map(String::from),
    );
    words
}

#[test]
fn no_rust_file_outside_the_family_folders_names_a_family() {
    let families = src().join("families");
    let words = family_words();
    let mut found = Vec::new();
    for path in rust_files(&src()) {
        if path.starts_with(&families) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            if let Some(w) = words.iter().find(|w| line.contains(w.as_str())) {
                let rel = path.strip_prefix(src()).unwrap().display();
                found.push(format!("src/{rel}:{}: `{w}`: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "files outside src/families/ name a family; ask the registry instead:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_registry_lists_every_family_folder_once() {
    let registry = std::fs::read_to_string(src().join("families/mod.rs")).unwrap();
    // The entries of `FAMILIES = &[…];`, however they are laid out.
    let list = registry
        .split_once("pub static FAMILIES")
        .and_then(|(_, rest)| rest.split_once("= &["))
        .and_then(|(_, rest)| rest.split_once("];"))
        .map(|(entries, _)| entries)
        .expect("the registry declares FAMILIES");
    let listed: Vec<&str> = (list.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    assert_eq!(listed.len(), Family::all().count(), "{listed:?}");
    for folder in folders() {
        let entry = format!("&{folder}::");
        // A folder whose family is still being written (its networks, not yet its pipeline)
        // has no `ModelFamily` and is not listed until it runs end to end.
        let module = std::fs::read_to_string(src().join("families").join(&folder).join("mod.rs"));
        let is_family = module.unwrap().contains("impl ModelFamily for");
        assert_eq!(
            listed.iter().filter(|l| l.starts_with(&entry)).count(),
            usize::from(is_family),
            "the registry lists `{folder}` once, when it is a family: {listed:?}"
        );
        assert!(
            registry.contains(&format!("pub mod {folder};")),
            "`{folder}` is a module of the registry"
        );
    }
}

#[test]
fn the_registry_reads_the_family_from_the_model_index() {
    let name = |json: &str| Family::from_model_index(json.as_bytes()).map(|f| f.name());
    for f in Family::all() {
        for class in f.class_names() {
            assert_eq!(
                name(&format!(r#"{{"_class_name": "{class}"}}"#)),
                Ok(f.name())
            );
        }
    }
    // A `model_index.json` without `_class_name` is the first family's.
    assert_eq!(name("{}"), Ok(Family::default_family().name()));
    let err = name(r#"{"_class_name": "SomeOtherPipeline"}"#).unwrap_err();
    assert!(err.contains("SomeOtherPipeline"), "{err}");
    for f in Family::all() {
        assert!(err.contains(f.class_names()[0]), "{err}");
    }
}

#[test]
fn options_a_family_lacks_are_refused_by_name() {
    use zimage::families::Feature;
    let all = [
        Feature::ControlNet,
        Feature::CfgTruncation,
        Feature::CfgNormalization,
        Feature::NegativePrompt,
        Feature::References,
    ];
    for f in Family::all() {
        for feature in all {
            let refused = f.refuse(&[feature]);
            assert_eq!(refused.is_ok(), f.takes(feature));
            if let Err(e) = refused {
                assert!(e.contains(feature.flag()) && e.contains(f.name()), "{e}");
            }
        }
    }
}
