//! The Z-Image S3-DiT (`ZImageTransformer2DModel`): single-stream diffusion transformer over
//! `[image tokens, caption tokens]`, with noise and context refiners and 3-axis RoPE.
//!
//! Mirrors diffusers 0.42.1 `models/transformers/transformer_z_image.py` (zimage-spec §3). One
//! sample at a time (B = 1): classifier-free guidance runs the two prompts separately, which
//! equals the reference's masked batch.

use crate::mlx::{self, fast, ops, Array, Dtype};
use crate::models::blocks::{after_block, apply_rope, attend, sinusoid};
use crate::models::rope::RopeTables;
use crate::models::weights::{Checkpoint, Linear, Release, RmsNorm, Weights};
use crate::models::{check_range, ModelError, MAX_COUNT, MAX_WIDTH};

/// Width of the timestep embedding input (sinusoids) and cap of the adaLN width.
const ADALN_EMBED_DIM: i32 = 256;
const FREQUENCY_EMBEDDING_SIZE: i32 = 256;
/// Hidden width of the timestep MLP.
const T_MLP_HIDDEN: i32 = 1024;
/// Caption and image token counts are padded to multiples of this.
pub const SEQ_MULTI_OF: i32 = 32;
/// The longest RoPE axis a config may give: 64× Z-Image's longest.
const MAX_ROPE_POSITIONS: i32 = 1 << 16;
/// The most angles the three RoPE tables may hold together (256 MiB of f32): Z-Image's hold
/// 49 152.
const MAX_ROPE_TABLE: i64 = 1 << 26;

/// `transformer/config.json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct DitConfig {
    pub all_patch_size: Vec<i32>,
    pub all_f_patch_size: Vec<i32>,
    pub in_channels: i32,
    pub dim: i32,
    pub n_layers: i32,
    pub n_refiner_layers: i32,
    pub n_heads: i32,
    pub norm_eps: f32,
    pub qk_norm: bool,
    pub cap_feat_dim: i32,
    pub rope_theta: f64,
    pub t_scale: f32,
    pub axes_dims: Vec<i32>,
    pub axes_lens: Vec<i32>,
}

impl DitConfig {
    /// Checks every key the transformer divides by, indexes with, or sizes a shape or a table
    /// by, before anything is allocated.
    pub fn validate(&self) -> Result<(), String> {
        use crate::models::check_finite;
        const WHAT: &str = "transformer";
        let (patch, f_patch) = (&self.all_patch_size, &self.all_f_patch_size);
        let widths = [self.dim, self.n_heads, self.n_refiner_layers];
        check_dit_shape(WHAT, patch, f_patch, widths)?;
        check_range(WHAT, "in_channels", self.in_channels, 1..=MAX_COUNT)?;
        check_range(WHAT, "n_layers", self.n_layers, 1..=MAX_COUNT)?;
        check_range(WHAT, "cap_feat_dim", self.cap_feat_dim, 1..=MAX_WIDTH)?;
        check_finite(WHAT, "norm_eps", self.norm_eps as f64, true)?;
        check_finite(WHAT, "rope_theta", self.rope_theta, true)?;
        check_finite(WHAT, "t_scale", self.t_scale as f64, false)?;
        if self.dim % self.n_heads != 0 {
            return Err(format!(
                "transformer `dim` {} is not divisible by `n_heads` {}",
                self.dim, self.n_heads
            ));
        }
        let sum: i64 = self.axes_dims.iter().map(|&d| d as i64).sum();
        if self.axes_dims.len() != 3
            || self.axes_dims.iter().any(|&d| d <= 0 || d % 2 != 0)
            || sum != self.head_dim() as i64
        {
            return Err(format!(
                "transformer `axes_dims` {:?} must be 3 positive even sizes summing to the head dim `dim`/`n_heads` = {}",
                self.axes_dims,
                self.head_dim()
            ));
        }
        if self.axes_lens.len() != 3 {
            return Err(format!(
                "transformer `axes_lens` {:?} must have 3 entries, one per RoPE axis",
                self.axes_lens
            ));
        }
        for &len in &self.axes_lens {
            check_range(WHAT, "axes_lens", len, 1..=MAX_ROPE_POSITIONS)?;
        }
        let table: i64 = (self.axes_dims.iter())
            .zip(&self.axes_lens)
            .map(|(&d, &len)| d as i64 / 2 * len as i64)
            .sum();
        if table > MAX_ROPE_TABLE {
            return Err(format!(
                "transformer `axes_lens` {:?} with `axes_dims` {:?} make RoPE tables of {table} angles, more than {MAX_ROPE_TABLE}",
                self.axes_lens, self.axes_dims
            ));
        }
        if !self.qk_norm {
            return Err("transformer `qk_norm: false` is not supported".into());
        }
        Ok(())
    }

