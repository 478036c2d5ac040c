//! The safe MLX wrapper against hand-computed values, its error paths and its memory hygiene.

use half::bf16;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use zimage::mlx::{self, fast, io, ops, random, Array, Dtype};

fn arr(v: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

fn close(a: &Array, want: &[f32], tol: f32) {
    let got = a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g}, want {w} (all: {got:?})"
        );
    }
}

/// max |a − b| over every element, in f32.
fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    let (a, b) = (a.astype(Dtype::F32).unwrap(), b.astype(Dtype::F32).unwrap());
    let axes: Vec<i32> = (0..a.shape().len() as i32).collect();
    (&a - &b)
        .unwrap()
        .abs()
        .unwrap()
        .max(&axes, false)
        .unwrap()
        .item::<f32>()
        .unwrap()
}

#[test]
fn creation_and_readback() {
    let a = arr(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    assert_eq!(a.shape(), vec![2, 3]);
    assert_eq!(
        (a.ndim(), a.size(), a.nbytes(), a.dtype()),
        (2, 6, 24, Dtype::F32)
    );
    assert_eq!(a.dim(-1), 3);
    assert_eq!(Array::scalar(7i32).unwrap().item::<i32>().unwrap(), 7);
    close(&Array::zeros(&[2], Dtype::F32).unwrap(), &[0.0, 0.0], 0.0);
    close(&Array::ones(&[2], Dtype::BF16).unwrap(), &[1.0, 1.0], 0.0);
    close(&Array::full(&[3], 2.5, Dtype::F16).unwrap(), &[2.5; 3], 0.0);
    close(
        &Array::arange(0.0, 5.0, 2.0, Dtype::F32).unwrap(),
        &[0.0, 2.0, 4.0],
        0.0,
    );
    let b = Array::from_slice(&[bf16::from_f32(1.5), bf16::from_f32(-2.0)], &[2]).unwrap();
    assert_eq!(
        b.to_bytes().unwrap(),
        [
            bf16::from_f32(1.5).to_le_bytes(),
            bf16::from_f32(-2.0).to_le_bytes()
        ]
        .concat()
    );
    let raw = Array::from_bytes(&1.25f32.to_le_bytes(), &[1], Dtype::F32).unwrap();
    assert_eq!(raw.item::<f32>().unwrap(), 1.25);
    assert!(Array::from_slice(&[1.0f32; 3], &[2, 2]).is_err());
    assert!(
        a.to_vec::<i32>().is_err(),
        "dtype mismatch on readback is an error"
    );
    let c = a.clone();
    drop(a);
    assert_eq!(c.sum(&[], false).unwrap().item::<f32>().unwrap(), 21.0);
}

#[test]
fn elementwise_maths() {
    let x = arr(&[0.5, 1.0, 2.0], &[3]);
    close(&x.neg().unwrap(), &[-0.5, -1.0, -2.0], 0.0);
    close(
        &x.exp().unwrap(),
        &[1.648_721_3, std::f32::consts::E, 7.389_056],
        1e-6,
    );
    close(
        &x.log().unwrap(),
        &[-std::f32::consts::LN_2, 0.0, std::f32::consts::LN_2],
        1e-6,
    );
    close(
        &x.sin().unwrap(),
        &[0.479_425_55, 0.841_470_96, 0.909_297_4],
        1e-6,
    );
    close(
        &x.cos().unwrap(),
        &[0.877_582_6, 0.540_302_3, -0.416_146_84],
        1e-6,
    );
    close(
        &x.tanh().unwrap(),
        &[0.462_117_16, 0.761_594_2, 0.964_027_6],
        1e-6,
    );
    close(
        &x.sigmoid().unwrap(),
        &[0.622_459_3, 0.731_058_6, 0.880_797_1],
        1e-6,
    );
    close(
        &x.silu().unwrap(),
        &[0.311_229_65, 0.731_058_6, 1.761_594_2],
        1e-6,
    );
    close(
        &x.sqrt().unwrap(),
        &[0.707_106_77, 1.0, std::f32::consts::SQRT_2],
        1e-6,
    );
    close(
        &x.rsqrt().unwrap(),
        &[std::f32::consts::SQRT_2, 1.0, 0.707_106_77],
        1e-6,
    );
    close(&x.square().unwrap(), &[0.25, 1.0, 4.0], 0.0);
    close(&arr(&[-1.5, 2.0], &[2]).abs().unwrap(), &[1.5, 2.0], 0.0);
    let y = arr(&[2.0, 1.0, 0.5], &[3]);
    close(&(&x + &y).unwrap(), &[2.5, 2.0, 2.5], 0.0);
    close(&(&x - &y).unwrap(), &[-1.5, 0.0, 1.5], 0.0);
    close(&(&x * &y).unwrap(), &[1.0, 1.0, 1.0], 0.0);
    close(&(&x / &y).unwrap(), &[0.25, 1.0, 4.0], 0.0);
    close(&(&x * 2.0).unwrap(), &[1.0, 2.0, 4.0], 0.0);
    close(&(x.clone() + 1.0).unwrap(), &[1.5, 2.0, 3.0], 0.0);
    close(&(-&x).unwrap(), &[-0.5, -1.0, -2.0], 0.0);
    close(&ops::maximum(&x, &y).unwrap(), &[2.0, 1.0, 2.0], 0.0);
    close(&ops::minimum(&x, &y).unwrap(), &[0.5, 1.0, 0.5], 0.0);
    close(
        &ops::power(&x, &y).unwrap(),
        &[0.25, 1.0, std::f32::consts::SQRT_2],
        1e-6,
    );
    close(
        &ops::clip(&x, Some(0.75), Some(1.5)).unwrap(),
        &[0.75, 1.0, 1.5],
        0.0,
    );
    close(
        &ops::clip(&x, None, Some(1.0)).unwrap(),
        &[0.5, 1.0, 1.0],
        0.0,
    );
    let gt = ops::greater(&x, &y).unwrap();
    assert_eq!(gt.to_vec::<bool>().unwrap(), vec![false, false, true]);
    assert_eq!(
        ops::equal(&x, &y).unwrap().to_vec::<bool>().unwrap(),
        vec![false, true, false]
    );
    assert_eq!(
        ops::less(&x, &y).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false]
    );
    assert_eq!(
        ops::less_equal(&x, &y).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, false]
    );
    assert_eq!(
        ops::greater_equal(&x, &y)
            .unwrap()
            .to_vec::<bool>()
            .unwrap(),
        vec![false, true, true]
    );
    assert_eq!(
        ops::not_equal(&x, &y).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, true]
    );
    close(&ops::where_(&gt, &x, &y).unwrap(), &[2.0, 1.0, 2.0], 0.0);
    // Scalars keep a bf16 operand in bf16.
    let h = Array::ones(&[2], Dtype::BF16).unwrap();
    assert_eq!((&h * 3.0).unwrap().dtype(), Dtype::BF16);
    assert_eq!(h.astype(Dtype::F32).unwrap().dtype(), Dtype::F32);
}

