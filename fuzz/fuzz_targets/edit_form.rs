//! The body of `POST /v1/images/edits`: the multipart form read into its fields as the server
//! reads it (text fields parsed, pictures kept as bytes), then the pictures' headers checked
//! against the input budget, and those small enough decoded and made into a picture and mask
//! as the edit makes them.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::input_budget::{self, Input};
use zimage::server::openai;

const CONTENT_TYPE: &str = "multipart/form-data; boundary=zimageboundary";

fuzz_target!(|data: &[u8]| {
    let runtime = zimage_fuzz::runtime();
    let Ok(form) = runtime.block_on(openai::read_edit_body(CONTENT_TYPE, data.to_vec())) else {
        return;
    };
    let pictures: Vec<Input> = [
        ("field", "image", form.image.as_deref()),
        ("field", "mask", form.mask.as_deref()),
        ("field", "control_image", form.control_image.as_deref()),
    ]
    .into_iter()
    .filter_map(|(what, name, bytes)| bytes.map(|bytes| Input { what, name, bytes }))
    .collect();
    let Ok(headers) = input_budget::probe_all(&pictures) else {
        return;
    };
    // The budget's sum never wraps, and small pictures only are decoded.
    let held = input_budget::held_bytes(&headers, 10);
    assert!(headers.iter().all(|h| h.held_bytes() <= held));
    if headers.iter().any(|h| h.width > 64 || h.height > 64) {
        return;
    }
    if let Some(image) = &form.image {
        if let Ok(input) = openai::decode_edit(image, form.mask.as_deref(), None) {
            if let Some(mask) = &input.mask {
                assert_eq!(
                    (mask.width(), mask.height()),
                    (input.image.width(), input.image.height())
                );
            }
        }
    }
});
