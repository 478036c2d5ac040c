//! FLUX.2 [klein] through the command line: imported from its diffusers directory, listed and
//! shown with its family, generated from the store pixel for pixel as from its directory, and
//! the options klein lacks refused by name.

mod common;

use common::{compare_pixels, klein_reference_image, s, zimage_in};
use std::ops::ControlFlow;
use std::path::Path;
use zimage::pipeline::klein::KleinPipeline;
use zimage::pipeline::Request;

fn models() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/models"))
}

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn a_stored_klein_generates_what_the_library_makes() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = models().join("flux2-klein-tiny");
    let out = zimage_in(&store, &["create", "klein", "--from", s(&dir)]);
    assert!(out.status.success(), "{}", text(&out));

    let out = zimage_in(&store, &["list"]);
    assert!(text(&out).contains("FLUX.2 [klein]"), "{}", text(&out));
    let out = zimage_in(&store, &["show", "klein"]);
    let shown = text(&out);
    assert!(shown.contains("family      FLUX.2 [klein]"), "{shown}");
    assert!(
        shown.contains("4 steps, guidance 1 (distilled model)"),
        "{shown}"
    );

    // The command line's picture is the library's, whose parity with diffusers
    // `klein_parity` checks (the command line takes sides in multiples of 16).
    let png = tmp.path().join("fox.png");
    let args = [
        "generate",
        "a red fox in the snow",
        "--model",
        "klein",
        "--width",
        "96",
        "--height",
        "64",
        "--seed",
        "42",
        "--dtype",
        "f32",
        "-o",
        s(&png),
    ];
    let out = zimage_in(&store, &args);
    assert!(out.status.success(), "{}", text(&out));
    let ours = image::open(&png).unwrap().to_rgb8().into_raw();
    let dir = zimage::diffusers_dir::DiffusersDir::open(&dir).unwrap();
    let mut p = KleinPipeline::new(dir, zimage::mlx::Dtype::F32).unwrap();
    let req = Request {
        prompt: "a red fox in the snow".into(),
        negative_prompt: None,
        width: 96,
        height: 64,
        steps: 4,
        guidance: 1.0,
        cfg_normalization: false,
        cfg_truncation: 1.0,
        seed: 42,
        noise: None,
        input: None,
    };
    let made = p
        .generate(&req, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(
        ours, made.rgb,
        "the stored klein's picture differs from the directory's"
    );

    // `--noise`: the file holding what seed 42 draws (`[1, C, h, w]` over the token grid, the
    // tiny model's 64 channels at 96×64 / 8) makes the seed's picture whatever `--seed` says.
    let noise = tmp.path().join("noise.safetensors");
    let values = zimage::torch_rng::Generator::new(42)
        .randn(64 * 8 * 12)
        .unwrap();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    common::write_safetensors(
        &noise,
        &[(
            "noise",
            zimage::safetensors::Dtype::F32,
            vec![1, 64, 8, 12],
            bytes,
        )],
    );
    let from_noise = tmp.path().join("from-noise.png");
    let mut flags = args.to_vec();
    flags.truncate(flags.len() - 1);
    flags.extend([s(&from_noise), "--noise", s(&noise)]);
    let seed = flags.iter().position(|f| *f == "42").unwrap();
    flags[seed] = "7";
    let out = zimage_in(&store, &flags);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(image::open(&from_noise).unwrap().to_rgb8().into_raw(), ours);

    // Live previews: the last step's picture at the VAE's scale (4 in the tiny model, whose VAE
    // is one level shallower than the real one), fitted on its 16 latent channels; the image's
    // bytes unchanged.
    let preview = tmp.path().join("preview.png");
    let with = tmp.path().join("with-preview.png");
    let mut flags = args.to_vec();
    flags.truncate(flags.len() - 1);
    flags.extend([s(&with), "--preview", s(&preview), "-v"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zimage"))
        .env("ZIMAGE_CACHE_DIR", tmp.path().join("cache"))
        .arg("--store")
        .arg(&store)
        .args(&flags)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        std::fs::read(&png).unwrap() == std::fs::read(&with).unwrap(),
        "--preview changed the image"
    );
    let picture = image::open(&preview).unwrap();
    assert_eq!((picture.width(), picture.height()), (24, 16));
    let cached: Vec<_> = std::fs::read_dir(tmp.path().join("cache/previews"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    let map: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cached[0]).unwrap()).unwrap();
    assert_eq!(
        (map["format"].as_str(), map["channels"].as_u64()),
        (Some("flux2"), Some(16))
    );
}

#[test]
fn options_klein_lacks_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = models().join("flux2-klein-tiny");
    let base = ["generate", "a fox", "--model", s(&dir), "--width", "64"];
    let picture = models().join("reference/inputs/picture-96x80.png");
    let cases: [(&[&str], &str); 3] = [
        (
            &["--cfg-truncation", "0.5"],
            "--cfg-truncation is not available",
        ),
        (
            &["--cfg-normalization"],
            "--cfg-normalization is not available",
        ),
        (
            &["--controlnet", s(&dir), "--control", s(&picture)],
            "--controlnet/--control is not available",
        ),
    ];
    for (extra, expected) in cases {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let out = zimage_in(&store, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(expected), "{args:?}: {}", text(&out));
    }
}

