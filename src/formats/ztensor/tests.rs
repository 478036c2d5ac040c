use super::*;
use ciborium::Value;
use std::collections::BTreeMap;

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The manifest of a written file (everything between the last blob and the size).
fn manifest_of(bytes: &[u8]) -> &[u8] {
    let n = u64::from_le_bytes(bytes[bytes.len() - 8..].try_into().unwrap()) as usize;
    &bytes[bytes.len() - 8 - n..bytes.len() - 8]
}

/// The manifest of the reference's `v1_dense_f32_crc32c.zt`, spelled as in formats.md §A2.
fn golden_manifest() -> Vec<u8> {
    let mut m = Vec::new();
    let t = |m: &mut Vec<u8>, head: u8, s: &str| {
        m.push(head);
        m.extend_from_slice(s.as_bytes());
    };
    m.push(0xa4);
    t(&mut m, 0x67, "version");
    t(&mut m, 0x63, "1.0");
    t(&mut m, 0x69, "generator");
    t(&mut m, 0x73, "zTensor-Rust v0.1.0");
    t(&mut m, 0x6a, "attributes");
    m.push(0xa0);
    t(&mut m, 0x67, "tensors");
    m.push(0xa1);
    t(&mut m, 0x66, "weight");
    m.push(0xa4);
    t(&mut m, 0x65, "dtype");
    t(&mut m, 0x67, "float32");
    t(&mut m, 0x65, "shape");
    m.extend_from_slice(&[0x82, 0x02, 0x03]);
    t(&mut m, 0x66, "format");
    t(&mut m, 0x65, "dense");
    t(&mut m, 0x6a, "components");
    m.push(0xa1);
    t(&mut m, 0x64, "data");
    m.push(0xa3);
    t(&mut m, 0x66, "offset");
    m.extend_from_slice(&[0x18, 0x40]);
    t(&mut m, 0x66, "length");
    m.extend_from_slice(&[0x18, 0x18]);
    t(&mut m, 0x66, "digest");
    t(&mut m, 0x71, "crc32c:0x805104B9");
    m
}

/// Writes the reference container: one dense 2×3 F32 tensor `weight`. Returns its size.
fn write_weight(p: &std::path::Path) -> u64 {
    let mut w = Writer::create(p, WriteOptions::default()).unwrap();
    w.add_dense(
        "weight",
        ZDtype::Float32,
        &[2, 3],
        &f32s(&[1., 2., 3., 4., 5., 6.]),
    )
    .unwrap();
    w.finish().unwrap()
}

#[test]
fn writer_reproduces_the_reference_manifest_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.zt");
    let size = write_weight(&p);
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(size, bytes.len() as u64);
    assert_eq!(&bytes[..8], MAGIC);
    assert!(bytes[8..64].iter().all(|&b| b == 0), "padding is zero");
    assert_eq!(&bytes[64..88], &f32s(&[1., 2., 3., 4., 5., 6.])[..]);
    assert_eq!(manifest_of(&bytes), &golden_manifest()[..]);
    assert_eq!(
        bytes.len(),
        88 + golden_manifest().len() + 8,
        "manifest right after the last blob"
    );
}

#[test]
fn empty_file_is_magic_manifest_size() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e.zt");
    Writer::create(&p, WriteOptions::default())
        .unwrap()
        .finish()
        .unwrap();
    let bytes = std::fs::read(&p).unwrap();
    let m = manifest_of(&bytes);
    assert_eq!(bytes.len(), 8 + m.len() + 8);
    let f = ZtFile::open(&p).unwrap();
    assert!(f.is_empty() && f.attributes().is_empty());
    assert_eq!((f.version(), f.generator()), ("1.0", GENERATOR));
}

