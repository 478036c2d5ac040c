//! `FluxTransformer2DModel` (flux1-spec §5): packed latent tokens, T5's prompt rows, CLIP's
//! pooled vector, the noise level and (for the guidance-distilled models) the guidance scale →
//! the flow velocity. Double-stream blocks keep text and image apart but attend jointly;
//! single-stream blocks run attention and the MLP side by side over `[text ; image]`. Unlike
//! FLUX.2's, every block reads its own modulation of the one conditioning vector, and every
//! linear layer has a bias.

use super::rope::AXES;
use crate::mlx::{self, fast, ops, Array, Dtype};
use crate::models::blocks::{after_block, apply_rope, attend, sinusoid};
use crate::models::weights::{Checkpoint, Linear, Release, RmsNorm, Weights};
use crate::models::{check_range, ModelError, MAX_COUNT, MAX_WIDTH};

/// Where the config lives in a diffusers directory; errors name it.
pub const CONFIG_FILE: &str = "transformer/config.json";

/// The MLPs' hidden width over the model width: diffusers' fixed `mlp_ratio` 4.
const MLP_RATIO: i32 = 4;
/// Every norm's epsilon (LayerNorms and q/k RMS norms), not in the config.
const EPS: f32 = 1e-6;
/// The width of the timestep and guidance sinusoids (`Timesteps(num_channels=256)`).
const SINUSOID_WIDTH: i32 = 256;

/// `transformer/config.json`, the keys the forward pass uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Flux1Config {
    #[serde(default = "one")]
    pub patch_size: i32,
    pub in_channels: i32,
    #[serde(default)]
    pub out_channels: Option<i32>,
    pub num_layers: i32,
    pub num_single_layers: i32,
    pub attention_head_dim: i32,
    pub num_attention_heads: i32,
    pub joint_attention_dim: i32,
    pub pooled_projection_dim: i32,
    /// A guidance-distilled model (\[dev\], Kontext): the guidance scale is an input.
    #[serde(default)]
    pub guidance_embeds: bool,
    pub axes_dims_rope: Vec<i32>,
}

fn one() -> i32 {
    1
}

impl Flux1Config {
    /// Reads [`CONFIG_FILE`] and validates it; errors name the file and the key.
    pub fn from_json(bytes: &[u8]) -> Result<Flux1Config, ModelError> {
        let cfg: Flux1Config = crate::models::parse_json(bytes, CONFIG_FILE)?;
        cfg.validate()
            .map_err(|e| ModelError::Config(format!("`{CONFIG_FILE}`: {e}")))?;
        Ok(cfg)
    }

    /// Checks every key a shape or table is sized by, before anything is allocated.
    pub fn validate(&self) -> Result<(), String> {
        const WHAT: &str = "transformer";
        if self.patch_size != 1 {
            return Err(format!(
                "{WHAT} `patch_size` is {}; the pipeline packs 2×2 latent patches itself, so it must be 1",
                self.patch_size
            ));
        }
        check_range(WHAT, "in_channels", self.in_channels, 1..=MAX_WIDTH)?;
        if let Some(out) = self.out_channels.filter(|&o| o != self.in_channels) {
            return Err(format!(
                "{WHAT} `out_channels` {out} differs from `in_channels` {}",
                self.in_channels
            ));
        }
        let sizes = [
            ("num_layers", self.num_layers, 0..=MAX_COUNT),
            ("num_single_layers", self.num_single_layers, 0..=MAX_COUNT),
            ("attention_head_dim", self.attention_head_dim, 2..=4096),
            (
                "num_attention_heads",
                self.num_attention_heads,
                1..=MAX_COUNT,
            ),
            (
                "joint_attention_dim",
                self.joint_attention_dim,
                1..=MAX_WIDTH * 4,
            ),
            (
                "pooled_projection_dim",
                self.pooled_projection_dim,
                1..=MAX_WIDTH,
            ),
        ];
        for (key, value, range) in sizes {
            check_range(WHAT, key, value, range)?;
        }
        // The heads' product sizes every stream; the MLPs are 4× and the single blocks'
        // output projection reads 5× that, which this bound keeps within i32.
        check_range(
            WHAT,
            "num_attention_heads × attention_head_dim",
            self.dim(),
            1..=MAX_WIDTH,
        )?;
        crate::models::rope::check_axes(&self.axes_dims_rope, self.attention_head_dim, AXES)
    }