    pub fn head_dim(&self) -> i32 {
        self.dim / self.n_heads
    }
    pub fn adaln_dim(&self) -> i32 {
        self.dim.min(ADALN_EMBED_DIM)
    }
    fn ffn_dim(&self) -> i32 {
        // int(dim / 3 * 8), as the reference computes it in floating point.
        (self.dim as f64 / 3.0 * 8.0) as i32
    }
    fn patch_features(&self) -> i32 {
        2 * 2 * self.in_channels
    }
}

/// The q, k and v projections: one product over their joined weights in the CPU form
/// ([`crate::platform::fused_transformer_kernels`]), else three.
enum QkvProjection {
    Joined(Linear),
    Separate { q: Linear, k: Linear, v: Linear },
}

struct Attention {
    qkv: QkvProjection,
    to_out: Linear,
    norm_q: RmsNorm,
    norm_k: RmsNorm,
    heads: i32,
    head_dim: i32,
}

impl Attention {
    fn new(cfg: &DitConfig, w: &Weights, joined: bool) -> mlx::Result<Attention> {
        let (d, hd) = (cfg.dim, cfg.head_dim());
        let (q, k, v) = (
            Linear::new(&w.pp("to_q"), d, d, false)?,
            Linear::new(&w.pp("to_k"), d, d, false)?,
            Linear::new(&w.pp("to_v"), d, d, false)?,
        );
        let qkv = match joined {
            true => Linear::join(&[&q, &k, &v])?,
            false => None,
        };
        Ok(Attention {
            qkv: match qkv {
                Some(p) => QkvProjection::Joined(p),
                None => QkvProjection::Separate { q, k, v },
            },
            to_out: Linear::new(&w.pp("to_out").pp(0), d, d, false)?,
            // The qk-norm eps is fixed at 1e-5 in the reference, whatever `norm_eps` says.
            norm_q: RmsNorm::new(&w.pp("norm_q"), hd, 1e-5)?,
            norm_k: RmsNorm::new(&w.pp("norm_k"), hd, 1e-5)?,
            heads: cfg.n_heads,
            head_dim: hd,
        })
    }

    /// `x`: [S, dim]; full bidirectional attention with RoPE from `rope` ([S, 1, hd/2] each).
    fn forward(&self, x: &Array, rope: &(Array, Array)) -> mlx::Result<Array> {
        let s = x.dim(0);
        let (h, hd) = (self.heads, self.head_dim);
        let scale = 1.0 / (hd as f32).sqrt();
        let (q, k, v) = match &self.qkv {
            QkvProjection::Joined(qkv) => {
                let o = fast::QkvHeads {
                    q_weight: self.norm_q.weight(),
                    k_weight: self.norm_k.weight(),
                    cos: &rope.0,
                    sin: &rope.1,
                    heads: h,
                    eps: self.norm_q.eps(),
                    q_scale: scale,
                }
                .attention(&qkv.forward(x)?)?;
                return self.to_out.forward(&o);
            }
            QkvProjection::Separate { q, k, v } => (q, k, v),
        };
        let split = |proj: &Linear, norm: Option<&RmsNorm>| -> mlx::Result<Array> {
            let t = proj.forward(x)?.reshape(&[s, h, hd])?;
            match norm {
                Some(n) => apply_rope(&n.forward(&t)?, rope),
                None => Ok(t),
            }
        };
        let q = split(q, Some(&self.norm_q))?;
        let k = split(k, Some(&self.norm_k))?;
        let v = split(v, None)?;
        // [S, H, hd] → [1, H, S, hd]
        let bhsd = |t: Array| t.transpose(&[1, 0, 2])?.expand_dims(0);
        let o = attend(&bhsd(q)?, &bhsd(k)?, &bhsd(v)?, scale)?;
        let o = o.squeeze(0)?.transpose(&[1, 0, 2])?.reshape(&[s, h * hd])?;
        self.to_out.forward(&o)
    }
}

