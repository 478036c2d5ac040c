//! FLUX.2 [klein] through the command line: imported from its diffusers directory, listed and
//! shown with its family, generated from the store pixel for pixel as from its directory, and
//! the options klein lacks refused by name.

mod common;

use common::{compare_pixels, klein_reference_image, s, zimage_in};
use image::GenericImageView;
use std::ops::ControlFlow;
use std::path::Path;
use zimage::families::flux2_klein::pipeline::KleinPipeline;
use zimage::pipeline::Request;

fn models() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/models"))
}

/// Asserts that the command was refused (exit 2) with a message holding `needle`.
fn refused(out: &std::process::Output, needle: &str) {
    assert_eq!(out.status.code(), Some(2), "{}", text(out));
    assert!(text(out).contains(needle), "{}", text(out));
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

/// Sides are multiples of the model's own token cell, not of a cell every family shares: the
/// tiny klein's VAE has three levels, so its cell is 8 pixels (the real models' 16).
#[test]
fn sizes_are_multiples_of_the_models_own_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = models().join("flux2-klein-tiny");
    let png = tmp.path().join("tall.png");
    let args = [
        "generate",
        "a fox",
        "--model",
        s(&dir),
        "--width",
        "72",
        "--height",
        "96",
        "--steps",
        "1",
        "-o",
        s(&png),
    ];
    let out = zimage_in(&store, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(image::open(&png).unwrap().dimensions(), (72, 96));
    let args = ["generate", "a fox", "--model", s(&dir), "--width", "100"];
    refused(
        &zimage_in(&store, &args),
        "--width is 100; widths and heights are multiples of 8",
    );
    assert!(!tmp.path().join("zimage.png").exists());
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
    let (same, worst) = compare_pixels(ours.as_raw(), &klein_reference_image("edit1"));
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, worst {worst}"
    );

    // Image to image at strength 1 noises the picture away wholly, so it enters only as the
    // condition every klein picture gives, as a reference does: the same pixels when it has the
    // output's size (how A1111's img2img asks for an edit).
    let whole = tmp.path().join("strength-1.png");
    let mut args = args.to_vec();
    args.splice(4..6, ["--image", s(&picture), "--strength", "1"]);
    *args.last_mut().unwrap() = s(&whole);
    let out = zimage_in(&tmp.path().join("store"), &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(image::open(&whole).unwrap().to_rgb8(), ours);

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
    refused(&out, "--ref is not available for Z-Image");
}

/// One inpainting request from the command line, as the reference `case` made it in diffusers
/// (`models/make_klein_tiny.py`): `picture` and `mask` under `models/reference/`, strength,
/// steps and seed; its picture must be `size` and match diffusers' to 99.9%, none off by more
/// than one level.
fn inpaints_as_diffusers(
    case: &str,
    (picture, mask): (&str, &str),
    (strength, steps, seed): (&str, &str, &str),
    size: (u32, u32),
) {
    let tmp = tempfile::tempdir().unwrap();
    let png = tmp.path().join("inpainted.png");
    let model = models().join("flux2-klein-tiny");
    let (picture, mask) = (
        models().join("reference").join(picture),
        models().join("reference").join(mask),
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
        strength,
        "--steps",
        steps,
        "--seed",
        seed,
        "--dtype",
        "f32",
        "-o",
        s(&png),
    ];
    let out = zimage_in(&tmp.path().join("store"), &args);
    assert!(out.status.success(), "{}", text(&out));
    let ours = image::open(&png).unwrap().to_rgb8();
    assert_eq!(ours.dimensions(), size);
    let (same, worst) = compare_pixels(&ours.into_raw(), &klein_reference_image(case));
    println!("{case} from the command line: {same} identical, worst off by {worst}");
    assert!(
        same >= 0.999 && worst <= 1,
        "{case}: {same} identical, worst {worst}"
    );
}

/// `--image --mask --strength`: klein inpaints at the picture's size, as diffusers does; the
/// picture and its mask (a ramp across the threshold) are resized (100×75 → 96×72) as Pillow
/// resizes them.
#[test]
fn inpainting_from_the_command_line_matches_diffusers() {
    let inputs = (
        "klein-inputs/picture-100x75.png",
        "klein-inputs/mask-100x75.png",
    );
    inpaints_as_diffusers("inpaint", inputs, ("0.8", "6", "11"), (96, 72));
}

/// A mask whose edges fall inside token cells (some cells half or a quarter covered) inpaints
/// as diffusers does: the token mask is the bilinear reduction's, partial values and all.
#[test]
fn inpainting_a_mask_off_the_token_grid_matches_diffusers() {
    let inputs = (
        "inputs/picture-96x80.png",
        "klein-inputs/mask-rect-96x80.png",
    );
    inpaints_as_diffusers("inpaint-offgrid", inputs, ("1", "4", "13"), (96, 80));
}

/// A picture of another size than the output is resized, mask and all, as diffusers resizes it
/// (Pillow's LANCZOS, byte for byte): a rectangle whose edges land inside token cells after the
/// resize binarises there as it does in diffusers, so the token mask and the picture match.
#[test]
fn inpainting_a_resized_mask_off_the_token_grid_matches_diffusers() {
    let inputs = (
        "klein-inputs/picture-100x75.png",
        "klein-inputs/mask-rect-100x75.png",
    );
    inpaints_as_diffusers("inpaint-resized", inputs, ("0.8", "6", "11"), (96, 72));
}

/// Generates "a red fox in the snow" with seed 42 in f32 from `model` with `flags`, against
/// `store`; the picture's pixels.
fn generate_fox(store: &Path, model: &str, flags: &[&str], png: &Path) -> Vec<u8> {
    let mut args = vec![
        "generate",
        "a red fox in the snow",
        "--model",
        model,
        "--seed",
        "42",
        "--dtype",
        "f32",
        "-o",
        s(png),
    ];
    args.extend(flags);
    let out = zimage_in(store, &args);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    image::open(png).unwrap().to_rgb8().into_raw()
}

/// The LoRA reference's request (models/make_klein_lora_reference.py) with `extra` flags.
fn generate_lora_case(store: &Path, model: &str, extra: &[&str], png: &Path) -> Vec<u8> {
    let flags = [&["--width", "96", "--height", "64"], extra].concat();
    generate_fox(store, model, &flags, png)
}

/// `--lora` on klein: a LoRA in diffusers/PEFT names and one in the original (BFL) names, whose
/// fused `qkv` pairs are split onto q, k and v, draw what diffusers draws with them loaded, from
/// the flag and from a stored model that carries them (`create --lora`).
#[test]
fn loras_in_diffusers_and_original_names_match_diffusers() {
    let refs = models().join("reference");
    let st = zimage::mlx::io::load_safetensors(&refs.join("klein-lora.safetensors")).unwrap();
    let image = |key: &str| st.tensors[key].to_vec::<u8>().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = models().join("flux2-klein-tiny");
    let out = zimage_in(&store, &["create", "klein", "--from", s(&dir)]);
    assert!(out.status.success(), "{}", text(&out));
    for kind in ["peft", "bfl"] {
        let want = image(&format!("{kind}_u8"));
        let (same, _) = compare_pixels(&image("base_u8"), &want);
        assert!(
            same < 0.5,
            "the {kind} LoRA barely changes the image ({same})"
        );
        let lora = refs.join(format!("klein-lora-{kind}.safetensors"));
        let png = tmp.path().join(format!("{kind}.png"));
        let flagged = generate_lora_case(&store, s(&dir), &["--lora", s(&lora)], &png);
        let (same, worst) = compare_pixels(&flagged, &want);
        println!(
            "klein {kind} LoRA: {:.4}% identical, worst off by {worst}",
            same * 100.0
        );
        assert!(
            same >= 0.999 && worst <= 1,
            "{kind}: {same} identical, worst {worst}"
        );
        let chunks = zimage::image_out::read_png_text(&png).unwrap();
        let params = &chunks.iter().find(|(k, _)| k == "parameters").unwrap().1;
        let named = format!("Lora hashes: \"klein-lora-{kind}: ");
        assert!(params.contains(&named), "{params}");

        if kind == "bfl" {
            // kohya's spelling of the same pairs, alpha 8 at scale 0.5 (= scale 1).
            let kohya = tmp.path().join("kohya.safetensors");
            kohya_copy(&lora, &kohya, 8.0);
            let spec = format!("{}:0.5", s(&kohya));
            let png = tmp.path().join("kohya.png");
            let spelled = generate_lora_case(&store, s(&dir), &["--lora", &spec], &png);
            assert_eq!(spelled, flagged, "kohya's spelling draws otherwise");
        }
        let out = common::zimage(&["inspect", s(&lora), "--json"]);
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let base = j["lora_base"].as_str().unwrap();
        assert!(base.starts_with("FLUX") && base.contains("klein"), "{j}");

        let derived = format!("klein-{kind}");
        let out = zimage_in(
            &store,
            &["create", &derived, "--from", "klein", "--lora", s(&lora)],
        );
        assert!(out.status.success(), "{}", text(&out));
        let png = tmp.path().join(format!("{kind}-stored.png"));
        let stored = generate_lora_case(&store, &derived, &[], &png);
        assert_eq!(stored, flagged, "{kind}: the stored LoRA draws otherwise");
    }
}

/// `from` (a LoRA in `diffusion_model.<module>.lora_A/lora_B` names) in kohya's names, with
/// `alpha` for every pair.
fn kohya_copy(from: &Path, to: &Path, alpha: f32) {
    let st = zimage::mlx::io::load_safetensors(from).unwrap();
    let alpha = zimage::mlx::Array::from_slice(&[alpha], &[]).unwrap();
    let mut tensors = Vec::new();
    for (key, array) in &st.tensors {
        let stem = key.strip_prefix("diffusion_model.").unwrap();
        let (module, part) = stem.split_once(".lora_").unwrap();
        let flat = format!("lora_unet_{}", module.replace('.', "_"));
        let part = if part.starts_with('A') { "down" } else { "up" };
        tensors.push((format!("{flat}.lora_{part}.weight"), array));
        if part == "down" {
            tensors.push((format!("{flat}.alpha"), &alpha));
        }
    }
    let named: Vec<(&str, &zimage::mlx::Array)> =
        tensors.iter().map(|(k, a)| (k.as_str(), *a)).collect();
    zimage::mlx::io::save_safetensors(to, &named, &[]).unwrap();
}

/// The bytes of `values` as f32 little-endian.
fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

/// A LoRA of one pair on `module`: `down` `[2, in]` and `up` `[out, 2]`, in f32.
fn pair_lora(path: &Path, module: &str, down: &[f32], up: &[f32]) {
    let (a, b) = (
        format!("{module}.lora_A.weight"),
        format!("{module}.lora_B.weight"),
    );
    let f32 = zimage::safetensors::Dtype::F32;
    let (inp, out) = (down.len() as u64 / 2, up.len() as u64 / 2);
    common::write_safetensors(
        path,
        &[
            (&a, f32, vec![2, inp], f32_bytes(down.iter().copied())),
            (&b, f32, vec![out, 2], f32_bytes(up.iter().copied())),
        ],
    );
}

/// `n` values of a slow wave, a LoRA half's weights.
fn wave(n: u64, k: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * k).sin() * 0.3).collect()
}

