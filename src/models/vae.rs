//! The `AutoencoderKL` decoder (the 16-channel FLUX VAE's architecture), channels-last.
//!
//! Mirrors diffusers 0.42.1 `models/autoencoders/vae.py` `Decoder` with `UNetMidBlock2D`,
//! `UpDecoderBlock2D`, `ResnetBlock2D` and `Upsample2D` (zimage-spec §5). Convolution weights are
//! transposed from PyTorch's `[O, I, kh, kw]` to MLX's `[O, kh, kw, I]` as they are bound. The
//! blocks here serve the encoder too ([`super::vae_encoder`]).

use super::weights::{Checkpoint, Linear, Weights};
use crate::mlx::{self, fast, ops, Array, Dtype};

/// `vae/config.json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct VaeConfig {
    pub block_out_channels: Vec<i32>,
    pub layers_per_block: i32,
    pub latent_channels: i32,
    pub norm_num_groups: i32,
    pub out_channels: i32,
    /// FLUX.2's VAE has none: its BatchNorm statistics normalise the latents instead.
    #[serde(default = "one")]
    pub scaling_factor: f32,
    #[serde(default)]
    pub shift_factor: Option<f32>,
    #[serde(default = "yes")]
    pub mid_block_add_attention: bool,
    #[serde(default)]
    pub use_post_quant_conv: bool,
    /// A 1×1 convolution after the encoder (none in the 16-channel FLUX VAE).
    #[serde(default)]
    pub use_quant_conv: bool,
    /// Image channels the encoder takes.
    #[serde(default = "rgb_channels")]
    pub in_channels: i32,
    #[serde(default = "default_act")]
    pub act_fn: String,
    /// The image size the VAE was trained at, in pixels: the default image size.
    #[serde(default)]
    pub sample_size: Option<u32>,
    /// The eps of FLUX.2's latent BatchNorm (`bn.running_mean`/`running_var`).
    #[serde(default)]
    pub batch_norm_eps: Option<f32>,
}

/// The most up blocks a config may give: each doubles the image, and the scale factor
/// `2^(blocks − 1)` must stay a small shift.
const MAX_UP_BLOCKS: usize = 6;

fn one() -> f32 {
    1.0
}
fn yes() -> bool {
    true
}
fn rgb_channels() -> i32 {
    3
}
fn default_act() -> String {
    "silu".into()
}

impl VaeConfig {
    /// Checks every key the decoder divides by, shifts by or sizes a layer by, before
    /// anything is allocated.
    pub fn validate(&self) -> Result<(), String> {
        use super::{check_finite, check_range, MAX_COUNT, MAX_WIDTH};
        const WHAT: &str = "VAE";
        if self.act_fn != "silu" {
            return Err(format!(
                "VAE `act_fn` is `{}`; only `silu` is supported",
                self.act_fn
            ));
        }
        if !(1..=MAX_UP_BLOCKS).contains(&self.block_out_channels.len()) {
            return Err(format!(
                "VAE `block_out_channels` has {} entries; it must have 1..={MAX_UP_BLOCKS} (each doubles the image size)",
                self.block_out_channels.len()
            ));
        }
        for &c in &self.block_out_channels {
            check_range(WHAT, "block_out_channels", c, 1..=MAX_WIDTH)?;
        }
        check_range(WHAT, "norm_num_groups", self.norm_num_groups, 1..=MAX_WIDTH)?;
        if let Some(c) = self
            .block_out_channels
            .iter()
            .find(|c| *c % self.norm_num_groups != 0)
        {
            return Err(format!(
                "VAE `block_out_channels` entry {c} is not divisible by `norm_num_groups` {}",
                self.norm_num_groups
            ));
        }
        check_range(
            WHAT,
            "layers_per_block",
            self.layers_per_block,
            0..=MAX_COUNT,
        )?;
        check_range(WHAT, "latent_channels", self.latent_channels, 1..=MAX_COUNT)?;
        if self.out_channels != 3 {
            return Err(format!(
                "VAE `out_channels` is {}; it must be 3 (RGB)",
                self.out_channels
            ));
        }
        check_finite(WHAT, "scaling_factor", self.scaling_factor as f64, false)?;
        if self.scaling_factor == 0.0 {
            return Err("VAE `scaling_factor` is 0; latents are divided by it".into());
        }
        if let Some(shift) = self.shift_factor {
            check_finite(WHAT, "shift_factor", shift as f64, false)?;
        }
        if let Some(size) = self.sample_size {
            let cell = 2 * self.scale_factor() as u32;
            if size == 0 || size % cell != 0 || size > super::MAX_IMAGE_SIDE {
                return Err(format!(
                    "VAE `sample_size` is {size}; it must be a multiple of {cell} within {cell}..={} (it is the default image size)",
                    super::MAX_IMAGE_SIDE
                ));
            }
        }
        Ok(())
    }

