//! The memory a request needs, phase by phase, and the choices that make it fit a budget.
//!
//! The phases run one after another and each frees what it loaded before the next starts, so
//! the process peaks at the largest phase: its weights as they will be held, its activations,
//! and what the process held before loading anything (measured, not guessed).
//!
//! - text: the text encoder's layers but the last, the embedding table as stored, activations
//!   over the prompt's tokens; at least what its load holds (every tensor as stored);
//! - denoise: the transformer (and a ControlNet's blocks), one block's activations over image +
//!   caption tokens (attention scores in head chunks of at most 256 MiB), the caption features,
//!   and a ControlNet's hints for one step;
//! - decode: the VAE decoder in the compute dtype and its activations, per tile when tiled.
//!
//! The GPU graph ([`Graph::Gpu`]) holds the same weights but other transients: one block's
//! activations in the compute dtype (its norms and RoPE in f32), attention fused (no scores) or,
//! where MLX does not fuse it, one chunk of queries' scores; a quantized layer widened for its
//! product over the image tokens; on a GPU no convolution matrices or CPU scratch in the decode.
//!
//! Weights are counted from the tensor sizes of the stored model, so the same figures serve
//! `generate`'s preflight and `show`. The family supplies its [`Denoiser`]: how many text
//! layers run, which tokens the denoiser attends over and what one of its blocks holds; the
//! rest (weights as held, the text encoder, the VAE, the choice under a budget) is shared.

use crate::mlx::Device;
use crate::models::vae_tiling::{self as tiling, Tiling};
use crate::models::{Qwen3Config, Residency, VaeConfig};

/// The text encoder's widths, as its activations are counted: plain figures its family reads
/// from the encoder's config.
#[derive(Debug, Clone, Copy)]
pub struct TextShape {
    pub hidden: u64,
    /// The MLP's inner width (its gate and up projections each this wide).
    pub intermediate: u64,
    pub heads: u64,
    pub head_dim: u64,
}

impl From<&Qwen3Config> for TextShape {
    fn from(c: &Qwen3Config) -> TextShape {
        TextShape {
            hidden: c.hidden_size as u64,
            intermediate: c.intermediate_size as u64,
            heads: c.num_attention_heads as u64,
            head_dim: c.head_dim as u64,
        }
    }
}
use crate::platform::Graph;
use std::collections::{HashMap, HashSet};

/// One stored tensor's size.
#[derive(Debug, Clone)]
pub struct TensorSize {
    /// The name inside its component.
    pub name: String,
    /// The logical shape (of the full-precision tensor a packed one stands for).
    pub shape: Vec<u64>,
    /// Bytes as stored (a packed tensor with its scales and biases).
    pub stored_bytes: u64,
    /// Quantized: held packed whatever the residency.
    pub packed: bool,
}

impl TensorSize {
    /// Saturating: shapes come from manifests, which are input.
    fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }
}

/// A family's denoiser, as the plan counts its sequence and one block's activations: plain
/// figures its family reads from the model's configs.
#[derive(Debug, Clone, Copy)]
pub struct Denoiser {
    /// The hidden width of the token stream.
    pub dim: u64,
    /// Attention heads.
    pub heads: u64,
    /// Values per token of a block's widest products in the compute dtype.
    pub wide_values: u64,
    /// Pixels on a side of one image token (the VAE's downscale times the patch).
    pub cell: u64,
    /// The image's and the prompt's tokens are each padded to a multiple of this (1: none).
    pub pad_to: u64,
    /// Decoder layers of the text encoder that run.
    pub text_layers: i32,
    /// Hidden states the text phase keeps per prompt beside its activations.
    pub text_outputs: u64,
    /// The CPU graph attends through the shim's kernel (else MLX's, on both graphs).
    pub shim_attention: bool,
    /// Values the denoise keeps for all its steps per prompt token (projected text features
    /// held outside the sequence) and per reference token.
    pub kept_per_text_token: u64,
    pub kept_per_reference_token: u64,
    /// Values per token beside a quantized layer widened on the GPU graph when the block's
    /// widest layer runs apart from its transients (a fused input projection); `None` when it
    /// runs amid them.
    pub widest_apart: Option<u64>,
}

impl Denoiser {
    /// Tokens the blocks attend over: the image's, the prompt's and the references', the first
    /// two padded as the family pads them.
    fn sequence(&self, req: &RequestShape) -> u64 {
        let cell = self.cell.max(1);
        let image = (req.width as u64 / cell) * (req.height as u64 / cell);
        let pad = self.pad_to.max(1);
        round_up(image, pad) + round_up(req.prompt_tokens as u64, pad) + req.reference_tokens as u64
    }
}

