//! FLUX.2 [klein] from the files people have: Black Forest Labs' single transformer file
//! (original names, fused q|k|v, the final modulation's halves the other way round), ComfyUI's
//! three files and GGUF transformers, imported with `create --transformer/--text-encoder/--vae`
//! and written back with `export --format comfy|gguf`.
//!
//! The original-layout file is written here from the tiny model's diffusers file through the
//! spec's name table (klein-spec §10.4), spelled out below, not through zimage's own mapping.

mod common;

use common::{s, write_safetensors, zimage_in};
use std::path::{Path, PathBuf};
use zimage::safetensors::{self, Dtype};

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/flux2-klein-tiny")
}

fn ok(out: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The original name of a diffusers tensor that keeps its bytes, per the spec's table.
fn original_name(diffusers: &str) -> Option<String> {
    let top = [
        ("x_embedder.weight", "img_in.weight"),
        ("context_embedder.weight", "txt_in.weight"),
        (
            "time_guidance_embed.timestep_embedder.linear_1.weight",
            "time_in.in_layer.weight",
        ),
        (
            "time_guidance_embed.timestep_embedder.linear_2.weight",
            "time_in.out_layer.weight",
        ),
        (
            "double_stream_modulation_img.linear.weight",
            "double_stream_modulation_img.lin.weight",
        ),
        (
            "double_stream_modulation_txt.linear.weight",
            "double_stream_modulation_txt.lin.weight",
        ),
        (
            "single_stream_modulation.linear.weight",
            "single_stream_modulation.lin.weight",
        ),
        ("proj_out.weight", "final_layer.linear.weight"),
    ];
    if let Some((_, o)) = top.iter().find(|(d, _)| *d == diffusers) {
        return Some(o.to_string());
    }
    let (kind, rest) = diffusers.split_once("blocks.")?;
    let (n, inner) = rest.split_once('.')?;
    let inner = match (kind, inner) {
        ("transformer_", "attn.norm_q.weight") => "img_attn.norm.query_norm.scale",
        ("transformer_", "attn.norm_k.weight") => "img_attn.norm.key_norm.scale",
        ("transformer_", "attn.norm_added_q.weight") => "txt_attn.norm.query_norm.scale",
        ("transformer_", "attn.norm_added_k.weight") => "txt_attn.norm.key_norm.scale",
        ("transformer_", "attn.to_out.0.weight") => "img_attn.proj.weight",
        ("transformer_", "attn.to_add_out.weight") => "txt_attn.proj.weight",
        ("transformer_", "ff.linear_in.weight") => "img_mlp.0.weight",
        ("transformer_", "ff.linear_out.weight") => "img_mlp.2.weight",
        ("transformer_", "ff_context.linear_in.weight") => "txt_mlp.0.weight",
        ("transformer_", "ff_context.linear_out.weight") => "txt_mlp.2.weight",
        ("single_transformer_", "attn.to_qkv_mlp_proj.weight") => "linear1.weight",
        ("single_transformer_", "attn.to_out.weight") => "linear2.weight",
        ("single_transformer_", "attn.norm_q.weight") => "norm.query_norm.scale",
        ("single_transformer_", "attn.norm_k.weight") => "norm.key_norm.scale",
        _ => return None,
    };
    let block = match kind {
        "transformer_" => "double_blocks",
        _ => "single_blocks",
    };
    Some(format!("{block}.{n}.{inner}"))
}

/// The tiny model's transformer as Black Forest Labs lays it out, under `prefix`.
fn write_original(path: &Path, prefix: &str) {
    let file = tiny().join("transformer/diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(file).unwrap();
    let header = safetensors::parse(&bytes).unwrap();
    let data = |name: &str| {
        let t = header.tensors.iter().find(|t| t.name == name).unwrap();
        let start = (header.data_start() + t.data_offsets.0) as usize;
        (t, bytes[start..start + t.nbytes() as usize].to_vec())
    };
    let mut out: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = Vec::new();
    for t in &header.tensors {
        let name = t.name.as_str();
        if let Some(o) = original_name(name) {
            out.push((o, t.dtype, t.shape.clone(), data(name).1));
        } else if name == "norm_out.linear.weight" {
            // diffusers holds (scale, shift); the original (shift, scale).
            let (_, b) = data(name);
            let half = b.len() / 2;
            let swapped = [&b[half..], &b[..half]].concat();
            out.push((
                "final_layer.adaLN_modulation.1.weight".into(),
                t.dtype,
                t.shape.clone(),
                swapped,
            ));
        }
    }
    let blocks = header
        .tensors
        .iter()
        .filter(|t| t.name.ends_with(".attn.to_q.weight") && t.name.starts_with("transformer_"))
        .count();
    for b in 0..blocks {
        for (stream, parts) in [
            ("img", ["to_q", "to_k", "to_v"]),
            ("txt", ["add_q_proj", "add_k_proj", "add_v_proj"]),
        ] {
            let mut fused = Vec::new();
            let mut shape = Vec::new();
            for p in parts {
                let (t, b) = data(&format!("transformer_blocks.{b}.attn.{p}.weight"));
                fused.extend(b);
                shape = vec![t.shape[0] * 3, t.shape[1]];
            }
            out.push((
                format!("double_blocks.{b}.{stream}_attn.qkv.weight"),
                Dtype::BF16,
                shape,
                fused,
            ));
        }
    }
    let tensors: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = out
        .into_iter()
        .map(|(n, d, s, b)| (format!("{prefix}{n}"), d, s, b))
        .collect();
    let borrowed: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
        .collect();
    write_safetensors(path, &borrowed);
}

/// `zimage create NAME --transformer T --text-encoder E --vae V`: a model from its three files.
fn create_from_files(store: &Path, name: &str, [transformer, encoder, vae]: [&Path; 3]) -> String {
    ok(&zimage_in(
        store,
        &[
            "create",
            name,
            "--transformer",
            s(transformer),
            "--text-encoder",
            s(encoder),
            "--vae",
            s(vae),
        ],
    ))
}

/// The pixels of a 64² picture the stored model `model` makes from seed 3.
fn pixels(store: &Path, model: &str, dir: &Path) -> Vec<u8> {
    let png = dir.join(format!("{}.png", model.replace('/', "_")));
    ok(&zimage_in(
        store,
        &[
            "generate",
            "a fox",
            "--model",
            model,
            "--width",
            "64",
            "--height",
            "64",
            "--seed",
            "3",
            "-o",
            s(&png),
        ],
    ));
    image::open(&png).unwrap().to_rgb8().into_raw()
}

#[test]
fn the_original_single_file_imports_as_the_diffusers_model() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    ok(&zimage_in(
        &store,
        &["create", "klein", "--from", s(&tiny())],
    ));
    let original = tmp.path().join("flux-2-klein-tiny.safetensors");
    write_original(&original, "model.diffusion_model.");

    // The directory gives what shapes cannot tell (the tiny model's RoPE split); every
    // tensor of the file is then one the directory's model already holds, byte for byte.
    let out = ok(&zimage_in(
        &store,
        &[
            "create",
            "from-bfl",
            "--from",
            s(&tiny()),
            "--transformer",
            s(&original),
        ],
    ));
    assert!(out.contains("original layout"), "{out}");
    assert!(out.contains(" 0 blobs written"), "{out}");
    assert_eq!(
        pixels(&store, "from-bfl", tmp.path()),
        pixels(&store, "klein", tmp.path())
    );

    // A file named as a base model's makes a base model when nothing else says.
    let base = tmp.path().join("flux-2-klein-base-tiny.safetensors");
    std::fs::copy(&original, &base).unwrap();
    let comfy = tmp.path().join("comfy");
    ok(&zimage_in(
        &store,
        &["export", "--format", "comfy", "klein", s(&comfy)],
    ));
    let te = comfy.join("text_encoders/klein.safetensors");
    let vae = comfy.join("vae/klein.safetensors");
    let out = ok(&zimage_in(
        &store,
        &[
            "create",
            "base",
            "--transformer",
            s(&base),
            "--text-encoder",
            s(&te),
            "--vae",
            s(&vae),
        ],
    ));
    assert!(out.contains("created base"), "{out}");
    let shown = ok(&zimage_in(&store, &["show", "base"]));
    assert!(shown.contains("family      FLUX.2 [klein]"), "{shown}");
    assert!(
        shown.contains("50 steps, guidance 4 (base model)"),
        "{shown}"
    );

    // A Z-Image and a klein model whose text encoders share a tensor (the tiny models' token
    // embedding) store it once.
    let zimage = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    ok(&zimage_in(&store, &["create", "z", "--from", s(&zimage)]));
    let shown = ok(&zimage_in(&store, &["show", "z"]));
    let shared = shown.lines().find(|l| l.starts_with("shared")).unwrap();
    assert!(shared.starts_with("shared      1 blobs"), "{shown}");
}

#[test]
fn comfy_and_gguf_exports_import_back_to_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    ok(&zimage_in(
        &store,
        &["create", "klein", "--from", s(&tiny())],
    ));
    let comfy = tmp.path().join("comfy");
    ok(&zimage_in(
        &store,
        &["export", "--format", "comfy", "klein", s(&comfy)],
    ));
    let file = |dir: &str, ext: &str| comfy.join(format!("{dir}/klein.{ext}"));

    // The exported transformer is in the original layout.
    let header = safetensors::read_header_file(&file("diffusion_models", "safetensors")).unwrap();
    let names: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
    for name in [
        "double_blocks.0.img_attn.qkv.weight",
        "single_blocks.2.linear1.weight",
        "final_layer.adaLN_modulation.1.weight",
    ] {
        assert!(names.contains(&name), "{names:?}");
    }

    // The three files alone (their metadata carries the configs) make the same model.
    let from_files = |name: &str, transformer: &Path| {
        let (encoder, vae) = (
            file("text_encoders", "safetensors"),
            file("vae", "safetensors"),
        );
        create_from_files(&store, name, [transformer, &encoder, &vae])
    };
    let out = from_files("from-comfy", &file("diffusion_models", "safetensors"));
    assert!(out.contains(" 0 blobs written"), "{out}");
    let want = pixels(&store, "klein", tmp.path());
    assert_eq!(pixels(&store, "from-comfy", tmp.path()), want);

    // GGUF: the bf16 transformer comes back exact.
    let out = ok(&zimage_in(
        &store,
        &["export", "--format", "gguf", "klein", s(&comfy)],
    ));
    assert!(out.contains("(exact)"), "{out}");
    let out = from_files("from-gguf", &file("diffusion_models", "gguf"));
    assert!(out.contains(" 0 blobs written"), "{out}");
    assert_eq!(pixels(&store, "from-gguf", tmp.path()), want);

    // A quantized klein goes out as ggml blocks and comes back as a model that runs.
    ok(&zimage_in(
        &store,
        &["create", "k4", "--from", s(&tiny()), "--quantize", "int4"],
    ));
    let q = tmp.path().join("q");
    let out = ok(&zimage_in(
        &store,
        &["export", "--format", "gguf", "k4", s(&q)],
    ));
    assert!(out.contains("Q4_1"), "{out}");
    let gguf = q.join("diffusion_models/k4.gguf");
    let out = from_files("from-q4", &gguf);
    assert!(out.contains("created from-q4"), "{out}");
    let shown = ok(&zimage_in(&store, &["show", "from-q4"]));
    assert!(shown.contains("quantized"), "{shown}");
    assert_eq!(pixels(&store, "from-q4", tmp.path()).len(), 64 * 64 * 3);
}

