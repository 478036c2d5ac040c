//! The Z-Image-Turbo Fun ControlNet Union (`ZImageControlNetModel`): control blocks that read a
//! control image's latents alongside the transformer's own tokens and give hints that are added
//! into the transformer's main layers.
//!
//! Mirrors diffusers 0.42.1 `models/controlnets/controlnet_z_image.py`. As its
//! `from_transformer` does, the ControlNet holds only its own weights (control blocks, control
//! patch embedder, control refiner) and borrows the rest from the [`ZImageTransformer`] at each
//! call: timestep and image embedders, pad tokens, noise refiner, the refined caption and RoPE
//! tables of a [`Prepared`] request.
//!
//! One step with control, for a denoise loop:
//!
//! ```ignore
//! let prepared = transformer.prepare(&latents.shape(), &caption)?; // once per request
//! // each step:
//! let hints = controlnet.hints(&transformer, &prepared, &latents, &control_latents, t, scale)?;
//! let v = transformer.forward_prepared_with(&latents, t, &prepared, Some(&hints))?;
//! ```
//!
//! `control_latents` are the control image through the VAE encoder (the distribution's mode,
//! shifted and scaled like the latents), `[16, h, w]`; [`ControlNet::hints`] zero-pads them to
//! `control_in_dim` channels as diffusers' pipelines do.

use super::controlnet_config::{ControlNetConfig, RefinerMode};
use super::transformer::{
    pad_rows, patchify, round_up, Block, DitConfig, Hints, LayerHints, Prepared, ZImageTransformer,
    SEQ_MULTI_OF,
};
use crate::mlx::{self, ops, Array, Dtype};
use crate::models::blocks::after_block;
use crate::models::weights::{Checkpoint, Linear, Release, Weights};

/// `ZImageControlTransformerBlock`: a transformer block over the control stream `c`, which the
/// first block seeds from the base stream (`c = before_proj(c) + x`), each block giving a hint
/// `after_proj(c)`.
struct ControlBlock {
    block: Block,
    before_proj: Option<Linear>,
    after_proj: Linear,
}

impl ControlBlock {
    fn new(cfg: &DitConfig, w: &Weights, first: bool, fused: bool) -> mlx::Result<ControlBlock> {
        let d = cfg.dim;
        Ok(ControlBlock {
            block: Block::new(cfg, w, true, fused)?,
            before_proj: match first {
                true => Some(Linear::new(&w.pp("before_proj"), d, d, true)?),
                false => None,
            },
            after_proj: Linear::new(&w.pp("after_proj"), d, d, true)?,
        })
    }

    /// One block: returns the new control stream and its hint.
    fn forward(
        &self,
        c: &Array,
        x: &Array,
        rope: &(Array, Array),
        t: &Array,
    ) -> mlx::Result<(Array, Array)> {
        let c = match &self.before_proj {
            Some(before) => (before.forward(c)? + x)?,
            None => c.clone(),
        };
        let c = self.block.forward(&c, rope, Some(t))?;
        let hint = self.after_proj.forward(&c)?;
        Ok((c, hint))
    }
}

/// The control stream through `blocks`, reading base stream `x`: its last state and the hints.
/// With `release` (streamed weights) each block is computed before the next.
fn run_control(
    blocks: &[ControlBlock],
    c: Array,
    x: &Array,
    rope: &(Array, Array),
    t: &Array,
    release: Option<&Release>,
) -> mlx::Result<(Array, Vec<Array>)> {
    let mut c = c;
    let mut hints = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let (next, hint) = block.forward(&c, x, rope, t)?;
        if release.is_some() || crate::platform::evaluates_per_block() {
            mlx::eval(&[&next, &hint])?;
        }
        after_block(release, &next, ("control_layers", i))?;
        c = next;
        hints.push(hint);
    }
    Ok((c, hints))
}

/// One step's hints, computed as the transformer's main layers reach them
/// ([`ControlNet::hint_stream`]): each main control block runs, and is evaluated, when the
/// layer it hints asks.
pub struct HintStream<'a> {
    net: &'a ControlNet,
    rope: &'a (Array, Array),
    /// The timestep conditioning.
    c: Array,
    /// What the control blocks read: the image tokens (through this ControlNet's pass of the
    /// noise refiner) and the caption.
    unified: Array,
    /// The control stream, after the blocks run so far.
    ctrl: Array,
    /// The next main control block.
    next: usize,
    scale: f32,
    seconds: f64,
}

impl HintStream<'_> {
    /// Seconds spent computing this step's control so far.
    pub fn seconds(&self) -> f64 {
        self.seconds
    }
}

