//! What a request starts from besides its prompt: nothing (text → image), a picture to rework
//! (diffusers' `…Img2ImgPipeline`s), or a picture and the part of it to repaint
//! (`…InpaintPipeline`s).
//!
//! Both image tasks encode the picture with the VAE encoder, draw a latent from its
//! distribution with the request's generator, then draw the noise from the same generator (so a
//! seed gives diffusers' image), and start the schedule at the step the strength leaves. Inpaint
//! then puts the kept region back after every step, re-noised to the next step's σ.

use crate::mlx::{self, ops, Array};
use crate::models::vae_tiling::Tiling;
use crate::models::{LatentDistribution, VaeConfig, VaeEncoder};
use crate::torch_rng::Generator;

/// The picture a request starts from, already at the request's size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImageInput {
    /// RGB, `height × width × 3`.
    #[serde(skip)]
    pub rgb: Vec<u8>,
    /// One value per pixel: 1 repaints, 0 keeps (inpaint); `None` reworks the whole picture.
    #[serde(rename = "inpaint", serialize_with = "is_some")]
    pub mask: Option<Vec<u8>>,
    /// How far back toward noise the picture is taken, in (0, 1]: 1 starts from pure noise.
    pub strength: f64,
}

fn is_some<S: serde::Serializer>(m: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bool(m.is_some())
}

/// img2img's default strength (diffusers').
pub const DEFAULT_STRENGTH: f64 = 0.6;
/// Inpaint's default strength (diffusers').
pub const DEFAULT_INPAINT_STRENGTH: f64 = 1.0;

impl ImageInput {
    /// What is wrong with this input for a `width`×`height` request, if anything.
    pub fn check(&self, width: u32, height: u32) -> Result<(), String> {
        if !(self.strength > 0.0 && self.strength <= 1.0) {
            return Err(format!(
                "--strength is {}; it must be within (0, 1]",
                self.strength
            ));
        }
        let pixels = width as usize * height as usize;
        if self.rgb.len() != pixels * 3 {
            return Err(format!(
                "the input picture has {} bytes; {width}×{height} RGB needs {}",
                self.rgb.len(),
                pixels * 3
            ));
        }
        if let Some(mask) = &self.mask {
            if mask.len() != pixels {
                return Err(format!(
                    "the mask has {} values; {width}×{height} needs {pixels}",
                    mask.len()
                ));
            }
        }
        Ok(())
    }

    /// The index of the first step of a `steps`-step schedule that runs: diffusers'
    /// `get_timesteps`, `int(max(N − min(N·strength, N), 0))` in double precision.
    pub fn first_step(&self, steps: usize) -> usize {
        first_step(steps, self.strength)
    }
}

/// The error diffusers raises when `strength` leaves none of `steps` to run
/// (`get_timesteps` returns an empty schedule), or `None`.
pub fn no_step_error(steps: usize, strength: f64) -> Option<String> {
    (steps > 0 && first_step(steps, strength) >= steps).then(|| {
        format!(
            "--strength {strength:?} with --steps {steps} leaves no denoising step to run (steps · strength is too small to move the schedule's start); raise --strength or --steps"
        )
    })
}

/// See [`ImageInput::first_step`].
pub fn first_step(steps: usize, strength: f64) -> usize {
    let n = steps as f64;
    (n - (n * strength).min(n)).max(0.0) as usize
}

/// The picture's latents as the pipeline scales them: `(sample − shift) · scale`, `[C, h, w]`
/// f32, with `sample` drawn from the encoded distribution by `generator` (its first draw).
/// With `tiling` the picture is encoded in tiles (as the decode is, when the memory budget
/// asks for it).
pub fn image_latents(
    encoder: &VaeEncoder,
    input: &ImageInput,
    (width, height): (u32, u32),
    tiling: Option<&Tiling>,
    generator: &mut Generator,
) -> Result<Array, super::Error> {
    let image = crate::models::vae_encoder::image_to_array(&input.rgb, width, height)?;
    let moments = match tiling {
        Some(t) => encoder.moments_tiled(&image, t)?,
        None => encoder.moments(&image)?,
    };
    moments.eval()?;
    let dist = LatentDistribution::from_moments(&moments)?;
    let s = dist.mean.shape();
    let eps = generator
        .randn((s[0] * s[1] * s[2]) as usize)
        .map_err(super::Error::Request)?;
    let eps = Array::from_slice(&eps, &[s[2], s[0], s[1]])?;
    let sample = dist.sample(&eps)?.astype(mlx::Dtype::F32)?;
    let latents = scaled(&sample, &encoder.config)?;
    latents.eval()?;
    Ok(latents)
}

