//! DFSN containers: the exact layout, pack → edit → verify → unpack through the library and
//! the CLI, little-endian and non-default headers, and malformed files.

mod common;

use common::{s, zimage};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use zimage::formats::dfsn::{self, ByteOrder, Container, Error, ModelType, MODEL_OFFSET};

/// A small safetensors file (one F32 tensor).
fn model_bytes() -> Vec<u8> {
    let header = br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend((0..16u8).map(|i| i.wrapping_mul(37)));
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A container by hand: `type` and the two offsets as given, metadata at `meta_at`, the model
/// at `model_at`.
fn hand_container(
    type_bytes: [u8; 2],
    offsets: [[u8; 4]; 2],
    meta_at: usize,
    meta: &[u8],
    model_at: usize,
    model: &[u8],
) -> Vec<u8> {
    let mut out = vec![0u8; model_at];
    out[..4].copy_from_slice(b"DFSN");
    out[4..6].copy_from_slice(&type_bytes);
    out[6..38].copy_from_slice(&Sha256::digest(model));
    out[0x26..0x2A].copy_from_slice(&offsets[0]);
    out[0x2A..0x2E].copy_from_slice(&offsets[1]);
    out[meta_at..meta_at + meta.len()].copy_from_slice(meta);
    out.extend_from_slice(model);
    out
}

#[test]
fn pack_writes_the_documented_layout() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_bytes();
    let model_path = write(dir.path(), "m.safetensors", &model);
    let out = dir.path().join("m.dfsn");
    let c = dfsn::pack(&model_path, &serde_json::json!({"name": "tiny"}), &out).unwrap();
    assert_eq!(c.model_type, ModelType::Safetensors);

    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len() as u64, MODEL_OFFSET + model.len() as u64);
    assert_eq!(&bytes[..4], b"DFSN");
    assert_eq!(&bytes[4..6], &[0, 2]);
    assert_eq!(&bytes[6..38], Sha256::digest(&model).as_slice());
    assert_eq!(&bytes[0x26..0x2A], &[0x00, 0x00, 0x01, 0x00]);
    assert_eq!(&bytes[0x2A..0x2E], &[0x00, 0x20, 0x01, 0x00]);
    assert!(bytes[0x2E..0x100].iter().all(|&b| b == 0));
    let json = br#"{"name":"tiny"}"#;
    assert_eq!(&bytes[0x100..0x100 + json.len()], json);
    assert!(
        bytes[0x100 + json.len()..0x200100].iter().all(|&b| b == 0),
        "NUL padding"
    );
    assert_eq!(&bytes[0x200100..], &model[..]);

    let opened = Container::open(&out).unwrap();
    assert_eq!(
        (
            opened.metadata_offset,
            opened.model_offset,
            opened.model_len
        ),
        (0x100, 0x200100, model.len() as u64)
    );
    assert_eq!(opened.byte_order, ByteOrder::Big);
    assert_eq!(opened.sha256_hex(), format!("{:x}", Sha256::digest(&model)));
    assert_eq!(opened.metadata, serde_json::json!({"name": "tiny"}));

    // A zip (ckpt) is type 1; anything else is refused.
    let ckpt = write(dir.path(), "m.ckpt", b"PK\x03\x04 pretend pickle archive");
    assert_eq!(
        dfsn::pack(&ckpt, &serde_json::json!({}), &dir.path().join("c.dfsn"))
            .unwrap()
            .model_type,
        ModelType::Ckpt
    );
    assert_eq!(
        std::fs::read(dir.path().join("c.dfsn")).unwrap()[4..6],
        [0, 1]
    );
    let text = write(dir.path(), "notes.txt", b"not a model");
    let err = dfsn::pack(&text, &serde_json::json!({}), &dir.path().join("t.dfsn")).unwrap_err();
    assert!(
        matches!(err, Error::NotAModel { .. }) && err.to_string().contains("notes.txt"),
        "{err}"
    );
    assert!(!dir.path().join("t.dfsn").exists());
}

