//! A model the engine holds loaded, as every family's runner answers for it, and the LoRAs
//! bound to it.

use super::batch::{Outcome, Reporter};
use super::error::Error;
use super::job::Job;
use super::progress::Cancel;
use super::source::Source;
use crate::generation_defaults::GenerationDefaults;
use crate::mlx::Dtype;
use std::time::SystemTime;

/// A loaded model of some family: its pipeline, its defaults and what is bound to it.
pub trait LoadedModel: Send {
    /// Where its files and weights come from.
    fn source(&self) -> &Source;
    /// Makes `job`'s images (the job checked and its options taken by the family), reporting
    /// to `reporter` and stopping on `cancel`.
    fn run(&mut self, job: &Job, report: &mut Reporter, cancel: &Cancel) -> Result<Outcome, Error>;
}

/// What a family's runner keeps of a loaded model: its pipeline, the compute dtype, the
/// settings the model records for requests that name none, and the LoRAs bound to it.
pub struct Held<P> {
    pub pipeline: P,
    pub dtype: Dtype,
    pub defaults: GenerationDefaults,
    pub loras: BoundLoras,
}

impl<P> Held<P> {
    /// The model in `source`, its recorded defaults read and its pipeline made by `make`.
    pub fn new(
        source: Source,
        dtype: Dtype,
        make: impl FnOnce(Source, Dtype) -> Result<P, crate::pipeline::Error>,
    ) -> Result<Held<P>, Error> {
        let defaults = GenerationDefaults::of(&source)?;
        Ok(Held {
            pipeline: make(source, dtype)?,
            dtype,
            defaults,
            loras: BoundLoras::default(),
        })
    }
}

/// A request LoRA as bound: its file's size and time of change tell an edited file from the
/// one bound before.
#[derive(Debug, Clone, PartialEq)]
struct LoraStamp {
    spec: crate::lora::LoraSpec,
    len: u64,
    modified: Option<SystemTime>,
}

impl LoraStamp {
    fn of(spec: &crate::lora::LoraSpec) -> LoraStamp {
        let meta = std::fs::metadata(&spec.path).ok();
        LoraStamp {
            spec: spec.clone(),
            len: meta.as_ref().map_or(0, |m| m.len()),
            modified: meta.and_then(|m| m.modified().ok()),
        }
    }
}

/// The LoRAs a pipeline's adapters were bound for (`None`: none bound yet, not even the
/// model's own), with whether unknown keys were skipped.
#[derive(Default)]
pub struct BoundLoras(Option<(Vec<LoraStamp>, bool)>);

impl BoundLoras {
    /// Binds the model's own LoRAs and `specs` to `pipeline` with its family's `load` and `set`,
    /// unless those are bound already.
    pub fn bind<P>(
        &mut self,
        pipeline: &mut P,
        (specs, lenient): (&[crate::lora::LoraSpec], bool),
        load: impl FnOnce(
            &P,
            &[crate::lora::LoraSpec],
            bool,
        ) -> Result<crate::lora::Adapters, crate::pipeline::Error>,
        set: impl FnOnce(&mut P, crate::lora::Adapters),
    ) -> Result<(), Error> {
        let wanted: (Vec<LoraStamp>, bool) = (specs.iter().map(LoraStamp::of).collect(), lenient);
        if self.0.as_ref() == Some(&wanted) {
            return Ok(());
        }
        set(pipeline, load(pipeline, specs, lenient)?);
        self.0 = Some(wanted);
        Ok(())
    }
}