/// A K-quant GGUF transformer, as the published klein GGUFs are: a klein whose rows are 256
/// wide (the tiny model at D 256, one block of each kind) goes out through `export --format
/// gguf`, its 256-multiple rows become Q4_K blocks (the fused q|k|v cut into thirds and the
/// final modulation's halves swapped on those blocks), and it imports as exact int4 and draws
/// what the same values in f32 draw.
#[test]
fn a_k_quant_gguf_transformer_imports_exactly() {
    use zimage::formats::gguf::{self, GgmlType};
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let model = tmp.path().join("wide");
    common::copy_model(&tiny(), &model);
    // A link to the tiny model's weights: removed, not written through.
    let weights_file = model.join("transformer/diffusion_pytorch_model.safetensors");
    std::fs::remove_file(&weights_file).unwrap();
    let config = tiny().join("transformer/config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    for (key, value) in [
        ("num_attention_heads", serde_json::json!(4)),
        ("num_layers", serde_json::json!(1)),
        ("num_single_layers", serde_json::json!(1)),
        ("mlp_ratio", serde_json::json!(3.0)),
        ("timestep_guidance_channels", serde_json::json!(256)),
    ] {
        config[key] = value;
    }
    std::fs::write(model.join("transformer/config.json"), config.to_string()).unwrap();
    let widths = common::klein::Widths {
        inner: 256,
        mlp: 768,
        joint: config["joint_attention_dim"].as_u64().unwrap() as usize,
        channels: config["in_channels"].as_u64().unwrap() as usize,
        sinusoid: 256,
        head: 64,
    };
    let weights = common::klein::weights(&widths);
    let tensors: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = (weights.iter())
        .map(|(n, shape, v)| {
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (
                n.as_str(),
                Dtype::F32,
                shape.iter().map(|&d| d as u64).collect(),
                bytes,
            )
        })
        .collect();
    write_safetensors(&weights_file, &tensors);

    ok(&zimage_in(&store, &["create", "wide", "--from", s(&model)]));
    let out = tmp.path().join("out");
    ok(&zimage_in(
        &store,
        &["export", "--format", "comfy", "wide", s(&out)],
    ));
    ok(&zimage_in(
        &store,
        &["export", "--format", "gguf", "wide", s(&out)],
    ));
    let exported = std::fs::read(out.join("diffusion_models/wide.gguf")).unwrap();
    let file = gguf::read(exported.as_slice(), exported.len() as u64).unwrap();

    // Every matrix whose rows fill whole 256-value blocks as Q4_K; the rest as exported. The
    // other file holds what the blocks hold, in f32.
    let (quantized, widened) = common::ggml::q4_k_and_widened(&exported, &file);
    let names: Vec<&str> = (quantized.iter())
        .filter(|t| t.1 == GgmlType::Q4_K)
        .map(|t| t.0.as_str())
        .collect();
    for name in [
        "double_blocks.0.img_attn.qkv.weight",
        "final_layer.adaLN_modulation.1.weight",
    ] {
        assert!(names.iter().any(|n| n.ends_with(name)), "{names:?}");
    }
    let write = |name: &str, tensors: &[common::ggml::Written]| {
        let path = tmp.path().join(name);
        common::ggml::write_like(&file, &path, tensors);
        path
    };
    let from = |name: &str, transformer: &Path| {
        let encoder = out.join("text_encoders/wide.safetensors");
        let vae = out.join("vae/wide.safetensors");
        create_from_files(&store, name, [transformer, &encoder, &vae])
    };
    let said = from("wide-q4k", &write("q4k.gguf", &quantized));
    assert!(said.contains("Q4_K → int4, group 32 (exact)"), "{said}");
    from("wide-f32", &write("f32.gguf", &widened));

    let (got, want) = (
        pixels(&store, "wide-q4k", tmp.path()),
        pixels(&store, "wide-f32", tmp.path()),
    );
    let off: Vec<u8> = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
    let mse = off.iter().map(|&d| f64::from(d).powi(2)).sum::<f64>() / off.len() as f64;
    let psnr = 10.0 * (255f64.powi(2) / mse.max(1e-12)).log10();
    // int4 products against f32 ones on the same values: rounding apart, the same picture.
    println!("Q4_K klein against the same values in f32: {psnr:.1} dB");
    assert!(psnr >= 40.0, "{psnr:.1} dB");
}
