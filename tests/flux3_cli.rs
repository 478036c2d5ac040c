//! FLUX.3 [klein] through the command line: imported from its diffusers directory (a modular
//! pipeline's), listed and shown with its family, generated from the store pixel for pixel as
//! from its directory, and the options it lacks refused by name.

mod common;

use common::{s, zimage_in};
use std::ops::ControlFlow;
use std::path::Path;
use zimage::families::flux3_klein::Flux3Pipeline;
use zimage::pipeline::Request;

fn models() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/models"))
}

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn a_stored_flux3_generates_what_the_library_makes_and_refuses_what_it_lacks() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = models().join("flux3-klein-tiny");
    let out = zimage_in(&store, &["create", "flux3", "--from", s(&dir)]);
    assert!(out.status.success(), "{}", text(&out));

    let out = zimage_in(&store, &["list"]);
    assert!(text(&out).contains("FLUX.3 [klein]"), "{}", text(&out));
    let out = zimage_in(&store, &["show", "flux3"]);
    let shown = text(&out);
    assert!(shown.contains("FLUX.3 [klein]"), "{shown}");
    assert!(shown.contains("16 steps"), "{shown}");

    // The command line's picture is the library's, whose parity with diffusers
    // `flux3_parity` checks.
    let png = tmp.path().join("fox.png");
    let args = [
        "generate",
        "a red fox in the snow",
        "--model",
        "flux3",
        "--width",
        "96",
        "--height",
        "64",
        "--steps",
        "3",
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
    let mut p = Flux3Pipeline::new(dir, zimage::mlx::Dtype::F32).unwrap();
    let req = Request {
        prompt: "a red fox in the snow".into(),
        negative_prompt: None,
        width: 96,
        height: 64,
        steps: 3,
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
        "the stored model's picture differs from the directory's"
    );

    // No image-to-image or inpainting: refused by the option's name.
    let picture = models().join("reference/inputs/picture-96x80.png");
    let mask = models().join("reference/inputs/mask-96x80.png");
    let mut image_args = args[..args.len() - 1].to_vec();
    let other = tmp.path().join("other.png");
    image_args.extend([s(&other), "--image", s(&picture)]);
    let out = zimage_in(&store, &image_args);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("--image is not available for FLUX.3 [klein]"),
        "{}",
        text(&out)
    );
    image_args.extend(["--mask", s(&mask)]);
    let out = zimage_in(&store, &image_args);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("--mask is not available for FLUX.3 [klein]"),
        "{}",
        text(&out)
    );
    assert!(!other.exists());
}
