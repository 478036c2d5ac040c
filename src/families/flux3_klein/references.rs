//! FLUX.3's reference pictures (the spec §4): one reference is kept whole, scaled under 4
//! megapixels and reflect-padded to the grid, and the picture made from it is cropped back to
//! its own size; several are each scaled under 1 megapixel and centre-cropped to the grid.

use crate::pipeline::reference::Reference;

/// The grid references are padded or cropped to: diffusers' `Flux3ImageProcessor` default
/// (its own constant, not the VAE's scale).
pub const GRID: u32 = 16;
/// The most pixels a single reference's canvas may hold.
const ONE_MAX_PIXELS: f64 = 4.0 * 1024.0 * 1024.0;
/// The longest side of a single reference's canvas, and its shortest.
const ONE_MAX_SIDE: u32 = 4096;
const ONE_MIN_SIDE: u32 = 64;
/// The most pixels each of several references keeps.
const EACH_MAX_PIXELS: f64 = 1024.0 * 1024.0;
/// The most reference pictures one request may give.
pub const MAX_REFERENCES: usize = 10;

/// Where the picture a single reference is padded into sits in its canvas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crop {
    pub left: u32,
    pub top: u32,
    pub width: u32,
    pub height: u32,
}

impl Crop {
    /// The crop of an RGB picture `full_width` wide.
    pub fn apply(&self, rgb: &[u8], full_width: u32) -> Vec<u8> {
        let row = |y: u32| {
            let start = ((y * full_width + self.left) * 3) as usize;
            &rgb[start..start + (self.width * 3) as usize]
        };
        (self.top..self.top + self.height)
            .flat_map(row)
            .copied()
            .collect()
    }
}

/// A request's references, prepared, and the crop of the output (a single reference's box;
/// `None` with several, or when the request names its size).
#[derive(Debug, Clone, Default)]
pub struct Prepared {
    pub pictures: Vec<Reference>,
    pub crop: Option<Crop>,
}

impl Prepared {
    /// `images` (each with its label for messages) prepared as diffusers prepares `image`.
    pub fn new(images: &[(&image::DynamicImage, &str)]) -> Result<Prepared, String> {
        if images.len() > MAX_REFERENCES {
            return Err(format!(
                "{} reference pictures given; {} takes at most {MAX_REFERENCES}",
                images.len(),
                super::family().name()
            ));
        }
        if let [(image, label)] = images {
            let (picture, crop) = fill(image, label)?;
            return Ok(Prepared {
                pictures: vec![picture],
                crop: Some(crop),
            });
        }
        let pictures = (images.iter())
            .map(|(image, label)| cropped(image, label))
            .collect::<Result<_, _>>()?;
        Ok(Prepared {
            pictures,
            crop: None,
        })
    }
}

/// A canvas side: rounded up to the grid, then within [64, 4096].
fn canvas_side(side: u32) -> u32 {
    side.div_ceil(GRID)
        .saturating_mul(GRID)
        .clamp(ONE_MIN_SIDE, ONE_MAX_SIDE)
}

/// Python's `round` (half to even) of a non-negative value.
fn round_half_even(x: f64) -> u32 {
    let r = x.round();
    let r = if (x - x.trunc() - 0.5).abs() == 0.0 && r % 2.0 != 0.0 {
        r - 1.0
    } else {
        r
    };
    r as u32
}

/// One reference kept whole: scaled until its canvas fits, then reflect-padded to the canvas,
/// centred; the box it fills is the output's crop.
fn fill(image: &image::DynamicImage, label: &str) -> Result<(Reference, Crop), String> {
    let (w, h) = (image.width(), image.height());
    if w == 0 || h == 0 {
        return Err(format!("{label} is {w}×{h}; a reference needs pixels"));
    }
    let mut rgb = image.to_rgb8();
    let ((sw, sh), (cw, ch), (left, top)) = fill_geometry(w, h);
    if (sw, sh) != (w, h) {
        rgb = crate::resample::lanczos3(&rgb, sw, sh);
    }
    // numpy's "reflect" (the edge pixel not repeated) when both sides exceed 16 pixels, else
    // "symmetric" (repeated).
    let repeat_edge = sw.min(sh) <= 16;
    let src = |canvas: u32, offset: u32, n: u32| {
        mirror(canvas as i64 - offset as i64, n as i64, repeat_edge)
    };
    let mut out = Vec::with_capacity((cw * ch * 3) as usize);
    for y in 0..ch {
        let sy = src(y, top, sh);
        for x in 0..cw {
            let sx = src(x, left, sw);
            out.extend_from_slice(&rgb.get_pixel(sx, sy).0);
        }
    }
    let picture = Reference {
        rgb: out,
        width: cw,
        height: ch,
    };
    let crop = Crop {
        left,
        top,
        width: sw,
        height: sh,
    };
    Ok((picture, crop))
}