#[test]
fn library_pack_edit_verify_unpack() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_bytes();
    let model_path = write(dir.path(), "m.safetensors", &model);
    let out = dir.path().join("m.dfsn");
    dfsn::pack(&model_path, &serde_json::json!({}), &out).unwrap();
    let before = std::fs::read(&out).unwrap();

    let meta = serde_json::json!({"title": "Tiny", "tags": ["a", "b"], "nested": {"x": 1}});
    dfsn::set_metadata(&out, &meta).unwrap();
    let after = std::fs::read(&out).unwrap();
    assert_eq!(after.len(), before.len(), "the file keeps its length");
    assert_eq!(
        after[..0x100],
        before[..0x100],
        "the header (and the stored hash) are unchanged"
    );
    assert_eq!(
        after[0x200100..],
        before[0x200100..],
        "the model bytes stay where they were"
    );
    let c = Container::open(&out).unwrap();
    assert_eq!(c.metadata, meta);
    assert_eq!(c.model_offset, MODEL_OFFSET);

    let v = dfsn::verify(&out).unwrap();
    assert!(v.ok(), "{v:?}");
    assert_eq!(v.model_len, model.len() as u64);
    let back = dir.path().join("back.safetensors");
    dfsn::unpack(&out, &back).unwrap();
    assert_eq!(std::fs::read(&back).unwrap(), model);

    // A ckpt payload has no tensor listing.
    let ckpt = write(dir.path(), "m.ckpt", b"PK\x03\x04 pretend pickle archive");
    dfsn::pack(&ckpt, &serde_json::json!({}), &dir.path().join("c.dfsn")).unwrap();
    assert!(matches!(
        dfsn::listing(&dir.path().join("c.dfsn")),
        Err(Error::NoListing { .. })
    ));
}

