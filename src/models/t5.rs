//! T5's encoder (FLUX's `text_encoder_2`, T5 v1.1 XXL): token ids → the final-normed hidden
//! states, every row of them (FLUX's `prompt_embeds`).
//!
//! Mirrors transformers 5.23.0 `models/t5/modeling_t5.py` `T5EncoderModel` (flux1-spec §3):
//! ```text
//! per block:  h = RMS(x)·w0;  x += o(softmax(q·kᵀ + bias)·v)      no 1/√d scaling
//!             h = RMS(x)·w1;  x += wo(gelu_tanh(wi_0·h) ⊙ wi_1·h)
//! then        RMS(x)·w_final
//! ```
//! `bias[head, i, j]` is the relative-position table of block 0 read at the bucket of `j − i`,
//! computed once and added in every block. FLUX's pipeline passes no attention mask: padding
//! rows are ordinary tokens, attended by and attending to every row.

use super::blocks::widen;
use super::weights::{Checkpoint, Linear, RmsNorm, Table, Weights};
use super::ModelError;
use crate::mlx::{self, fast, ops, Array, Dtype};

/// `text_encoder_2/config.json` (`T5Config`), the keys the encoder uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct T5Config {
    pub vocab_size: i32,
    pub d_model: i32,
    pub d_kv: i32,
    pub d_ff: i32,
    pub num_layers: i32,
    pub num_heads: i32,
    pub relative_attention_num_buckets: i32,
    /// Absent from configs written before transformers added it; its default then.
    #[serde(default = "default_max_distance")]
    pub relative_attention_max_distance: i32,
    pub layer_norm_epsilon: f32,
    pub feed_forward_proj: String,
}

fn default_max_distance() -> i32 {
    128
}

/// The largest vocabulary a config may give: 32× T5's.
const MAX_VOCAB: i32 = 1 << 20;

impl T5Config {
    /// Reads `text_encoder_2/config.json`; `file` names it in errors.
    pub fn from_json(bytes: &[u8], file: &str) -> Result<T5Config, ModelError> {
        let cfg: T5Config = super::parse_json(bytes, file)?;
        cfg.validate()
            .map_err(|e| ModelError::Config(format!("`{file}`: {e}")))?;
        Ok(cfg)
    }

    /// Checks every key the encoder sizes a shape by, before anything is allocated.
    pub fn validate(&self) -> Result<(), String> {
        use super::{check_finite, check_range, MAX_COUNT, MAX_WIDTH};
        const WHAT: &str = "T5 encoder";
        check_range(WHAT, "vocab_size", self.vocab_size, 1..=MAX_VOCAB)?;
        check_range(WHAT, "d_model", self.d_model, 1..=MAX_WIDTH)?;
        check_range(WHAT, "d_kv", self.d_kv, 1..=MAX_WIDTH)?;
        check_range(WHAT, "d_ff", self.d_ff, 1..=MAX_WIDTH * 4)?;
        check_range(WHAT, "num_layers", self.num_layers, 1..=MAX_COUNT)?;
        check_range(WHAT, "num_heads", self.num_heads, 1..=MAX_COUNT)?;
        if self.num_heads as i64 * self.d_kv as i64 > MAX_WIDTH as i64 * 4 {
            return Err(format!(
                "{WHAT} `num_heads` × `d_kv` is {}; it must be at most {}",
                self.num_heads as i64 * self.d_kv as i64,
                MAX_WIDTH * 4
            ));
        }
        // Bidirectional buckets: half each way, half of those exact, so at least 4.
        check_range(
            WHAT,
            "relative_attention_num_buckets",
            self.relative_attention_num_buckets,
            4..=MAX_COUNT,
        )?;
        check_range(
            WHAT,
            "relative_attention_max_distance",
            self.relative_attention_max_distance,
            1..=MAX_WIDTH,
        )?;
        if self.relative_attention_max_distance <= self.relative_attention_num_buckets / 4 {
            return Err(format!(
                "{WHAT} `relative_attention_max_distance` {} must exceed the exact buckets \
                 (`relative_attention_num_buckets` / 4 = {})",
                self.relative_attention_max_distance,
                self.relative_attention_num_buckets / 4
            ));
        }
        check_finite(
            WHAT,
            "layer_norm_epsilon",
            self.layer_norm_epsilon as f64,
            true,
        )?;
        // transformers reads "gated-gelu" as the gated tanh GELU (`gelu_new`), FLUX's T5 v1.1.
        if self.feed_forward_proj != "gated-gelu" {
            return Err(format!(
                "{WHAT} `feed_forward_proj` is `{}`; only `gated-gelu` is supported",
                self.feed_forward_proj
            ));
        }
        Ok(())
    }
}