    /// The model width `D`.
    pub fn dim(&self) -> i32 {
        self.num_attention_heads * self.attention_head_dim
    }

    /// The MLPs' hidden width.
    pub fn mlp_dim(&self) -> i32 {
        MLP_RATIO * self.dim()
    }
}

/// `LN(x)·(1 + scale) + shift`, LN without affine (the adaLN-Zero modulation).
fn modulate(x: &Array, shift: &Array, scale: &Array) -> mlx::Result<Array> {
    (fast::layer_norm(x, None, None, EPS)? * (scale + 1.0)?)? + shift
}

/// `[S, H·hd]` → `[S, H, hd]`, RMS-normed per head when `norm` is given.
fn split_heads(t: &Array, heads: i32, norm: Option<&RmsNorm>) -> mlx::Result<Array> {
    let t = t.reshape(&[t.dim(0), heads, t.dim(1) / heads])?;
    match norm {
        Some(n) => n.forward(&t),
        None => Ok(t),
    }
}

/// Softmax attention over all rows (no mask) of `[S, H, hd]` q, k, v, q and k rotated by
/// `rope` in f32 and rounded back: `[S, H·hd]`.
fn attention(q: &Array, k: &Array, v: &Array, rope: &(Array, Array)) -> mlx::Result<Array> {
    let [s, h, hd] = [q.dim(0), q.dim(1), q.dim(2)];
    let bhsd = |t: &Array| t.transpose(&[1, 0, 2])?.expand_dims(0);
    let o = attend(
        &bhsd(&apply_rope(q, rope)?)?,
        &bhsd(&apply_rope(k, rope)?)?,
        &bhsd(v)?,
        1.0 / (hd as f32).sqrt(),
    )?;
    o.squeeze(0)?.transpose(&[1, 0, 2])?.reshape(&[s, h * hd])
}

/// The shim's q/k-norm, RoPE and scaling of joined q|k|v projections, `rope` the rows' tables.
fn qkv_heads<'a>(
    norm_q: &'a RmsNorm,
    norm_k: &'a RmsNorm,
    (cos, sin): (&'a Array, &'a Array),
    heads: i32,
) -> fast::QkvHeads<'a> {
    let hd = norm_q.weight().dim(0);
    fast::QkvHeads {
        q_weight: norm_q.weight(),
        k_weight: norm_k.weight(),
        cos,
        sin,
        heads,
        eps: norm_q.eps(),
        q_scale: 1.0 / (hd as f32).sqrt(),
    }
}

/// A linear layer of the checkpoint, all of FLUX.1's have a bias.
fn linear(w: &Weights, name: &str, in_dim: i32, out_dim: i32) -> mlx::Result<Linear> {
    Linear::new(&w.pp(name), in_dim, out_dim, true)
}

/// The outputs of linear layers that read the same rows `x`, side by side. The CPU form's
/// kernels read q|k|v as one array; the layers still run one product each (joined, they would
/// round otherwise than the streamed and LoRA-adapted forms, which cannot join).
fn side_by_side(parts: &[&Linear], x: &Array) -> mlx::Result<Array> {
    let outputs = (parts.iter())
        .map(|p| p.forward(x))
        .collect::<mlx::Result<Vec<_>>>()?;
    ops::concatenate(&outputs.iter().collect::<Vec<_>>(), 1)
}

/// `linear_2(SiLU(linear_1(x)))`: the timestep, guidance and pooled-text embedders.
struct Embedder {
    linear_1: Linear,
    linear_2: Linear,
}

