//! Model hashes against published vectors and independent computations, and `zimage hash`.

mod common;

use common::zimage;
use sha2::{Digest, Sha256};
use std::path::Path;
use zimage::formats::model_hash::{hash_file, ModelHashes};
use zimage::store::{blob, Layer, Manifest, ModelName, Store};

fn sha_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Bytes that differ everywhere, so that a range off by one shows.
fn noise(n: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A safetensors file: `header` JSON (padded to `header_len` with spaces when given), then `data`.
fn safetensors(header: &str, header_len: Option<usize>, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    if let Some(n) = header_len {
        h.resize(n, b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

fn hash_bytes(dir: &Path, name: &str, bytes: &[u8]) -> ModelHashes {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    hash_file(&path).unwrap()
}

#[test]
fn hello_world_matches_civitais_scanner_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let h = hash_bytes(dir.path(), "hello.txt", b"hello world");
    assert_eq!(h.size, 11);
    assert_eq!(
        h.sha256,
        "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
    );
    assert_eq!(
        h.sha256.to_uppercase(),
        "B94D27B9934D3E08A52E52D7DA7DABFAC484EFE37A5380EE9088F7ACE2EFCDE9"
    );
    assert_eq!(h.autov2, "b94d27b993");
    assert_eq!(h.civitai_autov2, "B94D27B993");
    assert_eq!(h.civitai_autov1, None);
    assert_eq!(
        h.blake3,
        "D74981EFA70A0C880B8D8C1985D075DBCBF679B99A5F9914E5AAF96B831A9E24"
    );
    assert_eq!(h.crc32, "85114A0D");
    // Under 1 MiB A1111 hashes nothing.
    assert_eq!(h.legacy, "e3b0c442");
    assert_eq!(h.safetensors, None);
}

#[test]
fn legacy_hash_reads_the_64_kib_after_the_first_mib() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = noise(0x120000);
    let h = hash_bytes(dir.path(), "big.ckpt", &bytes);
    assert_eq!(h.legacy, sha_hex(&bytes[0x100000..0x110000])[..8]);
    assert_eq!(
        h.civitai_autov1, None,
        "Civitai shows no AutoV1 under 2 MiB"
    );
    assert_eq!(h.sha256, sha_hex(&bytes));

    // A file ending inside the range hashes what is there.
    let short = &bytes[..0x104000];
    assert_eq!(
        hash_bytes(dir.path(), "short.ckpt", short).legacy,
        sha_hex(&short[0x100000..])[..8]
    );

    // From 2 MiB on Civitai shows it, in upper case; the file spans several read chunks.
    let long = noise((9 << 20) + 123);
    let h = hash_bytes(dir.path(), "long.ckpt", &long);
    let legacy = sha_hex(&long[0x100000..0x110000])[..8].to_string();
    assert_eq!(h.legacy, legacy);
    assert_eq!(h.civitai_autov1, Some(legacy.to_uppercase()));
    assert_eq!(h.sha256, sha_hex(&long));
    assert_eq!(h.blake3, blake3::hash(&long).to_hex().to_uppercase());
    assert_eq!(
        h.crc32,
        format!("{:08X}", crc32fast::hash(&long).swap_bytes())
    );
}

#[test]
fn addnet_hash_covers_everything_after_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let data = noise(64);
    let bytes = safetensors(
        r#"{"w":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}}"#,
        Some(64),
        &data,
    );
    let h = hash_bytes(dir.path(), "lora.safetensors", &bytes);
    let st = h.safetensors.clone().unwrap();
    assert_eq!(st.header_len, 64);
    assert_eq!(st.addnet, sha_hex(&data));
    assert_eq!(st.civitai_autov3_full, sha_hex(&data).to_uppercase());
    assert_eq!(st.civitai_autov3, sha_hex(&data)[..12].to_uppercase());
    assert_eq!(st.a1111_lora_hash, st.addnet);
    assert_eq!(st.sshs_model_hash, None);
    let rows = h.rows();
    assert!(
        rows.contains(&("A1111 LoRA hash", sha_hex(&data)[..12].to_string())),
        "{rows:?}"
    );
    assert!(!rows.iter().any(|(l, _)| *l == "Civitai AutoV3 (full)"));
}

#[test]
fn embedded_sshs_model_hash_is_shown_beside_the_real_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = noise(8);
    // ai-toolkit wrote sha256("") here; A1111 believes it anyway.
    let empty = sha_hex(b"");
    let header = format!(
        r#"{{"__metadata__":{{"sshs_model_hash":"{empty}","sshs_legacy_hash":"abcd1234"}},"w":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}}}"#
    );
    let h = hash_bytes(
        dir.path(),
        "lora.safetensors",
        &safetensors(&header, None, &data),
    );
    let st = h.safetensors.clone().unwrap();
    assert_eq!(st.sshs_model_hash.as_deref(), Some(empty.as_str()));
    assert_eq!(st.sshs_legacy_hash.as_deref(), Some("abcd1234"));
    assert_eq!(st.a1111_lora_hash, empty);
    assert_eq!(st.addnet, sha_hex(&data));
    let rows = h.rows();
    assert!(
        rows.contains(&(
            "sshs_model_hash",
            format!("{empty} (differs from the addnet hash)")
        )),
        "{rows:?}"
    );
    assert!(rows.contains(&("addnet hash", sha_hex(&data))));
}

