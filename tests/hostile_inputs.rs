//! Hostile inputs of the second pass: picture bombs that add up across a request's inputs and
//! across a server's requests, truncated JPEGs, file errors that must name their flag once,
//! control characters in paths, a strength that runs no step, NaN weights and components that do
//! not fit the model at `create`, and GGUF metadata that would take thirty times its size.

mod common;

use common::{copy_model, s, zimage_in};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_zimage");

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny")
}

fn reference_input(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/reference/inputs")
        .join(name)
}

/// A valid PNG of `side`² pixels in 16-bit RGBA, all zeros: a few hundred KB that decode to
/// `side² · 8` bytes.
fn png_bomb(side: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, side, side);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Sixteen);
    enc.set_compression(png::Compression::Fast);
    let mut writer = enc.write_header().unwrap();
    let mut w = writer.stream_writer().unwrap();
    let row = vec![0u8; side as usize * 8];
    for _ in 0..side {
        w.write_all(&row).unwrap();
    }
    w.finish().unwrap();
    writer.finish().unwrap();
    out
}

/// The bomb of the report: a PNG claiming 8192² RGBA16 (512 MiB decoded), made once.
fn bomb_8192() -> &'static [u8] {
    static BOMB: OnceLock<Vec<u8>> = OnceLock::new();
    BOMB.get_or_init(|| png_bomb(8192))
}