/// The sizes of a model's three components and its configuration.
pub struct ModelSizes<'a> {
    pub text_encoder: &'a [TensorSize],
    pub transformer: &'a [TensorSize],
    pub vae: &'a [TensorSize],
    /// A ControlNet loaded beside the transformer (empty: none).
    pub controlnet: &'a [TensorSize],
    pub text_config: TextShape,
    pub denoiser: Denoiser,
    pub vae_config: &'a VaeConfig,
}

/// What a request asks of memory, apart from the model.
#[derive(Debug, Clone, Copy)]
pub struct RequestShape {
    pub width: u32,
    pub height: u32,
    /// Prompt tokens after templating (the longer of the prompt and the negative one); for
    /// FLUX.2 the padded length every prompt runs at.
    pub prompt_tokens: u32,
    /// Prompts the text encoder runs (2 with a negative prompt, whose features the denoise
    /// phase keeps too).
    pub prompts: u32,
    /// Tokens of reference pictures the denoiser reads beside the image's (FLUX.2 only).
    pub reference_tokens: u32,
    /// Bytes of one value in the compute dtype.
    pub compute_bytes: u64,
    /// The largest picture the VAE encoder encodes first (`width, height`): the one an image
    /// task starts from, a ControlNet's control image, FLUX.2's reference pictures; `None`
    /// for a request from text alone.
    pub encodes: Option<(u32, u32)>,
    /// The form the model graph takes: the GPU's holds other transients than the CPU's.
    pub graph: Graph,
    /// The device MLX computes on: a GPU fuses attention and widens weights in one kernel,
    /// where MLX's CPU backend composes both from steps that hold more.
    pub device: Device,
}

/// Peak bytes of each phase (weights and activations), and what the process holds besides.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct MemoryEstimate {
    pub base: u64,
    pub text: u64,
    /// The VAE encoder's phase (0 for a request from text alone).
    pub encode: u64,
    pub denoise: u64,
    pub decode: u64,
}

impl MemoryEstimate {
    /// The process's expected peak resident memory.
    pub fn peak(&self) -> u64 {
        self.base.saturating_add(
            self.text
                .max(self.encode)
                .max(self.denoise)
                .max(self.decode),
        )
    }
}

/// How a request will run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryPlan {
    pub residency: Residency,
    #[serde(skip)]
    pub tiling: Option<Tiling>,
    pub estimate: MemoryEstimate,
    pub budget: u64,
    /// Where the budget came from: ` (--memory-limit 4GB)`, ` (Metal's recommended working
    /// set)`…
    pub budget_source: String,
    /// The most freed buffers MLX may keep for reuse within a phase, on the GPU graph (`None`:
    /// MLX's own limit, on the CPU graph, whose phases free their memory to the system).
    pub cache_limit: Option<u64>,
}

/// The request cannot fit the budget in any mode.
#[derive(Debug, thiserror::Error)]
#[error(
    "this request needs at least {} of memory (text {}, encode {}, denoise {}, decode {}, process {}), \
     more than the budget of {}{}. {} Set a larger budget with --memory-limit or ZIMAGE_MEMORY_LIMIT \
     if the machine really has more free",
    gb(*needs), gb(estimate.text), gb(estimate.encode), gb(estimate.denoise), gb(estimate.decode),
    gb(estimate.base), gb(*budget), budget_source, advice
)]
pub struct DoesNotFit {
    /// The smallest budget under which the request runs, in its leanest mode.
    pub needs: u64,
    /// The leanest mode's estimate at that budget.
    pub estimate: MemoryEstimate,
    pub budget: u64,
    pub budget_source: String,
    pub advice: String,
}

/// Bytes as gigabytes (megabytes below one), for messages.
pub fn gb(bytes: u64) -> String {
    if bytes < 1_000_000_000 {
        format!("{:.0} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.2} GB", bytes as f64 / 1e9)
    }
}

/// Bytes the attention of one chunk of heads may hold in scores (the shim's CPU kernel).
const SCORE_CHUNK_BYTES: u64 = 256 << 20;
/// The buffer narrow weights are widened into, one tile at a time.
const WIDEN_SCRATCH_BYTES: u64 = 64 << 20;
/// The GPU graph's block transients over the sequence, in `S·dim` values: those held in f32
/// and those in the compute dtype (measured with `ZIMAGE_DEBUG_BLOCKS` on MLX's CPU backend).
const GPU_STREAM_F32: u64 = 4;
const GPU_STREAM_NARROW: u64 = 6;
/// The smallest cache limit the GPU graph sets: the small buffers of a phase (norm
/// statistics, the timestep embedding) stay cached whatever the request.
const MIN_CACHE_LIMIT: u64 = 64 << 20;
/// What the process adds once it computes: BLAS thread buffers, MLX's worker state.
const RUNTIME_BYTES: u64 = 48 << 20;

