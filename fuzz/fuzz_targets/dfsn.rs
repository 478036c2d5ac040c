//! The DFSN container reader: header, byte order, offsets, metadata JSON, the model's hash and
//! the safetensors listing of the model inside.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::formats::dfsn;

fuzz_target!(|data: &[u8]| {
    let path = zimage_fuzz::scratch_file("input.dfsn", data);
    let Ok(container) = dfsn::Container::open(&path) else {
        return;
    };
    assert!(container.metadata.is_object());
    assert!(container.metadata_offset <= container.model_offset);
    assert_eq!(
        container.model_offset + container.model_len,
        data.len() as u64
    );
    let _ = container.metadata_room();
    let _ = container.sha256_hex();
    if let Ok(v) = dfsn::verify(&path) {
        assert_eq!(v.model_len, container.model_len);
    }
    let _ = dfsn::listing(&path);
});