/// A one-pair rank-2 LoRA on `module` (`[out, in]`).
fn one_pair_lora(path: &Path, module: &str, (out, inp): (u64, u64)) {
    pair_lora(path, module, &wave(2 * inp, 0.7), &wave(2 * out, 1.3));
}

/// The final layer's original pair holds shift's rows then scale's; `norm_out.linear` holds
/// scale's then shift's, so the original pair is the diffusers pair with B's halves swapped.
#[test]
fn the_original_final_layer_pair_swaps_shift_and_scale() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = models().join("flux2-klein-tiny");
    let (down, up) = (wave(2 * 128, 0.7), wave(2 * 256, 1.3));
    let swapped = [&up[256..], &up[..256]].concat();
    let original = tmp.path().join("original.safetensors");
    pair_lora(
        &original,
        "diffusion_model.final_layer.adaLN_modulation.1",
        &down,
        &up,
    );
    let diffusers = tmp.path().join("diffusers.safetensors");
    pair_lora(&diffusers, "transformer.norm_out.linear", &down, &swapped);
    let small = ["--width", "32", "--height", "32", "--steps", "1"];
    let draw = |lora: &Path, png: &str| {
        let flags: Vec<&str> = small.iter().copied().chain(["--lora", s(lora)]).collect();
        generate_fox(&store, s(&dir), &flags, &tmp.path().join(png))
    };
    let plain = generate_fox(&store, s(&dir), &small, &tmp.path().join("plain.png"));
    let from_original = draw(&original, "original.png");
    assert_ne!(
        from_original, plain,
        "the final layer's LoRA changed nothing"
    );
    assert_eq!(from_original, draw(&diffusers, "diffusers.png"));
}

