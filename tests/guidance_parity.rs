//! The base model's guidance options, `cfg_normalization` and `cfg_truncation`, against
//! diffusers 0.42.1's `ZImagePipeline` in f32 from the seed alone: each on its own and both,
//! on the demo model and on the held-out one, with guidance above 1 and a truncation that
//! leaves the last steps unguided; and the command line's flags, which also land in the PNG's
//! metadata. References: `models/make_guidance_reference.py`.

mod common;

use std::path::{Path, PathBuf};
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::zimage::Pipeline;
use zimage::mlx::{io, Dtype};
use zimage::pipeline::Request;

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

struct Case {
    image: Vec<u8>,
    meta: serde_json::Value,
}

fn load(case: &str) -> Case {
    let st = io::load_safetensors(&models().join(format!("reference/{case}.safetensors"))).unwrap();
    Case {
        image: st.tensors["image"].to_vec::<u8>().unwrap(),
        meta: serde_json::from_str(&st.metadata["case"]).unwrap(),
    }
}

impl Case {
    fn request(&self) -> Request {
        let m = &self.meta;
        Request {
            prompt: m["prompt"].as_str().unwrap().into(),
            negative_prompt: m["negative_prompt"].as_str().map(String::from),
            width: m["width"].as_u64().unwrap() as u32,
            height: m["height"].as_u64().unwrap() as u32,
            steps: m["steps"].as_u64().unwrap() as usize,
            guidance: m["guidance"].as_f64().unwrap() as f32,
            cfg_normalization: m["cfg_normalization"].as_bool().unwrap_or(false),
            cfg_truncation: m["cfg_truncation"].as_f64().unwrap_or(1.0),
            seed: m["seed"].as_u64().unwrap(),
            noise: None,
            input: None,
        }
    }

    /// The model directory the case ran on, assembled under `tmp` for the held-out one.
    fn model_dir(&self, tmp: &Path) -> PathBuf {
        match self.meta["model"].as_str().unwrap() {
            "demo" => models().join("z-image-tiny"),
            _ => common::heldout_dir(tmp),
        }
    }

    /// Asserts the acceptance bound: ≥ 99.9% of values identical, none off by more than 1.
    fn check_pixels(&self, name: &str, rgb: &[u8], how: &str) {
        assert_eq!(rgb.len(), self.image.len(), "{name}: image size");
        let off: Vec<u8> = rgb
            .iter()
            .zip(&self.image)
            .map(|(a, b)| a.abs_diff(*b))
            .collect();
        let identical = off.iter().filter(|&&d| d == 0).count() as f64 / off.len() as f64;
        let worst = *off.iter().max().unwrap();
        println!(
            "{name} ({how}): {:.4}% of values identical, max off by {worst}",
            identical * 100.0
        );
        assert!(
            identical >= 0.999 && worst <= 1,
            "{name} ({how}): {identical} identical, max off {worst}"
        );
    }
}

fn check(name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let case = load(name);
    let dir = case.model_dir(tmp.path());
    let mut p = Pipeline::new(DiffusersDir::open(&dir).unwrap(), Dtype::F32, false).unwrap();
    let out = p.generate(&case.request(), &mut |_| {}).unwrap();
    case.check_pixels(name, &out.rgb, "library");
}

#[test]
fn cfg_normalization_matches_diffusers() {
    check("guided-norm");
}

#[test]
fn cfg_truncation_matches_diffusers() {
    check("guided-trunc");
}

#[test]
fn both_guidance_options_match_diffusers() {
    check("guided-both");
}

#[test]
fn heldout_cfg_normalization_matches_diffusers() {
    check("guided-heldout-norm");
}

#[test]
fn heldout_cfg_truncation_matches_diffusers() {
    check("guided-heldout-trunc");
}

#[test]
fn heldout_both_guidance_options_match_diffusers() {
    check("guided-heldout-both");
}

/// `--cfg-normalization` and `--cfg-truncation` draw diffusers' picture and are recorded in
/// the PNG's metadata.
#[test]
fn the_command_line_flags_match_diffusers() {
    let name = "guided-heldout-both";
    let case = load(name);
    let m = &case.meta;
    let tmp = tempfile::tempdir().unwrap();
    let dir = case.model_dir(tmp.path());
    let out = tmp.path().join("out.png");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_zimage"))
        .env("ZIMAGE_CACHE_DIR", tmp.path().join("cache"))
        .args(["--store", common::s(&tmp.path().join("store")), "generate"])
        .arg(m["prompt"].as_str().unwrap())
        .args(["--model", common::s(&dir)])
        .args(["--negative", m["negative_prompt"].as_str().unwrap()])
        .args(["--width", &m["width"].to_string()])
        .args(["--height", &m["height"].to_string()])
        .args(["--steps", &m["steps"].to_string()])
        .args(["--seed", &m["seed"].to_string()])
        .args(["--guidance", &m["guidance"].to_string()])
        .arg("--cfg-normalization")
        .args(["--cfg-truncation", &m["cfg_truncation"].to_string()])
        .args(["--dtype", "f32", "-o", common::s(&out)])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let png = image::open(&out).unwrap().to_rgb8();
    case.check_pixels(name, png.as_raw(), "command line");
    let text = zimage::image_out::read_png_text(&out).unwrap();
    let params = &text.iter().find(|(k, _)| k == "parameters").unwrap().1;
    assert!(params.contains("CFG normalization: True"), "{params}");
    assert!(params.contains("CFG truncation: 0.3"), "{params}");
}

/// A truncation outside [0, 1] is refused before anything loads, naming the flag.
#[test]
fn a_truncation_outside_the_unit_interval_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_zimage"))
        .env("ZIMAGE_CACHE_DIR", tmp.path().join("cache"))
        .args(["--store", common::s(&tmp.path().join("store")), "generate"])
        .arg("a fox")
        .args(["--model", common::s(&models().join("z-image-tiny"))])
        .args(["--cfg-truncation", "1.5", "-o"])
        .arg(tmp.path().join("out.png"))
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("--cfg-truncation is 1.5"), "{err}");
    assert!(!tmp.path().join("out.png").exists());
}