#[test]
fn every_layout_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    for (compress, checksum) in [
        (false, Checksum::None),
        (true, Checksum::Crc32c),
        (false, Checksum::Sha256),
        (true, Checksum::Sha256),
    ] {
        let p = dir
            .path()
            .join(format!("r-{compress}-{}.zt", checksum.name()));
        let attributes: BTreeMap<_, _> = [("license".to_string(), "MIT".to_string())].into();
        let mut w = Writer::create(
            &p,
            WriteOptions {
                compress,
                checksum,
                attributes,
            },
        )
        .unwrap();
        let dense = f32s(&(0..300).map(|i| i as f32 * 0.5).collect::<Vec<_>>());
        w.add_dense("dense", ZDtype::Float32, &[10, 30], &dense)
            .unwrap();
        w.add_dense("scalar", ZDtype::BFloat16, &[], &[0x80, 0x3f])
            .unwrap();
        w.add_dense("empty", ZDtype::Int64, &[0, 7], &[]).unwrap();
        // [[0, 5, 0], [0, 0, 0], [7, 0, 9]]
        w.add_csr(
            "csr",
            ZDtype::Int32,
            &[3, 3],
            &[5, 0, 0, 0, 7, 0, 0, 0, 9, 0, 0, 0],
            &[1, 0, 2],
            &[0, 1, 1, 3],
        )
        .unwrap();
        w.add_coo(
            "coo",
            ZDtype::Uint8,
            &[2, 2, 2],
            &[1, 2],
            &[0, 1, 1, 0, 1, 1],
        )
        .unwrap();
        w.finish().unwrap();

        let f = ZtFile::open(&p).unwrap();
        assert!(f.warnings().is_empty(), "{:?}", f.warnings());
        assert_eq!(f.attributes()["license"], "MIT");
        assert_eq!(f.read_dense("dense").unwrap(), dense);
        assert_eq!(f.read_dense("scalar").unwrap(), vec![0x80, 0x3f]);
        assert_eq!(f.read_dense("empty").unwrap(), Vec::<u8>::new());
        let csr: Vec<u8> = [0i32, 5, 0, 0, 0, 0, 7, 0, 9]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(f.read_dense("csr").unwrap(), csr);
        // (0,1,1) = 1, (1,0,1) = 2
        assert_eq!(f.read_dense("coo").unwrap(), vec![0, 0, 0, 1, 0, 2, 0, 0]);
        f.verify().unwrap();
        let mut copied = Vec::new();
        f.copy_dense("dense", &mut copied).unwrap();
        assert_eq!(copied, dense);
        for t in f.tensors() {
            for (_, c) in t.layout.components() {
                assert_eq!(c.offset % ALIGNMENT, 0);
                assert_eq!(c.encoding == Encoding::Zstd, compress);
                assert_eq!(c.digest.is_some(), checksum != Checksum::None);
            }
        }
        let l = listing(&p).unwrap();
        let names: Vec<_> = l
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.dtype.as_str(), t.byte_length))
            .collect();
        assert_eq!(
            names,
            [
                ("coo", "u8", 8),
                ("csr", "i32", 36),
                ("dense", "f32", 1200),
                ("empty", "i64", 0),
                ("scalar", "bf16", 2)
            ]
        );
        assert_eq!(l.metadata["license"], serde_json::json!("MIT"));
    }
}

#[test]
fn writer_refuses_what_the_reader_would_reject() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::create(&dir.path().join("x.zt"), WriteOptions::default()).unwrap();
    assert!(
        w.add_dense("a", ZDtype::Float32, &[2], &[0; 4]).is_err(),
        "short data"
    );
    w.add_dense("a", ZDtype::Uint8, &[1], &[0]).unwrap();
    assert!(
        w.add_dense("a", ZDtype::Uint8, &[1], &[0]).is_err(),
        "duplicate"
    );
    assert!(
        w.add_csr("c", ZDtype::Uint8, &[2, 2], &[1], &[2], &[0, 1, 1])
            .is_err(),
        "column out of range"
    );
    assert!(
        w.add_csr("c", ZDtype::Uint8, &[2, 2], &[1, 1], &[0, 0], &[0, 2, 2])
            .is_err(),
        "repeated column"
    );
    assert!(
        w.add_coo("o", ZDtype::Uint8, &[2], &[1, 1], &[1, 1])
            .is_err(),
        "repeated coordinate"
    );
    assert!(
        w.add_dense("big", ZDtype::Float64, &[1 << 32, 1 << 32], &[])
            .is_err(),
        "overflow"
    );
    drop(w);
    assert!(
        !dir.path().join("x.zt").exists(),
        "an unfinished writer leaves nothing"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nor its temporary file"
    );
}