/// w1 and w3: one product over their joined weights in the CPU form, else two.
enum GateProjection {
    Joined(Linear),
    Separate { w1: Linear, w3: Linear },
}

struct FeedForward {
    w13: GateProjection,
    w2: Linear,
}

impl FeedForward {
    fn new(cfg: &DitConfig, w: &Weights, joined: bool) -> mlx::Result<FeedForward> {
        let (d, f) = (cfg.dim, cfg.ffn_dim());
        let w1 = Linear::new(&w.pp("w1"), d, f, false)?;
        let w3 = Linear::new(&w.pp("w3"), d, f, false)?;
        let w13 = match joined {
            true => Linear::join(&[&w1, &w3])?,
            false => None,
        };
        Ok(FeedForward {
            w13: match w13 {
                Some(w13) => GateProjection::Joined(w13),
                None => GateProjection::Separate { w1, w3 },
            },
            w2: Linear::new(&w.pp("w2"), f, d, false)?,
        })
    }

    fn forward(&self, x: &Array) -> mlx::Result<Array> {
        let gated = match &self.w13 {
            GateProjection::Joined(w13) => fast::silu_gate(&w13.forward(x)?)?,
            GateProjection::Separate { w1, w3 } => (w1.forward(x)?.silu()? * w3.forward(x)?)?,
        };
        self.w2.forward(&gated)
    }
}

/// Per-block scales and gates from the timestep conditioning.
struct Modulation {
    scale_msa: Array,
    gate_msa: Array,
    scale_mlp: Array,
    gate_mlp: Array,
}

/// `ZImageTransformerBlock`: sandwich-normed attention and FFN, optionally adaLN-modulated.
pub(crate) struct Block {
    attention: Attention,
    feed_forward: FeedForward,
    attention_norm1: RmsNorm,
    attention_norm2: RmsNorm,
    ffn_norm1: RmsNorm,
    ffn_norm2: RmsNorm,
    ada_ln: Option<Linear>,
    /// The CPU form ([`crate::platform::fused_transformer_kernels`]).
    fused: bool,
}

impl Block {
    pub(crate) fn new(
        cfg: &DitConfig,
        w: &Weights,
        modulated: bool,
        fused: bool,
    ) -> mlx::Result<Block> {
        let norm = |name: &str| RmsNorm::new(&w.pp(name), cfg.dim, cfg.norm_eps);
        Ok(Block {
            attention: Attention::new(cfg, &w.pp("attention"), fused)?,
            feed_forward: FeedForward::new(cfg, &w.pp("feed_forward"), fused)?,
            attention_norm1: norm("attention_norm1")?,
            attention_norm2: norm("attention_norm2")?,
            ffn_norm1: norm("ffn_norm1")?,
            ffn_norm2: norm("ffn_norm2")?,
            ada_ln: if modulated {
                Some(Linear::new(
                    &w.pp("adaLN_modulation").pp(0),
                    cfg.adaln_dim(),
                    4 * cfg.dim,
                    true,
                )?)
            } else {
                None
            },
            fused,
        })
    }

    /// `m = c·Wᵀ + b` split into (scale_msa, gate_msa, scale_mlp, gate_mlp); no SiLU on `c`.
    fn modulation(&self, c: Option<&Array>) -> mlx::Result<Option<Modulation>> {
        let Some(ada) = &self.ada_ln else {
            return Ok(None);
        };
        let Some(c) = c else {
            return Err(mlx::Error::new(
                "transformer",
                "a modulated block needs the timestep conditioning",
            ));
        };
        let parts = ops::split(&ada.forward(c)?, 4, 1)?;
        Ok(Some(Modulation {
            scale_msa: (&parts[0] + 1.0)?,
            gate_msa: parts[1].tanh()?,
            scale_mlp: (&parts[2] + 1.0)?,
            gate_mlp: parts[3].tanh()?,
        }))
    }

