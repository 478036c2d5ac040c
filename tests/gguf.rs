//! GGUF files: imported with each ggml type mapped exactly onto MLX's quantization (group 32)
//! where it can be, checked against the `gguf` package's dequantizer
//! (`tests/fixtures/gguf/make_fixtures.py`); products through the packed weights; llama.cpp's
//! names; `inspect` and `hash --structural`; files made by stable-diffusion.cpp against
//! diffusers; and hostile files refused with exit 2 and nothing stored.

mod common;

use common::zimage_in;
use std::path::{Path, PathBuf};
use zimage::formats::gguf::{self, GgmlType, Value, WriteTensor};
use zimage::loader::{self, ReadPath};
use zimage::mlx::{self, Array, Dtype};
use zimage::store::Store;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

fn reference() -> std::collections::HashMap<String, Vec<f32>> {
    let st = mlx::io::load_safetensors(&fixture("types.reference.safetensors")).unwrap();
    st.tensors
        .into_iter()
        .map(|(k, v)| (k, v.to_vec::<f32>().unwrap()))
        .collect()
}

fn import(root: &Path, name: &str, file: &Path, component: &str) -> String {
    let args = [
        "create",
        name,
        "--from",
        file.to_str().unwrap(),
        "--component",
        component,
    ];
    run_ok(root, &args)
}

#[test]
fn every_type_imports_as_the_reference_dequantizes_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let printed = import(&root, "types", &fixture("types.gguf"), "transformer");
    for line in [
        "Q4_0 → q4_0 (symmetric int4, group 32, exact)",
        "Q8_0 → q8_0 (symmetric int8, group 32, exact)",
        "Q5_1 → int5, group 32 (exact)",
        "Q5_K → int5, group 32 (exact)",
        "Q6_K → int8, group 32 (re-quantized)",
        "largest re-quantization error",
    ] {
        assert!(printed.contains(line), "`{line}` missing from:\n{printed}");
    }
    let store = Store::at(&root);
    let model = store.open("types").unwrap();
    let loaded =
        loader::load_component(&store, &model, "transformer", ReadPath::MlxLoader).unwrap();
    for (name, q) in &loaded.quantized {
        assert_eq!(q.group_size, 32, "{name}");
        // The symmetric types keep their f16 `d` and no bias: Q4_0 at 4.5 bits a weight.
        let symmetric = ["q4_0.weight", "q5_0.weight", "q8_0.weight"].contains(&name.as_str());
        if symmetric {
            assert_eq!(q.mode, mlx::QuantMode::Symmetric, "{name}");
            assert_eq!(q.scales.dtype(), Dtype::F16, "{name}");
            assert!(q.biases.is_none(), "{name}");
        } else {
            assert_eq!(q.mode, mlx::QuantMode::Affine, "{name}");
            assert_eq!(q.scales.dtype(), Dtype::F32, "{name}");
        }
    }
    let bits = |n: &str| loaded.quantized[n].bits;
    assert_eq!(
        (
            bits("q4_0.weight"),
            bits("q5_1.weight"),
            bits("q8_0.weight")
        ),
        (4, 5, 8)
    );
    assert_eq!(
        (
            bits("q4_k.weight"),
            bits("q6_k.weight"),
            bits("q3_k.weight")
        ),
        (4, 8, 4)
    );
    let want = reference();
    let got = loaded.into_arrays().unwrap();
    assert_eq!(got.len(), want.len());
    for (name, want) in &want {
        let values = got[name]
            .astype(Dtype::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let requantized = ["q2_k.weight", "q3_k.weight", "q6_k.weight"].contains(&name.as_str());
        if requantized {
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = values
                .iter()
                .zip(want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= scale * 0.1,
                "{name}: error {err} against values up to {scale}"
            );
        } else {
            let same = values
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name} differs from the reference dequantization");
        }
    }
}