#[test]
fn metadata_that_does_not_fit_leaves_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = write(dir.path(), "m.safetensors", &model_bytes());
    let out = dir.path().join("m.dfsn");
    dfsn::pack(&model_path, &serde_json::json!({"keep": "me"}), &out).unwrap();
    let before = std::fs::read(&out).unwrap();

    let huge = serde_json::json!({"blob": "x".repeat(2 << 20)});
    let err = dfsn::set_metadata(&out, &huge).unwrap_err();
    assert!(matches!(err, Error::MetadataTooLarge { .. }), "{err}");
    assert!(err.to_string().contains("m.dfsn"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), before);

    // Exactly the area's size fits.
    let exact = serde_json::json!({"b": "x".repeat(0x200000 - r#"{"b":""}"#.len())});
    dfsn::set_metadata(&out, &exact).unwrap();
    assert_eq!(Container::open(&out).unwrap().metadata, exact);
    assert!(dfsn::verify(&out).unwrap().ok());
}

#[test]
fn cli_pack_meta_verify_unpack() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_bytes();
    let model_path = write(dir.path(), "m.safetensors", &model);
    let meta_path = write(dir.path(), "meta.json", br#"{"author":"me","version":1}"#);
    let out = dir.path().join("m.dfsn");

    let r = zimage(&[
        "dfsn",
        "pack",
        s(&model_path),
        "--meta",
        s(&meta_path),
        "-o",
        s(&out),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let hash_before = std::fs::read(&out).unwrap()[6..38].to_vec();

    let r = zimage(&[
        "dfsn",
        "meta",
        s(&out),
        "--set",
        "title=Tiny fox",
        "--set",
        "version=2",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let r = zimage(&["dfsn", "meta", s(&out)]);
    let printed: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(
        printed,
        serde_json::json!({"author": "me", "version": "2", "title": "Tiny fox"})
    );

    let replacement = write(dir.path(), "new.json", br#"{"only":"this"}"#);
    assert!(
        zimage(&["dfsn", "meta", s(&out), "--file", s(&replacement)])
            .status
            .success()
    );
    assert_eq!(
        Container::open(&out).unwrap().metadata,
        serde_json::json!({"only": "this"})
    );
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes[6..38], hash_before[..]);
    assert_eq!(&bytes[0x200100..], &model[..]);

    let r = zimage(&["dfsn", "verify", s(&out)]);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stdout)
    );
    let back = dir.path().join("back.safetensors");
    assert!(zimage(&["dfsn", "unpack", s(&out), "-o", s(&back)])
        .status
        .success());
    assert_eq!(std::fs::read(&back).unwrap(), model);

    // `--meta` left out stores `{}`.
    let bare = dir.path().join("bare.dfsn");
    assert!(zimage(&["dfsn", "pack", s(&model_path), "-o", s(&bare)])
        .status
        .success());
    assert_eq!(
        Container::open(&bare).unwrap().metadata,
        serde_json::json!({})
    );
}

#[test]
fn a_containers_hashes_are_its_models() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = write(dir.path(), "m.safetensors", &model_bytes());
    let out = dir.path().join("m.dfsn");
    dfsn::pack(&model_path, &serde_json::json!({"note": "x"}), &out).unwrap();
    let hashes = |p: &Path| {
        let r = zimage(&["hash", s(p), "--json"]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        serde_json::from_slice::<serde_json::Value>(&r.stdout).unwrap()
    };
    let (model, container) = (hashes(&model_path), hashes(&out));
    for key in [
        "sha256",
        "autov2",
        "legacy",
        "blake3",
        "crc32",
        "safetensors",
    ] {
        assert_eq!(model[key], container[key], "{key}");
    }
    assert_eq!(container["container"], "dfsn");
    // Changed model bytes: the stored hash no longer holds, and `hash` says so.
    let mut bytes = std::fs::read(&out).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&out, &bytes).unwrap();
    let r = zimage(&["hash", s(&out)]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("dfsn verify"));
}

#[test]
fn changed_model_bytes_fail_verify_with_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = write(dir.path(), "m.safetensors", &model_bytes());
    let out = dir.path().join("m.dfsn");
    dfsn::pack(&model_path, &serde_json::json!({}), &out).unwrap();
    let mut bytes = std::fs::read(&out).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&out, &bytes).unwrap();

    let r = zimage(&["dfsn", "verify", s(&out)]);
    assert_eq!(
        r.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&r.stdout)
    );
    assert!(String::from_utf8_lossy(&r.stdout).contains("mismatch"));
    let r = zimage(&["dfsn", "verify", s(&out), "--json"]);
    assert_eq!(r.status.code(), Some(1));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&r.stdout).unwrap()["ok"],
        false
    );

    let back = dir.path().join("back.safetensors");
    let err = dfsn::unpack(&out, &back).unwrap_err();
    assert!(matches!(err, Error::HashMismatch { .. }), "{err}");
    assert!(!back.exists(), "nothing is written on a mismatch");
    assert_eq!(
        zimage(&["dfsn", "unpack", s(&out), "-o", s(&back)])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn reads_a_little_endian_container() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_bytes();
    let bytes = hand_container(
        [2, 0],
        [0x100u32.to_le_bytes(), 0x200100u32.to_le_bytes()],
        0x100,
        b"{\"le\":true}",
        0x200100,
        &model,
    );
    let path = write(dir.path(), "le.dfsn", &bytes);
    let c = Container::open(&path).unwrap();
    assert_eq!(c.byte_order, ByteOrder::Little);
    assert_eq!(c.model_type, ModelType::Safetensors);
    assert_eq!((c.metadata_offset, c.model_offset), (0x100, 0x200100));
    assert_eq!(c.metadata, serde_json::json!({"le": true}));
    assert!(dfsn::verify(&path).unwrap().ok());
    let back = dir.path().join("back.safetensors");
    dfsn::unpack(&path, &back).unwrap();
    assert_eq!(std::fs::read(&back).unwrap(), model);

    // A big-endian type with little-endian offsets: read as big-endian those offsets fit the
    // file (0x10000 and 0x12000) but find no safetensors there, so the other reading wins.
    let mixed = hand_container(
        [0, 2],
        [0x100u32.to_le_bytes(), 0x200100u32.to_le_bytes()],
        0x100,
        b"{}",
        0x200100,
        &model,
    );
    let path = write(dir.path(), "mixed.dfsn", &mixed);
    assert_eq!(Container::open(&path).unwrap().model_offset, 0x200100);
}

