//! A FLUX.3 [klein] transformer in Black Forest Labs' single-file names, imported over the tiny
//! model's directory: every tensor is one the directory's model already holds, byte for byte
//! (the output layer's halves swapped back), and the model makes the same picture.

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

/// The tiny model's transformer as Black Forest Labs lays it out, under `prefix`, with a
/// training-only tensor the import leaves out.
fn write_original(path: &Path, prefix: &str) {
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
        out.push((
            format!("{prefix}{}", original_name(&t.name)),
            t.dtype,
            t.shape.clone(),
            data,
        ));
    }
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