/// Whether `name` is a token table, which the encoders read a few rows at a time and hold as
/// stored (packed when quantized), never widening it whole for a product: a causal LM's
/// `embed_tokens`, T5's tied `shared` table, CLIP's `token_embedding`.
fn is_table(name: &str) -> bool {
    name.ends_with("embed_tokens.weight")
        || name.ends_with("token_embedding.weight")
        || name == "shared.weight"
}

/// Bytes of a component's weights as they will be held.
fn weight_bytes(
    tensors: &[TensorSize],
    used: impl Fn(&str) -> bool,
    residency: Residency,
    compute_bytes: u64,
) -> u64 {
    tensors
        .iter()
        .filter(|t| used(&t.name))
        .map(|t| {
            let is_table = is_table(&t.name);
            let is_linear = t.shape.len() == 2 && t.name.ends_with(".weight") && !is_table;
            if t.packed || is_table || (is_linear && residency.as_stored()) {
                t.stored_bytes
            } else {
                t.numel().saturating_mul(compute_bytes)
            }
        })
        .fold(0u64, u64::saturating_add)
}

/// The block a streamed tensor belongs to: its name up to the first numbered part
/// (`layers.3`, `model.layers.3`, `control_layers.7`), or `None` for what lies outside the
/// blocks.
fn block_of(name: &str) -> Option<&str> {
    let mut start = 0;
    for part in name.split('.') {
        let end = start + part.len();
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            return Some(&name[..end]);
        }
        start = end + 1;
    }
    None
}

/// Bytes of a component's weights (those `used`) as they will be held. Streamed: what lies
/// outside the blocks and the blocks' small tensors in full, the blocks' linear weights (as
/// stored) one block at a time, the largest.
fn held_bytes(
    tensors: &[TensorSize],
    used: impl Fn(&str) -> bool,
    residency: Residency,
    compute_bytes: u64,
) -> u64 {
    if residency != Residency::Streamed {
        return weight_bytes(tensors, used, residency, compute_bytes);
    }
    let streamed = |t: &TensorSize| {
        block_of(&t.name).is_some()
            && (t.packed || (t.shape.len() == 2 && t.name.ends_with(".weight")))
    };
    let in_blocks: HashSet<&str> = (tensors.iter())
        .filter(|t| used(&t.name) && streamed(t))
        .map(|t| t.name.as_str())
        .collect();
    let rest = weight_bytes(
        tensors,
        |n| used(n) && !in_blocks.contains(n),
        Residency::Stored,
        compute_bytes,
    );
    let mut blocks: HashMap<&str, u64> = HashMap::new();
    for t in tensors
        .iter()
        .filter(|t| in_blocks.contains(t.name.as_str()))
    {
        let b =
            (blocks.entry(block_of(&t.name).expect("streamed tensors are in blocks"))).or_default();
        *b = b.saturating_add(t.stored_bytes);
    }
    rest.saturating_add(blocks.values().copied().max().unwrap_or(0))
}

/// The buffer linear layers widen their weights into, when any weight of the component will be
/// held narrower than the compute dtype.
fn widen_scratch(tensors: &[TensorSize], residency: Residency, compute_bytes: u64) -> u64 {
    let narrow = tensors.iter().any(|t| {
        t.packed
            || (residency.as_stored()
                && t.shape.len() == 2
                && t.stored_bytes < t.numel().saturating_mul(compute_bytes))
    });
    if narrow {
        WIDEN_SCRATCH_BYTES
    } else {
        0
    }
}

/// The stored copy of the largest layer whose weights are held widened to the compute dtype:
/// the GPU graph casts a layer's weights when it first runs it, and the stored copy is alive
/// until the cast is done. Nothing when no weight is widened.
fn cast_source(tensors: &[TensorSize], residency: Residency, compute_bytes: u64) -> u64 {
    if residency != Residency::Compute {
        return 0;
    }
    let mut layers: HashMap<&str, u64> = HashMap::new();
    for t in tensors {
        let widened = !t.packed && t.stored_bytes < t.numel().saturating_mul(compute_bytes);
        if let Some(block) = block_of(&t.name).filter(|_| widened) {
            let held = layers.entry(block).or_default();
            *held = held.saturating_add(t.stored_bytes);
        }
    }
    layers.into_values().max().unwrap_or(0)
}