/// A file with the given manifest value after `blob` (placed at offset 64).
fn craft(dir: &std::path::Path, name: &str, blob: &[u8], manifest: &Value) -> std::path::PathBuf {
    let mut bytes = MAGIC.to_vec();
    bytes.resize(64, 0);
    bytes.extend_from_slice(blob);
    let mut m = Vec::new();
    ciborium::ser::into_writer(manifest, &mut m).unwrap();
    bytes.extend_from_slice(&m);
    bytes.extend_from_slice(&(m.len() as u64).to_le_bytes());
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (text(k), v)).collect())
}

fn dense_manifest(version: &str, dtype: &str, shape: &[u64], comp: Vec<(&str, Value)>) -> Value {
    let shape = Value::Array(shape.iter().map(|&d| Value::Integer(d.into())).collect());
    map(vec![
        ("version", text(version)),
        ("generator", text("test")),
        ("attributes", map(vec![])),
        (
            "tensors",
            map(vec![(
                "t",
                map(vec![
                    ("dtype", text(dtype)),
                    ("shape", shape),
                    ("format", text("dense")),
                    ("components", map(vec![("data", map(comp))])),
                ]),
            )]),
        ),
    ])
}

fn at(offset: u64, length: u64) -> Vec<(&'static str, Value)> {
    vec![
        ("offset", Value::Integer(offset.into())),
        ("length", Value::Integer(length.into())),
    ]
}

#[test]
fn accepts_what_the_reference_reader_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let blob = f32s(&[0., 1., 2., 3., 4., 5.]);
    let mut comp = at(64, 24);
    comp.push(("encoding", text("raw")));
    comp.push(("digest", text("crc32c:0x78743a5d")));
    comp.push(("extra", text("ignored")));
    let p = craft(
        dir.path(),
        "ok.zt",
        &blob,
        &dense_manifest("1.0", "float32", &[2, 3], comp),
    );
    assert_eq!(ZtFile::open(&p).unwrap().read_dense("t").unwrap(), blob);

    let mut comp = at(64, 24);
    comp.push(("digest", text("xxh3:1234")));
    let p = craft(
        dir.path(),
        "unknown-digest.zt",
        &blob,
        &dense_manifest("1.3", "float32", &[2, 3], comp),
    );
    let f = ZtFile::open(&p).unwrap();
    assert_eq!(f.warnings().len(), 2, "{:?}", f.warnings());
    assert_eq!(f.read_dense("t").unwrap(), blob);
}

