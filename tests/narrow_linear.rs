//! `fast::linear` over weights kept as stored (bf16, f16, affine-quantized) against MLX's own
//! dequantize/astype followed by a float32 matmul.

use zimage::mlx::{self, fast, ops, random, Array, Dtype, QuantMode, QuantizedTensor};

fn normal(shape: &[i32], seed: u64) -> Array {
    random::normal(shape, Dtype::F32, &random::key(seed).unwrap()).unwrap()
}

/// max |a − b| / max |b|.
fn relative_error(a: &Array, b: &Array) -> f32 {
    let a = a.to_vec::<f32>().unwrap();
    let b = b.to_vec::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let scale = b
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// The reference: the weight expanded by MLX, then an f32 product (+ bias).
fn reference(x: &Array, w32: &Array, bias: Option<&Array>) -> Array {
    let y = ops::matmul(x, &w32.transpose(&[1, 0]).unwrap()).unwrap();
    match bias {
        Some(b) => (&y + b).unwrap(),
        None => y,
    }
}

#[test]
fn dequantized_values_are_mlx_own_bit_for_bit() {
    // x = I turns the product into the widened weight itself: every value must be MLX's.
    for (bits, group, scale_dtype) in [
        (4, 64, Dtype::BF16),
        (8, 64, Dtype::BF16),
        (4, 32, Dtype::BF16),
        (2, 64, Dtype::BF16),
        (4, 64, Dtype::F32),
        (8, 32, Dtype::F16),
    ] {
        let (n, k) = (48, 256);
        let w = (normal(&[n, k], 1) * 0.05)
            .unwrap()
            .astype(scale_dtype)
            .unwrap();
        let (wq, s, b) = ops::quantize(&w, group, bits).unwrap();
        let eye = Array::from_slice(
            &(0..k * k)
                .map(|i| if i / k == i % k { 1f32 } else { 0.0 })
                .collect::<Vec<_>>(),
            &[k, k],
        )
        .unwrap();
        let quant = fast::Packing {
            scales: &s,
            biases: Some(&b),
            group_size: group,
            bits,
            mode: QuantMode::Affine,
        };
        let got = fast::linear(&eye, &wq, Some(quant), None).unwrap();
        let want = ops::dequantize(&wq, &s, &b, group, bits)
            .unwrap()
            .astype(Dtype::F32)
            .unwrap()
            .transpose(&[1, 0])
            .unwrap();
        let (got, want) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        let differing = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differing,
            0,
            "{bits}-bit, group {group}, {scale_dtype:?} scales: {differing} of {} values differ",
            got.len()
        );
    }
}

#[test]
fn products_match_dequantize_then_matmul() {
    // Shapes of every linear of the real models (out, in), with the row counts they run at.
    let shapes: &[(i32, i32, i32, bool)] = &[
        (3840, 3840, 96, false),  // attention q/k/v/out
        (10240, 3840, 40, false), // feed-forward w1/w3
        (3840, 10240, 40, false), // feed-forward w2
        (15360, 256, 1, true),    // adaLN modulation
        (3840, 2560, 33, true),   // caption projection
        (4096, 2560, 17, false),  // Qwen3 q_proj
        (1024, 2560, 17, false),  // Qwen3 k/v_proj
        (2560, 4096, 17, false),  // Qwen3 o_proj
        (9728, 2560, 17, false),  // Qwen3 gate/up
        (2560, 9728, 17, false),  // Qwen3 down
    ];
    for (i, &(n, k, m, has_bias)) in shapes.iter().enumerate() {
        let seed = 10 + i as u64;
        let x = normal(&[m, k], seed);
        let w = (normal(&[n, k], seed + 100) * (1.0 / (k as f32).sqrt()))
            .unwrap()
            .astype(Dtype::BF16)
            .unwrap();
        let bias = has_bias.then(|| normal(&[n], seed + 200));
        // bf16 weight widened per tile.
        let got = fast::linear(&x, &w, None, bias.as_ref()).unwrap();
        let want = reference(&x, &w.astype(Dtype::F32).unwrap(), bias.as_ref());
        let e = relative_error(&got, &want);
        assert!(
            e <= 1e-5,
            "bf16 [{n}, {k}] × {m} rows: relative error {e:e}"
        );
        for bits in [4, 8] {
            let (wq, s, b) = ops::quantize(&w, 64, bits).unwrap();
            let quant = fast::Packing {
                scales: &s,
                biases: Some(&b),
                group_size: 64,
                bits,
                mode: QuantMode::Affine,
            };
            let got = fast::linear(&x, &wq, Some(quant), bias.as_ref()).unwrap();
            let w32 = ops::dequantize(&wq, &s, &b, 64, bits)
                .unwrap()
                .astype(Dtype::F32)
                .unwrap();
            let want = reference(&x, &w32, bias.as_ref());
            let e = relative_error(&got, &want);
            assert!(
                e <= 1e-5,
                "int{bits} [{n}, {k}] × {m} rows: relative error {e:e}"
            );
        }
        mlx::memory::clear_cache();
    }
}

#[test]
fn f16_weights_and_batched_inputs() {
    let x = normal(&[2, 3, 128], 1);
    let w = normal(&[40, 128], 2).astype(Dtype::F16).unwrap();
    let got = fast::linear(&x, &w, None, None).unwrap();
    assert_eq!(got.shape(), vec![2, 3, 40]);
    let want = ops::matmul(
        &x,
        &w.astype(Dtype::F32).unwrap().transpose(&[1, 0]).unwrap(),
    )
    .unwrap();
    assert!(relative_error(&got, &want) <= 1e-6);
}

