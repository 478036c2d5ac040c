//! The `AutoencoderKL` encoder (the 16-channel FLUX VAE's architecture), channels-last: an image in
//! [-1, 1] to the moments (mean and log-variance) of its latent distribution.
//!
//! Mirrors diffusers 0.42.1 `models/autoencoders/vae.py` `Encoder` with `DownEncoderBlock2D`,
//! `Downsample2D` and `UNetMidBlock2D`, and `DiagonalGaussianDistribution` for what is drawn
//! from the moments. The blocks are the decoder's ([`super::vae`]).

use super::vae::{conv_matrix, Conv2d, GroupNorm, MidBlock, ResnetBlock, VaeConfig};
use super::weights::{Checkpoint, Weights};
use crate::mlx::{self, fast, ops, Array, Dtype};

/// A 3×3 convolution with stride 2 after padding the bottom and right by one zero row and
/// column (`Downsample2D` with `padding=0`): `[H, W]` → `[H/2, W/2]` for even sides.
struct Downsample {
    /// `[O, 3, 3, I]`, MLX's layout.
    weight: Array,
    /// The same weight as one `[9·I, O]` matrix, for [`fast::conv2d`].
    matrix: Array,
    bias: Array,
}

impl Downsample {
    fn new(w: &Weights, c: i32) -> mlx::Result<Downsample> {
        let weight = w.get("weight", &[c, c, 3, 3])?.transpose(&[0, 2, 3, 1])?;
        Ok(Downsample {
            matrix: conv_matrix(&weight)?,
            weight,
            bias: w.get("bias", &[c])?,
        })
    }

    /// `x`: `[1, H, W, C]` with even `H` and `W`.
    fn forward(&self, x: &Array) -> mlx::Result<Array> {
        if crate::platform::convolutions_as_matmuls() {
            // On the CPU as gathered patches times the weight (a quarter of a stride-1
            // convolution's work), evaluated as the decoder's convolutions are: one at a time.
            x.eval()?;
            let y = fast::conv2d(x, &self.matrix, &self.bias, 3, 2, (0, 1))?;
            y.eval()?;
            return Ok(y);
        }
        let padded = ops::pad(x, &[(0, 0), (0, 1), (0, 1), (0, 0)], 0.0)?;
        ops::conv2d(&padded, &self.weight, (2, 2), (0, 0), (1, 1), 1)? + &self.bias
    }
}

struct DownBlock {
    resnets: Vec<ResnetBlock>,
    downsample: Option<Downsample>,
}

/// The encoder: image → latent moments.
pub struct VaeEncoder {
    conv_in: Conv2d,
    down_blocks: Vec<DownBlock>,
    mid: MidBlock,
    norm_out: GroupNorm,
    conv_out: Conv2d,
    quant_conv: Option<Conv2d>,
    pub config: VaeConfig,
    dtype: Dtype,
}

/// The moments of an encoded image, `[h, w, C]` each in the encoder's dtype.
pub struct LatentDistribution {
    pub mean: Array,
    /// `log σ²`, clamped to [−30, 20] as diffusers clamps it.
    pub logvar: Array,
}

