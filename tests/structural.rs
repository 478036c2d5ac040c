//! weight-inspect compatibility on real files: the golden hash, metadata canonicalisation,
//! zero-size tensors, the `id` and `diff` renderings byte for byte, and `zimage diff` against
//! files and a stored model, malformed input included.

mod common;

use common::zimage_in as zimage;
use std::path::{Path, PathBuf};
use zimage::diffusers_dir::DiffusersDir;
use zimage::formats::structural::{self, Artifact};
use zimage::formats::{listing_of_file, Listing};
use zimage::store::{ImportOptions, Store};

const TINY: &str = "models/z-image-tiny";
const TINY_TRANSFORMER: &str =
    "models/z-image-tiny/transformer/diffusion_pytorch_model.safetensors";

/// Writes a safetensors file with exactly this header text, followed by `data_len` zero bytes.
fn write_raw(path: &Path, header: &str, data_len: usize) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + data_len, 0);
    std::fs::write(path, bytes).unwrap();
}

fn artifact_of(path: &Path) -> Artifact {
    Artifact::from_listing(&listing_of_file(path).unwrap())
}

/// The documented golden example, with its header keys out of order.
fn golden_file(dir: &Path) -> PathBuf {
    let path = dir.join("golden.safetensors");
    write_raw(
        &path,
        r#"{"b.bias":{"dtype":"F16","shape":[3],"data_offsets":[24,30]},"__metadata__":{"note":"x","format":"pt"},"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}  "#,
        30,
    );
    path
}

#[test]
fn golden_canonical_json_and_hash() {
    let dir = tempfile::tempdir().unwrap();
    let a = artifact_of(&golden_file(dir.path()));
    assert_eq!(
        a.canonical_json(),
        r#"{"format":"safetensors","metadata":{"format":"\"pt\"","note":"\"x\""},"tensors":{"a.weight":{"name":"a.weight","dtype":"f32","shape":[2,3],"byte_length":24},"b.bias":{"name":"b.bias","dtype":"f16","shape":[3],"byte_length":6}}}"#
    );
    assert_eq!(
        a.hash(),
        "7d22ce7f2e131b433e24684d4ff9592bf08a0e5e27ff92381d67f309e3f13378"
    );
    assert_eq!(a.id(), "wi:safetensors:0:7d22ce7f");
}

#[test]
fn id_renderings() {
    let dir = tempfile::tempdir().unwrap();
    let a = artifact_of(&golden_file(dir.path()));
    assert_eq!(
        structural::render_id_text(&a),
        "Structural identity\n\
         ──────────────────\n\
         ID:        wi:safetensors:0:7d22ce7f\n\
         Stable:    yes (machine independent)\n\
         Includes:  header, tensor names, shapes, dtypes\n\
         Excludes:  raw weight bytes\n\
         \n\
         format: Safetensors\n\
         structural_hash: 7d22ce7f2e131b433e24684d4ff9592bf08a0e5e27ff92381d67f309e3f13378\n\
         tensor_count: 2\n\
         metadata_count: 2\n"
    );
    assert_eq!(
        structural::render_id_json(&a),
        "{\n  \"schema\": 1,\n  \"format\": \"safetensors\",\n  \"structural_hash\": \"7d22ce7f2e131b433e24684d4ff9592bf08a0e5e27ff92381d67f309e3f13378\",\n  \"tensor_count\": 2,\n  \"metadata_count\": 2\n}\n"
    );
}

#[test]
fn metadata_values_are_canonicalised() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.safetensors");
    let header = concat!(
        r#"{"__metadata__":{"s":"q\"b\\s\n\r\t\u0001\u007f é","i":-12,"big":18446744073709551615,"f":0.25,"#,
        r#""t":true,"n":null,"o":{"z":[1,{"y":2,"x":"s"}],"a":false},"arr":[3, 2.5, "w"]},"#,
        r#""w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}"#
    );
    write_raw(&path, header, 2);
    let json = artifact_of(&path).canonical_json();
    let expected_metadata = concat!(
        r#""metadata":{"arr":"\"[3,2.5,\\\"w\\\"]\"","big":"4895412794951729152","f":"4598175219545276416","i":"-12","#,
        r#""n":"null","o":"\"{\\\"a\\\":false,\\\"z\\\":[1,{\\\"x\\\":\\\"s\\\",\\\"y\\\":2}]}\"","#,
        r#""s":"\"q\\\"b\\\\s\\n\\r\\t\\u0001\\u007f é\"","t":"true"}"#
    );
    assert!(json.contains(expected_metadata), "{json}");
}

