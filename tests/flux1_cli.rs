//! FLUX.1 through the command line: \[dev\], \[schnell\] and Kontext imported from their diffusers
//! directories (sharing every blob they have in common), listed and shown with their family and
//! kind, generated from the store pixel for pixel as the library makes them from the directory,
//! true guidance recorded in the picture's metadata, and what a model lacks refused by name.

mod common;

use common::{s, zimage_in};
use std::ops::ControlFlow;
use std::path::Path;
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::flux1::Flux1Pipeline;
use zimage::mlx::Dtype;
use zimage::pipeline::Request;

fn models() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/models"))
}

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

fn parameters(png: &Path) -> String {
    let text = zimage::image_out::read_png_text(png).unwrap();
    text.into_iter().find(|(k, _)| k == "parameters").unwrap().1
}

#[test]
fn stored_flux1_models_draw_what_the_library_draws_and_share_their_blobs() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    for (name, dir) in [
        ("dev", "flux1-dev-tiny"),
        ("kontext", "flux1-kontext-tiny"),
        ("schnell", "flux1-schnell-tiny"),
    ] {
        let out = zimage_in(&store, &["create", name, "--from", s(&models().join(dir))]);
        assert!(out.status.success(), "{}", text(&out));
        let said = text(&out);
        // Kontext \[dev\] is \[dev\]'s weights as another pipeline; \[schnell\] shares the text
        // encoders and the VAE.
        match name {
            "kontext" => assert!(said.contains(" 0 blobs written"), "{said}"),
            "schnell" => assert!(!said.contains(" 0 already present"), "{said}"),
            _ => {}
        }
    }
    let listed = text(&zimage_in(&store, &["list"]));
    assert_eq!(listed.matches("FLUX.1").count(), 3, "{listed}");
    for (name, kind) in [
        ("dev", "28 steps, guidance 3.5 ([dev] model)"),
        ("kontext", "(Kontext [dev] model)"),
        ("schnell", "4 steps, guidance 0 ([schnell] model)"),
    ] {
        let shown = text(&zimage_in(&store, &["show", name]));
        assert!(shown.contains("family      FLUX.1"), "{shown}");
        assert!(shown.contains(kind), "{shown}");
        assert!(shown.contains("text_encoder_2"), "{shown}");
    }

    // True guidance: the command line's picture is the library's, and its metadata says so.
    let png = tmp.path().join("cat.png");
    let args = [
        "generate",
        "a cat on a sofa",
        "--model",
        "dev",
        "--negative",
        "blurry, dark",
        "--true-cfg",
        "2",
        "--width",
        "72",
        "--height",
        "64",
        "--steps",
        "3",
        "--seed",
        "7",
        "--dtype",
        "f32",
        "-o",
        s(&png),
    ];
    let out = zimage_in(&store, &args);
    assert!(out.status.success(), "{}", text(&out));
    let ours = image::open(&png).unwrap().to_rgb8().into_raw();
    let dir = DiffusersDir::open(&models().join("flux1-dev-tiny")).unwrap();
    let mut p = Flux1Pipeline::new(dir, Dtype::F32).unwrap();
    p.set_true_cfg(2.0);
    let req = Request {
        prompt: "a cat on a sofa".into(),
        negative_prompt: Some("blurry, dark".into()),
        width: 72,
        height: 64,
        steps: 3,
        guidance: 3.5,
        cfg_normalization: false,
        cfg_truncation: 1.0,
        seed: 7,
        noise: None,
        input: None,
    };
    let theirs = p
        .generate(&req, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    assert!(ours == theirs.rgb, "the stored model draws another picture");
    let params = parameters(&png);
    assert!(
        params.contains("\nNegative prompt: blurry, dark\n")
            && params.contains("True CFG scale: 2"),
        "{params}"
    );

    // Weights streamed from the store block by block (T5's and the transformer's) draw the
    // same picture.
    let streamed = tmp.path().join("streamed.png");
    let args = [
        "generate",
        "a cat on a sofa",
        "--model",
        "dev",
        "--negative",
        "blurry, dark",
        "--true-cfg",
        "2",
        "--width",
        "72",
        "--height",
        "64",
        "--steps",
        "3",
        "--seed",
        "7",
        "--dtype",
        "f32",
        "--weights",
        "streamed",
        "-o",
        s(&streamed),
    ];
    let out = zimage_in(&store, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(image::open(&streamed).unwrap().to_rgb8().into_raw() == ours);

    // [schnell] has no guidance embedder: a guidance scale changes nothing, as in diffusers,
    // and the command line says it was ignored.
    let mut drawn = Vec::new();
    for guidance in ["", "7"] {
        let png = tmp.path().join(format!("schnell-{guidance}.png"));
        let mut args = vec![
            "generate",
            "a lighthouse",
            "--model",
            "schnell",
            "--width",
            "64",
            "--height",
            "48",
            "--steps",
            "2",
            "-o",
            s(&png),
        ];
        if !guidance.is_empty() {
            args.extend(["--guidance", guidance]);
        }
        let out = zimage_in(&store, &args);
        assert!(out.status.success(), "{}", text(&out));
        let warned = String::from_utf8_lossy(&out.stderr).contains("it was ignored");
        assert_eq!(warned, guidance == "7", "{}", text(&out));
        drawn.push(image::open(&png).unwrap().to_rgb8().into_raw());
    }
    assert!(drawn[0] == drawn[1], "[schnell] read the guidance scale");

    // What each model lacks, refused by name with nothing written.
    let picture = models().join("reference/inputs/picture-96x80.png");
    let refused = tmp.path().join("refused.png");
    for (args, needle) in [
        (
            vec!["--model", "dev", "--ref", s(&picture)],
            "--ref is not available for FLUX.1 [dev] models",
        ),
        (
            vec!["--model", "kontext", "--image", s(&picture)],
            "--image is not available for FLUX.1 Kontext [dev] models",
        ),
        (
            vec![
                "--model",
                "kontext",
                "--ref",
                s(&picture),
                "--ref",
                s(&picture),
            ],
            "a Kontext model edits one",
        ),
        (vec!["--model", "dev", "--true-cfg", "2"], "add --negative"),
        (
            vec!["--model", "dev", "--true-cfg", "0.5", "--negative", "x"],
            "--true-cfg is 0.5",
        ),
    ] {
        let mut all = vec!["generate", "a fox", "-o", s(&refused)];
        all.extend(args);
        let out = zimage_in(&store, &all);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains(needle), "{}", text(&out));
        assert!(!refused.exists());
    }
}