impl VaeEncoder {
    pub fn new(cfg: &VaeConfig, mut ckpt: Checkpoint) -> Result<VaeEncoder, super::ModelError> {
        cfg.validate().map_err(super::ModelError::Config)?;
        if cfg.in_channels != 3 {
            return Err(super::ModelError::Config(format!(
                "VAE `in_channels` is {}; the encoder takes RGB (3)",
                cfg.in_channels
            )));
        }
        ckpt.allow_unused("decoder.");
        ckpt.allow_unused("post_quant_conv.");
        ckpt.allow_unused("bn.");
        if !cfg.use_quant_conv {
            ckpt.allow_unused("quant_conv.");
        }
        let dtype = ckpt.dtype();
        let model = {
            let w = ckpt.root().pp("encoder");
            let g = cfg.norm_num_groups;
            let chans = &cfg.block_out_channels;
            let mut down_blocks = Vec::new();
            let mut cin = chans[0];
            for (i, &cout) in chans.iter().enumerate() {
                let bw = w.pp("down_blocks").pp(i);
                let resnets =
                    ResnetBlock::stack(&bw.pp("resnets"), cin, cout, cfg.layers_per_block, g)?;
                let downsample = if i + 1 < chans.len() {
                    Some(Downsample::new(&bw.pp("downsamplers.0.conv"), cout)?)
                } else {
                    None
                };
                down_blocks.push(DownBlock {
                    resnets,
                    downsample,
                });
                cin = cout;
            }
            let top = *chans.last().expect("validated non-empty");
            let mid = w.pp("mid_block");
            let moments = 2 * cfg.latent_channels;
            VaeEncoder {
                conv_in: Conv2d::new(&w.pp("conv_in"), cfg.in_channels, chans[0], 3)?,
                down_blocks,
                mid: MidBlock::new(&mid, top, g, cfg.mid_block_add_attention)?,
                norm_out: GroupNorm::new(&w.pp("conv_norm_out"), top, g)?,
                conv_out: Conv2d::new(&w.pp("conv_out"), top, moments, 3)?,
                quant_conv: if cfg.use_quant_conv {
                    Some(Conv2d::new(
                        &ckpt.root().pp("quant_conv"),
                        moments,
                        moments,
                        1,
                    )?)
                } else {
                    None
                },
                config: cfg.clone(),
                dtype,
            }
        };
        ckpt.finish()?;
        Ok(model)
    }

    /// The encoder's compute dtype.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The moments of `image` `[H, W, 3]` in [-1, 1] (sides multiples of the scale factor):
    /// `[H/f, W/f, 2C]`, mean then log-variance along the channels, in the encoder's dtype.
    pub fn moments(&self, image: &Array) -> mlx::Result<Array> {
        let mut x = self
            .conv_in
            .forward(&image.astype(self.dtype)?.expand_dims(0)?)?;
        for block in &self.down_blocks {
            for r in &block.resnets {
                x = r.forward(&x)?;
            }
            if let Some(down) = &block.downsample {
                x = down.forward(&x)?;
            }
        }
        x = self.mid.forward(&x)?;
        x = self.conv_out.forward(&self.norm_out.forward_silu(&x)?)?;
        if let Some(q) = &self.quant_conv {
            x = q.forward(&x)?;
        }
        x.squeeze(0)
    }
}

impl LatentDistribution {
    /// Splits moments `[h, w, 2C]` into mean and clamped log-variance.
    pub fn from_moments(moments: &Array) -> mlx::Result<LatentDistribution> {
        let parts = ops::split(moments, 2, 2)?;
        Ok(LatentDistribution {
            mean: parts[0].clone(),
            logvar: ops::clip(&parts[1], Some(-30.0), Some(20.0))?,
        })
    }

    /// `mean + σ·ε` with `σ = exp(logvar / 2)` and `ε` the standard normals `[C, h, w]`
    /// (f32, in torch's NCHW order as its generator draws them): `[C, h, w]`.
    pub fn sample(&self, eps: &Array) -> mlx::Result<Array> {
        let std = (&self.logvar * 0.5)?.exp()?;
        let eps = eps.transpose(&[1, 2, 0])?.astype(self.mean.dtype())?;
        (&self.mean + (std * eps)?)?.transpose(&[2, 0, 1])
    }

    /// The distribution's mode (its mean) as `[C, h, w]`.
    pub fn mode(&self) -> mlx::Result<Array> {
        self.mean.transpose(&[2, 0, 1])
    }
}

/// An RGB image as the encoder takes it: `[H, W, 3]` f32 in [-1, 1], each byte `v` as
/// `2·(v/255) − 1` with diffusers' roundings (f32 division, then the affine map).
pub fn image_to_array(rgb: &[u8], width: u32, height: u32) -> mlx::Result<Array> {
    let values: Vec<f32> = rgb
        .iter()
        .map(|&v| 2.0 * (v as f32 / 255.0) - 1.0)
        .collect();
    Array::from_slice(&values, &[height as i32, width as i32, 3])
}