    /// Pixels per latent cell along each axis.
    pub fn scale_factor(&self) -> i32 {
        1 << (self.block_out_channels.len() - 1)
    }
}

/// A stride-1 "same" convolution, NHWC.
pub(super) struct Conv2d {
    /// `[O, kh, kw, I]`, MLX's layout.
    weight: Array,
    /// The same weight as one `[k·k·I, O]` matrix, for [`fast::conv2d_same`].
    matrix: Array,
    bias: Array,
    k: i32,
}

impl Conv2d {
    pub(super) fn new(w: &Weights, cin: i32, cout: i32, k: i32) -> mlx::Result<Conv2d> {
        let weight = w
            .get("weight", &[cout, cin, k, k])?
            .transpose(&[0, 2, 3, 1])?;
        Ok(Conv2d {
            matrix: conv_matrix(&weight)?,
            weight,
            bias: w.get("bias", &[cout])?,
            k,
        })
    }

    pub(super) fn forward(&self, x: &Array) -> mlx::Result<Array> {
        self.forward_with(x, false, None)
    }

    /// The convolution of `x` enlarged ×2 by nearest neighbour when `upsample` (a 3×3 kernel
    /// only), plus `residual` (shaped as the output) when given. On the CPU a 3×3 kernel does
    /// both in its own pass (`fast::conv3x3_same`), without the enlarged copy or the sum's
    /// operand: those buffers are the decoder's largest, and each new one costs its page faults.
    pub(super) fn forward_with(
        &self,
        x: &Array,
        upsample: bool,
        residual: Option<&Array>,
    ) -> mlx::Result<Array> {
        if crate::platform::convolutions_as_matmuls() && self.k == 3 {
            x.eval()?;
            let y = fast::conv3x3_same(x, &self.matrix, &self.bias, upsample, residual)?;
            y.eval()?;
            return Ok(y);
        }
        let x = match upsample {
            true => upsample_nearest_2x(x)?,
            false => x.clone(),
        };
        let y = self.convolve(&x)?;
        match residual {
            Some(r) => y + r,
            None => Ok(y),
        }
    }

    fn convolve(&self, x: &Array) -> mlx::Result<Array> {
        if crate::platform::convolutions_as_matmuls() {
            // On the CPU the decoder runs one convolution at a time: its input, then its output,
            // evaluated here. As one lazy graph MLX would allocate every activation before
            // computing any; this way each buffer is recycled through MLX's cache. Measured at
            // 512²: peak 1.0 GB instead of 2.4 GB, no slower (faster at small sizes).
            x.eval()?;
            let y = fast::conv2d_same(x, &self.matrix, &self.bias, self.k)?;
            y.eval()?;
            Ok(y)
        } else {
            // The GPU graph evaluates around each convolution too, for the same reason: its
            // queued kernels would otherwise hold every activation of the decoder at once.
            let eager = crate::platform::evaluates_per_block();
            if eager {
                x.eval()?;
            }
            let p = self.k / 2;
            let y = (ops::conv2d(x, &self.weight, (1, 1), (p, p), (1, 1), 1)? + &self.bias)?;
            if eager {
                y.eval()?;
            }
            Ok(y)
        }
    }
}

/// A `[O, k, k, I]` (MLX layout) convolution weight as the `[k·k·I, O]` matrix whose row
/// `(dy·k + dx)·I + i` holds tap `(dy, dx)` of input channel `i`: the form
/// [`fast::conv2d_same`] takes.
pub fn conv_matrix(weight: &Array) -> mlx::Result<Array> {
    let s = weight.shape();
    let (cout, k, cin) = (s[0], s[1], s[3]);
    weight
        .transpose(&[1, 2, 3, 0])?
        .reshape(&[k * k * cin, cout])
}

