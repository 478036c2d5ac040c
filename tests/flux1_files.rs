//! FLUX.1 from the files people have: a transformer in Black Forest Labs' single-file names
//! (`flux1-dev.safetensors`, with or without ComfyUI's `model.diffusion_model.`), imported over
//! the tiny model's directory as the same model; `export --format comfy|gguf` writing those
//! names back, which import again storing nothing new; published-style GGUF transformers (Q8_0
//! as city96 writes them, Q4_K) drawing the values they hold; ComfyUI's four files (the
//! transformer, `clip_l`, `t5xxl`, `ae`) composing the model with no directory, fp8 ones too; and
//! T5's encoder as a llama.cpp GGUF file (`t5-v1_1-xxl-encoder-Q8_0.gguf`).
//!
//! The original-layout files are written here from the tiny model's diffusers files through
//! zimage's export table (`layout::to_original`), checked against the spec's names and byte
//! order (flux1-spec §11) for the fused layers and the swapped final modulation.

mod common;

use common::{s, write_safetensors, write_safetensors_with_metadata, zimage_in};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use zimage::formats::gguf::{self, GgmlType};
use zimage::layouts::Joined;
use zimage::safetensors::{self, Dtype};

/// A tensor as a test writes it: name, dtype, shape, bytes.
type Tensor = (String, Dtype, Vec<u64>, Vec<u8>);

fn tiny(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("models/flux1-{kind}-tiny"))
}

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

fn ok(out: &std::process::Output) -> String {
    let text = text(out);
    assert!(out.status.success(), "{text}");
    text
}

/// What a refused command says, on one line.
fn refused(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "{}", text(out));
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

