//! The progress bar of a pull, a push or a download: bytes, with the count of blobs or files.

use indicatif::{ProgressBar, ProgressStyle};
use std::sync::atomic::{AtomicUsize, Ordering};
use zimage::hub::{HubFile, PullProgress};
use zimage::registry;

/// A progress bar in bytes, with the count of blobs (or files).
pub struct Bar {
    pub bar: ProgressBar,
    blobs: AtomicUsize,
    done: AtomicUsize,
    verb: &'static str,
    unit: &'static str,
}

impl Bar {
    /// Counting files, as a Hugging Face pull moves them.
    pub fn files(verb: &'static str) -> Bar {
        Bar {
            unit: "files",
            ..Bar::new(verb)
        }
    }

    pub fn new(verb: &'static str) -> Bar {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        Bar {
            bar,
            blobs: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            verb,
            unit: "blobs",
        }
    }
    fn message(&self) {
        self.bar.set_message(format!(
            "{} {}/{} {}",
            self.verb,
            self.done.load(Ordering::Relaxed),
            self.blobs.load(Ordering::Relaxed),
            self.unit
        ));
    }
}

impl registry::Progress for Bar {
    fn start(&self, bytes: u64, blobs: usize) {
        self.bar.set_length(bytes);
        self.blobs.store(blobs, Ordering::Relaxed);
        self.message();
    }
    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }
    fn blob_done(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
        self.message();
    }
}

impl PullProgress for Bar {
    fn status(&self, status: &str) {
        self.bar.set_message(status.to_string());
    }
    fn downloads(&self, files: &[&HubFile]) {
        let bytes: u64 = files.iter().map(|f| f.size).sum();
        self.bar.inc_length(bytes);
        self.blobs.fetch_add(files.len(), Ordering::Relaxed);
        self.message();
    }
    fn advance(&self, _: &HubFile, bytes: u64) {
        self.bar.inc(bytes);
    }
    fn file_done(&self, _: &HubFile) {
        self.done.fetch_add(1, Ordering::Relaxed);
        self.message();
    }
    fn importing(&self, done: u64, total: u64) {
        if self.bar.length() != Some(total) {
            self.bar.set_message("importing");
            self.bar.set_length(total);
            self.bar.reset_eta();
        }
        self.bar.set_position(done);
    }
}
