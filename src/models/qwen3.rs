//! Qwen3 as a text encoder: by default the output of the second-to-last decoder layer
//! (`hidden_states[-2]`: after all layers but the last, without the final norm), computed over
//! the real tokens only.
//!
//! Mirrors transformers 5.23.0 `models/qwen3/modeling_qwen3.py` (zimage-spec §2.4–2.5). Because
//! padding is on the right and attention is causal, running only the real tokens gives the
//! same embeddings as the reference's padded, masked run.

use super::weights::{Checkpoint, Linear, Release, RmsNorm, Table, Weights};
use crate::mlx::{self, fast, Array};

/// `text_encoder/config.json`, the keys the encoder path uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Qwen3Config {
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub rms_norm_eps: f32,
    /// transformers 4.x writes `rope_theta` at the top level, 5.x inside `rope_parameters`.
    #[serde(default)]
    pub rope_theta: Option<f32>,
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    pub use_sliding_window: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
}

#[derive(Debug, Clone, serde::Deserialize)]
pub struct RopeParameters {
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_type: Option<String>,
}

/// The largest vocabulary a config may give: 8× Qwen3's.
const MAX_VOCAB: i32 = 1 << 20;
/// The widest attention head a config may give: 32× Qwen3's.
const MAX_HEAD_DIM: i32 = 4096;

fn default_act() -> String {
    "silu".into()
}

impl Qwen3Config {
    /// Checks every key the encoder divides by, indexes with, or sizes a shape by, before
    /// anything is allocated.
    pub fn validate(&self) -> Result<(), String> {
        use super::{check_finite, check_range, MAX_COUNT, MAX_WIDTH};
        const WHAT: &str = "text encoder";
        check_range(WHAT, "vocab_size", self.vocab_size, 1..=MAX_VOCAB)?;
        check_range(WHAT, "hidden_size", self.hidden_size, 1..=MAX_WIDTH)?;
        check_range(
            WHAT,
            "intermediate_size",
            self.intermediate_size,
            1..=MAX_WIDTH * 4,
        )?;
        check_range(
            WHAT,
            "num_hidden_layers",
            self.num_hidden_layers,
            2..=MAX_COUNT,
        )?;
        check_range(
            WHAT,
            "num_attention_heads",
            self.num_attention_heads,
            1..=MAX_COUNT,
        )?;
        check_range(
            WHAT,
            "num_key_value_heads",
            self.num_key_value_heads,
            1..=MAX_COUNT,
        )?;
        check_range(WHAT, "head_dim", self.head_dim, 2..=MAX_HEAD_DIM)?;
        if self.head_dim % 2 != 0 {
            return Err(format!(
                "text encoder `head_dim` is {}; RoPE rotates pairs, so it must be even",
                self.head_dim
            ));
        }
        check_finite(WHAT, "rms_norm_eps", self.rms_norm_eps as f64, true)?;
        if self.hidden_act != "silu" {
            return Err(format!(
                "text encoder `hidden_act` is `{}`; only `silu` is supported",
                self.hidden_act
            ));
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(format!(
                "text encoder `num_attention_heads` {} is not a multiple of `num_key_value_heads` {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.use_sliding_window {
            return Err("text encoder `use_sliding_window: true` is not supported".into());
        }
        if let Some(t) = self
            .rope_parameters
            .as_ref()
            .and_then(|r| r.rope_type.as_deref())
        {
            if t != "default" {
                return Err(format!(
                    "text encoder `rope_parameters.rope_type` `{t}` is not supported"
                ));
            }
        }
        match self.theta() {
            None => {
                return Err(
                    "text encoder config has neither `rope_theta` nor `rope_parameters.rope_theta`"
                        .into(),
                )
            }
            Some(theta) => check_finite(WHAT, "rope_theta", theta as f64, true)?,
        }
        Ok(())
    }

    /// The RoPE base, wherever the config keeps it.
    pub fn theta(&self) -> Option<f32> {
        self.rope_parameters
            .as_ref()
            .map(|r| r.rope_theta)
            .or(self.rope_theta)
    }

    /// Decoder layers that run: all but the last.
    pub fn layers_used(&self) -> i32 {
        self.num_hidden_layers - 1
    }
}

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    rope_theta: f32,
}

impl Attention {
    fn new(cfg: &Qwen3Config, w: &Weights) -> mlx::Result<Attention> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nq, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let b = cfg.attention_bias;
        Ok(Attention {
            q_proj: Linear::new(&w.pp("q_proj"), h, nq * d, b)?,
            k_proj: Linear::new(&w.pp("k_proj"), h, nkv * d, b)?,
            v_proj: Linear::new(&w.pp("v_proj"), h, nkv * d, b)?,
            o_proj: Linear::new(&w.pp("o_proj"), nq * d, h, b)?,
            q_norm: RmsNorm::new(&w.pp("q_norm"), d, cfg.rms_norm_eps)?,
            k_norm: RmsNorm::new(&w.pp("k_norm"), d, cfg.rms_norm_eps)?,
            heads: nq,
            kv_heads: nkv,
            head_dim: d,
            rope_theta: cfg.theta().expect("validated"),
        })
    }

