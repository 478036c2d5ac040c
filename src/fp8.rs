//! The 8-bit floats checkpoints are published in (ComfyUI's `float8_e4m3fn` and `float8_e5m2`,
//! safetensors' `F8_E4M3` and `F8_E5M2`). MLX has no 8-bit float arrays; both formats fit
//! bf16 exactly (fewer exponent and mantissa bits), so an import widens them to bf16 without
//! losing a bit. A "scaled" fp8 file multiplies each weight by a scale tensor stored beside
//! it; those scales are not read, and such a file is refused by name rather than imported
//! wrong.

use crate::dtype::Dtype;

/// Whether `d` is one of the two 8-bit float formats read.
pub fn is_fp8(d: Dtype) -> bool {
    matches!(d, Dtype::F8_E4M3 | Dtype::F8_E5M2)
}

/// `float8_e4m3fn`: bias 7, no infinities, `S.1111.111` is NaN.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 3) & 0x0f, (b & 0x07) as f32);
    let magnitude = match (e, b & 0x07) {
        (0x0f, 0x07) => f32::NAN,
        (0, _) => m / 8.0 * 2f32.powi(-6),
        _ => (1.0 + m / 8.0) * 2f32.powi(e as i32 - 7),
    };
    sign * magnitude
}

/// `float8_e5m2`: IEEE-style, bias 15, an all-ones exponent infinity (mantissa 0) or NaN.
pub fn e5m2_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 2) & 0x1f, (b & 0x03) as f32);
    let magnitude = match (e, b & 0x03) {
        (0x1f, 0) => f32::INFINITY,
        (0x1f, _) => f32::NAN,
        (0, _) => m / 4.0 * 2f32.powi(-14),
        _ => (1.0 + m / 4.0) * 2f32.powi(e as i32 - 15),
    };
    sign * magnitude
}

/// One element of an fp8 dtype as f32.
pub fn to_f32(b: u8, d: Dtype) -> f32 {
    match d {
        Dtype::F8_E5M2 => e5m2_to_f32(b),
        _ => e4m3_to_f32(b),
    }
}

/// Why a scale tensor is refused, after its name.
pub const SCALE_REFUSAL: &str = "is a scale of a scaled-fp8 checkpoint, which zimage does not read (its weights would import without their scales); use the plain fp8 file, a bf16 one, or `--quantize` on a bf16 one";

/// The first tensor among `names` that is a scaled-fp8 checkpoint's scale or marker
/// (ComfyUI's `scaled_fp8`, `….scale_weight`, `….scale_input`; the `….weight_scale` and
/// `….input_scale` of other fp8 exporters), which the import does not apply.
pub fn unread_scale<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    names.into_iter().find(|n| {
        let last = n.rsplit('.').next().unwrap_or(n);
        matches!(
            last,
            "scaled_fp8" | "scale_weight" | "scale_input" | "weight_scale" | "input_scale"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_e4m3_value_widens_as_torch_does() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert!(e4m3_to_f32(0x7f).is_nan());
        // Every value fits bf16 exactly.
        for b in 0..=255u8 {
            let v = e4m3_to_f32(b);
            assert!(
                v.is_nan() || half::bf16::from_f32(v).to_f32() == v,
                "{b:#x}"
            );
        }
    }

    #[test]
    fn every_e5m2_value_widens_as_torch_does() {
        assert_eq!(e5m2_to_f32(0x3c), 1.0);
        assert_eq!(e5m2_to_f32(0x7b), 57344.0);
        assert_eq!(e5m2_to_f32(0x7c), f32::INFINITY);
        assert!(e5m2_to_f32(0x7d).is_nan());
        assert_eq!(e5m2_to_f32(0x01), 2f32.powi(-16));
        for b in 0..=255u8 {
            let v = e5m2_to_f32(b);
            assert!(
                !v.is_finite() || half::bf16::from_f32(v).to_f32() == v,
                "{b:#x}"
            );
        }
    }

    #[test]
    fn scale_tensors_are_found_by_name() {
        let names = ["a.weight", "double_blocks.0.img_attn.qkv.scale_weight"];
        assert_eq!(
            unread_scale(names),
            Some("double_blocks.0.img_attn.qkv.scale_weight")
        );
        assert_eq!(unread_scale(["a.weight", "scaled_fp8"]), Some("scaled_fp8"));
        assert_eq!(unread_scale(["norm.scale", "a.weight"]), None);
    }
}
