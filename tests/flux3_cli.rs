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

/// Copies a model directory (its files, recursively).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The prompt is rendered by the chat template the model ships, from its directory and from
/// the store alike; a template that does not parse is refused naming its file.
#[test]
fn the_models_own_chat_template_renders_the_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("flux3");
    copy_dir(&models().join("flux3-klein-tiny"), &dir);
    let file = dir.join("tokenizer/chat_template.json");
    let stock: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let stock = stock["chat_template"].as_str().unwrap().to_string();
    let ids = |dir: &Path, prompt: &str| {
        let d = zimage::diffusers_dir::DiffusersDir::open(dir).unwrap();
        let p = Flux3Pipeline::new(d, zimage::mlx::Dtype::F32).unwrap();
        p.token_ids(prompt).unwrap()
    };
    let (plain, plain_empty) = (ids(&dir, "a fox"), ids(&dir, ""));

    // A system turn before the user's: its tokens, then the stock template's.
    let system = "{{- '<|im_start|>system\\nYou paint.<|im_end|>\\n' }}";
    let custom = serde_json::json!({"chat_template": format!("{system}{stock}")});
    std::fs::write(&file, custom.to_string()).unwrap();
    let (ours, ours_empty) = (ids(&dir, "a fox"), ids(&dir, ""));
    let k = ours_empty.len() - plain_empty.len();
    assert!(k > 3, "{ours_empty:?}");
    assert_eq!(ours[..k], ours_empty[..k]);
    assert_eq!(ours[k..], plain[..]);

    // Stored with the model, and read back from the store.
    let store = tmp.path().join("store");
    let out = zimage_in(&store, &["create", "flux3sys", "--from", s(&dir)]);
    assert!(out.status.success(), "{}", text(&out));
    let st = zimage::store::Store::at(&store);
    let model = st.open("flux3sys").unwrap();
    let source = zimage::loader::StoreSource {
        store: st,
        model,
        read_path: zimage::loader::ReadPath::MlxLoader,
    };
    let p = Flux3Pipeline::new(source, zimage::mlx::Dtype::F32).unwrap();
    assert_eq!(p.token_ids("a fox").unwrap(), ours);

    // A broken template is refused, naming its file.
    std::fs::write(&file, r#"{"chat_template": "{% for m in messages %}"}"#).unwrap();
    let d = zimage::diffusers_dir::DiffusersDir::open(&dir).unwrap();
    let e = Flux3Pipeline::new(d, zimage::mlx::Dtype::F32)
        .err()
        .unwrap();
    assert!(e.to_string().contains("chat_template.json"), "{e}");
}

/// A FLUX.2 [klein] and a FLUX.3 [klein] with the same VAE share its blobs: the second import
/// writes none of them.
#[test]
fn flux2_and_flux3_share_the_vae_they_have_in_common() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    for (name, dir) in [("klein", "flux2-klein-tiny"), ("flux3", "flux3-klein-tiny")] {
        let out = zimage_in(&store, &["create", name, "--from", s(&models().join(dir))]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let st = zimage::store::Store::at(&store);
    let vae = |name: &str| -> std::collections::BTreeMap<String, String> {
        let model = st.open(name).unwrap();
        (model.manifest.layers.iter())
            .filter_map(|l| {
                let path = l.name.as_deref()?.strip_prefix("vae/")?;
                Some((path.to_string(), l.digest.clone()))
            })
            .collect()
    };
    let (klein, flux3) = (vae("klein"), vae("flux3"));
    assert!(klein.len() > 10, "{klein:?}");
    assert_eq!(klein, flux3);
}
