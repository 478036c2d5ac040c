//! Every shell block of the README and of `docs/` runs here, so that no command in them rots:
//! each file's blocks run in order in a sandbox of their own (a store holding the demo model
//! under the names the docs use, stand-ins for the files they name, the `zimage` under test
//! first on `PATH`). A block that needs what a test cannot have (a real model, the network, a
//! Mac) says so on its first line, `# needs: …`, and is not run.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// One fenced `sh` block: where it starts and its text.
struct Block {
    line: usize,
    text: String,
}

fn sh_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, bool, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match &mut open {
            None if fence => {
                let info = line.trim_start().trim_start_matches('`').trim();
                open = Some((i + 1, info == "sh", String::new()));
            }
            Some((start, is_sh, text)) if fence => {
                if *is_sh {
                    blocks.push(Block {
                        line: *start,
                        text: std::mem::take(text),
                    });
                }
                open = None;
            }
            Some((_, _, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    blocks
}

/// What a block says it needs instead of running, if anything.
fn needs(block: &Block) -> Option<&str> {
    block
        .text
        .lines()
        .next()
        .and_then(|l| l.trim().strip_prefix("# needs:"))
        .map(str::trim)
}

fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

/// A sandbox the docs' commands run in: the demo model stored as the names they use and as the
/// directories they import from, and the pictures and files they name.
fn sandbox(dir: &Path) -> Vec<(String, String)> {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_zimage"), bin.join("zimage")).unwrap();
    let store = dir.join("store");
    for from in ["Z-Image-Turbo", "Z-Image"] {
        common::copy_model(&demo, &dir.join(from));
    }
    let klein = demo.with_file_name("flux2-klein-tiny");
    common::copy_model(&klein, &dir.join("FLUX.2-klein-4B"));
    for name in ["z-image-turbo", "me/z-image-turbo"] {
        let out = common::zimage_in(&store, &["create", name, "--from", common::s(&demo)]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The pictures and files the docs' examples name, at the demo model's size.
    let mut mask = image::GrayImage::new(256, 256);
    for (x, y, p) in mask.enumerate_pixels_mut() {
        let inside = (x as i32 - 128).pow(2) + (y as i32 - 64).pow(2) < 48 * 48;
        *p = image::Luma([if inside { 255 } else { 0 }]);
    }
    for name in ["hat.png", "door-mask.png"] {
        mask.save(dir.join(name)).unwrap();
    }
    let picture = image::RgbImage::from_fn(256, 256, |x, y| image::Rgb([x as u8, y as u8, 128]));
    for name in ["fox.png", "sketch.png", "house.png"] {
        picture.save(dir.join(name)).unwrap();
    }
    for name in ["style.safetensors", "detail.safetensors"] {
        common::server::write_attention_lora(&dir.join(name));
    }
    let weights = demo.join("transformer/diffusion_pytorch_model.safetensors");
    for name in ["model.safetensors", "a.safetensors"] {
        std::fs::copy(&weights, dir.join(name)).unwrap();
    }
    std::fs::write(dir.join("meta.json"), r#"{"author": "someone"}"#).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    vec![
        ("PATH".into(), path),
        ("HOME".into(), dir.join("home").display().to_string()),
        ("ZIMAGE_MODELS".into(), store.display().to_string()),
        (
            "ZIMAGE_CACHE_DIR".into(),
            dir.join("cache").display().to_string(),
        ),
    ]
}

#[test]
fn every_shell_block_in_the_docs_runs_or_says_what_it_needs() {
    let mut ran = 0;
    let mut failures = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let blocks = sh_blocks(&text);
        let runnable: Vec<&Block> = blocks.iter().filter(|b| needs(b).is_none()).collect();
        for b in &blocks {
            if needs(b) == Some("") {
                failures.push(format!(
                    "{}:{}: `# needs:` says nothing",
                    doc.display(),
                    b.line
                ));
            }
        }
        if runnable.is_empty() {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        let env = sandbox(dir.path());
        for block in runnable {
            let out = Command::new("bash")
                .args(["-euo", "pipefail", "-c", &block.text])
                .current_dir(dir.path())
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .output()
                .unwrap();
            ran += 1;
            if !out.status.success() {
                failures.push(format!(
                    "{}:{}: the block failed ({}):\n{}\n{}",
                    doc.display(),
                    block.line,
                    out.status,
                    block.text,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(ran > 0, "no block ran");
}