impl LayerHints for HintStream<'_> {
    fn after(&mut self, layer: usize) -> mlx::Result<Option<Array>> {
        let places = &self.net.config.control_layers_places;
        while self.next < places.len() && places[self.next] as usize <= layer {
            let start = std::time::Instant::now();
            let block = &self.net.layers[self.next];
            let at = places[self.next] as usize;
            self.next += 1;
            let (ctrl, hint) = block.forward(&self.ctrl, &self.unified, self.rope, &self.c)?;
            let hint = (hint * self.scale)?;
            mlx::eval(&[&ctrl, &hint])?;
            if let Some(release) = &self.net.release {
                release.release();
            }
            self.ctrl = ctrl;
            self.seconds += start.elapsed().as_secs_f64();
            if at == layer {
                return Ok(Some(hint));
            }
        }
        Ok(None)
    }
}

/// What refines the control tokens before the main control blocks.
enum ControlRefiner {
    /// 1.0: plain modulated blocks, no hints.
    Plain(Vec<Block>),
    /// 2.1: control blocks of their own, hinting the noise refiner.
    Blocks(Vec<ControlBlock>),
    /// 2.0: the main control blocks, run once more over the image tokens.
    MainBlocks,
}

/// A loaded ControlNet.
pub struct ControlNet {
    layers: Vec<ControlBlock>,
    x_embedder: Linear,
    refiner: ControlRefiner,
    pub config: ControlNetConfig,
    dtype: Dtype,
    /// Set when the weights are streamed (see [`ZImageTransformer`]'s).
    release: Option<Release>,
}

impl ControlNet {
    /// Binds `ckpt` (diffusers names) for hooking into a transformer of configuration `dit`.
    pub fn new(
        cfg: &ControlNetConfig,
        ckpt: Checkpoint,
        dit: &DitConfig,
    ) -> Result<ControlNet, crate::models::ModelError> {
        cfg.validate().map_err(crate::models::ModelError::Config)?;
        cfg.check_fits(dit)
            .map_err(crate::models::ModelError::Config)?;
        let mut ckpt = ckpt;
        if cfg.add_control_noise_refiner == Some(RefinerMode::ControlLayers) {
            // 2.0 files carry refiner blocks that diffusers' converter drops unread.
            ckpt.allow_unused("control_noise_refiner.");
        }
        let dtype = ckpt.dtype();
        let model = {
            let w = ckpt.root();
            let fused = crate::platform::fused_transformer_kernels(dtype);
            // The blocks are the transformer's, at the ControlNet's own norm eps.
            let block_cfg = DitConfig {
                norm_eps: cfg.norm_eps,
                ..dit.clone()
            };
            let control_blocks = |name: &str, first: &dyn Fn(usize) -> bool, n: usize| {
                (0..n)
                    .map(|i| ControlBlock::new(&block_cfg, &w.pp(name).pp(i), first(i), fused))
                    .collect::<mlx::Result<Vec<_>>>()
            };
            let places = &cfg.control_layers_places;
            let n_refiner = cfg.n_refiner_layers as usize;
            let refiner =
                match cfg.add_control_noise_refiner {
                    None => ControlRefiner::Plain(
                        (0..n_refiner)
                            .map(|i| {
                                Block::new(
                                    &block_cfg,
                                    &w.pp("control_noise_refiner").pp(i),
                                    true,
                                    fused,
                                )
                            })
                            .collect::<mlx::Result<_>>()?,
                    ),
                    Some(RefinerMode::ControlNoiseRefiner) => ControlRefiner::Blocks(
                        control_blocks("control_noise_refiner", &|i| i == 0, n_refiner)?,
                    ),
                    Some(RefinerMode::ControlLayers) => ControlRefiner::MainBlocks,
                };
            ControlNet {
                // diffusers numbers a main control block by its place: only place 0 seeds.
                layers: control_blocks("control_layers", &|i| places[i] == 0, places.len())?,
                x_embedder: Linear::new(
                    &w.pp("control_all_x_embedder").pp("2-1"),
                    4 * cfg.control_in_dim,
                    cfg.dim,
                    true,
                )?,
                refiner,
                config: cfg.clone(),
                dtype,
                release: ckpt.release(),
            }
        };
        ckpt.finish()?;
        Ok(model)
    }

    /// The hints for one step, multiplied by `scale` (the conditioning scale): `latent`
    /// ([C, h, w]) and `t_model` as the step gives them to the transformer, `prepared` made by
    /// [`ZImageTransformer::prepare`] for this request, `control` the control latents
    /// ([c, h, w] with c ≤ `control_in_dim`; missing channels are zeros). All of them at once;
    /// [`ControlNet::hint_stream`] gives them one at a time.
    pub fn hints(
        &self,
        transformer: &ZImageTransformer,
        prepared: &Prepared,
        latent: &Array,
        control: &Array,
        t_model: f32,
        scale: f32,
    ) -> mlx::Result<Hints> {
        let mut stream =
            self.hint_stream(transformer, prepared, latent, control, t_model, scale)?;
        let mut hints = Vec::new();
        for &layer in &self.config.control_layers_places {
            let layer = layer as usize;
            if let Some(hint) = stream.after(layer)? {
                hints.push((layer, hint));
            }
        }
        Ok(Hints::new(hints))
    }