/// GroupNorm with PyTorch's grouping (consecutive channels), statistics in f32.
pub(super) struct GroupNorm {
    weight: Array,
    bias: Array,
    groups: i32,
    eps: f32,
}

impl GroupNorm {
    pub(super) fn new(w: &Weights, channels: i32, groups: i32) -> mlx::Result<GroupNorm> {
        Ok(GroupNorm {
            weight: w.get("weight", &[channels])?,
            bias: w.get("bias", &[channels])?,
            groups,
            eps: 1e-6,
        })
    }

    /// `x`: [B, H, W, C].
    fn forward(&self, x: &Array) -> mlx::Result<Array> {
        mlx::fast::group_norm(x, &self.weight, &self.bias, self.groups, self.eps, false)
    }

    /// `silu(forward(x))`, fused: the decoder follows most of its norms with SiLU.
    pub(super) fn forward_silu(&self, x: &Array) -> mlx::Result<Array> {
        mlx::fast::group_norm(x, &self.weight, &self.bias, self.groups, self.eps, true)
    }
}

pub(super) struct ResnetBlock {
    norm1: GroupNorm,
    conv1: Conv2d,
    norm2: GroupNorm,
    conv2: Conv2d,
    shortcut: Option<Conv2d>,
}

impl ResnetBlock {
    pub(super) fn new(w: &Weights, cin: i32, cout: i32, groups: i32) -> mlx::Result<ResnetBlock> {
        Ok(ResnetBlock {
            norm1: GroupNorm::new(&w.pp("norm1"), cin, groups)?,
            conv1: Conv2d::new(&w.pp("conv1"), cin, cout, 3)?,
            norm2: GroupNorm::new(&w.pp("norm2"), cout, groups)?,
            conv2: Conv2d::new(&w.pp("conv2"), cout, cout, 3)?,
            shortcut: if cin != cout {
                Some(Conv2d::new(&w.pp("conv_shortcut"), cin, cout, 1)?)
            } else {
                None
            },
        })
    }

    /// `count` blocks `resnets.0…`, the first from `cin` channels to `cout`, the rest `cout`
    /// to `cout` (a down or up block's resnets).
    pub(super) fn stack(
        w: &Weights,
        cin: i32,
        cout: i32,
        count: i32,
        groups: i32,
    ) -> mlx::Result<Vec<ResnetBlock>> {
        (0..count)
            .map(|r| ResnetBlock::new(&w.pp(r), if r == 0 { cin } else { cout }, cout, groups))
            .collect()
    }

    /// `shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))`, the sum made by conv2 itself.
    pub(super) fn forward(&self, x: &Array) -> mlx::Result<Array> {
        let normed = self
            .norm2
            .forward_silu(&self.conv1.forward(&self.norm1.forward_silu(x)?)?)?;
        let residual = match &self.shortcut {
            Some(s) => s.forward(x)?,
            None => x.clone(),
        };
        self.conv2.forward_with(&normed, false, Some(&residual))
    }
}

/// Single-head self-attention over all pixels, with a residual connection.
pub(super) struct MidAttention {
    group_norm: GroupNorm,
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
}

/// Queries per attention chunk: bounds the score matrix at large sizes (one head as wide as
/// the channels has no fused kernel, so its scores are materialised, 4096 × tokens at a time).
/// `vae_tiling`'s memory model counts with it.
pub(super) const ATTENTION_CHUNK: i32 = 4096;

impl MidAttention {
    pub(super) fn new(w: &Weights, c: i32, groups: i32) -> mlx::Result<MidAttention> {
        Ok(MidAttention {
            group_norm: GroupNorm::new(&w.pp("group_norm"), c, groups)?,
            to_q: Linear::new(&w.pp("to_q"), c, c, true)?,
            to_k: Linear::new(&w.pp("to_k"), c, c, true)?,
            to_v: Linear::new(&w.pp("to_v"), c, c, true)?,
            to_out: Linear::new(&w.pp("to_out").pp(0), c, c, true)?,
        })
    }