/// Runs `zimage` with `args` under `/usr/bin/time`, in `dir`; returns the output and the peak
/// resident memory in bytes. Killed past 60 s.
fn zimage_measured(dir: &Path, args: &[&str]) -> (Output, u64) {
    let child = Command::new("/usr/bin/time")
        .args(["-f", "maxrss-kb=%M", BIN])
        .current_dir(dir)
        .env("ZIMAGE_CACHE_DIR", dir.join("cache"))
        .env_remove("ZIMAGE_MEMORY_LIMIT")
        .arg("--store")
        .arg(dir.join("store"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::output_within(child, Duration::from_secs(60), || {
        panic!("zimage {args:?} still running after 60 s")
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    let kb: u64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("maxrss-kb="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS in: {stderr}"));
    (out, kb * 1024)
}

fn generate_on(dir: &Path, extra: &[&str]) -> (Output, u64) {
    let out = dir.join("out.png");
    let model = demo();
    let mut args = vec![
        "generate",
        "a red fox",
        "--model",
        s(&model),
        "--width",
        "64",
        "--height",
        "64",
        "--steps",
        "1",
        "-o",
        s(&out),
    ];
    args.extend_from_slice(extra);
    zimage_measured(dir, &args)
}

/// Asserts a refusal with exit code 2 and exactly one error line holding every needle (the
/// `/usr/bin/time` line aside); returns that line.
fn assert_refused(out: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let code = stderr
        .lines()
        .any(|l| l.contains("exited with non-zero status 2"));
    assert!(code || out.status.code() == Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "one error line expected: {stderr}");
    for n in needles {
        assert!(errors[0].contains(n), "`{n}` not in: {stderr}");
    }
    errors[0].to_string()
}

// --- 1. Picture bombs, summed over a request's inputs ------------------------------------

#[test]
fn a_bomb_as_image_and_mask_is_refused_from_its_headers_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b.png");
    std::fs::write(&b, bomb_8192()).unwrap();
    let started = Instant::now();
    let (out, peak) = generate_on(
        dir.path(),
        &["--image", s(&b), "--mask", s(&b), "--memory-limit", "400MB"],
    );
    let line = assert_refused(&out, &["--image `", "--mask `", "400 MB", "b.png"]);
    assert!(!dir.path().join("out.png").exists());
    // Refused before decoding: far below the 400 MB budget, let alone the 1.37 GB it took.
    assert!(peak < 400_000_000, "peak RSS {peak} bytes: {line}");
    assert!(started.elapsed() < Duration::from_secs(10));
    eprintln!("CLI bomb: peak RSS {:.1} MB", peak as f64 / 1e6);
}

#[test]
fn a_bomb_as_reference_is_weighed_with_the_others_before_any_is_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b.png");
    std::fs::write(&b, bomb_8192()).unwrap();
    let started = Instant::now();
    let (out, peak) = generate_on(dir.path(), &["--ref", s(&b), "--memory-limit", "1GB"]);
    let line = assert_refused(&out, &["--ref `", "b.png", "budget"]);
    assert!(!dir.path().join("out.png").exists());
    // Refused from its header: it took 890 MiB and seconds when it was decoded first.
    assert!(peak < 400_000_000, "peak RSS {peak} bytes: {line}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_bomb_as_control_image_counts_toward_the_same_budget() {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b.png");
    std::fs::write(&b, bomb_8192()).unwrap();
    let (out, peak) = generate_on(
        dir.path(),
        &[
            "--control",
            s(&b),
            "--controlnet",
            "no-such-controlnet",
            "--memory-limit",
            "400MB",
        ],
    );
    assert_refused(&out, &["--control `", "400 MB"]);
    assert!(peak < 400_000_000, "peak RSS {peak}");
}

// --- 5. Truncated JPEGs ---------------------------------------------------------------

fn jpeg(side: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(side, side, |x, y| {
        image::Rgb([(x * 7) as u8, (y * 5) as u8, ((x ^ y) * 3) as u8])
    });
    let mut out = Vec::new();
    image::DynamicImage::ImageRgb8(img)
        .write_to(
            &mut std::io::Cursor::new(&mut out),
            image::ImageFormat::Jpeg,
        )
        .unwrap();
    out
}

#[test]
fn truncated_jpegs_are_refused_as_every_input() {
    let dir = tempfile::tempdir().unwrap();
    let whole = jpeg(64);
    let cut = dir.path().join("cut.jpg");
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let good = dir.path().join("good.jpg");
    std::fs::write(&good, &whole).unwrap();
    // The library's decoder, as the server uses it.
    // A whole JPEG decodes to the pixels the lenient decoder gives.
    let strict = zimage::image_in::decode(&whole, "--image", "good.jpg").unwrap();
    let lenient = image::load_from_memory(&whole).unwrap();
    assert_eq!(strict.to_rgb8(), lenient.to_rgb8());
    let e = zimage::image_in::decode(&whole[..whole.len() / 2], "field", "image").unwrap_err();
    assert!(e.to_string().contains("cut short"), "{e}");
    let (out, _) = generate_on(dir.path(), &["--image", s(&cut)]);
    assert_refused(&out, &["--image `", "cut.jpg", "cut short"]);
    let (out, _) = generate_on(dir.path(), &["--image", s(&good), "--mask", s(&cut)]);
    assert_refused(&out, &["--mask `", "cut.jpg", "cut short"]);
    let (out, _) = generate_on(
        dir.path(),
        &["--control", s(&cut), "--controlnet", "no-such-controlnet"],
    );
    assert_refused(&out, &["--control `", "cut.jpg", "cut short"]);
    assert!(!dir.path().join("out.png").exists());
}

// --- 6, 7. File errors: the flag once, the cause once, the path escaped -------------------

#[test]
fn a_device_as_image_names_the_flag_once_and_the_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    for flag in ["--image", "--mask", "--control"] {
        let mut args = vec![flag, "/dev/zero"];
        if flag == "--mask" {
            args = vec!["--image", "/dev/zero", "--mask", "/dev/zero"];
        }
        if flag == "--control" {
            args.extend(["--controlnet", "x"]);
        }
        let (out, _) = generate_on(dir.path(), &args);
        let line = assert_refused(&out, &["/dev/zero", "character device"]);
        assert_eq!(line.matches("character device").count(), 1, "{line}");
        let named = if flag == "--mask" { "--image" } else { flag };
        assert_eq!(line.matches(named).count(), 1, "{line}");
    }
}

#[test]
fn a_newline_in_a_path_is_printed_escaped_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("a\nb\x1b[31m.png");
    let (out, _) = generate_on(dir.path(), &["--image", s(&odd)]);
    let line = assert_refused(&out, &["--image", "a\\nb\\x1b[31m.png"]);
    assert!(!line.contains('\x1b'), "{line:?}");
    // A path of 5000 bytes is cut.
    let long = dir.path().join("x".repeat(200)).join("y".repeat(200));
    let (out, _) = generate_on(dir.path(), &["--image", s(&long)]);
    let line = assert_refused(&out, &["--image"]);
    assert!(line.len() < 700, "{} bytes: {line}", line.len());
}

// --- 9. A strength that runs no step -------------------------------------------------

#[test]
fn a_strength_that_leaves_no_step_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let picture = reference_input("picture-128x128.png");
    let (out, _) = generate_on(dir.path(), &["--image", s(&picture), "--strength", "1e-20"]);
    assert_refused(&out, &["--strength", "no denoising step"]);
    // A subnormal strength is no strength at all: refused by the one number check.
    let (out, _) = generate_on(dir.path(), &["--image", s(&picture), "--strength", "1e-40"]);
    assert_refused(&out, &["--strength", "(0, 1]"]);
    assert!(!dir.path().join("out.png").exists());
}

