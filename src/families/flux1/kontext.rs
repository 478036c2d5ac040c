//! Kontext's picture to edit, prepared as `FluxKontextPipeline` prepares it (flux1-spec §8.2):
//! stretched (Lanczos-3, no crop) to the preferred resolution whose aspect is nearest the
//! picture's, then encoded by the VAE's mean.
//!
//! The preferred resolutions are diffusers' list, about one megapixel each, for the FLUX VAE's
//! 1024-pixel sample size. A model whose VAE states another sample size (the tiny test models)
//! gets the list scaled by the ratio and floored to its token cell, so that the reference stays
//! the size the model was made for; at 1024 this is diffusers' list exactly.

use crate::pipeline::reference::Reference;

/// `(width, height)` pairs, diffusers' `PREFERRED_KONTEXT_RESOLUTIONS`.
pub const PREFERRED: [(u32, u32); 17] = [
    (672, 1568),
    (688, 1504),
    (720, 1456),
    (752, 1392),
    (800, 1328),
    (832, 1248),
    (880, 1184),
    (944, 1104),
    (1024, 1024),
    (1104, 944),
    (1184, 880),
    (1248, 832),
    (1328, 800),
    (1392, 752),
    (1456, 720),
    (1504, 688),
    (1568, 672),
];

/// The sample size the list is written for.
const LIST_SAMPLE_SIZE: u32 = 1024;

/// The size a `width × height` picture is stretched to: its sides floored to the cell give the
/// aspect; the preferred resolution nearest it (the first, i.e. narrower, on a tie) is scaled
/// to `sample_size` and floored to the cell.
pub fn preferred_size((width, height): (u32, u32), cell: u32, sample_size: u32) -> (u32, u32) {
    let (w, h) = (width - width % cell, height - height % cell);
    let aspect = w as f64 / h as f64;
    let distance = |&(pw, ph): &(u32, u32)| (aspect - pw as f64 / ph as f64).abs();
    let (pw, ph) = PREFERRED
        .iter()
        .copied()
        .min_by(|a, b| distance(a).total_cmp(&distance(b)))
        .expect("a non-empty list");
    let scale = |side: u32| {
        let s = (side as u64 * sample_size as u64 / LIST_SAMPLE_SIZE as u64) as u32;
        (s - s % cell).max(cell)
    };
    (scale(pw), scale(ph))
}

/// `img` as Kontext reads it: at least one cell each way, stretched to its preferred size.
pub fn prepare(
    img: &image::DynamicImage,
    cell: u32,
    sample_size: u32,
    label: &str,
) -> Result<Reference, String> {
    let (w, h) = (img.width(), img.height());
    if w < cell || h < cell {
        return Err(format!(
            "{label} is {w}×{h}; the picture to edit needs at least {cell} pixels each way"
        ));
    }
    if w.max(h) > 8 * w.min(h) {
        return Err(format!(
            "{label} is {w}×{h}; the picture to edit may be at most 8 times longer one way than the other"
        ));
    }
    let (width, height) = preferred_size((w, h), cell, sample_size);
    let rgb = crate::image_in::picture(img, width, height).into_raw();
    Ok(Reference { rgb, width, height })
}

/// The output size diffusers computes for a requested `width × height` with `max_area` their
/// product: the same aspect at that area, rounded, then floored to the cell (flux1-spec §8.1).
pub fn output_size((width, height): (u32, u32), cell: u32) -> (u32, u32) {
    let area = width as f64 * height as f64;
    let aspect = width as f64 / height as f64;
    let w = (area * aspect).sqrt().round() as u32;
    let h = (area / aspect).sqrt().round() as u32;
    (w - w % cell, h - h % cell)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_aspect_is_chosen_as_diffusers_chooses_it() {
        assert_eq!(preferred_size((100, 72), 16, 1024), (1248, 832));
        assert_eq!(preferred_size((3000, 1000), 16, 1024), (1568, 672));
        assert_eq!(preferred_size((512, 512), 16, 1024), (1024, 1024));
        // A smaller sample size scales the list and floors it to the cell.
        assert_eq!(preferred_size((100, 72), 8, 128), (144, 104));
    }

    #[test]
    fn an_asked_size_is_the_output_size() {
        assert_eq!(output_size((80, 64), 8), (80, 64));
        assert_eq!(output_size((1000, 1000), 16), (992, 992));
    }
}