    /// `x`: [L, hidden] → [L, hidden], under `mask` (causal, or causal and padding), rotated
    /// at positions `0..L` or, given, by the half-split `rope` tables `(cos, sin)` `[L, d]`.
    fn forward(
        &self,
        x: &Array,
        mask: fast::Mask,
        rope: Option<&(Array, Array)>,
    ) -> mlx::Result<Array> {
        let l = x.dim(0);
        let d = self.head_dim;
        // 1. Project and split heads: [L, n·d] → [1, n, L, d], per-head RMS norm first.
        let heads = |proj: &Linear, norm: Option<&RmsNorm>, n: i32| -> mlx::Result<Array> {
            let t = proj.forward(x)?.reshape(&[1, l, n, d])?;
            let t = match norm {
                Some(norm) => norm.forward(&t)?,
                None => t,
            };
            t.transpose(&[0, 2, 1, 3])
        };
        let q = heads(&self.q_proj, Some(&self.q_norm), self.heads)?;
        let k = heads(&self.k_proj, Some(&self.k_norm), self.kv_heads)?;
        let v = heads(&self.v_proj, None, self.kv_heads)?;
        // 2. Half-split ("rotate_half") RoPE at positions 0..L, or at the given ones.
        let (q, k) = match rope {
            Some(tables) => (
                rotate_half_split(&q, tables)?,
                rotate_half_split(&k, tables)?,
            ),
            None => (
                fast::rope(&q, d, false, Some(self.rope_theta), 1.0, 0, None)?,
                fast::rope(&k, d, false, Some(self.rope_theta), 1.0, 0, None)?,
            ),
        };
        // 3. Causal attention; query head j reads kv head j / (heads / kv_heads).
        let scale = 1.0 / (d as f32).sqrt();
        let o = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask)?;
        let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[l, self.heads * d])?;
        self.o_proj.forward(&o)
    }
}

/// `x·cos + rotate_half(x)·sin` for `x` `[1, n, L, d]` and tables `[L, d]` (each half the
/// same angles), in the tables' dtype and back, as transformers applies explicit positions.
fn rotate_half_split(x: &Array, (cos, sin): &(Array, Array)) -> mlx::Result<Array> {
    let d = x.dim(3);
    let (x1, x2) = (x.slice_axis(3, 0, d / 2)?, x.slice_axis(3, d / 2, d)?);
    let rotated = crate::mlx::ops::concatenate(&[&x2.neg()?, &x1], 3)?;
    let (cos, sin) = (cos.astype(x.dtype())?, sin.astype(x.dtype())?);
    (x * &cos)? + (&rotated * &sin)?
}

