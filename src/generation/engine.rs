//! The engine: the model a front end keeps loaded between jobs (the command line's `--runs`
//! and batches, the server's keep-alive), with the LoRAs and the ControlNet bound to it.

use super::source::{ModelChoice, ModelKey, Source};
use super::Error;
use crate::controlnet_source::{self, ControlNetSource};
use crate::family::Family;
use crate::generation_defaults::GenerationDefaults;
use crate::mlx::Dtype;
use crate::pipeline::klein::KleinPipeline;
use crate::pipeline::{ControlNetLoader, Pipeline};
use crate::store::{Store, StoredModel};
use std::path::PathBuf;
use std::time::SystemTime;

/// The ControlNet a job names.
#[derive(Debug, Clone)]
pub enum ControlNetChoice {
    /// A diffusers directory or a published single file (the command line allows paths).
    Path(PathBuf),
    /// A ControlNet in `store`, by name.
    Stored {
        /// The store holding it.
        store: Store,
        /// Its name there.
        name: String,
    },
}

impl ControlNetChoice {
    fn key(&self) -> String {
        match self {
            ControlNetChoice::Path(p) => format!("path:{}", p.display()),
            ControlNetChoice::Stored { store, name } => {
                format!("stored:{}:{name}", store.root.display())
            }
        }
    }

