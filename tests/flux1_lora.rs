//! LoRAs on FLUX.1: one LoRA on the tiny \[dev\]'s attention layers, saved in diffusers/PEFT
//! names, in kohya's (`lora_unet_double_blocks_0_img_attn_qkv`, the fused q|k|v and a single
//! block's `linear1` with its MLP rows zero) and in XLabs' (`double_blocks.0.processor.
//! qkv_lora1`), draws what diffusers draws with it loaded (models/make_flux1_lora_reference.py),
//! the three namings the very same picture.

mod common;

use common::{compare_pixels, s, zimage_in};
use std::path::{Path, PathBuf};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn a_lora_in_peft_kohya_and_xlabs_names_draws_what_diffusers_draws() {
    let refs = models().join("reference");
    let st = zimage::mlx::io::load_safetensors(&refs.join("flux1-lora.safetensors")).unwrap();
    let theirs = st.tensors["image"].to_vec::<u8>().unwrap();
    let base = zimage::mlx::io::load_safetensors(&refs.join("flux1-t2i-dev.safetensors")).unwrap();
    let (same, _) = compare_pixels(&base.tensors["image"].to_vec::<u8>().unwrap(), &theirs);
    assert!(same < 0.5, "the LoRA barely changes the picture ({same})");

    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = models().join("flux1-dev-tiny");
    let out = zimage_in(&store, &["create", "dev", "--from", s(&dir)]);
    assert!(out.status.success(), "{}", text(&out));
    let mut drawn = Vec::new();
    for naming in ["peft", "kohya", "xlabs"] {
        let lora = refs.join(format!("flux1-lora-{naming}.safetensors"));
        let png = tmp.path().join(format!("{naming}.png"));
        let args = [
            "generate",
            "a red fox in the snow",
            "--model",
            "dev",
            "--width",
            "88",
            "--height",
            "56",
            "--steps",
            "4",
            "--guidance",
            "3.5",
            "--seed",
            "42",
            "--dtype",
            "f32",
            "--lora",
            s(&lora),
            "-o",
            s(&png),
        ];
        let out = zimage_in(&store, &args);
        assert!(out.status.success(), "{naming}: {}", text(&out));
        let ours = image::open(&png).unwrap().to_rgb8().into_raw();
        let (same, worst) = compare_pixels(&ours, &theirs);
        println!(
            "{naming}: {:.4}% of values identical to diffusers', worst off by {worst}",
            same * 100.0
        );
        assert!(
            same >= 0.999 && worst <= 1,
            "{naming}: {same} identical, worst {worst}"
        );
        drawn.push(ours);
    }
    assert!(drawn[0] == drawn[1], "kohya's naming draws another picture");
    assert!(drawn[0] == drawn[2], "XLabs' naming draws another picture");

    // A stored model that carries the XLabs file draws the same.
    let lora = refs.join("flux1-lora-xlabs.safetensors");
    let out = zimage_in(
        &store,
        &["create", "dev-lora", "--from", "dev", "--lora", s(&lora)],
    );
    assert!(out.status.success(), "{}", text(&out));
    let png = tmp.path().join("stored.png");
    let args = [
        "generate",
        "a red fox in the snow",
        "--model",
        "dev-lora",
        "--width",
        "88",
        "--height",
        "56",
        "--steps",
        "4",
        "--guidance",
        "3.5",
        "--seed",
        "42",
        "--dtype",
        "f32",
        "-o",
        s(&png),
    ];
    let out = zimage_in(&store, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(image::open(&png).unwrap().to_rgb8().into_raw() == drawn[0]);
}