#[test]
fn civitai_scanner_hashes_from_byte_8_when_the_header_is_16_mib() {
    let dir = tempfile::tempdir().unwrap();
    let data = noise(32);
    let bytes = safetensors(
        r#"{"w":{"dtype":"U8","shape":[32],"data_offsets":[0,32]}}"#,
        Some(16 << 20),
        &data,
    );
    let st = hash_bytes(dir.path(), "big-header.safetensors", &bytes)
        .safetensors
        .unwrap();
    assert_eq!(st.addnet, sha_hex(&data));
    assert_eq!(st.civitai_autov3_full, sha_hex(&bytes[8..]).to_uppercase());
    assert_eq!(st.civitai_autov3, st.civitai_autov3_full[..12]);
}

#[test]
fn hash_command_prints_rows_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hello.txt");
    std::fs::write(&path, b"hello world").unwrap();
    let p = path.to_str().unwrap();

    let out = zimage(&["hash", p]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("CRC32 (Civitai)") && text.contains("85114A0D"),
        "{text}"
    );

    let out = zimage(&["hash", p, "--json"]);
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["file"], p);
    assert_eq!(json["autov2"], "b94d27b993");
    assert_eq!(json["civitai_autov1"], serde_json::Value::Null);

    let out = zimage(&[
        "hash",
        dir.path().join("missing").to_str().unwrap(),
        "--store",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn hash_of_a_stored_model_is_its_identity() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let layer = |name: &str, bytes: &[u8]| {
        let (digest, size, _) = blob::write_blob(root, bytes).unwrap();
        Layer {
            media_type: "application/vnd.ollama.image.tensor".into(),
            digest,
            size,
            from: None,
            name: Some(name.into()),
            dtype: None,
            shape: None,
        }
    };
    let mut config = layer("", b"{}");
    config.media_type = "application/vnd.docker.container.image.v1+json".into();
    config.name = None;
    let manifest = Manifest::new(
        config,
        vec![layer("vae/w", b"one"), layer("transformer/w", b"two")],
    );
    Store::at(root)
        .write_manifest(&ModelName::parse("tiny").unwrap(), &manifest)
        .unwrap();
    let model = Store::at(root).open("tiny").unwrap();

    let out = zimage(&["--store", root.to_str().unwrap(), "hash", "tiny", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["model_identity"], manifest.model_identity());
    assert_eq!(json["manifest_digest"], model.manifest_digest);

    let out = zimage(&[
        "--store",
        root.to_str().unwrap(),
        "hash",
        "tiny",
        "--component",
        "vae",
    ]);
    assert_eq!(out.status.code(), Some(2), "--component needs --structural");
}
