//! What a request says of a ControlNet: the control image at the request's size and how
//! strongly it steers, whichever family's ControlNet reads it.

/// The conditioning scale when a request names none (diffusers').
pub const DEFAULT_SCALE: f32 = 0.75;
/// The largest conditioning scale accepted.
pub const MAX_SCALE: f32 = 2.0;

/// A request's control image, already at the request's size, and how strongly it steers.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ControlInput {
    /// RGB, `height × width × 3`.
    #[serde(skip)]
    pub rgb: Vec<u8>,
    /// What the hints are multiplied by (`controlnet_conditioning_scale`), within [0, 2].
    pub scale: f32,
}

/// A control request as it arrives (from flags or a server's fields), before the model is
/// loaded and the output's size settled: which ControlNet, the decoded control image, the scale.
#[derive(Debug, Clone)]
pub struct ControlSpec {
    /// The ControlNet: a stored name, or a path where the caller allows paths.
    pub controlnet: String,
    /// The control image, decoded, at its own size.
    pub image: image::DynamicImage,
    pub scale: f32,
}

impl ControlSpec {
    /// The control input for a `width`×`height` request (the image resized as `--image` is).
    pub fn input(&self, width: u32, height: u32) -> ControlInput {
        ControlInput {
            rgb: crate::image_in::picture(&self.image, width, height).into_raw(),
            scale: self.scale,
        }
    }
}

/// What is wrong with a conditioning scale, if anything (named as the command line's flag).
pub fn scale_error(scale: f32) -> Option<String> {
    (!crate::number::within(scale, 0.0..=f64::from(MAX_SCALE)))
        .then(|| format!("--control-scale is {scale}; it must be a number within [0, {MAX_SCALE}]"))
}

impl ControlInput {
    /// What is wrong with this input for a `width`×`height` request, if anything.
    pub fn check(&self, width: u32, height: u32) -> Result<(), String> {
        if let Some(e) = scale_error(self.scale) {
            return Err(e);
        }
        let bytes = width as usize * height as usize * 3;
        if self.rgb.len() != bytes {
            return Err(format!(
                "the control image has {} bytes; {width}×{height} RGB needs {bytes}",
                self.rgb.len()
            ));
        }
        Ok(())
    }
}
