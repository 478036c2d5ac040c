//! Live previews: a denoising step's latents as a small RGB picture, one pixel per latent cell,
//! through a linear map from a cell's channels to its colour. The map belongs to a latent
//! format and is fitted against the loaded model's own VAE decoder, never written down from
//! another model: it decodes a few random latents once, averages each decoded cell's pixels, and
//! solves the least squares for `rgb = W·latent + b`. Fitted maps are cached by the decoder's
//! weights digest.

use crate::mlx::{self, Array};
use crate::models::vae::to_rgb8;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How a model family's denoiser lays out its latents: what a preview map is fitted for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[doc(hidden)]
pub struct LatentFormat {
    /// Names the format in the cache (`z-image`).
    pub name: &'static str,
    /// Channels per latent cell; the denoiser's latents are `[channels, h, w]`.
    pub channels: usize,
    /// Pixels per latent cell along each side of the decoded image.
    pub cell: u32,
}

impl LatentFormat {
    /// The format `name` of `channels` per cell, decoded by a VAE of configuration `vae`.
    pub(crate) fn decoded_by(
        name: &'static str,
        channels: i32,
        vae: &crate::models::VaeConfig,
    ) -> Self {
        LatentFormat {
            name,
            channels: channels as usize,
            cell: vae.scale_factor() as u32,
        }
    }
}

/// One step's picture: row-major RGB bytes, one pixel per latent cell.
#[derive(Clone, PartialEq)]
pub struct Preview {
    /// Pixels across: the latent grid's width.
    pub width: u32,
    /// Pixels down: the latent grid's height.
    pub height: u32,
    /// `width × height × 3` bytes, red, green, blue.
    pub rgb: Vec<u8>,
}

impl std::fmt::Debug for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Preview({}×{})", self.width, self.height)
    }
}

impl Preview {
    /// The picture as a PNG without metadata.
    pub fn png(&self) -> Vec<u8> {
        crate::image_out::encode_png(&self.rgb, self.width, self.height, &[])
            .expect("a preview's bytes match its size")
    }

    /// The PNG in base64, as JSON answers carry pictures.
    pub fn png_base64(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(self.png())
    }
}

/// `rgb = weights·latent + bias` for one latent cell, in the decoder's output units ([-1, 1]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[doc(hidden)]
pub struct RgbMap {
    pub format: String,
    pub channels: usize,
    /// `3 × channels`, row-major: red's weights, then green's, then blue's.
    pub weights: Vec<f32>,
    pub bias: [f32; 3],
    /// The fit's R² on latents it was not fitted on, averaged over the three colours.
    pub r2: f64,
}

/// The most of a denoise's time its previews may take: on a model whose steps take
/// milliseconds, some steps go without one.
const TIME_SHARE: f64 = 0.01;

/// Draws a denoise's step previews within a small share (1%) of its time.
#[doc(hidden)]
pub struct StepPreviews<'a> {
    map: &'a RgbMap,
    started: Instant,
    spent: Duration,
}

