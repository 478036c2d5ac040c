//! The safetensors header parser, from memory and from a reader, and the writer's headers
//! read back.
//!
//! Beyond "no panic": both entry points agree, an accepted header describes exactly the bytes
//! it was given, and a header rebuilt by the writer from what was parsed parses to the same
//! tensors and metadata.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::safetensors::{self, TensorSpec};

fuzz_target!(|data: &[u8]| {
    let parsed = safetensors::parse(data);
    let read = safetensors::read_header(&mut std::io::Cursor::new(data), data.len() as u64);
    let header = match (parsed, read) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "parse and read_header disagree");
            a
        }
        (Err(_), Err(_)) => return,
        (a, b) => panic!("parse gives {a:?} but read_header gives {b:?}"),
    };
    assert_eq!(header.file_len(), data.len() as u64);
    for t in &header.tensors {
        let bits = t.numel() as u128 * t.dtype.bits() as u128;
        assert_eq!(
            bits,
            t.nbytes() as u128 * 8,
            "`{}`: size does not match",
            t.name
        );
        assert!(t.data_offsets.1 <= header.data_len());
    }

    // The writer lays tensors out in the order given, so give them in file order.
    let mut order: Vec<_> = header.tensors.iter().collect();
    order.sort_by_key(|t| t.data_offsets);
    let specs: Vec<TensorSpec> = order
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    let Ok(mut rebuilt) = safetensors::header_bytes(&specs, header.metadata.as_ref(), 8) else {
        return;
    };
    rebuilt.resize(rebuilt.len() + header.data_len() as usize, 0);
    let again = safetensors::parse(&rebuilt).expect("a header the writer built parses");
    let again_order: Vec<_> = again.tensors.iter().collect();
    assert_eq!(again_order, order, "tensors change through the writer");
    assert_eq!(
        again.metadata, header.metadata,
        "metadata changes through the writer"
    );
});