/// Hashes that weight-inspect v0.1.0 printed for the same bytes: every metadata kind (escapes
/// incl. \b, \f and DEL, -0.0, 1e300, u64::MAX, a repeated nested key), an odd dtype, extra
/// data offsets; and the tiny transformer.
#[test]
fn hashes_agree_with_weight_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let header = concat!(
        r#"{"__metadata__":{"s":"q\"b\\s\n\r\t\u0001\u007f é\u0008\u000c","i":-12,"big":18446744073709551615,"f":0.25,"#,
        r#""g":1e300,"h":-0.0,"t":true,"n":null,"o":{"z":[1,{"y":2,"x":"s"}],"a":false,"a":true},"arr":[3, 2.5, "w", 1.0, 1e-7]},"#,
        r#""w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"x":{"dtype":"weird_Type","shape":[],"data_offsets":[2,4,9]}}"#
    );
    write_raw(&path, header, 4);
    assert_eq!(
        artifact_of(&path).hash(),
        "30cd0bd72a4f01fe23375440fcb6d56f5037e19d19536571a891b1a8cba803df"
    );
    assert_eq!(
        artifact_of(Path::new(TINY_TRANSFORMER)).hash(),
        "5852f46dc9157d7b9cf0331c2e83f23335cdf88763e5b45a00763042c9cd896c"
    );
}

#[test]
fn zero_size_tensors_hash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zero.safetensors");
    write_raw(
        &path,
        r#"{"empty":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"one":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        4,
    );
    let a = artifact_of(&path);
    assert_eq!(
        a.canonical_json(),
        r#"{"format":"safetensors","metadata":{},"tensors":{"empty":{"name":"empty","dtype":"f32","shape":[0,4],"byte_length":0},"one":{"name":"one","dtype":"f32","shape":[1],"byte_length":4}}}"#
    );
    let id = a.id();
    assert!(
        id.starts_with("wi:safetensors:0:")
            && id.len() == 25
            && id[17..].chars().all(|c| c.is_ascii_hexdigit())
    );
    assert_eq!(&id[17..], &a.hash()[..8]);
}

/// A: a.weight f32[2,3], b.bias, c.gone, e.bytes 4 bytes; metadata format, note "x", old.
/// B: a.weight f16[3,2], b.bias, d.new, e.bytes 8 bytes; metadata format, note "y", new.
fn diff_pair(dir: &Path) -> (PathBuf, PathBuf) {
    let a = dir.join("a.safetensors");
    let b = dir.join("b.safetensors");
    write_raw(
        &a,
        r#"{"__metadata__":{"format":"pt","note":"x","old":1},"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b.bias":{"dtype":"F16","shape":[3],"data_offsets":[24,30]},"c.gone":{"dtype":"F32","shape":[4],"data_offsets":[30,46]},"e.bytes":{"dtype":"F32","shape":[1],"data_offsets":[46,50]}}"#,
        50,
    );
    write_raw(
        &b,
        r#"{"__metadata__":{"format":"pt","note":"y","new":true},"a.weight":{"dtype":"F16","shape":[3,2],"data_offsets":[0,12]},"b.bias":{"dtype":"F16","shape":[3],"data_offsets":[12,18]},"d.new":{"dtype":"U8","shape":[2],"data_offsets":[18,20]},"e.bytes":{"dtype":"F32","shape":[1],"data_offsets":[20,28]}}"#,
        28,
    );
    (a, b)
}

fn diff_of(a: &Path, b: &Path) -> structural::StructuralDiff {
    structural::diff(&artifact_of(a), &artifact_of(b))
}

const TEXT_DIFFERENT: &str = "DIFFERENT\n\
--------------------\n\
Added tensors:    1\n\
Removed tensors: 1\n\
Modified tensors: 2\n\
Structural ID:    changed\n";

const TEXT_VERBOSE_TAIL: &str = "\n\
Tensor changes\n\
─────────────\n  \
a.weight\n    \
dtype: f32 -> f16\n    \
shape: [2, 3] -> [3, 2]\n  \
e.bytes\n";

const MD_DIFFERENT: &str = "## Structural Diff\n\
\n\
**Status:** [DIFFERENT]\n\
\n\
| Change Type | Count |\n\
|-------------|-------|\n\
| Added tensors | 1 |\n\
| Removed tensors | 1 |\n\
| Modified tensors | 2 |\n\
\n\
### Added tensors\n\
```\n\
+ d.new\n\
```\n\
### Removed tensors\n\
```\n\
- c.gone\n\
```\n\
### Modified tensors\n\
```\n\
~ a.weight\n  \
dtype: f32 → f16\n  \
shape: [2, 3] → [3, 2]\n\
~ e.bytes\n\
```\n";