#[test]
fn reductions_and_softmax() {
    let a = arr(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    close(&a.sum(&[1], false).unwrap(), &[6.0, 15.0], 0.0);
    close(&a.sum(&[], false).unwrap(), &[21.0], 0.0);
    close(&a.mean(&[0], false).unwrap(), &[2.5, 3.5, 4.5], 0.0);
    close(&a.max(&[1], false).unwrap(), &[3.0, 6.0], 0.0);
    close(&a.min(&[1], true).unwrap(), &[1.0, 4.0], 0.0);
    assert_eq!(a.min(&[1], true).unwrap().shape(), vec![2, 1]);
    close(
        &a.var(&[1], false, 0).unwrap(),
        &[0.666_666_7, 0.666_666_7],
        1e-6,
    );
    close(&a.var(&[1], false, 1).unwrap(), &[1.0, 1.0], 1e-6);
    // softmax([1, 2, 3]) = e^x / Σ e^x
    close(
        &a.softmax(&[1], true).unwrap(),
        &[
            0.090_030_57,
            0.244_728_48,
            0.665_240_94,
            0.090_030_57,
            0.244_728_48,
            0.665_240_94,
        ],
        1e-6,
    );
}

#[test]
fn matmul_and_addmm() {
    let a = arr(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = arr(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
    close(&ops::matmul(&a, &b).unwrap(), &[4.0, 5.0, 10.0, 11.0], 0.0);
    close(&a.matmul(&b).unwrap(), &[4.0, 5.0, 10.0, 11.0], 0.0);
    let c = arr(&[1.0, 1.0, 1.0, 1.0], &[2, 2]);
    close(
        &ops::addmm(&c, &a, &b, 2.0, 0.5).unwrap(),
        &[8.5, 10.5, 20.5, 22.5],
        0.0,
    );
    // Through a transposed view, as linear layers use it.
    let bt = b.transpose(&[1, 0]).unwrap();
    close(
        &ops::matmul(&a, &bt.transpose(&[1, 0]).unwrap()).unwrap(),
        &[4.0, 5.0, 10.0, 11.0],
        0.0,
    );
}

#[test]
fn shape_ops() {
    let a = arr(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]);
    close(
        &a.reshape(&[3, 2]).unwrap(),
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        0.0,
    );
    close(
        &a.transpose(&[1, 0]).unwrap(),
        &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
        0.0,
    );
    close(
        &a.swapaxes(0, 1).unwrap(),
        &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
        0.0,
    );
    assert_eq!(a.expand_dims(0).unwrap().shape(), vec![1, 2, 3]);
    assert_eq!(
        a.expand_dims(0).unwrap().squeeze(0).unwrap().shape(),
        vec![2, 3]
    );
    close(
        &arr(&[1.0, 2.0], &[2, 1]).broadcast_to(&[2, 2]).unwrap(),
        &[1.0, 1.0, 2.0, 2.0],
        0.0,
    );
    close(
        &arr(&[1.0, 2.0], &[2]).repeat(2, 0).unwrap(),
        &[1.0, 1.0, 2.0, 2.0],
        0.0,
    );
    close(
        &a.slice(&[0, 1], &[2, 3], &[1, 1]).unwrap(),
        &[1.0, 2.0, 4.0, 5.0],
        0.0,
    );
    close(
        &a.slice(&[0, 0], &[2, 3], &[1, 2]).unwrap(),
        &[0.0, 2.0, 3.0, 5.0],
        0.0,
    );
    close(&a.slice_axis(1, 2, 3).unwrap(), &[2.0, 5.0], 0.0);
    let idx = Array::from_slice(&[2i32, 0], &[2]).unwrap();
    close(&a.take(&idx, 1).unwrap(), &[2.0, 0.0, 5.0, 3.0], 0.0);
    let idx2 = Array::from_slice(&[1i32, 0, 2, 2], &[2, 2]).unwrap();
    close(
        &a.take_along_axis(&idx2, 1).unwrap(),
        &[1.0, 0.0, 5.0, 5.0],
        0.0,
    );
    close(
        &ops::concatenate(&[&a, &a], 0)
            .unwrap()
            .slice_axis(0, 2, 4)
            .unwrap(),
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        0.0,
    );
    assert_eq!(ops::stack(&[&a, &a], 0).unwrap().shape(), vec![2, 2, 3]);
    let parts = ops::split(&a, 3, 1).unwrap();
    assert_eq!(parts.len(), 3);
    close(&parts[1], &[1.0, 4.0], 0.0);
    let parts = ops::split_at(&a, &[1], 1).unwrap();
    assert_eq!(
        (parts[0].shape(), parts[1].shape()),
        (vec![2, 1], vec![2, 2])
    );
    close(
        &ops::pad(&arr(&[1.0, 2.0], &[1, 2]), &[(0, 1), (1, 0)], 9.0).unwrap(),
        &[9.0, 1.0, 2.0, 9.0, 9.0, 9.0],
        0.0,
    );
    assert_eq!(
        a.argmax(&[1], false).unwrap().to_vec::<u32>().unwrap(),
        vec![2, 2]
    );
}

#[test]
fn conv2d_nhwc() {
    // 3×3 input, one channel, 2×2 kernel of ones: every output is the sum of a 2×2 window.
    let x = arr(
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
        &[1, 3, 3, 1],
    );
    let w = arr(&[1.0; 4], &[1, 2, 2, 1]);
    let y = ops::conv2d(&x, &w, (1, 1), (0, 0), (1, 1), 1).unwrap();
    assert_eq!(y.shape(), vec![1, 2, 2, 1]);
    close(&y, &[12.0, 16.0, 24.0, 28.0], 0.0);
    let y = ops::conv2d(&x, &w, (2, 2), (1, 1), (1, 1), 1).unwrap();
    close(&y, &[1.0, 5.0, 11.0, 28.0], 0.0);
}

#[test]
fn fast_kernels() {
    let x = arr(&[1.0, 2.0, 3.0, 4.0], &[1, 4]);
    // rms = sqrt(7.5); y = x / rms · w
    let w = arr(&[1.0, 1.0, 2.0, 0.5], &[4]);
    let r = 7.5f32.sqrt();
    close(
        &fast::rms_norm(&x, Some(&w), 0.0).unwrap(),
        &[1.0 / r, 2.0 / r, 6.0 / r, 2.0 / r],
        1e-6,
    );
    // mean 2.5, var 1.25
    let s = 1.25f32.sqrt();
    close(
        &fast::layer_norm(&x, None, None, 0.0).unwrap(),
        &[-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s],
        1e-6,
    );
    let b = arr(&[1.0; 4], &[4]);
    close(
        &fast::layer_norm(&x, Some(&w), Some(&b), 0.0).unwrap(),
        &[1.0 - 1.5 / s, 1.0 - 0.5 / s, 1.0 + 1.0 / s, 1.0 + 0.75 / s],
        1e-6,
    );
    // RoPE at position 1 (offset 1), dims 2, base 1: angle 1 rad on the only pair.
    let v = arr(&[1.0, 0.0], &[1, 1, 1, 2]);
    let (c, sn) = (1f32.cos(), 1f32.sin());
    close(
        &fast::rope(&v, 2, true, Some(1.0), 1.0, 1, None).unwrap(),
        &[c, sn],
        1e-6,
    );
    close(
        &fast::rope(&v, 2, false, Some(1.0), 1.0, 1, None).unwrap(),
        &[c, sn],
        1e-6,
    );
    // Attention over two keys with equal scores averages the values; causal sees only the first.
    let q = arr(&[1.0, 0.0], &[1, 1, 1, 2]);
    let q2 = arr(&[1.0, 0.0, 1.0, 0.0], &[1, 1, 2, 2]);
    let k = arr(&[0.0, 1.0, 0.0, 1.0], &[1, 1, 2, 2]);
    let vv = arr(&[2.0, 0.0, 4.0, 8.0], &[1, 1, 2, 2]);
    close(
        &fast::scaled_dot_product_attention(&q, &k, &vv, 1.0, fast::Mask::None).unwrap(),
        &[3.0, 4.0],
        1e-6,
    );
    close(
        &fast::scaled_dot_product_attention(&q2, &k, &vv, 1.0, fast::Mask::Causal).unwrap(),
        &[2.0, 0.0, 3.0, 4.0],
        1e-6,
    );
    let mask = Array::from_slice(&[false, true], &[1, 1, 1, 2]).unwrap();
    close(
        &fast::scaled_dot_product_attention(&q, &k, &vv, 1.0, fast::Mask::Array(&mask)).unwrap(),
        &[4.0, 8.0],
        1e-6,
    );
}

#[test]
fn quantization_round_trip() {
    let vals: Vec<f32> = (0..128).map(|i| (i as f32 - 64.0) / 16.0).collect();
    let w = arr(&vals, &[2, 64]);
    let (q, s, b) = ops::quantize(&w, 64, 8).unwrap();
    assert_eq!(
        (q.shape(), q.dtype(), s.shape()),
        (vec![2, 16], Dtype::U32, vec![2, 1])
    );
    let back = ops::dequantize(&q, &s, &b, 64, 8).unwrap();
    // 8-bit affine over a range of 3.94 has a step of ~0.0155.
    close(&back, &vals, 0.01);
    let x = arr(&vec![1.0; 64], &[1, 64]);
    let y = ops::quantized_matmul(&x, &q, &s, &b, true, 64, 8).unwrap();
    let want = ops::matmul(&x, &back.transpose(&[1, 0]).unwrap()).unwrap();
    close(&y, &want.to_vec::<f32>().unwrap(), 1e-4);
}

#[test]
fn random_normal_is_keyed() {
    let k = random::key(7).unwrap();
    let a = random::normal(&[1000], Dtype::F32, &k)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let b = random::normal(&[1000], Dtype::F32, &random::key(7).unwrap())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b, "same key, same numbers");
    let mean = a.iter().sum::<f32>() / 1000.0;
    let var = a.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / 1000.0;
    assert!(
        mean.abs() < 0.15 && (var - 1.0).abs() < 0.15,
        "mean {mean}, var {var}"
    );
}

#[test]
fn safetensors_round_trip_and_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    let a = arr(&[1.0, 2.0], &[2]);
    let h = Array::ones(&[2, 2], Dtype::BF16).unwrap();
    io::save_safetensors(&p, &[("a", &a), ("h", &h)], &[("k", "v")]).unwrap();
    let back = io::load_safetensors(&p).unwrap();
    assert_eq!(back.metadata["k"], "v");
    close(&back.tensors["a"], &[1.0, 2.0], 0.0);
    assert_eq!(back.tensors["h"].dtype(), Dtype::BF16);
    // MLX writes a strict, unpadded header that our parser accepts.
    let header = zimage::safetensors::parse(&std::fs::read(&p).unwrap()).unwrap();
    assert_eq!(header.tensors.len(), 2);
    let err = io::load_safetensors(&dir.path().join("missing.safetensors")).unwrap_err();
    assert!(err.to_string().contains("missing.safetensors"), "{err}");
}

