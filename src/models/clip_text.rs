//! CLIP's text model (FLUX's `text_encoder`, the text tower of CLIP ViT-L/14): token ids → the
//! final-normed hidden states and the pooled vector, the row at the end-of-text token.
//!
//! Mirrors transformers 5.23.0 `models/clip/modeling_clip.py` `CLIPTextModel` (flux1-spec §2.2):
//! `x = token_embedding[ids] + position_embedding[0..L]`, pre-norm layers
//! `x += out_proj(attn(LN1(x)))`, `x += fc2(act(fc1(LN2(x))))` with causal attention, then
//! `final_layer_norm`. FLUX's pipeline passes no attention mask, so the causal mask is the only
//! one and the padding after the text is read as ordinary tokens.

use super::blocks::widen;
use super::weights::{Checkpoint, LayerNorm, Linear, Table, Weights};
use super::ModelError;
use crate::mlx::{self, fast, Array, Dtype};

/// `text_encoder/config.json` (`CLIPTextConfig`), the keys the text model uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ClipTextConfig {
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub max_position_embeddings: i32,
    pub hidden_act: ClipActivation,
    pub layer_norm_eps: f32,
    /// Picks how the pooled row is found (see [`pooled_position`]); transformers' default when
    /// the config has none.
    #[serde(default = "default_eos_token_id")]
    pub eos_token_id: i64,
}

fn default_eos_token_id() -> i64 {
    49407
}

/// The MLP's activation (`hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClipActivation {
    /// `z·σ(1.702·z)`, OpenAI's CLIP.
    QuickGelu,
    /// The exact (erf) GELU.
    Gelu,
}

/// The largest vocabulary a config may give: 16× CLIP's.
const MAX_VOCAB: i32 = 1 << 20;

impl ClipTextConfig {
    /// Reads `text_encoder/config.json`; `file` names it in errors.
    pub fn from_json(bytes: &[u8], file: &str) -> Result<ClipTextConfig, ModelError> {
        let cfg: ClipTextConfig = super::parse_json(bytes, file)?;
        cfg.validate()
            .map_err(|e| ModelError::Config(format!("`{file}`: {e}")))?;
        Ok(cfg)
    }

    /// Checks every key the model divides by or sizes a shape by, before anything is allocated.
    pub fn validate(&self) -> Result<(), String> {
        use super::{check_finite, check_range, MAX_COUNT, MAX_WIDTH};
        const WHAT: &str = "CLIP text model";
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
            1..=MAX_COUNT,
        )?;
        check_range(
            WHAT,
            "num_attention_heads",
            self.num_attention_heads,
            1..=MAX_COUNT,
        )?;
        check_range(
            WHAT,
            "max_position_embeddings",
            self.max_position_embeddings,
            1..=MAX_WIDTH,
        )?;
        check_finite(WHAT, "layer_norm_eps", self.layer_norm_eps as f64, true)?;
        if self.hidden_size % self.num_attention_heads != 0 {
            return Err(format!(
                "{WHAT} `hidden_size` {} is not a multiple of `num_attention_heads` {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        Ok(())
    }

    fn head_dim(&self) -> i32 {
        self.hidden_size / self.num_attention_heads
    }
}

/// The row the pooled output is read from, as transformers picks it: with the old configs'
/// `eos_token_id` 2 (FLUX's), the first occurrence of the largest id, which with CLIP's
/// vocabulary (end-of-text last) is the first end-of-text token; otherwise the first
/// occurrence of `eos_token_id`, or row 0 when there is none.
pub fn pooled_position(ids: &[u32], eos_token_id: i64) -> usize {
    if eos_token_id == 2 {
        let max = ids.iter().copied().max().unwrap_or(0);
        return ids.iter().position(|&id| id == max).unwrap_or(0);
    }
    (ids.iter())
        .position(|&id| id as i64 == eos_token_id)
        .unwrap_or(0)
}

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    heads: i32,
    head_dim: i32,
}

impl Attention {
    fn new(cfg: &ClipTextConfig, w: &Weights) -> mlx::Result<Attention> {
        let d = cfg.hidden_size;
        Ok(Attention {
            q_proj: Linear::new(&w.pp("q_proj"), d, d, true)?,
            k_proj: Linear::new(&w.pp("k_proj"), d, d, true)?,
            v_proj: Linear::new(&w.pp("v_proj"), d, d, true)?,
            out_proj: Linear::new(&w.pp("out_proj"), d, d, true)?,
            heads: cfg.num_attention_heads,
            head_dim: cfg.head_dim(),
        })
    }

