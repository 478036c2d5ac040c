//! Reference pictures, the images a model sees beside the prompt while it draws (an edit's
//! source, a style or a subject): their count and size checked before any model loads, and
//! each prepared at a model's token cell.

/// The most pixels a reference keeps: larger ones are scaled down to this area first.
pub const MAX_REFERENCE_PIXELS: u64 = 1024 * 1024;
/// The most reference pictures one request may give.
pub const MAX_REFERENCES: usize = 4;

/// A picture's size scaled, when above [`MAX_REFERENCE_PIXELS`], to that area (each side
/// truncated, as diffusers computes it); else as it is.
pub fn capped_size(w: u32, h: u32) -> (u32, u32) {
    if w as u64 * h as u64 <= MAX_REFERENCE_PIXELS {
        return (w, h);
    }
    let s = (MAX_REFERENCE_PIXELS as f64 / (w as f64 * h as f64)).sqrt();
    ((w as f64 * s) as u32, (h as f64 * s) as u32)
}

/// A reference picture as the model reads it: RGB bytes, sides multiples of the token cell.
#[derive(Debug, Clone)]
pub struct Reference {
    pub rgb: Vec<u8>,
    pub width: u32,
    pub height: u32,
}

impl Reference {
    /// Whether a `w`×`h` picture (`label` in messages) may be a reference: at least 64 pixels
    /// each way and an aspect ratio within 8 (flux2-spec §4.1); checkable before any model.
    pub fn check_size(w: u32, h: u32, label: &str) -> Result<(), String> {
        if w < 64 || h < 64 {
            return Err(format!(
                "{label} is {w}×{h}; a reference needs at least 64 pixels each way"
            ));
        }
        if w.max(h) > 8 * w.min(h) {
            return Err(format!(
                "{label} is {w}×{h}; a reference's longer side may be at most 8 times its shorter"
            ));
        }
        Ok(())
    }

    /// `img` prepared as diffusers' FLUX.2 pipelines prepare an `image` (flux2-spec §4.1): at least
    /// 64 pixels each way and an aspect ratio within 8; above 1024² pixels scaled (Lanczos-3) to
    /// that area; then centre-cropped, not resized, to multiples of `cell`; alpha dropped.
    pub fn prepare(img: &image::DynamicImage, cell: u32, label: &str) -> Result<Reference, String> {
        let (w, h) = (img.width(), img.height());
        Reference::check_size(w, h, label)?;
        let mut rgb = img.to_rgb8();
        let (sw, sh) = capped_size(w, h);
        if (sw, sh) != (w, h) {
            rgb = crate::resample::lanczos3(&rgb, sw, sh);
        }
        let (w, h) = rgb.dimensions();
        let (cw, ch) = (w - w % cell, h - h % cell);
        let (left, top) = ((w - cw) / 2, (h - ch) / 2);
        let rgb = image::imageops::crop_imm(&rgb, left, top, cw, ch).to_image();
        Ok(Reference {
            rgb: rgb.into_raw(),
            width: cw,
            height: ch,
        })
    }
}