/// The GPU graph's widened copy of one quantized layer, for products over `rows` rows
/// ([`crate::platform::widens_quantized`]): the largest packed linear weight in the compute
/// dtype with what MLX holds while widening it, or nothing when no weight is packed or the rows
/// are few. One layer only: each widened product is evaluated before the next is made. A packed
/// token table is no product's weight: only the rows read are widened.
fn widened_layer(tensors: &[TensorSize], req: &RequestShape, rows: u64) -> u64 {
    if !crate::platform::widens_quantized(req.graph, rows) {
        return 0;
    }
    let per_value = crate::platform::widening_bytes_per_value(req.device, req.compute_bytes);
    (tensors.iter())
        .filter(|t| t.packed && t.shape.len() == 2 && !is_table(&t.name))
        .map(|t| t.numel().saturating_mul(per_value))
        .max()
        .unwrap_or(0)
}

/// Whether the decode's convolutions run as the CPU's matrix products, which keep each
/// convolution's weight in matrix form beside it: the CPU graph, and any graph on the CPU
/// ([`crate::platform::convolutions_as_matmuls_on`]).
fn uses_conv_matrices(req: &RequestShape) -> bool {
    req.graph == Graph::Cpu || crate::platform::convolutions_as_matmuls_on(req.device)
}

/// Whether the text encoder path binds `name` (the first `layers` layers; no final norm, no
/// head, no vision tower), under a causal-LM save's `model.` or a vision-language save's
/// `model.language_model.`, as the encoder reads them.
fn text_encoder_uses(name: &str, layers: i32) -> bool {
    let n = (name.strip_prefix("model.language_model."))
        .or_else(|| name.strip_prefix("model."))
        .unwrap_or(name);
    let later = n
        .strip_prefix("layers.")
        .and_then(|rest| rest.split('.').next()?.parse::<i32>().ok())
        .is_some_and(|i| i >= layers);
    !(later || n.starts_with("norm.") || n.starts_with("lm_head.") || n.starts_with("visual."))
}

fn vae_uses(name: &str) -> bool {
    !(name.starts_with("encoder.") || name.starts_with("quant_conv."))
}

/// `n` rounded up to a multiple of `m`, saturating: a size a hostile file states can be near
/// `u64::MAX`.
fn round_up(n: u64, m: u64) -> u64 {
    n.div_ceil(m).saturating_mul(m)
}