    /// `c`: the timestep conditioning, which only modulated blocks read.
    pub(crate) fn forward(
        &self,
        x: &Array,
        rope: &(Array, Array),
        c: Option<&Array>,
    ) -> mlx::Result<Array> {
        let m = self.modulation(c)?;
        if self.fused {
            return self.forward_fused(x, rope, m.as_ref());
        }
        let scaled = |h: Array, s: Option<&Array>| match s {
            Some(s) => h * s,
            None => Ok(h),
        };
        let gated = |h: Array, g: Option<&Array>| match g {
            Some(g) => h * g,
            None => Ok(h),
        };
        let h = scaled(
            self.attention_norm1.forward(x)?,
            m.as_ref().map(|m| &m.scale_msa),
        )?;
        let h = self
            .attention_norm2
            .forward(&self.attention.forward(&h, rope)?)?;
        let x = (x + gated(h, m.as_ref().map(|m| &m.gate_msa))?)?;
        let h = scaled(
            self.ffn_norm1.forward(&x)?,
            m.as_ref().map(|m| &m.scale_mlp),
        )?;
        let h = self.ffn_norm2.forward(&self.feed_forward.forward(&h)?)?;
        &x + gated(h, m.as_ref().map(|m| &m.gate_mlp))?
    }

    /// The same in the CPU form: a modulation scale or gate multiplies a norm's weight (a vector)
    /// rather than its output, and each residual add happens in its norm's pass.
    fn forward_fused(
        &self,
        x: &Array,
        rope: &(Array, Array),
        m: Option<&Modulation>,
    ) -> mlx::Result<Array> {
        let norm = |norm: &RmsNorm, h: &Array, by: Option<&Array>, residual: Option<&Array>| {
            let weight = match by {
                Some(by) => (norm.weight() * by)?,
                None => norm.weight().clone(),
            };
            fast::rms_norm_residual(h, &weight, norm.eps(), residual)
        };
        let h = norm(&self.attention_norm1, x, m.map(|m| &m.scale_msa), None)?;
        let h = self.attention.forward(&h, rope)?;
        let x = norm(&self.attention_norm2, &h, m.map(|m| &m.gate_msa), Some(x))?;
        let h = norm(&self.ffn_norm1, &x, m.map(|m| &m.scale_mlp), None)?;
        let h = self.feed_forward.forward(&h)?;
        norm(&self.ffn_norm2, &h, m.map(|m| &m.gate_mlp), Some(&x))
    }
}

/// What one request fixes for every step: the caption tokens through their refiner, and the
/// RoPE tables of the image and the unified sequence. Made by [`ZImageTransformer::prepare`].
pub struct Prepared {
    /// `[C, h, w]` of the latents it was made for.
    latent_shape: Vec<i32>,
    /// `[Lp, dim]`, after the context refiner.
    caption: Array,
    img_rope: (Array, Array),
    rope: (Array, Array),
}

impl Prepared {
    /// `[C, h, w]` of the latents it was made for.
    pub fn latent_shape(&self) -> &[i32] {
        &self.latent_shape
    }
    /// The refined caption tokens, `[Lp, dim]`.
    pub(crate) fn caption(&self) -> &Array {
        &self.caption
    }
    /// RoPE of the image tokens alone (the noise refiner's).
    pub(crate) fn img_rope(&self) -> &(Array, Array) {
        &self.img_rope
    }
    /// RoPE of the unified sequence `[image, caption]`.
    pub(crate) fn rope(&self) -> &(Array, Array) {
        &self.rope
    }

    /// Computes it now, so that steps only read it.
    pub fn eval(&self) -> mlx::Result<()> {
        mlx::eval(&[
            &self.caption,
            &self.img_rope.0,
            &self.img_rope.1,
            &self.rope.0,
            &self.rope.1,
        ])
    }
}

