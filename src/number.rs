//! The one check every number a request gives goes through before it is used: finite, not
//! subnormal, and within the setting's range. A subnormal value (below 1.2e-38, f32's smallest
//! normal number) is no setting anyone means, and image routines assert that theirs are normal
//! (a Gaussian blur's sigma), so it is refused with the rest rather than let through to them.

use std::ops::RangeBounds;

/// Whether `value` is finite, zero or normal as an f32, and within `range`.
pub fn within(value: impl Into<f64>, range: impl RangeBounds<f64>) -> bool {
    let v = value.into();
    let normal = v == 0.0 || (v as f32).is_normal();
    v.is_finite() && normal && range.contains(&v)
}

/// The range `(low, high]`, open below, as strengths and scales take it.
pub fn above(low: f64, high: f64) -> (std::ops::Bound<f64>, std::ops::Bound<f64>) {
    use std::ops::Bound::{Excluded, Included};
    (Excluded(low), Included(high))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnormal_nan_and_out_of_range_values_are_refused() {
        assert!(within(0.0f32, 0.0..=64.0));
        assert!(within(64.0f32, 0.0..=64.0));
        assert!(!within(1e-40f32, 0.0..=64.0));
        assert!(!within(-1e-40f32, -1.0..=1.0));
        assert!(!within(f32::NAN, 0.0..=64.0));
        assert!(!within(f64::INFINITY, 0.0..));
        assert!(!within(64.5f32, 0.0..=64.0));
        assert!(within(1.0, above(0.0, 1.0)));
        assert!(!within(0.0, above(0.0, 1.0)));
        assert!(!within(1e-300, above(0.0, 1.0)));
    }
}