    /// `x`: `[L, D]` → `[L, D]`, each row attending to itself and the rows before it.
    fn forward(&self, x: &Array) -> mlx::Result<Array> {
        let (l, h, d) = (x.dim(0), self.heads, self.head_dim);
        // [L, D] → [1, H, L, d]
        let heads = |proj: &Linear| {
            proj.forward(x)?
                .reshape(&[1, l, h, d])?
                .transpose(&[0, 2, 1, 3])
        };
        let (q, k, v) = (
            heads(&self.q_proj)?,
            heads(&self.k_proj)?,
            heads(&self.v_proj)?,
        );
        let scale = 1.0 / (d as f32).sqrt();
        // In f32 and rounded once, as torch's attention kernel computes a bf16 one.
        let (q, k, v) = (widen(&q)?, widen(&k)?, widen(&v)?);
        let o = fast::scaled_dot_product_attention(&q, &k, &v, scale, fast::Mask::Causal)?;
        let o = o
            .transpose(&[0, 2, 1, 3])?
            .reshape(&[l, h * d])?
            .astype(x.dtype())?;
        self.out_proj.forward(&o)
    }
}

struct Mlp {
    fc1: Linear,
    fc2: Linear,
    act: ClipActivation,
}

impl Mlp {
    fn forward(&self, x: &Array) -> mlx::Result<Array> {
        let z = self.fc1.forward(x)?;
        let z = match self.act {
            ClipActivation::QuickGelu => (&z * (&z * 1.702)?.sigmoid()?)?,
            ClipActivation::Gelu => gelu_erf(&z)?,
        };
        self.fc2.forward(&z)
    }
}

/// `½z(1 + erf(z/√2))`.
fn gelu_erf(z: &Array) -> mlx::Result<Array> {
    let inner = ((z * std::f32::consts::FRAC_1_SQRT_2)?.erf()? + 1.0)?;
    (z * 0.5)? * inner
}

struct EncoderLayer {
    layer_norm1: LayerNorm,
    self_attn: Attention,
    layer_norm2: LayerNorm,
    mlp: Mlp,
}

impl EncoderLayer {
    fn new(cfg: &ClipTextConfig, w: &Weights) -> mlx::Result<EncoderLayer> {
        let (d, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        Ok(EncoderLayer {
            layer_norm1: LayerNorm::new(&w.pp("layer_norm1"), d, eps)?,
            self_attn: Attention::new(cfg, &w.pp("self_attn"))?,
            layer_norm2: LayerNorm::new(&w.pp("layer_norm2"), d, eps)?,
            mlp: Mlp {
                fc1: Linear::new(&w.pp("mlp").pp("fc1"), d, cfg.intermediate_size, true)?,
                fc2: Linear::new(&w.pp("mlp").pp("fc2"), cfg.intermediate_size, d, true)?,
                act: cfg.hidden_act,
            },
        })
    }

    fn forward(&self, x: &Array) -> mlx::Result<Array> {
        let x = (x + self.self_attn.forward(&self.layer_norm1.forward(x)?)?)?;
        &x + self.mlp.forward(&self.layer_norm2.forward(&x)?)?
    }
}

/// What the text model gives for one prompt.
pub struct ClipTextOutput {
    /// `[L, hidden]`: every row after the final layer norm (`last_hidden_state`).
    pub hidden: Array,
    /// `[hidden]`: the row at [`pooled_position`] (`pooler_output`, FLUX's pooled projection).
    pub pooled: Array,
}

/// The text model: token ids → [`ClipTextOutput`].
pub struct ClipTextModel {
    token_embedding: Table,
    position_embedding: Array,
    layers: Vec<EncoderLayer>,
    final_layer_norm: LayerNorm,
    dtype: Dtype,
    pub config: ClipTextConfig,
}

impl ClipTextModel {
    /// Binds the checkpoint, its names with or without the `text_model.` prefix that
    /// `CLIPTextModel` checkpoints (FLUX's) carry. A `text_projection` (a
    /// `CLIPTextModelWithProjection` save) and the `position_ids` buffer of older saves are not
    /// used and may be present.
    pub fn new(cfg: &ClipTextConfig, ckpt: Checkpoint) -> Result<ClipTextModel, ModelError> {
        cfg.validate().map_err(ModelError::Config)?;
        let mut ckpt = ckpt.rename(|n| n.strip_prefix("text_model.").unwrap_or(n).to_string());
        ckpt.allow_unused("embeddings.position_ids");
        ckpt.allow_unused("text_projection.");
        let w = ckpt.root();
        let d = cfg.hidden_size;
        let embeddings = w.pp("embeddings");
        let token_embedding =
            (embeddings.pp("token_embedding")).table("weight", &[cfg.vocab_size, d])?;
        let position_embedding = (embeddings.pp("position_embedding"))
            .get("weight", &[cfg.max_position_embeddings, d])?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| EncoderLayer::new(cfg, &w.pp("encoder").pp("layers").pp(i)))
            .collect::<mlx::Result<Vec<_>>>()?;
        let final_layer_norm = LayerNorm::new(&w.pp("final_layer_norm"), d, cfg.layer_norm_eps)?;
        let dtype = ckpt.dtype();
        ckpt.finish()?;
        Ok(ClipTextModel {
            token_embedding,
            position_embedding,
            layers,
            final_layer_norm,
            dtype,
            config: cfg.clone(),
        })
    }