/// The transformer.
pub struct ZImageTransformer {
    t_mlp0: Linear,
    t_mlp2: Linear,
    cap_norm: RmsNorm,
    cap_proj: Linear,
    x_embedder: Linear,
    x_pad_token: Array,
    cap_pad_token: Array,
    final_ada: Linear,
    final_linear: Linear,
    noise_refiner: Vec<Block>,
    context_refiner: Vec<Block>,
    layers: Vec<Block>,
    rope: RopeTables,
    pub config: DitConfig,
    dtype: Dtype,
    /// Set when the weights are streamed: each block is computed, then its pages let go of.
    release: Option<Release>,
}

impl ZImageTransformer {
    pub fn new(cfg: &DitConfig, ckpt: Checkpoint) -> Result<ZImageTransformer, ModelError> {
        cfg.validate().map_err(ModelError::Config)?;
        let dtype = ckpt.dtype();
        let model = {
            let w = ckpt.root();
            let (d, a) = (cfg.dim, cfg.adaln_dim());
            let fused = crate::platform::fused_transformer_kernels(dtype);
            let blocks = |name: &str, n: i32, modulated: bool| -> mlx::Result<Vec<Block>> {
                (0..n)
                    .map(|i| Block::new(cfg, &w.pp(name).pp(i), modulated, fused))
                    .collect()
            };
            let fl = w.pp("all_final_layer").pp("2-1");
            ZImageTransformer {
                t_mlp0: Linear::new(
                    &w.pp("t_embedder.mlp.0"),
                    FREQUENCY_EMBEDDING_SIZE,
                    T_MLP_HIDDEN,
                    true,
                )?,
                t_mlp2: Linear::new(&w.pp("t_embedder.mlp.2"), T_MLP_HIDDEN, a, true)?,
                cap_norm: RmsNorm::new(&w.pp("cap_embedder.0"), cfg.cap_feat_dim, cfg.norm_eps)?,
                cap_proj: Linear::new(&w.pp("cap_embedder.1"), cfg.cap_feat_dim, d, true)?,
                x_embedder: Linear::new(
                    &w.pp("all_x_embedder").pp("2-1"),
                    cfg.patch_features(),
                    d,
                    true,
                )?,
                x_pad_token: w.get("x_pad_token", &[1, d])?,
                cap_pad_token: w.get("cap_pad_token", &[1, d])?,
                final_ada: Linear::new(&fl.pp("adaLN_modulation.1"), a, d, true)?,
                final_linear: Linear::new(&fl.pp("linear"), d, cfg.patch_features(), true)?,
                noise_refiner: blocks("noise_refiner", cfg.n_refiner_layers, true)?,
                context_refiner: blocks("context_refiner", cfg.n_refiner_layers, false)?,
                layers: blocks("layers", cfg.n_layers, true)?,
                rope: RopeTables::new(cfg.rope_theta, &cfg.axes_dims, &cfg.axes_lens),
                config: cfg.clone(),
                dtype,
                release: ckpt.release(),
            }
        };
        ckpt.finish()?;
        Ok(model)
    }

    /// After a block: with streamed weights, computes `x` now and lets go of the weights' pages,
    /// so that no more than a block's weights are held at once.
    pub(crate) fn after_block(&self, x: &Array, block: (&str, usize)) -> mlx::Result<()> {
        after_block(self.release.as_ref(), x, block)
    }

    /// The timestep conditioning `c` ([1, adaln_dim]) for `t_model` (0 at pure noise).
    pub(crate) fn t_embed(&self, t_model: f32) -> mlx::Result<Array> {
        let emb = sinusoid(t_model * self.config.t_scale, FREQUENCY_EMBEDDING_SIZE);
        let e = Array::from_slice(&emb, &[1, FREQUENCY_EMBEDDING_SIZE])?.astype(self.dtype)?;
        self.t_mlp2.forward(&self.t_mlp0.forward(&e)?.silu()?)
    }

