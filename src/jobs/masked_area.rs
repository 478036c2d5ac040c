//! Inpainting the masked area alone ("only masked", A1111's `inpaint_full_res`): the part of the
//! picture around the mask is cut out, grown to the image's aspect ratio, inpainted at the
//! image's full size, scaled back and pasted where the mask is. A small masked area gets all
//! the image's pixels, and the picture outside the mask is kept exactly.

use image::{GrayImage, RgbImage};

/// A rectangle of the picture, in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// The left edge.
    pub x: u32,
    /// The top edge.
    pub y: u32,
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
}

/// The picture at the image's size, its mask (1 repaints) and the region inpainted.
#[derive(Debug, Clone)]
pub struct MaskedArea {
    picture: RgbImage,
    mask: Vec<u8>,
    /// The region inpainted, in the picture's pixels.
    pub region: Region,
}

impl MaskedArea {
    /// The area of `mask` (one 0/1 value per pixel of `picture`) with `padding` pixels around
    /// it, grown to the aspect ratio of `width`×`height` (the size the area is inpainted at).
    pub fn new(
        picture: RgbImage,
        mask: Vec<u8>,
        padding: u32,
        (width, height): (u32, u32),
    ) -> Result<MaskedArea, String> {
        let (w, h) = picture.dimensions();
        let region = masked_region(&mask, w, h, padding, width as f64 / height as f64)
            .ok_or("the mask marks nothing to repaint; paint the area to inpaint white")?;
        Ok(MaskedArea {
            picture,
            mask,
            region,
        })
    }

    /// The region's picture and mask at `width`×`height`, as the pipeline takes them.
    pub fn input(&self, width: u32, height: u32) -> (Vec<u8>, Vec<u8>) {
        let r = self.region;
        let picture = image::imageops::crop_imm(&self.picture, r.x, r.y, r.width, r.height);
        let picture = crate::resample::lanczos3(&picture.to_image(), width, height);
        let mask = self.region_mask();
        let mask = crate::resample::lanczos3(&mask, width, height);
        // Cut at half, as a mask given at the image's size is.
        let mask = mask
            .into_raw()
            .into_iter()
            .map(|v| u8::from(v >= 128))
            .collect();
        (picture.into_raw(), mask)
    }

    /// The picture with the inpainted region (`rgb`, `width`×`height`) scaled back into place
    /// where the mask repaints; elsewhere the picture as it was.
    pub fn paste(&self, rgb: Vec<u8>, width: u32, height: u32) -> Option<Vec<u8>> {
        let r = self.region;
        let made = RgbImage::from_raw(width, height, rgb)?;
        let made = crate::resample::lanczos3(&made, r.width, r.height);
        let mut out = self.picture.clone();
        let full_width = self.picture.width() as usize;
        for (x, y, p) in made.enumerate_pixels() {
            let (px, py) = (r.x + x, r.y + y);
            if self.mask[py as usize * full_width + px as usize] != 0 {
                out.put_pixel(px, py, *p);
            }
        }
        Some(out.into_raw())
    }

    /// The mask over the region, 0 or 255 per pixel.
    fn region_mask(&self) -> GrayImage {
        let r = self.region;
        let full_width = self.picture.width() as usize;
        GrayImage::from_fn(r.width, r.height, |x, y| {
            let i = (r.y + y) as usize * full_width + (r.x + x) as usize;
            image::Luma([if self.mask[i] != 0 { 255 } else { 0 }])
        })
    }
}

