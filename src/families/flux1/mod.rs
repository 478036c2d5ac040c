//! Black Forest Labs' FLUX.1 (\[dev\], \[schnell\], Krea \[dev\], Kontext \[dev\]): CLIP's pooled vector
//! and T5's rows as the prompt (the shared `models::clip_text` and `models::t5`), FLUX.1's
//! double- then single-stream transformer ([`transformer`], its 3-axis [`rope`]) and the 16-channel
//! AutoencoderKL.
//!
//! - [`transformer`]: `FluxTransformer2DModel` as diffusers computes it, from the config and the
//!   checkpoint in diffusers' names; \[dev\] and Kontext embed the guidance scale, \[schnell\] does
//!   not;
//! - [`rope`]: the position ids (text all zero, the image `(0, i, j)`, a Kontext reference
//!   `(1, i, j)`) and their rotary tables.
//!
//! The pipeline, the runner and the registry's entry come once a prompt runs end to end; until
//! then the family is not in `FAMILIES`. Mirrors diffusers 0.42.1 (flux1-spec).

pub mod layout;
pub mod rope;
pub mod transformer;

pub use transformer::{Flux1Config, Flux1Transformer};