impl<'a> StepPreviews<'a> {
    pub fn new(map: &'a RgbMap) -> StepPreviews<'a> {
        StepPreviews {
            map,
            started: Instant::now(),
            spent: Duration::ZERO,
        }
    }

    /// The preview of this step's latents `[C, h, w]`, which `latents` computes (its time counts
    /// as the preview's), unless previews have had their share of the time so far; the `last`
    /// step's is always drawn.
    pub fn step(
        &mut self,
        last: bool,
        latents: impl FnOnce() -> mlx::Result<Array>,
    ) -> mlx::Result<Option<Preview>> {
        let budget = self.started.elapsed().mul_f64(TIME_SHARE);
        if !last && self.spent > budget {
            return Ok(None);
        }
        let t = Instant::now();
        let preview = self.map.preview(&latents()?)?;
        self.spent += t.elapsed();
        Ok(Some(preview))
    }
}

/// The side of the latent grids the fit decodes, in cells.
const GRID: usize = 16;
/// Random latents are drawn per block of cells this wide, so that a cell's neighbours are like
/// it, as in a picture, and the decoder's answer to the cell is its own.
const BLOCK: usize = 2;
/// Independent draws fitted on per unknown of one colour (the channels and the bias): enough
/// for a stable fit, few enough that a large VAE decodes them in seconds on a GPU.
const DRAWS_PER_UNKNOWN: usize = 16;
/// Latent grids held out to measure the fit.
const HELD_OUT: u64 = 1;
/// Bumped when the fit changes, so that cached maps of an older fit are refitted.
const FIT_VERSION: u32 = 1;
/// A cached map is a few kilobytes; anything much larger is not one.
const CACHE_FILE_LIMIT: u64 = 1 << 20;

impl RgbMap {
    /// Fits the map for `format` against `decode`, which takes latents `[C, h, w]` as the
    /// denoiser leaves them and returns the image `[h·cell, w·cell, 3]` in [-1, 1].
    pub fn fit(
        format: &LatentFormat,
        decode: &mut dyn FnMut(&Array) -> mlx::Result<Array>,
    ) -> mlx::Result<RgbMap> {
        let c = format.channels;
        let draws_per_grid = (GRID / BLOCK).pow(2);
        let fitted = (DRAWS_PER_UNKNOWN * (c + 1)).div_ceil(draws_per_grid) as u64;
        let mut normal = NormalEquations::new(c + 1);
        let mut held_out = Vec::new();
        for seed in 0..fitted + HELD_OUT {
            let (cells, rgb) = sample(format, seed, decode)?;
            let rows = cells.chunks_exact(c).zip(rgb.chunks_exact(3));
            if seed < fitted {
                rows.for_each(|(x, y)| normal.add(x, y));
            } else {
                held_out.extend(rows.map(|(x, y)| (x.to_vec(), [y[0], y[1], y[2]])));
            }
        }
        let solved = normal.solve();
        let mut map = RgbMap {
            format: format.name.to_string(),
            channels: c,
            weights: (0..3)
                .flat_map(|k| (0..c).map(move |i| (k, i)))
                .map(|(k, i)| solved[i][k] as f32)
                .collect(),
            bias: [0, 1, 2].map(|k| solved[c][k] as f32),
            r2: 0.0,
        };
        map.r2 = map.r_squared(&held_out);
        Ok(map)
    }

    /// One cell's colour.
    fn apply(&self, cell: &[f32]) -> [f64; 3] {
        [0, 1, 2].map(|k| {
            let w = &self.weights[k * self.channels..(k + 1) * self.channels];
            let dot: f64 = w.iter().zip(cell).map(|(&a, &b)| a as f64 * b as f64).sum();
            dot + self.bias[k] as f64
        })
    }

    /// `1 − SS_res/SS_tot` per colour over `rows`, averaged over the colours.
    fn r_squared(&self, rows: &[(Vec<f32>, [f32; 3])]) -> f64 {
        let n = rows.len().max(1) as f64;
        let mean = [0, 1, 2].map(|k| rows.iter().map(|(_, y)| y[k] as f64).sum::<f64>() / n);
        let (mut residual, mut total) = ([0.0f64; 3], [0.0f64; 3]);
        for (x, y) in rows {
            let fitted = self.apply(x);
            for k in 0..3 {
                residual[k] += (y[k] as f64 - fitted[k]).powi(2);
                total[k] += (y[k] as f64 - mean[k]).powi(2);
            }
        }
        // A decoder whose colour never changes is matched by its constant alone.
        let per_colour = [0, 1, 2].map(|k| match total[k] > 0.0 {
            true => 1.0 - residual[k] / total[k],
            false => f64::from(u8::from(residual[k] == 0.0)),
        });
        per_colour.iter().sum::<f64>() / 3.0
    }

