//! Batches and the hires pass, end to end on the tiny model: image k of `--count N` is the
//! single run from seed + k, and `--hires-scale` is a plain run followed by image-to-image of
//! its picture at the larger size.

use std::path::Path;
use zimage::image_out::read_png_text;

mod common;
use common::s;

fn store(dir: &Path) -> std::path::PathBuf {
    let store = dir.join("store");
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let out = common::zimage_in(&store, &["create", "tiny", "--from", s(&tiny)]);
    assert!(out.status.success(), "{out:?}");
    store
}

fn generate(store: &Path, flags: &[&str]) -> String {
    let mut args = vec!["generate", "a red fox in the snow", "--model", "tiny"];
    args.extend(flags);
    let out = common::zimage_in(store, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn rgb(path: &Path) -> Vec<u8> {
    image::open(path).unwrap().to_rgb8().into_raw()
}

fn parameters(path: &Path) -> String {
    let text = read_png_text(path).unwrap();
    text.into_iter().find(|(k, _)| k == "parameters").unwrap().1
}

#[test]
fn each_image_of_a_batch_is_the_single_run_from_its_seed() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let size = ["--width", "64", "--height", "48", "--steps", "2"];
    let out = dir.path().join("fox.png");
    let mut flags = vec!["--seed", "11", "--count", "4", "-o", s(&out), "-v"];
    flags.extend(size);
    let said = generate(&store, &flags);
    for k in 0..4u64 {
        let numbered = dir.path().join(format!("fox-{}.png", k + 1));
        assert!(said.contains(&format!("seed {}", 11 + k)), "{said}");
        let single = dir.path().join(format!("single-{k}.png"));
        let seed = (11 + k).to_string();
        let mut flags = vec!["--seed", &seed, "-o", s(&single)];
        flags.extend(size);
        generate(&store, &flags);
        assert!(
            std::fs::read(&numbered).unwrap() == std::fs::read(&single).unwrap(),
            "image {} of the batch differs from the single run with seed {seed}",
            k + 1
        );
        assert!(parameters(&numbered).contains(&format!("Seed: {seed}")));
    }
    assert!(!out.exists(), "a batch writes numbered files only");
    assert!(rgb(&dir.path().join("fox-1.png")) != rgb(&dir.path().join("fox-2.png")));
}

#[test]
fn a_hires_pass_is_image_to_image_of_the_first_picture_at_the_larger_size() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let hires = dir.path().join("hires.png");
    let said = generate(
        &store,
        &[
            "--width",
            "64",
            "--height",
            "48",
            "--steps",
            "3",
            "--seed",
            "5",
            "--hires-scale",
            "2",
            "--hires-strength",
            "0.6",
            "--hires-steps",
            "4",
            "-o",
            s(&hires),
        ],
    );
    assert!(said.contains("128×96"), "{said}");
    let first = dir.path().join("first.png");
    generate(
        &store,
        &[
            "--width",
            "64",
            "--height",
            "48",
            "--steps",
            "3",
            "--seed",
            "5",
            "-o",
            s(&first),
        ],
    );
    let second = dir.path().join("second.png");
    generate(
        &store,
        &[
            "--image",
            s(&first),
            "--width",
            "128",
            "--height",
            "96",
            "--strength",
            "0.6",
            "--steps",
            "4",
            "--seed",
            "5",
            "-o",
            s(&second),
        ],
    );
    assert!(
        rgb(&hires) == rgb(&second),
        "the hires pass differs from image-to-image of the first picture"
    );
    let params = parameters(&hires);
    for field in [
        "Size: 64x48",
        "Steps: 3",
        "Denoising strength: 0.6",
        "Hires upscale: 2",
        "Hires steps: 4",
        "Hires upscaler: Lanczos",
    ] {
        assert!(params.contains(field), "no `{field}` in {params}");
    }
}

#[test]
fn hires_and_count_bounds_are_refused_before_anything_loads() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("empty");
    for (flags, needle) in [
        (vec!["--hires-scale", "0.5"], "--hires-scale is 0.5"),
        (vec!["--hires-scale", "9"], "--hires-scale is 9"),
        (
            vec!["--hires-scale", "2", "--hires-strength", "0"],
            "--hires-strength is 0",
        ),
        (vec!["--hires-strength", "0.5"], "need --hires-scale"),
        (vec!["--count", "0"], "--count"),
        (vec!["--count", "101"], "--count"),
    ] {
        let mut args = vec!["generate", "a fox"];
        args.extend(&flags);
        let out = common::zimage_in(&store, &args);
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
}
