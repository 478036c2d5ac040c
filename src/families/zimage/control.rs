//! A control image steering the layout through a ControlNet (`ZImageControlNetPipeline`),
//! alone or with a picture and the part of it to repaint (`ZImageControlNetInpaintPipeline`).
//!
//! The control image goes through the VAE encoder and its distribution's mode (no draw from the
//! generator, so the noise stays the seed's first draw), shifted and scaled like latents. With
//! a mask the ControlNet reads `2C + 1` channels: the control latents, `1 − mask` on the latent
//! grid, and the latents of the picture with its repainted part blanked to 0. That pipeline
//! starts from pure noise and blends nothing after the steps: the picture and the mask reach
//! the model through the control input alone. Every step the ControlNet gives hints for the
//! step's latents and caption, added into the transformer's layers (with guidance, once per
//! caption).

use super::controlnet::ControlNet;
use super::controlnet_config::ControlNetConfig;
use super::transformer::{DitConfig, Prepared, ZImageTransformer};
use crate::memory_plan::TensorSize;
use crate::mlx::{self, ops, Array, Dtype};
use crate::models::vae_tiling::Tiling;
use crate::models::{LatentDistribution, Residency, VaeEncoder};
use crate::pipeline::{ControlInput, ImageInput, SourceError};

/// A ControlNet a pipeline can load when its denoise phase starts: where it comes from (a
/// directory, a published file, the store) is the implementer's business.
pub trait ControlNetLoader: Send {
    /// A short name for messages and metadata.
    fn name(&self) -> String;
    /// The published version it is (`1.0`, `2.0`, `2.1`).
    fn version(&self) -> &'static str;
    fn config(&self) -> &ControlNetConfig;
    /// Its tensors' sizes, read without loading them (for the memory plan).
    fn tensor_sizes(&self) -> Vec<TensorSize>;
    /// Loads it as `at` says.
    fn load(&self, at: LoadAs<'_>) -> Result<ControlNet, SourceError>;
}

/// How a ControlNet is loaded: for a transformer of configuration `dit`, computing in `dtype`,
/// its weights held as `residency` says.
#[derive(Debug, Clone, Copy)]
pub struct LoadAs<'a> {
    pub dit: &'a DitConfig,
    pub dtype: Dtype,
    pub residency: Residency,
}

/// The control latents the ControlNet reads, `[c, h, w]` f32: the control image's (`c` = C), or
/// with `inpaint` (a picture with its mask) the control image's, `1 − mask` and the masked
/// picture's (`c` = 2C + 1). With `tiling` the images are encoded in tiles.
pub fn control_latents(
    encoder: &VaeEncoder,
    control: &ControlInput,
    inpaint: Option<&ImageInput>,
    (width, height): (u32, u32),
    tiling: Option<&Tiling>,
) -> Result<Array, super::Error> {
    let image = crate::models::vae_encoder::image_to_array(&control.rgb, width, height)?;
    let latents = mode_latents(encoder, &image, tiling)?;
    let Some(input) = inpaint else {
        return Ok(latents);
    };
    let mask = input.mask.as_deref().ok_or_else(|| {
        super::Error::Request("a ControlNet with an input picture needs its mask".into())
    })?;
    let masked = masked_picture(&input.rgb, mask, width, height)?;
    let picture = mode_latents(encoder, &masked, tiling)?;
    let s = latents.shape();
    let kept: Vec<f32> = crate::pipeline::condition::mask_on_grid(mask, width, height, s[1], s[2])
        .iter()
        .map(|&repaint| if repaint { 0.0 } else { 1.0 })
        .collect();
    let kept = Array::from_slice(&kept, &[1, s[1], s[2]])?;
    let out = ops::concatenate(&[&latents, &kept, &picture], 0)?;
    out.eval()?;
    Ok(out)
}

/// `(mode − shift) · scale` of `image` (`[H, W, 3]` in [-1, 1]), `[C, h, w]` f32.
fn mode_latents(
    encoder: &VaeEncoder,
    image: &Array,
    tiling: Option<&Tiling>,
) -> Result<Array, super::Error> {
    let moments = match tiling {
        Some(t) => encoder.moments_tiled(image, t)?,
        None => encoder.moments(image)?,
    };
    let mode = LatentDistribution::from_moments(&moments)?
        .mode()?
        .astype(Dtype::F32)?;
    let latents = crate::pipeline::condition::scaled(&mode, &encoder.config)?;
    latents.eval()?;
    Ok(latents)
}

/// The picture as the encoder takes it (`[H, W, 3]` in [-1, 1]) with the pixels to repaint set
/// to 0 (diffusers' `image * (mask < 0.5)` on the normalised picture).
fn masked_picture(rgb: &[u8], mask: &[u8], width: u32, height: u32) -> mlx::Result<Array> {
    let image = crate::models::vae_encoder::image_to_array(rgb, width, height)?;
    let keep: Vec<f32> = mask.iter().map(|&m| f32::from(m == 0)).collect();
    let keep = Array::from_slice(&keep, &[height as i32, width as i32, 1])?;
    image * keep
}

/// A request's control while it denoises: the loaded ControlNet, its input and scale, and the
/// time its hints have taken so far.
pub struct Control<'a> {
    pub net: &'a ControlNet,
    /// From [`control_latents`].
    pub latents: Array,
    pub scale: f32,
    /// Seconds spent computing hints (each evaluated as the transformer reaches its layer).
    pub seconds: f64,
}

impl Control<'_> {
    /// The transformer's output for `latents` under caption `prepared`, steered: the control
    /// blocks run as the main layers reach the ones they hint, and their time is added to
    /// [`Control::seconds`].
    pub fn steered_output(
        &mut self,
        transformer: &ZImageTransformer,
        prepared: &Prepared,
        latents: &Array,
        t_model: f32,
    ) -> mlx::Result<Array> {
        let mut stream = self.net.hint_stream(
            transformer,
            prepared,
            latents,
            &self.latents,
            t_model,
            self.scale,
        )?;
        let out = transformer.forward_with_hints(latents, t_model, prepared, Some(&mut stream))?;
        self.seconds += stream.seconds();
        Ok(out)
    }
}
