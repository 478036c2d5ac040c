//! The A1111 infotext parser (the `parameters` text of a PNG).

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::formats::infotext;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = infotext::parse(text);
    for (k, _) in &parsed.params {
        assert!(parsed.get(k).is_some());
    }
});
