//! FLUX.3 [klein] from the files people have: a transformer in Black Forest Labs' single-file
//! names, imported over the tiny model's directory (every tensor is one the directory's model
//! already holds, byte for byte, the output layer's halves swapped back, and the model makes the
//! same picture), and the transformer written back in those names with `export --format
//! comfy|gguf`, which imports again as the same model; GGUF transformers as published (Q8_0,
//! and Q4_K on a FLUX.3 whose rows are 256 wide) import and draw the values they hold.
//!
//! The original-layout file is written here from the tiny model's diffusers file through the
//! spec's name table (§10.2), spelled out below, not through zimage's own mapping.

mod common;

use common::{s, write_safetensors, zimage_in};
use std::path::{Path, PathBuf};
use zimage::safetensors::{self, Dtype};

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/flux3-klein-tiny")
}

fn ok(out: &std::process::Output) -> String {
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    text
}

/// A diffusers name's original one (the spec §10.2, read backwards).
fn original_name(name: &str) -> String {
    let top = [
        ("x_embedders.image.weight", "emb_in.image.weight"),
        ("x_embedders.image_cond.weight", "emb_in.image_cond.weight"),
        ("context_embedder.weight", "txt_in.weight"),
        (
            "timestep_embedder.linear_1.weight",
            "time_in.in_layer.weight",
        ),
        (
            "timestep_embedder.linear_2.weight",
            "time_in.out_layer.weight",
        ),
        (
            "target_timestep_embedder.linear_1.weight",
            "ref_time_in.in_layer.weight",
        ),
        (
            "target_timestep_embedder.linear_2.weight",
            "ref_time_in.out_layer.weight",
        ),
        ("proj_out.weight", "final_layer.image.linear.weight"),
        (
            "norm_out.linear.weight",
            "final_layer.image.adaLN_modulation.1.weight",
        ),
    ];
    if let Some((_, o)) = top.iter().find(|(d, _)| *d == name) {
        return o.to_string();
    }
    if name.contains("_stream_modulations.") {
        return name.replace(".linear.weight", ".lin.weight");
    }
    let suffixes = [
        ("attn.to_q.weight", "q_proj.weight"),
        ("attn.to_k.weight", "k_proj.weight"),
        ("attn.to_v.weight", "v_proj.weight"),
        ("attn.to_out.0.weight", "attn_out.weight"),
        ("attn.norm_q.weight", "norm.query_norm.scale"),
        ("attn.norm_k.weight", "norm.key_norm.scale"),
        ("ff.linear_in.weight", "mlp_in.weight"),
        ("ff.linear_out.weight", "mlp_out.weight"),
    ];
    let (d, o) = suffixes.iter().find(|(d, _)| name.ends_with(d)).unwrap();
    let head = name.strip_suffix(d).unwrap();
    let head = head
        .replacen(
            "mode_blocks.",
            "content_mode_blocks.",
            usize::from(head.starts_with("mode_blocks.")),
        )
        .replacen("single_transformer_blocks.", "single_blocks.", 1);
    format!("{head}{o}")
}

