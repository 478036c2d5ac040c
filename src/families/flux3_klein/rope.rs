//! FLUX.3's rotary tables: four axes (t, h, w, l), interleaved pairs, θ from the config, angles
//! in f64 rounded once to f32 (the FLUX.3 spec §5.5). Unlike FLUX.2's, positions may be halves
//! (the image's h and w ids are scaled by 0.5) or negative (references on the l axis).

/// The factor the pipeline scales the image's and the references' h and w ids by: the model
/// was trained with its image positions at half their index (diffusers' `image_rope_scale`).
pub const IMAGE_ROPE_SCALE: f64 = 0.5;

pub use crate::models::rope::axes_tables as tables;

/// Text ids `(0, 0, 0, s)` for a window of `length` rows (padding rows included).
pub fn text_ids(length: usize) -> Vec<[f64; 4]> {
    (0..length).map(|s| [0.0, 0.0, 0.0, s as f64]).collect()
}

/// Ids `(0, i/2, j/2, l)` of an `h × w` token grid: the output image at `l = 0`, reference `k`
/// at `l = −(k + 1)`.
pub fn grid_ids((h, w): (i32, i32), l: f64) -> Vec<[f64; 4]> {
    let s = IMAGE_ROPE_SCALE;
    (0..h)
        .flat_map(|i| (0..w).map(move |j| [0.0, i as f64 * s, j as f64 * s, l]))
        .collect()
}

/// The references' ids, concatenated in order, each on its own grid.
pub fn reference_ids(grids: &[(i32, i32)]) -> Vec<[f64; 4]> {
    (grids.iter().enumerate())
        .flat_map(|(k, &g)| grid_ids(g, -(k as f64 + 1.0)))
        .collect()
}