impl ModelSizes<'_> {
    /// The estimate of a request held in `residency`, decoded with `tiling`.
    pub fn estimate(
        &self,
        req: &RequestShape,
        residency: Residency,
        tiling: Option<&Tiling>,
        base: u64,
    ) -> MemoryEstimate {
        let cb = req.compute_bytes;
        // Saturating throughout: weight sizes come from manifests, which are input.
        let sum = |parts: &[u64]| parts.iter().fold(0u64, |n, &p| n.saturating_add(p));
        let gpu = req.graph == Graph::Gpu;
        MemoryEstimate {
            base: base.saturating_add(RUNTIME_BYTES),
            text: sum(&[
                self.text_weights(residency, cb),
                self.text_activations(req),
                match gpu {
                    true => widened_layer(self.text_encoder, req, req.prompt_tokens as u64)
                        .max(cast_source(self.text_encoder, residency, cb)),
                    false => widen_scratch(self.text_encoder, residency, cb),
                },
            ])
            .max(self.text_load(residency, cb)),
            denoise: sum(&[
                self.denoise_weights(residency, cb),
                match gpu {
                    true => self.block_peak_gpu(req),
                    false => {
                        self.denoise_activations(req)
                            + widen_scratch(self.transformer, residency, cb)
                    }
                },
                self.control_hints(req),
            ]),
            // The encoder's activations are the decoder's mirror image (the same channels at
            // the same resolutions), so the untiled decode's count at the picture's size stands
            // in for them.
            encode: match req.encodes {
                Some((width, height)) => sum(&[
                    weight_bytes(self.vae, |n| !vae_uses(n), Residency::Compute, cb),
                    self.decode_activations(
                        &RequestShape {
                            width,
                            height,
                            ..*req
                        },
                        None,
                    ),
                ]),
                None => 0,
            },
            decode: sum(&[self.vae_weights(cb), self.decode_activations(req, tiling)]),
        }
    }

    pub fn text_weights(&self, residency: Residency, compute_bytes: u64) -> u64 {
        let layers = self.denoiser.text_layers;
        held_bytes(
            self.text_encoder,
            |n| text_encoder_uses(n, layers),
            residency,
            compute_bytes,
        )
    }

    /// What loading the text encoder holds before the model lets go of the parts it never runs
    /// (its last layer, final norm and head): every tensor as stored, unless streamed.
    fn text_load(&self, residency: Residency, compute_bytes: u64) -> u64 {
        match residency {
            Residency::Streamed => 0,
            _ => weight_bytes(
                self.text_encoder,
                |_| true,
                Residency::Stored,
                compute_bytes,
            ),
        }
    }

    /// The transformer's weights and a ControlNet's, as they will be held.
    pub fn denoise_weights(&self, residency: Residency, compute_bytes: u64) -> u64 {
        held_bytes(self.transformer, |_| true, residency, compute_bytes)
            .saturating_add(self.controlnet_weights(residency, compute_bytes))
    }

    /// A ControlNet's weights as they will be held (0 without one).
    pub fn controlnet_weights(&self, residency: Residency, compute_bytes: u64) -> u64 {
        held_bytes(self.controlnet, |_| true, residency, compute_bytes)
    }

    /// What a ControlNet holds beside the transformer during a pass: one hint at a time (each
    /// computed as its layer is reached), the control stream before and after a block, and
    /// what the blocks read ([image, caption]), each `[S, dim]`.
    fn control_hints(&self, req: &RequestShape) -> u64 {
        if self.controlnet.is_empty() {
            return 0;
        }
        4 * self.sequence(req) * self.denoiser.dim * req.compute_bytes
    }

    pub fn vae_weights(&self, compute_bytes: u64) -> u64 {
        weight_bytes(self.vae, vae_uses, Residency::Compute, compute_bytes)
    }

    fn text_activations(&self, req: &RequestShape) -> u64 {
        let c = self.text_config;
        let l = req.prompt_tokens as u64;
        let (h, i) = (c.hidden, c.intermediate);
        let q = c.heads * c.head_dim;
        // The residual stream and its norms, q/k/v/o, gate/up/product, and the scores; then
        // the hidden states kept for each prompt.
        let values = l * (6 * h + 3 * q + 3 * i) + 2 * c.heads * l * l;
        let kept = req.prompts as u64 * self.denoiser.text_outputs * l * h * req.compute_bytes;
        values * 4 + kept
    }

    fn denoise_activations(&self, req: &RequestShape) -> u64 {
        let s = self.sequence(req);
        let dim = self.denoiser.dim;
        let heads = self.denoiser.heads;
        // Attention through the shim's kernel on the CPU graph, or MLX's on both graphs, as
        // the family's denoiser says.
        let scores = match self.denoiser.shim_attention {
            true => (heads * s * s * 4).min(SCORE_CHUNK_BYTES.max(s * s * 4)),
            false => self.mlx_attention_scores(req),
        };
        // Residual stream, its norms and q/k/v/o in f32 whatever the dtype (RoPE), the
        // block's widest products, two copies of a chunk of scores (scores and exponentials).
        s * dim * 4 * 16
            + s * self.denoiser.wide_values * req.compute_bytes
            + 2 * scores
            + self.denoise_inputs(req)
    }

    /// What the denoise phase keeps for all its steps beside the blocks: projected text
    /// features for each prompt held outside the sequence, and the references' tokens.
    fn denoise_inputs(&self, req: &RequestShape) -> u64 {
        let text = req.prompts as u64 * req.prompt_tokens as u64;
        (text * self.denoiser.kept_per_text_token
            + req.reference_tokens as u64 * self.denoiser.kept_per_reference_token)
            * req.compute_bytes
    }

    /// Tokens of the sequence the denoiser's blocks attend over.
    fn sequence(&self, req: &RequestShape) -> u64 {
        self.denoiser.sequence(req)
    }

    /// The GPU graph's transients of one block (evaluated block by block), over `S` tokens:
    /// the block's input and the residual stream, the norms' f32 statistics pass and the q/k/v
    /// projections with their f32 RoPE rotation (`S·dim` values each), the feed-forward's gate,
    /// its SiLU, the up projection and their product (`S·ffn` each, in the compute dtype), and
    /// attention: fused, nothing more; else one chunk of queries' scores and their softmax.
    fn denoise_activations_gpu(&self, req: &RequestShape) -> u64 {
        let s = self.sequence(req);
        let dim = self.denoiser.dim;
        let cb = req.compute_bytes;
        let scores = 2 * self.mlx_attention_scores(req);
        s * dim * (GPU_STREAM_F32 * 4 + GPU_STREAM_NARROW * cb)
            + s * self.denoiser.wide_values * cb
            + scores
            + self.denoise_inputs(req)
    }

    /// One chunk of queries' scores of MLX's attention: none where it is fused (a GPU), else
    /// as many queries' as fit [`crate::platform::ATTENTION_CHUNK_BYTES`].
    fn mlx_attention_scores(&self, req: &RequestShape) -> u64 {
        if crate::platform::attention_is_fused_on(req.device) {
            return 0;
        }
        let (s, heads) = (self.sequence(req), self.denoiser.heads);
        let rows = crate::models::blocks::query_chunk(heads, s).min(s);
        heads * rows * s * req.compute_bytes
    }

    /// The GPU graph's peak within one block: its transients and the widened copy of a
    /// quantized layer. Where the widest layer runs amid the block's transients both count;
    /// where it runs apart (a fused input projection, when the block holds little but its input)
    /// it counts with what the denoiser says lies beside it.
    fn block_peak_gpu(&self, req: &RequestShape) -> u64 {
        let transients = self.denoise_activations_gpu(req);
        let widened = widened_layer(self.transformer, req, self.sequence(req));
        match self.denoiser.widest_apart {
            None => transients + widened,
            Some(values) => {
                let beside = self.sequence(req) * values * req.compute_bytes;
                transients.max(widened + beside + self.denoise_inputs(req))
            }
        }
    }

    /// The GPU graph's cache limit for a request estimated at `estimate`: enough to keep one
    /// block's transients for the next block (each block frees and asks again for the same
    /// buffers), never more than the budget leaves beside the estimate, so that the cache
    /// cannot take a run past its budget. Freed buffers beyond it go back to the device.
    pub fn cache_limit(
        &self,
        req: &RequestShape,
        estimate: &MemoryEstimate,
        budget: u64,
    ) -> Option<u64> {
        if req.graph != Graph::Gpu {
            return None;
        }
        let block = self.denoise_activations_gpu(req).max(MIN_CACHE_LIMIT);
        Some(block.min(budget.saturating_sub(estimate.peak())))
    }

    fn decode_activations(&self, req: &RequestShape, tiling: Option<&Tiling>) -> u64 {
        let (h, w) = (req.height as i32, req.width as i32);
        let cb = req.compute_bytes as usize;
        // The convolution weights are also kept in matrix form once the decoder has run, and on
        // the CPU the convolutions' scratch.
        let matrices = match uses_conv_matrices(req) {
            true => {
                tiling::conv_matrix_bytes(self.vae_config, cb)
                    + tiling::conv_scratch_bytes(self.vae_config)
            }
            false => 0,
        };
        matrices
            + match tiling {
                Some(t) => tiling::tiled_decode_peak_bytes(self.vae_config, h, w, t, cb),
                None => tiling::decode_peak_bytes(self.vae_config, h, w, cb),
            }
    }

    /// The weights' bytes if every tensor a quantized import quantizes were packed at `bits`
    /// (group 64, bf16 scales and biases): what a `--quantize` import would hold.
    pub fn quantized_variant(&self, bits: u64) -> (Vec<TensorSize>, Vec<TensorSize>) {
        let pack = |tensors: &[TensorSize]| -> Vec<TensorSize> {
            tensors
                .iter()
                .map(|t| {
                    let n = t.name.as_str();
                    let quantizable = !t.packed
                        && t.shape.len() >= 2
                        && crate::store::import::quantizes_name(n)
                        && t.shape.last().is_some_and(|c| c % 64 == 0);
                    if !quantizable {
                        return t.clone();
                    }
                    TensorSize {
                        stored_bytes: t.numel() * bits / 8 + t.numel() / 64 * 4,
                        packed: true,
                        ..t.clone()
                    }
                })
                .collect()
        };
        (pack(self.text_encoder), pack(self.transformer))
    }

    /// Chooses the fastest way to run `req` within `budget`: weights in the compute dtype when
    /// they fit, else as stored, else (where `streaming` is possible) streamed; an untiled
    /// decode when it fits, else the largest tile that does. `base` is what the process holds
    /// before loading.
    pub fn plan(
        &self,
        req: &RequestShape,
        budget: u64,
        budget_source: &str,
        base: u64,
        streaming: bool,
    ) -> Result<MemoryPlan, DoesNotFit> {
        let plan = self.try_plan(req, budget, base, streaming);
        plan.map(|p| MemoryPlan {
            budget_source: budget_source.to_string(),
            ..p
        })
        .ok_or_else(|| {
            let needs = self.smallest_budget(req, base, streaming);
            let estimate = match self.try_plan(req, needs, base, streaming) {
                Some(plan) => plan.estimate,
                None => self.estimate(req, Residency::Stored, None, base),
            };
            DoesNotFit {
                needs,
                estimate,
                budget,
                budget_source: budget_source.to_string(),
                advice: self.advice(req, budget, base),
            }
        })
    }

    /// The smallest budget [`ModelSizes::plan`] accepts for `req`, rounded up to 10 MB (so that
    /// [`gb`] never writes a figure under it): the leanest residency with the smallest decode
    /// tiles that fit beside it.
    pub fn smallest_budget(&self, req: &RequestShape, base: u64, streaming: bool) -> u64 {
        let leanest = match streaming {
            true => Residency::Streamed,
            false => Residency::Stored,
        };
        // Untiled in the leanest residency always fits its own peak; halve the gap from there.
        let (mut low, mut high) = (0u64, self.estimate(req, leanest, None, base).peak());
        while high - low > 1_000_000 {
            let mid = low + (high - low) / 2;
            match self.try_plan(req, mid, base, streaming) {
                Some(_) => high = mid,
                None => low = mid,
            }
        }
        round_up(high, 10_000_000)
    }

    /// [`ModelSizes::plan`]'s choice, `None` when nothing fits `budget`.
    fn try_plan(
        &self,
        req: &RequestShape,
        budget: u64,
        base: u64,
        streaming: bool,
    ) -> Option<MemoryPlan> {
        let fits = |e: &MemoryEstimate| e.peak() <= budget;
        let mut chosen = None;
        // Streaming holds the weights as stored, without the load's copy: where holding them in
        // the compute dtype would change little (quantized weights), it comes first.
        let candidates = match (streaming, self.compute_changes_little(req.compute_bytes)) {
            (true, true) => vec![Residency::Streamed],
            (true, false) => vec![Residency::Compute, Residency::Stored, Residency::Streamed],
            (false, _) => vec![Residency::Compute, Residency::Stored],
        };
        for residency in candidates {
            let e = self.estimate(req, residency, None, base);
            let without_decode = MemoryEstimate { decode: 0, ..e };
            if !fits(&without_decode) {
                continue;
            }
            let tiling = if fits(&e) {
                None
            } else {
                let room = budget
                    .saturating_sub(e.base)
                    .saturating_sub(self.vae_weights(req.compute_bytes));
                // The CPU graph keeps the convolutions' matrices beside the weights.
                let matrices = match uses_conv_matrices(req) {
                    true => tiling::conv_matrix_bytes(self.vae_config, req.compute_bytes as usize),
                    false => 0,
                };
                let room = room.saturating_sub(matrices);
                tiling::choose_tiling(
                    self.vae_config,
                    req.height as i32,
                    req.width as i32,
                    req.compute_bytes as usize,
                    room,
                )
            };
            let e = self.estimate(req, residency, tiling.as_ref(), base);
            if fits(&e) {
                chosen = Some(MemoryPlan {
                    cache_limit: self.cache_limit(req, &e, budget),
                    residency,
                    tiling,
                    estimate: e,
                    budget,
                    budget_source: String::new(),
                });
                break;
            }
        }
        chosen
    }

    /// Whether holding the text encoder's and the transformer's weights in the compute dtype
    /// would change little (under 5% of them): they are quantized, or stored in that dtype,
    /// but for a few small layers.
    pub fn compute_changes_little(&self, compute_bytes: u64) -> bool {
        let held = |r: Residency| {
            weight_bytes(self.text_encoder, |_| true, r, compute_bytes)
                .saturating_add(weight_bytes(self.transformer, |_| true, r, compute_bytes))
        };
        let (compute, stored) = (held(Residency::Compute), held(Residency::Stored));
        compute.saturating_sub(stored) <= stored / 20
    }

    /// What would fit instead: a quantized import, or a smaller image.
    fn advice(&self, req: &RequestShape, budget: u64, base: u64) -> String {
        let mut out = Vec::new();
        for (bits, name) in [(8, "int8"), (4, "int4")] {
            let (text, transformer) = self.quantized_variant(bits);
            let sizes = ModelSizes {
                text_encoder: &text,
                transformer: &transformer,
                ..*self
            };
            let e = sizes.estimate(req, Residency::Stored, None, base);
            let already = text
                .iter()
                .zip(self.text_encoder)
                .all(|(a, b)| a.packed == b.packed)
                && transformer
                    .iter()
                    .zip(self.transformer)
                    .all(|(a, b)| a.packed == b.packed);
            if !already && e.peak() <= budget {
                out.push(format!(
                    "An {name} import would need about {} (`zimage create NAME --from DIR --quantize {name}`).",
                    gb(e.peak())
                ));
                break;
            }
        }
        for side in [768u32, 512, 256] {
            if side >= req.width.max(req.height) {
                continue;
            }
            let small = RequestShape {
                width: side,
                height: side,
                ..*req
            };
            if self.try_plan(&small, budget, base, false).is_some() {
                out.push(format!("{side}×{side} would fit."));
                break;
            }
        }
        if out.is_empty() {
            out.push("Nothing smaller of this model fits either.".into());
        }
        out.join(" ")
    }
}

