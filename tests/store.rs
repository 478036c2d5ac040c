//! The model store on real files: import, show, verify, load, dedup, gc, crash safety, every
//! Ollama blob generation, and malformed input.

mod common;

use common::{write_safetensors as write_st, zimage_in as zimage};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use zimage::diffusers_dir::DiffusersDir;
use zimage::loader::{self, ReadPath};
use zimage::mlx::{self, Array, Dtype as MDtype};
use zimage::safetensors::{self, Dtype, TensorSpec};
use zimage::store::{blob, ImportOptions, Layer, Manifest, ModelName, Quantization, Store};

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

/// A small diffusers directory: a sharded text encoder with an index, a transformer, a VAE,
/// configs and tokenizer files.
fn make_diffusers(dir: &Path, te_seed: f32, tr_seed: f32) {
    for c in [
        "text_encoder",
        "transformer",
        "vae",
        "scheduler",
        "tokenizer",
    ] {
        std::fs::create_dir_all(dir.join(c)).unwrap();
    }
    std::fs::write(
        dir.join("model_index.json"),
        r#"{"_class_name":"ZImagePipeline"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("scheduler/scheduler_config.json"),
        r#"{"shift":3.0}"#,
    )
    .unwrap();
    for c in ["text_encoder", "transformer", "vae"] {
        std::fs::write(
            dir.join(c).join("config.json"),
            format!(r#"{{"component":"{c}"}}"#),
        )
        .unwrap();
    }
    std::fs::write(dir.join("tokenizer/vocab.json"), r#"{"a":0}"#).unwrap();
    std::fs::write(dir.join("tokenizer/merges.txt"), "#version: 0.2\n").unwrap();
    write_st(
        &dir.join("text_encoder/model-00001-of-00002.safetensors"),
        &[
            (
                "model.embed_tokens.weight",
                Dtype::BF16,
                vec![64, 64],
                bf16_bytes(64 * 64, te_seed),
            ),
            (
                "model.layers.0.mlp.down_proj.weight",
                Dtype::BF16,
                vec![64, 128],
                bf16_bytes(64 * 128, te_seed + 1.0),
            ),
        ],
    );
    write_st(
        &dir.join("text_encoder/model-00002-of-00002.safetensors"),
        &[(
            "model.norm.weight",
            Dtype::BF16,
            vec![64],
            bf16_bytes(64, te_seed + 2.0),
        )],
    );
    std::fs::write(
        dir.join("text_encoder/model.safetensors.index.json"),
        r#"{"metadata":{"total_size":24704},"weight_map":{"model.embed_tokens.weight":"model-00001-of-00002.safetensors","model.layers.0.mlp.down_proj.weight":"model-00001-of-00002.safetensors","model.norm.weight":"model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    write_st(
        &dir.join("transformer/diffusion_pytorch_model.safetensors"),
        &[
            (
                "layers.0.attention.to_q.weight",
                Dtype::F32,
                vec![64, 64],
                f32_bytes(64 * 64, tr_seed),
            ),
            (
                "layers.0.attention_norm1.weight",
                Dtype::F32,
                vec![64],
                f32_bytes(64, tr_seed + 1.0),
            ),
            (
                "x_pad_token",
                Dtype::F32,
                vec![1, 64],
                f32_bytes(64, tr_seed + 2.0),
            ),
            ("scalar", Dtype::F32, vec![], f32_bytes(1, 3.0)),
            ("empty", Dtype::F32, vec![0, 4], vec![]),
        ],
    );
    write_st(
        &dir.join("vae/diffusion_pytorch_model.safetensors"),
        &[(
            "decoder.conv_in.weight",
            Dtype::F32,
            vec![8, 16, 3, 3],
            f32_bytes(8 * 16 * 9, 5.0),
        )],
    );
}

/// (component, name) → (dtype, shape, bytes).
type TensorBytes = BTreeMap<(String, String), (Dtype, Vec<u64>, Vec<u8>)>;

fn source_tensors(dir: &Path) -> TensorBytes {
    let d = DiffusersDir::open(dir).unwrap();
    let mut out = BTreeMap::new();
    for (c, ts) in &d.tensors {
        for t in ts {
            let bytes = std::fs::read(&t.file).unwrap();
            let data = bytes[t.offset as usize..(t.offset + t.info.nbytes()) as usize].to_vec();
            out.insert(
                (c.clone(), t.name.clone()),
                (t.info.dtype, t.info.shape.clone(), data),
            );
        }
    }
    out
}

fn blob_count(root: &Path) -> usize {
    std::fs::read_dir(root.join("blobs"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("sha256-")
        })
        .count()
}

/// The streamed digest equals sha256 of the whole file at every size the buffer treats apart:
/// empty, smaller than the smallest buffer, between, and more than one full buffer.
#[test]
fn hash_file_matches_sha256_at_every_buffer_size() {
    use sha2::{Digest, Sha256};
    let dir = tempfile::tempdir().unwrap();
    for len in [0usize, 1, 4095, 4096, 70_000, (1 << 20) + 1, 3 << 20] {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let path = dir.path().join(format!("blob-{len}"));
        std::fs::write(&path, &bytes).unwrap();
        let (digest, size) = blob::hash_file(&path).unwrap();
        assert_eq!(size, len as u64);
        assert_eq!(
            digest,
            format!("sha256:{:x}", Sha256::digest(&bytes)),
            "{len} bytes"
        );
    }
}

#[test]
fn seed_example_blob_is_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_diffusers(&src, 0.0, 0.0);
    // Replace the text encoder's second shard by the seed's example tensor (zeros).
    let n = 2560 * 9728 * 2;
    write_st(
        &src.join("text_encoder/model-00002-of-00002.safetensors"),
        &[(
            "model.norm.weight",
            Dtype::BF16,
            vec![2560, 9728],
            vec![0u8; n],
        )],
    );
    let store = Store::at(&dir.path().join("store"));
    store
        .create(
            "seed",
            &DiffusersDir::open(&src).unwrap(),
            &ImportOptions::default(),
            &|_| {},
        )
        .unwrap();
    let m = store.open("seed").unwrap();
    let layer = m
        .manifest
        .tensor_layers()
        .find(|l| l.name.as_deref() == Some("text_encoder/model.norm.weight"))
        .unwrap();
    assert_eq!(layer.size, 49_807_448);
    assert_eq!(
        (layer.dtype.as_deref(), layer.shape.clone()),
        (Some("BF16"), Some(vec![2560, 9728]))
    );
    let bytes = std::fs::read(store.blob_path(&layer.digest).unwrap()).unwrap();
    assert_eq!(bytes.len(), 49_807_448);
    assert_eq!(&bytes[..8], &80u64.to_le_bytes());
    assert_eq!(
        std::str::from_utf8(&bytes[8..88]).unwrap(),
        "{\"data\":{\"dtype\":\"BF16\",\"shape\":[2560,9728],\"data_offsets\":[0,49807360]}}       "
    );
    assert!(bytes[88..].iter().all(|&b| b == 0));
}

#[test]
fn import_show_verify_load_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_diffusers(&src, 0.0, 0.0);
    let root = dir.path().join("store");
    let out = zimage(
        &root,
        &["create", "me/tiny:v1", "--from", src.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("9 tensors"));

    let show = zimage(&root, &["show", "me/tiny:v1", "--json"]);
    assert!(show.status.success());
    let json: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(json["components"]["text_encoder"]["tensors"], 3);
    assert_eq!(
        json["components"]["transformer"]["parameters"],
        64 * 64 + 64 + 64 + 1
    );
    let list = zimage(&root, &["list"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("me/tiny:v1"));
    let verify = zimage(&root, &["verify", "me/tiny:v1"]);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );

    let store = Store::at(&root);
    let model = store.open("me/tiny:v1").unwrap();
    let configs: Vec<&str> = model
        .manifest
        .layers
        .iter()
        .filter(|l| l.is_config_file())
        .filter_map(|l| l.name.as_deref())
        .collect();
    assert!(
        configs.contains(&"transformer/config.json") && configs.contains(&"tokenizer/vocab.json")
    );
    let want = source_tensors(&src);
    for path in [ReadPath::MlxLoader, ReadPath::Mmap] {
        let mut seen = 0;
        for component in ["text_encoder", "transformer", "vae"] {
            let loaded = loader::load_component(&store, &model, component, path).unwrap();
            loaded.eval().unwrap();
            for (name, arr) in &loaded.tensors {
                let (dtype, shape, data) = &want[&(component.to_string(), name.clone())];
                assert_eq!(arr.dtype(), *dtype, "{component}/{name}");
                assert_eq!(
                    arr.shape().iter().map(|&d| d as u64).collect::<Vec<_>>(),
                    *shape
                );
                assert_eq!(&arr.to_bytes().unwrap(), data, "{component}/{name} differs");
                seen += 1;
            }
        }
        assert_eq!(seen, want.len());
    }
}

#[test]
fn dtype_conversion_and_alignment() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_diffusers(&src, 0.0, 0.0);
    let store = Store::at(&dir.path().join("store"));
    let opts = ImportOptions {
        dtype: Some(Dtype::BF16),
        align: 16384,
        ..Default::default()
    };
    store
        .create("bf", &DiffusersDir::open(&src).unwrap(), &opts, &|_| {})
        .unwrap();
    let m = store.open("bf").unwrap();
    for l in m.manifest.tensor_layers() {
        let (_, h) = blob::read_blob_header(&store.root, &l.digest).unwrap();
        assert_eq!(h.data_start() % 16384, 0);
        assert_eq!(h.tensors[0].dtype, Dtype::BF16);
    }
    let loaded = loader::load_component(&store, &m, "transformer", ReadPath::Mmap).unwrap();
    let q = loaded.tensors["layers.0.attention.to_q.weight"]
        .astype(MDtype::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let src_vals: Vec<f32> = f32_bytes(64 * 64, 0.0)
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for (a, b) in q.iter().zip(&src_vals) {
        assert_eq!(*a, half::bf16::from_f32(*b).to_f32());
    }
    assert!(store.verify("bf").unwrap().problems.is_empty());
}

#[test]
fn shared_text_encoder_is_stored_once_and_gc_frees_exactly_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    make_diffusers(&a, 0.0, 0.0);
    make_diffusers(&b, 0.0, 9.0); // same text encoder and VAE, different transformer
    let store = Store::at(&dir.path().join("store"));
    store
        .create(
            "a",
            &DiffusersDir::open(&a).unwrap(),
            &ImportOptions::default(),
            &|_| {},
        )
        .unwrap();
    let after_a = blob_count(&store.root);
    let s = store
        .create(
            "b",
            &DiffusersDir::open(&b).unwrap(),
            &ImportOptions::default(),
            &|_| {},
        )
        .unwrap();
    // b adds only its 3 differing transformer tensors (the scalar and the empty tensor are shared).
    assert_eq!(blob_count(&store.root), after_a + 3);
    assert_eq!(s.blobs_written, 3);
    assert_eq!(s.blobs_present, 6);
    let b_model = store.open("b").unwrap();
    let unshared: u64 = b_model
        .manifest
        .tensor_layers()
        .filter(|l| {
            !store
                .open("a")
                .unwrap()
                .manifest
                .digests()
                .any(|d| d == l.digest)
        })
        .map(|l| l.size)
        .sum();
    let out = zimage(&store.root, &["rm", "b"]);
    assert!(out.status.success());
    let swept = store.gc(&|| {}).unwrap();
    assert_eq!((swept.blobs, swept.bytes), (3, unshared));
    assert_eq!(blob_count(&store.root), after_a);
    assert!(store.verify("a").unwrap().problems.is_empty());
    assert!(store.open("b").is_err());
}

