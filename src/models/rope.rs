//! Rotary tables: the S3-DiT's three axes (zimage-spec §3.7) and FLUX's per-token tables of any
//! number of axes ([`axes_tables`], every FLUX transformer's).
//!
//! For the S3-DiT, axis `a` with `d_a` dims has `d_a/2` frequencies `1/θ^(2j/d_a)` (f64); the angle of position
//! `p` is `f32(p·f)` and cos/sin are taken in f32, as the reference builds `freqs_cis`. A token
//! with ids `(p0, p1, p2)` rotates its head-dim pairs with the three axes' tables concatenated.

use crate::mlx::{self, Array};

pub struct RopeTables {
    /// Per axis: `len × d/2` angles, row-major.
    angles: Vec<Vec<f32>>,
    halves: Vec<usize>,
    lens: Vec<i32>,
}

impl RopeTables {
    pub fn new(theta: f64, axes_dims: &[i32], axes_lens: &[i32]) -> RopeTables {
        let mut angles = Vec::new();
        for (&d, &len) in axes_dims.iter().zip(axes_lens) {
            let freqs: Vec<f64> = (0..d / 2)
                .map(|j| 1.0 / theta.powf((2 * j) as f64 / d as f64))
                .collect();
            let table = (0..len)
                .flat_map(|p| freqs.iter().map(move |f| (p as f64 * f) as f32))
                .collect();
            angles.push(table);
        }
        RopeTables {
            angles,
            halves: axes_dims.iter().map(|&d| d as usize / 2).collect(),
            lens: axes_lens.to_vec(),
        }
    }

    /// `(cos, sin)`, each `[S, 1, head_dim/2]` f32, for tokens at `positions`.
    pub fn lookup(&self, positions: &[[i32; 3]]) -> mlx::Result<(Array, Array)> {
        let half: usize = self.halves.iter().sum();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for pos in positions {
            for (axis, &p) in pos.iter().enumerate() {
                // The pipeline checks positions against the tables before it runs; this keeps
                // a caller that did not from reading outside them.
                if !(0..self.lens[axis]).contains(&p) {
                    return Err(mlx::Error::new(
                        "rope",
                        format!(
                            "position {p} beyond the RoPE table of axis {axis} ({} long)",
                            self.lens[axis]
                        ),
                    ));
                }
                let h = self.halves[axis];
                for &a in &self.angles[axis][p as usize * h..(p as usize + 1) * h] {
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
        let shape = [positions.len() as i32, 1, half as i32];
        Ok((
            Array::from_slice(&cos, &shape)?,
            Array::from_slice(&sin, &shape)?,
        ))
    }
}

/// FLUX's tables: `(cos, sin)`, each `[S, 1, Σd/2]` f32, for tokens at `ids` of `A` axes; per
/// axis `a` of `dims[a]` dims, pair `j` turns by `p_a / θ^(2j/dims[a])`, the angle and its
/// cos/sin in f64 rounded once to f32, as diffusers' `get_1d_rotary_pos_embed` builds them.
/// Positions may be halves or negative. `dims` has one size per axis ([`check_axes`]).
pub fn axes_tables<const A: usize>(
    ids: &[[f64; A]],
    dims: &[i32],
    theta: f64,
) -> mlx::Result<(Array, Array)> {
    if dims.len() != A {
        return Err(mlx::Error::new(
            "rope",
            format!("{} axis sizes for ids of {A} axes", dims.len()),
        ));
    }
    let freqs: Vec<Vec<f64>> = dims
        .iter()
        .map(|&d| {
            (0..d / 2)
                .map(|j| 1.0 / theta.powf((2 * j) as f64 / d as f64))
                .collect()
        })
        .collect();
    let half: usize = freqs.iter().map(Vec::len).sum();
    let mut cos = Vec::with_capacity(ids.len() * half);
    let mut sin = Vec::with_capacity(ids.len() * half);
    for id in ids {
        for (axis, f) in freqs.iter().enumerate() {
            for w in f {
                let phi = id[axis] * w;
                cos.push(phi.cos() as f32);
                sin.push(phi.sin() as f32);
            }
        }
    }
    let shape = [ids.len() as i32, 1, half as i32];
    Ok((
        Array::from_slice(&cos, &shape)?,
        Array::from_slice(&sin, &shape)?,
    ))
}

/// Checks a FLUX transformer config's `axes_dims_rope`: `axes` even sizes that fill the head.
pub fn check_axes(dims: &[i32], head_dim: i32, axes: usize) -> Result<(), String> {
    if dims.len() != axes
        || dims.iter().any(|d| *d < 2 || d % 2 != 0)
        || dims.iter().sum::<i32>() != head_dim
    {
        return Err(format!(
            "transformer `axes_dims_rope` {dims:?} must be {axes} even sizes summing to `attention_head_dim` {head_dim}"
        ));
    }
    Ok(())
}
