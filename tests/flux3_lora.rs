//! LoRAs on FLUX.3 [klein]: one LoRA made with peft on every linear layer of every block kind of
//! the tiny model, saved in diffusers' names and in Black Forest Labs' (`diffusion_model.
//! content_mode_blocks.image.0.q_proj`, …), draws what diffusers draws with it loaded
//! (models/make_flux3_lora_reference.py), in either naming, from the flag and from a stored
//! model that carries it.

mod common;

use common::{compare_pixels, s, zimage_in};
use std::path::{Path, PathBuf};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// The reference's request (a red fox, 72×56, 3 steps, seed 42, f32) from `model` with `extra`
/// flags; the picture's pixels.
fn generate_case(store: &Path, model: &str, extra: &[&str], png: &Path) -> Vec<u8> {
    let mut args = vec![
        "generate",
        "a red fox in the snow",
        "--model",
        model,
        "--width",
        "72",
        "--height",
        "56",
        "--steps",
        "3",
        "--seed",
        "42",
        "--dtype",
        "f32",
        "-o",
        s(png),
    ];
    args.extend(extra);
    let out = zimage_in(store, &args);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    image::open(png).unwrap().to_rgb8().into_raw()
}

#[test]
fn loras_in_diffusers_and_original_names_match_diffusers() {
    let refs = models().join("reference");
    let st = zimage::mlx::io::load_safetensors(&refs.join("flux3-lora.safetensors")).unwrap();
    let image = |key: &str| st.tensors[key].to_vec::<u8>().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = models().join("flux3-klein-tiny");
    let out = zimage_in(&store, &["create", "flux3", "--from", s(&dir)]);
    assert!(out.status.success(), "{}", text(&out));

    // Without a LoRA, the case is diffusers' picture.
    let png = tmp.path().join("base.png");
    let (same, worst) = compare_pixels(
        &generate_case(&store, "flux3", &[], &png),
        &image("base_u8"),
    );
    println!(
        "FLUX.3 without a LoRA: {:.4}% identical, worst off by {worst}",
        same * 100.0
    );
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, worst {worst}"
    );

    let mut drawn = Vec::new();
    for kind in ["peft", "bfl"] {
        let want = image(&format!("{kind}_u8"));
        let (same, _) = compare_pixels(&image("base_u8"), &want);
        assert!(
            same < 0.5,
            "the {kind} LoRA barely changes the image ({same})"
        );
        let lora = refs.join(format!("flux3-lora-{kind}.safetensors"));
        let png = tmp.path().join(format!("{kind}.png"));
        let flagged = generate_case(&store, "flux3", &["--lora", s(&lora)], &png);
        let (same, worst) = compare_pixels(&flagged, &want);
        println!(
            "FLUX.3 {kind} LoRA: {:.4}% identical to diffusers, worst off by {worst}",
            same * 100.0
        );
        assert!(
            same >= 0.999 && worst <= 1,
            "{kind}: {same} identical, worst {worst}"
        );

        let out = common::zimage(&["inspect", s(&lora), "--json"]);
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let base = j["lora_base"].as_str().unwrap();
        assert!(base.starts_with("FLUX.3"), "{j}");

        let derived = format!("flux3-{kind}");
        let out = zimage_in(
            &store,
            &["create", &derived, "--from", "flux3", "--lora", s(&lora)],
        );
        assert!(out.status.success(), "{}", text(&out));
        let png = tmp.path().join(format!("{kind}-stored.png"));
        let stored = generate_case(&store, &derived, &[], &png);
        assert_eq!(stored, flagged, "{kind}: the stored LoRA draws otherwise");
        drawn.push(flagged);
    }
    // The same pairs in either naming (BFL's B times the peft file's alpha/r) are one update.
    assert_eq!(drawn[0], drawn[1], "the two namings draw otherwise");
}
