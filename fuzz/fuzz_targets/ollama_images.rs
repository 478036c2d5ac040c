//! The body of Ollama's `POST /api/generate` as the server parses it: JSON into the request,
//! its `images[0]` and `control_image` out of base64, their headers checked against the input
//! budget, and those small enough decoded. An error quotes at most a few hundred bytes of what
//! was sent.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::input_budget::{self, Input};
use zimage::server::{errors::MAX_MESSAGE_BYTES, ollama};

/// An error line's length: the message cut, plus the words that say how long it was.
const MAX_ERROR: usize = MAX_MESSAGE_BYTES + 64;

fuzz_target!(|data: &[u8]| {
    let body = match ollama::parse_generate_body(data) {
        Ok(body) => body,
        Err(e) => {
            assert!(e.message.len() <= MAX_ERROR, "{} bytes", e.message.len());
            return;
        }
    };
    let (image, control) = match ollama::request_pictures(&body) {
        Ok(p) => p,
        Err(e) => {
            assert!(e.message.len() <= MAX_ERROR, "{} bytes", e.message.len());
            return;
        }
    };
    let pictures: Vec<Input> = [
        ("field `images`", "images[0]", image.as_deref()),
        ("field", "control_image", control.as_deref()),
    ]
    .into_iter()
    .filter_map(|(what, name, bytes)| bytes.map(|bytes| Input { what, name, bytes }))
    .collect();
    let Ok(headers) = input_budget::probe_all(&pictures) else {
        return;
    };
    if headers.iter().any(|h| h.width > 64 || h.height > 64) {
        return;
    }
    if let Some(bytes) = &image {
        let _ = ollama::decode_input(bytes, None);
    }
});
