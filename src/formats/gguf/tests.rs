use super::*;

fn small_file() -> Vec<u8> {
    let q = {
        let mut b = half::f16::from_f32(0.25).to_le_bytes().to_vec();
        b.extend((0..16u8).map(|j| j | (j << 4)));
        b
    };
    let f: Vec<u8> = [1.0f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut out = Vec::new();
    write(
        &mut out,
        &[
            ("general.architecture".into(), Value::String("test".into())),
            (
                "list".into(),
                Value::Array {
                    type_id: 4,
                    values: vec![Value::U32(7), Value::U32(8)],
                },
            ),
        ],
        &[
            WriteTensor {
                name: "w".into(),
                ggml_type: GgmlType::Q4_0,
                shape: vec![1, 32],
                data: &q,
            },
            WriteTensor {
                name: "b".into(),
                ggml_type: GgmlType::F32,
                shape: vec![2],
                data: &f,
            },
        ],
    )
    .unwrap();
    out
}

fn parse(bytes: &[u8]) -> Result<Gguf> {
    read(bytes, bytes.len() as u64)
}

#[test]
fn round_trips_what_it_writes() {
    let bytes = small_file();
    let g = parse(&bytes).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.tensors[0].shape, vec![1, 32]);
    assert_eq!(g.tensors[0].nbytes, 18);
    assert_eq!(g.tensors[1].offset, g.data_start + 32);
    assert_eq!(
        g.get("list").and_then(|v| match v {
            Value::Array { values, .. } => values[1].as_u64(),
            _ => None,
        }),
        Some(8)
    );
    let b = &g.tensors[1];
    let data = &bytes[b.offset as usize..(b.offset + b.nbytes) as usize];
    assert_eq!(data, &[0, 0, 128, 63, 0, 0, 0, 192]);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = small_file();
    // The last tensor ends 8 bytes after the start of the last 32-byte slot.
    let end = parse(&bytes).unwrap().tensors[1].offset as usize + 8;
    for n in 0..end {
        assert!(parse(&bytes[..n]).is_err(), "{n} bytes parsed");
    }
}

#[test]
fn refuses_hostile_headers() {
    let head = |n_tensors: u64, n_kv: u64| {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b
    };
    let err = parse(&head(0, 1_000_000)).unwrap_err().to_string();
    assert!(
        err.contains("metadata_kv_count") && err.contains("limit"),
        "{err}"
    );
    let err = parse(&head(1000, 0)).unwrap_err().to_string();
    assert!(
        err.contains("tensor_count") && err.contains("truncated"),
        "{err}"
    );
    let mut b = head(0, 1);
    b.extend(3u64.to_le_bytes());
    b.extend(b"key");
    b.extend(8u32.to_le_bytes());
    b.extend(u64::MAX.to_le_bytes());
    let err = parse(&b).unwrap_err().to_string();
    assert!(err.contains("metadata `key`"), "{err}");
    let mut be = b"GGUF".to_vec();
    be.extend(3u32.to_be_bytes());
    be.extend([0u8; 16]);
    assert!(matches!(parse(&be), Err(Error::BigEndian(_))));
}

/// Rewrites the tensor info of the first tensor (`w`) in `small_file`.
fn with_first_tensor(dims: &[u64], type_id: u32, offset: u64) -> Vec<u8> {
    let bytes = small_file();
    let g = parse(&bytes).unwrap();
    // The first tensor info follows the metadata; find it by its name.
    let at = bytes
        .windows(9)
        .position(|w| w == [1, 0, 0, 0, 0, 0, 0, 0, b'w'])
        .unwrap();
    let mut out = bytes[..at + 9].to_vec();
    out.extend((dims.len() as u32).to_le_bytes());
    dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
    out.extend(type_id.to_le_bytes());
    out.extend(offset.to_le_bytes());
    let old_len = 4 + 8 * 2 + 4 + 8;
    out.extend(&bytes[at + 9 + old_len..]);
    assert_eq!(g.tensors.len(), 2);
    out
}

#[test]
fn refuses_bad_tensors() {
    let ok = with_first_tensor(&[32, 1], 2, 0);
    assert!(parse(&ok).is_ok());
    let err = |b: Vec<u8>| parse(&b).unwrap_err().to_string();
    assert!(err(with_first_tensor(&[32, 1], 99, 0)).contains("unknown ggml type id 99"));
    assert!(err(with_first_tensor(&[32, 1], 2, 8)).contains("not a multiple of the alignment"));
    assert!(err(with_first_tensor(&[32, 1], 2, 1 << 40)).contains("past the end"));
    assert!(err(with_first_tensor(&[32, 1], 2, 32)).contains("overlap"));
    assert!(err(with_first_tensor(&[1 << 40, 1 << 40], 2, 0)).contains("2^63"));
    // A zero dimension does not excuse the others: in another order their product overflows.
    assert!(err(with_first_tensor(&[0, 1 << 40, 1 << 40], 0, 0)).contains("2^63"));
    assert!(err(with_first_tensor(&[16, 2], 2, 0)).contains("block of 32"));
}