#[test]
fn errors_carry_mlx_messages_and_never_abort() {
    let a = arr(&[1.0; 6], &[2, 3]);
    let e = a.reshape(&[4]).unwrap_err();
    assert_eq!(e.op, "reshape");
    assert!(e.message.contains("[reshape]"), "{e}");
    let e = ops::matmul(&a, &a).unwrap_err();
    assert!(e.message.contains("[matmul]"), "{e}");
    let e = (&a + &arr(&[1.0; 4], &[4])).unwrap_err();
    assert!(
        e.message.contains("broadcast") || e.message.contains("Shapes"),
        "{e}"
    );
    assert!(a.transpose(&[0]).is_err());
    assert!(a.slice_axis(5, 0, 1).is_err());
    assert!(ops::concatenate(&[&a, &arr(&[1.0], &[1])], 0).is_err());
    // The process is still fine afterwards.
    assert_eq!(a.sum(&[], false).unwrap().item::<f32>().unwrap(), 6.0);
}

#[test]
fn one_dtype_serves_headers_and_arrays_and_types_mlx_lacks_are_errors() {
    use zimage::safetensors::Dtype;
    // The type a header names is the type an array is made of: no conversion through names.
    let header_dtype = Dtype::parse("BF16").unwrap();
    let a = Array::zeros(&[2, 2], header_dtype).unwrap();
    assert_eq!(a.dtype(), header_dtype);
    for d in Dtype::ALL {
        let made = Array::zeros(&[2], d);
        assert_eq!(made.is_ok(), d.in_mlx(), "{d}");
        if let Err(e) = made {
            assert!(e.message.contains(&format!("MLX has no {d} arrays")), "{e}");
        }
    }
    assert!(a.astype(Dtype::F8_E4M3).is_err());
}