/// Half-split RoPE tables `(cos, sin)`, each `[L, d]` f32, for explicit `positions`: pair `j`
/// turns by `p·θ^(−2j/d)`, the inverse frequencies and the angles in f32 as transformers
/// computes them, each half holding the same angles.
pub fn half_split_tables(positions: &[i32], d: i32, theta: f32) -> mlx::Result<(Array, Array)> {
    let half = (d / 2) as usize;
    let inv: Vec<f32> = (0..half)
        .map(|j| 1.0 / theta.powf((2 * j) as f32 / d as f32))
        .collect();
    let mut cos = Vec::with_capacity(positions.len() * d as usize);
    let mut sin = Vec::with_capacity(positions.len() * d as usize);
    for &p in positions {
        let angles: Vec<f32> = inv.iter().map(|f| p as f32 * f).collect();
        for _ in 0..2 {
            cos.extend(angles.iter().map(|a| a.cos()));
            sin.extend(angles.iter().map(|a| a.sin()));
        }
    }
    let shape = [positions.len() as i32, d];
    Ok((
        Array::from_slice(&cos, &shape)?,
        Array::from_slice(&sin, &shape)?,
    ))
}

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn new(cfg: &Qwen3Config, w: &Weights) -> mlx::Result<Mlp> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Mlp {
            gate_proj: Linear::new(&w.pp("gate_proj"), h, i, false)?,
            up_proj: Linear::new(&w.pp("up_proj"), h, i, false)?,
            down_proj: Linear::new(&w.pp("down_proj"), i, h, false)?,
        })
    }

    fn forward(&self, x: &Array) -> mlx::Result<Array> {
        let gated = (self.gate_proj.forward(x)?.silu()? * self.up_proj.forward(x)?)?;
        self.down_proj.forward(&gated)
    }
}

struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    fn forward(
        &self,
        x: &Array,
        mask: fast::Mask,
        rope: Option<&(Array, Array)>,
    ) -> mlx::Result<Array> {
        let x = (x + self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, rope)?)?;
        &x + self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&x)?)?
    }
}

/// The encoder: token ids → `[L, hidden]` prompt embeddings.
pub struct Qwen3Encoder {
    embed_tokens: Table,
    dtype: crate::mlx::Dtype,
    layers: Vec<DecoderLayer>,
    /// Set when the weights are streamed: each layer is computed, then let go of.
    release: Option<Release>,
    pub config: Qwen3Config,
}

impl Qwen3Encoder {
    /// Binds the checkpoint, with or without the `model.` prefix of a causal-LM save (or the
    /// `model.language_model.` of a vision-language save, whose vision tower never runs). The
    /// last layer, the final norm and any `lm_head` are not needed and may be absent.
    pub fn new(cfg: &Qwen3Config, ckpt: Checkpoint) -> Result<Qwen3Encoder, super::ModelError> {
        Qwen3Encoder::with_layers(cfg, ckpt, cfg.layers_used())
    }

    /// The same, binding only the first `count` decoder layers (the later ones may be absent):
    /// an encoder read at an intermediate layer never runs what follows it.
    pub fn with_layers(
        cfg: &Qwen3Config,
        ckpt: Checkpoint,
        count: i32,
    ) -> Result<Qwen3Encoder, super::ModelError> {
        cfg.validate().map_err(super::ModelError::Config)?;
        if !(1..=cfg.num_hidden_layers).contains(&count) {
            return Err(super::ModelError::Config(format!(
                "text encoder has {} layers; {count} are needed",
                cfg.num_hidden_layers
            )));
        }
        let mut ckpt = ckpt.rename(|n| {
            (n.strip_prefix("model.language_model."))
                .or_else(|| n.strip_prefix("model."))
                .unwrap_or(n)
                .to_string()
        });
        ckpt.allow_unused("visual.");
        for unused in count..cfg.num_hidden_layers {
            ckpt.allow_unused(&format!("layers.{unused}."));
        }
        ckpt.allow_unused("norm.");
        ckpt.allow_unused("lm_head.");
        let w = ckpt.root();
        // The table stays as stored (packed, when quantized): only the prompt's rows are
        // gathered and widened.
        let embed_tokens = w
            .pp("embed_tokens")
            .table("weight", &[cfg.vocab_size, cfg.hidden_size])?;
        let mut layers = Vec::new();
        for i in 0..count {
            let lw = w.pp("layers").pp(i);
            layers.push(DecoderLayer {
                input_layernorm: RmsNorm::new(
                    &lw.pp("input_layernorm"),
                    cfg.hidden_size,
                    cfg.rms_norm_eps,
                )?,
                self_attn: Attention::new(cfg, &lw.pp("self_attn"))?,
                post_attention_layernorm: RmsNorm::new(
                    &lw.pp("post_attention_layernorm"),
                    cfg.hidden_size,
                    cfg.rms_norm_eps,
                )?,
                mlp: Mlp::new(cfg, &lw.pp("mlp"))?,
            });
        }
        let dtype = ckpt.dtype();
        let release = ckpt.release();
        ckpt.finish()?;
        Ok(Qwen3Encoder {
            embed_tokens,
            dtype,
            layers,
            release,
            config: cfg.clone(),
        })
    }