/// The tensors of a safetensors file, sorted by name.
fn read_tensors(path: &Path) -> Vec<Tensor> {
    let bytes = std::fs::read(path).unwrap();
    let header = safetensors::parse(&bytes).unwrap();
    let mut out: Vec<Tensor> = (header.tensors.iter())
        .map(|t| {
            let start = (header.data_start() + t.data_offsets.0) as usize;
            let data = bytes[start..start + t.nbytes() as usize].to_vec();
            (t.name.clone(), t.dtype, t.shape.clone(), data)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// An export's table: stored names and shapes to the tensors of the file.
type Table = fn(&[(String, Vec<u64>)]) -> Vec<Joined>;

/// `tensors` joined as `table` says: each joined tensor its parts' bytes one after the other,
/// rolled by its rows.
fn joined(tensors: &[Tensor], table: Table) -> Vec<Tensor> {
    let shapes: Vec<(String, Vec<u64>)> =
        tensors.iter().map(|t| (t.0.clone(), t.2.clone())).collect();
    let by_name: HashMap<&str, &Tensor> = tensors.iter().map(|t| (t.0.as_str(), t)).collect();
    let mut out: Vec<Tensor> = (table(&shapes).into_iter())
        .map(|j| {
            let mut bytes: Vec<u8> = (j.parts.iter())
                .flat_map(|p| by_name[p.as_str()].3.clone())
                .collect();
            let rows = j.shape[0] as usize;
            let by = bytes.len() / rows * j.roll_rows as usize;
            bytes.rotate_left(by);
            (j.name, by_name[j.parts[0].as_str()].1, j.shape, bytes)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn component_file(dir: &Path, component: &str) -> PathBuf {
    let name = match component {
        "transformer" | "vae" => "diffusion_pytorch_model.safetensors",
        _ => "model.safetensors",
    };
    dir.join(component).join(name)
}

/// The tiny model's transformer in Black Forest Labs' names, checked against the spec's
/// table where it fuses or reorders: a double block's `qkv` is q's rows, then k's, then v's; a
/// single block's `linear1` q, k, v and the MLP's input; the final modulation (shift, scale)
/// where diffusers holds (scale, shift).
fn bfl_transformer(dir: &Path) -> Vec<Tensor> {
    let diffusers = read_tensors(&component_file(dir, "transformer"));
    let bfl = joined(&diffusers, zimage::families::flux1::layout::to_original);
    let d: HashMap<&str, &Tensor> = diffusers.iter().map(|t| (t.0.as_str(), t)).collect();
    let o: HashMap<&str, &Tensor> = bfl.iter().map(|t| (t.0.as_str(), t)).collect();
    let cat = |names: &[&str]| -> Vec<u8> { names.iter().flat_map(|n| d[n].3.clone()).collect() };
    assert_eq!(
        o["double_blocks.1.txt_attn.qkv.weight"].3,
        cat(&[
            "transformer_blocks.1.attn.add_q_proj.weight",
            "transformer_blocks.1.attn.add_k_proj.weight",
            "transformer_blocks.1.attn.add_v_proj.weight",
        ])
    );
    assert_eq!(
        o["single_blocks.2.linear1.bias"].3,
        cat(&[
            "single_transformer_blocks.2.attn.to_q.bias",
            "single_transformer_blocks.2.attn.to_k.bias",
            "single_transformer_blocks.2.attn.to_v.bias",
            "single_transformer_blocks.2.proj_mlp.bias",
        ])
    );
    let scale_shift = &d["norm_out.linear.weight"].3;
    let half = scale_shift.len() / 2;
    assert_eq!(
        o["final_layer.adaLN_modulation.1.weight"].3,
        [&scale_shift[half..], &scale_shift[..half]].concat()
    );
    for (name, diffusers) in [
        ("img_in.weight", "x_embedder.weight"),
        (
            "vector_in.in_layer.weight",
            "time_text_embed.text_embedder.linear_1.weight",
        ),
        (
            "double_blocks.0.img_mod.lin.bias",
            "transformer_blocks.0.norm1.linear.bias",
        ),
        (
            "double_blocks.0.txt_attn.norm.key_norm.scale",
            "transformer_blocks.0.attn.norm_added_k.weight",
        ),
        (
            "single_blocks.0.linear2.weight",
            "single_transformer_blocks.0.proj_out.weight",
        ),
        ("final_layer.linear.weight", "proj_out.weight"),
    ] {
        assert_eq!(o[name].3, d[diffusers].3, "{name}");
    }
    bfl
}

/// `tensors` under `prefix`, written to `path` with `meta`.
fn write(path: &Path, prefix: &str, tensors: &[Tensor], meta: Option<&BTreeMap<String, String>>) {
    let named: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = (tensors.iter())
        .map(|(n, d, s, b)| (format!("{prefix}{n}"), *d, s.clone(), b.clone()))
        .collect();
    let borrowed: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = (named.iter())
        .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
        .collect();
    write_safetensors_with_metadata(path, &borrowed, meta);
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

fn create(store: &Path, args: &[&str]) -> String {
    let mut all = vec!["create"];
    all.extend(args);
    ok(&zimage_in(store, &all))
}

/// A transformer in BFL's names (\[dev\] under ComfyUI's prefix and without it, \[schnell\]
/// without a guidance embedder) imports over the tiny model's directory as that model: every
/// blob already stored, the same picture.
#[test]
fn black_forest_labs_names_import_over_the_directory_as_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let mut stored = std::collections::BTreeSet::new();
    for (kind, prefix) in [
        ("dev", "model.diffusion_model."),
        ("dev", ""),
        ("schnell", "model.diffusion_model."),
    ] {
        let dir = tiny(kind);
        if stored.insert(kind) {
            create(&store, &[kind, "--from", s(&dir)]);
        }
        let bfl = bfl_transformer(&dir);
        assert_eq!(
            bfl.iter().any(|t| t.0.starts_with("guidance_in.")),
            kind == "dev"
        );
        let file = tmp.path().join(format!("flux1-{kind}.safetensors"));
        write(&file, prefix, &bfl, None);
        let name = format!("bfl-{kind}{}", prefix.len());
        let said = create(
            &store,
            &[&name, "--from", s(&dir), "--transformer", s(&file)],
        );
        assert!(said.contains("original layout"), "{said}");
        assert!(said.contains(" 0 blobs written"), "{said}");
        assert_eq!(
            pixels(&store, &name, tmp.path()),
            pixels(&store, kind, tmp.path()),
            "{kind} {prefix}"
        );
    }
}

/// `zimage create NAME --from <tiny dev> --transformer FILE`; what it says.
fn over_dev(store: &Path, name: &str, transformer: &Path) -> String {
    create(
        store,
        &[
            name,
            "--from",
            s(&tiny("dev")),
            "--transformer",
            s(transformer),
        ],
    )
}

/// `export --format comfy` writes the transformer in BFL's names, tensor for tensor the
/// original layout's bytes, beside CLIP's and T5's files and the VAE; it and the `--format gguf`
/// file (`general.architecture` `flux`, the same names) import over the tiny model's directory
/// storing nothing new and draw the same picture.
#[test]
fn comfy_and_gguf_exports_are_in_bfl_names_and_import_back() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    create(&store, &["dev", "--from", s(&tiny("dev"))]);
    let out = tmp.path().join("out");
    let said = ok(&zimage_in(
        &store,
        &["export", "--format", "comfy", "dev", s(&out)],
    ));
    for file in [
        "diffusion_models/dev.safetensors",
        "text_encoders/dev.safetensors",
        "text_encoders/dev_2.safetensors",
        "vae/dev.safetensors",
    ] {
        assert!(said.contains(file), "{said}");
    }
    let exported = out.join("diffusion_models/dev.safetensors");
    let want = bfl_transformer(&tiny("dev"));
    let got = read_tensors(&exported);
    let names = |t: &[Tensor]| -> Vec<String> { t.iter().map(|t| t.0.clone()).collect() };
    assert_eq!(names(&got), names(&want));
    assert!(
        got == want,
        "the exported tensors are not the original layout's bytes"
    );
    // The text encoders keep transformers' names, as ComfyUI's `clip_l` and `t5xxl` do.
    for (file, component) in [("dev", "text_encoder"), ("dev_2", "text_encoder_2")] {
        let exported = read_tensors(&out.join(format!("text_encoders/{file}.safetensors")));
        assert!(
            exported == read_tensors(&component_file(&tiny("dev"), component)),
            "{file}"
        );
    }

    let said = over_dev(&store, "from-comfy", &exported);
    assert!(said.contains("original layout"), "{said}");
    assert!(said.contains(" 0 blobs written"), "{said}");
    let picture = pixels(&store, "dev", tmp.path());
    assert_eq!(pixels(&store, "from-comfy", tmp.path()), picture);

    let said = ok(&zimage_in(
        &store,
        &["export", "--format", "gguf", "dev", s(&out)],
    ));
    assert!(said.contains("(exact)"), "{said}");
    let gguf_path = out.join("diffusion_models/dev.gguf");
    let bytes = std::fs::read(&gguf_path).unwrap();
    let file = gguf::read(bytes.as_slice(), bytes.len() as u64).unwrap();
    let architecture = (file.metadata.iter()).find(|(k, _)| k == "general.architecture");
    assert_eq!(
        architecture.map(|(_, v)| v),
        Some(&gguf::Value::String("flux".into()))
    );
    let mut gguf_names: Vec<String> = file.tensors.iter().map(|t| t.name.clone()).collect();
    gguf_names.sort();
    assert_eq!(gguf_names, names(&want));
    let modulation = (file.tensors.iter())
        .find(|t| t.name == "final_layer.adaLN_modulation.1.weight")
        .unwrap();
    let held = &bytes[modulation.offset as usize..(modulation.offset + modulation.nbytes) as usize];
    let bfl = want.iter().find(|t| t.0 == modulation.name).unwrap();
    assert_eq!(held, bfl.3.as_slice());
    let said = over_dev(&store, "from-gguf", &gguf_path);
    assert!(said.contains(" 0 blobs written"), "{said}");
    assert_eq!(pixels(&store, "from-gguf", tmp.path()), picture);
}

/// Random weights of a FLUX.1 transformer at width 256 (two heads of 128, which diffusers'
/// RoPE axes fill), one block of each kind, the tiny model's 32 latent channels, 40-wide text
/// rows and 48-wide pooled vector: diffusers' names, shapes and f32 values (a fixed hash,
/// variance about 1/fan_in; norm scales near 1; biases small).
fn wide_weights() -> Vec<(String, Vec<u64>, Vec<f32>)> {
    let (d, channels, text, pooled, sinusoid) = (256u64, 32, 40, 48, 256);
    let mut shapes: Vec<(String, Vec<u64>)> = Vec::new();
    let mut linear = |name: &str, rows: u64, cols: u64| {
        shapes.push((format!("{name}.weight"), vec![rows, cols]));
        shapes.push((format!("{name}.bias"), vec![rows]));
    };
    linear("x_embedder", d, channels);
    linear("context_embedder", d, text);
    for (embedder, width) in [
        ("timestep_embedder", sinusoid),
        ("guidance_embedder", sinusoid),
        ("text_embedder", pooled),
    ] {
        linear(&format!("time_text_embed.{embedder}.linear_1"), d, width);
        linear(&format!("time_text_embed.{embedder}.linear_2"), d, d);
    }
    let b = "transformer_blocks.0";
    linear(&format!("{b}.norm1.linear"), 6 * d, d);
    linear(&format!("{b}.norm1_context.linear"), 6 * d, d);
    for p in [
        "to_q",
        "to_k",
        "to_v",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_out.0",
        "to_add_out",
    ] {
        linear(&format!("{b}.attn.{p}"), d, d);
    }
    for ff in ["ff", "ff_context"] {
        linear(&format!("{b}.{ff}.net.0.proj"), 4 * d, d);
        linear(&format!("{b}.{ff}.net.2"), d, 4 * d);
    }
    let s = "single_transformer_blocks.0";
    linear(&format!("{s}.norm.linear"), 3 * d, d);
    for p in ["to_q", "to_k", "to_v"] {
        linear(&format!("{s}.attn.{p}"), d, d);
    }
    linear(&format!("{s}.proj_mlp"), 4 * d, d);
    linear(&format!("{s}.proj_out"), d, 5 * d);
    linear("norm_out.linear", 2 * d, d);
    linear("proj_out", channels, d);
    for n in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
        shapes.push((format!("{b}.attn.{n}.weight"), vec![128]));
    }
    for n in ["norm_q", "norm_k"] {
        shapes.push((format!("{s}.attn.{n}.weight"), vec![128]));
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
            let values = match (shape.as_slice(), name.ends_with(".bias")) {
                ([_], true) => (0..n).map(|_| 0.02 * uniform()).collect(),
                ([_], false) => (0..n).map(|_| 1.0 + 0.1 * uniform()).collect(),
                // Uniform in ±√(3/fan_in): variance 1/fan_in.
                ([_, fan_in], _) => {
                    let a = (3.0 / *fan_in as f32).sqrt();
                    (0..n).map(|_| a * uniform()).collect()
                }
                _ => unreachable!("weights are 1-D or 2-D"),
            };
            (name, shape, values)
        })
        .collect()
}

/// The tiny \[dev\] model at `to` with the wide random transformer.
fn wide_model(to: &Path) {
    common::copy_model(&tiny("dev"), to);
    let weights_file = component_file(to, "transformer");
    // A link to the tiny model's weights: removed, not written through.
    std::fs::remove_file(&weights_file).unwrap();
    let config_path = to.join("transformer/config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    for (key, value) in [
        ("attention_head_dim", serde_json::json!(128)),
        ("num_attention_heads", serde_json::json!(2)),
        ("num_layers", serde_json::json!(1)),
        ("num_single_layers", serde_json::json!(1)),
        ("axes_dims_rope", serde_json::json!([16, 56, 56])),
    ] {
        config[key] = value;
    }
    std::fs::write(&config_path, config.to_string()).unwrap();
    let weights = wide_weights();
    let tensors: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = (weights.iter())
        .map(|(n, shape, v)| {
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (n.as_str(), Dtype::F32, shape.clone(), bytes)
        })
        .collect();
    write_safetensors(&weights_file, &tensors);
}

/// `got` is `want`, which is a picture (not a flat field the weights saturate to).
fn same_picture(got: &[u8], want: &[u8], what: &str) {
    let values: std::collections::BTreeSet<u8> = want.iter().copied().collect();
    assert!(values.len() > 64, "{} distinct values", values.len());
    assert!(
        got == want,
        "{what} draws another picture than its values in f32"
    );
}

/// Published FLUX.1 GGUFs (city96's: BFL's names without a prefix, `general.architecture`
/// `flux`, the blocks' matrices in Q8_0, the layers outside them in F16, norm scales and biases
/// in F32) and K-quant ones (Q4_K wherever rows fill 256-value blocks) import over the model's
/// directory as quantized models and draw, pixel for pixel, what the same values in f32 draw.
#[test]
fn published_style_gguf_transformers_import_and_draw_their_values() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let model = tmp.path().join("wide");
    wide_model(&model);
    create(&store, &["wide", "--from", s(&model)]);
    let out = tmp.path().join("out");
    ok(&zimage_in(
        &store,
        &["export", "--format", "gguf", "wide", s(&out)],
    ));
    let exported = std::fs::read(out.join("diffusion_models/wide.gguf")).unwrap();
    let file = gguf::read(exported.as_slice(), exported.len() as u64).unwrap();

    // city96's Q8_0: the same metadata, no config.
    let plain = gguf::Gguf {
        metadata: (file.metadata.iter())
            .filter(|(k, _)| !k.starts_with("zimage."))
            .cloned()
            .collect(),
        ..file.clone()
    };
    let (mut q8, mut widened) = (Vec::new(), Vec::new());
    for t in &file.tensors {
        let bytes = &exported[t.offset as usize..(t.offset + t.nbytes) as usize];
        let values: Vec<f32> = (bytes.chunks_exact(4))
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let in_block = t.name.starts_with("double_blocks.") || t.name.starts_with("single_blocks.");
        let entry = |ty, data| (t.name.clone(), ty, t.shape.clone(), data);
        let (written, held) = match t.shape.as_slice() {
            [_, cols] if in_block && cols % 32 == 0 => {
                let blocks = zimage::ggml::quantize_q8_0(&values);
                let held = zimage::ggml::dequantize(GgmlType::Q8_0, &blocks).unwrap();
                (entry(GgmlType::Q8_0, blocks), held)
            }
            [_, _] => {
                let halves: Vec<half::f16> =
                    values.iter().map(|&v| half::f16::from_f32(v)).collect();
                let bytes = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
                (
                    entry(GgmlType::F16, bytes),
                    halves.iter().map(|h| h.to_f32()).collect(),
                )
            }
            _ => (entry(GgmlType::F32, bytes.to_vec()), values),
        };
        q8.push(written);
        widened.push(entry(
            GgmlType::F32,
            held.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ));
    }
    let write = |name: &str, tensors: &[common::ggml::Written]| {
        let path = tmp.path().join(name);
        common::ggml::write_like(&plain, &path, tensors);
        path
    };
    let over = |name: &str, transformer: &Path| {
        create(
            &store,
            &[name, "--from", s(&model), "--transformer", s(transformer)],
        )
    };
    let said = over("wide-q8", &write("flux1-dev-Q8_0.gguf", &q8));
    assert!(said.contains("Q8_0"), "{said}");
    let shown = ok(&zimage_in(&store, &["show", "wide-q8"]));
    assert!(shown.contains("quantized   MLX"), "{shown}");
    over("wide-q8-f32", &write("q8-f32.gguf", &widened));
    same_picture(
        &pixels(&store, "wide-q8", tmp.path()),
        &pixels(&store, "wide-q8-f32", tmp.path()),
        "Q8_0",
    );

    // Q4_K wherever a row fills whole 256-value blocks, the output modulation's halves swapped
    // on those blocks.
    let (quantized, widened) = common::ggml::q4_k_and_widened(&exported, &file);
    let q4k: Vec<&str> = (quantized.iter())
        .filter(|t| t.1 == GgmlType::Q4_K)
        .map(|t| t.0.as_str())
        .collect();
    for name in [
        "double_blocks.0.img_attn.qkv.weight",
        "single_blocks.0.linear1.weight",
        "final_layer.adaLN_modulation.1.weight",
    ] {
        assert!(q4k.contains(&name), "{q4k:?}");
    }
    let said = over("wide-q4k", &write("q4k.gguf", &quantized));
    assert!(said.contains("Q4_K → int4, group 32 (exact)"), "{said}");
    over("wide-q4k-f32", &write("q4k-f32.gguf", &widened));
    same_picture(
        &pixels(&store, "wide-q4k", tmp.path()),
        &pixels(&store, "wide-q4k-f32", tmp.path()),
        "Q4_K",
    );
}

/// `{CONFIG_METADATA_KEY: <dir>/<component>/config.json}`, as `export` writes it.
fn config_of(dir: &Path, component: &str) -> BTreeMap<String, String> {
    let config = std::fs::read_to_string(dir.join(component).join("config.json")).unwrap();
    BTreeMap::from([(zimage::layouts::CONFIG_METADATA_KEY.to_string(), config)])
}

/// The bf16 values of `t` as f32.
fn bf16_values(t: &Tensor) -> Vec<f32> {
    assert_eq!(t.1, Dtype::BF16, "{}", t.0);
    (t.3.chunks_exact(2))
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// Each matrix of `tensors` as `float8_e4m3fn` (the nearest code), the rest as it is; and the
/// same with those fp8 values widened to bf16.
fn fp8_and_widened(tensors: &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>) {
    let mut codes: Vec<(f32, u8)> = (0..=255u8)
        .map(|b| (zimage::fp8::e4m3_to_f32(b), b))
        .filter(|(v, _)| v.is_finite())
        .collect();
    codes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let nearest = |v: f32| -> u8 {
        let at = codes.partition_point(|(c, _)| *c < v);
        let below = at.checked_sub(1).map(|i| codes[i]);
        let above = codes.get(at).copied();
        match (below, above) {
            (Some(b), Some(a)) if (v - b.0).abs() <= (a.0 - v).abs() => b.1,
            (_, Some(a)) => a.1,
            (Some(b), None) => b.1,
            (None, None) => unreachable!("codes are finite"),
        }
    };
    let (mut narrow, mut wide) = (Vec::new(), Vec::new());
    for t in tensors {
        if t.2.len() != 2 {
            narrow.push(t.clone());
            wide.push(t.clone());
            continue;
        }
        let fp8: Vec<u8> = bf16_values(t).into_iter().map(nearest).collect();
        let widened: Vec<u8> = (fp8.iter())
            .flat_map(|&b| half::bf16::from_f32(zimage::fp8::e4m3_to_f32(b)).to_le_bytes())
            .collect();
        narrow.push((t.0.clone(), Dtype::F8_E4M3, t.2.clone(), fp8));
        wide.push((t.0.clone(), Dtype::BF16, t.2.clone(), widened));
    }
    (narrow, wide)
}

/// ComfyUI's four files of a FLUX.1 model.
struct ComfyFiles {
    transformer: PathBuf,
    clip: PathBuf,
    t5: PathBuf,
    vae: PathBuf,
}

/// How to write them.
#[derive(Clone, Copy, PartialEq)]
enum Files {
    /// Each carrying its config, as `export` writes them.
    WithConfig,
    /// Without configs, as published.
    Plain,
    /// With configs, the transformer's and T5's matrices as fp8 (`t5xxl_fp8_e4m3fn`).
    Fp8,
    /// With configs, the fp8 files' values widened to bf16.
    Fp8Widened,
}

/// ComfyUI's files of the tiny model of `kind` under `to`, made from its weights: the
/// transformer in BFL's names under `model.diffusion_model.` (`flux1-<kind>.safetensors`),
/// `clip_l` in transformers' names with a `text_projection`, `t5xxl` in transformers' names with
/// the token table also as `encoder.embed_tokens.weight`, and `ae` in the LDM names.
fn comfy_files(kind: &str, to: &Path, files: Files) -> ComfyFiles {
    let dir = tiny(kind);
    std::fs::create_dir_all(to).unwrap();
    let meta = |component: &str| (files != Files::Plain).then(|| config_of(&dir, component));
    let mut transformer = bfl_transformer(&dir);
    let clip = read_tensors(&component_file(&dir, "text_encoder"));
    let mut clip_l = clip.clone();
    let hidden = clip[0].2[1];
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("text_encoder/config.json")).unwrap(),
    )
    .unwrap();
    // `CLIPTextModelWithProjection`'s `[projection_dim, hidden]`.
    let projection = config["projection_dim"].as_u64().unwrap();
    clip_l.push((
        "text_projection.weight".into(),
        Dtype::BF16,
        vec![projection, hidden],
        vec![0u8; (2 * projection * hidden) as usize],
    ));
    let mut t5 = read_tensors(&component_file(&dir, "text_encoder_2"));
    let shared = t5.iter().find(|t| t.0 == "shared.weight").unwrap().clone();
    t5.push((
        "encoder.embed_tokens.weight".into(),
        shared.1,
        shared.2,
        shared.3,
    ));
    let vae = joined(
        &read_tensors(&component_file(&dir, "vae")),
        zimage::layouts::vae::to_original,
    );
    let t5_name = match files {
        Files::Fp8 | Files::Fp8Widened => "t5xxl_fp8_e4m3fn.safetensors",
        _ => "t5xxl_fp16.safetensors",
    };
    if matches!(files, Files::Fp8 | Files::Fp8Widened) {
        let pick = |(narrow, wide): (Vec<Tensor>, Vec<Tensor>)| match files {
            Files::Fp8 => narrow,
            _ => wide,
        };
        transformer = pick(fp8_and_widened(&transformer));
        t5 = pick(fp8_and_widened(&t5));
    }
    let out = ComfyFiles {
        transformer: to.join(format!("flux1-{kind}.safetensors")),
        clip: to.join("clip_l.safetensors"),
        t5: to.join(t5_name),
        vae: to.join("ae.safetensors"),
    };
    let prefix = "model.diffusion_model.";
    write(
        &out.transformer,
        prefix,
        &transformer,
        meta("transformer").as_ref(),
    );
    write(&out.clip, "", &clip_l, meta("text_encoder").as_ref());
    write(&out.t5, "", &t5, meta("text_encoder_2").as_ref());
    write(&out.vae, "", &vae, meta("vae").as_ref());
    out
}

/// `create NAME` from ComfyUI's files with the tiny model's tokenizers: its arguments.
fn composed_args(name: &str, f: &ComfyFiles, kind: &str) -> Vec<String> {
    let dir = tiny(kind);
    [
        name,
        "--transformer",
        s(&f.transformer),
        "--text-encoder",
        s(&f.clip),
        "--text-encoder-2",
        s(&f.t5),
        "--vae",
        s(&f.vae),
        "--tokenizer",
        s(&dir.join("tokenizer")),
        "--tokenizer-2",
        s(&dir.join("tokenizer_2")),
    ]
    .map(String::from)
    .to_vec()
}

fn create_owned(store: &Path, args: &[String]) -> std::process::Output {
    let mut all = vec!["create"];
    all.extend(args.iter().map(String::as_str));
    zimage_in(store, &all)
}

/// The tensors an import stored: `created NAME: N tensors`.
fn tensors_stored(said: &str) -> usize {
    let line = said.lines().find(|l| l.starts_with("created ")).unwrap();
    let (_, rest) = line.split_once(": ").unwrap();
    rest.split(' ').next().unwrap().parse().unwrap()
}

/// ComfyUI's four files (the transformer in BFL's names, `clip_l`, `t5xxl`, `ae`) and the
/// tokenizers compose each tiny FLUX.1 with no directory: the same tensors, every blob already
/// stored by the directory's import, the same picture; \[schnell\] told by its missing guidance
/// embedder, Kontext by the file's name. The files `export --format comfy` writes do the same.
#[test]
fn comfys_files_compose_flux1_without_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    for (kind, shown) in [("dev", "([dev] model)"), ("schnell", "([schnell] model)")] {
        let from_dir = create(&store, &[kind, "--from", s(&tiny(kind))]);
        let files = comfy_files(kind, &tmp.path().join(kind), Files::WithConfig);
        let name = format!("composed-{kind}");
        let said = ok(&create_owned(&store, &composed_args(&name, &files, kind)));
        assert!(
            said.contains("transformer: ") && said.contains("original layout"),
            "{said}"
        );
        assert!(
            said.contains("unused, left out: text_projection.weight"),
            "{said}"
        );
        assert!(
            said.contains("unused, left out: encoder.embed_tokens.weight"),
            "{said}"
        );
        assert!(said.contains(" 0 blobs written"), "{said}");
        assert_eq!(tensors_stored(&said), tensors_stored(&from_dir), "{said}");
        let show = ok(&zimage_in(&store, &["show", &name]));
        assert!(show.contains("family      FLUX.1"), "{show}");
        assert!(show.contains(shown), "{show}");
        assert_eq!(
            pixels(&store, &name, tmp.path()),
            pixels(&store, kind, tmp.path()),
            "{kind}"
        );
    }

    // Kontext [dev] is [dev]'s weights: only the file's name tells it.
    let files = comfy_files("kontext", &tmp.path().join("kontext"), Files::WithConfig);
    let named = tmp.path().join("kontext/flux1-kontext-dev.safetensors");
    std::fs::rename(&files.transformer, &named).unwrap();
    let files = ComfyFiles {
        transformer: named,
        ..files
    };
    let said = ok(&create_owned(
        &store,
        &composed_args("composed-kontext", &files, "kontext"),
    ));
    assert!(said.contains(" 0 blobs written"), "{said}");
    let show = ok(&zimage_in(&store, &["show", "composed-kontext"]));
    assert!(show.contains("(Kontext [dev] model)"), "{show}");

    // What `export --format comfy` writes composes the same model.
    let out = tmp.path().join("out");
    ok(&zimage_in(
        &store,
        &["export", "--format", "comfy", "dev", s(&out)],
    ));
    let exported = ComfyFiles {
        transformer: out.join("diffusion_models/dev.safetensors"),
        clip: out.join("text_encoders/dev.safetensors"),
        t5: out.join("text_encoders/dev_2.safetensors"),
        vae: out.join("vae/dev.safetensors"),
    };
    let said = ok(&create_owned(
        &store,
        &composed_args("from-export", &exported, "dev"),
    ));
    assert!(said.contains(" 0 blobs written"), "{said}");
    let show = ok(&zimage_in(&store, &["show", "from-export"]));
    assert!(show.contains("([dev] model)"), "{show}");
}