/// The bounding box of the mask's set pixels, `padding` wider each way, grown along its short
/// side to `aspect` (width / height) around its centre and moved (then cut) to lie inside the
/// `width`×`height` picture. `None` for an empty mask.
pub fn masked_region(
    mask: &[u8],
    width: u32,
    height: u32,
    padding: u32,
    aspect: f64,
) -> Option<Region> {
    let (mut x0, mut y0, mut x1, mut y1) = (u32::MAX, u32::MAX, 0u32, 0u32);
    for (i, &m) in mask.iter().enumerate() {
        if m != 0 {
            let (x, y) = ((i % width as usize) as u32, (i / width as usize) as u32);
            (x0, y0, x1, y1) = (x0.min(x), y0.min(y), x1.max(x + 1), y1.max(y + 1));
        }
    }
    if x0 == u32::MAX {
        return None;
    }
    let (x0, y0) = (x0.saturating_sub(padding), y0.saturating_sub(padding));
    let (x1, y1) = ((x1 + padding).min(width), (y1 + padding).min(height));
    let (bw, bh) = ((x1 - x0) as f64, (y1 - y0) as f64);
    // Grow the side that is short of the aspect; each side at most the picture's.
    let (want_w, want_h) = match bw / bh > aspect {
        true => (bw, bw / aspect),
        false => (bh * aspect, bh),
    };
    let (rw, rh) = (
        (want_w.round() as u32).clamp(1, width),
        (want_h.round() as u32).clamp(1, height),
    );
    let place = |start: u32, end: u32, size: u32, limit: u32| -> u32 {
        let centre = (start + end) as f64 / 2.0;
        let from = (centre - size as f64 / 2.0).round().max(0.0) as u32;
        from.min(limit - size)
    };
    Some(Region {
        x: place(x0, x1, rw, width),
        y: place(y0, y1, rh, height),
        width: rw,
        height: rh,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask_with(width: u32, height: u32, set: Region) -> Vec<u8> {
        (0..height)
            .flat_map(|y| {
                (0..width).map(move |x| {
                    u8::from(
                        x >= set.x && x < set.x + set.width && y >= set.y && y < set.y + set.height,
                    )
                })
            })
            .collect()
    }

    #[test]
    fn the_region_is_the_padded_mask_at_the_images_aspect_inside_the_picture() {
        let set = Region {
            x: 40,
            y: 50,
            width: 10,
            height: 20,
        };
        let mask = mask_with(100, 100, set);
        // Padding 5: 20×30 around (45, 60); square output: 30×30.
        let r = masked_region(&mask, 100, 100, 5, 1.0).unwrap();
        assert_eq!(
            r,
            Region {
                x: 30,
                y: 45,
                width: 30,
                height: 30
            }
        );
        // Near the edge the region moves inside.
        let mask = mask_with(100, 100, Region { x: 95, ..set });
        let r = masked_region(&mask, 100, 100, 5, 1.0).unwrap();
        assert_eq!((r.x + r.width, r.width), (100, 30));
        // A wide output grows the region's width, at most to the picture's.
        let r = masked_region(&mask_with(100, 100, set), 100, 100, 0, 4.0).unwrap();
        assert_eq!((r.width, r.height), (80, 20));
        // Past the picture's width the aspect cannot be kept: the region is cut to the picture.
        let r = masked_region(&mask_with(100, 100, set), 100, 100, 40, 4.0).unwrap();
        assert_eq!((r.width, r.height), (100, 90));
        assert!(masked_region(&[0; 100], 10, 10, 5, 1.0).is_none());
    }

    #[test]
    fn pasting_keeps_the_picture_outside_the_mask() {
        let picture = RgbImage::from_fn(64, 48, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let set = Region {
            x: 10,
            y: 10,
            width: 8,
            height: 8,
        };
        let area = MaskedArea::new(picture.clone(), mask_with(64, 48, set), 4, (32, 32)).unwrap();
        let (rgb, mask) = area.input(32, 32);
        assert_eq!((rgb.len(), mask.len()), (32 * 32 * 3, 32 * 32));
        let white = vec![255u8; 32 * 32 * 3];
        let out = RgbImage::from_raw(64, 48, area.paste(white, 32, 32).unwrap()).unwrap();
        for (x, y, p) in out.enumerate_pixels() {
            let inside = (10..18).contains(&x) && (10..18).contains(&y);
            assert_eq!(*p == image::Rgb([255, 255, 255]), inside, "({x}, {y})");
        }
    }
}