    /// The hints of one step as the transformer's main layers ask for them (see
    /// [`ControlNet::hints`] for the arguments): the control tokens are embedded and refined
    /// now; each main control block then runs when the layer it hints is reached, so that one
    /// hint is held at a time rather than all of them (19 × 64 MB at 1024² in f32).
    pub fn hint_stream<'a>(
        &'a self,
        transformer: &ZImageTransformer,
        prepared: &'a Prepared,
        latent: &Array,
        control: &Array,
        t_model: f32,
        scale: f32,
    ) -> mlx::Result<HintStream<'a>> {
        let start = std::time::Instant::now();
        transformer.check_prepared(latent, prepared)?;
        if transformer.dtype() != self.dtype {
            return Err(mlx::Error::new(
                "controlnet",
                format!(
                    "the controlnet computes in {:?}, the transformer in {:?}",
                    self.dtype,
                    transformer.dtype()
                ),
            ));
        }
        let c = transformer.t_embed(t_model)?;
        let x = transformer.embed_image(latent)?;
        let ctrl = self.embed_control(transformer, latent, control)?;

        // Control tokens through the control refiner, next to the image tokens; a 2.x
        // refiner's hints go into this ControlNet's own pass of the noise refiner.
        let img_rope = prepared.img_rope();
        let release = self.release.as_ref();
        let (ctrl, refiner_hints) = match &self.refiner {
            ControlRefiner::Plain(blocks) => {
                let mut ctrl = ctrl;
                for (i, block) in blocks.iter().enumerate() {
                    ctrl = block.forward(&ctrl, img_rope, Some(&c))?;
                    after_block(release, &ctrl, ("control_noise_refiner", i))?;
                }
                (ctrl, Vec::new())
            }
            ControlRefiner::Blocks(blocks) => run_control(blocks, ctrl, &x, img_rope, &c, release)?,
            ControlRefiner::MainBlocks => {
                run_control(&self.layers, ctrl, &x, img_rope, &c, release)?
            }
        };
        let refiner_hints = self.placed(self.config.refiner_places(), refiner_hints, scale)?;
        let x = transformer.refine_image(x, &c, prepared, &refiner_hints)?;

        // The main control blocks run over [control, caption], reading [image, caption].
        let caption = prepared.caption();
        let unified = ops::concatenate(&[&x, caption], 0)?;
        let ctrl = ops::concatenate(&[&ctrl, caption], 0)?;
        mlx::eval(&[&unified, &ctrl, &c])?;
        Ok(HintStream {
            net: self,
            rope: prepared.rope(),
            c,
            unified,
            ctrl,
            next: 0,
            scale,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Pairs the first hints with `places`, scaled.
    fn placed(
        &self,
        places: &[i32],
        hints: Vec<Array>,
        scale: f32,
    ) -> mlx::Result<Vec<(usize, Array)>> {
        places
            .iter()
            .zip(hints)
            .map(|(&at, h)| Ok((at as usize, (h * scale)?)))
            .collect()
    }

    /// Control tokens `[Np, dim]`: the control latents zero-padded to `control_in_dim`
    /// channels, patchified, embedded, the image's pad rows taking the image's pad token.
    fn embed_control(
        &self,
        transformer: &ZImageTransformer,
        latent: &Array,
        control: &Array,
    ) -> mlx::Result<Array> {
        let want = self.config.control_in_dim;
        let shape = control.shape();
        if shape.len() != 3 || shape[0] > want || shape[1..] != latent.shape()[1..] {
            return Err(mlx::Error::new(
                "controlnet",
                format!(
                    "control latents of shape {shape:?}; expected at most {want} channels over the latents' {:?}",
                    &latent.shape()[1..]
                ),
            ));
        }
        let control = control.astype(self.dtype)?;
        let control = match shape[0] < want {
            true => {
                let zeros = Array::zeros(&[want - shape[0], shape[1], shape[2]], self.dtype)?;
                ops::concatenate(&[&control, &zeros], 0)?
            }
            false => control,
        };
        let patches = patchify(&control)?;
        let n = patches.dim(0);
        let x = self.x_embedder.forward(&patches)?;
        pad_rows(&x, transformer.x_pad_token(), round_up(n, SEQ_MULTI_OF) - n)
    }
}
