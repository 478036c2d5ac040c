//! ControlNet generation against diffusers 0.42.1 (`ZImageControlNetPipeline`,
//! `ZImageControlNetInpaintPipeline`) in f32 from the seed alone, with the tiny ControlNets of
//! `models/make_controlnet.py`: on the demo model (2.1, 1.0, 2.1 inpaint) and on the held-out
//! model unlike it (another width, head count and depth, control blocks at layers [0, 2], a VAE
//! that halves twice, guidance on), from a directory and from a stored name; scale 0 against
//! the plain picture; and the command line's refusals.

mod common;

use image::{GrayImage, RgbImage};
use std::path::{Path, PathBuf};
use std::process::Output;
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::zimage::controlnet_source::ControlNetSource;
use zimage::families::zimage::Pipeline;
use zimage::mlx::{io, Array, Dtype};
use zimage::pipeline::{ControlInput, ImageInput, Request};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

/// `control_image` of make_controlnet.py: red and green ramps, a 16-pixel checkerboard in blue.
fn control_image(width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        let r = (x * 255) / (width - 1).max(1);
        let g = (y * 255) / (height - 1).max(1);
        let b = ((x / 16 + y / 16) % 2) * 255;
        image::Rgb([r as u8, g as u8, b as u8])
    })
}

/// The picture the inpaint references repaint: the control image mirrored left to right.
fn picture(width: u32, height: u32) -> RgbImage {
    image::imageops::flip_horizontal(&control_image(width, height))
}

/// `mask_image` of make_controlnet.py: the centre half white.
fn mask_image(width: u32, height: u32) -> GrayImage {
    GrayImage::from_fn(width, height, |x, y| {
        let inside =
            (height / 4..3 * height / 4).contains(&y) && (width / 4..3 * width / 4).contains(&x);
        image::Luma([if inside { 255 } else { 0 }])
    })
}

struct Case {
    name: String,
    tensors: std::collections::HashMap<String, Array>,
    meta: serde_json::Value,
}

fn load(case: &str) -> Case {
    let path = models().join(format!("reference/{case}.safetensors"));
    let st = io::load_safetensors(&path).unwrap();
    Case {
        name: case.into(),
        meta: serde_json::from_str(&st.metadata["case"]).unwrap(),
        tensors: st.tensors,
    }
}

impl Case {
    fn size(&self) -> (u32, u32) {
        let m = &self.meta;
        (
            m["width"].as_u64().unwrap() as u32,
            m["height"].as_u64().unwrap() as u32,
        )
    }

    fn inpaint(&self) -> bool {
        self.meta["mask"].is_string()
    }

    fn heldout(&self) -> bool {
        self.meta["model"] == "heldout"
    }

    /// The tiny ControlNet's layout name (`models/controlnet-tiny/NAME`).
    fn layout(&self) -> String {
        let layout = self.meta["layout"].as_str().unwrap();
        match self.heldout() {
            true => format!("heldout-{layout}"),
            false => layout.into(),
        }
    }

    fn model_dir(&self, tmp: &Path) -> PathBuf {
        match self.heldout() {
            true => common::heldout_dir(tmp),
            false => models().join("z-image-tiny"),
        }
    }

    fn request(&self) -> Request {
        let m = &self.meta;
        let (width, height) = self.size();
        Request {
            prompt: m["prompt"].as_str().unwrap().into(),
            negative_prompt: m["negative_prompt"].as_str().map(String::from),
            width,
            height,
            steps: m["steps"].as_u64().unwrap() as usize,
            guidance: m["guidance"].as_f64().unwrap() as f32,
            cfg_normalization: m["cfg_normalization"].as_bool().unwrap_or(false),
            cfg_truncation: m["cfg_truncation"].as_f64().unwrap_or(1.0),
            seed: m["seed"].as_u64().unwrap(),
            noise: None,
            input: self.inpaint().then(|| ImageInput {
                rgb: picture(width, height).into_raw(),
                mask: Some(
                    mask_image(width, height)
                        .into_raw()
                        .iter()
                        .map(|&v| u8::from(v >= 128))
                        .collect(),
                ),
                strength: 1.0,
            }),
        }
    }

