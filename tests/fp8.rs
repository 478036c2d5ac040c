//! 8-bit float checkpoints as ComfyUI publishes them (`F8_E4M3`, `F8_E5M2`): an import widens
//! them to bf16 without loss, so a model whose transformer is fp8 stores exactly the blobs of
//! the same values in bf16 and draws the same picture; a scaled-fp8 file, whose scales the
//! import would not apply, is refused naming the file and the tensor, storing nothing.

mod common;

use common::{s, write_safetensors, zimage_in};
use std::path::{Path, PathBuf};
use zimage::mlx::{io, Dtype as MlxDtype};
use zimage::safetensors::Dtype;

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/flux1-dev-tiny")
}

/// The fp8 code nearest `v` (the first on a tie), `decode` the format's widening.
fn encode(v: f32, decode: fn(u8) -> f32) -> u8 {
    (0..=255u8)
        .filter(|&b| decode(b).is_finite())
        .min_by(|&a, &b| (decode(a) - v).abs().total_cmp(&(decode(b) - v).abs()))
        .expect("finite codes")
}

/// The tiny transformer written twice: its matrices as fp8 (E4M3, and E5M2 for the
/// single-stream blocks), and the same fp8 values widened to bf16; the rest bf16 in both.
fn write_transformers(fp8_dir: &Path, bf16_dir: &Path, extra: &[(&str, Dtype, Vec<u64>, Vec<u8>)]) {
    let file = "transformer/diffusion_pytorch_model.safetensors";
    let st = io::load_safetensors(&tiny().join(file)).unwrap();
    let mut names: Vec<&String> = st.tensors.keys().collect();
    names.sort();
    let (mut narrow, mut wide) = (Vec::new(), Vec::new());
    for name in names {
        let a = &st.tensors[name];
        let shape: Vec<u64> = a.shape().iter().map(|&d| d as u64).collect();
        let values = a.astype(MlxDtype::F32).unwrap().to_vec::<f32>().unwrap();
        let bf16 = |v: &[f32]| -> Vec<u8> {
            v.iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect()
        };
        if shape.len() == 2 {
            let (dtype, decode): (Dtype, fn(u8) -> f32) = match name.starts_with("single_") {
                true => (Dtype::F8_E5M2, zimage::fp8::e5m2_to_f32),
                false => (Dtype::F8_E4M3, zimage::fp8::e4m3_to_f32),
            };
            let codes: Vec<u8> = values.iter().map(|&v| encode(v, decode)).collect();
            let widened: Vec<f32> = codes.iter().map(|&b| decode(b)).collect();
            narrow.push((name.as_str(), dtype, shape.clone(), codes));
            wide.push((name.as_str(), Dtype::BF16, shape, bf16(&widened)));
        } else {
            narrow.push((name.as_str(), Dtype::BF16, shape.clone(), bf16(&values)));
            wide.push((name.as_str(), Dtype::BF16, shape, bf16(&values)));
        }
    }
    narrow.extend(extra.iter().cloned());
    for (dir, tensors) in [(fp8_dir, narrow), (bf16_dir, wide)] {
        common::copy_model(&tiny(), dir);
        // The copy links the weights: the link goes, not the model's file.
        std::fs::remove_file(dir.join(file)).unwrap();
        write_safetensors(&dir.join(file), &tensors);
    }
}

#[test]
fn an_fp8_transformer_imports_as_the_bf16_of_its_values_and_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (fp8, bf16, store) = (
        tmp.path().join("fp8"),
        tmp.path().join("bf16"),
        tmp.path().join("store"),
    );
    write_transformers(&fp8, &bf16, &[]);
    let wide = zimage_in(&store, &["create", "wide", "--from", s(&bf16)]);
    assert!(wide.status.success(), "{wide:?}");
    let narrow = zimage_in(&store, &["create", "narrow", "--from", s(&fp8)]);
    assert!(narrow.status.success(), "{narrow:?}");
    let said = String::from_utf8_lossy(&narrow.stdout);
    assert!(said.contains(" 0 blobs written"), "{said}");

    let shown = zimage_in(&store, &["show", "narrow"]);
    let shown = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(!shown.contains("F8_"), "{shown}");

    let mut pngs = Vec::new();
    for model in ["narrow", "wide"] {
        let out = tmp.path().join(format!("{model}.png"));
        let args = [
            "generate",
            "a red fox",
            "--model",
            model,
            "--width",
            "48",
            "--height",
            "40",
            "--steps",
            "2",
            "-o",
            s(&out),
        ];
        let run = zimage_in(&store, &args);
        assert!(run.status.success(), "{run:?}");
        // The pixels: the metadata names the model.
        pngs.push(image::open(&out).unwrap().to_rgb8().into_raw());
    }
    assert!(pngs[0] == pngs[1], "the fp8 import draws another picture");
}

#[test]
fn a_scaled_fp8_file_is_refused_naming_the_scale() {
    let tmp = tempfile::tempdir().unwrap();
    let (fp8, bf16, store) = (
        tmp.path().join("fp8"),
        tmp.path().join("bf16"),
        tmp.path().join("store"),
    );
    let scale = (
        "transformer_blocks.0.attn.to_q.scale_weight",
        Dtype::F32,
        vec![],
        1.5f32.to_le_bytes().to_vec(),
    );
    write_transformers(&fp8, &bf16, &[scale]);
    let out = zimage_in(&store, &["create", "scaled", "--from", s(&fp8)]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("diffusion_pytorch_model.safetensors")
            && err.contains("transformer_blocks.0.attn.to_q.scale_weight")
            && err.contains("scaled-fp8"),
        "{err}"
    );
    let listed = zimage_in(&store, &["list"]);
    assert!(!String::from_utf8_lossy(&listed.stdout).contains("scaled"));
}