// --- 2, 3. Weights at create ---------------------------------------------------------

/// A copy of the demo model with the safetensors file of `component` rewritten by `edit`
/// (name, dtype, shape, bytes of every tensor).
fn model_with(dir: &Path, component: &str, edit: impl Fn(&mut Vec<Tensor>)) -> PathBuf {
    let root = dir.join("model");
    copy_model(&demo(), &root);
    let folder = root.join(component);
    for entry in std::fs::read_dir(&folder).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let mut tensors = read_tensors(&bytes);
        edit(&mut tensors);
        std::fs::remove_file(&path).unwrap();
        let list: Vec<(&str, zimage::dtype::Dtype, Vec<u64>, Vec<u8>)> = tensors
            .iter()
            .map(|t| (t.name.as_str(), t.dtype, t.shape.clone(), t.data.clone()))
            .collect();
        common::write_safetensors(&path, &list);
    }
    root
}

#[derive(Clone)]
struct Tensor {
    name: String,
    dtype: zimage::dtype::Dtype,
    shape: Vec<u64>,
    data: Vec<u8>,
}

fn read_tensors(bytes: &[u8]) -> Vec<Tensor> {
    let header = zimage::safetensors::parse(bytes).unwrap();
    header
        .tensors
        .iter()
        .map(|info| {
            let start = header.data_start() as usize + info.data_offsets.0 as usize;
            let end = header.data_start() as usize + info.data_offsets.1 as usize;
            Tensor {
                name: info.name.clone(),
                dtype: info.dtype,
                shape: info.shape.clone(),
                data: bytes[start..end].to_vec(),
            }
        })
        .collect()
}

/// Sets the first value of tensor `name` to `value` (f32, f16 or bf16).
fn poison(tensors: &mut [Tensor], name: &str, value: f32) {
    let t = tensors.iter_mut().find(|t| t.name == name).unwrap();
    let bytes = match t.dtype {
        zimage::dtype::Dtype::F32 => value.to_le_bytes().to_vec(),
        zimage::dtype::Dtype::F16 => half::f16::from_f32(value).to_le_bytes().to_vec(),
        zimage::dtype::Dtype::BF16 => half::bf16::from_f32(value).to_le_bytes().to_vec(),
        other => panic!("{other:?}"),
    };
    t.data[..bytes.len()].copy_from_slice(&bytes);
}

/// The first tensor of `component` (by name) whose shape `fits`.
fn first_tensor_where(component: &str, fits: impl Fn(&[u64]) -> bool) -> String {
    let folder = demo().join(component);
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&folder).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            names.extend(
                read_tensors(&std::fs::read(&path).unwrap())
                    .into_iter()
                    .filter(|t| t.name.ends_with(".weight") && fits(&t.shape))
                    .map(|t| t.name),
            );
        }
    }
    names.sort();
    names
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no tensor in {component}"))
}

fn first_tensor(component: &str) -> String {
    first_tensor_where(component, |shape| !shape.is_empty())
}