/// A text-encoder LoRA binds to klein's Qwen3 as to Z-Image's; a key that names no layer is
/// refused naming the closest one, in the naming the key uses.
#[test]
fn klein_takes_text_encoder_loras_and_names_the_closest_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = models().join("flux2-klein-tiny");
    let te = tmp.path().join("te.safetensors");
    one_pair_lora(
        &te,
        "text_encoder.model.layers.3.self_attn.q_proj",
        (32, 16),
    );
    let small = ["--width", "32", "--height", "32", "--steps", "1"];
    let plain = generate_fox(&store, s(&dir), &small, &tmp.path().join("plain.png"));
    let flags = [&small[..], &["--lora", s(&te)]].concat();
    let with = generate_fox(&store, s(&dir), &flags, &tmp.path().join("te.png"));
    assert_ne!(plain, with, "the text-encoder LoRA changed nothing");

    let cases = [
        (
            "diffusion_model.double_blocks.0.img_attn.qkvv",
            "closest is `double_blocks.0.img_attn.qkv`",
        ),
        (
            "transformer.single_transformer_blocks.2.attn.to_outt",
            "closest is `single_transformer_blocks.2.attn.to_out`",
        ),
    ];
    for (module, expected) in cases {
        let typo = tmp.path().join("typo.safetensors");
        one_pair_lora(&typo, module, (128, 128));
        let args = ["generate", "a fox", "--model", s(&dir), "--lora", s(&typo)];
        let out = zimage_in(&store, &args);
        refused(&out, expected);
    }
    // A fused layer's pair must cut into its three layers' rows.
    let odd = tmp.path().join("odd.safetensors");
    one_pair_lora(
        &odd,
        "diffusion_model.double_blocks.1.txt_attn.qkv",
        (128, 128),
    );
    let out = zimage_in(
        &store,
        &["generate", "a fox", "--model", s(&dir), "--lora", s(&odd)],
    );
    refused(&out, "do not fit layer `transformer_blocks.1.attn.add_");
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