#[test]
fn products_through_group_32_weights_match_the_widened_weight() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    import(&root, "types", &fixture("types.gguf"), "transformer");
    let store = Store::at(&root);
    let model = store.open("types").unwrap();
    let loaded =
        loader::load_component(&store, &model, "transformer", ReadPath::MlxLoader).unwrap();
    let key = mlx::random::key(7).unwrap();
    let x = mlx::random::normal(&[3, 256], Dtype::F32, &key).unwrap();
    for (name, q) in &loaded.quantized {
        let packed = mlx::fast::linear(&x, &q.weight, Some(q.packing()), None).unwrap();
        let dense =
            mlx::ops::matmul(&x, &q.dequantize().unwrap().transpose(&[1, 0]).unwrap()).unwrap();
        let (a, b) = (
            packed.to_vec::<f32>().unwrap(),
            dense.to_vec::<f32>().unwrap(),
        );
        let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
        let err = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (p, d)| m.max((p - d).abs()));
        assert!(
            err <= scale * 1e-5,
            "{name}: packed product off by {err} (values up to {scale})"
        );
    }
    let _ = Array::from_slice(&[0f32], &[1]).unwrap();
}

#[test]
fn llama_cpp_names_become_the_text_encoders() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("qwen3.gguf");
    let norm: Vec<u8> = [1.0f32; 32].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut q8 = Vec::new();
    for _ in 0..2 {
        q8.extend(half::f16::from_f32(0.01).to_le_bytes());
        q8.extend((0..32u8).map(|i| i.wrapping_mul(7)));
    }
    let tensors = [
        WriteTensor {
            name: "token_embd.weight".into(),
            ggml_type: GgmlType::F32,
            shape: vec![32],
            data: &norm,
        },
        WriteTensor {
            name: "blk.0.attn_q.weight".into(),
            ggml_type: GgmlType::Q8_0,
            shape: vec![2, 32],
            data: &q8,
        },
        WriteTensor {
            name: "blk.0.attn_k_norm.weight".into(),
            ggml_type: GgmlType::F32,
            shape: vec![32],
            data: &norm,
        },
        WriteTensor {
            name: "output_norm.weight".into(),
            ggml_type: GgmlType::F32,
            shape: vec![32],
            data: &norm,
        },
    ];
    let meta = [(
        "general.architecture".to_string(),
        Value::String("qwen3".into()),
    )];
    let mut bytes = Vec::new();
    gguf::write(&mut bytes, &meta, &tensors).unwrap();
    std::fs::write(&file, bytes).unwrap();
    let root = dir.path().join("store");
    import(&root, "te", &file, "text_encoder");
    let model = Store::at(&root).open("te").unwrap();
    let mut names: Vec<String> = model
        .manifest
        .tensor_layers()
        .filter_map(|l| l.name.clone())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "text_encoder/model.embed_tokens.weight",
            "text_encoder/model.layers.0.self_attn.k_norm.weight",
            "text_encoder/model.layers.0.self_attn.q_proj.weight",
            "text_encoder/model.norm.weight",
        ]
    );
}

#[test]
fn inspect_and_structural_hash_read_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let f = fixture("types.gguf");
    let out = zimage_in(&root, &["inspect", f.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["format"], "GGUF v3");
    assert_eq!(v["tensors"].as_array().unwrap().len(), 14);
    let q4 = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "q4_0.weight")
        .unwrap();
    assert_eq!(q4["dtype"], "q4_0");
    assert_eq!(q4["shape"], serde_json::json!([8, 256]));
    assert_eq!(q4["byte_length"], 1152);
    let out = zimage_in(&root, &["hash", "--structural", f.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = zimage_in(&root, &["hash", "--structural", f.to_str().unwrap()]);
    assert_eq!(out.stdout, again.stdout);
}

/// A GGUF file byte by byte: `kvs` as (key, type id, value bytes), tensors as (name, dims in
/// file order, type id, offset), then `data` bytes after 32-byte alignment.
fn raw(
    kvs: &[(&str, u32, Vec<u8>)],
    tensors: &[(&str, Vec<u64>, u32, u64)],
    data: usize,
) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    let s = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    for (k, ty, v) in kvs {
        s(&mut b, k);
        b.extend(ty.to_le_bytes());
        b.extend(v);
    }
    for (name, dims, ty, offset) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
    }
    b.resize(b.len().div_ceil(32) * 32 + data, 0);
    b
}

