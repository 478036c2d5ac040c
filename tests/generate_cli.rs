//! `zimage generate` end to end: through the store, with the PNG metadata read back.

use std::path::Path;
use std::process::Command;
use zimage::image_out::read_png_text;
use zimage::mlx::io;

fn models() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

#[test]
fn demo_generate_writes_a_png_whose_metadata_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("fox.png");
    let out = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .env("ZIMAGE_CACHE_DIR", dir.path().join("cache"))
        .args(["--store", dir.path().join("empty-store").to_str().unwrap()])
        .args([
            "generate",
            "a red fox in the snow",
            "--width",
            "64",
            "--height",
            "48",
            "-o",
            png.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("weights are random"));
    let img = image::open(&png).unwrap();
    assert_eq!((img.width(), img.height()), (64, 48));
    let text = read_png_text(&png).unwrap();
    let params = &text.iter().find(|(k, _)| k == "parameters").unwrap().1;
    assert!(
        params.starts_with("a red fox in the snow\nSteps: 8, Sampler: Euler"),
        "{params}"
    );
    assert!(
        params.contains("Seed: 42")
            && params.contains("Size: 64x48")
            && params.contains("Model hash: ")
    );
    let json: serde_json::Value =
        serde_json::from_str(&text.iter().find(|(k, _)| k == "zimage").unwrap().1).unwrap();
    assert_eq!(json["request"]["prompt"], "a red fox in the snow");
    assert_eq!(json["model_identity"].as_str().unwrap().len(), 64);
}

#[test]
fn stored_model_with_reference_noise_reproduces_diffusers_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_zimage"))
            .arg("--store")
            .arg(&store)
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[
        "create",
        "tiny",
        "--from",
        models().join("z-image-tiny").to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference = io::load_safetensors(&models().join("reference/square.safetensors")).unwrap();
    let noise = dir.path().join("noise.safetensors");
    io::save_safetensors(
        &noise,
        &[("noise", &reference.tensors["latents_init"])],
        &[],
    )
    .unwrap();
    let png = dir.path().join("out.png");
    let out = run(&[
        "generate",
        "a red fox in the snow",
        "--model",
        "tiny",
        "--width",
        "128",
        "--height",
        "128",
        "--noise",
        noise.to_str().unwrap(),
        "-o",
        png.to_str().unwrap(),
        "--verbose",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("denoise"));
    let ours = image::open(&png).unwrap().to_rgb8().into_raw();
    let want = reference.tensors["image_u8"].to_vec::<u8>().unwrap();
    let same = ours.iter().zip(&want).filter(|(a, b)| a == b).count() as f64 / want.len() as f64;
    let worst = ours
        .iter()
        .zip(&want)
        .map(|(a, b)| (*a as i32 - *b as i32).abs())
        .max()
        .unwrap();
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, worst {worst}"
    );

    // A noise file of the wrong shape is refused with the field named.
    let out = run(&[
        "generate",
        "x",
        "--model",
        "tiny",
        "--width",
        "64",
        "--height",
        "64",
        "--noise",
        noise.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tensor `noise` has shape"));
    // So is a size the model cannot take.
    let out = run(&[
        "generate", "x", "--model", "tiny", "--width", "100", "--height", "64",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("multiples of 16"));
}

#[test]
fn preview_writes_the_last_steps_picture_and_changes_no_pixel_of_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let generate = |out: &Path, extra: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_zimage"))
            .env("ZIMAGE_CACHE_DIR", &cache)
            .args(["--store", dir.path().join("empty-store").to_str().unwrap()])
            .args(["generate", "a red fox in the snow", "--width", "64"])
            .args([
                "--height",
                "48",
                "--steps",
                "3",
                "-o",
                out.to_str().unwrap(),
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::read(out).unwrap()
    };
    let plain = generate(&dir.path().join("plain.png"), &[]);
    let preview = dir.path().join("preview.png");
    let with_preview = generate(
        &dir.path().join("with.png"),
        &["--preview", preview.to_str().unwrap()],
    );
    assert!(plain == with_preview, "--preview changed the image");
    // One pixel per latent cell: an eighth of the image each way.
    let picture = image::open(&preview).unwrap();
    assert_eq!((picture.width(), picture.height()), (8, 6));
    // The map was fitted against the demo's VAE once, and cached by its weights.
    let cached: Vec<_> = std::fs::read_dir(cache.join("previews"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    let map: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cached[0]).unwrap()).unwrap();
    assert_eq!(map["channels"], 16);
    assert_eq!(map["weights"].as_array().unwrap().len(), 3 * 16);
    assert!(map["r2"].as_f64().unwrap() > 0.0, "{map}");
    // A folder that does not exist is refused before anything loads.
    let output = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .args(["generate", "x", "--preview", "/nonexistent-folder/p.png"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--preview `/nonexistent-folder/p.png`")
    );
}
