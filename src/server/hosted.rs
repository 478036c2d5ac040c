//! Images answered by URL (OpenAI's `response_format: "url"`): kept in memory for a bounded
//! time and a bounded total, served from the server itself, then forgotten.

use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an image stays at its URL (OpenAI's last an hour).
pub const KEPT_FOR: Duration = Duration::from_secs(60 * 60);
/// The most bytes of images kept at once; the oldest go first past it.
pub const MAX_BYTES: usize = 512 << 20;

/// The images served by URL, oldest first.
#[derive(Default)]
pub struct Hosted {
    images: Mutex<VecDeque<Entry>>,
}

struct Entry {
    id: String,
    png: Vec<u8>,
    until: Instant,
}

impl Hosted {
    /// Keeps `png` and returns the id it is served under (`/v1/images/files/{id}.png`).
    pub fn keep(&self, png: Vec<u8>) -> String {
        let id = format!("{:x}", Sha256::digest(&png))[..32].to_string();
        let mut images = self.images.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        images.retain(|e| e.until > now && e.id != id);
        images.push_back(Entry {
            id: id.clone(),
            png,
            until: now + KEPT_FOR,
        });
        let mut total: usize = images.iter().map(|e| e.png.len()).sum();
        while total > MAX_BYTES && images.len() > 1 {
            if let Some(old) = images.pop_front() {
                total -= old.png.len();
            }
        }
        id
    }

    /// The image kept under `id`, while it is kept.
    pub fn get(&self, id: &str) -> Option<Vec<u8>> {
        let images = self.images.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        (images.iter())
            .find(|e| e.id == id && e.until > now)
            .map(|e| e.png.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_served_under_its_id_and_the_oldest_go_past_the_total() {
        let hosted = Hosted::default();
        let a = hosted.keep(vec![1; MAX_BYTES / 2 + 1]);
        assert_eq!(hosted.get(&a).map(|p| p.len()), Some(MAX_BYTES / 2 + 1));
        assert_eq!(hosted.get("0123"), None);
        let b = hosted.keep(vec![2; MAX_BYTES / 2 + 1]);
        assert_eq!(hosted.get(&a), None, "the oldest went past the total");
        assert!(hosted.get(&b).is_some());
    }
}
