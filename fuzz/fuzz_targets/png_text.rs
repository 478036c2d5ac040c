//! The PNG text-chunk reader (tEXt, zTXt, iTXt), on a file as the CLI reads it.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = zimage_fuzz::scratch_file("input.png", data);
    let _ = zimage::image_out::read_png_text(&path);
});