/// `--ref`: the output takes the reference's size and matches diffusers' edit of it.
#[test]
fn an_edit_from_a_reference_matches_diffusers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = models().join("flux2-klein-tiny");
    let picture = models().join("reference/inputs/picture-96x80.png");
    let png = tmp.path().join("snowy.png");
    let args = [
        "generate",
        "make it snowy",
        "--model",
        s(&dir),
        "--ref",
        s(&picture),
        "--seed",
        "5",
        "--dtype",
        "f32",
        "-o",
        s(&png),
    ];
    let out = zimage_in(&tmp.path().join("store"), &args);
    assert!(out.status.success(), "{}", text(&out));
    let ours = image::open(&png).unwrap().to_rgb8();
    assert_eq!(ours.dimensions(), (96, 80));
    let (same, worst) = compare_pixels(&ours.into_raw(), &klein_reference_image("edit1"));
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, worst {worst}"
    );

    // Z-Image takes no references.
    let zimage = models().join("z-image-tiny");
    let args = [
        "generate",
        "a fox",
        "--model",
        s(&zimage),
        "--ref",
        s(&picture),
    ];
    let out = zimage_in(&tmp.path().join("store"), &args);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--ref is not available for Z-Image"),
        "{}",
        text(&out)
    );
}

/// `--image --mask --strength`: klein inpaints at the picture's size, as diffusers does. The
/// picture is resized (100×75 → 96×72) by a Lanczos-3 that is close to, not bit-identical
/// with, PIL's, so pixels may differ by a level or two (`klein_parity` checks the pipeline
/// itself from diffusers' resized picture: 99.99% identical).
#[test]
fn inpainting_from_the_command_line_matches_diffusers() {
    let tmp = tempfile::tempdir().unwrap();
    let inputs = models().join("reference/klein-inputs");
    let png = tmp.path().join("inpainted.png");
    let model = models().join("flux2-klein-tiny");
    let (picture, mask) = (
        inputs.join("picture-100x75.png"),
        inputs.join("mask-100x75.png"),
    );
    let args = [
        "generate",
        "a red fox in the snow",
        "--model",
        s(&model),
        "--image",
        s(&picture),
        "--mask",
        s(&mask),
        "--strength",
        "0.8",
        "--steps",
        "6",
        "--seed",
        "11",
        "--dtype",
        "f32",
        "-o",
        s(&png),
    ];
    let out = zimage_in(&tmp.path().join("store"), &args);
    assert!(out.status.success(), "{}", text(&out));
    let ours = image::open(&png).unwrap().to_rgb8();
    assert_eq!(ours.dimensions(), (96, 72));
    let (same, worst) = compare_pixels(&ours.into_raw(), &klein_reference_image("inpaint"));
    println!("inpaint from the command line: {same} identical, worst off by {worst}");
    assert!(worst <= 2, "{same} identical, worst {worst}");
}
