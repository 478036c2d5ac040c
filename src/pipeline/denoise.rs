//! The one denoising loop every task runs: flow-match Euler steps from a schedule's
//! `first` step to its end, with classifier-free guidance when a negative caption is given,
//! a ControlNet's hints added into every forward pass (each caption its own), and inpaint's
//! blend after each step.

use super::condition::Inpaint;
use super::control::Control;
use super::{Error, Progress};
use crate::mlx::Array;
use crate::models::transformer::Prepared;
use crate::models::ZImageTransformer;
use crate::scheduler::Schedule;
use std::ops::ControlFlow;

/// The captions the transformer is conditioned on: the prompt's, and with guidance the
/// negative prompt's and the scale.
pub struct Guidance<'a> {
    pub positive: &'a Prepared,
    pub negative: Option<(&'a Prepared, f32)>,
}

/// Runs steps `first..` of `schedule` on `latents`. `progress` hears of each step as
/// `index` of the steps run; answering `Break` stops with [`Error::Stopped`].
#[allow(clippy::too_many_arguments)]
pub fn denoise(
    transformer: &ZImageTransformer,
    mut latents: Array,
    schedule: &Schedule,
    first: usize,
    guidance: &Guidance,
    mut control: Option<&mut Control>,
    inpaint: Option<&Inpaint>,
    progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
) -> Result<Array, Error> {
    let total = schedule.steps() - first;
    let _reuse = crate::platform::ReuseFreedMemory::start();
    for i in first..schedule.steps() {
        let t = schedule.t_model(i);
        let pos = model_output(transformer, &latents, t, guidance.positive, &mut control)?;
        let v = match guidance.negative {
            Some((neg, scale)) => {
                let neg = model_output(transformer, &latents, t, neg, &mut control)?;
                (&pos + ((&pos - &neg)? * scale)?)?
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