/// The tiny model's transformer as Black Forest Labs lays it out: names, dtypes, shapes, bytes.
fn original_tensors() -> Vec<(String, Dtype, Vec<u64>, Vec<u8>)> {
    let file = tiny().join("transformer/diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(file).unwrap();
    let header = safetensors::parse(&bytes).unwrap();
    let mut out: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = Vec::new();
    for t in &header.tensors {
        let start = (header.data_start() + t.data_offsets.0) as usize;
        let mut data = bytes[start..start + t.nbytes() as usize].to_vec();
        if t.name == "norm_out.linear.weight" {
            // diffusers holds (scale, shift); the original (shift, scale).
            let half = data.len() / 2;
            data = [&data[half..], &data[..half]].concat();
        }
        out.push((original_name(&t.name), t.dtype, t.shape.clone(), data));
    }
    out
}

/// The tiny model's transformer as Black Forest Labs lays it out, under `prefix`, with a
/// training-only tensor the import leaves out.
fn write_original(path: &Path, prefix: &str) {
    let mut out: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = original_tensors()
        .into_iter()
        .map(|(n, d, s, b)| (format!("{prefix}{n}"), d, s, b))
        .collect();
    out.push((
        format!("{prefix}repa_projectors.0.weight"),
        Dtype::BF16,
        vec![2, 2],
        vec![0; 8],
    ));
    let borrowed: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = out
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
        .collect();
    write_safetensors(path, &borrowed);
}

fn pixels(store: &Path, model: &str, dir: &Path) -> Vec<u8> {
    let png = dir.join(format!("{model}.png"));
    let args = [
        "generate",
        "a red fox",
        "--model",
        model,
        "--width",
        "64",
        "--height",
        "64",
        "--steps",
        "2",
        "--seed",
        "3",
        "--dtype",
        "f32",
        "-o",
        s(&png),
    ];
    ok(&zimage_in(store, &args));
    image::open(&png).unwrap().to_rgb8().into_raw()
}

#[test]
fn black_forest_labs_names_import_as_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    ok(&zimage_in(
        &store,
        &["create", "flux3", "--from", s(&tiny())],
    ));
    let original = tmp.path().join("flux-3-klein-tiny.safetensors");
    write_original(&original, "model.diffusion_model.");
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
        pixels(&store, "flux3", tmp.path())
    );
}