impl Embedder {
    fn new(w: &Weights, in_dim: i32, d: i32) -> mlx::Result<Embedder> {
        Ok(Embedder {
            linear_1: linear(w, "linear_1", in_dim, d)?,
            linear_2: linear(w, "linear_2", d, d)?,
        })
    }

    fn forward(&self, x: &Array) -> mlx::Result<Array> {
        self.linear_2.forward(&self.linear_1.forward(x)?.silu()?)
    }
}

/// One stream of a double block: its modulation, projections, q/k norms, attention output and
/// feed-forward (`D → 4D → D` with the tanh GELU).
struct Stream {
    modulation: Linear,
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    to_out: Linear,
    ff_in: Linear,
    ff_out: Linear,
}

/// A stream's tensor names: the modulation, the attention's q, k, v, q norm, k norm and output
/// under `attn`, and the feed-forward module.
struct StreamNames {
    modulation: &'static str,
    attn: [&'static str; 6],
    ff: &'static str,
}

const IMAGE: StreamNames = StreamNames {
    modulation: "norm1.linear",
    attn: ["to_q", "to_k", "to_v", "norm_q", "norm_k", "to_out.0"],
    ff: "ff",
};

const TEXT: StreamNames = StreamNames {
    modulation: "norm1_context.linear",
    attn: [
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "norm_added_q",
        "norm_added_k",
        "to_add_out",
    ],
    ff: "ff_context",
};

impl Stream {
    fn new(w: &Weights, names: &StreamNames, cfg: &Flux1Config) -> mlx::Result<Stream> {
        let (d, m, hd) = (cfg.dim(), cfg.mlp_dim(), cfg.attention_head_dim);
        let (a, ff) = (w.pp("attn"), w.pp(names.ff).pp("net"));
        Ok(Stream {
            modulation: linear(w, names.modulation, d, 6 * d)?,
            to_q: linear(&a, names.attn[0], d, d)?,
            to_k: linear(&a, names.attn[1], d, d)?,
            to_v: linear(&a, names.attn[2], d, d)?,
            norm_q: RmsNorm::new(&a.pp(names.attn[3]), hd, EPS)?,
            norm_k: RmsNorm::new(&a.pp(names.attn[4]), hd, EPS)?,
            to_out: linear(&a, names.attn[5], d, d)?,
            ff_in: linear(&ff, "0.proj", d, m)?,
            ff_out: linear(&ff, "2", m, d)?,
        })
    }

    /// The six chunks `shift, scale, gate` (attention), `shift, scale, gate` (MLP), `[1, D]`.
    fn chunks(&self, cond: &Array) -> mlx::Result<Vec<Array>> {
        ops::split(&self.modulation.forward(cond)?, 6, 1)
    }

    /// q, k, v `[S, H, hd]` of the stream modulated by `m`.
    fn qkv(&self, x: &Array, m: &[Array], heads: i32) -> mlx::Result<[Array; 3]> {
        let h = modulate(x, &m[0], &m[1])?;
        Ok([
            split_heads(&self.to_q.forward(&h)?, heads, Some(&self.norm_q))?,
            split_heads(&self.to_k.forward(&h)?, heads, Some(&self.norm_k))?,
            split_heads(&self.to_v.forward(&h)?, heads, None)?,
        ])
    }

    /// Attention's inputs `[3, H, S, hd]` from q|k|v side by side: q and k normed per head
    /// and rotated by the stream's rows of `rope`, q times `1/√hd` (the shim's one pass).
    fn heads(
        &self,
        x: &Array,
        m: &[Array],
        rope: (&Array, &Array),
        heads: i32,
    ) -> mlx::Result<Array> {
        let h = modulate(x, &m[0], &m[1])?;
        let qkv = side_by_side(&[&self.to_q, &self.to_k, &self.to_v], &h)?;
        qkv_heads(&self.norm_q, &self.norm_k, rope, heads).split(&qkv)
    }

