//! Resizing 8-bit pictures exactly as Pillow's `Image.resize(…, LANCZOS)` does, which is what
//! diffusers' image processors call: the same filter windows, the same weights rounded to the
//! same fixed point, the same rounding of every sum, one axis at a time in Pillow's order.
//! A resized input therefore has Pillow's bytes, so a mask's edge that lands on a token cell's
//! centre binarises as diffusers' does.
//!
//! Mirrors Pillow 13's `libImaging/Resample.c` (`precompute_coeffs`, `normalize_coeffs_8bpc`,
//! `ImagingResampleHorizontal_8bpc`, `ImagingResampleVertical_8bpc`) for an unboxed resize.

use image::{ImageBuffer, Pixel};

/// Fraction bits of the fixed-point weights (Pillow: 32 − 8 − 2).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Lanczos-3's reach, in source pixels at scale 1.
const SUPPORT: f64 = 3.0;

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * std::f64::consts::PI;
    x.sin() / x
}

fn lanczos(x: f64) -> f64 {
    if (-SUPPORT..SUPPORT).contains(&x) {
        sinc(x) * sinc(x / SUPPORT)
    } else {
        0.0
    }
}

/// For each output position along an axis of `input` source pixels resized to `output`: the
/// first source pixel it reads and its fixed-point weights, one per source pixel from there.
fn coefficients(input: u32, output: u32) -> Vec<(usize, Vec<i32>)> {
    let scale = input as f64 / output as f64;
    // Downscaling widens the filter, which antialiases; upscaling keeps it at its own width.
    let filter_scale = scale.max(1.0);
    let support = SUPPORT * filter_scale;
    (0..output)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            // Pillow truncates toward zero (a C cast), then clamps to the image.
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).min(input as i64) as usize;
            let weights: Vec<f64> = (first..end)
                .map(|x| lanczos((x as f64 - center + 0.5) / filter_scale))
                .collect();
            let total: f64 = weights.iter().sum();
            let unit = (1u64 << PRECISION_BITS) as f64;
            let fixed = weights
                .iter()
                .map(|w| if total != 0.0 { w / total } else { *w })
                .map(|w| match w < 0.0 {
                    true => (-0.5 + w * unit) as i32,
                    false => (0.5 + w * unit) as i32,
                })
                .collect();
            (first, fixed)
        })
        .collect()
}

/// A fixed-point sum back to a byte, as Pillow's `clip8` does.
fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// The value at output position `xx` of one line of one channel, from the line's weights;
/// `at(x)` reads the line's source pixel `x`.
fn sample(coeffs: &[(usize, Vec<i32>)], xx: usize, at: impl Fn(usize) -> u8) -> u8 {
    let (first, weights) = &coeffs[xx];
    let mut sum: i64 = 1 << (PRECISION_BITS - 1);
    for (k, w) in weights.iter().enumerate() {
        sum += i64::from(at(first + k)) * i64::from(*w);
    }
    clip8(sum)
}

/// The two passes of a resize.
#[derive(Clone, Copy)]
enum Axis {
    Across,
    Down,
}

/// Each row of `data` (`w`×`h` pixels of `channels` bytes) resized to `to` pixels.
fn across(data: &[u8], (w, h): (usize, usize), to: usize, channels: usize) -> Vec<u8> {
    let coeffs = coefficients(w as u32, to as u32);
    let mut out = vec![0u8; to * h * channels];
    for y in 0..h {
        let line = &data[y * w * channels..(y + 1) * w * channels];
        for xx in 0..to {
            for c in 0..channels {
                out[(y * to + xx) * channels + c] = sample(&coeffs, xx, |x| line[x * channels + c]);
            }
        }
    }
    out
}

/// Each column of `data` (`w`×`h` pixels of `channels` bytes) resized to `to` pixels.
fn down(data: &[u8], (w, h): (usize, usize), to: usize, channels: usize) -> Vec<u8> {
    let coeffs = coefficients(h as u32, to as u32);
    let row = w * channels;
    let mut out = vec![0u8; to * row];
    for yy in 0..to {
        for x in 0..w {
            for c in 0..channels {
                let at = |y: usize| data[y * row + x * channels + c];
                out[yy * row + x * channels + c] = sample(&coeffs, yy, at);
            }
        }
    }
    out
}

