//! zTensor v1.0 against the reference crate `ztensor` 1.0.0 in both directions, `zimage convert`
//! round trips and failures, and importing a .zt file into the store.

mod common;

use common::{s, write_safetensors_with_metadata as write_st, zimage};
use std::collections::BTreeMap;
use std::path::Path;
use zimage::formats::ztensor::{self as zt, Checksum, WriteOptions, ZDtype, ZtFile};
use zimage::loader::{self, ReadPath};
use zimage::safetensors::{self, Dtype};
use zimage::store::{ImportOptions, Store};
use ztensor::{ChecksumAlgorithm, DType, Encoding, ZTensorReader, ZTensorWriter};

fn f32_bytes(n: usize, seed: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i as f32 * 0.37 + seed).sin()).to_le_bytes())
        .collect()
}

fn bf16_bytes(n: usize, seed: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| half::bf16::from_f32((i as f32 * 0.11 + seed).cos()).to_le_bytes())
        .collect()
}

/// CSR `[[0, 1.5, 0, 0], [0, 0, 0, 0], [2.5, 0, 0, -1]]` and its dense form.
fn csr_case() -> (Vec<u8>, Vec<u64>, Vec<u64>, Vec<u8>) {
    let values: Vec<u8> = [1.5f32, 2.5, -1.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let dense: Vec<u8> = [0., 1.5, 0., 0., 0., 0., 0., 0., 2.5, 0., 0., -1.0f32]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    (values, vec![1, 0, 3], vec![0, 1, 1, 3], dense)
}

/// COO over shape `[2, 3]`: (1, 2) = 7, (0, 0) = 9, stored as i16.
fn coo_case() -> (Vec<u8>, Vec<u64>, Vec<u8>) {
    let values: Vec<u8> = [7i16, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
    let dense: Vec<u8> = [9i16, 0, 0, 0, 0, 7]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    (values, vec![1, 0, 2, 0], dense)
}

#[test]
fn files_written_by_the_reference_read_back_equal() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ref.zt");
    let dense = f32_bytes(6 * 10, 0.0);
    let bf = bf16_bytes(33, 1.0);
    let (csr_v, csr_i, csr_p, csr_dense) = csr_case();
    let (coo_v, coo_c, coo_dense) = coo_case();
    let mut w = ZTensorWriter::create(&p).unwrap();
    w.add_tensor(
        "raw",
        vec![6, 10],
        DType::Float32,
        Encoding::Raw,
        dense.clone(),
        ChecksumAlgorithm::None,
    )
    .unwrap();
    w.add_tensor(
        "zstd",
        vec![6, 10],
        DType::Float32,
        Encoding::Zstd,
        dense.clone(),
        ChecksumAlgorithm::None,
    )
    .unwrap();
    w.add_tensor(
        "crc",
        vec![6, 10],
        DType::Float32,
        Encoding::Raw,
        dense.clone(),
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_tensor(
        "zstd_crc",
        vec![6, 10],
        DType::Float32,
        Encoding::Zstd,
        dense.clone(),
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_tensor(
        "bf16",
        vec![3, 11],
        DType::BFloat16,
        Encoding::Zstd,
        bf.clone(),
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_tensor(
        "scalar",
        vec![],
        DType::Int64,
        Encoding::Raw,
        42i64.to_le_bytes().to_vec(),
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_tensor(
        "flags",
        vec![3],
        DType::Bool,
        Encoding::Raw,
        vec![1, 0, 1],
        ChecksumAlgorithm::None,
    )
    .unwrap();
    w.add_csr_tensor(
        "csr",
        vec![3, 4],
        DType::Float32,
        csr_v.clone(),
        csr_i.clone(),
        csr_p.clone(),
        Encoding::Raw,
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_csr_tensor(
        "csr_zstd",
        vec![3, 4],
        DType::Float32,
        csr_v,
        csr_i,
        csr_p,
        Encoding::Zstd,
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_coo_tensor(
        "coo",
        vec![2, 3],
        DType::Int16,
        coo_v.clone(),
        coo_c.clone(),
        Encoding::Raw,
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_coo_tensor(
        "coo_zstd",
        vec![2, 3],
        DType::Int16,
        coo_v,
        coo_c,
        Encoding::Zstd,
        ChecksumAlgorithm::None,
    )
    .unwrap();
    w.finalize().unwrap();

    let f = ZtFile::open(&p).unwrap();
    assert!(f.warnings().is_empty());
    for name in ["raw", "zstd", "crc", "zstd_crc"] {
        assert_eq!(f.read_dense(name).unwrap(), dense, "{name}");
    }
    assert_eq!(f.read_dense("bf16").unwrap(), bf);
    assert_eq!(f.read_dense("scalar").unwrap(), 42i64.to_le_bytes());
    assert_eq!(f.read_dense("flags").unwrap(), vec![1, 0, 1]);
    assert_eq!(f.read_dense("csr").unwrap(), csr_dense);
    assert_eq!(f.read_dense("csr_zstd").unwrap(), csr_dense);
    assert_eq!(f.read_dense("coo").unwrap(), coo_dense);
    assert_eq!(f.read_dense("coo_zstd").unwrap(), coo_dense);
    f.verify().unwrap();
    let l = zt::listing(&p).unwrap();
    assert_eq!(l.format, "ztensor");
    let flags = l.tensors.iter().find(|t| t.name == "flags").unwrap();
    assert_eq!((flags.dtype.as_str(), flags.byte_length), ("bool", 3));
    assert_eq!(
        l.tensors.iter().find(|t| t.name == "scalar").unwrap().dtype,
        "i64"
    );

    let empty = dir.path().join("empty.zt");
    ZTensorWriter::create(&empty).unwrap().finalize().unwrap();
    let f = ZtFile::open(&empty).unwrap();
    assert!(f.is_empty() && f.attributes().is_empty());
    let bytes = std::fs::read(&empty).unwrap();
    assert_eq!(
        bytes.len(),
        8 + manifest_len(&bytes) + 8,
        "the manifest follows the magic"
    );
}

fn manifest_len(file: &[u8]) -> usize {
    u64::from_le_bytes(file[file.len() - 8..].try_into().unwrap()) as usize
}

/// The same tensors through both writers, raw: the files must be identical byte for byte.
#[test]
fn our_raw_files_are_byte_identical_to_the_references() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (dir.path().join("ours.zt"), dir.path().join("theirs.zt"));
    let dense = f32_bytes(5 * 7, 2.0);
    let (csr_v, csr_i, csr_p, _) = csr_case();
    let (coo_v, coo_c, _) = coo_case();
    for ck in [ChecksumAlgorithm::None, ChecksumAlgorithm::Crc32c] {
        let mut w = ZTensorWriter::create(&theirs).unwrap();
        w.add_tensor(
            "b.weight",
            vec![5, 7],
            DType::Float32,
            Encoding::Raw,
            dense.clone(),
            ck,
        )
        .unwrap();
        w.add_tensor("a.scalar", vec![], DType::Uint8, Encoding::Raw, vec![3], ck)
            .unwrap();
        w.add_tensor(
            "c.empty",
            vec![0, 3],
            DType::Float16,
            Encoding::Raw,
            vec![],
            ck,
        )
        .unwrap();
        w.add_csr_tensor(
            "d.csr",
            vec![3, 4],
            DType::Float32,
            csr_v.clone(),
            csr_i.clone(),
            csr_p.clone(),
            Encoding::Raw,
            ck,
        )
        .unwrap();
        w.add_coo_tensor(
            "e.coo",
            vec![2, 3],
            DType::Int16,
            coo_v.clone(),
            coo_c.clone(),
            Encoding::Raw,
            ck,
        )
        .unwrap();
        w.finalize().unwrap();

        let checksum = if ck == ChecksumAlgorithm::None {
            Checksum::None
        } else {
            Checksum::Crc32c
        };
        let mut w = zt::Writer::create(
            &ours,
            WriteOptions {
                compress: false,
                checksum,
                attributes: BTreeMap::new(),
            },
        )
        .unwrap();
        w.add_dense("b.weight", ZDtype::Float32, &[5, 7], &dense)
            .unwrap();
        w.add_dense("a.scalar", ZDtype::Uint8, &[], &[3]).unwrap();
        w.add_dense("c.empty", ZDtype::Float16, &[0, 3], &[])
            .unwrap();
        w.add_csr("d.csr", ZDtype::Float32, &[3, 4], &csr_v, &csr_i, &csr_p)
            .unwrap();
        w.add_coo("e.coo", ZDtype::Int16, &[2, 3], &coo_v, &coo_c)
            .unwrap();
        w.finish().unwrap();
        assert_eq!(
            std::fs::read(&ours).unwrap(),
            std::fs::read(&theirs).unwrap(),
            "checksum {ck:?}"
        );
    }
}

#[test]
fn files_we_write_read_back_equal_in_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let dense = f32_bytes(4 * 16, 3.0);
    let bf = bf16_bytes(20, 0.5);
    let (csr_v, csr_i, csr_p, _) = csr_case();
    let (coo_v, coo_c, _) = coo_case();
    for compress in [false, true] {
        for checksum in [Checksum::None, Checksum::Crc32c, Checksum::Sha256] {
            let p = dir
                .path()
                .join(format!("ours-{compress}-{}.zt", checksum.name()));
            let attributes: BTreeMap<_, _> = [("framework".to_string(), "MLX".to_string())].into();
            let mut w = zt::Writer::create(
                &p,
                WriteOptions {
                    compress,
                    checksum,
                    attributes,
                },
            )
            .unwrap();
            w.add_dense("dense", ZDtype::Float32, &[4, 16], &dense)
                .unwrap();
            w.add_dense("bf16", ZDtype::BFloat16, &[20], &bf).unwrap();
            w.add_dense("scalar", ZDtype::Int32, &[], &7i32.to_le_bytes())
                .unwrap();
            w.add_csr("csr", ZDtype::Float32, &[3, 4], &csr_v, &csr_i, &csr_p)
                .unwrap();
            w.add_coo("coo", ZDtype::Int16, &[2, 3], &coo_v, &coo_c)
                .unwrap();
            w.finish().unwrap();

            let mut r = ZTensorReader::open(&p).unwrap();
            assert_eq!(r.manifest.version, "1.0");
            assert_eq!(r.manifest.attributes["framework"], "MLX");
            assert_eq!(r.read_tensor("dense").unwrap(), dense);
            assert_eq!(r.read_tensor("bf16").unwrap(), bf);
            assert_eq!(r.read_tensor("scalar").unwrap(), 7i32.to_le_bytes());
            let csr = r.read_csr_tensor::<f32>("csr").unwrap();
            assert_eq!((csr.indices, csr.indptr), (csr_i.clone(), csr_p.clone()));
            assert_eq!(csr.values, vec![1.5, 2.5, -1.0]);
            let coo = r.read_coo_tensor::<i16>("coo").unwrap();
            assert_eq!(coo.indices, vec![vec![1, 2], vec![0, 0]]);
            assert_eq!(coo.values, vec![7, 9]);
        }
    }
}

/// crate 1.0.0 reads `sha256:` digests without checking them; we check them.
#[test]
fn sha256_digests_are_checked_by_us_and_skipped_by_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sha.zt");
    let data = f32_bytes(16, 0.0);
    let mut w = zt::Writer::create(
        &p,
        WriteOptions {
            checksum: Checksum::Sha256,
            ..Default::default()
        },
    )
    .unwrap();
    w.add_dense("w", ZDtype::Float32, &[16], &data).unwrap();
    w.finish().unwrap();
    let mut bytes = std::fs::read(&p).unwrap();
    let text = String::from_utf8_lossy(&bytes).to_string();
    assert!(text.contains("sha256:") && !text.contains("crc32c"));
    bytes[64] ^= 0x40;
    std::fs::write(&p, &bytes).unwrap();
    let theirs = ZTensorReader::open(&p).unwrap().read_tensor("w").unwrap();
    assert_ne!(theirs, data, "the reference returns the damaged bytes");
    let e = ZtFile::open(&p)
        .unwrap()
        .read_dense("w")
        .unwrap_err()
        .to_string();
    assert!(e.contains("sha.zt") && e.contains("digest mismatch"), "{e}");
}

/// A safetensors file's tensors by name, and its `__metadata__`.
type StContents = (
    BTreeMap<String, (Dtype, Vec<u64>, Vec<u8>)>,
    Option<BTreeMap<String, String>>,
);

fn st_tensors(path: &Path) -> StContents {
    let bytes = std::fs::read(path).unwrap();
    let h = safetensors::parse(&bytes).unwrap();
    let start = h.data_start() as usize;
    let map = h
        .tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                (
                    t.dtype,
                    t.shape.clone(),
                    bytes[start + t.data_offsets.0 as usize..start + t.data_offsets.1 as usize]
                        .to_vec(),
                ),
            )
        })
        .collect();
    (map, h.metadata)
}

#[test]
fn convert_round_trips_safetensors_through_zt() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("model.safetensors");
    let meta: BTreeMap<_, _> = [
        ("format".to_string(), "pt".to_string()),
        ("note".to_string(), "ü 日本".to_string()),
    ]
    .into();
    let tensors = vec![
        ("b.weight", Dtype::BF16, vec![8, 9], bf16_bytes(72, 0.3)),
        ("a.weight", Dtype::F32, vec![4, 4], f32_bytes(16, 1.0)),
        ("mask", Dtype::BOOL, vec![5], vec![1, 0, 0, 1, 1]),
        ("step", Dtype::I64, vec![], 99i64.to_le_bytes().to_vec()),
        ("none", Dtype::F16, vec![3, 0], vec![]),
    ];
    write_st(&src, &tensors, Some(&meta));
    let (want, want_meta) = st_tensors(&src);
    for (i, flags) in [
        vec![],
        vec!["--compress"],
        vec!["--checksum", "sha256"],
        vec!["--compress", "--checksum", "none"],
    ]
    .into_iter()
    .enumerate()
    {
        let z = dir.path().join(format!("m{i}.zt"));
        let back = dir.path().join(format!("back{i}.safetensors"));
        let mut args = vec!["convert", s(&src), s(&z)];
        args.extend(flags.iter().copied());
        let out = zimage(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8_lossy(&out.stdout);
        assert!(line.contains("5 tensors"), "{line}");
        // The reference reads what convert wrote.
        let mut r = ZTensorReader::open(&z).unwrap();
        assert_eq!(r.manifest.attributes, meta);
        assert_eq!(r.read_tensor("a.weight").unwrap(), want["a.weight"].2);
        let out = zimage(&["convert", s(&z), s(&back)]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (got, got_meta) = st_tensors(&back);
        assert_eq!(got, want, "{flags:?}");
        assert_eq!(got_meta, want_meta);
    }
    // Tensors sorted by name on both sides give the very same file.
    let sorted = dir.path().join("sorted.safetensors");
    let mut by_name = tensors.clone();
    by_name.sort_by(|a, b| a.0.cmp(b.0));
    write_st(&sorted, &by_name, Some(&meta));
    let (z, back) = (
        dir.path().join("sorted.zt"),
        dir.path().join("sorted-back.safetensors"),
    );
    assert!(zimage(&["convert", s(&sorted), s(&z)]).status.success());
    assert!(zimage(&["convert", s(&z), s(&back)]).status.success());
    assert_eq!(
        std::fs::read(&sorted).unwrap(),
        std::fs::read(&back).unwrap()
    );
}

#[test]
fn convert_densifies_sparse_tensors_from_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sparse.zt");
    let (csr_v, csr_i, csr_p, csr_dense) = csr_case();
    let (coo_v, coo_c, coo_dense) = coo_case();
    let mut w = ZTensorWriter::create(&p).unwrap();
    w.add_csr_tensor(
        "csr",
        vec![3, 4],
        DType::Float32,
        csr_v,
        csr_i,
        csr_p,
        Encoding::Zstd,
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_coo_tensor(
        "coo",
        vec![2, 3],
        DType::Int16,
        coo_v,
        coo_c,
        Encoding::Raw,
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.finalize().unwrap();
    let out_path = dir.path().join("dense.safetensors");
    let out = zimage(&["convert", s(&p), s(&out_path)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (got, meta) = st_tensors(&out_path);
    assert_eq!(got["csr"], (Dtype::F32, vec![3, 4], csr_dense));
    assert_eq!(got["coo"], (Dtype::I16, vec![2, 3], coo_dense));
    assert!(meta.is_none());
}

#[test]
fn convert_refuses_dtypes_ztensor_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("fp8.safetensors");
    write_st(
        &src,
        &[
            ("ok", Dtype::F32, vec![1], vec![0; 4]),
            ("scales.fp8", Dtype::F8_E4M3, vec![4], vec![1; 4]),
        ],
        None,
    );
    let dst = dir.path().join("fp8.zt");
    let out = zimage(&["convert", s(&src), s(&dst)]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("scales.fp8") && err.contains("F8_E4M3") && err.contains("fp8.safetensors"),
        "{err}"
    );
    assert!(!dst.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary file left behind"
    );
}

/// A valid one-tensor file as written by the reference, to damage.
fn reference_file(dir: &Path) -> Vec<u8> {
    let p = dir.join("good.zt");
    let mut w = ZTensorWriter::create(&p).unwrap();
    let data: Vec<u8> = [0f32, 1., 2., 3., 4., 5.]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    w.add_tensor(
        "weight",
        vec![2, 3],
        DType::Float32,
        Encoding::Raw,
        data,
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.finalize().unwrap();
    std::fs::read(p).unwrap()
}

fn replace(bytes: &mut [u8], old: &[u8], new: &[u8]) {
    assert_eq!(old.len(), new.len());
    let at = bytes
        .windows(old.len())
        .position(|w| w == old)
        .expect("pattern present");
    bytes[at..at + new.len()].copy_from_slice(new);
}

#[test]
fn malformed_files_fail_with_exit_code_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = reference_file(dir.path());
    let n = good.len();
    let mut cases: Vec<(&str, Vec<u8>, &str)> = Vec::new();
    let mut b = good.clone();
    replace(&mut b, b"\x66offset\x18\x40", b"\x66offset\x18\x3c");
    cases.push(("misaligned.zt", b, "multiple of 64"));
    let mut b = good.clone();
    b[n - 8..].copy_from_slice(&(n as u64 * 2).to_le_bytes());
    cases.push(("size-past-end.zt", b, "manifest size"));
    let mut b = good.clone();
    replace(&mut b, b"crc32c:0x78743A5D", b"crc32c:0x78743A5C");
    cases.push(("bad-crc.zt", b, "digest mismatch"));
    let mut b = good.clone();
    replace(&mut b, b"\x67version", b"\x7fversion");
    cases.push(("bad-cbor.zt", b, "CBOR"));
    cases.push(("truncated.zt", good[..n - 30].to_vec(), ""));
    let mut b = good.clone();
    replace(&mut b, b"\x63\x31.0", b"\x63\x32.0");
    cases.push(("major-2.zt", b, "version 2.0"));
    // shape [2^64-1, 2^64-1]: the manifest grows, so it is rebuilt around the same blob.
    let m_start = n - 8 - manifest_len(&good);
    let mut b = good[..m_start].to_vec();
    let mut m = good[m_start..n - 8].to_vec();
    let at = m.windows(3).position(|w| w == b"\x82\x02\x03").unwrap();
    m.splice(
        at..at + 3,
        b"\x82\x1b\xff\xff\xff\xff\xff\xff\xff\xff\x1b\xff\xff\xff\xff\xff\xff\xff\xff"
            .iter()
            .copied(),
    );
    b.extend_from_slice(&m);
    b.extend_from_slice(&(m.len() as u64).to_le_bytes());
    cases.push(("shape-overflow.zt", b, "64 bits"));

    for (name, bytes, want) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        let lib = ZtFile::open(&p).and_then(|f| f.read_dense("weight").map(|_| ()));
        let msg = lib.unwrap_err().to_string();
        assert!(msg.contains(name) && msg.contains(want), "{name}: {msg}");
        let out_path = dir.path().join(format!("{name}.safetensors"));
        let out = zimage(&["convert", s(&p), s(&out_path)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            !err.contains("panicked") && err.contains(name),
            "{name}: {err}"
        );
        assert!(!out_path.exists(), "{name}: no output");
    }
}

#[test]
fn zt_files_import_into_the_store_and_load_equal() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("transformer.zt");
    let q = f32_bytes(64 * 64, 0.0);
    let norm = bf16_bytes(64, 2.0);
    let (csr_v, csr_i, csr_p, csr_dense) = csr_case();
    let attributes: BTreeMap<_, _> = [("model_name".to_string(), "tiny".to_string())].into();
    let mut w = zt::Writer::create(
        &p,
        WriteOptions {
            attributes,
            ..Default::default()
        },
    )
    .unwrap();
    w.add_dense(
        "layers.0.attention.to_q.weight",
        ZDtype::Float32,
        &[64, 64],
        &q,
    )
    .unwrap();
    w.finish().unwrap();
    // Same file plus compressed and sparse tensors, written by the reference.
    let p2 = dir.path().join("mixed.zt");
    let mut w = ZTensorWriter::create(&p2).unwrap();
    w.add_tensor(
        "layers.0.attention.to_q.weight",
        vec![64, 64],
        DType::Float32,
        Encoding::Raw,
        q.clone(),
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_tensor(
        "norm.weight",
        vec![64],
        DType::BFloat16,
        Encoding::Zstd,
        norm.clone(),
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_csr_tensor(
        "sparse",
        vec![3, 4],
        DType::Float32,
        csr_v,
        csr_i,
        csr_p,
        Encoding::Raw,
        ChecksumAlgorithm::Crc32c,
    )
    .unwrap();
    w.add_tensor(
        "scalar",
        vec![],
        DType::Int32,
        Encoding::Raw,
        5i32.to_le_bytes().to_vec(),
        ChecksumAlgorithm::None,
    )
    .unwrap();
    w.finalize().unwrap();

    let store = Store::at(&dir.path().join("store"));
    let src = zt::ZtSource::open(&p, "transformer").unwrap();
    store
        .create("zt-plain", &src, &ImportOptions::default(), &|_| {})
        .unwrap();
    let m = store.open("zt-plain").unwrap();
    let meta = store
        .config_file(&m, "transformer/metadata.json")
        .unwrap()
        .unwrap();
    let meta: BTreeMap<String, String> = serde_json::from_slice(&meta).unwrap();
    assert_eq!(meta["model_name"], "tiny");
    let loaded = loader::load_component(&store, &m, "transformer", ReadPath::MlxLoader).unwrap();
    loaded.eval().unwrap();
    assert_eq!(
        loaded.tensors["layers.0.attention.to_q.weight"]
            .to_bytes()
            .unwrap(),
        q
    );

    let src = zt::ZtSource::open(&p2, "transformer").unwrap();
    store
        .create("zt-mixed", &src, &ImportOptions::default(), &|_| {})
        .unwrap();
    drop(src);
    let m = store.open("zt-mixed").unwrap();
    assert!(
        store
            .config_file(&m, "transformer/metadata.json")
            .unwrap()
            .is_none(),
        "no attributes, no metadata file"
    );
    let want: BTreeMap<&str, (&str, Vec<u64>, Vec<u8>)> = [
        (
            "layers.0.attention.to_q.weight",
            ("F32", vec![64, 64], q.clone()),
        ),
        ("norm.weight", ("BF16", vec![64], norm)),
        ("sparse", ("F32", vec![3, 4], csr_dense)),
        ("scalar", ("I32", vec![], 5i32.to_le_bytes().to_vec())),
    ]
    .into();
    for path in [ReadPath::MlxLoader, ReadPath::Mmap] {
        let loaded = loader::load_component(&store, &m, "transformer", path).unwrap();
        loaded.eval().unwrap();
        assert_eq!(loaded.tensors.len(), want.len());
        for (name, arr) in &loaded.tensors {
            let (dtype, shape, data) = &want[name.as_str()];
            assert_eq!(arr.dtype().name(), *dtype, "{name}");
            assert_eq!(
                arr.shape().iter().map(|&d| d as u64).collect::<Vec<_>>(),
                *shape,
                "{name}"
            );
            assert_eq!(&arr.to_bytes().unwrap(), data, "{name}");
        }
    }
    assert!(store.verify("zt-mixed").unwrap().problems.is_empty());

    // A damaged file is refused before anything is imported.
    let mut bytes = std::fs::read(&p2).unwrap();
    bytes[100] ^= 1;
    let bad = dir.path().join("damaged.zt");
    std::fs::write(&bad, bytes).unwrap();
    let e = zt::ZtSource::open(&bad, "transformer")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("damaged.zt") && e.contains("digest mismatch"),
        "{e}"
    );
}