    fn control(&self) -> ControlInput {
        let (width, height) = self.size();
        ControlInput {
            rgb: control_image(width, height).into_raw(),
            scale: self.meta["scale"].as_f64().unwrap() as f32,
        }
    }

    fn f32(&self, name: &str) -> Vec<f32> {
        self.tensors[name]
            .astype(Dtype::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    }

    /// The share of `rgb`'s values equal to diffusers', and the most any is off; asserts the
    /// acceptance bound (≥ 99.9% identical, none off by more than 1).
    fn check_pixels(&self, rgb: &[u8], how: &str) {
        let want: Vec<u8> = self.tensors["image_u8"].to_vec::<u8>().unwrap();
        assert_eq!(rgb.len(), want.len(), "{}: image size", self.name);
        let off: Vec<u8> = rgb.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
        let identical = off.iter().filter(|&&d| d == 0).count() as f64 / off.len() as f64;
        let worst = *off.iter().max().unwrap();
        println!(
            "{} ({how}): {:.4}% of values identical, max off by {worst}",
            self.name,
            identical * 100.0
        );
        assert!(
            identical >= 0.999 && worst <= 1,
            "{} ({how}): {identical} identical, max off {worst}",
            self.name
        );
    }
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A pipeline on the case's model with the case's tiny ControlNet, written to `tmp`.
fn pipeline(r: &Case, tmp: &Path) -> Pipeline<DiffusersDir> {
    let cn = tmp.join("controlnet");
    common::controlnet::write_tiny_dir(&r.layout(), &cn);
    let dir = r.model_dir(tmp);
    let mut p = Pipeline::new(DiffusersDir::open(&dir).unwrap(), Dtype::F32, false).unwrap();
    p.set_controlnet(Some(Box::new(ControlNetSource::open(&cn).unwrap())))
        .unwrap();
    p
}

/// The whole run from the seed through the library, compared stage by stage.
/// Held by each test that runs a pipeline in this process. Pipelines run side by side share
/// the process's BLAS workers, which then split a product's sum differently and move a value by
/// a rounding step; the comparisons here, exact ones included, hold for a pipeline run alone.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static PIPELINES: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PIPELINES.lock().unwrap_or_else(|p| p.into_inner())
}

fn check(case: &str) {
    let _alone = one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let r = load(case);
    let mut p = pipeline(&r, tmp.path());
    let (req, control) = (r.request(), r.control());

    // The control input as the ControlNet reads it (diffusers pads a 2.x one to 33 channels
    // before the call; ours pads inside the ControlNet).
    let encoder = p.load_vae_encoder().unwrap();
    let latents = zimage::families::zimage::control::control_latents(
        &encoder,
        &control,
        req.input.as_ref(),
        (req.width, req.height),
        None,
    )
    .unwrap();
    let want = r.f32("control_latents");
    let ours = latents.to_vec::<f32>().unwrap();
    let d = max_abs(&ours, &want[..ours.len()]);
    println!("{case}: control latents max-abs {d:.3e}");
    assert!(d <= 1e-4, "{case}: control latents differ by {d}");
    assert!(want[ours.len()..].iter().all(|&v| v == 0.0));

    let out = p
        .generate_controlled(&req, Some(&control), &mut |_| {
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    assert!(out.control_seconds.is_some_and(|s| s > 0.0));
    let vae = &p.configs.vae;
    let unscaled: Vec<f32> = (out.latents.to_vec::<f32>().unwrap().iter())
        .map(|v| v / vae.scaling_factor + vae.shift_factor.unwrap_or(0.0))
        .collect();
    let d = max_abs(&unscaled, &r.f32("vae_input"));
    println!("{case}: VAE input max-abs {d:.3e}");
    r.check_pixels(&out.rgb, "library, directory");
}

#[test]
fn controlnet_2_1_matches_diffusers() {
    check("controlnet-2.1");
}

#[test]
fn controlnet_1_0_matches_diffusers() {
    check("controlnet-1.0");
}

#[test]
fn controlnet_inpaint_2_1_matches_diffusers() {
    check("controlnet-inpaint-2.1");
}

#[test]
fn heldout_controlnet_2_1_with_guidance_matches_diffusers() {
    check("controlnet-heldout-2.1");
}

#[test]
fn heldout_controlnet_1_0_with_guidance_matches_diffusers() {
    check("controlnet-heldout-1.0");
}

#[test]
fn heldout_controlnet_inpaint_2_1_matches_diffusers() {
    check("controlnet-inpaint-heldout-2.1");
}

/// `cfg_normalization` and `cfg_truncation` together, both branches steered
/// (`models/make_guidance_reference.py`).
#[test]
fn heldout_controlnet_with_both_guidance_options_matches_diffusers() {
    check("guided-controlnet-heldout-2.1");
}

/// The inputs a command-line run reads, written as files.
struct Files {
    control: PathBuf,
    image: PathBuf,
    mask: PathBuf,
}

fn write_inputs(r: &Case, dir: &Path) -> Files {
    let (w, h) = r.size();
    let files = Files {
        control: dir.join("control.png"),
        image: dir.join("picture.png"),
        mask: dir.join("mask.png"),
    };
    control_image(w, h).save(&files.control).unwrap();
    picture(w, h).save(&files.image).unwrap();
    mask_image(w, h).save(&files.mask).unwrap();
    files
}

/// `zimage generate` for case `r` with `--controlnet controlnet`, into `out`.
fn generate(r: &Case, model: &Path, controlnet: &str, store: &Path, out: &Path) -> Output {
    let m = &r.meta;
    let files = write_inputs(r, out.parent().unwrap());
    let (w, h) = r.size();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_zimage"));
    cmd.env("ZIMAGE_CACHE_DIR", store.with_extension("cache"))
        .args(["--store", common::s(store), "generate"])
        .arg(m["prompt"].as_str().unwrap())
        .args(["--model", common::s(model), "--controlnet", controlnet])
        .args(["--control", common::s(&files.control)])
        .args(["--width", &w.to_string(), "--height", &h.to_string()])
        .args([
            "--steps",
            &m["steps"].to_string(),
            "--seed",
            &m["seed"].to_string(),
        ])
        .args(["--guidance", &m["guidance"].to_string()])
        .args(["--control-scale", &m["scale"].to_string()])
        .args(["--dtype", "f32", "-o", common::s(out)]);
    if r.inpaint() {
        cmd.args(["--image", common::s(&files.image)])
            .args(["--mask", common::s(&files.mask)]);
    }
    cmd.output().unwrap()
}

/// The command line, with the ControlNet stored by name (`zimage create NAME --from DIR`),
/// makes diffusers' picture and records the ControlNet in the PNG.
fn check_stored(case: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let r = load(case);
    let (cn, store) = (tmp.path().join("cn"), tmp.path().join("store"));
    common::controlnet::write_tiny_dir(&r.layout(), &cn);
    let created = common::zimage_in(&store, &["create", "tiny-cn", "--from", common::s(&cn)]);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let model = r.model_dir(tmp.path());
    let out = tmp.path().join("out.png");
    let run = generate(&r, &model, "tiny-cn", &store, &out);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let png = image::open(&out).unwrap().to_rgb8();
    r.check_pixels(png.as_raw(), "command line, stored name");
    let text = zimage::image_out::read_png_text(&out).unwrap();
    let params = &text.iter().find(|(k, _)| k == "parameters").unwrap().1;
    let version = r.meta["layout"].as_str().unwrap();
    let scale = r.meta["scale"].as_f64().unwrap();
    for want in [
        "ControlNet: tiny-cn".to_string(),
        format!("ControlNet version: {version}"),
        format!("ControlNet scale: {scale}"),
    ] {
        assert!(params.contains(&want), "{want} missing from {params}");
    }
    let json = &text.iter().find(|(k, _)| k == "zimage").unwrap().1;
    let json: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(json["control"]["controlnet"], "tiny-cn");
    assert_eq!(json["control"]["version"], version);
}

#[test]
fn controlnet_2_1_stored_by_name_matches_diffusers_from_the_command_line() {
    check_stored("controlnet-2.1");
}

#[test]
fn heldout_controlnet_2_1_stored_by_name_matches_diffusers_from_the_command_line() {
    check_stored("controlnet-heldout-2.1");
}

#[test]
fn heldout_controlnet_inpaint_stored_by_name_matches_diffusers_from_the_command_line() {
    check_stored("controlnet-inpaint-heldout-2.1");
}

/// A ControlNet directory on the command line, with `--verbose` and two runs (the ControlNet
/// kept loaded with the transformer): diffusers' picture, and the hints' cost and the
/// ControlNet's weights in the report.
#[test]
fn heldout_controlnet_1_0_from_a_directory_on_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let r = load("controlnet-heldout-1.0");
    let cn = tmp.path().join("cn");
    common::controlnet::write_tiny_dir(&r.layout(), &cn);
    let model = r.model_dir(tmp.path());
    let out = tmp.path().join("out.png");
    let store = tmp.path().join("store");
    let m = &r.meta;
    let files = write_inputs(&r, tmp.path());
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_zimage"))
        .env("ZIMAGE_CACHE_DIR", tmp.path().join("cache"))
        .args([
            "--store",
            common::s(&store),
            "generate",
            "-v",
            "--runs",
            "2",
        ])
        .arg(m["prompt"].as_str().unwrap())
        .args(["--model", common::s(&model), "--controlnet", common::s(&cn)])
        .args(["--control", common::s(&files.control)])
        .args([
            "--steps",
            &m["steps"].to_string(),
            "--seed",
            &m["seed"].to_string(),
        ])
        .args(["--guidance", &m["guidance"].to_string()])
        .args(["--control-scale", &m["scale"].to_string()])
        .args(["--dtype", "f32", "-o", common::s(&out)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    // Without --width/--height the output takes the control image's size.
    let png = image::open(&out).unwrap().to_rgb8();
    r.check_pixels(png.as_raw(), "command line, directory, size from --control");
    assert!(stderr.contains("run 2 of 2:"), "{stderr}");
    assert_eq!(
        stderr.matches("per step, the ControlNet's hints").count(),
        2,
        "{stderr}"
    );
    assert!(
        stderr.contains("holds the ControlNet's weights"),
        "{stderr}"
    );
}

/// Scale 0 multiplies every hint by 0: the picture is text → image's to the bit.
#[test]
fn scale_zero_gives_the_plain_picture_exactly() {
    let _alone = one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let r = load("controlnet-heldout-2.1");
    let mut p = pipeline(&r, tmp.path());
    let req = r.request();
    let control = ControlInput {
        scale: 0.0,
        ..r.control()
    };
    let steered = p
        .generate_controlled(&req, Some(&control), &mut |_| {
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    let plain = p.generate(&req, &mut |_| {}).unwrap();
    assert!(steered.control_seconds.is_some());
    assert!(plain.control_seconds.is_none());
    assert_eq!(
        steered.latents.to_vec::<f32>().unwrap(),
        plain.latents.to_vec::<f32>().unwrap()
    );
    assert_eq!(steered.rgb, plain.rgb);
    // And the scale does steer: the reference's differs from the plain picture.
    let want: Vec<u8> = r.tensors["image_u8"].to_vec::<u8>().unwrap();
    assert_ne!(want, plain.rgb);
}

/// Runs `zimage generate` on the demo model with `args` after the prompt; the output path is
/// `out`.
fn refused(tmp: &Path, args: &[&str]) -> (String, PathBuf) {
    let out = tmp.join("never.png");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_zimage"))
        .env("ZIMAGE_CACHE_DIR", tmp.join("cache"))
        .args([
            "--store",
            common::s(&tmp.join("store")),
            "generate",
            "a fox",
        ])
        .args(["--model", common::s(&models().join("z-image-tiny"))])
        .args(["--steps", "1", "--width", "64", "--height", "64"])
        .args(args)
        .args(["-o", common::s(&out)])
        .output()
        .unwrap();
    let stderr = String::from_utf8(run.stderr).unwrap();
    assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!out.exists(), "{args:?} wrote {}", out.display());
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    (lines[0].to_string(), out)
}

#[test]
fn the_command_line_refuses_bad_control_requests_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (cn21, cn10, heldout) = (t.join("cn21"), t.join("cn10"), t.join("cn-heldout"));
    common::controlnet::write_tiny_dir("2.1", &cn21);
    common::controlnet::write_tiny_dir("1.0", &cn10);
    common::controlnet::write_tiny_dir("heldout-2.1", &heldout);
    let control = t.join("control.png");
    control_image(64, 64).save(&control).unwrap();
    let mask = t.join("mask.png");
    mask_image(64, 64).save(&mask).unwrap();
    let missing = t.join("missing.png");
    let not_image = t.join("control.txt");
    std::fs::write(&not_image, "not a picture").unwrap();
    let (c, n21, n10, nh) = (
        common::s(&control),
        common::s(&cn21),
        common::s(&cn10),
        common::s(&heldout),
    );
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--control", c],
            vec!["--control", "needs --controlnet"],
        ),
        (
            vec!["--controlnet", n21],
            vec!["--controlnet", "needs --control"],
        ),
        (
            vec!["--control", c, "--controlnet", nh],
            vec!["--controlnet", "does not fit", "wide"],
        ),
        (
            vec![
                "--control",
                c,
                "--controlnet",
                n21,
                "--control-scale",
                "2.5",
            ],
            vec!["--control-scale is 2.5", "[0, 2]"],
        ),
        (
            vec![
                "--control",
                c,
                "--controlnet",
                n21,
                "--control-scale",
                "-0.1",
            ],
            vec!["--control-scale is -0.1"],
        ),
        (
            vec![
                "--control",
                c,
                "--controlnet",
                n21,
                "--control-scale",
                "NaN",
            ],
            vec!["--control-scale is NaN"],
        ),
        (
            vec!["--control", common::s(&not_image), "--controlnet", n21],
            vec!["--control", "control.txt", "not a PNG"],
        ),
        (
            vec!["--control", common::s(&missing), "--controlnet", n21],
            vec!["--control", "missing.png"],
        ),
        (
            vec!["--control", c, "--controlnet", "no-such-controlnet"],
            vec!["--controlnet", "no-such-controlnet"],
        ),
        (
            vec!["--control", c, "--controlnet", n21, "--image", c],
            vec!["--control", "needs --mask"],
        ),
        (
            vec![
                "--control",
                c,
                "--controlnet",
                n10,
                "--image",
                c,
                "--mask",
                common::s(&mask),
            ],
            vec!["--controlnet", "1.0", "33"],
        ),
        (
            vec![
                "--control",
                c,
                "--controlnet",
                n21,
                "--image",
                c,
                "--mask",
                common::s(&mask),
                "--strength",
                "0.5",
            ],
            vec!["--strength is 0.5"],
        ),
        (
            vec!["--control-scale", "0.5"],
            vec!["--control-scale needs --control"],
        ),
    ];
    for (args, wants) in cases {
        let (line, _) = refused(t, &args);
        for want in wants {
            assert!(line.contains(want), "{args:?}: `{want}` not in {line}");
        }
    }
}

fn mean_off(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y) as f64)
        .sum::<f64>()
        / a.len() as f64
}