#[test]
fn external_memory_is_released_exactly_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    struct Owner(Vec<f32>, Arc<AtomicUsize>);
    impl Drop for Owner {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    let owner = Owner(vec![1.0, 2.0, 3.0, 4.0], drops.clone());
    let ptr = owner.0.as_ptr() as *const u8;
    let a = unsafe { Array::from_external(ptr, &[2, 2], Dtype::F32, Box::new(owner)) }.unwrap();
    close(&(&a * 2.0).unwrap(), &[2.0, 4.0, 6.0, 8.0], 0.0);
    // Where the backend wraps the memory (Metal, page-aligned) the owner lives as long as a
    // handle does; where it copies (the CPU backend) the owner goes right after the copy.
    // Either way it is dropped exactly once and the values are intact.
    let b = a.clone();
    drop(a);
    assert!(drops.load(Ordering::SeqCst) <= 1);
    close(&b, &[1.0, 2.0, 3.0, 4.0], 0.0);
    drop(b);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn device_and_version() {
    assert!(mlx::version().starts_with("0.32"));
    zimage::platform::use_default_device().unwrap();
    assert_eq!(mlx::default_device(), zimage::platform::default_device());
    let info = mlx::build_info();
    assert!(!info.lib_dir.is_empty());
}

#[test]
fn silu_matches_its_definition_for_every_layout_and_dtype() {
    // Values across the clamp at ±87, zero and the usual range.
    let vals: Vec<f32> = (0..4096)
        .map(|i| (i as f32 - 2048.0) * 0.06)
        .chain([-200.0, -88.0, 88.0, 200.0, 0.0])
        .collect();
    let n = vals.len() as i32;
    let x = Array::from_slice(&vals, &[n]).unwrap();
    let got = x.silu().unwrap().to_vec::<f32>().unwrap();
    for (v, g) in vals.iter().zip(&got) {
        let want = (*v as f64) / (1.0 + (-(*v as f64)).exp());
        assert!(
            ((*g as f64) - want).abs() <= 2e-7 * want.abs().max(1e-30) + 1e-30,
            "silu({v}) = {g}, want {want}"
        );
    }
    // A strided (transposed) input, and a bf16 one, go through the same op.
    let m = Array::from_slice(&vals[..4096], &[64, 64]).unwrap();
    let t = m
        .transpose(&[1, 0])
        .unwrap()
        .silu()
        .unwrap()
        .transpose(&[1, 0])
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(t, got[..4096].to_vec());
    let h = m
        .astype(Dtype::BF16)
        .unwrap()
        .silu()
        .unwrap()
        .astype(Dtype::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let worst = h
        .iter()
        .zip(&got[..4096])
        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
        .fold(0.0, f32::max);
    assert!(worst < 1e-2, "bf16 silu off by {worst}");
}

/// A random NHWC input `[b, h, w, cin]`, `[cout, k, k, cin]` weight and bias.
fn conv_operands(b: i32, h: i32, w: i32, cin: i32, cout: i32, k: i32) -> (Array, Array, Array) {
    let normal = |shape: &[i32], seed| {
        random::normal(shape, Dtype::F32, &random::key(seed).unwrap()).unwrap()
    };
    (
        normal(&[b, h, w, cin], 7),
        normal(&[cout, k, k, cin], 8),
        normal(&[cout], 9),
    )
}

/// Outputs are sums of `terms` unit normals times unit normals: about sqrt(terms) in size. f32
/// rounding of such sums, direct or gathered, stays near 1e-6 of that; Winograd's F(4×4, 3×3)
/// transforms scale values by up to 8 on the way, which leaves up to about 3e-5 of it at 512
/// channels.
fn assert_convolutions_agree(got: &Array, want: &Array, terms: i32, case: &str) {
    assert_eq!(got.shape(), want.shape(), "{case}");
    let diff = max_abs_diff(got, want);
    let scale = (terms as f32).sqrt();
    assert!(
        diff < 5e-5 * scale,
        "{case}: off by {diff} (outputs about {scale})"
    );
}

#[test]
fn convolution_as_products_matches_conv2d() {
    use zimage::models::vae::conv_matrix;
    // 3×3 kernels take the Winograd form: sides that are not multiples of 4 (partial 4×4 tiles
    // at the right and bottom edges), batches, a 1×1 image, channel counts that are not
    // multiples of its 64-channel chunks, and images whose tiles span several 32 MiB blocks (the
    // last one short). 1×1 and 5×5
    // kernels take the gathered form, with an image of more patch rows than one gather block.
    let cases = [
        (1, 5, 7, 3, 4, 3),
        (2, 6, 4, 5, 2, 3),
        (1, 1, 1, 3, 4, 3),
        (1, 9, 11, 130, 70, 3),
        (1, 40, 36, 512, 512, 3),
        (1, 256, 250, 64, 8, 3),
        (2, 3, 3, 4, 6, 1),
        (1, 4, 9, 2, 3, 5),
        (1, 256, 250, 64, 8, 5),
    ];
    for (b, h, w, cin, cout, k) in cases {
        let (x, wt, bias) = conv_operands(b, h, w, cin, cout, k);
        let want =
            (ops::conv2d(&x, &wt, (1, 1), (k / 2, k / 2), (1, 1), 1).unwrap() + &bias).unwrap();
        let got = fast::conv2d_same(&x, &conv_matrix(&wt).unwrap(), &bias, k).unwrap();
        assert_convolutions_agree(
            &got,
            &want,
            k * k * cin,
            &format!("{b}×{h}×{w}×{cin} → {cout}, k {k}"),
        );
    }
    // A weight that does not fit the input is refused, naming what is expected.
    let x = random::normal(&[1, 4, 4, 3], Dtype::F32, &random::key(7).unwrap()).unwrap();
    let wrong = Array::zeros(&[9 * 2, 4], Dtype::F32).unwrap();
    let err =
        fast::conv2d_same(&x, &wrong, &Array::zeros(&[4], Dtype::F32).unwrap(), 3).unwrap_err();
    assert!(err.to_string().contains("[k·k·I, O]"), "{err}");
}

#[test]
fn fused_upsample_and_residual_give_the_separate_steps_bytes() {
    use zimage::models::vae::conv_matrix;
    // The decoder's upsampler (nearest ×2, then 3×3) and a resnet's conv2 with its residual, in
    // one pass: the same bits as the steps one by one, at odd sides (partial tiles) and with a
    // batch; and at a size whose tiles span several blocks.
    for (b, h, w, cin, cout) in [(1, 5, 3, 3, 4), (2, 4, 7, 6, 5), (1, 130, 110, 64, 64)] {
        let (x, wt, bias) = conv_operands(b, h, w, cin, cout, 3);
        let matrix = conv_matrix(&wt).unwrap();
        let enlarged = x
            .reshape(&[b, h, 1, w, 1, cin])
            .unwrap()
            .broadcast_to(&[b, h, 2, w, 2, cin])
            .unwrap()
            .reshape(&[b, 2 * h, 2 * w, cin])
            .unwrap();
        let want = fast::conv2d_same(&enlarged, &matrix, &bias, 3).unwrap();
        let got = fast::conv3x3_same(&x, &matrix, &bias, true, None).unwrap();
        let case = format!("{b}×{h}×{w}×{cin} → {cout}");
        assert_eq!(got.shape(), want.shape(), "{case}");
        assert_eq!(
            got.to_vec::<f32>().unwrap(),
            want.to_vec::<f32>().unwrap(),
            "upsampled {case}"
        );

        let residual =
            random::normal(&[b, h, w, cout], Dtype::F32, &random::key(3).unwrap()).unwrap();
        let want = (fast::conv2d_same(&x, &matrix, &bias, 3).unwrap() + &residual).unwrap();
        let got = fast::conv3x3_same(&x, &matrix, &bias, false, Some(&residual)).unwrap();
        assert_eq!(
            got.to_vec::<f32>().unwrap(),
            want.to_vec::<f32>().unwrap(),
            "with residual {case}"
        );
    }
    // A residual of another shape is refused, naming the rule.
    let (x, wt, bias) = conv_operands(1, 4, 4, 3, 2, 3);
    let wrong = Array::zeros(&[1, 4, 4, 3], Dtype::F32).unwrap();
    let err =
        fast::conv3x3_same(&x, &conv_matrix(&wt).unwrap(), &bias, false, Some(&wrong)).unwrap_err();
    assert!(err.to_string().contains("shaped as the output"), "{err}");
}

#[test]
fn strided_convolution_as_products_matches_conv2d() {
    use zimage::models::vae::conv_matrix;
    // The VAE encoder's downsample (3×3, stride 2, one zero row and column after the image),
    // odd sides, symmetric padding, a 1×1 kernel at stride 2 (gathered too), and an image of more
    // patch rows than one 8 MiB gather block: (batch, h, w, cin, cout, k, stride, before, after).
    let cases = [
        (1, 8, 6, 3, 4, 3, 2, 0, 1),
        (2, 7, 9, 5, 6, 3, 2, 0, 1),
        (1, 9, 9, 4, 3, 3, 2, 1, 1),
        (1, 6, 5, 3, 2, 1, 2, 0, 0),
        (1, 5, 7, 2, 3, 4, 3, 2, 1),
        (1, 160, 128, 128, 16, 3, 2, 0, 1),
    ];
    for (b, h, w, cin, cout, k, stride, lo, hi) in cases {
        let (x, wt, bias) = conv_operands(b, h, w, cin, cout, k);
        let padded = ops::pad(&x, &[(0, 0), (lo, hi), (lo, hi), (0, 0)], 0.0).unwrap();
        let want = (ops::conv2d(&padded, &wt, (stride, stride), (0, 0), (1, 1), 1).unwrap()
            + &bias)
            .unwrap();
        let got = fast::conv2d(&x, &conv_matrix(&wt).unwrap(), &bias, k, stride, (lo, hi)).unwrap();
        let case = format!("{b}×{h}×{w}×{cin} → {cout}, k {k}, stride {stride}");
        assert_convolutions_agree(&got, &want, k * k * cin, &case);
    }
    // Padding as wide as the kernel is refused.
    let x = random::normal(&[1, 4, 4, 3], Dtype::F32, &random::key(7).unwrap()).unwrap();
    let matrix = Array::zeros(&[9 * 3, 4], Dtype::F32).unwrap();
    let bias = Array::zeros(&[4], Dtype::F32).unwrap();
    let err = fast::conv2d(&x, &matrix, &bias, 3, 2, (3, 0)).unwrap_err();
    assert!(
        err.to_string().contains("padding below the kernel size"),
        "{err}"
    );
}

#[test]
fn attention_in_head_chunks_matches_the_definition() {
    // 2 heads of 5800 × 5800 scores exceed the 256 MiB a chunk may hold: one head per chunk.
    let (s, d) = (5800, 16);
    let q = random::normal(&[1, 2, s, d], Dtype::F32, &random::key(11).unwrap()).unwrap();
    let k = random::normal(&[1, 2, s, d], Dtype::F32, &random::key(12).unwrap()).unwrap();
    let v = random::normal(&[1, 2, s, d], Dtype::F32, &random::key(13).unwrap()).unwrap();
    let scale = 0.25;
    let got = fast::scaled_dot_product_attention(&q, &k, &v, scale, fast::Mask::None).unwrap();
    let scores = (q.matmul(&k.transpose(&[0, 1, 3, 2]).unwrap()).unwrap() * scale).unwrap();
    let want = scores.softmax(&[3], true).unwrap().matmul(&v).unwrap();
    assert_eq!(got.shape(), vec![1, 2, s, d]);
    let diff = max_abs_diff(&got, &want);
    assert!(diff < 1e-5, "off by {diff}");
}

#[test]
fn grouped_causal_attention_matches_the_definition() {
    // 4 query heads over 2 kv heads; 5 queries against 7 keys, aligned to the last keys.
    let (h, kvh, l, s, d) = (4, 2, 5, 7, 8);
    let q = random::normal(&[1, h, l, d], Dtype::F32, &random::key(21).unwrap()).unwrap();
    let k = random::normal(&[1, kvh, s, d], Dtype::F32, &random::key(22).unwrap()).unwrap();
    let v = random::normal(&[1, kvh, s, d], Dtype::F32, &random::key(23).unwrap()).unwrap();
    let scale = 1.0 / (d as f32).sqrt();
    // The definition: query head j reads kv head j / 2; query i sees keys up to i + s − l.
    let per_head = |t: &Array| -> Array {
        let heads: Vec<Array> = (0..h)
            .map(|j| t.slice_axis(1, j / (h / kvh), j / (h / kvh) + 1).unwrap())
            .collect();
        ops::concatenate(&heads.iter().collect::<Vec<_>>(), 1).unwrap()
    };
    let bias: Vec<f32> = (0..l)
        .flat_map(|i| {
            (0..s).map(move |j| {
                if j <= i + s - l {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    let definition = |q: &Array, k: &Array, v: &Array| -> Array {
        let scores = (q
            .matmul(&per_head(k).transpose(&[0, 1, 3, 2]).unwrap())
            .unwrap()
            * scale)
            .unwrap();
        let scores = (scores + Array::from_slice(&bias, &[l, s]).unwrap()).unwrap();
        scores
            .softmax(&[3], true)
            .unwrap()
            .matmul(&per_head(v))
            .unwrap()
    };

    let got = fast::scaled_dot_product_attention(&q, &k, &v, scale, fast::Mask::Causal).unwrap();
    assert_eq!(got.shape(), vec![1, h, l, d]);
    let diff = max_abs_diff(&got, &definition(&q, &k, &v));
    assert!(diff < 1e-5, "f32: off by {diff}");

    // bf16 inputs: within the bf16 rounding of the weights and the output of the f32 definition.
    let (qb, kb, vb) = (
        q.astype(Dtype::BF16).unwrap(),
        k.astype(Dtype::BF16).unwrap(),
        v.astype(Dtype::BF16).unwrap(),
    );
    let got = fast::scaled_dot_product_attention(&qb, &kb, &vb, scale, fast::Mask::Causal).unwrap();
    assert_eq!(got.dtype(), Dtype::BF16);
    let up = |t: &Array| t.astype(Dtype::F32).unwrap();
    let diff = max_abs_diff(&got, &definition(&up(&qb), &up(&kb), &up(&vb)));
    assert!(diff < 2e-2, "bf16: off by {diff}");
}

#[test]
fn group_norm_matches_its_definition() {
    // 2 images of 9×7 pixels, 12 channels in 3 groups of 4 consecutive channels.
    let (b, h, w, c, g) = (2, 9, 7, 12, 3);
    let x = (random::normal(&[b, h, w, c], Dtype::F32, &random::key(31).unwrap()).unwrap() * 3.0)
        .unwrap();
    let x = (x + 5.0).unwrap(); // an offset, so that the variance is not the mean square
    let weight = random::normal(&[c], Dtype::F32, &random::key(32).unwrap()).unwrap();
    let bias = random::normal(&[c], Dtype::F32, &random::key(33).unwrap()).unwrap();
    // The definition, in f64 on the host, from the values as the dtype holds them.
    let (pixels, c, per) = ((h * w) as usize, c as usize, (c / g) as usize);
    let definition = |x: &Array, weight: &Array, bias: &Array| -> Vec<f32> {
        let host = |a: &Array| a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
        let (xs, ws, bs) = (host(x), host(weight), host(bias));
        let mut want = vec![0f32; xs.len()];
        for n in 0..b as usize {
            for grp in 0..g as usize {
                let vals = || {
                    (0..pixels).flat_map(move |p| {
                        (0..per).map(move |k| (n * pixels + p) * c + grp * per + k)
                    })
                };
                let count = (pixels * per) as f64;
                let mean = vals().map(|i| xs[i] as f64).sum::<f64>() / count;
                let var = vals().map(|i| (xs[i] as f64 - mean).powi(2)).sum::<f64>() / count;
                for i in vals() {
                    let ch = i % c;
                    want[i] = (((xs[i] as f64 - mean) / (var + 1e-6).sqrt()) * ws[ch] as f64
                        + bs[ch] as f64) as f32;
                }
            }
        }
        want
    };
    let silu = |v: f32| v / (1.0 + (-v).exp());
    for (dtype, tol) in [(Dtype::F32, 2e-5), (Dtype::BF16, 4e-2)] {
        let xd = x.astype(dtype).unwrap();
        let (wd, bd) = (weight.astype(dtype).unwrap(), bias.astype(dtype).unwrap());
        let want = definition(&xd, &wd, &bd);
        for fused_silu in [false, true] {
            let got = fast::group_norm(&xd, &wd, &bd, g, 1e-6, fused_silu).unwrap();
            assert_eq!((got.shape(), got.dtype()), (x.shape(), dtype));
            let got = got.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, e)| (a - if fused_silu { silu(*e) } else { *e }).abs())
                .fold(0f32, f32::max);
            assert!(worst < tol, "{dtype:?}, silu {fused_silu}: off by {worst}");
        }
    }
    // Channels that the groups do not divide are refused with MLX-style context.
    let err = fast::group_norm(&x, &weight, &bias, 5, 1e-6, false).unwrap_err();
    assert!(err.to_string().contains("groups"), "{err}");
    let short = weight.slice_axis(0, 0, 6).unwrap();
    let err = fast::group_norm(&x, &short, &bias, g, 1e-6, false).unwrap_err();
    assert!(err.to_string().contains("one value per channel"), "{err}");
}

#[test]
fn shapes_with_a_negative_dimension_are_refused_before_reaching_mlx() {
    let err = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[-2, -2]).unwrap_err();
    assert!(err.message.contains("negative"), "{err}");
    let err = Array::from_bytes(&[0u8; 16], &[-1, -4], Dtype::F32).unwrap_err();
    assert!(err.message.contains("negative"), "{err}");
}

#[test]
fn shapes_whose_element_count_overflows_are_refused_without_a_panic() {
    let huge = [i32::MAX, i32::MAX, i32::MAX];
    let err = Array::from_slice(&[1.0f32], &huge).unwrap_err();
    assert!(err.message.contains("more elements"), "{err}");
    let err = Array::from_bytes(&[0u8; 4], &[i32::MAX, i32::MAX, 4], Dtype::F32).unwrap_err();
    assert!(err.message.contains("more"), "{err}");
}

#[test]
fn blas_sgemm_refuses_sizes_whose_products_overflow_or_exceed_an_int() {
    let err = mlx::blas_sgemm(usize::MAX, 2, 2, &[], &[0.0; 4], &mut []).unwrap_err();
    assert!(err.contains("do not"), "{err}");
    let big = i32::MAX as usize + 1;
    let err = mlx::blas_sgemm(big, 0, 0, &[], &[], &mut []).unwrap_err();
    assert!(err.contains("int"), "{err}");
}

#[test]
fn additive_masks_attend_as_the_definition() {
    // T5's case: a per-head f32 bias [1, H, L, S]; one shared by the heads ([L, S]) and one per
    // batch row ([B, 1, L, S]); grouped kv heads; and a boolean mask, which MLX applies.
    let normal = |shape: &[i32], seed| {
        random::normal(shape, Dtype::F32, &random::key(seed).unwrap()).unwrap()
    };
    let (b, h, kv, l, s, d) = (2, 4, 2, 7, 9, 8);
    let q = normal(&[b, h, l, d], 21);
    let k = normal(&[b, kv, s, d], 22);
    let v = normal(&[b, kv, s, d], 23);
    let scale = 0.3;
    // Each kv head serves h / kv query heads.
    let widen = |t: &Array| {
        t.reshape(&[b, kv, 1, s, d])
            .unwrap()
            .broadcast_to(&[b, kv, h / kv, s, d])
            .unwrap()
            .reshape(&[b, h, s, d])
            .unwrap()
    };
    let (kw, vw) = (widen(&k), widen(&v));
    let want = |mask: &Array| {
        let scores = (q.matmul(&kw.transpose(&[0, 1, 3, 2]).unwrap()).unwrap() * scale).unwrap();
        ((scores + mask).unwrap().softmax(&[3], true).unwrap())
            .matmul(&vw)
            .unwrap()
    };
    for mask in [
        normal(&[1, h, l, s], 24),
        normal(&[l, s], 25),
        normal(&[b, 1, l, s], 26),
    ] {
        let got = fast::scaled_dot_product_attention(&q, &k, &v, scale, fast::Mask::Array(&mask))
            .unwrap();
        assert_eq!(got.shape(), vec![b, h, l, d]);
        let diff = max_abs_diff(&got, &want(&mask));
        assert!(diff < 1e-5, "{:?}: off by {diff}", mask.shape());
    }
    let zero = Array::full(&[], 0.0, Dtype::F32).unwrap();
    let keep = ops::greater(&normal(&[1, 1, l, s], 27), &zero).unwrap();
    let never = Array::full(&[], f32::NEG_INFINITY, Dtype::F32).unwrap();
    let additive = ops::where_(&keep, &zero, &never).unwrap();
    let got = fast::scaled_dot_product_attention(&q, &k, &v, scale, fast::Mask::Array(&keep));
    let diff = max_abs_diff(&got.unwrap(), &want(&additive));
    assert!(diff < 1e-5, "boolean mask: off by {diff}");
}

#[test]
fn tanh_gelu_is_torchs_formula_rounded_once() {
    // Across the range, past where the exponent is clamped, and at zero; in f32, then in bf16
    // (computed in f32 from the rounded input, rounded once).
    let xs: Vec<f32> = (-900..900)
        .map(|i| i as f32 * 0.013)
        .chain([-120.0, -30.0, 0.0, 30.0, 120.0])
        .collect();
    let gelu = |v: f64| {
        let u = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
        0.5 * v * (1.0 + u.tanh())
    };
    let x = arr(&xs, &[xs.len() as i32]);
    let got = x.gelu_tanh().unwrap().to_vec::<f32>().unwrap();
    for (v, g) in xs.iter().zip(&got) {
        let want = gelu(*v as f64);
        let err = (*g as f64 - want).abs() / want.abs().max(1e-3);
        assert!(err < 1e-5, "gelu({v}) = {g}, want {want}");
    }
    let narrow = x.astype(Dtype::BF16).unwrap();
    let got = narrow.gelu_tanh().unwrap();
    assert_eq!(got.dtype(), Dtype::BF16);
    let want = (narrow.astype(Dtype::F32).unwrap().gelu_tanh().unwrap())
        .astype(Dtype::BF16)
        .unwrap();
    assert_eq!(max_abs_diff(&got, &want), 0.0);
}