/// Both graphs draw diffusers' picture from a model directory: the CPU's and the GPU's form
/// (`ZIMAGE_GRAPH=gpu`, run on MLX's CPU backend), in f32, with a Kontext edit as well.
#[test]
fn both_graphs_draw_diffusers_picture() {
    let tmp = tempfile::tempdir().unwrap();
    let refs = models().join("reference");
    for (graph, case, model, extra) in [
        ("cpu", "t2i-dev", "flux1-dev-tiny", vec![]),
        ("gpu", "t2i-dev", "flux1-dev-tiny", vec![]),
        (
            "gpu",
            "inpaint",
            "flux1-dev-tiny",
            vec!["--image", "--mask"],
        ),
    ] {
        let st = zimage::mlx::io::load_safetensors(&refs.join(format!("flux1-{case}.safetensors")))
            .unwrap();
        let call: serde_json::Value = serde_json::from_str(&st.metadata["case"]).unwrap();
        let png = tmp.path().join(format!("{graph}-{case}.png"));
        let num = |k: &str| call[k].as_f64().unwrap().to_string();
        let mut args: Vec<String> = [
            "generate",
            call["prompt"].as_str().unwrap(),
            "--model",
            s(&models().join(model)),
            "--dtype",
            "f32",
            "-o",
            s(&png),
        ]
        .map(String::from)
        .to_vec();
        for (flag, key) in [
            ("--width", "width"),
            ("--height", "height"),
            ("--steps", "num_inference_steps"),
            ("--guidance", "guidance_scale"),
            ("--seed", "seed"),
        ] {
            args.extend([flag.to_string(), num(key)]);
        }
        if extra.contains(&"--image") {
            let picture = refs.join(call["image"].as_str().unwrap());
            let mask = refs.join(call["mask_image"].as_str().unwrap());
            args.extend(["--image".into(), s(&picture).into(), "--mask".into()]);
            args.extend([s(&mask).into(), "--strength".into(), num("strength")]);
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_zimage"))
            .args(&args)
            .env("ZIMAGE_GRAPH", graph)
            .output()
            .unwrap();
        assert!(out.status.success(), "{graph} {case}: {}", text(&out));
        let ours = image::open(&png).unwrap().to_rgb8().into_raw();
        let theirs = st.tensors["image"].to_vec::<u8>().unwrap();
        let (same, worst) = common::compare_pixels(&ours, &theirs);
        println!(
            "{graph} graph, {case}: {:.4}% identical, worst off by {worst}",
            same * 100.0
        );
        assert!(
            same >= 0.999 && worst <= 1,
            "{graph} {case}: {same}, {worst}"
        );
    }
}
