//! Input pictures and masks (`--image`, `--mask`, the server's uploads): decoding under the
//! limits, then everything the pipeline does with a picture before the encoder — RGB at a
//! request's size, the binarised mask, and OpenAI's alpha mask.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::image_in;

fuzz_target!(|data: &[u8]| {
    // The limits' code under a smaller side, so that a few bytes claiming thousands of pixels
    // cost milliseconds, not seconds, and the executions go to the decoders' paths.
    let Ok(img) = image_in::decode_within(data, "--image", "input", 512) else {
        return;
    };
    let (w, h) = (img.width().min(48), img.height().min(48));
    let rgb = image_in::picture(&img, w, h);
    assert_eq!(rgb.len(), (w * h * 3) as usize);
    let mask = image_in::mask(&image_in::mask_from_alpha(&img), w, h);
    assert!(mask.iter().all(|&v| v <= 1));
    let _ = image_in::default_size(img.width(), img.height(), 16);
});