/// A memory size as people write it: `12GB`, `12G`, `12.5 GiB`, `800MB`, or plain bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a memory size (e.g. 12GB, 800MB)"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "`{text}`: unknown unit (use B, KB, MB, GB, TB or KiB, MiB, GiB)"
            ))
        }
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1e6 {
        return Err(format!("`{text}` is too small a memory budget"));
    }
    // No machine has a petabyte of memory; a larger figure is a typo, not a budget.
    if bytes > 1e15 {
        return Err(format!(
            "`{text}` is more memory than any machine has (at most 1000TB)"
        ));
    }
    Ok(bytes as u64)
}

/// The budget and where it came from: `--memory-limit`, else `ZIMAGE_MEMORY_LIMIT`, else the
/// GPU's memory as the device reports it (Metal's recommended working set, a CUDA device's free
/// memory), else 85% of the machine's.
pub fn budget(flag: Option<&str>) -> Result<(u64, String), String> {
    if let Some(f) = flag {
        let bytes = parse_size(f).map_err(|e| format!("--memory-limit: {e}"))?;
        return Ok((bytes, format!(" (--memory-limit {f})")));
    }
    if let Ok(v) = std::env::var("ZIMAGE_MEMORY_LIMIT") {
        let bytes = parse_size(&v).map_err(|e| format!("ZIMAGE_MEMORY_LIMIT: {e}"))?;
        return Ok((bytes, format!(" (ZIMAGE_MEMORY_LIMIT={v})")));
    }
    if let Some(device) = crate::platform::device_memory() {
        let what = crate::platform::DEVICE_MEMORY_NAME;
        return Ok((device, format!(" (the GPU's {what})")));
    }
    let total = crate::platform::physical_memory().unwrap_or(8_000_000_000);
    Ok((
        total / 100 * 85,
        format!(" (85% of this machine's {})", gb(total)),
    ))
}

