//! `Flux3Transformer2DModel` (the FLUX.3 spec §5): image tokens, reference tokens and the
//! stacked Qwen3-VL features each run through their own mode blocks (attending within their
//! mode only), then joint blocks over `[text ; image ; references]`. Every block runs attention
//! and the feed-forward in parallel on one modulated input under one gate. The image is
//! modulated at the flow time, text and references at time 0; a flow map adds the embedding of
//! the step's target time to all of them. No biases.

use super::rope;
use crate::mlx::{self, fast, ops, Array, Dtype};
use crate::models::blocks::{after_block, apply_rope, attend, sinusoid};
use crate::models::weights::{Checkpoint, Linear, Release, RmsNorm, Weights};
use crate::models::{check_finite, check_range, ModelError, MAX_COUNT, MAX_WIDTH};

/// `transformer/config.json`, the keys the forward pass uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Flux3Config {
    pub in_channels: i32,
    pub cond_in_channels: i32,
    pub num_layers: i32,
    pub num_single_layers: i32,
    pub attention_head_dim: i32,
    pub num_attention_heads: i32,
    pub joint_attention_dim: i32,
    pub timestep_channels: i32,
    pub mlp_ratio: f32,
    pub axes_dims_rope: Vec<i32>,
    pub rope_theta: f64,
    #[serde(default = "default_eps")]
    pub eps: f32,
    /// A step-distilled flow map: the model also reads the time its step lands at.
    #[serde(default)]
    pub flow_map: bool,
}

fn default_eps() -> f32 {
    1e-6
}