/// The bucket of relative position `relative` (key minus query) in a bidirectional encoder
/// with `num_buckets` buckets, as transformers' `_relative_position_bucket` computes it: half
/// the buckets for keys after the query; in each half, distances below a quarter of the
/// buckets (`exact`) get a bucket each, longer ones share buckets logarithmically up to
/// `max_distance`, and everything beyond shares the last. The logarithm is taken in f32 and
/// truncated, as the reference does, so bucket edges fall where its edges fall.
pub fn relative_position_bucket(relative: i32, num_buckets: i32, max_distance: i32) -> i32 {
    let half = num_buckets / 2;
    let after = if relative > 0 { half } else { 0 };
    let distance = relative.unsigned_abs() as i32;
    let exact = half / 2;
    if distance < exact {
        return after + distance;
    }
    let span = ((max_distance as f64) / (exact as f64)).ln() as f32;
    let log_ratio = (distance as f32 / exact as f32).ln() / span;
    let large = exact + (log_ratio * (half - exact) as f32) as i32;
    after + large.min(half - 1)
}

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    heads: i32,
    d_kv: i32,
}

impl Attention {
    fn new(cfg: &T5Config, w: &Weights) -> mlx::Result<Attention> {
        let (d, inner) = (cfg.d_model, cfg.num_heads * cfg.d_kv);
        Ok(Attention {
            q: Linear::new(&w.pp("q"), d, inner, false)?,
            k: Linear::new(&w.pp("k"), d, inner, false)?,
            v: Linear::new(&w.pp("v"), d, inner, false)?,
            o: Linear::new(&w.pp("o"), inner, d, false)?,
            heads: cfg.num_heads,
            d_kv: cfg.d_kv,
        })
    }

    /// `x`: `[L, d_model]` → `[L, d_model]`, scores offset by `bias` (`[1, H, L, L]`, f32),
    /// unscaled; in f32, rounded once.
    fn forward(&self, x: &Array, bias: &Array) -> mlx::Result<Array> {
        let (l, h, d) = (x.dim(0), self.heads, self.d_kv);
        // [L, H·d] → [1, H, L, d]
        let heads = |proj: &Linear| {
            proj.forward(x)?
                .reshape(&[1, l, h, d])?
                .transpose(&[0, 2, 1, 3])
        };
        let (q, k, v) = (heads(&self.q)?, heads(&self.k)?, heads(&self.v)?);
        let (q, k, v) = (widen(&q)?, widen(&k)?, widen(&v)?);
        let o = fast::scaled_dot_product_attention(&q, &k, &v, 1.0, fast::Mask::Array(bias))?;
        let o = o
            .transpose(&[0, 2, 1, 3])?
            .reshape(&[l, h * d])?
            .astype(x.dtype())?;
        self.o.forward(&o)
    }
}

/// The gated feed-forward: `wo(gelu_tanh(wi_0·h) ⊙ wi_1·h)`.
struct GatedFeedForward {
    wi_0: Linear,
    wi_1: Linear,
    wo: Linear,
}

impl GatedFeedForward {
    fn new(cfg: &T5Config, w: &Weights) -> mlx::Result<GatedFeedForward> {
        let (d, ff) = (cfg.d_model, cfg.d_ff);
        Ok(GatedFeedForward {
            wi_0: Linear::new(&w.pp("wi_0"), d, ff, false)?,
            wi_1: Linear::new(&w.pp("wi_1"), d, ff, false)?,
            wo: Linear::new(&w.pp("wo"), ff, d, false)?,
        })
    }

    fn forward(&self, h: &Array) -> mlx::Result<Array> {
        let gated = (gelu_tanh(&self.wi_0.forward(h)?)? * self.wi_1.forward(h)?)?;
        self.wo.forward(&gated)
    }
}

/// `½z(1 + tanh(√(2/π)(z + 0.044715z³)))`, transformers' `gelu_new`. In f32 the shim's one
/// pass (its rounding differs from the ops' by an ulp or so); in a narrower dtype op by op,
/// each rounded as transformers rounds it.
fn gelu_tanh(z: &Array) -> mlx::Result<Array> {
    if z.dtype() == mlx::Dtype::F32 {
        return z.gelu_tanh();
    }
    let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt() as f32;
    let cube = ops::power(z, &Array::full(&[], 3.0, z.dtype())?)?;
    let cubic = (z + (cube * 0.044715)?)?;
    let inner = (cubic * sqrt_2_over_pi)?.tanh()?;
    (z * 0.5)? * (inner + 1.0)?
}

struct Block {
    attention_norm: RmsNorm,
    attention: Attention,
    feed_forward_norm: RmsNorm,
    feed_forward: GatedFeedForward,
}

impl Block {
    /// Block `b`: `layer.0` is the attention, `layer.1` the feed-forward.
    fn new(cfg: &T5Config, w: &Weights) -> mlx::Result<Block> {
        let (attn, ff) = (w.pp("layer").pp(0), w.pp("layer").pp(1));
        let (d, eps) = (cfg.d_model, cfg.layer_norm_epsilon);
        Ok(Block {
            attention_norm: RmsNorm::new(&attn.pp("layer_norm"), d, eps)?,
            attention: Attention::new(cfg, &attn.pp("SelfAttention"))?,
            feed_forward_norm: RmsNorm::new(&ff.pp("layer_norm"), d, eps)?,
            feed_forward: GatedFeedForward::new(cfg, &ff.pp("DenseReluDense"))?,
        })
    }

