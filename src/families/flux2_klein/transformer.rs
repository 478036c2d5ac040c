//! `Flux2Transformer2DModel` (klein-spec §5): token latents, the stacked Qwen3 features and the
//! noise level → the flow velocity. Double-stream blocks keep text and image apart but attend
//! jointly; single-stream blocks run one fused projection over `[text ; image]`. Every block
//! takes its shift, scale and gate from three modulations computed once per forward. No biases.

use crate::mlx::{self, fast, ops, Array, Dtype};
use crate::models::blocks::{after_block, apply_rope, attend, sinusoid};
use crate::models::weights::{Checkpoint, Linear, Release, RmsNorm, Weights};
use crate::models::{check_finite, check_range, ModelError, MAX_COUNT, MAX_WIDTH};

/// `transformer/config.json`, the keys the forward pass uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Flux2Config {
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
    #[serde(default = "sinusoid_width")]
    pub timestep_guidance_channels: i32,
    pub mlp_ratio: f32,
    pub axes_dims_rope: Vec<i32>,
    pub rope_theta: f64,
    #[serde(default = "default_eps")]
    pub eps: f32,
    #[serde(default)]
    pub guidance_embeds: bool,
}

fn one() -> i32 {
    1
}
fn sinusoid_width() -> i32 {
    256
}
fn default_eps() -> f32 {
    1e-6
}