impl Flux3Config {
    /// Checks every key a shape or table is sized by, before anything is allocated.
    pub fn validate(&self) -> Result<(), String> {
        const WHAT: &str = "transformer";
        let sizes = [
            ("in_channels", self.in_channels, 1..=MAX_WIDTH),
            ("cond_in_channels", self.cond_in_channels, 1..=MAX_WIDTH),
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
                1..=MAX_WIDTH * 16,
            ),
            ("timestep_channels", self.timestep_channels, 2..=MAX_WIDTH),
        ];
        for (key, value, range) in sizes {
            check_range(WHAT, key, value, range)?;
        }
        if self.timestep_channels % 2 != 0 {
            return Err(format!(
                "transformer `timestep_channels` is {}; the sinusoid is [cos | sin], so it must be even",
                self.timestep_channels
            ));
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
fn modulate(x: &Array, m: &[Array], eps: f32) -> mlx::Result<Array> {
    (fast::layer_norm(x, None, None, eps)? * (&m[1] + 1.0)?)? + &m[0]
}

/// One block of any kind: its attention and feed-forward read the same input, and their sum
/// is the block's update.
struct Block {
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    to_out: Linear,
    ff_in: Linear,
    ff_out: Linear,
}

impl Block {
    fn new(w: &Weights, cfg: &Flux3Config) -> mlx::Result<Block> {
        let (d, m, hd) = (cfg.dim(), cfg.mlp_dim(), cfg.attention_head_dim);
        let a = w.pp("attn");
        Ok(Block {
            to_q: Linear::new(&a.pp("to_q"), d, d, false)?,
            to_k: Linear::new(&a.pp("to_k"), d, d, false)?,
            to_v: Linear::new(&a.pp("to_v"), d, d, false)?,
            // Kept f32 in a bf16 run, as diffusers keeps them (the spec §5.12).
            norm_q: RmsNorm::new_f32(&a.pp("norm_q"), hd, cfg.eps)?,
            norm_k: RmsNorm::new_f32(&a.pp("norm_k"), hd, cfg.eps)?,
            to_out: Linear::new(&a.pp("to_out.0"), d, d, false)?,
            ff_in: Linear::new(&w.pp("ff").pp("linear_in"), d, 2 * m, false)?,
            ff_out: Linear::new(&w.pp("ff").pp("linear_out"), m, d, false)?,
        })
    }

    /// `attn(h) + ff(h)` for the modulated rows `h` `[S, D]`, q and k normed and rotated in
    /// f32 and rounded once to v's dtype (the spec §5.6).
    fn core(&self, h: &Array, rope: &(Array, Array), heads: i32) -> mlx::Result<Array> {
        let s = h.dim(0);
        let split = |t: Array| t.reshape(&[s, heads, t.dim(1) / heads]);
        let v = split(self.to_v.forward(h)?)?;
        let qk = |proj: &Linear, norm: &RmsNorm| -> mlx::Result<Array> {
            let t = split(proj.forward(h)?)?.astype(Dtype::F32)?;
            apply_rope(&norm.forward(&t)?, rope)?.astype(v.dtype())
        };
        let (q, k) = (qk(&self.to_q, &self.norm_q)?, qk(&self.to_k, &self.norm_k)?);
        let hd = v.dim(2);
        let bhsd = |t: &Array| t.transpose(&[1, 0, 2])?.expand_dims(0);
        let o = attend(&bhsd(&q)?, &bhsd(&k)?, &bhsd(&v)?, 1.0 / (hd as f32).sqrt())?;
        let o = o
            .squeeze(0)?
            .transpose(&[1, 0, 2])?
            .reshape(&[s, heads * hd])?;
        let f = self
            .ff_out
            .forward(&fast::silu_gate(&self.ff_in.forward(h)?)?)?;
        self.to_out.forward(&o)? + f
    }

    /// A mode block: `x + gate ⊙ core((1 + scale) ⊙ LN(x) + shift)`, attending within `x`.
    fn mode(&self, x: &Array, m: &[Array], rope: &(Array, Array), c: Consts) -> mlx::Result<Array> {
        let o = self.core(&modulate(x, m, c.eps)?, rope, c.heads)?;
        x + (&m[2] * o)?
    }
}

/// What every block reads of the config.
#[derive(Clone, Copy)]
struct Consts {
    heads: i32,
    eps: f32,
}

/// The three token modes, in the order the joint blocks concatenate them.
const TEXT: usize = 0;
const IMAGE: usize = 1;
const REFERENCE: usize = 2;

/// The modulation heads of one stage, one per mode (text, image, references).
struct Modulations([Linear; 3]);

impl Modulations {
    fn new(w: &Weights, d: i32) -> mlx::Result<Modulations> {
        let head = |name: &str| Linear::new(&w.pp(name).pp("linear"), d, 3 * d, false);
        Ok(Modulations([
            head("txt")?,
            head("image")?,
            head("image_cond")?,
        ]))
    }

    /// Each mode's `[shift, scale, gate]` (`[1, D]` each): the image from `a_img`, text and
    /// references from `a_zero`.
    fn chunks(&self, a_img: &Array, a_zero: &Array) -> mlx::Result<[Vec<Array>; 3]> {
        let c = |l: &Linear, a: &Array| ops::split(&l.forward(a)?, 3, 1);
        Ok([
            c(&self.0[TEXT], a_zero)?,
            c(&self.0[IMAGE], a_img)?,
            c(&self.0[REFERENCE], a_zero)?,
        ])
    }
}

/// The two-layer timestep MLP (`linear_1`, SiLU, `linear_2`, no biases).
struct TimeEmbedder {
    linear_1: Linear,
    linear_2: Linear,
}

impl TimeEmbedder {
    fn new(w: &Weights, channels: i32, d: i32) -> mlx::Result<TimeEmbedder> {
        Ok(TimeEmbedder {
            linear_1: Linear::new(&w.pp("linear_1"), channels, d, false)?,
            linear_2: Linear::new(&w.pp("linear_2"), d, d, false)?,
        })
    }

    fn forward(&self, sinusoid: &Array) -> mlx::Result<Array> {
        self.linear_2
            .forward(&self.linear_1.forward(sinusoid)?.silu()?)
    }
}

/// The RoPE tables of one call: each mode's own and the joint `[text ; image ; references]`.
pub struct Rope {
    text: (Array, Array),
    image: (Array, Array),
    references: Option<(Array, Array)>,
    joint: (Array, Array),
}

impl Rope {
    /// The tables for a text window of `text_rows`, an output grid and the references' grids.
    pub fn new(
        cfg: &Flux3Config,
        text_rows: usize,
        grid: (i32, i32),
        references: &[(i32, i32)],
    ) -> mlx::Result<Rope> {
        let table = |ids: &[[f64; 4]]| rope::tables(ids, &cfg.axes_dims_rope, cfg.rope_theta);
        let (t, i, r) = (
            rope::text_ids(text_rows),
            rope::grid_ids(grid, 0.0),
            rope::reference_ids(references),
        );
        let joint: Vec<[f64; 4]> = t.iter().chain(&i).chain(&r).copied().collect();
        Ok(Rope {
            text: table(&t)?,
            image: table(&i)?,
            references: match r.is_empty() {
                true => None,
                false => Some(table(&r)?),
            },
            joint: table(&joint)?,
        })
    }
}

/// The transformer, batch 1: image tokens `[N, C]`, reference tokens `[R, C']` and the text
/// features `[P, J]` in, the image's velocity `[N, C]` out.
pub struct Flux3Transformer {
    x_image: Linear,
    x_reference: Linear,
    context_embedder: Linear,
    time: TimeEmbedder,
    target_time: Option<TimeEmbedder>,
    early: Modulations,
    joint_modulations: Modulations,
    /// Mode blocks: text, image, references.
    modes: [Vec<Block>; 3],
    joint: Vec<Block>,
    norm_out: Linear,
    proj_out: Linear,
    release: Option<Release>,
    dtype: Dtype,
    pub config: Flux3Config,
}

impl Flux3Transformer {
    pub fn new(cfg: &Flux3Config, ckpt: Checkpoint) -> Result<Flux3Transformer, ModelError> {
        cfg.validate().map_err(ModelError::Config)?;
        let (d, ch) = (cfg.dim(), cfg.timestep_channels);
        let w = ckpt.root();
        let lin = |name: &str, i: i32, o: i32| Linear::new(&w.pp(name), i, o, false);
        let blocks = |prefix: &str, n: i32| -> mlx::Result<Vec<Block>> {
            (0..n)
                .map(|b| Block::new(&w.pp(prefix).pp(b), cfg))
                .collect()
        };
        let target_time = match cfg.flow_map {
            true => Some(TimeEmbedder::new(&w.pp("target_timestep_embedder"), ch, d)?),
            false => None,
        };
        let model = Flux3Transformer {
            x_image: lin("x_embedders.image", cfg.in_channels, d)?,
            x_reference: lin("x_embedders.image_cond", cfg.cond_in_channels, d)?,
            context_embedder: lin("context_embedder", cfg.joint_attention_dim, d)?,
            time: TimeEmbedder::new(&w.pp("timestep_embedder"), ch, d)?,
            target_time,
            early: Modulations::new(&w.pp("early_stream_modulations"), d)?,
            joint_modulations: Modulations::new(&w.pp("single_stream_modulations"), d)?,
            modes: [
                blocks("txt_mode_blocks", cfg.num_layers)?,
                blocks("mode_blocks.image", cfg.num_layers)?,
                blocks("mode_blocks.image_cond", cfg.num_layers)?,
            ],
            joint: blocks("single_transformer_blocks", cfg.num_single_layers)?,
            norm_out: lin("norm_out.linear", d, 2 * d)?,
            proj_out: lin("proj_out", d, cfg.in_channels)?,
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

    /// A time as the model sees it: the pipeline hands `t/1000` (f32) in the latents' dtype
    /// and the model multiplies by 1000 in its own, rounding each time (the spec §6.4).
    pub fn model_time(&self, t: f32) -> mlx::Result<f32> {
        let t = Array::from_slice(&[t / 1000.0], &[1])?.astype(self.dtype)?;
        (t * 1000.0)?.astype(Dtype::F32)?.item::<f32>()
    }

    fn embed(&self, mlp: &TimeEmbedder, t: f32) -> mlx::Result<Array> {
        let width = self.config.timestep_channels;
        let e = sinusoid(t, width);
        mlp.forward(&Array::from_slice(&e, &[1, width])?.astype(self.dtype)?)
    }

    /// The velocity of the image `tokens` `[N, C]` at schedule time `t` (a flow map: landing
    /// at `target`), with the prompt features `text` `[P, J]`, the clean `references`
    /// `[R, C']` if any, and the call's RoPE tables: `[N, C]` in the model's dtype.
    pub fn forward(
        &self,
        tokens: &Array,
        (t, target): (f32, Option<f32>),
        text: &Array,
        references: Option<&Array>,
        rope: &Rope,
    ) -> mlx::Result<Array> {
        let cfg = &self.config;
        let c = Consts {
            heads: cfg.num_attention_heads,
            eps: cfg.eps,
        };
        // 1. Time embeddings: the image's at t, text's and references' at 0, a flow map's
        //    target embedding added to both.
        let mut e_img = self.embed(&self.time, self.model_time(t)?)?;
        let mut e_zero = self.embed(&self.time, 0.0)?;
        if let Some(g) = &self.target_time {
            let target = target.ok_or_else(|| {
                mlx::Error::new("transformer", "a flow map needs the step's target time")
            })?;
            let e_tgt = self.embed(g, self.model_time(target)?)?;
            e_img = (&e_img + &e_tgt)?;
            e_zero = (&e_zero + &e_tgt)?;
        }
        let (a_img, a_zero) = (e_img.silu()?, e_zero.silu()?);
        let early = self.early.chunks(&a_img, &a_zero)?;
        let late = self.joint_modulations.chunks(&a_img, &a_zero)?;

        // 2. Each mode through its own blocks.
        let mut y = self.context_embedder.forward(&text.astype(self.dtype)?)?;
        let mut x = self.x_image.forward(&tokens.astype(self.dtype)?)?;
        let mut r = match references {
            Some(r) => Some(self.x_reference.forward(&r.astype(self.dtype)?)?),
            None => None,
        };
        for (i, block) in self.modes[TEXT].iter().enumerate() {
            y = block.mode(&y, &early[TEXT], &rope.text, c)?;
            after_block(self.release.as_ref(), &y, ("txt_mode_blocks", i))?;
        }
        for (i, block) in self.modes[IMAGE].iter().enumerate() {
            x = block.mode(&x, &early[IMAGE], &rope.image, c)?;
            after_block(self.release.as_ref(), &x, ("mode_blocks.image", i))?;
        }
        if let (Some(refs), Some(table)) = (r.as_mut(), &rope.references) {
            for (i, block) in self.modes[REFERENCE].iter().enumerate() {
                *refs = block.mode(refs, &early[REFERENCE], table, c)?;
                after_block(self.release.as_ref(), refs, ("mode_blocks.image_cond", i))?;
            }
        }

        // 3. Joint blocks over [text ; image ; references], each part modulated and gated by
        //    its own mode.
        let (p, n) = (y.dim(0), x.dim(0));
        for (i, block) in self.joint.iter().enumerate() {
            let mut parts = vec![
                modulate(&y, &late[TEXT], c.eps)?,
                modulate(&x, &late[IMAGE], c.eps)?,
            ];
            if let Some(refs) = &r {
                parts.push(modulate(refs, &late[REFERENCE], c.eps)?);
            }
            let h = ops::concatenate(&parts.iter().collect::<Vec<_>>(), 0)?;
            let o = block.core(&h, &rope.joint, c.heads)?;
            y = (&y + (&late[TEXT][2] * o.slice_axis(0, 0, p)?)?)?;
            x = (&x + (&late[IMAGE][2] * o.slice_axis(0, p, p + n)?)?)?;
            if let Some(refs) = r.as_mut() {
                let rest = o.slice_axis(0, p + n, o.dim(0))?;
                *refs = (&*refs + (&late[REFERENCE][2] * rest)?)?;
            }
            after_block(self.release.as_ref(), &x, ("single_transformer_blocks", i))?;
        }

        // 4. The output layer on the image rows; `norm_out` puts scale first, shift second.
        let out = ops::split(&self.norm_out.forward(&a_img)?, 2, 1)?;
        let h = (fast::layer_norm(&x, None, None, c.eps)? * (&out[0] + 1.0)?)? + &out[1];
        self.proj_out.forward(&h?)
    }
}