/// A model's estimated run-time peak at one size, with weights held either way, as `show`
/// reports it.
pub struct RuntimeMemory {
    /// The side of the square image sized.
    pub side: u32,
    pub dtype: crate::mlx::Dtype,
    /// Weights widened to the compute dtype.
    pub compute: MemoryEstimate,
    /// Weights as stored.
    pub stored: MemoryEstimate,
    /// The smallest budget a run of this size fits, in its leanest mode.
    pub needs: u64,
}

impl RuntimeMemory {
    /// `model`'s figures for a `side`² image from `prompts` prompts of `prompt_tokens` tokens,
    /// computing in `dtype`.
    pub fn of(
        model: &ModelSizes,
        side: u32,
        prompt_tokens: u32,
        prompts: u32,
        dtype: crate::mlx::Dtype,
        can_stream: bool,
    ) -> RuntimeMemory {
        let shape = RequestShape {
            width: side,
            height: side,
            prompt_tokens,
            prompts,
            reference_tokens: 0,
            compute_bytes: dtype.size_bytes() as u64,
            encodes: None,
            graph: crate::platform::graph(),
            device: crate::mlx::default_device(),
        };
        let base = crate::platform::held_before_loading();
        RuntimeMemory {
            side,
            dtype,
            compute: model.estimate(&shape, Residency::Compute, None, base),
            stored: model.estimate(&shape, Residency::Stored, None, base),
            needs: model.smallest_budget(&shape, base, can_stream),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_people_write_them() {
        assert_eq!(parse_size("12GB").unwrap(), 12_000_000_000);
        assert_eq!(parse_size("12g").unwrap(), 12_000_000_000);
        assert_eq!(parse_size("1.5 GiB").unwrap(), 1_610_612_736);
        assert_eq!(parse_size("800MB").unwrap(), 800_000_000);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("10").is_err());
    }
}