    fn open(&self) -> Result<Box<dyn ControlNetLoader>, Error> {
        match self {
            ControlNetChoice::Path(path) => ControlNetSource::open(path)
                .map(|s| Box::new(s) as Box<dyn ControlNetLoader>)
                .map_err(|e| Error::ControlNet(format!("--controlnet: {e}"))),
            ControlNetChoice::Stored { store, name } => {
                match controlnet_source::open_stored(store.clone(), name) {
                    Ok(s) => Ok(Box::new(s)),
                    Err(controlnet_source::Error::Store(e)) => match super::source::open_error(e) {
                        Error::NotFound(m) => Err(Error::NotFound(format!("--controlnet: {m}"))),
                        other => Err(Error::ControlNet(format!("--controlnet: {other}"))),
                    },
                    Err(e) => Err(Error::ControlNet(format!("--controlnet: {e}"))),
                }
            }
        }
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
struct BoundLoras(Option<(Vec<LoraStamp>, bool)>);

impl BoundLoras {
    /// Binds the model's own LoRAs and `specs` to `pipeline` with its family's `load` and `set`,
    /// unless those are bound already.
    fn bind<P>(
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

/// The loaded model.
pub(super) struct Loaded {
    pub key: ModelKey,
    pub pipeline: Pipeline<Source>,
    /// What the model says a request should use when it names nothing.
    pub defaults: GenerationDefaults,
    loras: BoundLoras,
    /// The ControlNet set on the pipeline; it stays with the model until a job names another.
    controlnet: Option<String>,
}

/// A loaded FLUX.2 \[klein\] model (its family's pipeline, with its LoRAs; no ControlNet).
pub(super) struct LoadedKlein {
    pub key: ModelKey,
    pub pipeline: KleinPipeline<Source>,
    pub defaults: GenerationDefaults,
    loras: BoundLoras,
}

/// Keeps one model loaded between jobs.
pub struct Engine {
    dtype: Dtype,
    /// Keep the transformer and VAE between images (more memory, no reload).
    keep_models: bool,
    loaded: Option<Loaded>,
    /// The loaded model when it is a FLUX.2 \[klein\] one (then `loaded` is `None`).
    klein: Option<LoadedKlein>,
}

impl Engine {
    /// An engine computing in `dtype` (`None`: bf16 on a GPU, f32 on the CPU).
    pub fn new(dtype: Option<Dtype>, keep_models: bool) -> Engine {
        Engine {
            dtype: dtype.unwrap_or_else(crate::platform::default_compute_dtype),
            keep_models,
            loaded: None,
            klein: None,
        }
    }

    /// The dtype the engine computes in.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The stored model loaded, if any.
    pub fn stored_model(&self) -> Option<&StoredModel> {
        match &self.klein {
            Some(k) => k.pipeline.source().stored(),
            None => self
                .loaded
                .as_ref()
                .and_then(|l| l.pipeline.source().stored()),
        }
    }

    /// Whether the model `key` names is the one loaded.
    pub fn holds(&self, key: &ModelKey) -> bool {
        self.loaded.as_ref().is_some_and(|l| &l.key == key)
            || self.klein.as_ref().is_some_and(|k| &k.key == key)
    }

    /// Lets go of the loaded model and returns its memory to the system.
    pub fn unload(&mut self) {
        let klein = self.klein.take().is_some();
        if self.loaded.take().is_some() || klein {
            crate::mlx::memory::clear_cache();
            crate::platform::trim_freed_memory();
        }
    }

    /// Makes `model` the loaded one, loading it if another (or none) is loaded; reports
    /// whether it loaded anything.
    pub fn load(&mut self, model: &ModelChoice) -> Result<bool, Error> {
        if model.key().is_some_and(|k| self.holds(&k)) {
            return Ok(false);
        }
        self.unload();
        let source = Source::open(model)?;
        let key = source.key();
        if crate::pipeline::family_of(&source)? == Family::Flux2Klein {
            let defaults = GenerationDefaults::of(&source)?;
            let pipeline = KleinPipeline::new(source, self.dtype)?;
            self.klein = Some(LoadedKlein {
                key,
                pipeline,
                defaults,
                loras: BoundLoras::default(),
            });
            return Ok(true);
        }
        let mut pipeline = Pipeline::new(source, self.dtype, self.keep_models)?;
        let defaults = GenerationDefaults::of(pipeline.source())?;
        if let Some(shift) = defaults.shift {
            pipeline.configs.scheduler.shift = shift;
        }
        self.loaded = Some(Loaded {
            key,
            pipeline,
            defaults,
            loras: BoundLoras::default(),
            controlnet: None,
        });
        Ok(true)
    }

    /// The loaded model when it is a FLUX.2 \[klein\] one.
    pub(super) fn klein(&mut self) -> Option<&mut LoadedKlein> {
        self.klein.as_mut()
    }

    /// The loaded model; [`Engine::load`] first.
    pub(super) fn loaded(&mut self) -> &mut Loaded {
        self.loaded
            .as_mut()
            .expect("a model is loaded before it is used")
    }
}

impl Loaded {
    /// Binds the model's own LoRAs and `specs` to the pipeline, unless those are bound already.
    pub fn bind_loras(
        &mut self,
        specs: &[crate::lora::LoraSpec],
        lenient: bool,
    ) -> Result<(), Error> {
        let (load, set) = (Pipeline::load_adapters, Pipeline::set_adapters);
        (self.loras).bind(&mut self.pipeline, (specs, lenient), load, set)
    }

    /// Sets the ControlNet `choice` names on the pipeline, unless it is set already.
    pub fn set_controlnet(&mut self, choice: &ControlNetChoice) -> Result<(), Error> {
        let key = choice.key();
        if self.controlnet.as_deref() == Some(key.as_str()) {
            return Ok(());
        }
        let net = choice.open()?;
        self.controlnet = None;
        self.pipeline.set_controlnet(Some(net))?;
        self.controlnet = Some(key);
        Ok(())
    }
}

impl LoadedKlein {
    /// Binds klein's own LoRAs (a derived model's) and `specs`, unless those are bound already.
    pub fn bind_loras(
        &mut self,
        specs: &[crate::lora::LoraSpec],
        lenient: bool,
    ) -> Result<(), Error> {
        let pipeline = &mut self.pipeline;
        let (load, set) = (KleinPipeline::load_adapters, KleinPipeline::set_adapters);
        (self.loras).bind(pipeline, (specs, lenient), load, set)
    }
}