/// What a composition of FLUX.1's files lacks or misplaces is refused on one line naming it:
/// an encoder in the other's place (saying which encoder the file is), a missing second
/// encoder or tokenizer, and a CLIP whose head count no shape tells and no config gives.
#[test]
fn misplaced_and_missing_files_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let files = comfy_files("dev", &tmp.path().join("dev"), Files::WithConfig);
    let args = composed_args("x", &files, "dev");
    let with = |flag: &str, value: &Path| -> Vec<String> {
        let mut a = args.clone();
        let at = a.iter().position(|x| x == flag).unwrap();
        a[at + 1] = s(value).to_string();
        a
    };
    let err = refused(&create_owned(&store, &with("--text-encoder", &files.t5)));
    assert!(err.contains(s(&files.t5)), "{err}");
    assert!(err.contains("is T5's encoder"), "{err}");
    assert!(err.contains("given as --text-encoder-2"), "{err}");
    let err = refused(&create_owned(
        &store,
        &with("--text-encoder-2", &files.clip),
    ));
    assert!(err.contains(s(&files.clip)), "{err}");
    assert!(err.contains("is CLIP's text model"), "{err}");
    assert!(err.contains("given as --text-encoder"), "{err}");

    let without = |flag: &str| -> Vec<String> {
        let mut a = args.clone();
        let at = a.iter().position(|x| x == flag).unwrap();
        a.drain(at..at + 2);
        a
    };
    let err = refused(&create_owned(&store, &without("--text-encoder-2")));
    assert!(err.contains("text_encoder_2 missing"), "{err}");
    assert!(err.contains("--text-encoder-2"), "{err}");
    let err = refused(&create_owned(&store, &without("--tokenizer-2")));
    assert!(
        err.contains("`tokenizer_2` (T5TokenizerFast) must be given: --tokenizer-2"),
        "{err}"
    );
    let err = refused(&create_owned(&store, &without("--tokenizer")));
    assert!(
        err.contains("`tokenizer` (CLIPTokenizer) must be given: --tokenizer"),
        "{err}"
    );

    // Published files carry no config: the tiny CLIP's 48-wide rows say nothing of its heads.
    let plain = comfy_files("dev", &tmp.path().join("plain"), Files::Plain);
    let err = refused(&create_owned(&store, &with("--text-encoder", &plain.clip)));
    assert!(err.contains(s(&plain.clip)), "{err}");
    assert!(
        err.contains("gives a width of 48, not CLIP-L's 768"),
        "{err}"
    );
    // Nor do the tiny transformer's heads of 24 say their RoPE axes.
    let err = refused(&create_owned(
        &store,
        &with("--transformer", &plain.transformer),
    ));
    assert!(err.contains("gives a head size of 24"), "{err}");
}

