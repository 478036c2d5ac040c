//! FLUX.2's rotary tables: four axes (T, H, W, L) of 32 dims each, θ 2000, angles and their
//! cos/sin in f64 rounded once to f32, as diffusers' `get_1d_rotary_pos_embed` builds them
//! (klein-spec §5.5). Positions are arbitrary ids, so the table is built per token.

use crate::mlx::{self, Array};

/// `(cos, sin)`, each `[S, 1, Σd/2]` f32, for tokens with `ids` (see
/// [`crate::models::rope::axes_tables`]).
pub fn tables(ids: &[[i32; 4]], dims: &[i32], theta: f64) -> mlx::Result<(Array, Array)> {
    let ids: Vec<[f64; 4]> = ids.iter().map(|id| id.map(f64::from)).collect();
    crate::models::rope::axes_tables(&ids, dims, theta)
}

/// Text ids `(0, 0, 0, s)` for `length` rows, then output-image ids `(0, i, j, 0)` of an
/// `h × w` token grid, then each reference's grid at `(10 + 10k, i, j, 0)`.
pub fn ids(length: usize, grid: (i32, i32), references: &[(i32, i32)]) -> Vec<[i32; 4]> {
    let mut ids: Vec<[i32; 4]> = (0..length as i32).map(|s| [0, 0, 0, s]).collect();
    let grids = std::iter::once((0, grid)).chain(
        references
            .iter()
            .enumerate()
            .map(|(k, &g)| (10 + 10 * k as i32, g)),
    );
    for (t, (h, w)) in grids {
        for i in 0..h {
            ids.extend((0..w).map(|j| [t, i, j, 0]));
        }
    }
    ids
}
