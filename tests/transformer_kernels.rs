//! The transformer's CPU kernels (one-pass RMS norm with residual, qk-norm with RoPE into heads,
//! attention into rows, both at once from the fused projections, the SiLU gate) and joined linear
//! layers, each against the same maths composed from MLX's own ops, on the real MLX.

use std::collections::HashMap;
use zimage::mlx::{self, fast, ops, random, Array, Dtype, QuantMode, QuantizedTensor};
use zimage::models::weights::{Checkpoint, Linear};

fn normal(shape: &[i32], seed: u64) -> Array {
    random::normal(shape, Dtype::F32, &random::key(seed).unwrap()).unwrap()
}

fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    assert_eq!(a.shape(), b.shape(), "shapes differ");
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `x · rsqrt(mean(x²) + eps) · w` over the last axis, in MLX's ops.
fn composed_rms_norm(x: &Array, w: &Array, eps: f32) -> Array {
    let inv = (x.square().unwrap().mean(&[-1], true).unwrap() + eps)
        .unwrap()
        .rsqrt()
        .unwrap();
    ((x * &inv).unwrap() * w).unwrap()
}

/// Runs one test at a time: the attention kernels set OpenBLAS's process-wide thread count while
/// they run, so a product of another test running beside them may take another summation order,
/// and the bit-for-bit comparisons here would compare two orders.
fn setup() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    mlx::set_default_device(mlx::Device::Cpu).unwrap();
    guard
}

#[test]
fn rms_norm_with_residual_matches_the_composed_norm() {
    let _one = setup();
    let (x, w, r) = (normal(&[37, 96], 1), normal(&[96], 2), normal(&[37, 96], 3));
    let plain = fast::rms_norm_residual(&x, &w, 1e-6, None).unwrap();
    let want = composed_rms_norm(&x, &w, 1e-6);
    assert!(max_abs_diff(&plain, &want) <= 1e-5);
    // A weight given as [1, N] (a norm weight times a modulation row) is the same weight.
    let added = fast::rms_norm_residual(&x, &w.reshape(&[1, 96]).unwrap(), 1e-6, Some(&r)).unwrap();
    assert!(max_abs_diff(&added, &(&want + &r).unwrap()) <= 1e-5);
    // The plain entry point takes the same kernel.
    let fast_norm = fast::rms_norm(&x, Some(&w), 1e-6).unwrap();
    assert!(max_abs_diff(&fast_norm, &want) <= 1e-5);
}

#[test]
fn qkv_heads_norms_rotates_and_splits_the_heads() {
    let _one = setup();
    let (s, h, d) = (7, 2, 8);
    let qkv = normal(&[s, 3 * h * d], 4);
    let (wq, wk) = (normal(&[d], 5), normal(&[d], 6));
    let angles = normal(&[s, 1, d / 2], 7);
    let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
    let scale = 0.25;
    let got = fast::QkvHeads {
        q_weight: &wq,
        k_weight: &wk,
        cos: &cos,
        sin: &sin,
        heads: h,
        eps: 1e-5,
        q_scale: scale,
    }
    .split(&qkv)
    .unwrap();
    assert_eq!(got.shape(), vec![3, h, s, d]);

    let parts = ops::split(&qkv.reshape(&[s, 3, h, d]).unwrap(), 3, 1).unwrap();
    let heads = |t: &Array| t.reshape(&[s, h, d]).unwrap();
    // Interleaved pairs (x₀, x₁) → (x₀cos − x₁sin, x₀sin + x₁cos), then [S, H, D] → [H, S, D].
    let rotate = |t: Array, w: &Array, by: f32| {
        let pairs = composed_rms_norm(&heads(&t), w, 1e-5)
            .reshape(&[s, h, d / 2, 2])
            .unwrap();
        let x0 = pairs.slice_axis(3, 0, 1).unwrap().squeeze(3).unwrap();
        let x1 = pairs.slice_axis(3, 1, 2).unwrap().squeeze(3).unwrap();
        let y0 = ((&x0 * &cos).unwrap() - (&x1 * &sin).unwrap()).unwrap();
        let y1 = ((&x0 * &sin).unwrap() + (&x1 * &cos).unwrap()).unwrap();
        let y = ops::stack(&[&y0, &y1], 3)
            .unwrap()
            .reshape(&[s, h, d])
            .unwrap();
        (y * by).unwrap().transpose(&[1, 0, 2]).unwrap()
    };
    let want = [
        rotate(parts[0].clone(), &wq, scale),
        rotate(parts[1].clone(), &wk, 1.0),
        heads(&parts[2]).transpose(&[1, 0, 2]).unwrap(),
    ];
    for (i, want) in want.iter().enumerate() {
        let part = got
            .slice_axis(0, i as i32, i as i32 + 1)
            .unwrap()
            .squeeze(0)
            .unwrap();
        assert!(max_abs_diff(&part, want) <= 1e-5, "part {i}");
    }
}

/// Attention of `[3, H, S, D]` through MLX's kernel, as `[S, H·D]`.
fn reference_attention(qkv: &Array) -> Array {
    let (h, s, d) = (qkv.dim(1), qkv.dim(2), qkv.dim(3));
    let part = |i: i32| qkv.slice_axis(0, i, i + 1).unwrap();
    let o = fast::scaled_dot_product_attention(&part(0), &part(1), &part(2), 1.0, fast::Mask::None)
        .unwrap();
    o.squeeze(0)
        .unwrap()
        .transpose(&[1, 0, 2])
        .unwrap()
        .reshape(&[s, h * d])
        .unwrap()
}