#[test]
fn reads_other_consistent_offsets_and_space_padding() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_bytes();
    let mut meta = b"{\"small\": \"area\"}".to_vec();
    meta.resize(0x100, b' ');
    let bytes = hand_container(
        [0, 2],
        [0x40u32.to_be_bytes(), 0x1000u32.to_be_bytes()],
        0x40,
        &meta,
        0x1000,
        &model,
    );
    let path = write(dir.path(), "small.dfsn", &bytes);
    let c = Container::open(&path).unwrap();
    assert_eq!(
        (c.metadata_offset, c.model_offset, c.metadata_room()),
        (0x40, 0x1000, 0xFC0)
    );
    assert_eq!(c.metadata, serde_json::json!({"small": "area"}));
    assert!(dfsn::verify(&path).unwrap().ok());

    // Its metadata area is what an edit may fill, and no more.
    dfsn::set_metadata(&path, &serde_json::json!({"k": "v"})).unwrap();
    assert_eq!(std::fs::read(&path).unwrap()[0x1000..], model[..]);
    assert!(matches!(
        dfsn::set_metadata(&path, &serde_json::json!({"k": "v".repeat(0x1000)})),
        Err(Error::MetadataTooLarge { room: 0xFC0, .. })
    ));
}

#[test]
fn malformed_containers_name_the_file_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_bytes();
    let good = hand_container(
        [0, 2],
        [0x100u32.to_be_bytes(), 0x200100u32.to_be_bytes()],
        0x100,
        b"{}",
        0x200100,
        &model,
    );

    let mut bad_magic = good.clone();
    bad_magic[..4].copy_from_slice(b"DFSX");
    let mut past_eof = good.clone();
    past_eof.truncate(0x1000);
    let mut not_json = good.clone();
    not_json[0x100..0x110].copy_from_slice(b"{this is not js}");
    let mut not_object = good.clone();
    not_object[0x100..0x103].copy_from_slice(b"[1]");
    let mut bad_type = good.clone();
    bad_type[4..6].copy_from_slice(&[0, 7]);
    let mut overlap = good.clone();
    overlap[0x26..0x2A].copy_from_slice(&0x10u32.to_be_bytes());
    let mut not_utf8 = good.clone();
    not_utf8[0x100..0x104].copy_from_slice(b"{\xff\xfe}");

    let cases: [(&str, Vec<u8>, &str); 8] = [
        ("truncated.dfsn", good[..20].to_vec(), "truncated"),
        ("magic.dfsn", bad_magic, "magic"),
        ("eof.dfsn", past_eof, "past the end"),
        ("json.dfsn", not_json, "not JSON"),
        ("array.dfsn", not_object, "expected an object"),
        ("type.dfsn", bad_type, "`type`"),
        ("overlap.dfsn", overlap, "`metadata offset`"),
        ("utf8.dfsn", not_utf8, "UTF-8"),
    ];
    for (name, bytes, reason) in cases {
        let path = write(dir.path(), name, &bytes);
        let err = Container::open(&path).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains(reason), "{name}: {err}");
        for args in [
            vec!["dfsn", "meta", s(&path)],
            vec!["dfsn", "verify", s(&path)],
        ] {
            let r = zimage(&args);
            assert_eq!(r.status.code(), Some(2), "{args:?}");
            let stderr = String::from_utf8_lossy(&r.stderr);
            assert!(
                stderr.contains(name) && stderr.contains(reason),
                "{args:?}: {stderr}"
            );
        }
    }
}

#[test]
fn cli_refuses_metadata_that_cannot_be_stored() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = write(dir.path(), "m.safetensors", &model_bytes());
    let out = dir.path().join("m.dfsn");

    let big = write(
        dir.path(),
        "big.json",
        format!("{{\"x\":\"{}\"}}", "y".repeat(3 << 20)).as_bytes(),
    );
    let r = zimage(&[
        "dfsn",
        "pack",
        s(&model_path),
        "--meta",
        s(&big),
        "-o",
        s(&out),
    ]);
    assert_eq!(r.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("m.dfsn"),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(!out.exists());

    let broken = write(dir.path(), "broken.json", b"{oops");
    let r = zimage(&[
        "dfsn",
        "pack",
        s(&model_path),
        "--meta",
        s(&broken),
        "-o",
        s(&out),
    ]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("broken.json"));

    assert!(zimage(&["dfsn", "pack", s(&model_path), "-o", s(&out)])
        .status
        .success());
    let before = std::fs::read(&out).unwrap();
    let r = zimage(&["dfsn", "meta", s(&out), "--file", s(&big)]);
    assert_eq!(r.status.code(), Some(2));
    assert_eq!(std::fs::read(&out).unwrap(), before);
    assert_eq!(
        zimage(&["dfsn", "meta", s(&out), "--set", "no-equals-sign"])
            .status
            .code(),
        Some(2)
    );
}