impl Flux2Config {
    /// Checks every key a shape or table is sized by, before anything is allocated.
    pub fn validate(&self) -> Result<(), String> {
        const WHAT: &str = "transformer";
        if self.patch_size != 1 {
            return Err(format!(
                "transformer `patch_size` is {}; FLUX.2 packs 2×2 latent patches itself, so it must be 1",
                self.patch_size
            ));
        }
        if self.guidance_embeds {
            return Err(
                "transformer `guidance_embeds: true` is not supported (FLUX.2 [klein] has no guidance embedder)"
                    .into(),
            );
        }
        check_range(WHAT, "in_channels", self.in_channels, 1..=MAX_WIDTH)?;
        if let Some(out) = self.out_channels.filter(|&o| o != self.in_channels) {
            return Err(format!(
                "transformer `out_channels` {out} differs from `in_channels` {}",
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
            ("dim", self.dim(), 1..=MAX_WIDTH),
            (
                "joint_attention_dim",
                self.joint_attention_dim,
                1..=MAX_WIDTH * 4,
            ),
            (
                "timestep_guidance_channels",
                self.timestep_guidance_channels,
                2..=MAX_WIDTH,
            ),
        ];
        for (key, value, range) in sizes {
            check_range(WHAT, key, value, range)?;
        }
        check_finite(WHAT, "mlp_ratio", self.mlp_ratio as f64, true)?;
        check_range(WHAT, "mlp hidden size", self.mlp_dim(), 1..=MAX_WIDTH * 4)?;
        check_finite(WHAT, "rope_theta", self.rope_theta, true)?;
        check_finite(WHAT, "eps", self.eps as f64, true)?;
        crate::models::rope::check_axes(&self.axes_dims_rope, self.attention_head_dim, 4)
    }

    pub fn dim(&self) -> i32 {
        self.num_attention_heads * self.attention_head_dim
    }

    /// The feed-forward hidden width `M`.
    pub fn mlp_dim(&self) -> i32 {
        (self.dim() as f32 * self.mlp_ratio) as i32
    }
}

/// `(1 + scale) ⊙ LN(x) + shift`, LN without affine.
fn modulate(x: &Array, shift: &Array, scale: &Array, eps: f32) -> mlx::Result<Array> {
    (fast::layer_norm(x, None, None, eps)? * (scale + 1.0)?)? + shift
}

/// `[1, n·D]` → n chunks `[1, D]`.
fn chunks(m: &Array, n: i32) -> mlx::Result<Vec<Array>> {
    ops::split(m, n, 1)
}

/// q, k or v of `[S, D]` as `[S, heads, head_dim]`, RMS-normed per head when `norm` is given.
fn heads(t: &Array, norm: Option<&RmsNorm>, heads: i32) -> mlx::Result<Array> {
    let s = t.dim(0);
    let t = t.reshape(&[s, heads, t.dim(1) / heads])?;
    match norm {
        Some(n) => n.forward(&t),
        None => Ok(t),
    }
}

/// Joint attention of `[S, H, hd]` q, k, v, q and k rotated by `rope`: `[S, H·hd]`.
fn joint_attention(q: &Array, k: &Array, v: &Array, rope: &(Array, Array)) -> mlx::Result<Array> {
    let s = q.shape();
    let scale = 1.0 / (s[2] as f32).sqrt();
    let bhsd = |t: Array| t.transpose(&[1, 0, 2])?.expand_dims(0);
    let o = attend(
        &bhsd(apply_rope(q, rope)?)?,
        &bhsd(apply_rope(k, rope)?)?,
        &bhsd(v.clone())?,
        scale,
    )?;
    o.squeeze(0)?
        .transpose(&[1, 0, 2])?
        .reshape(&[s[0], s[1] * s[2]])
}

/// One stream's half of a double block: projections, q/k norms, output, feed-forward.
struct Stream {
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    to_out: Linear,
    ff_in: Linear,
    ff_out: Linear,
}

impl Stream {
    fn new(w: &Weights, names: [&str; 6], ff: &str, cfg: &Flux2Config) -> mlx::Result<Stream> {
        let (d, m, hd) = (cfg.dim(), cfg.mlp_dim(), cfg.attention_head_dim);
        let a = w.pp("attn");
        Ok(Stream {
            to_q: Linear::new(&a.pp(names[0]), d, d, false)?,
            to_k: Linear::new(&a.pp(names[1]), d, d, false)?,
            to_v: Linear::new(&a.pp(names[2]), d, d, false)?,
            norm_q: RmsNorm::new(&a.pp(names[3]), hd, cfg.eps)?,
            norm_k: RmsNorm::new(&a.pp(names[4]), hd, cfg.eps)?,
            to_out: Linear::new(&a.pp(names[5]), d, d, false)?,
            ff_in: Linear::new(&w.pp(ff).pp("linear_in"), d, 2 * m, false)?,
            ff_out: Linear::new(&w.pp(ff).pp("linear_out"), m, d, false)?,
        })
    }

    /// q, k, v of the modulated stream.
    fn qkv(&self, x: &Array, n: i32) -> mlx::Result<[Array; 3]> {
        Ok([
            heads(&self.to_q.forward(x)?, Some(&self.norm_q), n)?,
            heads(&self.to_k.forward(x)?, Some(&self.norm_k), n)?,
            heads(&self.to_v.forward(x)?, None, n)?,
        ])
    }

    /// The residual updates after attention: `x + gate_a ⊙ out(o)`, then the gated SwiGLU.
    fn finish(&self, x: &Array, o: &Array, m: &[Array], eps: f32) -> mlx::Result<Array> {
        let x = (x + (&m[2] * self.to_out.forward(o)?)?)?;
        let h = modulate(&x, &m[3], &m[4], eps)?;
        let f = self
            .ff_out
            .forward(&fast::silu_gate(&self.ff_in.forward(&h)?)?)?;
        &x + (&m[5] * f)?
    }
}

/// `transformer_blocks.{b}`: image and text streams with joint attention (text first).
struct DoubleBlock {
    image: Stream,
    text: Stream,
}

impl DoubleBlock {
    /// `x` image `[N, D]`, `y` text `[T, D]`; `mi`/`mt` the six image/text chunks.
    fn forward(
        &self,
        x: &Array,
        y: &Array,
        (mi, mt): (&[Array], &[Array]),
        rope: &(Array, Array),
        (heads, eps): (i32, f32),
    ) -> mlx::Result<(Array, Array)> {
        let t = y.dim(0);
        let [qx, kx, vx] = self.image.qkv(&modulate(x, &mi[0], &mi[1], eps)?, heads)?;
        let [qy, ky, vy] = self.text.qkv(&modulate(y, &mt[0], &mt[1], eps)?, heads)?;
        let cat = |a: &Array, b: &Array| ops::concatenate(&[a, b], 0);
        let o = joint_attention(&cat(&qy, &qx)?, &cat(&ky, &kx)?, &cat(&vy, &vx)?, rope)?;
        let (oy, ox) = (o.slice_axis(0, 0, t)?, o.slice_axis(0, t, o.dim(0))?);
        Ok((
            self.image.finish(x, &ox, mi, eps)?,
            self.text.finish(y, &oy, mt, eps)?,
        ))
    }
}

/// `single_transformer_blocks.{b}`: one projection to q, k, v and the MLP's gate and value;
/// attention and MLP share the output projection.
struct SingleBlock {
    to_qkv_mlp: Linear,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    to_out: Linear,
}

impl SingleBlock {
    fn forward(
        &self,
        z: &Array,
        m: &[Array],
        rope: &(Array, Array),
        (heads_n, d, eps): (i32, i32, f32),
    ) -> mlx::Result<Array> {
        let p = self.to_qkv_mlp.forward(&modulate(z, &m[0], &m[1], eps)?)?;
        let part = |i: i32| p.slice_axis(1, i * d, (i + 1) * d);
        let q = heads(&part(0)?, Some(&self.norm_q), heads_n)?;
        let k = heads(&part(1)?, Some(&self.norm_k), heads_n)?;
        let v = heads(&part(2)?, None, heads_n)?;
        let o = joint_attention(&q, &k, &v, rope)?;
        let mlp = fast::silu_gate(&p.slice_axis(1, 3 * d, p.dim(1))?)?;
        let out = self.to_out.forward(&ops::concatenate(&[&o, &mlp], 1)?)?;
        z + (&m[2] * out)?
    }
}

/// The transformer, batch 1: token rows `[N', C]` in, `[N', C]` velocity out.
pub struct Flux2Transformer {
    x_embedder: Linear,
    context_embedder: Linear,
    t_linear_1: Linear,
    t_linear_2: Linear,
    modulation_img: Linear,
    modulation_txt: Linear,
    modulation_single: Linear,
    double: Vec<DoubleBlock>,
    single: Vec<SingleBlock>,
    norm_out: Linear,
    proj_out: Linear,
    release: Option<Release>,
    dtype: Dtype,
    pub config: Flux2Config,
}

impl Flux2Transformer {
    pub fn new(cfg: &Flux2Config, ckpt: Checkpoint) -> Result<Flux2Transformer, ModelError> {
        cfg.validate().map_err(ModelError::Config)?;
        let (d, m, c) = (cfg.dim(), cfg.mlp_dim(), cfg.in_channels);
        let hd = cfg.attention_head_dim;
        let w = ckpt.root();
        let lin = |name: &str, i: i32, o: i32| Linear::new(&w.pp(name), i, o, false);
        let t = w.pp("time_guidance_embed.timestep_embedder");
        let double = (0..cfg.num_layers)
            .map(|b| {
                let bw = w.pp("transformer_blocks").pp(b);
                Ok(DoubleBlock {
                    image: Stream::new(
                        &bw,
                        ["to_q", "to_k", "to_v", "norm_q", "norm_k", "to_out.0"],
                        "ff",
                        cfg,
                    )?,
                    text: Stream::new(
                        &bw,
                        [
                            "add_q_proj",
                            "add_k_proj",
                            "add_v_proj",
                            "norm_added_q",
                            "norm_added_k",
                            "to_add_out",
                        ],
                        "ff_context",
                        cfg,
                    )?,
                })
            })
            .collect::<mlx::Result<Vec<_>>>()?;
        let single = (0..cfg.num_single_layers)
            .map(|b| {
                let a = w.pp("single_transformer_blocks").pp(b).pp("attn");
                Ok(SingleBlock {
                    to_qkv_mlp: Linear::new(&a.pp("to_qkv_mlp_proj"), d, 3 * d + 2 * m, false)?,
                    norm_q: RmsNorm::new(&a.pp("norm_q"), hd, cfg.eps)?,
                    norm_k: RmsNorm::new(&a.pp("norm_k"), hd, cfg.eps)?,
                    to_out: Linear::new(&a.pp("to_out"), d + m, d, false)?,
                })
            })
            .collect::<mlx::Result<Vec<_>>>()?;
        let model = Flux2Transformer {
            x_embedder: lin("x_embedder", c, d)?,
            context_embedder: lin("context_embedder", cfg.joint_attention_dim, d)?,
            t_linear_1: Linear::new(&t.pp("linear_1"), cfg.timestep_guidance_channels, d, false)?,
            t_linear_2: Linear::new(&t.pp("linear_2"), d, d, false)?,
            modulation_img: lin("double_stream_modulation_img.linear", d, 6 * d)?,
            modulation_txt: lin("double_stream_modulation_txt.linear", d, 6 * d)?,
            modulation_single: lin("single_stream_modulation.linear", d, 3 * d)?,
            double,
            single,
            norm_out: lin("norm_out.linear", d, 2 * d)?,
            proj_out: lin("proj_out", d, c)?,
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
    /// and the model multiplies by 1000 in its own, rounding each time (klein-spec §6.4).
    pub fn model_time(&self, t: f32) -> mlx::Result<f32> {
        let t = Array::from_slice(&[t], &[1])?.astype(self.dtype)?;
        ((t / 1000.0)? * 1000.0)?.astype(Dtype::F32)?.item::<f32>()
    }

    /// `temb [1, D]` for the schedule's `t` (`σ·1000`).
    fn t_embed(&self, t: f32) -> mlx::Result<Array> {
        let width = self.config.timestep_guidance_channels;
        let e = sinusoid(self.model_time(t)?, width);
        let e = Array::from_slice(&e, &[1, width])?.astype(self.dtype)?;
        self.t_linear_2
            .forward(&self.t_linear_1.forward(&e)?.silu()?)
    }

    /// The velocity for `tokens` `[N', C]` (output tokens, then any reference tokens) at
    /// schedule time `t`, with the prompt features `text` `[T, J]` and the RoPE tables of
    /// `[text ; tokens]`: `[N', C]` in the model's dtype.
    pub fn forward(
        &self,
        tokens: &Array,
        t: f32,
        text: &Array,
        rope: &(Array, Array),
    ) -> mlx::Result<Array> {
        let cfg = &self.config;
        let (d, heads_n, eps) = (cfg.dim(), cfg.num_attention_heads, cfg.eps);
        let a = self.t_embed(t)?.silu()?;
        let mi = chunks(&self.modulation_img.forward(&a)?, 6)?;
        let mt = chunks(&self.modulation_txt.forward(&a)?, 6)?;
        let ms = chunks(&self.modulation_single.forward(&a)?, 3)?;
        let mut x = self.x_embedder.forward(&tokens.astype(self.dtype)?)?;
        let mut y = self.context_embedder.forward(&text.astype(self.dtype)?)?;
        let t_rows = y.dim(0);
        for (i, block) in self.double.iter().enumerate() {
            (x, y) = block.forward(&x, &y, (&mi, &mt), rope, (heads_n, eps))?;
            after_block(self.release.as_ref(), &x, ("transformer_blocks", i))?;
        }
        let mut z = ops::concatenate(&[&y, &x], 0)?;
        for (i, block) in self.single.iter().enumerate() {
            z = block.forward(&z, &ms, rope, (heads_n, d, eps))?;
            after_block(self.release.as_ref(), &z, ("single_transformer_blocks", i))?;
        }
        let x = z.slice_axis(0, t_rows, z.dim(0))?;
        // `norm_out` puts scale first, shift second (the blocks' order is shift first).
        let out = chunks(&self.norm_out.forward(&a)?, 2)?;
        let h = (fast::layer_norm(&x, None, None, eps)? * (&out[0] + 1.0)?)? + &out[1];
        self.proj_out.forward(&h?)
    }
}