    /// One forward pass: `latent` [C, h, w] (f32 or the compute dtype), `caption` [L, cap_dim].
    /// Returns the model output [C, h, w] in f32 (the reference's velocity, before negation).
    pub fn forward(&self, latent: &Array, t_model: f32, caption: &Array) -> mlx::Result<Array> {
        self.forward_prepared(latent, t_model, &self.prepare(&latent.shape(), caption)?)
    }

    /// What a request with latents of `latent_shape` ([C, h, w]) and `caption` ([L, cap_dim])
    /// fixes for all its steps.
    pub fn prepare(&self, latent_shape: &[i32], caption: &Array) -> mlx::Result<Prepared> {
        let &[_, h, w] = latent_shape else {
            return Err(mlx::Error::new(
                "transformer",
                format!("latents of shape {latent_shape:?}; expected [C, h, w]"),
            ));
        };
        let (ht, wt) = (h / 2, w / 2);
        let n = ht * wt;
        let np = round_up(n, SEQ_MULTI_OF);
        let l = caption.dim(0);
        let lp = round_up(l, SEQ_MULTI_OF);

        // Image positions (Lp + 1, i, j), pads (0, 0, 0).
        let mut img_pos: Vec<[i32; 3]> = (0..n).map(|k| [lp + 1, k / wt, k % wt]).collect();
        img_pos.resize(np as usize, [0, 0, 0]);
        let img_rope = self.rope.lookup(&img_pos)?;

        // Caption tokens: norm + project, learned pad rows, positions (1 + m, 0, 0), then the
        // context refiner, which the timestep does not modulate.
        let cap = self
            .cap_proj
            .forward(&self.cap_norm.forward(&caption.astype(self.dtype)?)?)?;
        let cap = pad_rows(&cap, &self.cap_pad_token, lp - l)?;
        let cap_pos: Vec<[i32; 3]> = (0..lp).map(|m| [1 + m, 0, 0]).collect();
        let cap_rope = self.rope.lookup(&cap_pos)?;
        let mut cap = cap;
        for (i, block) in self.context_refiner.iter().enumerate() {
            cap = block.forward(&cap, &cap_rope, None)?;
            self.after_block(&cap, ("context_refiner", i))?;
        }
        let rope = (
            ops::concatenate(&[&img_rope.0, &cap_rope.0], 0)?,
            ops::concatenate(&[&img_rope.1, &cap_rope.1], 0)?,
        );
        Ok(Prepared {
            latent_shape: latent_shape.to_vec(),
            caption: cap,
            img_rope,
            rope,
        })
    }

    /// [`ZImageTransformer::forward`] with what the request fixes made once by
    /// [`ZImageTransformer::prepare`].
    pub fn forward_prepared(
        &self,
        latent: &Array,
        t_model: f32,
        prepared: &Prepared,
    ) -> mlx::Result<Array> {
        self.forward_prepared_with(latent, t_model, prepared, None)
    }

    /// [`ZImageTransformer::forward_prepared`] with a ControlNet's `hints` for this step added
    /// into the main layers (each after the layer it names, as diffusers adds
    /// `controlnet_block_samples`). `None` is the plain forward.
    pub fn forward_prepared_with(
        &self,
        latent: &Array,
        t_model: f32,
        prepared: &Prepared,
        hints: Option<&Hints>,
    ) -> mlx::Result<Array> {
        if let Some(hints) = hints {
            self.check_hints(hints, prepared)?;
        }
        let mut given = hints.map(GivenHints);
        let source = given.as_mut().map(|g| g as &mut dyn LayerHints);
        self.forward_with_hints(latent, t_model, prepared, source)
    }