    /// `hidden_states[-2]` for the real tokens `ids`: `[L, hidden]`.
    pub fn encode(&self, ids: &[u32]) -> mlx::Result<Array> {
        let x = self.embed(ids)?;
        Ok(self.run(x, fast::Mask::Causal, None, &[])?.0)
    }

    /// The residual stream after each of the layer counts `outputs` (transformers'
    /// `hidden_states[k]`: the output of `k` layers, no final norm), for `ids` right-padded with
    /// `pad_id` to `length` rows. A row attends to the rows at or before it that are real
    /// tokens, so a padding row reads the prompt only, as the padded reference run computes it
    /// (the FLUX.2 spec §2.2–2.3). Each output is `[length, hidden]`.
    pub fn encode_padded(
        &self,
        ids: &[u32],
        pad_id: u32,
        length: usize,
        outputs: &[usize],
    ) -> mlx::Result<Vec<Array>> {
        let real = ids.len().min(length);
        let mut padded = ids[..real].to_vec();
        padded.resize(length, pad_id);
        let n = length as i32;
        let mask: Vec<bool> = (0..length)
            .flat_map(|q| (0..length).map(move |k| k <= q && k < real))
            .collect();
        let mask = Array::from_slice(&mask, &[1, 1, n, n])?;
        let x = self.embed(&padded)?;
        Ok(self.run(x, fast::Mask::Array(&mask), None, outputs)?.1)
    }

    /// As [`Qwen3Encoder::encode_padded`], the real tokens at positions `0..L` and every
    /// padding row at position `pad_position` instead of its index (what a model trained on
    /// an encoder that placed its padding so reads). A row still attends to the real rows at
    /// or before it.
    pub fn encode_padded_at(
        &self,
        ids: &[u32],
        pad_id: u32,
        length: usize,
        outputs: &[usize],
        pad_position: i32,
    ) -> mlx::Result<Vec<Array>> {
        let real = ids.len().min(length);
        let mut padded = ids[..real].to_vec();
        padded.resize(length, pad_id);
        let n = length as i32;
        let mask: Vec<bool> = (0..length)
            .flat_map(|q| (0..length).map(move |k| k <= q && k < real))
            .collect();
        let mask = Array::from_slice(&mask, &[1, 1, n, n])?;
        let positions: Vec<i32> = (0..length)
            .map(|i| if i < real { i as i32 } else { pad_position })
            .collect();
        let theta = self.config.theta().expect("validated");
        let rope = half_split_tables(&positions, self.config.head_dim, theta)?;
        let x = self.embed(&padded)?;
        Ok(self
            .run(x, fast::Mask::Array(&mask), Some(&rope), outputs)?
            .1)
    }

    fn embed(&self, ids: &[u32]) -> mlx::Result<Array> {
        let ids: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let ids = Array::from_slice(&ids, &[ids.len() as i32])?;
        self.embed_tokens.rows(&ids)?.astype(self.dtype)
    }

    /// Runs the bound layers (stopping after the last of `outputs`, when given), keeping the
    /// stream after each count in `outputs`.
    fn run(
        &self,
        mut x: Array,
        mask: fast::Mask,
        rope: Option<&(Array, Array)>,
        outputs: &[usize],
    ) -> mlx::Result<(Array, Vec<Array>)> {
        let last = outputs.iter().max().copied().unwrap_or(self.layers.len());
        if last > self.layers.len() {
            return Err(mlx::Error::new(
                "text encoder",
                format!(
                    "hidden state {last} asked of an encoder with {} layers bound",
                    self.layers.len()
                ),
            ));
        }
        let mut kept = Vec::new();
        for (i, layer) in self.layers[..last].iter().enumerate() {
            x = layer.forward(&x, mask, rope)?;
            super::blocks::after_block(self.release.as_ref(), &x, ("text_encoder.layers", i))?;
            if outputs.contains(&(i + 1)) {
                kept.push(x.clone());
            }
        }
        Ok((x, kept))
    }
}