    pub(super) fn forward(&self, x: &Array) -> mlx::Result<Array> {
        let s = x.shape();
        let (b, h, w, c) = (s[0], s[1], s[2], s[3]);
        // Row-major (y, x) token order, as torch's view(B, C, h·w).
        let (q, k, v) = {
            let t = self.group_norm.forward(x)?.reshape(&[b, h * w, c])?;
            (
                self.to_q.forward(&t)?,
                self.to_k.forward(&t)?,
                self.to_v.forward(&t)?,
            )
        };
        let scale = 1.0 / (c as f32).sqrt();
        // One head of width C: [B, 1, tokens, C].
        let (k, v) = (k.expand_dims(1)?, v.expand_dims(1)?);
        let n = h * w;
        // Evaluated as it goes: q, k and v (freeing the normed input), then one chunk at a time.
        // Chunks left in one lazy graph are computed side by side, every chunk's scores alive at
        // once (measured at 128² latents: 2.2 GB instead of one chunk's 0.55 GB), which would
        // undo the chunking. On the CPU always, as the convolutions are; on a GPU when there is
        // more than one chunk.
        let eager = crate::platform::convolutions_as_matmuls()
            || crate::platform::evaluates_per_block()
            || n > ATTENTION_CHUNK;
        if eager {
            mlx::eval(&[&q, &k, &v])?;
        }
        let mut chunks = Vec::new();
        for start in (0..n).step_by(ATTENTION_CHUNK as usize) {
            let qc = q
                .slice_axis(1, start, (start + ATTENTION_CHUNK).min(n))?
                .expand_dims(1)?;
            let o = fast::scaled_dot_product_attention(&qc, &k, &v, scale, fast::Mask::None)?
                .squeeze(1)?;
            if eager {
                o.eval()?;
            }
            chunks.push(o);
        }
        let refs: Vec<&Array> = chunks.iter().collect();
        let o = if refs.len() == 1 {
            chunks[0].clone()
        } else {
            ops::concatenate(&refs, 1)?
        };
        let o = self.to_out.forward(&o)?.reshape(&[b, h, w, c])?;
        o + x
    }
}

/// `UNetMidBlock2D`: a resnet, attention over all pixels (when the config has it), a resnet.
pub(super) struct MidBlock {
    resnets: [ResnetBlock; 2],
    attention: Option<MidAttention>,
}

impl MidBlock {
    pub(super) fn new(w: &Weights, c: i32, groups: i32, attention: bool) -> mlx::Result<MidBlock> {
        Ok(MidBlock {
            resnets: [
                ResnetBlock::new(&w.pp("resnets.0"), c, c, groups)?,
                ResnetBlock::new(&w.pp("resnets.1"), c, c, groups)?,
            ],
            attention: if attention {
                Some(MidAttention::new(&w.pp("attentions.0"), c, groups)?)
            } else {
                None
            },
        })
    }

    pub(super) fn forward(&self, x: &Array) -> mlx::Result<Array> {
        let mut x = self.resnets[0].forward(x)?;
        if let Some(attn) = &self.attention {
            x = attn.forward(&x)?;
        }
        self.resnets[1].forward(&x)
    }
}

struct UpBlock {
    resnets: Vec<ResnetBlock>,
    upsample: Option<Conv2d>,
}

/// Nearest-neighbour ×2 of NHWC `x`, as one broadcast copy: each pixel becomes a 2×2 block.
fn upsample_nearest_2x(x: &Array) -> mlx::Result<Array> {
    let s = x.shape();
    let (b, h, w, c) = (s[0], s[1], s[2], s[3]);
    x.reshape(&[b, h, 1, w, 1, c])?
        .broadcast_to(&[b, h, 2, w, 2, c])?
        .reshape(&[b, 2 * h, 2 * w, c])
}

/// The decoder: scaled latents → image in [-1, 1], NHWC.
pub struct VaeDecoder {
    /// A 1×1 convolution before the decoder (FLUX.2's VAE; none in the 16-channel one).
    post_quant_conv: Option<Conv2d>,
    conv_in: Conv2d,
    mid: MidBlock,
    up_blocks: Vec<UpBlock>,
    norm_out: GroupNorm,
    conv_out: Conv2d,
    pub config: VaeConfig,
    dtype: Dtype,
}