    /// [`ZImageTransformer::forward_prepared_with`] with the hints asked for layer by layer, as
    /// the main layers reach them: a ControlNet's [`super::controlnet::HintStream`] computes each
    /// just before it is added, so that one hint is held at a time.
    pub fn forward_with_hints(
        &self,
        latent: &Array,
        t_model: f32,
        prepared: &Prepared,
        mut hints: Option<&mut dyn LayerHints>,
    ) -> mlx::Result<Array> {
        self.check_prepared(latent, prepared)?;
        let (c_in, h, w) = (latent.dim(0), latent.dim(1), latent.dim(2));
        let (ht, wt) = (h / 2, w / 2);
        let n = ht * wt;

        // 1. Conditioning.
        let c = self.t_embed(t_model)?;

        // 2–3. Image tokens: patchify, embed, learned pad rows, the noise refiner.
        let x = self.embed_image(latent)?;
        let x = self.refine_image(x, &c, prepared, &[])?;

        // 4. Unified sequence [image, caption] through the main layers.
        let mut u = ops::concatenate(&[&x, &prepared.caption], 0)?;
        for (i, block) in self.layers.iter().enumerate() {
            u = block.forward(&u, &prepared.rope, Some(&c))?;
            if let Some(hint) = match hints.as_mut() {
                Some(h) => h.after(i)?,
                None => None,
            } {
                if hint.shape() != u.shape() {
                    return Err(mlx::Error::new(
                        "transformer",
                        format!(
                            "a control hint of shape {:?} after layer {i}, over [{}, {}]",
                            hint.shape(),
                            u.dim(0),
                            self.config.dim
                        ),
                    ));
                }
                u = (&u + &hint)?;
            }
            self.after_block(&u, ("layers", i))?;
        }

        // 5. Final layer: LayerNorm (no affine) scaled by 1 + SiLU(c)·Wᵀ + b, then project.
        let scale = (self.final_ada.forward(&c.silu()?)? + 1.0)?;
        let y = (fast::layer_norm(&u, None, None, 1e-6)? * scale)?;
        let y = self.final_linear.forward(&y)?;

        // 6. Unpatchify the real image tokens: [N, 4C] → [C, h, w].
        y.slice_axis(0, 0, n)?
            .reshape(&[ht, wt, 2, 2, c_in])?
            .transpose(&[4, 0, 2, 1, 3])?
            .reshape(&[c_in, h, w])?
            .astype(Dtype::F32)
    }

    pub(crate) fn check_prepared(&self, latent: &Array, prepared: &Prepared) -> mlx::Result<()> {
        if latent.shape() != prepared.latent_shape {
            return Err(mlx::Error::new(
                "transformer",
                format!(
                    "latents of shape {:?}, prepared for {:?}",
                    latent.shape(),
                    prepared.latent_shape
                ),
            ));
        }
        Ok(())
    }