const JSON_DIFFERENT: &str = r#"{
  "schema": 1,
  "format_equal": true,
  "hash_equal": false,
  "tensor_count_equal": true,
  "metadata_count_equal": true,
  "metadata_added": [
    "new"
  ],
  "metadata_removed": [
    "old"
  ],
  "metadata_changed": [
    {
      "key": "note",
      "old_value": "\"x\"",
      "new_value": "\"y\""
    }
  ],
  "tensors_added": [
    "d.new"
  ],
  "tensors_removed": [
    "c.gone"
  ],
  "tensor_changes": [
    {
      "name": "a.weight",
      "dtype_old": "f32",
      "dtype_new": "f16",
      "shape_old": [
        2,
        3
      ],
      "shape_new": [
        3,
        2
      ],
      "byte_length_old": 24,
      "byte_length_new": 12
    },
    {
      "name": "e.bytes",
      "dtype_old": null,
      "dtype_new": null,
      "shape_old": null,
      "shape_new": null,
      "byte_length_old": 4,
      "byte_length_new": 8
    }
  ]
}
"#;

const TEXT_IDENTICAL: &str = "IDENTICAL\n\
--------------------\n\
No structural differences found.\n\
Structural ID:    unchanged\n";

const MD_IDENTICAL: &str = "## Structural Diff\n\
\n\
**Status:** [IDENTICAL]\n\
\n\
| Change Type | Count |\n\
|-------------|-------|\n\
| Added tensors | 0 |\n\
| Removed tensors | 0 |\n\
| Modified tensors | 0 |\n\
\n";

#[test]
fn diff_renderings_with_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = diff_pair(dir.path());
    let d = diff_of(&a, &b);
    assert_eq!(structural::render_diff_text(&d, false), TEXT_DIFFERENT);
    assert_eq!(
        structural::render_diff_text(&d, true),
        format!("{TEXT_DIFFERENT}{TEXT_VERBOSE_TAIL}")
    );
    assert_eq!(structural::render_diff_markdown(&d), MD_DIFFERENT);
    assert_eq!(structural::render_diff_json(&d), JSON_DIFFERENT);
}

#[test]
fn diff_renderings_identical() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = diff_pair(dir.path());
    let d = diff_of(&a, &a);
    assert!(!d.has_changes());
    assert_eq!(structural::render_diff_text(&d, true), TEXT_IDENTICAL);
    assert_eq!(structural::render_diff_markdown(&d), MD_IDENTICAL);
    let json: serde_json::Value = serde_json::from_str(&structural::render_diff_json(&d)).unwrap();
    assert_eq!(json["hash_equal"], true);
    assert_eq!(json["tensor_changes"], serde_json::json!([]));
}