/// An int8 ControlNet stored by name stays packed through generation and steers as the f32 one
/// does, up to its rounding.
#[test]
fn an_int8_controlnet_stored_by_name_steers_close_to_diffusers() {
    let tmp = tempfile::tempdir().unwrap();
    let r = load("controlnet-heldout-2.1");
    let (cn, store) = (tmp.path().join("cn"), tmp.path().join("store"));
    common::controlnet::write_tiny_dir(&r.layout(), &cn);
    let args = [
        "create",
        "cn8",
        "--from",
        common::s(&cn),
        "--quantize",
        "int8",
    ];
    let created = common::zimage_in(&store, &args);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let model = r.model_dir(tmp.path());
    let out = tmp.path().join("out.png");
    let run = generate(&r, &model, "cn8", &store, &out);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let png = image::open(&out).unwrap().to_rgb8();
    let want: Vec<u8> = r.tensors["image_u8"].to_vec::<u8>().unwrap();
    let mut p = Pipeline::new(DiffusersDir::open(&model).unwrap(), Dtype::F32, false).unwrap();
    let plain = p.generate(&r.request(), &mut |_| {}).unwrap();
    let (off, moved) = (mean_off(png.as_raw(), &want), mean_off(&plain.rgb, &want));
    println!("int8 ControlNet: mean |Δ| {off:.3} from diffusers' f32 picture; the control moves it {moved:.3}");
    assert!(
        off < moved / 4.0,
        "int8 off by {off}, control moves {moved}"
    );
}