    /// The residual updates once attention has run: `x += gate·out(o)`, then
    /// `x += gate·FF(modulated x)`.
    fn finish(&self, x: &Array, o: &Array, m: &[Array]) -> mlx::Result<Array> {
        let x = (x + (&m[2] * self.to_out.forward(o)?)?)?;
        let h = modulate(&x, &m[3], &m[4])?;
        let f = self.ff_out.forward(&self.ff_in.forward(&h)?.gelu_tanh()?)?;
        &x + (&m[5] * f)?
    }
}

/// `transformer_blocks.{b}`: image and text streams with joint attention over `[text ; image]`.
struct DoubleBlock {
    image: Stream,
    text: Stream,
    /// The CPU form ([`crate::platform::fused_transformer_kernels`]): q and k through the shim's
    /// norm, RoPE and attention kernels.
    fused: bool,
}

impl DoubleBlock {
    /// `x` image rows `[N, D]`, `y` text rows `[T, D]`, `cond` `SiLU(temb)` `[1, D]`.
    fn forward(
        &self,
        x: &Array,
        y: &Array,
        cond: &Array,
        rope: &(Array, Array),
        heads: i32,
    ) -> mlx::Result<(Array, Array)> {
        let (mi, mt) = (self.image.chunks(cond)?, self.text.chunks(cond)?);
        let t = y.dim(0);
        if self.fused {
            // Each stream normed and rotated with its own weights and rows of the tables, then
            // one attention over `[text ; image]`.
            let rows = |a: &Array, from: i32, to: i32| a.slice_axis(0, from, to);
            let s = t + x.dim(0);
            let (ct, st) = (rows(&rope.0, 0, t)?, rows(&rope.1, 0, t)?);
            let (ci, si) = (rows(&rope.0, t, s)?, rows(&rope.1, t, s)?);
            let hy = self.text.heads(y, &mt, (&ct, &st), heads)?;
            let hx = self.image.heads(x, &mi, (&ci, &si), heads)?;
            let o = fast::attention_rows(&ops::concatenate(&[&hy, &hx], 2)?)?;
            let (oy, ox) = (o.slice_axis(0, 0, t)?, o.slice_axis(0, t, s)?);
            return Ok((
                self.image.finish(x, &ox, &mi)?,
                self.text.finish(y, &oy, &mt)?,
            ));
        }
        let [qx, kx, vx] = self.image.qkv(x, &mi, heads)?;
        let [qy, ky, vy] = self.text.qkv(y, &mt, heads)?;
        let cat = |a: &Array, b: &Array| ops::concatenate(&[a, b], 0);
        let o = attention(&cat(&qy, &qx)?, &cat(&ky, &kx)?, &cat(&vy, &vx)?, rope)?;
        let (oy, ox) = (o.slice_axis(0, 0, t)?, o.slice_axis(0, t, o.dim(0))?);
        Ok((
            self.image.finish(x, &ox, &mi)?,
            self.text.finish(y, &oy, &mt)?,
        ))
    }
}

/// `single_transformer_blocks.{b}`: attention (no output projection of its own) and the MLP
/// read the same modulated rows; one projection takes both, side by side.
struct SingleBlock {
    modulation: Linear,
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    proj_mlp: Linear,
    proj_out: Linear,
    /// The CPU form, as [`DoubleBlock::fused`].
    fused: bool,
}

impl SingleBlock {
    fn new(w: &Weights, cfg: &Flux1Config, fused: bool) -> mlx::Result<SingleBlock> {
        let (d, m, hd) = (cfg.dim(), cfg.mlp_dim(), cfg.attention_head_dim);
        let a = w.pp("attn");
        Ok(SingleBlock {
            modulation: linear(w, "norm.linear", d, 3 * d)?,
            to_q: linear(&a, "to_q", d, d)?,
            to_k: linear(&a, "to_k", d, d)?,
            to_v: linear(&a, "to_v", d, d)?,
            norm_q: RmsNorm::new(&a.pp("norm_q"), hd, EPS)?,
            norm_k: RmsNorm::new(&a.pp("norm_k"), hd, EPS)?,
            proj_mlp: linear(w, "proj_mlp", d, m)?,
            fused,
            proj_out: linear(w, "proj_out", d + m, d)?,
        })
    }