#[test]
fn hostile_files_exit_2_with_one_line_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let whole = std::fs::read(fixture("types.gguf")).unwrap();
    let mut many_keys = b"GGUF".to_vec();
    many_keys.extend(3u32.to_le_bytes());
    many_keys.extend(0u64.to_le_bytes());
    many_keys.extend(1_000_000u64.to_le_bytes());
    for i in 0..1_000_000u32 {
        let key = format!("k{i}");
        many_keys.extend((key.len() as u64).to_le_bytes());
        many_keys.extend(key.as_bytes());
        many_keys.extend(4u32.to_le_bytes());
        many_keys.extend(i.to_le_bytes());
    }
    let q4 = |offset| ("w", vec![32, 2], 2, offset);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated",
            whole[..whole.len() / 2].to_vec(),
            "past the end",
        ),
        ("header-cut", whole[..100].to_vec(), "truncated"),
        ("past-end", raw(&[], &[q4(64)], 36), "past the end"),
        (
            "overlap",
            raw(&[], &[q4(0), ("v", vec![32, 2], 2, 32)], 96),
            "overlap",
        ),
        (
            "huge-dims",
            raw(&[], &[("w", vec![1 << 32, 1 << 32, 1 << 32], 0, 0)], 0),
            "2^63",
        ),
        (
            "unknown-type",
            raw(&[], &[("w", vec![32], 77, 0)], 32),
            "unknown ggml type id 77",
        ),
        (
            "misaligned",
            raw(&[], &[q4(8)], 64),
            "not a multiple of the alignment",
        ),
        (
            "bad-alignment",
            raw(
                &[("general.alignment", 4, 3u32.to_le_bytes().to_vec())],
                &[q4(0)],
                36,
            ),
            "general.alignment",
        ),
        ("many-keys", many_keys, "metadata_kv_count"),
        (
            "iq4_nl",
            raw(&[], &[("w", vec![32, 2], 20, 0)], 36),
            "IQ4_NL",
        ),
    ];
    for (name, bytes, expect) in cases {
        let file = dir.path().join(format!("{name}.gguf"));
        std::fs::write(&file, &bytes).unwrap();
        let root = dir.path().join(format!("store-{name}"));
        let out = zimage_in(
            &root,
            &[
                "create",
                name,
                "--from",
                file.to_str().unwrap(),
                "--component",
                "transformer",
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(expect) && err.contains(&format!("{name}.gguf")),
            "{name}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
        let manifests = root.join("manifests");
        assert!(
            !manifests.exists() || walk_files(&manifests) == 0,
            "{name}: a manifest was written"
        );
        if name != "iq4_nl" {
            let out = zimage_in(&root, &["inspect", file.to_str().unwrap()]);
            assert_eq!(out.status.code(), Some(2), "{name}: inspect");
        }
    }
}

fn walk_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk_files(&p)
            } else {
                1
            }
        })
        .sum()
}

/// The pixels of a PNG, as RGB.
fn rgb(path: &Path) -> Vec<u8> {
    image::open(path).unwrap().to_rgb8().into_raw()
}

/// `generate` of the lighthouse settings the references were made with, as RGB.
fn generate_reference_settings(root: &Path, model: &str, png: &Path) -> Vec<u8> {
    let st = mlx::io::load_safetensors(&fixture("heldout.reference.safetensors")).unwrap();
    let settings: serde_json::Value = serde_json::from_str(&st.metadata["settings"]).unwrap();
    let setting = |k: &str| settings[k].to_string().trim_matches('"').to_string();
    let args = [
        "generate",
        &setting("prompt"),
        "--model",
        model,
        "--width",
        &setting("width"),
        "--height",
        &setting("height"),
        "--steps",
        &setting("steps"),
        "--seed",
        &setting("seed"),
        "-o",
        common::s(png),
    ];
    let out = zimage_in(root, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rgb(png)
}

/// The share of identical values, the largest difference and the PSNR in dB.
fn compare(got: &[u8], want: &[u8]) -> (f64, u8, f64) {
    assert_eq!(got.len(), want.len());
    let off: Vec<u8> = (got.iter().zip(want))
        .map(|(a, b)| a.abs_diff(*b))
        .collect();
    let same = off.iter().filter(|d| **d == 0).count() as f64 / off.len() as f64;
    let mse = off.iter().map(|&d| f64::from(d).powi(2)).sum::<f64>() / off.len() as f64;
    let psnr = if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255f64.powi(2) / mse).log10()
    };
    (same, off.iter().max().copied().unwrap_or(0), psnr)
}

