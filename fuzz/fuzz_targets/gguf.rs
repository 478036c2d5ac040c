//! The GGUF reader on the input as a whole file, then every tensor's blocks through the
//! conversions an import makes, and the writer's file of what was read parsed back.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::formats::gguf::{self, WriteTensor};
use zimage::ggml;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = gguf::read(data, data.len() as u64) else {
        return;
    };
    let mut out = Vec::new();
    for t in &g.tensors {
        let end = t.offset + t.nbytes;
        assert!(end <= data.len() as u64, "`{}` ends past the input", t.name);
        let bytes = &data[t.offset as usize..end as usize];
        let numel = t.numel() as usize;
        // Bounded work per input: conversions of small tensors only.
        if numel <= 1 << 16 {
            if let Some(values) = ggml::dequantize(t.ggml_type, bytes) {
                assert_eq!(values.len(), numel);
            }
            if let Some(cols) = t.shape.last() {
                if let Some(a) = ggml::to_affine(t.ggml_type, bytes, *cols as usize) {
                    assert_eq!(a.scales.len(), numel / ggml::GROUP);
                    assert_eq!(a.packed.len(), numel * a.bits as usize / 8);
                }
            }
        }
        out.push(WriteTensor {
            name: t.name.clone(),
            ggml_type: t.ggml_type,
            shape: t.shape.clone(),
            data: bytes,
        });
    }
    let mut file = Vec::new();
    gguf::write(&mut file, &g.metadata, &out).expect("what was read writes");
    let back = gguf::read(file.as_slice(), file.len() as u64).expect("what was written reads");
    assert_eq!(back.metadata.len(), g.metadata.len());
    assert_eq!(back.tensors.len(), g.tensors.len());
    for (a, b) in back.tensors.iter().zip(&g.tensors) {
        assert_eq!(
            (&a.name, a.ggml_type, &a.shape, a.nbytes),
            (&b.name, b.ggml_type, &b.shape, b.nbytes)
        );
    }
});