#[test]
fn a_ztensor_file_compares_with_its_safetensors_source() {
    let dir = tempfile::tempdir().unwrap();
    let a = golden_file(dir.path());
    let zt = dir.path().join("a.zt");
    let out = zimage(
        &dir.path().join("store"),
        &[
            "convert",
            a.to_str().unwrap(),
            zt.to_str().unwrap(),
            "--compress",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let other: Listing = listing_of_file(&zt).unwrap();
    assert_eq!(other.format, "ztensor");
    let d = structural::diff(&artifact_of(&a), &Artifact::from_listing(&other));
    assert!(
        !d.has_changes() && !d.format_equal && !d.hash_equal,
        "{d:?}"
    );
    assert!(structural::render_diff_text(&d, false)
        .ends_with("Format:           differs\nStructural ID:    changed\n"));
    let out = zimage(
        &dir.path().join("store"),
        &[
            "diff",
            a.to_str().unwrap(),
            zt.to_str().unwrap(),
            "--fail-on-diff",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

// The command line.

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn tiny_store(dir: &Path) -> PathBuf {
    let root = dir.join("store");
    let store = Store::at(&root);
    store
        .create(
            "z-image-tiny-test",
            &DiffusersDir::open(Path::new(TINY)).unwrap(),
            &ImportOptions::default(),
            &|_| {},
        )
        .unwrap();
    root
}

#[test]
fn cli_file_against_stored_component() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny_store(dir.path());

    let out = zimage(
        &root,
        &[
            "diff",
            TINY_TRANSFORMER,
            "z-image-tiny-test",
            "--component",
            "transformer",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), TEXT_IDENTICAL);
    // The file's `__metadata__` has no counterpart in the store, and the note says so.
    assert!(
        text(&out.stderr).contains("no file metadata"),
        "{}",
        text(&out.stderr)
    );

    let out = zimage(
        &root,
        &[
            "diff",
            "z-image-tiny-test",
            TINY_TRANSFORMER,
            "--component",
            "transformer",
            "--json",
            "--fail-on-diff",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (json["schema"].as_u64(), json["hash_equal"].as_bool()),
        (Some(1), Some(true))
    );

    // One dtype changed in place: the header keeps its length (`"BF16"` → `"F16" `).
    let bytes = std::fs::read(TINY_TRANSFORMER).unwrap();
    let at = bytes.windows(6).position(|w| w == b"\"BF16\"").unwrap();
    let mut modified = bytes.clone();
    modified[at..at + 6].copy_from_slice(b"\"F16\" ");
    let path = dir.path().join("modified.safetensors");
    std::fs::write(&path, modified).unwrap();
    let p = path.to_str().unwrap();

    let out = zimage(
        &root,
        &["diff", TINY_TRANSFORMER, p, "--fail-on-diff", "--verbose"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("DIFFERENT\n") && stdout.contains("Modified tensors: 1\n"),
        "{stdout}"
    );
    assert!(stdout.contains("    dtype: bf16 -> f16\n"), "{stdout}");

    let out = zimage(
        &root,
        &[
            "diff",
            "z-image-tiny-test",
            p,
            "--component",
            "transformer",
            "--fail-on-diff",
            "--format",
            "md",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("**Status:** [DIFFERENT]"));

    let out = zimage(&root, &["diff", TINY_TRANSFORMER, p]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a difference without --fail-on-diff is a success"
    );
}

#[test]
fn cli_two_files() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = diff_pair(dir.path());
    let store = dir.path().join("store");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());

    let out = zimage(&store, &["diff", a, b, "--verbose"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("{TEXT_DIFFERENT}{TEXT_VERBOSE_TAIL}")
    );
    let out = zimage(&store, &["diff", a, b, "--json", "--only-changes"]);
    assert_eq!(text(&out.stdout), JSON_DIFFERENT);
    let out = zimage(&store, &["diff", a, b, "--format", "md"]);
    assert_eq!(text(&out.stdout), MD_DIFFERENT);
    let out = zimage(&store, &["diff", a, a, "--fail-on-diff"]);
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), TEXT_IDENTICAL.to_string())
    );

    let out = zimage(&store, &["diff", a, b, "--format", "xml"]);
    assert_eq!(out.status.code(), Some(2), "clap rejects an unknown format");
    let out = zimage(&store, &["diff", a, b, "--component", "transformer"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--component"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn cli_malformed_files_exit_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let (good, _) = diff_pair(dir.path());
    let bytes = std::fs::read(&good).unwrap();

    let mut overflow = u64::MAX.to_le_bytes().to_vec();
    overflow.extend_from_slice(b"{}");
    let mut bad_json = 8u64.to_le_bytes().to_vec();
    bad_json.extend_from_slice(b"{\"a\":[1}");
    let mut bad_tensor = Vec::new();
    let header = r#"{"w":{"dtype":"F32","shape":[1,-1],"data_offsets":[0,4]}}"#;
    bad_tensor.extend_from_slice(&(header.len() as u64).to_le_bytes());
    bad_tensor.extend_from_slice(header.as_bytes());
    bad_tensor.extend_from_slice(&[0; 4]);
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("truncated.safetensors", bytes[..5].to_vec(), ""),
        ("cut.safetensors", bytes[..40].to_vec(), ""),
        ("overflow.safetensors", overflow, ""),
        ("badjson.safetensors", bad_json, "not JSON"),
        (
            "badtensor.safetensors",
            bad_tensor,
            "tensor `w`: field `shape`",
        ),
    ];
    for (name, content, says) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        let out = zimage(
            &store,
            &["diff", good.to_str().unwrap(), path.to_str().unwrap()],
        );
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(
            stderr.contains(name) && stderr.contains(says),
            "{name}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}");
    }
}

#[test]
fn reader_errors_name_the_file() {
    let path = Path::new("x/y.safetensors");
    let read = |bytes: &[u8]| {
        structural::read_safetensors_listing(&mut &bytes[..], bytes.len() as u64, path)
            .unwrap_err()
            .to_string()
    };
    let mut overflow = u64::MAX.to_le_bytes().to_vec();
    overflow.extend_from_slice(b"{}");
    assert_eq!(
        read(&overflow),
        "`x/y.safetensors`: header length 18446744073709551615 exceeds the 104857600-byte limit"
    );
    assert_eq!(
        read(b"abc"),
        "`x/y.safetensors`: file is 3 bytes, too small for the 8-byte header length"
    );
    let mut past = 64u64.to_le_bytes().to_vec();
    past.extend_from_slice(b"{}");
    assert_eq!(
        read(&past),
        "`x/y.safetensors`: header length 64 runs past the end of the 10-byte file"
    );
}