#[test]
fn attention_rows_matches_scaled_dot_product_attention() {
    let _one = setup();
    let qkv = (normal(&[3, 3, 40, 16], 8) * 0.5).unwrap();
    let got = fast::attention_rows(&qkv).unwrap();
    assert!(max_abs_diff(&got, &reference_attention(&qkv)) <= 1e-5);
}

#[test]
fn attention_rows_over_several_blocks_of_queries() {
    let _one = setup();
    // 2 heads × 2100² scores are over the kernel's 32 MiB block: the queries go in two blocks.
    let qkv = (normal(&[3, 2, 2100, 16], 9) * 0.5).unwrap();
    let got = fast::attention_rows(&qkv).unwrap();
    assert!(max_abs_diff(&got, &reference_attention(&qkv)) <= 1e-5);
}

/// `QkvHeads::attention` against its two steps and against MLX's attention kernel, for `s` tokens of
/// `h` heads of 16.
fn check_qkv_attention(s: i32, h: i32, seed: u64) {
    let d = 16;
    let qkv = normal(&[s, 3 * h * d], seed);
    let (wq, wk) = (normal(&[d], seed + 1), normal(&[d], seed + 2));
    let angles = normal(&[s, 1, d / 2], seed + 3);
    let rope = (angles.cos().unwrap(), angles.sin().unwrap());
    let scale = 1.0 / (d as f32).sqrt();
    let qkv_heads = fast::QkvHeads {
        q_weight: &wq,
        k_weight: &wk,
        cos: &rope.0,
        sin: &rope.1,
        heads: h,
        eps: 1e-5,
        q_scale: scale,
    };
    let got = qkv_heads.attention(&qkv).unwrap();
    let heads = qkv_heads.split(&qkv).unwrap();
    // The same products and softmax in the same order: the same values, bit for bit.
    let steps = fast::attention_rows(&heads).unwrap();
    assert_eq!(got.shape(), vec![s, h * d]);
    assert_eq!(got.to_vec::<f32>().unwrap(), steps.to_vec::<f32>().unwrap());
    assert!(max_abs_diff(&got, &reference_attention(&heads)) <= 1e-5);
}

#[test]
fn qkv_attention_is_attention_of_the_normed_rotated_heads() {
    let _one = setup();
    // Three heads on two cores: one core takes two.
    check_qkv_attention(40, 3, 20);
}

#[test]
fn qkv_attention_over_several_blocks_of_queries() {
    let _one = setup();
    // 2900² scores per core are over the kernel's 32 MiB: each head's queries go in blocks.
    check_qkv_attention(2900, 2, 30);
}

#[test]
fn silu_gate_is_silu_of_one_half_times_the_other() {
    let _one = setup();
    let x = (normal(&[6, 40], 10) * 4.0).unwrap();
    let got = fast::silu_gate(&x).unwrap();
    let halves = ops::split(&x, 2, 1).unwrap();
    let want = (halves[0].silu().unwrap() * &halves[1]).unwrap();
    assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
}

fn checkpoint(tensors: Vec<(&str, Array)>) -> Checkpoint {
    let map: HashMap<String, Array> = tensors.into_iter().map(|(k, v)| (k.into(), v)).collect();
    Checkpoint::new("transformer", map, Dtype::F32)
}

#[test]
fn joined_linear_layers_give_their_outputs_side_by_side() {
    let _one = setup();
    let x = normal(&[9, 64], 11);
    let ckpt = checkpoint(vec![
        ("a.weight", normal(&[32, 64], 12)),
        ("b.weight", normal(&[48, 64], 13)),
    ]);
    let w = ckpt.root();
    let (a, b) = (
        Linear::new(&w.pp("a"), 64, 32, false).unwrap(),
        Linear::new(&w.pp("b"), 64, 48, false).unwrap(),
    );
    let joined = Linear::join(&[&a, &b]).unwrap().expect("dense layers join");
    let want = ops::concatenate(&[&a.forward(&x).unwrap(), &b.forward(&x).unwrap()], 1).unwrap();
    assert!(max_abs_diff(&joined.forward(&x).unwrap(), &want) <= 1e-4);
}

#[test]
fn joined_quantized_layers_stay_packed_and_give_the_same_outputs() {
    let _one = setup();
    let x = normal(&[5, 128], 14);
    let quantized: HashMap<String, QuantizedTensor> = [("a.weight", 15), ("b.weight", 16)]
        .into_iter()
        .map(|(name, seed)| {
            let q = QuantizedTensor::quantize(&normal(&[64, 128], seed), 64, 4, QuantMode::Affine)
                .unwrap();
            (name.to_string(), q)
        })
        .collect();
    let ckpt = Checkpoint::new("transformer", HashMap::new(), Dtype::F32).with_quantized(quantized);
    let w = ckpt.root();
    let (a, b) = (
        Linear::new(&w.pp("a"), 128, 64, false).unwrap(),
        Linear::new(&w.pp("b"), 128, 64, false).unwrap(),
    );
    let joined = Linear::join(&[&a, &b])
        .unwrap()
        .expect("alike quantized layers join");
    let want = ops::concatenate(&[&a.forward(&x).unwrap(), &b.forward(&x).unwrap()], 1).unwrap();
    assert!(max_abs_diff(&joined.forward(&x).unwrap(), &want) <= 1e-4);
}

#[test]
fn layers_with_a_bias_do_not_join() {
    let _one = setup();
    let ckpt = checkpoint(vec![
        ("a.weight", normal(&[8, 16], 17)),
        ("a.bias", normal(&[8], 18)),
        ("b.weight", normal(&[8, 16], 19)),
    ]);
    let w = ckpt.root();
    let a = Linear::new(&w.pp("a"), 16, 8, true).unwrap();
    let b = Linear::new(&w.pp("b"), 16, 8, false).unwrap();
    assert!(Linear::join(&[&a, &b]).unwrap().is_none());
}