    fn check_hints(&self, hints: &Hints, prepared: &Prepared) -> mlx::Result<()> {
        let rows = prepared.rope.0.dim(0);
        for (layer, hint) in &hints.after_layer {
            if *layer >= self.layers.len() || hint.shape() != [rows, self.config.dim] {
                return Err(mlx::Error::new(
                    "transformer",
                    format!(
                        "a control hint of shape {:?} for layer {layer}; the model has {} layers over [{rows}, {}]",
                        hint.shape(),
                        self.layers.len(),
                        self.config.dim
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The compute dtype.
    pub(crate) fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The learned row that pads image tokens to the sequence multiple, `[1, dim]`.
    pub(crate) fn x_pad_token(&self) -> &Array {
        &self.x_pad_token
    }

    /// Image tokens `[Np, dim]` of `latent` ([C, h, w]): patchified, embedded, padded with the
    /// learned pad row.
    pub(crate) fn embed_image(&self, latent: &Array) -> mlx::Result<Array> {
        let patches = patchify(&latent.astype(self.dtype)?)?;
        let n = patches.dim(0);
        let x = self.x_embedder.forward(&patches)?;
        pad_rows(&x, &self.x_pad_token, round_up(n, SEQ_MULTI_OF) - n)
    }

    /// The noise refiner over image tokens `x`, with `added[k] = (i, a)` added after refiner
    /// layer `i` (a 2.x ControlNet's refiner hints).
    pub(crate) fn refine_image(
        &self,
        x: Array,
        c: &Array,
        prepared: &Prepared,
        added: &[(usize, Array)],
    ) -> mlx::Result<Array> {
        let mut x = x;
        for (i, block) in self.noise_refiner.iter().enumerate() {
            x = block.forward(&x, &prepared.img_rope, Some(c))?;
            self.after_block(&x, ("noise_refiner", i))?;
            for (_, a) in added.iter().filter(|(at, _)| *at == i) {
                x = (&x + a)?;
            }
        }
        Ok(x)
    }
}

/// Hints for the main layers, asked for in order as each layer ends.
pub trait LayerHints {
    /// The hint to add after main layer `layer` (`[Np + Lp, dim]`, already multiplied by the
    /// conditioning scale), if any.
    fn after(&mut self, layer: usize) -> mlx::Result<Option<Array>>;
}

/// Hints computed beforehand, as [`LayerHints`].
struct GivenHints<'a>(&'a Hints);

impl LayerHints for GivenHints<'_> {
    fn after(&mut self, layer: usize) -> mlx::Result<Option<Array>> {
        Ok(self.0.after(layer).cloned())
    }
}

/// What a ControlNet adds into the transformer's main layers for one step: after layer `i`
/// runs, its hint (`[Np + Lp, dim]`, already multiplied by the conditioning scale) is added to
/// the unified sequence. Made by [`super::controlnet::ControlNet::hints`].
pub struct Hints {
    after_layer: Vec<(usize, Array)>,
}

impl Hints {
    pub(crate) fn new(after_layer: Vec<(usize, Array)>) -> Hints {
        Hints { after_layer }
    }

    /// The hint added after main layer `layer`, if any.
    pub fn after(&self, layer: usize) -> Option<&Array> {
        self.after_layer
            .iter()
            .find(|(at, _)| *at == layer)
            .map(|(_, h)| h)
    }

    /// The layers that receive a hint, in order.
    pub fn layers(&self) -> Vec<usize> {
        self.after_layer.iter().map(|(at, _)| *at).collect()
    }

    /// Computes the hints now (before the step that reads them).
    pub fn eval(&self) -> mlx::Result<()> {
        let arrays: Vec<&Array> = self.after_layer.iter().map(|(_, h)| h).collect();
        mlx::eval(&arrays)
    }
}

/// `[C, h, w]` → `[N, 4C]` patches of 2×2: feature (ph·2 + pw)·C + c, token i·Wt + j.
pub(crate) fn patchify(latent: &Array) -> mlx::Result<Array> {
    let (c, h, w) = (latent.dim(0), latent.dim(1), latent.dim(2));
    let (ht, wt) = (h / 2, w / 2);
    latent
        .reshape(&[c, ht, 2, wt, 2])?
        .transpose(&[1, 3, 2, 4, 0])?
        .reshape(&[ht * wt, 4 * c])
}

pub(crate) fn round_up(n: i32, m: i32) -> i32 {
    n + (m - n % m) % m
}

/// Appends `count` copies of the learned `pad` row ([1, dim]) to `x` ([S, dim]).
pub(crate) fn pad_rows(x: &Array, pad: &Array, count: i32) -> mlx::Result<Array> {
    if count == 0 {
        return Ok(x.clone());
    }
    let fill = pad.broadcast_to(&[count, pad.dim(1)])?;
    ops::concatenate(&[x, &fill], 0)
}

/// Checks what a Z-Image DiT (the transformer or a ControlNet) is shaped by: patch sizes of 2
/// in space and 1 in time (the only ones its patching supports), and its width, heads and
/// refiner layers within bounds.
pub(crate) fn check_dit_shape(
    what: &str,
    patch: &[i32],
    f_patch: &[i32],
    [dim, n_heads, n_refiner_layers]: [i32; 3],
) -> Result<(), String> {
    if patch != [2] || f_patch != [1] {
        return Err(format!(
            "{what} `all_patch_size` {patch:?} / `all_f_patch_size` {f_patch:?} are not supported (Z-Image uses [2]/[1])"
        ));
    }
    check_range(what, "dim", dim, 1..=MAX_WIDTH)?;
    check_range(what, "n_heads", n_heads, 1..=MAX_COUNT)?;
    check_range(what, "n_refiner_layers", n_refiner_layers, 0..=MAX_COUNT)
}
