//! What a family's pipeline holds besides its own configs and tokenizer, written once: the
//! model's source, the compute dtype, the LoRA pairs bound, how weights are held between uses
//! and how the decode is tiled; and the components loaded from it per phase.

use super::{load_adapters, Error, ModelSource};
use crate::lora::{Adapters, LoraSpec, OriginalNames};
use crate::memory_plan::TensorSize;
use crate::mlx::{Array, Dtype};
use crate::models::vae_tiling::Tiling;
use crate::models::{Checkpoint, ModelError, Residency};

/// A pipeline's source and the settings its components load under.
pub struct Core<S: ModelSource> {
    pub source: S,
    pub dtype: Dtype,
    /// LoRA pairs added, unfused, to the linear layers they target.
    pub adapters: Adapters,
    /// How the text encoder's and the transformer's weights are held.
    pub residency: Residency,
    /// Decode in tiles (`None`: whole).
    pub tiling: Option<Tiling>,
}

impl<S: ModelSource> Core<S> {
    /// Computing in `dtype`, no LoRA, weights held in it, decoded whole.
    pub fn new(source: S, dtype: Dtype) -> Core<S> {
        Core {
            source,
            dtype,
            adapters: Adapters::default(),
            residency: Residency::Compute,
            tiling: None,
        }
    }

    /// The model's own LoRAs (a derived model's), then the files `specs` names, bound to its
    /// layers in the compute dtype; `originals` are the names the family's checkpoints give
    /// the transformer's layers (see [`load_adapters`]).
    pub fn load_adapters(
        &self,
        originals: Option<OriginalNames>,
        specs: &[LoraSpec],
        lenient: bool,
    ) -> Result<Adapters, Error> {
        load_adapters(&self.source, originals, specs, lenient, self.dtype)
    }

    /// A component's checkpoint, held as set, with the LoRA pairs that target it.
    pub fn checkpoint(&self, component: &str) -> Result<Checkpoint, Error> {
        super::held_checkpoint(
            &self.source,
            component,
            self.dtype,
            self.residency,
            &self.adapters,
        )
    }

    /// A component's model, made from its checkpoint.
    pub fn load<M>(
        &self,
        component: &str,
        make: impl FnOnce(Checkpoint) -> Result<M, ModelError>,
    ) -> Result<M, Error> {
        Ok(make(self.checkpoint(component)?)?)
    }

    /// Whether the weights can stream ([`Residency::Streamed`]): mapped from a store, on the
    /// CPU.
    pub fn can_stream(&self) -> bool {
        self.source.maps_weights() && crate::platform::can_stream_weights()
    }

    /// The sizes of the model's tensors, per component.
    pub fn tensor_sizes(&self) -> Result<[Vec<TensorSize>; 3], Error> {
        super::component_sizes(&self.source)
    }

    /// The FLUX.2 VAE's BatchNorm statistics over the `channels` packed channels, as
    /// `(mean, sqrt(var + eps))` in the compute dtype (the square root taken there, as the
    /// reference does with its buffers).
    pub fn batch_norm_statistics(&self, channels: i32, eps: f32) -> Result<(Array, Array), Error> {
        let vae = self.source.component("vae").map_err(|e| Error::Source {
            model: self.source.name(),
            cause: e,
        })?;
        let get = |name: &str| -> Result<Array, Error> {
            let bad = |reason: String| Error::BadConfig {
                model: self.source.name(),
                path: "vae".into(),
                reason,
            };
            let t = (vae.tensors.get(name))
                .ok_or_else(|| bad(format!("has no `{name}`: not a FLUX.2 VAE")))?;
            if t.shape() != [channels] {
                return Err(bad(format!(
                    "`{name}` has shape {:?}; expected [{channels}]",
                    t.shape()
                )));
            }
            Ok(t.astype(self.dtype)?)
        };
        let std = (get("bn.running_var")? + eps)?.sqrt()?;
        Ok((get("bn.running_mean")?, std))
    }
}