/// GGUF files made by stable-diffusion.cpp's `sd-cli -M convert` from zimage's ComfyUI export
/// (`tests/fixtures/gguf/sdcpp/`), imported as one component of a model: each gives diffusers'
/// image on the file's weights dequantized by the `gguf` package.
#[test]
fn ggufs_made_by_sd_cpp_give_diffusers_image_on_their_dequantized_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let heldout = common::heldout_dir(tmp.path());
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let st = mlx::io::load_safetensors(&fixture("heldout.reference.safetensors")).unwrap();
    // (file, base model, flag, what the import prints, exact mapping)
    let cases = [
        (
            "heldout-transformer-q8_0",
            &heldout,
            "--transformer",
            "Q8_0 → q8_0 (symmetric int8",
            true,
        ),
        (
            "heldout-transformer-q4_0",
            &heldout,
            "--transformer",
            "Q4_0 → q4_0 (symmetric int4",
            true,
        ),
        (
            "text-encoder-q8_0",
            &heldout,
            "--text-encoder",
            "Q8_0 → q8_0 (symmetric int8",
            true,
        ),
        (
            "demo-transformer-q4_k",
            &demo,
            "--transformer",
            "Q4_K → int4, group 32 (exact)",
            false,
        ),
    ];
    for (stem, base, flag, printed_path, exact) in cases {
        let file = fixture(&format!("sdcpp/{stem}.gguf"));
        let name = stem.replace('_', "");
        let args = [
            "create",
            &name,
            "--from",
            common::s(base),
            flag,
            common::s(&file),
        ];
        let out = zimage_in(&root, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(printed.contains(printed_path), "{stem}: {printed}");

        let got =
            generate_reference_settings(&root, &name, &tmp.path().join(format!("{stem}.png")));
        let want = st.tensors[stem].to_vec::<u8>().unwrap();
        let (same, worst, psnr) = compare(&got, &want);
        eprintln!(
            "{stem}: {:.4}% identical, max off {worst}, {psnr:.1} dB",
            same * 100.0
        );
        if exact {
            assert!(
                same >= 0.999 && worst <= 1,
                "{stem}: {:.4}% identical, max off {worst}",
                same * 100.0
            );
        } else {
            assert!(psnr >= 40.0, "{stem}: {psnr:.1} dB");
        }
    }
}

/// The tensors of a GGUF file by name: type, shape and bytes.
fn gguf_tensors(path: &Path) -> std::collections::BTreeMap<String, (GgmlType, Vec<u64>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let g = gguf::read(bytes.as_slice(), bytes.len() as u64).unwrap();
    g.tensors
        .iter()
        .map(|t| {
            let data = bytes[t.offset as usize..(t.offset + t.nbytes) as usize].to_vec();
            (t.name.clone(), (t.ggml_type, t.shape.clone(), data))
        })
        .collect()
}