/// `img` resized to `width`×`height` with Pillow's Lanczos (returned as it is when it already
/// has that size).
pub fn lanczos3<P: Pixel<Subpixel = u8> + 'static>(
    img: &ImageBuffer<P, Vec<u8>>,
    width: u32,
    height: u32,
) -> ImageBuffer<P, Vec<u8>> {
    let (w, h) = img.dimensions();
    let channels = P::CHANNEL_COUNT as usize;
    let mut data = img.as_raw().clone();
    let mut cur = (w as usize, h as usize);
    // Pillow runs the vertical pass first when the height shrinks by more than twice as many
    // pixels as the width does; otherwise across first. The order changes the rounding.
    let shrink = |from: u32, to: u32| i64::from(from) - i64::from(to);
    let vertical_first = shrink(h, height) > 0 && shrink(h, height) > shrink(w, width) * 2;
    let passes = match vertical_first {
        true => [Axis::Down, Axis::Across],
        false => [Axis::Across, Axis::Down],
    };
    for axis in passes {
        match axis {
            Axis::Across if width != w => {
                data = across(&data, cur, width as usize, channels);
                cur.0 = width as usize;
            }
            Axis::Down if height != h => {
                data = down(&data, cur, height as usize, channels);
                cur.1 = height as usize;
            }
            _ => {}
        }
    }
    ImageBuffer::from_raw(width, height, data).expect("one value per channel of every pixel")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point() {
        for (input, output) in [(100, 96), (75, 72), (64, 200), (1000, 7)] {
            for (_, w) in coefficients(input, output) {
                let total: i64 = w.iter().map(|&k| i64::from(k)).sum();
                assert!(
                    (total - (1 << PRECISION_BITS)).abs() <= w.len() as i64,
                    "{total}"
                );
            }
        }
    }

    #[test]
    fn a_flat_picture_stays_flat_and_the_same_size_is_untouched() {
        let flat = image::GrayImage::from_pixel(37, 21, image::Luma([200]));
        let out = lanczos3(&flat, 16, 50);
        assert!(out.pixels().all(|p| p.0[0] == 200));
        let same = lanczos3(&flat, 37, 21);
        assert_eq!(same, flat);
    }

    /// Pillow 13's `Image.resize((4, 2), Image.LANCZOS)` of this 7×3 "L" ramp (downscaling).
    #[test]
    fn matches_pillow_on_a_grey_ramp() {
        let ramp = image::GrayImage::from_fn(7, 3, |x, y| image::Luma([(x * 35 + y * 10) as u8]));
        let out = lanczos3(&ramp, 4, 2);
        assert_eq!(out.into_raw(), vec![16, 76, 140, 200, 30, 90, 154, 214]);
    }

    /// Pillow 13's `Image.resize((13, 3), Image.LANCZOS)` of a 9×5 RGB pattern (up across,
    /// down the other way; negative lobes clipped).
    #[test]
    fn matches_pillow_on_rgb_up_and_down() {
        let img = image::RgbImage::from_fn(9, 5, |x, y| {
            let a = ((x * 37 + y * 91) % 256) as u8;
            image::Rgb([a, 255 - a, ((a as u32 * 3) % 256) as u8])
        });
        assert_eq!(lanczos3(&img, 13, 3).into_raw(), PILLOW_RGB_13X3.to_vec());
    }

    const PILLOW_RGB_13X3: [u8; 117] = [
        41, 214, 0, 58, 197, 43, 90, 165, 165, 115, 140, 245, 137, 118, 132, 173, 82, 101, 187, 68,
        189, 122, 133, 79, 116, 139, 83, 138, 117, 156, 62, 193, 35, 54, 201, 52, 89, 166, 138,
        123, 132, 22, 160, 95, 100, 147, 108, 139, 59, 196, 59, 58, 197, 60, 116, 139, 169, 145,
        110, 240, 119, 136, 113, 121, 134, 109, 149, 106, 185, 133, 122, 64, 148, 107, 81, 173, 82,
        167, 63, 192, 49, 80, 175, 137, 111, 144, 150, 135, 120, 19, 181, 74, 83, 144, 111, 149,
        62, 193, 100, 87, 168, 83, 150, 105, 163, 151, 104, 212, 82, 173, 92, 77, 178, 110, 111,
        144, 196,
    ];
}
