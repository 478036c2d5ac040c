//! Progress and cancel as data: what a running job reports (read by the command line's bar and
//! preview file, Ollama's stream, the servers' progress answers and the page) and the switch
//! any front end flips to stop it at the next step boundary.

use crate::preview::Preview;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where a job is. Reported when a phase starts and after every denoising step.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// The latest step's latents of this image as a picture, when the job asked for previews
    /// ([`super::job::Job::preview`]); it stays through the phases after that step.
    pub preview: Option<Arc<Preview>>,
    /// The image being made, 1-based, of `images`.
    pub image: usize,
    /// Images the job makes.
    pub images: usize,
    /// `load`, `text`, `encode`, `denoise`, `decode`, or `hires` (the second pass's upscale).
    pub phase: &'static str,
    /// Denoising steps done of `steps` in this image's current pass (0 before the first).
    pub step: usize,
    /// Steps in this image's current pass.
    pub steps: usize,
    /// Since the job started.
    pub elapsed: Duration,
}

impl Progress {
    /// The share of the whole job done, in [0, 1]: images done plus this one's steps.
    pub fn fraction(&self) -> f64 {
        let images = self.images.max(1) as f64;
        let within = match self.steps {
            0 => 0.0,
            n => self.step as f64 / n as f64,
        };
        ((self.image.saturating_sub(1)) as f64 + within.min(1.0)) / images
    }
}

/// Stops a job at its next step boundary, or skips the image being made. Clones share the
/// switches.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    stop: Arc<AtomicBool>,
    skip: Arc<AtomicBool>,
    keep: Arc<AtomicBool>,
}

impl Cancel {
    /// Switches that are all off: the job runs to its end.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Stops the job at its next step boundary; it ends as stopped, keeping no image.
    pub fn cancel(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Whether the job was told to stop.
    pub fn is_cancelled(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Stops the job at its next step boundary, and keeps the images it finished: the job
    /// answers with those (someone stopped a batch, and nobody went away).
    pub fn stop_keeping_finished(&self) {
        self.keep.store(true, Ordering::SeqCst);
        self.cancel();
    }

    /// Whether a stop keeps the images finished before it.
    pub fn keeps_finished(&self) -> bool {
        self.keep.load(Ordering::SeqCst)
    }

    /// Drops the image being made at its next step boundary; the job goes on with the next.
    pub fn skip_image(&self) {
        self.skip.store(true, Ordering::SeqCst);
    }

    /// Whether the image being made should stop here, for either reason.
    pub fn stops_image(&self) -> bool {
        self.is_cancelled() || self.skip.load(Ordering::SeqCst)
    }

    /// Whether a skip stopped the image (and not a cancel of the whole job); clears it.
    pub fn take_skip(&self) -> bool {
        !self.is_cancelled() && self.skip.swap(false, Ordering::SeqCst)
    }
}
