//! The request options only some families take, named as the command line names them.

/// A request option some families do not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Steering by a control image through a ControlNet.
    ControlNet,
    /// Guidance switched off once the model time passes a threshold (`--cfg-truncation`).
    CfgTruncation,
    /// Each guided prediction capped at the norm of the prompt's own (`--cfg-normalization`).
    CfgNormalization,
    /// A second prediction from the negative prompt each step (`--true-cfg`).
    TrueCfg,
    /// A prompt to steer away from.
    NegativePrompt,
    /// Reference images the model sees while it draws.
    References,
    /// A picture the denoise starts from (image-to-image).
    ImageInput,
    /// A mask saying which part of that picture to redraw (inpainting).
    Mask,
    /// A second, larger pass over the first picture (an image-to-image of it).
    Hires,
}

impl Feature {
    /// The command-line option that asks for the feature, for messages.
    pub fn flag(self) -> &'static str {
        match self {
            Feature::ControlNet => "--controlnet/--control",
            Feature::CfgTruncation => "--cfg-truncation",
            Feature::CfgNormalization => "--cfg-normalization",
            Feature::TrueCfg => "--true-cfg",
            Feature::NegativePrompt => "--negative-prompt",
            Feature::References => "--ref",
            Feature::ImageInput => "--image",
            Feature::Mask => "--mask",
            Feature::Hires => "--hires-scale",
        }
    }
}