/// A single `w × h` reference's geometry: the size it is scaled to (shrunk by 0.5% at a time
/// until its canvas fits under 4 megapixels), its canvas, and where it sits in the canvas.
pub fn fill_geometry(w: u32, h: u32) -> ((u32, u32), (u32, u32), (u32, u32)) {
    let (wf, hf) = (w as f64, h as f64);
    let mut s = 1f64
        .min((ONE_MAX_PIXELS / (wf * hf)).sqrt())
        .min(ONE_MAX_SIDE as f64 / wf.max(hf));
    let (sw, sh) = loop {
        let (sw, sh) = (
            round_half_even(wf * s).max(1),
            round_half_even(hf * s).max(1),
        );
        if canvas_side(sw) as f64 * canvas_side(sh) as f64 <= ONE_MAX_PIXELS {
            break (sw, sh);
        }
        s *= 0.995;
    };
    let (cw, ch) = (canvas_side(sw), canvas_side(sh));
    ((sw, sh), (cw, ch), ((cw - sw) / 2, (ch - sh) / 2))
}

/// The index `i` (possibly outside `0..n`) mirrored into it, as numpy pads.
fn mirror(mut i: i64, n: i64, repeat_edge: bool) -> u32 {
    if n == 1 {
        return 0;
    }
    loop {
        if i < 0 {
            i = if repeat_edge { -i - 1 } else { -i };
        } else if i >= n {
            i = if repeat_edge {
                2 * n - 1 - i
            } else {
                2 * (n - 1) - i
            };
        } else {
            return i as u32;
        }
    }
}

/// One of several references: scaled under 1 megapixel (each side truncated), then
/// centre-cropped to the grid.
fn cropped(image: &image::DynamicImage, label: &str) -> Result<Reference, String> {
    let (w, h) = (image.width(), image.height());
    let mut rgb = image.to_rgb8();
    if w as f64 * h as f64 > EACH_MAX_PIXELS {
        let s = (EACH_MAX_PIXELS / (w as f64 * h as f64)).sqrt();
        let (sw, sh) = ((w as f64 * s) as u32, (h as f64 * s) as u32);
        rgb = crate::resample::lanczos3(&rgb, sw, sh);
    }
    let (w, h) = rgb.dimensions();
    let (cw, ch) = (w - w % GRID, h - h % GRID);
    if cw == 0 || ch == 0 {
        return Err(format!(
            "{label} is {w}×{h}; a reference needs at least {GRID} pixels each way"
        ));
    }
    let (left, top) = ((w - cw) / 2, (h - ch) / 2);
    let rgb = image::imageops::crop_imm(&rgb, left, top, cw, ch).to_image();
    Ok(Reference {
        rgb: rgb.into_raw(),
        width: cw,
        height: ch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_reference_is_scaled_and_padded_as_diffusers_does() {
        // (size in, scaled size, canvas, offset), from the spec's checked examples.
        let cases = [
            ((100, 70), (100, 70), (112, 80), (6, 5)),
            ((1000, 700), (1000, 700), (1008, 704), (4, 2)),
            ((40, 30), (40, 30), (64, 64), (12, 17)),
            ((2500, 1700), (2471, 1680), (2480, 1680), (4, 0)),
            ((5000, 900), (4096, 737), (4096, 752), (0, 7)),
            ((2049, 2047), (2039, 2037), (2048, 2048), (4, 5)),
        ];
        for ((w, h), scaled, canvas, offset) in cases {
            assert_eq!(fill_geometry(w, h), (scaled, canvas, offset), "{w}×{h}");
        }
    }

    #[test]
    fn padding_mirrors_as_numpy_does() {
        // "reflect" skips the edge, "symmetric" repeats it.
        let reflect: Vec<u32> = (-3..7).map(|i| mirror(i, 4, false)).collect();
        assert_eq!(reflect, [3, 2, 1, 0, 1, 2, 3, 2, 1, 0]);
        let symmetric: Vec<u32> = (-3..7).map(|i| mirror(i, 4, true)).collect();
        assert_eq!(symmetric, [2, 1, 0, 0, 1, 2, 3, 3, 2, 1]);
    }

    #[test]
    fn the_crop_takes_the_box() {
        let rgb: Vec<u8> = (0..4 * 3 * 3).map(|v| v as u8).collect();
        let crop = Crop {
            left: 1,
            top: 1,
            width: 2,
            height: 1,
        };
        assert_eq!(crop.apply(&rgb, 4), [15, 16, 17, 18, 19, 20]);
    }
}
