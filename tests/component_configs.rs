//! Single component files take the model's own config: the held-out model (head width 32,
//! RoPE axes 8/12/12, a VAE of 4 groups that scales latents by 0.41) written as plain files,
//! without the config zimage writes into their metadata, and imported with `--from` its
//! directory generates the directory's image, as safetensors and as a GGUF transformer;
//! without `--from`, what is inferred is checked and a model `generate` would refuse is not
//! stored; a file that contradicts `--from` is refused naming the tensor; `show` says where each
//! value came from. And the generation defaults a model records at `create`.

mod common;

use common::{s, zimage_in};
use std::path::{Path, PathBuf};
use zimage::store::Store;

fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An f32 image of `model` (a stored name or a directory), guided, from seed 5.
fn generate(store: &Path, model: &str, png: &Path) -> image::RgbImage {
    ok(zimage_in(
        store,
        &[
            "generate",
            "an old stone bridge",
            "--model",
            model,
            "--width",
            "64",
            "--height",
            "48",
            "--steps",
            "3",
            "--guidance",
            "3",
            "--seed",
            "5",
            "--dtype",
            "f32",
            "-o",
            s(png),
        ],
    ));
    image::open(png).unwrap().to_rgb8()
}

fn assert_same_image(a: &image::RgbImage, b: &image::RgbImage, what: &str) {
    assert_eq!(a.dimensions(), b.dimensions());
    let (mut same, mut worst) = (0usize, 0u8);
    for (x, y) in a.as_raw().iter().zip(b.as_raw()) {
        same += (x == y) as usize;
        worst = worst.max(x.abs_diff(*y));
    }
    let share = same as f64 / a.as_raw().len() as f64;
    println!(
        "{what}: {:.4}% of values identical, max off by {worst}",
        share * 100.0
    );
    assert!(
        share >= 0.999 && worst <= 1,
        "{what}: {share} identical, max off by {worst}"
    );
}

/// The held-out model stored and exported as plain ComfyUI files and a plain GGUF transformer.
struct Exported {
    dir: PathBuf,
    transformer: PathBuf,
    gguf: PathBuf,
    text_encoder: PathBuf,
    vae: PathBuf,
}

fn export_heldout(tmp: &Path, store: &Path) -> Exported {
    let dir = common::heldout_dir(tmp);
    ok(zimage_in(store, &["create", "held", "--from", s(&dir)]));
    let out = tmp.join("files");
    for format in ["comfy", "gguf"] {
        ok(zimage_in(
            store,
            &["export", "held", "--format", format, "--no-config", s(&out)],
        ));
    }
    let e = Exported {
        dir,
        transformer: out.join("diffusion_models/held.safetensors"),
        gguf: out.join("diffusion_models/held.gguf"),
        text_encoder: out.join("text_encoders/held.safetensors"),
        vae: out.join("vae/held.safetensors"),
    };
    let meta = zimage::safetensors::read_header_file(&e.vae)
        .unwrap()
        .metadata;
    assert!(
        meta.is_none_or(|m| !m.contains_key(zimage::layouts::CONFIG_METADATA_KEY)),
        "--no-config leaves the config out"
    );
    e
}

#[test]
fn plain_files_with_from_generate_the_directorys_image_and_show_says_where_values_came_from() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let e = export_heldout(tmp.path(), &store);
    let want = generate(&store, s(&e.dir), &tmp.path().join("dir.png"));

    for (name, transformer) in [("files", &e.transformer), ("gguf", &e.gguf)] {
        ok(zimage_in(
            &store,
            &[
                "create",
                name,
                "--from",
                s(&e.dir),
                "--transformer",
                s(transformer),
                "--text-encoder",
                s(&e.text_encoder),
                "--vae",
                s(&e.vae),
            ],
        ));
        let got = generate(&store, name, &tmp.path().join(format!("{name}.png")));
        assert_same_image(&want, &got, name);
    }

    let shown = ok(zimage_in(&store, &["show", "files"]));
    let line = |key: &str, path: &str| {
        shown
            .lines()
            .find(|l| l.starts_with(path) && l.split_whitespace().nth(1) == Some(key))
            .unwrap_or_else(|| panic!("no `{key}` of {path} in:\n{shown}"))
            .to_string()
    };
    assert!(line("norm_num_groups", "vae/config.json").ends_with("--from"));
    assert!(line("scaling_factor", "vae/config.json").ends_with("--from"));
    assert!(line("axes_dims", "transformer/config.json").ends_with("--from"));
    assert!(line("dim", "transformer/config.json").ends_with("--from"));
    assert!(line("n_layers", "transformer/config.json").ends_with("--from"));
    let json: serde_json::Value =
        serde_json::from_str(&ok(zimage_in(&store, &["show", "files", "--json"]))).unwrap();
    let vae = json["configs"]["vae/config.json"].as_array().unwrap();
    let groups = vae.iter().find(|v| v["key"] == "norm_num_groups").unwrap();
    assert_eq!(groups["value"], 4);
    assert_eq!(groups["origin"], "from");
    // A model imported whole took every value from its own files.
    let whole = ok(zimage_in(&store, &["show", "held"]));
    assert!(
        whole.contains("every value from the model's own config files"),
        "{whole}"
    );
}

