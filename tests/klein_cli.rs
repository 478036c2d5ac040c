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

/// The memory plan holds for klein: a budget below what the request needs is refused before
/// anything loads, naming the smallest that works; under it the request runs, decoded in
/// tiles if need be; weights held as stored or streamed from the store draw the same picture
/// as weights in the compute dtype.
#[test]
fn klein_keeps_within_a_memory_limit_and_holds_its_weights_as_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = models().join("flux2-klein-tiny");
    let out = zimage_in(&store, &["create", "klein", "--from", s(&dir)]);
    assert!(out.status.success(), "{}", text(&out));
    let shown = text(&zimage_in(&store, &["show", "klein"]));
    assert!(
        shown.contains("run-time memory at 256×256") && shown.contains("the smallest budget"),
        "{shown}"
    );
    let run = |name: &str, extra: &[&str]| {
        let png = tmp.path().join(name);
        let mut args = vec![
            "generate",
            "a red fox",
            "--model",
            "klein",
            "--width",
            "128",
            "--height",
            "128",
            "--seed",
            "5",
            "--dtype",
            "f32",
            "-v",
            "-o",
        ];
        args.push(s(&png));
        args.extend(extra);
        (zimage_in(&store, &args), png)
    };
    let (out, whole) = run("whole.png", &[]);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("estimate denoise"), "{log}");

    let (out, _) = run("refused.png", &["--memory-limit", "2MB"]);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(!log.lines().any(|l| l.starts_with("text ")), "{log}");
    let needs: Vec<&str> = (log.split("needs at least ").nth(1))
        .unwrap_or_else(|| panic!("no figure named: {log}"))
        .split_whitespace()
        .take(2)
        .collect();
    let (out, _) = run("fits.png", &["--memory-limit", &needs.concat()]);
    assert!(out.status.success(), "{}", text(&out));

    let pixels = |png: &Path| image::open(png).unwrap().to_rgb8().into_raw();
    for weights in ["stored", "streamed"] {
        let (out, png) = run(&format!("{weights}.png"), &["--weights", weights]);
        let log = text(&out);
        assert!(out.status.success(), "{log}");
        let (a, b) = (pixels(&png), pixels(&whole));
        let most = a.iter().zip(&b).map(|(x, y)| x.abs_diff(*y)).max().unwrap();
        assert!(most <= 1, "--weights {weights}: max diff {most}: {log}");
    }
}