    /// `z += gate·proj_out([attn(ẑ) | GELU(proj_mlp(ẑ))])`, `ẑ` the modulated `z` `[S, D]`.
    fn forward(
        &self,
        z: &Array,
        cond: &Array,
        rope: &(Array, Array),
        heads: i32,
    ) -> mlx::Result<Array> {
        let m = ops::split(&self.modulation.forward(cond)?, 3, 1)?;
        let h = modulate(z, &m[0], &m[1])?;
        let mlp = self.proj_mlp.forward(&h)?.gelu_tanh()?;
        let o = match self.fused {
            true => {
                let qkv = side_by_side(&[&self.to_q, &self.to_k, &self.to_v], &h)?;
                qkv_heads(&self.norm_q, &self.norm_k, (&rope.0, &rope.1), heads).attention(&qkv)?
            }
            false => {
                let q = split_heads(&self.to_q.forward(&h)?, heads, Some(&self.norm_q))?;
                let k = split_heads(&self.to_k.forward(&h)?, heads, Some(&self.norm_k))?;
                let v = split_heads(&self.to_v.forward(&h)?, heads, None)?;
                attention(&q, &k, &v, rope)?
            }
        };
        let out = self.proj_out.forward(&ops::concatenate(&[&o, &mlp], 1)?)?;
        z + (&m[2] * out)?
    }
}

/// The transformer, batch 1: token rows `[N', C]` in (the output grid's, then any reference
/// picture's), `[N', C]` velocity out.
pub struct Flux1Transformer {
    x_embedder: Linear,
    context_embedder: Linear,
    time: Embedder,
    guidance: Option<Embedder>,
    pooled_text: Embedder,
    double: Vec<DoubleBlock>,
    single: Vec<SingleBlock>,
    norm_out: Linear,
    proj_out: Linear,
    release: Option<Release>,
    dtype: Dtype,
    pub config: Flux1Config,
}

impl Flux1Transformer {
    /// Binds every tensor of `ckpt` by diffusers' names; any missing, mis-shaped or unused
    /// tensor is an error.
    pub fn new(cfg: &Flux1Config, ckpt: Checkpoint) -> Result<Flux1Transformer, ModelError> {
        cfg.validate().map_err(ModelError::Config)?;
        let (d, c) = (cfg.dim(), cfg.in_channels);
        let w = ckpt.root();
        let te = w.pp("time_text_embed");
        let guidance = match cfg.guidance_embeds {
            true => Some(Embedder::new(
                &te.pp("guidance_embedder"),
                SINUSOID_WIDTH,
                d,
            )?),
            false => None,
        };
        let fused = crate::platform::fused_transformer_kernels(ckpt.dtype());
        let double = (0..cfg.num_layers)
            .map(|b| {
                let bw = w.pp("transformer_blocks").pp(b);
                Ok(DoubleBlock {
                    image: Stream::new(&bw, &IMAGE, cfg)?,
                    text: Stream::new(&bw, &TEXT, cfg)?,
                    fused,
                })
            })
            .collect::<mlx::Result<Vec<_>>>()?;
        let single = (0..cfg.num_single_layers)
            .map(|b| SingleBlock::new(&w.pp("single_transformer_blocks").pp(b), cfg, fused))
            .collect::<mlx::Result<Vec<_>>>()?;
        let model = Flux1Transformer {
            x_embedder: linear(&w, "x_embedder", c, d)?,
            context_embedder: linear(&w, "context_embedder", cfg.joint_attention_dim, d)?,
            time: Embedder::new(&te.pp("timestep_embedder"), SINUSOID_WIDTH, d)?,
            guidance,
            pooled_text: Embedder::new(&te.pp("text_embedder"), cfg.pooled_projection_dim, d)?,
            double,
            single,
            norm_out: linear(&w, "norm_out.linear", d, 2 * d)?,
            proj_out: linear(&w, "proj_out", d, c)?,
            release: ckpt.release(),
            dtype: ckpt.dtype(),
            config: cfg.clone(),
        };
        ckpt.finish()?;
        Ok(model)
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The noise level as the model sees it: the pipeline hands `t/1000` in the latents' dtype
    /// and the model multiplies by 1000 in its own, rounding each time (flux1-spec §6.3).
    pub fn model_time(&self, t: f32) -> mlx::Result<f32> {
        let t = Array::from_slice(&[t], &[1])?.astype(self.dtype)?;
        ((t / 1000.0)? * 1000.0)?.astype(Dtype::F32)?.item::<f32>()
    }

    /// The guidance scale as the model sees it: f32, cast to the model's dtype and ×1000 there
    /// (in bf16 3.5 becomes 3504).
    pub fn model_guidance(&self, g: f32) -> mlx::Result<f32> {
        let g = Array::from_slice(&[g], &[1])?.astype(self.dtype)?;
        (g * 1000.0)?.astype(Dtype::F32)?.item::<f32>()
    }

    /// `embedder(sinusoid(s))` `[1, D]`, the sinusoid in f32 cast to the model's dtype.
    fn embed_scalar(&self, embedder: &Embedder, s: f32) -> mlx::Result<Array> {
        let e = sinusoid(s, SINUSOID_WIDTH);
        embedder.forward(&Array::from_slice(&e, &[1, SINUSOID_WIDTH])?.astype(self.dtype)?)
    }

    /// `temb` `[1, D]`: the time's embedding, plus the guidance's on a guidance-distilled
    /// model, plus the pooled text's, summed in that order.
    fn conditioning(&self, t: f32, guidance: Option<f32>, pooled: &Array) -> mlx::Result<Array> {
        let mut temb = self.embed_scalar(&self.time, self.model_time(t)?)?;
        if let Some(embedder) = &self.guidance {
            let g = guidance.ok_or_else(|| {
                mlx::Error::new(
                    "transformer",
                    "this model embeds the guidance scale, and none was given",
                )
            })?;
            temb = (&temb + self.embed_scalar(embedder, self.model_guidance(g)?)?)?;
        }
        let p = pooled.reshape(&[1, self.config.pooled_projection_dim])?;
        &temb + self.pooled_text.forward(&p.astype(self.dtype)?)?
    }

    /// The velocity for `tokens` `[N', C]` at schedule time `t` (`σ·1000`) with the guidance
    /// scale `guidance` (read only by a guidance-distilled model; a model without the embedder
    /// ignores it, as the pipeline passes none), CLIP's `pooled` vector `[P]` or `[1, P]`, T5's
    /// rows `text` `[T, J]` and the RoPE tables of `[text ; tokens]`: `[N', C]` in the model's
    /// dtype.
    pub fn forward(
        &self,
        tokens: &Array,
        t: f32,
        guidance: Option<f32>,
        pooled: &Array,
        text: &Array,
        rope: &(Array, Array),
    ) -> mlx::Result<Array> {
        let heads = self.config.num_attention_heads;
        let cond = self.conditioning(t, guidance, pooled)?.silu()?;
        let mut x = self.x_embedder.forward(&tokens.astype(self.dtype)?)?;
        let mut y = self.context_embedder.forward(&text.astype(self.dtype)?)?;
        for (i, block) in self.double.iter().enumerate() {
            (x, y) = block.forward(&x, &y, &cond, rope, heads)?;
            after_block(self.release.as_ref(), &x, ("transformer_blocks", i))?;
        }
        let text_rows = y.dim(0);
        let mut z = ops::concatenate(&[&y, &x], 0)?;
        for (i, block) in self.single.iter().enumerate() {
            z = block.forward(&z, &cond, rope, heads)?;
            after_block(self.release.as_ref(), &z, ("single_transformer_blocks", i))?;
        }
        let x = z.slice_axis(0, text_rows, z.dim(0))?;
        // `norm_out` puts scale first, shift second (the blocks' order is shift first).
        let out = ops::split(&self.norm_out.forward(&cond)?, 2, 1)?;
        self.proj_out.forward(&modulate(&x, &out[1], &out[0])?)
    }
}