impl VaeDecoder {
    pub fn new(cfg: &VaeConfig, mut ckpt: Checkpoint) -> Result<VaeDecoder, super::ModelError> {
        cfg.validate().map_err(super::ModelError::Config)?;
        ckpt.allow_unused("encoder.");
        ckpt.allow_unused("quant_conv.");
        // FLUX.2's latent statistics: its pipeline reads them, the decoder does not.
        ckpt.allow_unused("bn.");
        let dtype = ckpt.dtype();
        let post_quant_conv = match cfg.use_post_quant_conv {
            true => {
                let c = cfg.latent_channels;
                Some(Conv2d::new(&ckpt.root().pp("post_quant_conv"), c, c, 1)?)
            }
            false => None,
        };
        let model = {
            let w = ckpt.root().pp("decoder");
            let g = cfg.norm_num_groups;
            let chans: Vec<i32> = cfg.block_out_channels.iter().rev().copied().collect();
            let top = chans[0];
            let mid = w.pp("mid_block");
            let mut up_blocks = Vec::new();
            let mut cin = top;
            for (i, &cout) in chans.iter().enumerate() {
                let bw = w.pp("up_blocks").pp(i);
                let resnets =
                    ResnetBlock::stack(&bw.pp("resnets"), cin, cout, cfg.layers_per_block + 1, g)?;
                let upsample = if i + 1 < chans.len() {
                    Some(Conv2d::new(&bw.pp("upsamplers.0.conv"), cout, cout, 3)?)
                } else {
                    None
                };
                up_blocks.push(UpBlock { resnets, upsample });
                cin = cout;
            }
            let last = *chans.last().expect("validated non-empty");
            VaeDecoder {
                post_quant_conv,
                conv_in: Conv2d::new(&w.pp("conv_in"), cfg.latent_channels, top, 3)?,
                mid: MidBlock::new(&mid, top, g, cfg.mid_block_add_attention)?,
                up_blocks,
                norm_out: GroupNorm::new(&w.pp("conv_norm_out"), last, g)?,
                conv_out: Conv2d::new(&w.pp("conv_out"), last, cfg.out_channels, 3)?,
                config: cfg.clone(),
                dtype,
            }
        };
        ckpt.finish()?;
        Ok(model)
    }

    /// Decodes the denoised latents `[C, h, w]` (f32) into an image `[H, W, 3]` in [-1, 1],
    /// in the VAE's dtype. Un-scaling happens in that dtype, as in the reference.
    pub fn decode(&self, latents: &Array) -> mlx::Result<Array> {
        let z = latents
            .astype(self.dtype)?
            .transpose(&[1, 2, 0])?
            .expand_dims(0)?;
        let z = (z / self.config.scaling_factor)?;
        let z = match self.config.shift_factor {
            Some(s) => (z + s)?,
            None => z,
        };
        let z = match &self.post_quant_conv {
            Some(conv) => conv.forward(&z)?,
            None => z,
        };
        let mut x = self.conv_in.forward(&z)?;
        x = self.mid.forward(&x)?;
        for block in &self.up_blocks {
            for r in &block.resnets {
                x = r.forward(&x)?;
            }
            if let Some(conv) = &block.upsample {
                // Nearest-neighbour ×2, then a 3×3 convolution.
                x = conv.forward_with(&x, true, None)?;
            }
        }
        let x = self.conv_out.forward(&self.norm_out.forward_silu(&x)?)?;
        x.squeeze(0)
    }
}

/// `[H, W, 3]` decoder output in [-1, 1] → RGB bytes, in the reference's order: denormalise and
/// clamp in the VAE dtype, then ×255 in f32 and round half to even.
pub fn to_rgb8(image: &Array) -> mlx::Result<Vec<u8>> {
    let x = ops::clip(&((image * 0.5)? + 0.5)?, Some(0.0), Some(1.0))?;
    let v = x.astype(Dtype::F32)?.to_vec::<f32>()?;
    Ok(v.into_iter()
        .map(|p| (p * 255.0).round_ties_even() as u8)
        .collect())
}
