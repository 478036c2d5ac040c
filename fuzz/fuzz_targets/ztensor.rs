//! The zTensor reader: open (magic, manifest size, CBOR manifest, layout checks), then every
//! tensor read dense (zstd, digests, CSR and COO scattered into zeros), streamed, verified and
//! listed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::formats::ztensor::{self, ZtFile};

fuzz_target!(|data: &[u8]| {
    let path = zimage_fuzz::scratch_file("input.zt", data);
    let Ok(file) = ZtFile::open(&path) else {
        return;
    };
    let _ = file.verify();
    let _ = ztensor::listing(&path);
    let names: Vec<String> = file.tensors().map(|t| t.name.clone()).collect();
    for name in names {
        let meta = file.tensor(&name).expect("listed tensors exist");
        let dense_len = meta.dense_len;
        if let Ok(bytes) = file.read_dense(&name) {
            assert_eq!(bytes.len() as u64, dense_len, "`{name}`: wrong dense size");
        }
        let mut out = Vec::new();
        if file.copy_dense(&name, &mut out).is_ok() {
            assert_eq!(out.len() as u64, dense_len, "`{name}`: wrong streamed size");
        }
    }
});