#[test]
fn killed_import_leaves_nothing_partial_and_a_rerun_completes() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_diffusers(&src, 0.0, 0.0);
    // Enough data that the import is still running when it is killed.
    let shard: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| (format!("big.{i}"), f32_bytes(2 << 20, i as f32)))
        .collect();
    let tensors: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = shard
        .iter()
        .map(|(n, d)| (n.as_str(), Dtype::F32, vec![2 << 20], d.clone()))
        .collect();
    write_st(
        &src.join("transformer/diffusion_pytorch_model.safetensors"),
        &tensors,
    );
    let root = dir.path().join("store");
    let mut child = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .arg("--store")
        .arg(&root)
        .args(["create", "big", "--from", src.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once it has started writing blobs.
    let start = std::time::Instant::now();
    while start.elapsed().as_secs() < 30 {
        let started = root
            .join("blobs")
            .read_dir()
            .map(|d| d.count() > 0)
            .unwrap_or(false);
        if started {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let store = Store::at(&root);
    assert!(
        store.open("big").is_err(),
        "no manifest may exist after a killed import"
    );
    // Every complete blob hashes to its name; leftovers are only temporary files.
    for e in std::fs::read_dir(root.join("blobs")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(hex) = name.strip_prefix("sha256-") {
            assert_eq!(
                blob::hash_file(&p).unwrap().0,
                format!("sha256:{hex}"),
                "corrupt blob {name}"
            );
        } else {
            assert!(
                name.starts_with(blob::PARTIAL_PREFIX),
                "unexpected file {name}"
            );
        }
    }
    let out = zimage(&root, &["create", "big", "--from", src.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(store.verify("big").unwrap().problems.is_empty());
    store.gc(&|| {}).unwrap();
    let leftovers = std::fs::read_dir(root.join("blobs"))
        .unwrap()
        .filter(|e| {
            !e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("sha256-")
        })
        .count();
    assert_eq!(leftovers, 0);
}

/// Writes one manifest by hand from (layer name, blob bytes) pairs.
fn hand_store(root: &Path, name: &str, blobs: Vec<(String, Vec<u8>)>) {
    let store = Store::at(root);
    let layers = blobs
        .into_iter()
        .map(|(n, bytes)| {
            let (digest, size, _) = blob::write_blob(root, &bytes).unwrap();
            Layer {
                media_type: "application/vnd.ollama.image.tensor".into(),
                digest,
                size,
                from: None,
                name: Some(n),
                dtype: None,
                shape: None,
            }
        })
        .collect();
    let (digest, size, _) = blob::write_blob(root, b"{}").unwrap();
    let config = Layer {
        media_type: "application/vnd.docker.container.image.v1+json".into(),
        digest,
        size,
        from: None,
        name: None,
        dtype: None,
        shape: None,
    };
    store
        .write_manifest(
            &ModelName::parse(name).unwrap(),
            &Manifest::new(config, layers),
        )
        .unwrap();
}

fn mlx_blob(dir: &Path, tensors: &[(&str, &Array)], meta: &[(&str, &str)]) -> Vec<u8> {
    let p = dir.join(format!(
        "tmp-{}.safetensors",
        tensors[0].0.replace('/', "_")
    ));
    mlx::io::save_safetensors(&p, tensors, meta).unwrap();
    std::fs::read(&p).unwrap()
}

#[test]
fn every_ollama_blob_generation_loads_to_the_same_values() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let vals: Vec<f32> = (0..128 * 64).map(|i| ((i as f32) * 0.013).sin()).collect();
    let w = Array::from_slice(&vals, &[128, 64])
        .unwrap()
        .astype(MDtype::BF16)
        .unwrap();
    let norm = Array::from_slice(&vals[..64], &[64]).unwrap();
    let name = "layers.0.attention.to_q.weight";
    let plain = |key: &str, a: &Array| {
        let dtype = a.dtype();
        let shape: Vec<u64> = a.shape().iter().map(|&d| d as u64).collect();
        let mut b = safetensors::header_bytes(
            &[TensorSpec {
                name: key.into(),
                dtype,
                shape,
            }],
            None,
            8,
        )
        .unwrap();
        b.extend(a.to_bytes().unwrap());
        b
    };
    // v1: "data"; v2: keyed by name.
    hand_store(
        &root,
        "gen/v1",
        vec![
            (format!("transformer/{name}"), plain("data", &w)),
            ("transformer/norm.weight".into(), plain("data", &norm)),
        ],
    );
    hand_store(
        &root,
        "gen/v2",
        vec![
            (format!("transformer/{name}"), plain(name, &w)),
            (
                "transformer/norm.weight".into(),
                plain("norm.weight", &norm),
            ),
        ],
    );
    // v1 quantized: three MLX-written layers keyed "data" (group 32, 8 bits).
    let (q, s, b) = mlx::ops::quantize(&w, 32, 8).unwrap();
    hand_store(
        &root,
        "gen/v1q",
        vec![
            (
                format!("transformer/{name}"),
                mlx_blob(dir.path(), &[("data", &q)], &[]),
            ),
            (
                format!("transformer/{name}_scale"),
                mlx_blob(dir.path(), &[("data", &s)], &[]),
            ),
            (
                format!("transformer/{name}_qbias"),
                mlx_blob(dir.path(), &[("data", &b)], &[]),
            ),
            (
                "transformer/norm.weight".into(),
                mlx_blob(dir.path(), &[("data", &norm)], &[]),
            ),
        ],
    );
    // v2 quantized: one MLX-written blob with `.scale`/`.bias` and metadata (group 64, 8 bits).
    let (q2, s2, b2) = mlx::ops::quantize(&w, 64, 8).unwrap();
    let full = format!("transformer/{name}");
    hand_store(
        &root,
        "gen/v2q",
        vec![
            (
                full.clone(),
                mlx_blob(
                    dir.path(),
                    &[
                        (&full, &q2),
                        (&format!("{full}.scale"), &s2),
                        (&format!("{full}.bias"), &b2),
                    ],
                    &[("quant_type", "int8"), ("group_size", "64")],
                ),
            ),
            (
                "transformer/norm.weight".into(),
                plain("norm.weight", &norm),
            ),
        ],
    );
    // v2 in the float modes Ollama also wrote: `.scale` bytes and no `.bias`.
    for (model, quant_type, group, bits, mode) in [
        ("gen/v2nvfp4", "nvfp4", 16, 4, mlx::QuantMode::Nvfp4),
        ("gen/v2mxfp8", "mxfp8", 32, 8, mlx::QuantMode::Mxfp8),
    ] {
        let q = mlx::QuantizedTensor::quantize(&w, group, bits, mode).unwrap();
        hand_store(
            &root,
            model,
            vec![
                (
                    full.clone(),
                    mlx_blob(
                        dir.path(),
                        &[(&full, &q.weight), (&format!("{full}.scale"), &q.scales)],
                        &[
                            ("quant_type", quant_type),
                            ("group_size", &group.to_string()),
                        ],
                    ),
                ),
                (
                    "transformer/norm.weight".into(),
                    plain("norm.weight", &norm),
                ),
            ],
        );
        let m = Store::at(&root).open(model).unwrap();
        let loaded =
            loader::load_component(&Store::at(&root), &m, "transformer", ReadPath::MlxLoader)
                .unwrap();
        let kept = &loaded.quantized[name];
        assert_eq!(
            (kept.mode, kept.group_size, kept.bits, kept.shape()),
            (mode, group, bits, vec![128, 64]),
            "{model}"
        );
    }
    let store = Store::at(&root);
    let reference = w.astype(MDtype::F32).unwrap().to_vec::<f32>().unwrap();
    for (model, tol) in [
        ("gen/v1", 0.0),
        ("gen/v2", 0.0),
        ("gen/v1q", 0.01),
        ("gen/v2q", 0.01),
        ("gen/v2nvfp4", 0.17),
        ("gen/v2mxfp8", 0.1),
    ] {
        let m = store.open(model).unwrap();
        let arrays = loader::load_component(&store, &m, "transformer", ReadPath::MlxLoader)
            .unwrap()
            .into_arrays()
            .unwrap();
        assert_eq!(
            arrays.len(),
            2,
            "{model}: {:?}",
            arrays.keys().collect::<Vec<_>>()
        );
        let got = arrays[name]
            .astype(MDtype::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let worst = got
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst <= tol, "{model}: max difference {worst}");
        assert_eq!(
            arrays["norm.weight"].to_vec::<f32>().unwrap(),
            vals[..64].to_vec(),
            "{model}"
        );
    }
    // The structural view lists what each blob holds under the names inside the component.
    let listing = zimage::formats::listing_of_model(
        &store,
        &store.open("gen/v2q").unwrap(),
        Some("transformer"),
    )
    .unwrap();
    let names: Vec<&str> = listing.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            name.to_string(),
            format!("{name}.bias"),
            format!("{name}.scale"),
            "norm.weight".into()
        ]
    );
    // A plain `.bias` tensor in a v2 blob of its own is a main tensor, not a quantization companion.
    let bias = Array::from_slice(&vals[..64], &[64]).unwrap();
    hand_store(
        &root,
        "gen/v2b",
        vec![("transformer/proj.bias".into(), plain("proj.bias", &bias))],
    );
    let summary = zimage::store::summarize(&store, &store.open("gen/v2b").unwrap()).unwrap();
    assert_eq!(
        (
            summary["transformer"].tensors,
            summary["transformer"].parameters
        ),
        (1, 64)
    );
}

#[test]
fn quantized_import_follows_ollamas_rules() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_diffusers(&src, 0.0, 0.0);
    let store = Store::at(&dir.path().join("store"));
    let opts = ImportOptions {
        quantize: Some(Quantization::Int8),
        ..Default::default()
    };
    store
        .create("q", &DiffusersDir::open(&src).unwrap(), &opts, &|_| {})
        .unwrap();
    let m = store.open("q").unwrap();
    let te = loader::load_component(&store, &m, "text_encoder", ReadPath::MlxLoader).unwrap();
    // Linear weights quantized; embeddings and norms left alone.
    assert!(te
        .quantized
        .contains_key("model.layers.0.mlp.down_proj.weight"));
    assert!(
        te.tensors.contains_key("model.embed_tokens.weight")
            && te.tensors.contains_key("model.norm.weight")
    );
    let tr = loader::load_component(&store, &m, "transformer", ReadPath::MlxLoader).unwrap();
    assert!(tr.quantized.contains_key("layers.0.attention.to_q.weight"));
    let vae = loader::load_component(&store, &m, "vae", ReadPath::MlxLoader).unwrap();
    assert!(vae.quantized.is_empty());
    let arrays = tr.into_arrays().unwrap();
    let got = arrays["layers.0.attention.to_q.weight"]
        .astype(MDtype::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let src_vals: Vec<f32> = f32_bytes(64 * 64, 0.0)
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let worst = got
        .iter()
        .zip(&src_vals)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst < 0.01, "int8 round trip error {worst}");
    assert!(store.verify("q").unwrap().problems.is_empty());
}

#[test]
fn malformed_input_gets_a_clear_error_and_a_nonzero_exit() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_diffusers(&src, 0.0, 0.0);
    let root = dir.path().join("store");
    assert!(
        zimage(&root, &["create", "ok", "--from", src.to_str().unwrap()])
            .status
            .success()
    );
    let store = Store::at(&root);
    let m = store.open("ok").unwrap();
    let layer = |suffix: &str| {
        m.manifest
            .tensor_layers()
            .find(|l| l.name.as_deref().unwrap().ends_with(suffix))
            .unwrap()
            .clone()
    };

    // A name reaching outside the store.
    let out = zimage(&root, &["show", "../../etc/passwd"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid model name"));
    // A missing model.
    let out = zimage(&root, &["show", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`nope` not found"));

    // A truncated blob: verify names the layer and fails; loading names the blob.
    let l = layer("to_q.weight");
    let p = store.blob_path(&l.digest).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
    let out = zimage(&root, &["verify", "ok"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("layers.0.attention.to_q.weight"));
    let err = loader::load_component(&store, &m, "transformer", ReadPath::MlxLoader)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains(&l.digest) && err.contains("describes"),
        "{err}"
    );
    std::fs::write(&p, &bytes).unwrap();

    // A bad header and an unknown dtype.
    let l = layer("norm1.weight");
    let p = store.blob_path(&l.digest).unwrap();
    let good = std::fs::read(&p).unwrap();
    let mut bad = good.clone();
    bad[8] = b'[';
    std::fs::write(&p, &bad).unwrap();
    let err = loader::load_component(&store, &m, "transformer", ReadPath::MlxLoader)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains(&l.digest) && err.contains("JSON"), "{err}");
    let text = String::from_utf8(good.clone()).unwrap_or_default();
    let _ = text;
    let mut unknown = good.clone();
    let pos = unknown.windows(3).position(|w| w == b"F32").unwrap();
    unknown[pos..pos + 3].copy_from_slice(b"Q32");
    std::fs::write(&p, &unknown).unwrap();
    let err = loader::load_component(&store, &m, "transformer", ReadPath::MlxLoader)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("unknown dtype `Q32`"), "{err}");
    std::fs::write(&p, &good).unwrap();

    // A wrong digest: the bytes do not hash to the blob's name.
    let l = layer("x_pad_token");
    let p = store.blob_path(&l.digest).unwrap();
    let mut wrong = std::fs::read(&p).unwrap();
    let last = wrong.len() - 1;
    wrong[last] ^= 0xff;
    std::fs::write(&p, &wrong).unwrap();
    let out = zimage(&root, &["verify", "ok"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("hashes to"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A malformed manifest digest never becomes a path.
    let mpath = root.join("manifests/registry.ollama.ai/library/ok/latest");
    let text = std::fs::read_to_string(&mpath)
        .unwrap()
        .replacen("sha256:", "sha256:../../", 1);
    std::fs::write(&mpath, text).unwrap();
    let out = zimage(&root, &["show", "ok"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid digest"));

    // A source directory that is not a model.
    let out = zimage(
        &root,
        &["create", "x", "--from", dir.path().to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model_index.json"));
    let _: PathBuf = root;
}