    fn forward(&self, x: &Array, bias: &Array) -> mlx::Result<Array> {
        let x = (x + self
            .attention
            .forward(&self.attention_norm.forward(x)?, bias)?)?;
        &x + self
            .feed_forward
            .forward(&self.feed_forward_norm.forward(&x)?)?
    }
}

/// The encoder: token ids → `[L, d_model]`.
pub struct T5Encoder {
    embed_tokens: Table,
    /// `[buckets, heads]`: block 0's relative attention table, shared by every block.
    relative_attention_bias: Array,
    blocks: Vec<Block>,
    final_layer_norm: RmsNorm,
    dtype: Dtype,
    pub config: T5Config,
}

impl T5Encoder {
    /// Binds the checkpoint. The token table is `shared.weight` or, when a save has only that,
    /// `encoder.embed_tokens.weight` (the same tensor, tied); a whole encoder–decoder
    /// checkpoint's `decoder.` and `lm_head.` tensors are not used. f16 is refused: T5 v1.1
    /// overflows it (transformers keeps `wo` in f32 to survive), so it runs in bf16 or f32.
    pub fn new(cfg: &T5Config, ckpt: Checkpoint) -> Result<T5Encoder, ModelError> {
        cfg.validate().map_err(ModelError::Config)?;
        if ckpt.dtype() == Dtype::F16 {
            return Err(ModelError::Config(
                "the T5 encoder overflows in f16; run it in bf16 or f32".into(),
            ));
        }
        let mut ckpt = ckpt;
        let table = match ckpt.contains("shared.weight") {
            true => "shared",
            false => "encoder.embed_tokens",
        };
        ckpt.allow_unused("encoder.embed_tokens.weight");
        ckpt.allow_unused("decoder.");
        ckpt.allow_unused("lm_head.");
        let w = ckpt.root();
        let embed_tokens = w
            .pp(table)
            .table("weight", &[cfg.vocab_size, cfg.d_model])?;
        let encoder = w.pp("encoder");
        let relative_attention_bias = (encoder.pp("block.0.layer.0.SelfAttention"))
            .pp("relative_attention_bias")
            .get(
                "weight",
                &[cfg.relative_attention_num_buckets, cfg.num_heads],
            )?;
        let blocks = (0..cfg.num_layers)
            .map(|b| Block::new(cfg, &encoder.pp("block").pp(b)))
            .collect::<mlx::Result<Vec<_>>>()?;
        let final_layer_norm = RmsNorm::new(
            &encoder.pp("final_layer_norm"),
            cfg.d_model,
            cfg.layer_norm_epsilon,
        )?;
        let dtype = ckpt.dtype();
        ckpt.finish()?;
        Ok(T5Encoder {
            embed_tokens,
            relative_attention_bias,
            blocks,
            final_layer_norm,
            dtype,
            config: cfg.clone(),
        })
    }

    /// The last hidden state for `ids` (the whole padded window): `[L, d_model]`.
    pub fn encode(&self, ids: &[u32]) -> mlx::Result<Array> {
        let l = self.check_ids(ids)?;
        let tokens: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let tokens = Array::from_slice(&tokens, &[l])?;
        let mut x = self.embed_tokens.rows(&tokens)?.astype(self.dtype)?;
        // Widened once here for every block's f32 attention (the table's values, as torch's
        // kernel widens them).
        let bias = widen(&self.position_bias(l)?)?;
        for block in &self.blocks {
            x = block.forward(&x, &bias)?;
        }
        self.final_layer_norm.forward(&x)
    }

    /// `[1, H, L, L]`: `bias[h, i, j]` = the table's row for the bucket of `j − i`, column `h`.
    pub fn position_bias(&self, l: i32) -> mlx::Result<Array> {
        let (buckets, distance) = (
            self.config.relative_attention_num_buckets,
            self.config.relative_attention_max_distance,
        );
        let ids: Vec<i32> = (0..l)
            .flat_map(|i| (0..l).map(move |j| relative_position_bucket(j - i, buckets, distance)))
            .collect();
        let ids = Array::from_slice(&ids, &[l * l])?;
        let h = self.config.num_heads;
        (self.relative_attention_bias.take(&ids, 0)?)
            .reshape(&[l, l, h])?
            .transpose(&[2, 0, 1])?
            .reshape(&[1, h, l, l])
    }

    fn check_ids(&self, ids: &[u32]) -> mlx::Result<i32> {
        let fail = |m: String| Err(mlx::Error::new("T5 encoder", m));
        if ids.is_empty() || ids.len() > super::MAX_WIDTH as usize {
            return fail(format!(
                "{} token ids; the encoder reads 1 to {}",
                ids.len(),
                super::MAX_WIDTH
            ));
        }
        if let Some(&id) = ids
            .iter()
            .find(|&&id| id as i64 >= self.config.vocab_size as i64)
        {
            return fail(format!(
                "token id {id} is outside the vocabulary (`vocab_size` {})",
                self.config.vocab_size
            ));
        }
        Ok(ids.len() as i32)
    }
}