#[test]
fn misfit_weights_are_errors_not_crashes() {
    let x = normal(&[4, 128], 1);
    let w = normal(&[8, 64], 2).astype(Dtype::BF16).unwrap();
    let e = fast::linear(&x, &w, None, None).unwrap_err().to_string();
    assert!(e.contains("columns"), "{e}");
    let (wq, s, b) = ops::quantize(&normal(&[8, 128], 3), 64, 4).unwrap();
    let quant = fast::Packing {
        scales: &s,
        biases: Some(&b),
        group_size: 64,
        bits: 8,
        mode: QuantMode::Affine,
    };
    let e = fast::linear(&x, &wq, Some(quant), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("do not fit"), "{e}");
}

#[test]
fn float_quantization_modes_match_their_dequantized_weights() {
    // nvfp4 and mxfp8 run through MLX's own dequantize on the CPU, one layer at a time.
    let x = normal(&[8, 256], 1);
    let w = (normal(&[64, 256], 2) * 0.05).unwrap();
    for (mode, group, bits) in [(QuantMode::Nvfp4, 16, 4), (QuantMode::Mxfp8, 32, 8)] {
        let q = QuantizedTensor::quantize(&w, group, bits, mode).unwrap();
        assert!(q.biases.is_none(), "{mode:?} has no biases");
        let got = fast::linear(&x, &q.weight, Some(q.packing()), None).unwrap();
        let w32 = q.dequantize().unwrap().astype(Dtype::F32).unwrap();
        let want = reference(&x, &w32, None);
        let e = relative_error(&got, &want);
        assert!(e <= 1e-5, "{mode:?}: relative error {e:e}");
        // And the quantization is close to the weight it stands for.
        let e = relative_error(&w32, &w);
        assert!(e < 0.25, "{mode:?}: quantization error {e}");
    }
}

/// Rounds to bf16 and back: the values bf16 products multiply.
fn bf16_values(a: &Array) -> Array {
    a.astype(Dtype::BF16).unwrap().astype(Dtype::F32).unwrap()
}

/// bf16 products take x and the widened weight rounded to bf16 and sum in f32: they agree
/// with an f32 product of those rounded values up to the order of the sums, over every weight
/// form and the awkward shapes (a partial row block, a partial panel of outputs, odd and
/// unaligned widths, a single row).
/// A quantized weight's scales, biases, group size and bits.
type Packed = (Array, Array, i32, i32);

#[test]
fn bf16_products_multiply_the_rounded_values() {
    if !mlx::bf16_products_available() {
        // Elsewhere the request gives f32 products: the same as `fast::linear`.
        let x = normal(&[5, 64], 1);
        let w = normal(&[40, 64], 2).astype(Dtype::BF16).unwrap();
        let a = fast::linear(&x, &w, None, None).unwrap();
        let b = fast::linear_with(&x, &w, None, None, fast::Products::Bf16).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        return;
    }
    for (i, &(m, n, k)) in [
        (29, 70, 96),
        (1, 33, 100),
        (12, 32, 64),
        (150, 300, 1088),
        (7, 5, 37),
    ]
    .iter()
    .enumerate()
    {
        let seed = 40 + i as u64;
        let x = normal(&[m, k], seed);
        let w = (normal(&[n, k], seed + 1) * (1.0 / (k as f32).sqrt())).unwrap();
        let bias = normal(&[n], seed + 2);
        let mut forms: Vec<(String, Array, Option<Packed>)> = vec![
            ("f32".into(), w.clone(), None),
            ("bf16".into(), w.astype(Dtype::BF16).unwrap(), None),
            ("f16".into(), w.astype(Dtype::F16).unwrap(), None),
        ];
        if k % 64 == 0 {
            for bits in [4, 8] {
                let wb = w.astype(Dtype::BF16).unwrap();
                let (wq, s, b) = ops::quantize(&wb, 64, bits).unwrap();
                forms.push((format!("int{bits}"), wq, Some((s, b, 64, bits))));
            }
        }
        for (name, wf, quant) in &forms {
            let (got, w32) = match quant {
                None => (
                    fast::linear_with(&x, wf, None, Some(&bias), fast::Products::Bf16).unwrap(),
                    wf.astype(Dtype::F32).unwrap(),
                ),
                Some((s, b, group, bits)) => {
                    let packing = fast::Packing {
                        scales: s,
                        biases: Some(b),
                        group_size: *group,
                        bits: *bits,
                        mode: QuantMode::Affine,
                    };
                    let got =
                        fast::linear_with(&x, wf, Some(packing), Some(&bias), fast::Products::Bf16)
                            .unwrap();
                    let w32 = ops::dequantize(wf, s, b, *group, *bits)
                        .unwrap()
                        .astype(Dtype::F32)
                        .unwrap();
                    (got, w32)
                }
            };
            assert_eq!(got.shape(), vec![m, n], "{name}");
            let want = reference(&bf16_values(&x), &bf16_values(&w32), Some(&bias));
            let e = relative_error(&got, &want);
            assert!(
                e <= 2e-6,
                "{name} [{m}, {k}] × [{n}, {k}]: relative error {e:e}"
            );
            // And against the exact product, bf16's rounding and no more.
            let exact = reference(&x, &w32, Some(&bias));
            let e = relative_error(&got, &exact);
            assert!(e <= 2e-2, "{name}: {e:e} from the f32 product");
        }
    }
}