fn run_ok(root: &Path, args: &[&str]) -> String {
    let out = zimage_in(root, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A GGUF import exported again gives the file's own blocks back, byte for byte, in a file
/// that imports to the same model and image (its config travels in the metadata).
#[test]
fn export_to_gguf_gives_back_the_imported_blocks_and_the_same_image() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let heldout = common::heldout_dir(tmp.path());
    let source = fixture("sdcpp/heldout-transformer-q4_0.gguf");
    run_ok(
        &root,
        &[
            "create",
            "q40",
            "--from",
            common::s(&heldout),
            "--transformer",
            common::s(&source),
        ],
    );
    let out = tmp.path().join("models");
    let printed = run_ok(
        &root,
        &["export", "q40", "--format", "gguf", common::s(&out)],
    );
    assert!(printed.contains("q4_0 → Q4_0 (exact)"), "{printed}");
    assert!(!printed.contains("largest change"), "{printed}");
    let exported = out.join("diffusion_models/q40.gguf");

    let (src, back) = (gguf_tensors(&source), gguf_tensors(&exported));
    assert_eq!(
        src.keys().collect::<Vec<_>>(),
        back.keys().collect::<Vec<_>>()
    );
    for (name, (ty, shape, data)) in &src {
        let (bty, bshape, bdata) = &back[name];
        let shape = match name.ends_with("pad_token") {
            true => [&[1][..], shape].concat(), // ggml wrote [dim]; diffusers' shape is [1, dim]
            false => shape.clone(),
        };
        assert_eq!(&shape, bshape, "{name}");
        if *ty == GgmlType::Q4_0 && shape.len() == 2 {
            assert_eq!(bty, ty, "{name}");
            assert!(data == bdata, "{name}: blocks differ");
        } else {
            // Quantized vectors were widened to f32 at import; bf16 stays bf16.
            let want = zimage::ggml::dequantize(*ty, data).unwrap();
            let got = zimage::ggml::dequantize(*bty, bdata).unwrap();
            assert_eq!(want, got, "{name}");
        }
    }
    let meta = gguf::read_file(&exported).unwrap();
    assert_eq!(
        meta.get("general.architecture"),
        Some(&Value::String("lumina2".into()))
    );

    run_ok(
        &root,
        &[
            "create",
            "again",
            "--from",
            common::s(&heldout),
            "--transformer",
            common::s(&exported),
        ],
    );
    let a = generate_reference_settings(&root, "q40", &tmp.path().join("a.png"));
    let b = generate_reference_settings(&root, "again", &tmp.path().join("b.png"));
    assert!(a == b, "the exported file draws another image");
}

/// zimage's own int4 becomes Q4_1 (its scales and biases in f16, per 32 values) and int8 is
/// re-quantized to Q8_0: each says so and how far the values moved, and the file imports to
/// an image close to the stored model's.
#[test]
fn export_to_gguf_writes_int4_as_q4_1_and_int8_as_q8_0() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    for (q, ty, line) in [
        (
            "int4",
            GgmlType::Q4_1,
            "int4 group 64 (BF16) → Q4_1 (f16 scales and biases)",
        ),
        (
            "int8",
            GgmlType::Q8_0,
            "int8 group 64 (BF16) → Q8_0 (re-quantized)",
        ),
    ] {
        run_ok(
            &root,
            &["create", q, "--from", common::s(&demo), "--quantize", q],
        );
        let out = tmp.path().join(q);
        let printed = run_ok(&root, &["export", q, "--format", "gguf", common::s(&out)]);
        assert!(printed.contains(line), "{printed}");
        assert!(
            printed.contains("largest change of a stored value"),
            "{printed}"
        );
        let file = out.join(format!("diffusion_models/{q}.gguf"));
        let types: Vec<GgmlType> = gguf_tensors(&file).values().map(|t| t.0).collect();
        assert!(types.contains(&ty), "{types:?}");

        let again = format!("{q}-again");
        let args = [
            "create",
            &again,
            "--from",
            common::s(&demo),
            "--transformer",
            common::s(&file),
        ];
        run_ok(&root, &args);
        let a = generate_reference_settings(&root, q, &tmp.path().join(format!("{q}.png")));
        let b =
            generate_reference_settings(&root, &again, &tmp.path().join(format!("{again}.png")));
        let (_, _, psnr) = compare(&a, &b);
        eprintln!("{q} → {ty}: {psnr:.1} dB against the stored model's image");
        assert!(psnr >= 30.0, "{q}: {psnr:.1} dB");
    }
}

/// A quantized embedding table stays packed: the rows a prompt asks for are gathered packed and
/// widened alone, to the values the whole table would widen to.
#[test]
fn a_quantized_table_widens_only_the_rows_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    import(&root, "types", &fixture("types.gguf"), "transformer");
    let store = Store::at(&root);
    let model = store.open("types").unwrap();
    let loaded =
        loader::load_component(&store, &model, "transformer", ReadPath::MlxLoader).unwrap();
    let ids = Array::from_slice(&[3i32, 0, 3, 1], &[4]).unwrap();
    for name in ["q4_0.weight", "q4_1.weight", "q8_0.weight"] {
        let q = loaded.quantized[name].clone();
        let whole = q.dequantize().unwrap().take(&ids, 0).unwrap();
        let rows = zimage::models::weights::Table::Quantized(q)
            .rows(&ids)
            .unwrap();
        assert_eq!(rows.shape(), whole.shape(), "{name}");
        assert_eq!(
            rows.to_vec::<f32>().unwrap(),
            whole.to_vec::<f32>().unwrap(),
            "{name}"
        );
    }
}