/// `(z − shift) · scale`, the inverse of what decoding undoes.
pub(crate) fn scaled(z: &Array, cfg: &VaeConfig) -> mlx::Result<Array> {
    let z = match cfg.shift_factor {
        Some(shift) => (z - shift)?,
        None => z.clone(),
    };
    z * cfg.scaling_factor
}

/// Flow matching's forward process (`FlowMatchEulerDiscreteScheduler.scale_noise`):
/// `σ·noise + (1 − σ)·sample`.
pub fn scale_noise(sample: &Array, sigma: f32, noise: &Array) -> mlx::Result<Array> {
    (noise * sigma)? + (sample * (1.0 - sigma))?
}

/// `mask` (one value per pixel of `width`×`height`, non-zero repaints) on an `h`×`w` latent
/// grid, row-major, as `F.interpolate(mode="nearest")` samples it: latent `(y, x)` takes pixel
/// `(⌊y·s⌋, ⌊x·s⌋)` with `s` the image-to-latent ratio.
pub fn mask_on_grid(mask: &[u8], width: u32, height: u32, h: i32, w: i32) -> Vec<bool> {
    let (h, w) = (h as usize, w as usize);
    let (sy, sx) = (height as f32 / h as f32, width as f32 / w as f32);
    let mut grid = Vec::with_capacity(h * w);
    for y in 0..h {
        let py = ((y as f32 * sy) as usize).min(height as usize - 1);
        for x in 0..w {
            let px = ((x as f32 * sx) as usize).min(width as usize - 1);
            grid.push(mask[py * width as usize + px] != 0);
        }
    }
    grid
}

/// Inpaint's state between steps: the clean picture latents, the noise they are re-noised
/// with, and the mask at latent size.
pub struct Inpaint {
    image_latents: Array,
    noise: Array,
    /// `[1, h, w]` bool, true where the model repaints.
    repaint: Array,
}

impl Inpaint {
    /// `mask`: one value per image pixel (`width`×`height`), sampled to the latent grid by
    /// [`mask_on_grid`].
    pub fn new(
        image_latents: Array,
        noise: Array,
        mask: &[u8],
        width: u32,
        height: u32,
    ) -> mlx::Result<Inpaint> {
        let s = image_latents.shape();
        let grid = mask_on_grid(mask, width, height, s[1], s[2]);
        Ok(Inpaint {
            image_latents,
            noise,
            repaint: Array::from_slice(&grid, &[1, s[1], s[2]])?,
        })
    }

    /// After a step: the kept region from the picture latents at `sigma_next` (the clean
    /// latents after the last step, `None`), the repainted region from `latents`.
    pub fn blend(&self, latents: &Array, sigma_next: Option<f32>) -> mlx::Result<Array> {
        let kept = match sigma_next {
            Some(sigma) => scale_noise(&self.image_latents, sigma, &self.noise)?,
            None => self.image_latents.clone(),
        };
        ops::where_(&self.repaint, latents, &kept)
    }
}

#[cfg(test)]
mod tests {
    use super::first_step;

    #[test]
    fn first_step_is_diffusers_get_timesteps() {
        // int(max(8 - min(8 * s, 8), 0)) in Python.
        assert_eq!(first_step(8, 0.6), 3);
        assert_eq!(first_step(8, 1.0), 0);
        assert_eq!(first_step(8, 0.1), 7);
        // 5 · 0.2 is exactly 1 in double precision; with 0.2 rounded to f32 first it would be
        // 1.0000000149 and the first step 3.
        assert_eq!(first_step(5, 0.2), 4);
    }

    #[test]
    fn a_strength_that_runs_no_step_is_refused() {
        assert!(super::no_step_error(8, 1e-40).is_some());
        // diffusers runs int(8 − 0.8) = 7 → the last step.
        assert!(super::no_step_error(8, 0.1).is_none());
        assert!(super::no_step_error(8, 0.125).is_none());
    }
}