#[test]
fn without_from_a_config_generate_would_refuse_is_not_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let e = export_heldout(tmp.path(), &store);
    let err = refused(zimage_in(
        &store,
        &[
            "create",
            "guessed",
            "--transformer",
            s(&e.transformer),
            "--text-encoder",
            s(&e.text_encoder),
            "--vae",
            s(&e.vae),
        ],
    ));
    // Turbo's 32 groups do not divide the held-out VAE's 16 channels.
    assert!(
        err.contains("encoder.down_blocks.0.resnets.0.norm1.weight")
            && err.contains("norm_num_groups")
            && err.contains("--from"),
        "{err}"
    );
    assert!(Store::at(&store).open("guessed").is_err());
}

#[test]
fn a_file_that_contradicts_from_is_refused_naming_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let e = export_heldout(tmp.path(), &store);
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let err = refused(zimage_in(
        &store,
        &[
            "create",
            "mixed",
            "--from",
            s(&demo),
            "--transformer",
            s(&e.transformer),
        ],
    ));
    assert!(
        err.contains("x_embedder") && err.contains("`dim` 128") && err.contains("256"),
        "{err}"
    );
    assert!(Store::at(&store).open("mixed").is_err());
}

/// `create --default-…` records generation defaults; `generate` uses them when its flags are
/// silent, and its flags still win; a model without them (Turbo) keeps 8 steps, no guidance.
#[test]
fn a_model_created_with_defaults_generates_with_them() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    ok(zimage_in(
        &store,
        &[
            "create",
            "base",
            "--from",
            s(&demo),
            "--default-steps",
            "3",
            "--default-guidance",
            "4",
            "--default-negative",
            "blurry",
            "--default-cfg-truncation",
            "0.5",
        ],
    ));
    ok(zimage_in(&store, &["create", "turbo", "--from", s(&demo)]));
    let shown = ok(zimage_in(&store, &["show", "base"]));
    assert!(
        shown.contains("defaults    3 steps, guidance 4, negative \"blurry\", cfg truncation 0.5"),
        "{shown}"
    );
    assert!(ok(zimage_in(&store, &["show", "turbo"])).contains("defaults    none recorded"));

    let run = |model: &str, extra: &[&str], png: &Path| {
        let mut args = vec![
            "generate", "a fox", "--model", model, "--width", "32", "--height", "32", "--dtype",
            "f32", "-o",
        ];
        args.push(s(png));
        args.extend(extra);
        ok(zimage_in(&store, &args));
        let text = zimage::image_out::read_png_text(png).unwrap();
        let params = text
            .iter()
            .find(|(k, _)| k == "parameters")
            .unwrap()
            .1
            .clone();
        (image::open(png).unwrap().to_rgb8(), params)
    };
    let (silent, params) = run("base", &[], &tmp.path().join("a.png"));
    assert!(
        params.contains("Negative prompt: blurry")
            && params.contains("Steps: 3,")
            && params.contains("CFG scale: 4,")
            && params.contains("CFG truncation: 0.5"),
        "{params}"
    );
    let explicit = [
        "--steps",
        "3",
        "--guidance",
        "4",
        "--negative",
        "blurry",
        "--cfg-truncation",
        "0.5",
    ];
    let (spelled, _) = run("turbo", &explicit, &tmp.path().join("b.png"));
    assert_eq!(silent.as_raw(), spelled.as_raw());
    let (_, params) = run("base", &["--steps", "2"], &tmp.path().join("c.png"));
    assert!(params.contains("Steps: 2,"), "{params}");
    let (_, params) = run("turbo", &[], &tmp.path().join("d.png"));
    assert!(
        params.contains("Steps: 8,") && params.contains("CFG scale: 0,"),
        "{params}"
    );

    let err = refused(zimage_in(
        &store,
        &["create", "bad", "--from", s(&demo), "--default-steps", "0"],
    ));
    assert!(err.contains("--default-steps is 0"), "{err}");
}

/// A directory's `generation_defaults.json` is imported with it, under the options `create`
/// gives, and a wrong one is refused naming the file and the field, with nothing stored.
#[test]
fn a_directory_says_its_defaults_and_create_options_lie_over_them() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = tmp.path().join("base");
    common::copy_model(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny"),
        &dir,
    );
    let file = dir.join("generation_defaults.json");
    std::fs::write(&file, r#"{"steps": 3, "guidance": 2.5, "shift": 6}"#).unwrap();
    ok(zimage_in(
        &store,
        &[
            "create",
            "base",
            "--from",
            s(&dir),
            "--default-guidance",
            "4",
        ],
    ));
    let shown = ok(zimage_in(&store, &["show", "base"]));
    assert!(
        shown.contains("defaults    3 steps, guidance 4, shift 6"),
        "{shown}"
    );
    let png = tmp.path().join("a.png");
    ok(zimage_in(
        &store,
        &[
            "generate",
            "a fox",
            "--model",
            "base",
            "--width",
            "32",
            "--height",
            "32",
            "-o",
            s(&png),
        ],
    ));
    let text = zimage::image_out::read_png_text(&png).unwrap();
    let params = &text.iter().find(|(k, _)| k == "parameters").unwrap().1;
    assert!(
        params.contains("Steps: 3,")
            && params.contains("CFG scale: 4,")
            && params.contains("shift 6"),
        "{params}"
    );
    std::fs::write(&file, r#"{"steps": 3, "guidance": -1}"#).unwrap();
    let err = refused(zimage_in(&store, &["create", "bad", "--from", s(&dir)]));
    assert!(
        err.contains("generation_defaults.json") && err.contains("`guidance` is -1"),
        "{err}"
    );
    assert!(Store::at(&store).open("bad").is_err());
}