fn assert_create_refused(dir: &Path, from: &Path, needles: &[&str]) {
    let store = dir.join("store");
    let out = zimage_in(&store, &["create", "m", "--from", s(from)]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for n in needles {
        assert!(errors[0].contains(n), "`{n}` not in: {stderr}");
    }
    let list = zimage_in(&store, &["list"]);
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains("m:"),
        "stored: {}",
        String::from_utf8_lossy(&list.stdout)
    );
}

#[test]
fn non_finite_weights_are_refused_at_create_in_every_component() {
    for (component, value, word) in [
        ("transformer", f32::NAN, "NaN"),
        ("text_encoder", f32::INFINITY, "+inf"),
        ("vae", f32::NEG_INFINITY, "-inf"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let name = first_tensor(component);
        let model = model_with(dir.path(), component, |ts| {
            if ts.iter().any(|t| t.name == name) {
                poison(ts, &name, value)
            }
        });
        assert_create_refused(dir.path(), &model, &[&name, word, component]);
    }
}

/// Rewrites the safetensors file `path` with the first value of tensor `name` set to `value`.
fn poison_file(path: &Path, name: &str, value: f32) {
    let mut tensors = read_tensors(&std::fs::read(path).unwrap());
    poison(&mut tensors, name, value);
    let list: Vec<(&str, zimage::dtype::Dtype, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|t| (t.name.as_str(), t.dtype, t.shape.clone(), t.data.clone()))
        .collect();
    std::fs::remove_file(path).unwrap();
    common::write_safetensors(path, &list);
}

#[test]
fn non_finite_weights_are_refused_at_create_in_single_files_and_controlnets() {
    // A transformer as one file, as ComfyUI ships it.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("transformer.safetensors");
    std::fs::copy(
        demo().join("transformer/diffusion_pytorch_model.safetensors"),
        &file,
    )
    .unwrap();
    let name = first_tensor("transformer");
    poison_file(&file, &name, f32::NAN);
    let store = dir.path().join("store");
    let out = zimage_in(
        &store,
        &[
            "create",
            "t",
            "--from",
            s(&file),
            "--component",
            "transformer",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&name) && stderr.contains("NaN"), "{stderr}");
    // A ControlNet directory.
    let cn = dir.path().join("controlnet");
    common::controlnet::write_tiny_dir("2.1", &cn);
    let weights = cn.join("diffusion_pytorch_model.safetensors");
    let first = read_tensors(&std::fs::read(&weights).unwrap())
        .into_iter()
        .map(|t| t.name)
        .min()
        .unwrap();
    poison_file(&weights, &first, f32::INFINITY);
    let out = zimage_in(&store, &["create", "cn", "--from", s(&cn)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&first) && stderr.contains("+inf"),
        "{stderr}"
    );
    let list = zimage_in(&store, &["list"]);
    assert!(String::from_utf8_lossy(&list.stdout).lines().count() <= 1);
}

#[test]
fn non_finite_values_in_a_gguf_block_scale_are_refused_at_create() {
    use zimage::formats::gguf::{self, GgmlType, Value, WriteTensor};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("te.gguf");
    let mut q8 = Vec::new();
    for block in 0..2 {
        let d = if block == 1 { f32::NAN } else { 0.01 };
        q8.extend(half::f16::from_f32(d).to_le_bytes());
        q8.extend((0..32u8).map(|i| i.wrapping_mul(7)));
    }
    let tensors = [WriteTensor {
        name: "blk.0.attn_q.weight".into(),
        ggml_type: GgmlType::Q8_0,
        shape: vec![2, 32],
        data: &q8,
    }];
    let meta = [(
        "general.architecture".to_string(),
        Value::String("qwen3".into()),
    )];
    let mut bytes = Vec::new();
    gguf::write(&mut bytes, &meta, &tensors).unwrap();
    std::fs::write(&file, bytes).unwrap();
    let store = dir.path().join("store");
    let out = zimage_in(
        &store,
        &[
            "create",
            "te",
            "--from",
            s(&file),
            "--component",
            "text_encoder",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("q_proj.weight") && stderr.contains("NaN"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn components_that_do_not_fit_the_model_are_refused_at_create() {
    // A transposed feed-forward weight.
    let dir = tempfile::tempdir().unwrap();
    let w1 = first_tensor_where("transformer", |shape| {
        shape.len() == 2 && shape[0] != shape[1]
    });
    let model = model_with(dir.path(), "transformer", |ts| {
        let t = ts.iter_mut().find(|t| t.name == w1).unwrap();
        t.shape.reverse();
    });
    assert_create_refused(dir.path(), &model, &["transformer", &w1, "shape"]);
    // An extra tensor, and one with an empty name.
    for extra in ["blocks.99.unknown.weight", ""] {
        let dir = tempfile::tempdir().unwrap();
        let model = model_with(dir.path(), "vae", |ts| {
            let mut t = ts[0].clone();
            t.name = extra.to_string();
            ts.push(t);
        });
        assert_create_refused(dir.path(), &model, &["vae"]);
    }
    // A text encoder config whose vocabulary the tokenizer does not fit.
    let dir = tempfile::tempdir().unwrap();
    let model = model_with(dir.path(), "text_encoder", |_| {});
    let cfg = model.join("text_encoder/config.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    json["vocab_size"] = serde_json::json!(1000);
    std::fs::remove_file(&cfg).unwrap();
    std::fs::write(&cfg, serde_json::to_vec(&json).unwrap()).unwrap();
    assert_create_refused(dir.path(), &model, &["vocab_size"]);
}

#[test]
fn non_finite_weights_are_an_error_naming_the_phase_not_a_black_picture() {
    let dir = tempfile::tempdir().unwrap();
    let name = first_tensor("transformer");
    let model = model_with(dir.path(), "transformer", |ts| {
        let t = ts.iter_mut().find(|t| t.name == name).unwrap();
        let nan = match t.dtype {
            zimage::dtype::Dtype::F32 => f32::NAN.to_le_bytes().to_vec(),
            zimage::dtype::Dtype::F16 => half::f16::NAN.to_le_bytes().to_vec(),
            _ => half::bf16::NAN.to_le_bytes().to_vec(),
        };
        for c in t.data.chunks_exact_mut(nan.len()) {
            c.copy_from_slice(&nan);
        }
    });
    let out = dir.path().join("out.png");
    let (o, _) = zimage_measured(
        dir.path(),
        &[
            "generate",
            "a fox",
            "--model",
            s(&model),
            "--width",
            "64",
            "--height",
            "64",
            "--steps",
            "1",
            "-o",
            s(&out),
        ],
    );
    assert_refused(&o, &["denoise", "NaN"]);
    assert!(!out.exists());
}

// --- 4. GGUF metadata ----------------------------------------------------------------

#[test]
fn gguf_metadata_arrays_are_held_within_a_cap() {
    // Three arrays of 16 M one-byte values: 50 MB of file that took 1.59 GB to hold.
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"GGUF");
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&3u64.to_le_bytes());
    for i in 0..3 {
        let key = format!("bomb.{i}");
        bytes.extend_from_slice(&(key.len() as u64).to_le_bytes());
        bytes.extend_from_slice(key.as_bytes());
        bytes.extend_from_slice(&9u32.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&(1u64 << 24).to_le_bytes());
        bytes.resize(bytes.len() + (1 << 24), 0);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("meta.gguf");
    std::fs::write(&file, &bytes).unwrap();
    let (out, peak) = zimage_measured(dir.path(), &["inspect", s(&file)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("bomb.") && stderr.contains("memory"),
        "{stderr}"
    );
    assert!(peak < 600_000_000, "peak RSS {peak}");
    eprintln!("GGUF metadata: peak RSS {:.1} MB", peak as f64 / 1e6);
}

// --- 1, 7, 8. The server ----------------------------------------------------------------

struct Server {
    child: std::process::Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(store: &Path, args: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(BIN)
            .arg("--store")
            .arg(store)
            .args(["serve", "--host", &format!("127.0.0.1:{port}")])
            .args(args)
            .env_remove("ZIMAGE_API_KEY")
            .env_remove("ZIMAGE_MEMORY_LIMIT")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server { child, port };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
            * 1024
    }
}

/// Sends a request and reads the whole answer: status, headers (lower-case), body.
fn send(port: u16, head: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut request = format!(
        "{head}\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    stream.write_all(&request).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let headers = String::from_utf8_lossy(&answer[..split]).to_lowercase();
    let status = headers[9..12].parse().unwrap();
    (status, headers, answer[split + 4..].to_vec())
}

fn edit_form(parts: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "zimage-test-boundary";
    let mut body = Vec::new();
    for (name, bytes) in parts {
        let file = if *name == "model" || *name == "prompt" {
            String::new()
        } else {
            format!("; filename=\"{name}.png\"")
        };
        body.extend(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"{file}\r\n\r\n"
            )
            .bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{boundary}--\r\n").bytes());
    (
        format!(
            "POST /v1/images/edits HTTP/1.1\r\nContent-Type: multipart/form-data; boundary={boundary}"
        ),
        body,
    )
}

#[test]
fn sixteen_concurrent_bomb_edits_keep_the_server_small_and_answering() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("store"), &["--memory-limit", "2GB"]);
    let port = server.port;
    let bomb = bomb_8192();
    // Each a 4096² RGBA16 picture that fits alone (about 335 MB held) but not two at once.
    let medium: &'static [u8] = Box::leak(png_bomb(4096).into_boxed_slice());
    let statuses = std::sync::Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for i in 0..16 {
            let statuses = &statuses;
            scope.spawn(move || {
                let parts: Vec<(&str, &[u8])> = if i % 2 == 0 {
                    vec![
                        ("model", b"tiny"),
                        ("prompt", b"a fox"),
                        ("image", bomb),
                        ("mask", bomb),
                    ]
                } else {
                    vec![("model", b"tiny"), ("prompt", b"a fox"), ("image", medium)]
                };
                let (head, body) = edit_form(&parts);
                let (status, headers, answer) = send(port, &head, &body);
                statuses.lock().unwrap().push((
                    i,
                    status,
                    headers.contains("retry-after: 5"),
                    String::from_utf8_lossy(&answer).into_owned(),
                ));
            });
        }
    });
    let peak = server.peak_rss();
    let statuses = statuses.into_inner().unwrap();
    eprintln!(
        "16 concurrent bomb edits: peak RSS {:.1} MB, {:.1} s",
        peak as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    let count = |s: u16| statuses.iter().filter(|x| x.1 == s).count();
    eprintln!(
        "statuses: {} × 400, {} × 404 (decoded), {} × 503",
        count(400),
        count(404),
        count(503)
    );
    // At least one medium picture was admitted and decoded.
    assert!(count(404) >= 1);
    for (i, status, retry_after, body) in &statuses {
        if i % 2 == 0 {
            // Image and mask together can never fit: refused from the headers.
            assert_eq!(*status, 400, "{body}");
            assert!(body.contains("decoded"), "{body}");
        } else {
            // One at a time: decoded, then told there is no such model; or told to come back.
            assert!(
                *status == 404 || (*status == 503 && *retry_after),
                "{status}: {body}"
            );
        }
    }
    assert!(peak < 2_000_000_000, "peak RSS {peak} bytes");
    let (status, _, _) = send(port, "GET / HTTP/1.1", b"");
    assert_eq!(status, 200);
}

#[test]
fn ollama_echoes_a_few_hundred_bytes_of_a_bad_value_not_five_megabytes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("store"), &[]);
    let value = "A".repeat(5 << 20);
    let body = format!(r#"{{"model":"tiny","prompt":"a fox","images":"{value}"}}"#);
    let (status, _, answer) = send(
        server.port,
        "POST /api/generate HTTP/1.1\r\nContent-Type: application/json",
        body.as_bytes(),
    );
    let text = String::from_utf8_lossy(&answer);
    assert_eq!(status, 400, "{}", &text[..text.len().min(500)]);
    assert!(answer.len() < 2000, "{} bytes", answer.len());
    assert!(text.contains("images"), "{text}");
}

/// A1111's routes admit their pictures through the server's input budget, from their headers,
/// before any is decoded, as every other API does: a bomb as the picture, as picture and mask,
/// or in a ControlNet unit is refused at once, the server stays small, and a subnormal
/// `mask_blur` is refused rather than reaching the blur. The next normal request of the same
/// kind is answered.
#[test]
fn a1111_pictures_pass_the_input_budget_before_they_are_decoded() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let store = common::server::demo_store(dir.path());
    let server = Server::start(&store, &["--memory-limit", "2GB"]);
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let bomb = b64(bomb_8192());
    let picture = b64(&std::fs::read(reference_input("picture-96x80.png")).unwrap());
    let mask = b64(&std::fs::read(reference_input("mask-96x80.png")).unwrap());
    let small = r#""prompt": "a fox", "steps": 1, "width": 64, "height": 64, "cfg_scale": 0"#;
    let unit = |image: &str| {
        format!(
            r#""alwayson_scripts": {{"controlnet": {{"args": [{{"model": "cn", "image": "{image}"}}]}}}}"#
        )
    };
    let post = |path: &str, body: String| {
        let head = format!("POST {path} HTTP/1.1\r\nContent-Type: application/json");
        let (status, _, answer) = send(server.port, &head, body.as_bytes());
        (status, String::from_utf8_lossy(&answer).into_owned())
    };
    let refused = [
        (
            "/sdapi/v1/img2img",
            format!(r#"{{{small}, "init_images": ["{bomb}"]}}"#),
        ),
        (
            "/sdapi/v1/img2img",
            format!(r#"{{{small}, "init_images": ["{bomb}"], "mask": "{bomb}"}}"#),
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{{small}, {}}}"#, unit(&bomb)),
        ),
    ];
    for (path, body) in refused {
        let (status, answer) = post(path, body);
        assert_eq!(status, 400, "{path}: {answer}");
        assert!(answer.contains("decoded"), "{answer}");
    }
    let inpaint = |blur: &str| {
        format!(
            r#"{{{small}, "init_images": ["{picture}"], "mask": "{mask}", "mask_blur": {blur}}}"#
        )
    };
    let (status, answer) = post("/sdapi/v1/img2img", inpaint("1e-40"));
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("mask_blur"), "{answer}");
    let peak = server.peak_rss();
    assert!(peak < 700_000_000, "peak RSS {peak} bytes");
    let (status, answer) = post("/sdapi/v1/img2img", inpaint("4"));
    assert_eq!(status, 200, "{answer}");
}

/// A budget that holds a 64² request of the demo model with the server's idle memory (about
/// 230 MB), but not with the peak a 63 MiB body leaves behind (about 400 MB).
const MEMORY_PLAN_LIMIT: &str = "250MB";

/// A server's memory plan starts from what the process holds now, not from its lifetime peak:
/// after a request whose body alone raised the peak well past the budget's room, the next
/// small requests are planned from the memory given back and run.
#[test]
fn a_past_peak_does_not_refuse_the_next_requests() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::server::demo_store(dir.path());
    let server = Server::start(&store, &["--memory-limit", MEMORY_PLAN_LIMIT]);
    let small = r#"{"prompt": "a fox", "steps": 1, "width": 64, "height": 64, "cfg_scale": 0}"#;
    let txt2img = |body: &[u8]| {
        let head = "POST /sdapi/v1/txt2img HTTP/1.1\r\nContent-Type: application/json";
        let (status, _, answer) = send(server.port, head, body);
        (status, String::from_utf8_lossy(&answer).into_owned())
    };
    let (status, answer) = txt2img(small.as_bytes());
    assert_eq!(status, 200, "{answer}");
    // 63 MiB of text in a field txt2img refuses: read, parsed and copied, then given back.
    let junk = format!(
        r#"{{"prompt": "a fox", "init_images": ["{}"]}}"#,
        "A".repeat(63 << 20)
    );
    let (status, answer) = txt2img(junk.as_bytes());
    assert_eq!(status, 400, "{}", &answer[..answer.len().min(300)]);
    let peak = server.peak_rss();
    assert!(
        peak > 250_000_000,
        "the body raised the peak to {peak} bytes only"
    );
    for _ in 0..2 {
        let (status, answer) = txt2img(small.as_bytes());
        assert_eq!(status, 200, "{answer}");
    }
}