    /// The preview of latents `[C, h, w]`: `h × w` pixels, quantised as the decoded image is.
    pub fn preview(&self, latents: &Array) -> mlx::Result<Preview> {
        let shape = latents.shape();
        let (h, w) = (shape[1], shape[2]);
        let weights = Array::from_slice(&self.weights, &[3, self.channels as i32])?;
        let bias = Array::from_slice(&self.bias, &[3, 1])?;
        let cells = latents
            .astype(mlx::Dtype::F32)?
            .reshape(&[self.channels as i32, h * w])?;
        let rgb = (weights.matmul(&cells)? + bias)?.transpose(&[1, 0])?;
        Ok(Preview {
            width: w as u32,
            height: h as u32,
            rgb: to_rgb8(&rgb)?,
        })
    }

    /// The map cached for `format` and a decoder whose weights digest is `digest`, else one
    /// fitted with `decode` and cached. Without a digest (or a cache folder) the map is fitted
    /// and not cached.
    pub fn cached_or_fit(
        format: &LatentFormat,
        digest: Option<&str>,
        decode: &mut dyn FnMut(&Array) -> mlx::Result<Array>,
    ) -> mlx::Result<RgbMap> {
        let path = digest.and_then(|d| cache_path(format, d));
        if let Some(map) = path.as_deref().and_then(|p| read_cached(p, format)) {
            return Ok(map);
        }
        let map = RgbMap::fit(format, decode)?;
        if let Some(path) = &path {
            // The cache only saves the next fit: a folder that cannot be written costs time.
            let _ = write_cached(path, &map);
        }
        Ok(map)
    }
}

/// Where the map for `format` and decoder weights `digest` is cached.
fn cache_path(format: &LatentFormat, digest: &str) -> Option<PathBuf> {
    let digest: String = digest.chars().filter(char::is_ascii_alphanumeric).collect();
    let file = format!("{}-v{FIT_VERSION}-{digest}.json", format.name);
    Some(crate::platform::cache_dir()?.join("previews").join(file))
}

/// A cached map, if the file holds a sound one for `format`.
fn read_cached(path: &Path, format: &LatentFormat) -> Option<RgbMap> {
    let bytes = crate::files::read_bounded(path, CACHE_FILE_LIMIT, "preview map").ok()?;
    let map: RgbMap = serde_json::from_slice(&bytes).ok()?;
    let sound = map.format == format.name
        && map.channels == format.channels
        && map.weights.len() == 3 * format.channels
        && map.weights.iter().chain(&map.bias).all(|v| v.is_finite());
    sound.then_some(map)
}

fn write_cached(path: &Path, map: &RgbMap) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(path.parent().ok_or("no parent")?)?;
    crate::files::write_output(path, &serde_json::to_vec_pretty(map)?)?;
    Ok(())
}

/// One random latent grid for the fit, decoded: each cell's channels (`GRID² × C`) and its
/// pixels' mean colour (`GRID² × 3`), both in row-major cell order.
fn sample(
    format: &LatentFormat,
    seed: u64,
    decode: &mut dyn FnMut(&Array) -> mlx::Result<Array>,
) -> mlx::Result<(Vec<f32>, Vec<f32>)> {
    let (c, blocks) = (format.channels as i32, (GRID / BLOCK) as i32);
    let draws = crate::torch_rng::randn(seed, (c * blocks * blocks) as usize)
        .map_err(|e| mlx::Error::new("randn", e))?;
    let latents = Array::from_slice(&draws, &[c, blocks, blocks])?
        .repeat(BLOCK as i32, 1)?
        .repeat(BLOCK as i32, 2)?;
    let (grid, cell) = (GRID as i32, format.cell as i32);
    let rgb = decode(&latents)?
        .astype(mlx::Dtype::F32)?
        .reshape(&[grid, cell, grid, cell, 3])?
        .mean(&[1, 3], false)?;
    let cells = latents.transpose(&[1, 2, 0])?;
    Ok((cells.to_vec()?, rgb.to_vec()?))
}

/// `XᵀX` and `XᵀY` of a least-squares problem with three targets, summed row by row.
struct NormalEquations {
    n: usize,
    xtx: Vec<f64>,
    xty: Vec<[f64; 3]>,
}

