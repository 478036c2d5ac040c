//! The parser and writer against hand-made headers.

use super::*;
use std::collections::BTreeMap;

fn file(json: &str, data_len: usize) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.resize(v.len() + data_len, 0);
    v
}

#[test]
fn seed_example_header_is_byte_exact() {
    let spec = TensorSpec {
        name: "data".into(),
        dtype: Dtype::BF16,
        shape: vec![2560, 9728],
    };
    let h = header_bytes(&[spec], None, 8).unwrap();
    assert_eq!(h.len(), 88);
    assert_eq!(&h[..8], &[0x50, 0, 0, 0, 0, 0, 0, 0]);
    let json = std::str::from_utf8(&h[8..]).unwrap();
    assert_eq!(
        json,
        "{\"data\":{\"dtype\":\"BF16\",\"shape\":[2560,9728],\"data_offsets\":[0,49807360]}}       "
    );
    assert_eq!(88 + 49_807_360, 49_807_448);
}

#[test]
fn written_headers_parse_back() {
    let specs = vec![
        TensorSpec {
            name: "a".into(),
            dtype: Dtype::F32,
            shape: vec![2, 3],
        },
        TensorSpec {
            name: "s".into(),
            dtype: Dtype::BF16,
            shape: vec![],
        },
        TensorSpec {
            name: "z".into(),
            dtype: Dtype::U8,
            shape: vec![0, 4],
        },
    ];
    let meta: BTreeMap<_, _> = [("k".to_string(), "v".to_string())].into();
    for align in [8, 64, 16384] {
        let mut f = header_bytes(&specs, Some(&meta), align).unwrap();
        assert_eq!(f.len() as u64 % align, 0);
        f.resize(f.len() + 24 + 2, 7);
        let h = parse(&f).unwrap();
        assert_eq!(h.tensors.len(), 3);
        assert_eq!(h.metadata.as_ref().unwrap()["k"], "v");
        assert_eq!(h.tensor("a").unwrap().data_offsets, (0, 24));
        assert_eq!(h.tensor("s").unwrap().data_offsets, (24, 26));
        assert_eq!(h.tensor("z").unwrap().data_offsets, (26, 26));
    }
}

#[test]
fn accepts_what_the_reference_accepts() {
    // MLX-style: unpadded, sorted keys, null metadata; leading whitespace; unknown fields.
    let f = file(
        r#"{"__metadata__":null,"data":{"data_offsets":[0,4],"dtype":"F32","shape":[1]}}"#,
        4,
    );
    assert!(parse(&f).unwrap().metadata.is_none());
    let f = file(
        " \t{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2],\"extra\":1}}  ",
        2,
    );
    assert_eq!(parse(&f).unwrap().tensors[0].shape, vec![2]);
    assert!(parse(&file("{}", 0)).unwrap().tensors.is_empty());
}

#[test]
fn rejects_each_malformation() {
    let e = |json: &str, data: usize| parse(&file(json, data)).unwrap_err();
    assert!(matches!(
        parse(&[1, 2, 3]).unwrap_err(),
        Error::HeaderTooSmall(3)
    ));
    let mut big = 200_000_000u64.to_le_bytes().to_vec();
    big.push(b'{');
    assert!(matches!(parse(&big).unwrap_err(), Error::HeaderTooLarge(_)));
    let mut short = 50u64.to_le_bytes().to_vec();
    short.extend_from_slice(b"{}");
    assert!(matches!(
        parse(&short).unwrap_err(),
        Error::InvalidHeaderLength { .. }
    ));
    let mut bad_utf8 = 2u64.to_le_bytes().to_vec();
    bad_utf8.extend_from_slice(&[0xff, 0xfe]);
    assert!(matches!(
        parse(&bad_utf8).unwrap_err(),
        Error::InvalidUtf8(_)
    ));
    assert!(matches!(e("[1]", 0), Error::InvalidJson(_)));
    assert!(matches!(e("{}\0\0", 0), Error::InvalidJson(_)));
    let dup = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    assert!(matches!(e(dup, 2), Error::DuplicateKey(k) if k == "a"));
    assert!(matches!(
        e(r#"{"__metadata__":{"k":1}}"#, 0),
        Error::BadMetadata(_)
    ));
    assert!(matches!(
        e(
            r#"{"t":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}}"#,
            2
        ),
        Error::UnknownDtype { .. }
    ));
    assert!(matches!(
        e(
            r#"{"t":{"dtype":"U8","shape":[-1],"data_offsets":[0,2]}}"#,
            2
        ),
        Error::BadField { field: "shape", .. }
    ));
    assert!(matches!(
        e(
            r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}"#,
            2
        ),
        Error::BadField {
            field: "data_offsets",
            ..
        }
    ));
    assert!(matches!(
        e(
            r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
            2
        ),
        Error::InvalidOffset { .. }
    ));
    let overlap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#;
    assert!(matches!(e(overlap, 3), Error::InvalidOffset { .. }));
    assert!(matches!(
        e(
            r#"{"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
            2
        ),
        Error::MisalignedSlice { .. }
    ));
    assert!(matches!(
        e(
            r#"{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
            4
        ),
        Error::SizeMismatch { .. }
    ));
    let huge = r#"{"t":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#;
    assert!(matches!(e(huge, 8), Error::Overflow { .. }));
    assert!(matches!(
        e(
            r#"{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
            3
        ),
        Error::LengthMismatch {
            expected: _,
            got: _
        }
    ));
}

#[test]
fn errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("broken.safetensors");
    std::fs::write(&p, [9u8; 4]).unwrap();
    let msg = read_header_file(&p).unwrap_err().to_string();
    assert!(
        msg.contains("broken.safetensors") && msg.contains("too small"),
        "{msg}"
    );
}