#[test]
fn rejects_each_malformation_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let blob = f32s(&[0., 1., 2., 3., 4., 5.]);
    let err = |name: &str, m: Value| {
        let p = craft(dir.path(), name, &blob, &m);
        let e = ZtFile::open(&p)
            .and_then(|f| f.read_dense("t").map(|_| ()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(name), "{e}");
        e
    };
    let ok = |extra: Vec<(&'static str, Value)>| {
        let mut c = at(64, 24);
        c.extend(extra);
        c
    };
    assert!(err(
        "v2.zt",
        dense_manifest("2.0", "float32", &[2, 3], ok(vec![]))
    )
    .contains("version 2.0"));
    assert!(err(
        "dtype.zt",
        dense_manifest("1.0", "f32", &[2, 3], ok(vec![]))
    )
    .contains("unknown dtype `f32`"));
    assert!(err(
        "size.zt",
        dense_manifest("1.0", "float32", &[2, 4], ok(vec![]))
    )
    .contains("needs 32"));
    assert!(err(
        "overflow.zt",
        dense_manifest("1.0", "float64", &[1 << 40, 1 << 40], ok(vec![]))
    )
    .contains("64 bits"));
    let e = err(
        "crc.zt",
        dense_manifest(
            "1.0",
            "float32",
            &[2, 3],
            ok(vec![("digest", text("crc32c:0x78743A5C"))]),
        ),
    );
    assert!(
        e.contains("digest mismatch") && e.contains("tensor `t`") && e.contains("component `data`"),
        "{e}"
    );
    let sha = format!("sha256:{}", "0".repeat(64));
    assert!(err(
        "sha.zt",
        dense_manifest("1.0", "float32", &[2, 3], ok(vec![("digest", text(&sha))]))
    )
    .contains("digest mismatch"));
    assert!(err(
        "enc.zt",
        dense_manifest(
            "1.0",
            "float32",
            &[2, 3],
            ok(vec![("encoding", text("lz4"))])
        )
    )
    .contains("unknown encoding"));
    let e = err(
        "align.zt",
        dense_manifest("1.0", "float32", &[2, 3], at(60, 24)),
    );
    assert!(
        e.contains("component `data`") && e.contains("multiple of 64"),
        "{e}"
    );
    assert!(err(
        "past.zt",
        dense_manifest("1.0", "float32", &[2, 3], at(128, 24))
    )
    .contains("run past"));
    assert!(err(
        "zstd.zt",
        dense_manifest(
            "1.0",
            "float32",
            &[2, 3],
            ok(vec![("encoding", text("zstd"))])
        )
    )
    .contains("zstd"));
    let no_tensors = map(vec![("version", text("1.0"))]);
    assert!(err("notensors.zt", no_tensors).contains("no `tensors`"));
    let shape_neg = one_uint8_tensor(vec![(
        "shape",
        Value::Array(vec![Value::Integer((-1).into())]),
    )]);
    assert!(err("neg.zt", shape_neg).contains("unsigned"));
}

#[test]
fn rejects_broken_containers() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.zt");
    write_weight(&p);
    let good = std::fs::read(&p).unwrap();
    let check = |name: &str, bytes: &[u8], want: &str| {
        let q = dir.path().join(name);
        std::fs::write(&q, bytes).unwrap();
        let e = ZtFile::open(&q)
            .and_then(|f| f.read_dense("weight").map(|_| ()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(name) && e.contains(want), "{name}: {e}");
    };
    let mut b = good.clone();
    b[0] = b'X';
    check("magic.zt", &b, "ZTEN1000");
    check("short.zt", &good[..10], "too short");
    check("truncated.zt", &good[..good.len() - 20], "manifest");
    let mut b = good.clone();
    let n = b.len();
    b[n - 8..].copy_from_slice(&(n as u64).to_le_bytes());
    check("bigsize.zt", &b, "runs past");
    let mut b = good.clone();
    b[70] ^= 1;
    check("flip.zt", &b, "digest mismatch");
    let mut b = good.clone();
    let m = manifest_of(&good).len();
    b[n - 8 - m] = 0xff;
    check("cbor.zt", &b, "CBOR");
}

#[test]
fn overlapping_components_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Two tensors on the same four bytes.
    let tensor = || {
        map(vec![
            ("dtype", text("uint8")),
            ("shape", Value::Array(vec![Value::Integer(4.into())])),
            ("format", text("dense")),
            ("components", map(vec![("data", map(at(64, 4)))])),
        ])
    };
    let m = map(vec![
        ("version", text("1.0")),
        ("tensors", map(vec![("a", tensor()), ("b", tensor())])),
    ]);
    let p = craft(dir.path(), "overlap.zt", &[1, 2, 3, 4], &m);
    let e = ZtFile::open(&p).unwrap_err().to_string();
    assert!(e.contains("overlap") && e.contains("overlap.zt"), "{e}");
}

