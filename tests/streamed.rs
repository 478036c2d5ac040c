//! Streamed weights and bf16 products: a stored model's transformer mapped from the store and
//! let go of block by block draws the stored run's image (bit for bit where the products run in
//! the shim's AVX-512 panels, else up to the BLAS's rounding of its separate q|k|v products);
//! quantized blobs map
//! without a copy and read back the same after their pages are let go of; `--products bf16`
//! draws an image close to the f32 one.

mod common;

use common::zimage_in;
use std::path::Path;
use zimage::loader::{self, ReadPath};
use zimage::store::Store;

fn demo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny")
}

fn ok(root: &Path, args: &[&str]) -> String {
    let out = zimage_in(root, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A store under `dir` holding the demo model imported as `q` with `--quantize quantize`.
fn quantized_demo(dir: &Path, quantize: &str) -> std::path::PathBuf {
    let root = dir.join("store");
    ok(
        &root,
        &[
            "create",
            "q",
            "--from",
            common::s(&demo()),
            "--quantize",
            quantize,
        ],
    );
    root
}

/// `generate` of the demo prompt at 64², 3 steps; returns the pixels and what `-v` printed.
fn generate(root: &Path, model: &str, png: &Path, extra: &[&str]) -> (Vec<u8>, String) {
    let mut args = vec![
        "generate",
        "a red fox in the snow",
        "--model",
        model,
        "--width",
        "64",
        "--height",
        "64",
        "--steps",
        "3",
        "--seed",
        "3",
        "-v",
        "-o",
        png.to_str().unwrap(),
    ];
    args.extend(extra);
    let log = ok(root, &args);
    (image::open(png).unwrap().to_rgb8().into_raw(), log)
}

#[test]
fn a_streamed_transformer_draws_the_stored_image_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let root = quantized_demo(tmp.path(), "int4");
    let (stored, log) = generate(
        &root,
        "q",
        &tmp.path().join("a.png"),
        &["--weights", "stored"],
    );
    assert!(log.contains("weights as stored"), "{log}");
    let (streamed, log) = generate(
        &root,
        "q",
        &tmp.path().join("b.png"),
        &["--weights", "streamed"],
    );
    assert!(log.contains("weights streamed from the store"), "{log}");
    // Streamed weights are not joined (that would copy them), so q|k|v and w1|w3 run as
    // separate products: in the shim's panels each output is the same sum either way, while the
    // BLAS may take another kernel for another width, rounding a few values otherwise.
    let off: Vec<u8> = (stored.iter().zip(&streamed))
        .map(|(a, b)| a.abs_diff(*b))
        .collect();
    let identical = off.iter().filter(|&&d| d == 0).count() as f64 / off.len() as f64;
    let worst = off.iter().copied().max().unwrap_or(0);
    eprintln!(
        "streamed: {:.3}% identical, max off {worst}",
        100.0 * identical
    );
    assert!(
        identical >= 0.999 && worst <= 1,
        "the streamed run drew another image"
    );
    if zimage::mlx::bf16_products_available() {
        assert!(
            stored == streamed,
            "panel products differ between joined and separate weights"
        );
    }
}

#[test]
fn quantized_blobs_map_without_a_copy_and_read_the_same_after_a_release() {
    let tmp = tempfile::tempdir().unwrap();
    let root = quantized_demo(tmp.path(), "int8");
    let store = Store::at(&root);
    let model = store.open("q").unwrap();
    let copied =
        loader::load_component(&store, &model, "transformer", ReadPath::MlxLoader).unwrap();
    let mapped = loader::load_component(&store, &model, "transformer", ReadPath::Mmap).unwrap();
    // On the CPU every blob maps, the quantized ones (three tensors each) included.
    assert_eq!(mapped.mapped, mapped.blobs);
    assert!(!mapped.quantized.is_empty());
    let (a, b) = (copied.into_weights(), mapped.into_weights());
    let release = b.release.clone().expect("mapped weights can be let go of");
    for round in 0..2 {
        for (name, q) in &a.quantized {
            let m = &b.quantized[name];
            for (x, y) in q.arrays().iter().zip(m.arrays()) {
                assert_eq!(x.to_bytes().unwrap(), y.to_bytes().unwrap(), "{name}");
            }
        }
        for (name, t) in &a.tensors {
            assert_eq!(
                t.to_bytes().unwrap(),
                b.tensors[name].to_bytes().unwrap(),
                "{name}"
            );
        }
        // Let go of every page: the next read maps them again from the files.
        if round == 0 {
            release.release();
        }
    }
}

#[test]
fn bf16_products_draw_close_to_the_f32_image() {
    let tmp = tempfile::tempdir().unwrap();
    let root = quantized_demo(tmp.path(), "int8");
    let (f32_image, _) = generate(&root, "q", &tmp.path().join("a.png"), &[]);
    let (bf16_image, log) = generate(
        &root,
        "q",
        &tmp.path().join("b.png"),
        &["--products", "bf16"],
    );
    if !zimage::mlx::bf16_products_available() {
        assert!(log.contains("no AVX512-BF16"), "{log}");
        assert!(f32_image == bf16_image);
        return;
    }
    let mse = (f32_image.iter().zip(&bf16_image))
        .map(|(a, b)| f64::from(a.abs_diff(*b)).powi(2))
        .sum::<f64>()
        / f32_image.len() as f64;
    let psnr = 10.0 * (255f64.powi(2) / mse.max(1e-12)).log10();
    eprintln!("bf16 products: {psnr:.1} dB against f32 products");
    assert!(psnr >= 30.0, "{psnr:.1} dB");
    assert!(f32_image != bf16_image, "the products did not change");
}