impl NormalEquations {
    fn new(n: usize) -> NormalEquations {
        NormalEquations {
            n,
            xtx: vec![0.0; n * n],
            xty: vec![[0.0; 3]; n],
        }
    }

    /// A row: the cell's channels, with a constant 1 for the bias, and its colour.
    fn add(&mut self, x: &[f32], y: &[f32]) {
        let row: Vec<f64> = x.iter().map(|&v| v as f64).chain([1.0]).collect();
        for (i, &a) in row.iter().enumerate() {
            for (j, &b) in row.iter().enumerate() {
                self.xtx[i * self.n + j] += a * b;
            }
            for (sum, &v) in self.xty[i].iter_mut().zip(y) {
                *sum += a * v as f64;
            }
        }
    }

    /// The coefficients, one row per input (the bias last), by Gaussian elimination with
    /// partial pivoting; a tiny ridge keeps a decoder that ignores a channel solvable.
    fn solve(&self) -> Vec<[f64; 3]> {
        let n = self.n;
        let trace: f64 = (0..n).map(|i| self.xtx[i * n + i]).sum();
        let ridge = 1e-9 * trace / n as f64;
        let mut a: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                let mut row = self.xtx[i * n..(i + 1) * n].to_vec();
                row[i] += ridge;
                row.extend(self.xty[i]);
                row
            })
            .collect();
        for col in 0..n {
            let pivot = (col..n)
                .max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))
                .expect("a column has rows");
            a.swap(col, pivot);
            for r in 0..n {
                if r != col && a[col][col] != 0.0 {
                    let f = a[r][col] / a[col][col];
                    let (pivot_row, row) = (a[col].clone(), &mut a[r]);
                    row.iter_mut()
                        .zip(&pivot_row)
                        .for_each(|(v, p)| *v -= f * p);
                }
            }
        }
        (0..n)
            .map(|i| {
                let d = a[i][i];
                [0, 1, 2].map(|k| if d == 0.0 { 0.0 } else { a[i][n + k] / d })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoder that is itself linear (each cell's colour a fixed mix of its channels) is
    /// recovered exactly, and the map's preview is that colour.
    #[test]
    fn a_linear_decoder_is_recovered() {
        let format = LatentFormat {
            name: "test",
            channels: 4,
            cell: 2,
        };
        let truth = [
            [0.5f32, -0.25, 0.0, 0.1],
            [0.0, 0.3, 0.2, -0.1],
            [0.1, 0.1, 0.1, 0.1],
        ];
        let bias = [0.05f32, -0.1, 0.2];
        let mix = Array::from_slice(&truth.concat(), &[3, 4]).unwrap();
        let shift = Array::from_slice(&bias, &[1, 1, 3]).unwrap();
        let mut decode = |latents: &Array| -> mlx::Result<Array> {
            let shape = latents.shape();
            let rgb = mix
                .matmul(&latents.reshape(&[4, shape[1] * shape[2]])?)?
                .transpose(&[1, 0])?
                .reshape(&[shape[1], shape[2], 3])?;
            let up = (rgb + &shift)?.repeat(2, 0)?.repeat(2, 1)?;
            Ok(up)
        };
        let map = RgbMap::fit(&format, &mut decode).unwrap();
        for (got, want) in map.weights.iter().zip(truth.concat()) {
            assert!((got - want).abs() < 1e-4, "{:?}", map.weights);
        }
        for (got, want) in map.bias.iter().zip(bias) {
            assert!((got - want).abs() < 1e-4, "{:?}", map.bias);
        }
        assert!(map.r2 > 0.9999, "{}", map.r2);
        let latents = Array::from_slice(&[1.0f32, 0.0, 0.0, 0.0], &[4, 1, 1]).unwrap();
        let preview = map.preview(&latents).unwrap();
        let decoded = to_rgb8(&decode(&latents).unwrap()).unwrap();
        assert_eq!((preview.width, preview.height), (1, 1));
        assert_eq!(preview.rgb, decoded[..3]);
    }
}