/// ComfyUI's fp8 files (the transformer and `t5xxl_fp8_e4m3fn`, their matrices `F8_E4M3`)
/// compose a model that stores exactly the blobs of the same values in bf16, and runs.
#[test]
fn fp8_files_compose_and_run() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let wide = comfy_files("dev", &tmp.path().join("wide"), Files::Fp8Widened);
    ok(&create_owned(&store, &composed_args("wide", &wide, "dev")));
    let fp8 = comfy_files("dev", &tmp.path().join("fp8"), Files::Fp8);
    let header = safetensors::parse(&std::fs::read(&fp8.t5).unwrap()).unwrap();
    assert!(header.tensors.iter().any(|t| t.dtype == Dtype::F8_E4M3));
    let said = ok(&create_owned(&store, &composed_args("fp8", &fp8, "dev")));
    assert!(said.contains(" 0 blobs written"), "{said}");
    let picture = pixels(&store, "fp8", tmp.path());
    assert_eq!(picture.len(), 64 * 64 * 3);
    assert_eq!(picture, pixels(&store, "wide", tmp.path()));
}

/// Uniform values in ±1 from a fixed hash.
fn uniform(seed: u64) -> impl FnMut() -> f32 {
    let mut state = seed;
    move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// llama.cpp's name of a T5 encoder tensor (`gguf` 0.19's `MODEL_ARCH.T5ENCODER` table:
/// `ffn_gate` is `wi_0`, `ffn_up` `wi_1`, `ffn_down` `wo`).
fn llama_cpp_name(name: &str) -> String {
    match name {
        "shared.weight" => return "token_embd.weight".into(),
        "encoder.final_layer_norm.weight" => return "enc.output_norm.weight".into(),
        _ => {}
    }
    let rest = name.strip_prefix("encoder.block.").unwrap();
    let (block, module) = rest.split_once(".layer.").unwrap();
    let ours = match module {
        "0.layer_norm.weight" => "attn_norm",
        "0.SelfAttention.q.weight" => "attn_q",
        "0.SelfAttention.k.weight" => "attn_k",
        "0.SelfAttention.v.weight" => "attn_v",
        "0.SelfAttention.o.weight" => "attn_o",
        "0.SelfAttention.relative_attention_bias.weight" => "attn_rel_b",
        "1.layer_norm.weight" => "ffn_norm",
        "1.DenseReluDense.wi_0.weight" => "ffn_gate",
        "1.DenseReluDense.wi_1.weight" => "ffn_up",
        "1.DenseReluDense.wo.weight" => "ffn_down",
        other => panic!("{other}"),
    };
    format!("enc.blk.{block}.{ours}.weight")
}

/// T5's encoder as a published llama.cpp GGUF (`t5-v1_1-xxl-encoder-Q8_0.gguf`, in llama.cpp's
/// names, its matrices Q8_0, the relative attention table F16 as llama.cpp leaves it, norms
/// F32) imports as `--text-encoder-2` over the model's directory, quantized, and draws pixel for
/// pixel what the same values in f32 draw; the same values as an F32 GGUF store exactly the
/// directory's blobs.
///
/// The tiny T5's rows (40 wide) fill no 32-value block, so the model here has a T5 of width 64
/// (4 heads of 16, a 128-wide feed-forward, random values) and its transformer reads 64-wide
/// text rows.
#[test]
fn a_llama_cpp_t5_gguf_is_the_second_text_encoder() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let model = tmp.path().join("t5-64");
    common::copy_model(&tiny("dev"), &model);
    let (d, heads, d_kv, d_ff, layers, buckets, vocab) = (64u64, 4u64, 16u64, 128u64, 2, 20, 320);

    let mut shapes: Vec<(String, Vec<u64>)> = vec![
        ("shared.weight".into(), vec![vocab, d]),
        ("encoder.final_layer_norm.weight".into(), vec![d]),
        (
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight".into(),
            vec![buckets, heads],
        ),
    ];
    for b in 0..layers {
        let at = |n: &str| format!("encoder.block.{b}.layer.{n}.weight");
        for p in ["q", "k", "v"] {
            shapes.push((at(&format!("0.SelfAttention.{p}")), vec![heads * d_kv, d]));
        }
        shapes.push((at("0.SelfAttention.o"), vec![d, heads * d_kv]));
        shapes.push((at("0.layer_norm"), vec![d]));
        shapes.push((at("1.layer_norm"), vec![d]));
        shapes.push((at("1.DenseReluDense.wi_0"), vec![d_ff, d]));
        shapes.push((at("1.DenseReluDense.wi_1"), vec![d_ff, d]));
        shapes.push((at("1.DenseReluDense.wo"), vec![d, d_ff]));
    }
    // Each tensor in llama.cpp's file and the f32 values that file holds.
    let mut random = uniform(0x51ed_270b_27d4_eb2d);
    let (mut q8, mut f32s) = (Vec::new(), Vec::new());
    for (name, shape) in &shapes {
        let n = shape.iter().product::<u64>() as usize;
        let values: Vec<f32> = match (shape.as_slice(), name.contains("relative")) {
            ([_], _) => (0..n).map(|_| 1.0 + 0.1 * random()).collect(),
            (_, true) => (0..n).map(|_| 0.5 * random()).collect(),
            ([_, fan_in], false) => {
                let a = (3.0 / *fan_in as f32).sqrt();
                (0..n).map(|_| a * random()).collect()
            }
            _ => unreachable!(),
        };
        let f32_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (ty, data, held) = match (shape.len(), name.contains("relative")) {
            (1, _) => (GgmlType::F32, f32_bytes(&values), values),
            (_, true) => {
                let h: Vec<half::f16> = values.iter().map(|&v| half::f16::from_f32(v)).collect();
                let held = h.iter().map(|v| v.to_f32()).collect();
                (
                    GgmlType::F16,
                    h.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    held,
                )
            }
            _ => {
                let blocks = zimage::ggml::quantize_q8_0(&values);
                let held = zimage::ggml::dequantize(GgmlType::Q8_0, &blocks).unwrap();
                (GgmlType::Q8_0, blocks, held)
            }
        };
        let gguf_name = llama_cpp_name(name);
        q8.push((gguf_name.clone(), ty, shape.clone(), data));
        f32s.push((name.clone(), gguf_name, shape.clone(), f32_bytes(&held)));
    }

    // The directory holds the same values in f32, in transformers' names; its transformer reads
    // 64-wide rows.
    let t5_file = component_file(&model, "text_encoder_2");
    std::fs::remove_file(&t5_file).unwrap();
    let dir_t5: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = (f32s.iter())
        .map(|(n, _, shape, b)| (n.as_str(), Dtype::F32, shape.clone(), b.clone()))
        .collect();
    write_safetensors(&t5_file, &dir_t5);
    let edit = |path: &Path, keys: &[(&str, serde_json::Value)]| {
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for (k, v) in keys {
            config[*k] = v.clone();
        }
        std::fs::write(path, config.to_string()).unwrap();
    };
    use serde_json::json;
    edit(
        &model.join("text_encoder_2/config.json"),
        &[
            ("d_model", json!(d)),
            ("d_kv", json!(d_kv)),
            ("d_ff", json!(d_ff)),
            ("num_heads", json!(heads)),
            ("num_layers", json!(layers)),
            ("num_decoder_layers", json!(layers)),
        ],
    );
    edit(
        &model.join("transformer/config.json"),
        &[("joint_attention_dim", json!(d))],
    );
    let transformer_file = component_file(&model, "transformer");
    let mut transformer = read_tensors(&transformer_file);
    let context = transformer
        .iter_mut()
        .find(|t| t.0 == "context_embedder.weight")
        .unwrap();
    let rows = context.2[0];
    let mut random = uniform(7);
    let a = (3.0 / d as f32).sqrt();
    context.2 = vec![rows, d];
    context.3 = (0..rows * d)
        .flat_map(|_| half::bf16::from_f32(a * random()).to_le_bytes())
        .collect();
    std::fs::remove_file(&transformer_file).unwrap();
    write(&transformer_file, "", &transformer, None);

    let metadata = [(
        "general.architecture".to_string(),
        gguf::Value::String("t5encoder".into()),
    )];
    let q8_path = tmp.path().join("t5-v1_1-xxl-encoder-Q8_0.gguf");
    common::ggml::write_with(&metadata, &q8_path, &q8);
    let f32_gguf: Vec<common::ggml::Written> = (f32s.iter())
        .map(|(_, n, shape, b)| (n.clone(), GgmlType::F32, shape.clone(), b.clone()))
        .collect();
    let f32_path = tmp.path().join("t5-f32.gguf");
    common::ggml::write_with(&metadata, &f32_path, &f32_gguf);

    create(&store, &["f32", "--from", s(&model)]);
    let over = |name: &str, t5: &Path| {
        create(
            &store,
            &[name, "--from", s(&model), "--text-encoder-2", s(t5)],
        )
    };
    let said = over("gguf-f32", &f32_path);
    assert!(
        said.contains("text_encoder_2: ") && said.contains("original layout"),
        "{said}"
    );
    assert!(said.contains(" 0 blobs written"), "{said}");
    let said = over("q8", &q8_path);
    assert!(said.contains("Q8_0"), "{said}");
    let shown = ok(&zimage_in(&store, &["show", "q8"]));
    assert!(shown.contains("quantized   MLX"), "{shown}");
    same_picture(
        &pixels(&store, "q8", tmp.path()),
        &pixels(&store, "f32", tmp.path()),
        "the Q8_0 T5",
    );
}
