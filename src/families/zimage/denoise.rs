//! The one denoising loop every task runs: flow-match Euler steps from a schedule's
//! `first` step to its end, with classifier-free guidance when a negative caption is given,
//! a ControlNet's hints added into every forward pass (each caption its own), and inpaint's
//! blend after each step.

use super::control::Control;
use super::transformer::{Prepared, ZImageTransformer};
use crate::mlx::Array;
use crate::pipeline::condition::Inpaint;
use crate::pipeline::{Error, Progress};
use crate::preview::{RgbMap, StepPreviews};
use crate::scheduler::Schedule;
use std::ops::ControlFlow;

/// The captions the transformer is conditioned on: the prompt's, and with guidance the
/// negative prompt's and the scale, with the base model's two refinements of it.
pub struct Guidance<'a> {
    pub positive: &'a Prepared,
    pub negative: Option<(&'a Prepared, f32)>,
    /// Caps the guided prediction's norm at the conditional prediction's.
    pub normalization: bool,
    /// Guidance stops once the model time `(1000 − t)/1000` passes this (1: never).
    pub truncation: f64,
}

impl Guidance<'_> {
    /// The negative caption and scale in force at model time `t`, or `None` when the step runs
    /// unguided. diffusers compares the f32 time, widened, with the threshold as given, and
    /// leaves thresholds above 1 alone.
    fn at(&self, t: f32) -> Option<(&Prepared, f32)> {
        let truncated = self.truncation <= 1.0 && t as f64 > self.truncation;
        self.negative
            .filter(|&(_, scale)| scale > 0.0 && !truncated)
    }
}

/// `pos + scale·(pos − neg)`, and with `normalize` scaled back to `pos`'s norm when it is
/// longer: both norms over the whole latent, in f32, as diffusers takes them.
fn guided(pos: &Array, neg: &Array, scale: f32, normalize: bool) -> Result<Array, Error> {
    let pred = (pos + ((pos - neg)? * scale)?)?;
    if !normalize {
        return Ok(pred);
    }
    let norm = |x: &Array| -> Result<f32, Error> {
        let x = x.astype(crate::mlx::Dtype::F32)?;
        Ok(x.square()?.sum(&[], false)?.sqrt()?.item()?)
    };
    let (cap, norm) = (norm(pos)?, norm(&pred)?);
    Ok(match norm > cap {
        true => (&pred * (cap / norm))?,
        false => pred,
    })
}

/// Runs steps `first..` of `schedule` on `latents`. `progress` hears of each step as
/// `index` of the steps run, with the latents drawn by `preview` when given (within a small
/// share of the time, see [`StepPreviews`]); answering `Break` stops with [`Error::Stopped`].
#[allow(clippy::too_many_arguments)]
pub fn denoise(
    transformer: &ZImageTransformer,
    mut latents: Array,
    schedule: &Schedule,
    first: usize,
    guidance: &Guidance,
    mut control: Option<&mut Control>,
    inpaint: Option<&Inpaint>,
    preview: Option<&RgbMap>,
    progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
) -> Result<Array, Error> {
    let total = schedule.steps() - first;
    let mut previews = preview.map(StepPreviews::new);
    let _reuse = crate::platform::ReuseFreedMemory::start();
    for i in first..schedule.steps() {
        let t = schedule.t_model(i);
        let pos = model_output(transformer, &latents, t, guidance.positive, &mut control)?;
        let v = match guidance.at(t) {
            Some((neg, scale)) => {
                let neg = model_output(transformer, &latents, t, neg, &mut control)?;
                guided(&pos, &neg, scale, guidance.normalization)?
            }
            None => pos,
        };
        // The pipeline negates the model output; the scheduler steps by dt = σ[i+1] − σ[i].
        latents = (&latents + (v.neg()? * schedule.dt(i))?)?;
        if let Some(inpaint) = inpaint {
            let next = (i + 1 < schedule.steps()).then(|| schedule.sigmas[i + 1]);
            latents = inpaint.blend(&latents, next)?;
        }
        latents.eval()?;
        let step = Progress::Step {
            index: i + 1 - first,
            total,
            preview: match previews.as_mut() {
                Some(p) => p.step(i + 1 == schedule.steps(), || Ok(latents.clone()))?,
                None => None,
            },
        };
        if progress(step).is_break() {
            return Err(Error::Stopped {
                step: i + 1 - first,
                total,
            });
        }
    }
    Ok(latents)
}

/// The transformer's output for one caption, steered by the control's hints for that caption.
fn model_output(
    transformer: &ZImageTransformer,
    latents: &Array,
    t: f32,
    caption: &Prepared,
    control: &mut Option<&mut Control>,
) -> Result<Array, Error> {
    Ok(match control {
        Some(c) => c.steered_output(transformer, caption, latents, t)?,
        None => transformer.forward_prepared(latents, t, caption)?,
    })
}