/// The tensors of a safetensors file: names, dtypes, shapes and bytes, sorted by name.
fn read_tensors(path: &Path) -> Vec<(String, Dtype, Vec<u64>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let header = safetensors::parse(&bytes).unwrap();
    let mut out: Vec<_> = (header.tensors.iter())
        .map(|t| {
            let start = (header.data_start() + t.data_offsets.0) as usize;
            let data = bytes[start..start + t.nbytes() as usize].to_vec();
            (t.name.clone(), t.dtype, t.shape.clone(), data)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `zimage create NAME --from <tiny> --transformer FILE`; what it says.
fn create_over_tiny(store: &Path, name: &str, transformer: &Path) -> String {
    ok(&zimage_in(
        store,
        &[
            "create",
            name,
            "--from",
            s(&tiny()),
            "--transformer",
            s(transformer),
        ],
    ))
}

/// `export --format comfy` writes the transformer in BFL's names, tensor for tensor what the
/// spec's table makes of the diffusers file; it and the `--format gguf` file import over the
/// tiny model's directory storing nothing new, and draw the same picture. Quantized models go
/// out as ggml blocks (int4 as Q4_1, int8 as Q8_0) that import as models that run.
#[test]
fn comfy_and_gguf_exports_are_in_original_names_and_import_back() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    ok(&zimage_in(
        &store,
        &["create", "flux3", "--from", s(&tiny())],
    ));
    let out = tmp.path().join("out");
    ok(&zimage_in(
        &store,
        &["export", "--format", "comfy", "flux3", s(&out)],
    ));
    let exported = out.join("diffusion_models/flux3.safetensors");
    let mut want = original_tensors();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    let got = read_tensors(&exported);
    let names = |t: &[(String, Dtype, Vec<u64>, Vec<u8>)]| -> Vec<String> {
        t.iter().map(|t| t.0.clone()).collect()
    };
    assert_eq!(names(&got), names(&want));
    assert!(
        got == want,
        "the exported tensors are not the original layout's bytes"
    );

    let said = create_over_tiny(&store, "from-comfy", &exported);
    assert!(said.contains("original layout"), "{said}");
    assert!(said.contains(" 0 blobs written"), "{said}");
    let picture = pixels(&store, "flux3", tmp.path());
    assert_eq!(pixels(&store, "from-comfy", tmp.path()), picture);

    // GGUF: the bf16 transformer, in the same names, comes back exact.
    let said = ok(&zimage_in(
        &store,
        &["export", "--format", "gguf", "flux3", s(&out)],
    ));
    assert!(said.contains("(exact)"), "{said}");
    let gguf_path = out.join("diffusion_models/flux3.gguf");
    let gguf_bytes = std::fs::read(&gguf_path).unwrap();
    let file = zimage::formats::gguf::read(gguf_bytes.as_slice(), gguf_bytes.len() as u64).unwrap();
    let architecture = (file.metadata.iter()).find(|(k, _)| k == "general.architecture");
    let flux = zimage::formats::gguf::Value::String("flux".into());
    assert_eq!(architecture.map(|(_, v)| v), Some(&flux));
    let mut gguf_names: Vec<String> = file.tensors.iter().map(|t| t.name.clone()).collect();
    gguf_names.sort();
    assert_eq!(gguf_names, names(&want));
    let said = create_over_tiny(&store, "from-gguf", &gguf_path);
    assert!(said.contains(" 0 blobs written"), "{said}");
    assert_eq!(pixels(&store, "from-gguf", tmp.path()), picture);

    // Quantized models go out as ggml blocks and come back as models that run.
    for (quantize, ggml) in [("int4", "Q4_1"), ("int8", "Q8_0")] {
        let name = format!("q-{quantize}");
        ok(&zimage_in(
            &store,
            &[
                "create",
                &name,
                "--from",
                s(&tiny()),
                "--quantize",
                quantize,
            ],
        ));
        let q = tmp.path().join(&name);
        let said = ok(&zimage_in(
            &store,
            &["export", "--format", "gguf", &name, s(&q)],
        ));
        assert!(said.contains(ggml), "{said}");
        let back = format!("from-{name}");
        let said = create_over_tiny(
            &store,
            &back,
            &q.join(format!("diffusion_models/{name}.gguf")),
        );
        assert!(said.contains(&format!("created {back}")), "{said}");
        let shown = ok(&zimage_in(&store, &["show", &back]));
        assert!(shown.contains("quantized"), "{shown}");
        assert_eq!(pixels(&store, &back, tmp.path()).len(), 64 * 64 * 3);
    }
}

/// A GGUF transformer as the published ones are written (BFL's names without a prefix, Q8_0
/// blocks in the blocks, F16 outside them, F32 norm scales, no config; made by
/// tests/fixtures/gguf/make_flux3_fixture.py, its names checked against diffusers' converter)
/// imports over the tiny model's directory as a quantized model, and draws what the same values
/// in f32 draw.
#[test]
fn a_published_style_gguf_transformer_imports_and_draws_its_values() {
    use zimage::formats::gguf;
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/flux3-tiny-q8_0.gguf");
    let bytes = std::fs::read(&fixture).unwrap();
    let file = gguf::read(bytes.as_slice(), bytes.len() as u64).unwrap();
    let kinds: std::collections::BTreeSet<String> = file
        .tensors
        .iter()
        .map(|t| format!("{:?}", t.ggml_type))
        .collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["F16", "F32", "Q8_0"]
    );

    // The same values in f32, under the same names.
    let widened: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = (file.tensors.iter())
        .map(|t| {
            let data = &bytes[t.offset as usize..(t.offset + t.nbytes) as usize];
            let values = zimage::ggml::dequantize(t.ggml_type, data).unwrap();
            let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (t.name.clone(), Dtype::F32, t.shape.clone(), data)
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let widened_path = tmp.path().join("widened.safetensors");
    let borrowed: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = (widened.iter())
        .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
        .collect();
    write_safetensors(&widened_path, &borrowed);

    let store = tmp.path().join("store");
    let said = create_over_tiny(&store, "q8", &fixture);
    assert!(said.contains("Q8_0"), "{said}");
    let shown = ok(&zimage_in(&store, &["show", "q8"]));
    assert!(shown.contains("quantized"), "{shown}");
    create_over_tiny(&store, "f32", &widened_path);
    let (got, want) = (
        pixels(&store, "q8", tmp.path()),
        pixels(&store, "f32", tmp.path()),
    );
    let off: Vec<u8> = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
    let mse = off.iter().map(|&d| f64::from(d).powi(2)).sum::<f64>() / off.len() as f64;
    let psnr = 10.0 * (255f64.powi(2) / mse.max(1e-12)).log10();
    // int8 products against f32 ones on the same values: rounding apart, the same picture.
    println!("Q8_0 FLUX.3 against the same values in f32: {psnr:.1} dB");
    assert!(psnr >= 40.0, "{psnr:.1} dB");
}

/// Random weights of a FLUX.3 transformer at width `dim` (heads of 32), one block of each kind,
/// feed-forward `mlp` wide, a 256-wide sinusoid, the tiny model's 64 channels and text width:
/// diffusers' names, shapes and f32 values (a fixed hash, variance about 1/fan_in; norm scales
/// near 1).
fn wide_weights(dim: u64, mlp: u64) -> Vec<(String, Vec<u64>, Vec<f32>)> {
    let (channels, text, sinusoid, head) = (64, 64, 256, 32);
    let mut shapes: Vec<(String, Vec<u64>)> = vec![
        ("x_embedders.image.weight".into(), vec![dim, channels]),
        ("x_embedders.image_cond.weight".into(), vec![dim, channels]),
        ("context_embedder.weight".into(), vec![dim, text]),
        (
            "timestep_embedder.linear_1.weight".into(),
            vec![dim, sinusoid],
        ),
        ("timestep_embedder.linear_2.weight".into(), vec![dim, dim]),
        (
            "target_timestep_embedder.linear_1.weight".into(),
            vec![dim, sinusoid],
        ),
        (
            "target_timestep_embedder.linear_2.weight".into(),
            vec![dim, dim],
        ),
        ("norm_out.linear.weight".into(), vec![2 * dim, dim]),
        ("proj_out.weight".into(), vec![channels, dim]),
    ];
    for stage in ["early_stream_modulations", "single_stream_modulations"] {
        for mode in ["image", "image_cond", "txt"] {
            shapes.push((format!("{stage}.{mode}.linear.weight"), vec![3 * dim, dim]));
        }
    }
    for block in [
        "mode_blocks.image.0",
        "mode_blocks.image_cond.0",
        "txt_mode_blocks.0",
        "single_transformer_blocks.0",
    ] {
        for layer in ["to_q", "to_k", "to_v", "to_out.0"] {
            shapes.push((format!("{block}.attn.{layer}.weight"), vec![dim, dim]));
        }
        for norm in ["norm_q", "norm_k"] {
            shapes.push((format!("{block}.attn.{norm}.weight"), vec![head]));
        }
        shapes.push((format!("{block}.ff.linear_in.weight"), vec![2 * mlp, dim]));
        shapes.push((format!("{block}.ff.linear_out.weight"), vec![dim, mlp]));
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    (shapes.into_iter())
        .map(|(name, shape)| {
            let n = shape.iter().product::<u64>() as usize;
            let values = match shape.as_slice() {
                [_] => (0..n).map(|_| 1.0 + 0.1 * uniform()).collect(),
                // Uniform in ±√(3/fan_in): variance 1/fan_in.
                [_, fan_in] => {
                    let a = (3.0 / *fan_in as f32).sqrt();
                    (0..n).map(|_| a * uniform()).collect()
                }
                _ => unreachable!("weights are 1-D or 2-D"),
            };
            (name, shape, values)
        })
        .collect()
}

/// A K-quant GGUF transformer, as the published GGUFs of wide models are: a FLUX.3 whose rows
/// are 256 wide (the tiny model at D 256, one block of each kind) goes out through `export
/// --format gguf` in BFL's names, its 256-multiple rows become Q4_K blocks (the output
/// modulation's halves swapped on those blocks), and it imports as exact int4 and draws what
/// the same values in f32 draw.
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
    let config_path = model.join("transformer/config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    for (key, value) in [
        ("num_attention_heads", serde_json::json!(8)),
        ("num_layers", serde_json::json!(1)),
        ("num_single_layers", serde_json::json!(1)),
        ("mlp_ratio", serde_json::json!(2.0)),
        ("timestep_channels", serde_json::json!(256)),
    ] {
        config[key] = value;
    }
    std::fs::write(&config_path, config.to_string()).unwrap();
    let weights = wide_weights(256, 512);
    let tensors: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = (weights.iter())
        .map(|(n, shape, v)| {
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (n.as_str(), Dtype::F32, shape.clone(), bytes)
        })
        .collect();
    write_safetensors(&weights_file, &tensors);

    ok(&zimage_in(&store, &["create", "wide", "--from", s(&model)]));
    let out = tmp.path().join("out");
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
        "content_mode_blocks.image.0.q_proj.weight",
        "single_blocks.0.mlp_out.weight",
        "final_layer.image.adaLN_modulation.1.weight",
    ] {
        assert!(names.contains(&name), "{names:?}");
    }
    let write = |name: &str, tensors: &[common::ggml::Written]| {
        let path = tmp.path().join(name);
        common::ggml::write_like(&file, &path, tensors);
        path
    };
    let from = |name: &str, transformer: &Path| {
        ok(&zimage_in(
            &store,
            &[
                "create",
                name,
                "--from",
                s(&model),
                "--transformer",
                s(transformer),
            ],
        ))
    };
    let said = from("wide-q4k", &write("q4k.gguf", &quantized));
    assert!(said.contains("Q4_K → int4, group 32 (exact)"), "{said}");
    from("wide-f32", &write("f32.gguf", &widened));

    let (got, want) = (
        pixels(&store, "wide-q4k", tmp.path()),
        pixels(&store, "wide-f32", tmp.path()),
    );
    // A picture, not a flat field the weights saturate to.
    let values: std::collections::BTreeSet<u8> = want.iter().copied().collect();
    assert!(values.len() > 64, "{} distinct values", values.len());
    let off: Vec<u8> = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
    let mse = off.iter().map(|&d| f64::from(d).powi(2)).sum::<f64>() / off.len() as f64;
    let psnr = 10.0 * (255f64.powi(2) / mse.max(1e-12)).log10();
    // int4 products against f32 ones on the same values: rounding apart, the same picture.
    println!("Q4_K FLUX.3 against the same values in f32: {psnr:.1} dB");
    assert!(psnr >= 40.0, "{psnr:.1} dB");
}

/// ComfyUI's three files as `export --format comfy` writes them (the transformer in BFL's
/// names, the Qwen3-VL text encoder in transformers' names, the VAE, each carrying its config)
/// make the same model with no directory beside them.
#[test]
fn the_three_comfy_files_alone_make_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    ok(&zimage_in(
        &store,
        &["create", "flux3", "--from", s(&tiny())],
    ));
    let out = tmp.path().join("out");
    ok(&zimage_in(
        &store,
        &["export", "--format", "comfy", "flux3", s(&out)],
    ));
    let file = |dir: &str| out.join(format!("{dir}/flux3.safetensors"));
    let said = ok(&zimage_in(
        &store,
        &[
            "create",
            "composed",
            "--transformer",
            s(&file("diffusion_models")),
            "--text-encoder",
            s(&file("text_encoders")),
            "--vae",
            s(&file("vae")),
        ],
    ));
    assert!(said.contains(" 0 blobs written"), "{said}");
    let shown = ok(&zimage_in(&store, &["show", "composed"]));
    assert!(shown.contains("FLUX.3 [klein]"), "{shown}");
    assert!(shown.contains("16 steps"), "{shown}");
    assert_eq!(
        pixels(&store, "composed", tmp.path()),
        pixels(&store, "flux3", tmp.path())
    );
}
