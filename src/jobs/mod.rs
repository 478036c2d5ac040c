//! What a run of a model is made of, below the runner that picks the family: the [`job::Job`]
//! a front end parses a request into and its checks, the model it names and how that opens
//! ([`source`]), progress and cancel, the runner's errors, the images a batch makes and their
//! metadata, and the [`loaded::LoadedModel`] every family's runner answers as. The families
//! build on these; `crate::generation` holds the engine and the runner above them.

pub mod batch;
pub mod error;
pub mod feature;
pub mod job;
pub mod loaded;
pub mod masked_area;
pub mod metadata;
pub mod noise;
pub mod passes;
pub mod progress;
pub mod source;