#[test]
fn sparse_indices_are_checked_when_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.zt");
    let mut w = Writer::create(&p, WriteOptions::default()).unwrap();
    w.add_coo("coo", ZDtype::Uint8, &[4], &[1], &[3]).unwrap();
    w.finish().unwrap();
    // Point the single coordinate past the end, keeping the digest honest.
    let mut bytes = std::fs::read(&p).unwrap();
    let f = ZtFile::open(&p).unwrap();
    let Layout::Coo { coords, .. } = &f.tensor("coo").unwrap().layout else {
        panic!()
    };
    let at = coords.offset as usize;
    bytes[at] = 9;
    let m = manifest_of(&bytes).to_vec();
    let old = Digest::Crc32c(crc32c::crc32c(&[3, 0, 0, 0, 0, 0, 0, 0])).text();
    let new = Digest::Crc32c(crc32c::crc32c(&bytes[at..at + 8])).text();
    let pos = m
        .windows(old.len())
        .position(|w| w == old.as_bytes())
        .unwrap();
    let start = bytes.len() - 8 - m.len() + pos;
    bytes[start..start + new.len()].copy_from_slice(new.as_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let e = dense_error(&p, "coo");
    assert!(
        e.contains("component `coords`") && e.contains("outside dimension 0"),
        "{e}"
    );
}

#[test]
fn cut_zstd_frames_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = f32s(&(0..256).map(|i| (i as f32).sin()).collect::<Vec<_>>());
    let z = zstd::encode_all(&data[..], 3).unwrap();
    let cut = &z[..z.len() - 4];
    let mut comp = at(64, cut.len() as u64);
    comp.push(("encoding", text("zstd")));
    let p = craft(
        dir.path(),
        "cut.zt",
        cut,
        &dense_manifest("1.0", "float32", &[256], comp),
    );
    let e = dense_error(&p, "t");
    assert!(
        e.contains("cut.zt") && e.contains("component `data`"),
        "{e}"
    );
    // Two frames back to back are one stream of data.
    let mut two = zstd::encode_all(&data[..512], 3).unwrap();
    two.extend(zstd::encode_all(&data[512..], 19).unwrap());
    let mut comp = at(64, two.len() as u64);
    comp.push(("encoding", text("zstd")));
    let p = craft(
        dir.path(),
        "two.zt",
        &two,
        &dense_manifest("1.0", "float32", &[256], comp),
    );
    assert_eq!(ZtFile::open(&p).unwrap().read_dense("t").unwrap(), data);
}

/// The error reading tensor `name` of the container at `p` gives.
fn dense_error(p: &std::path::Path, name: &str) -> String {
    ZtFile::open(p)
        .unwrap()
        .read_dense(name)
        .unwrap_err()
        .to_string()
}

/// A version 1.0 manifest of one uint8 tensor `t` with `fields` besides its dtype.
fn one_uint8_tensor(fields: Vec<(&str, Value)>) -> Value {
    let mut tensor = vec![("dtype", text("uint8"))];
    tensor.extend(fields);
    map(vec![
        ("version", text("1.0")),
        ("tensors", map(vec![("t", map(tensor))])),
    ])
}

#[test]
fn csr_row_pointers_that_fall_back_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let u64s = |v: &[u64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut blob = vec![1u8, 2, 3];
    blob.resize(64, 0);
    blob.extend(u64s(&[0, 1, 2]));
    blob.resize(128, 0);
    blob.extend(u64s(&[0, 10, 3]));
    let m = one_uint8_tensor(vec![
        (
            "shape",
            Value::Array(vec![Value::Integer(2.into()), Value::Integer(4.into())]),
        ),
        ("format", text("sparse_csr")),
        (
            "components",
            map(vec![
                ("values", map(at(64, 3))),
                ("indices", map(at(128, 24))),
                ("indptr", map(at(192, 24))),
            ]),
        ),
    ]);
    let p = craft(dir.path(), "csr.zt", &blob, &m);
    let e = dense_error(&p, "t");
    assert!(
        e.contains("component `indptr`") && e.contains("decreases at row 1"),
        "{e}"
    );
}
