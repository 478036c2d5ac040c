//! FLUX.1's rotary tables: three axes (16, 56, 56 in the real model) over interleaved pairs,
//! θ 10000, angles and their cos/sin in f64 rounded once to f32 (flux1-spec §5.3). Text rows
//! sit at `(0, 0, 0)` and so are not rotated; the output image at `(0, i, j)`; a Kontext
//! reference picture on its own grid at `(1, i, j)` (§4, §8.3).

use crate::mlx::{self, Array};

/// θ of every axis: not in the config, fixed by diffusers' `FluxPosEmbed(theta=10000)`.
pub const THETA: f64 = 10000.0;

/// The number of position axes.
pub const AXES: usize = 3;

/// `(cos, sin)`, each `[S, 1, Σd/2]` f32, for tokens with `ids` (see
/// [`crate::models::rope::axes_tables`]).
pub fn tables(ids: &[[f64; AXES]], dims: &[i32]) -> mlx::Result<(Array, Array)> {
    crate::models::rope::axes_tables(ids, dims, THETA)
}

/// Text ids: `length` rows, all zero.
pub fn text_ids(length: usize) -> Vec<[f64; AXES]> {
    vec![[0.0; AXES]; length]
}

/// Ids `(first, i, j)` of an `h × w` token grid, row by row: the output image has `first` 0,
/// a Kontext reference 1.
pub fn grid_ids((h, w): (i32, i32), first: f64) -> Vec<[f64; AXES]> {
    (0..h)
        .flat_map(|i| (0..w).map(move |j| [first, i as f64, j as f64]))
        .collect()
}

/// Every row's ids in the transformer's order: the text, the output grid, then the reference's
/// grid when there is one.
pub fn ids(text_rows: usize, grid: (i32, i32), reference: Option<(i32, i32)>) -> Vec<[f64; AXES]> {
    let mut ids = text_ids(text_rows);
    ids.extend(grid_ids(grid, 0.0));
    if let Some(r) = reference {
        ids.extend(grid_ids(r, 1.0));
    }
    ids
}