    /// Runs the model on `ids` (the whole window the tokenizer gives, padding included).
    pub fn forward(&self, ids: &[u32]) -> mlx::Result<ClipTextOutput> {
        let l = check_ids(ids, &self.config)?;
        // 1. Token rows plus the positions 0..L.
        let tokens: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let tokens = Array::from_slice(&tokens, &[l])?;
        let x = self.token_embedding.rows(&tokens)?.astype(self.dtype)?;
        let mut x = (x + self.position_embedding.slice_axis(0, 0, l)?)?;
        // 2. The layers, then the final norm over every row.
        for layer in &self.layers {
            x = layer.forward(&x)?;
        }
        let hidden = self.final_layer_norm.forward(&x)?;
        // 3. The pooled row.
        let at = pooled_position(ids, self.config.eos_token_id) as i32;
        let pooled = hidden
            .slice_axis(0, at, at + 1)?
            .reshape(&[self.config.hidden_size])?;
        Ok(ClipTextOutput { hidden, pooled })
    }
}

/// The number of ids, once they are known to fit the position table and the vocabulary.
fn check_ids(ids: &[u32], cfg: &ClipTextConfig) -> mlx::Result<i32> {
    let fail = |m: String| Err(mlx::Error::new("CLIP text model", m));
    if ids.is_empty() || ids.len() > cfg.max_position_embeddings as usize {
        return fail(format!(
            "{} token ids; the model reads 1 to `max_position_embeddings` = {}",
            ids.len(),
            cfg.max_position_embeddings
        ));
    }
    if let Some(&id) = ids.iter().find(|&&id| id as i64 >= cfg.vocab_size as i64) {
        return fail(format!(
            "token id {id} is outside the vocabulary (`vocab_size` {})",
            cfg.vocab_size
        ));
    }
    Ok(ids.len() as i32)
}
