//! Hostile inputs to the format readers: every command ends quickly, within bounded memory,
//! with one line naming the file, and never panics or aborts.

mod common;

use common::{s, write_safetensors};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use zimage::safetensors::Dtype;

/// How a command ended.
struct Run {
    /// Exit code; `None` when a signal ended it.
    code: Option<i32>,
    signal: Option<i32>,
    stderr: String,
    stdout: String,
    /// Peak resident memory of the child, in bytes.
    peak_rss: u64,
    /// User and system CPU time of the child: unlike wall time, not stretched by a busy machine.
    cpu: Duration,
    elapsed: Duration,
}

impl Run {
    fn describe(&self, what: &str) -> String {
        format!(
            "{what}: code {:?}, signal {:?}, {} MB peak, {:.1} s ({:.1} s CPU), stderr: {}",
            self.code,
            self.signal,
            self.peak_rss >> 20,
            self.elapsed.as_secs_f64(),
            self.cpu.as_secs_f64(),
            self.stderr.trim_end()
        )
    }
}

/// GNU time, which reports the peak memory of the command it runs. The peak is not taken from
/// `wait4` here: a child spawned from this (large, multi-threaded) test process starts its
/// count at the parent's size.
const TIME: &str = "/usr/bin/time";

/// Runs `zimage` with `args` and `env`, killing it after `limit`; its peak memory comes from
/// GNU time when it is installed (0 otherwise).
fn run_env(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    let rss_path = dir.path().join("rss");
    let bin = env!("CARGO_BIN_EXE_zimage");
    let timed = Path::new(TIME).exists();
    let mut cmd = if timed {
        let mut c = Command::new(TIME);
        c.args(["-f", "%M %U %S", "-o"]).arg(&rss_path).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            // SAFETY: signalling the process group this test started.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = start.elapsed();
    let report = std::fs::read_to_string(&rss_path).unwrap_or_default();
    // GNU time says "Command terminated by signal N" and exits with 128 + N.
    let by_signal = report
        .lines()
        .find_map(|l| l.strip_prefix("Command terminated by signal "))
        .and_then(|n| n.trim().parse().ok());
    let last: Vec<&str> = report.lines().last().unwrap_or("").split(' ').collect();
    let peak_kb: u64 = last.first().and_then(|v| v.parse().ok()).unwrap_or(0);
    let seconds = |i: usize| {
        last.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let cpu = Duration::from_secs_f64(seconds(1) + seconds(2));
    Run {
        code: if by_signal.is_some() {
            None
        } else {
            status.code()
        },
        signal: by_signal.or(std::os::unix::process::ExitStatusExt::signal(&status)),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        peak_rss: peak_kb * 1024,
        cpu,
        elapsed,
    }
}

fn run(args: &[&str]) -> Run {
    run_env(args, &[], Duration::from_secs(60))
}

/// A run that failed the way every refused input should: exit code 2, one line on stderr that
/// names `file`, and no crash.
fn assert_refused(r: &Run, file: &str, what: &str) {
    let d = r.describe(what);
    assert_eq!(r.code, Some(2), "{d}");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{d}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(file),
        "{d}"
    );
    assert!(!r.stderr.contains("panicked"), "{d}");
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

// ---- CBOR and zTensor files written by hand, so that any manifest can be made ----

enum C {
    U(u64),
    T(&'static str),
    A(Vec<C>),
    M(Vec<(&'static str, C)>),
}

fn head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    match n {
        0..=23 => out.push(m | n as u8),
        24..=0xff => out.extend([m | 24, n as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend((n as u16).to_be_bytes())
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend((n as u32).to_be_bytes())
        }
        _ => {
            out.push(m | 27);
            out.extend(n.to_be_bytes())
        }
    }
}

fn cbor(v: &C, out: &mut Vec<u8>) {
    match v {
        C::U(n) => head(out, 0, *n),
        C::T(t) => {
            head(out, 3, t.len() as u64);
            out.extend(t.as_bytes())
        }
        C::A(items) => {
            head(out, 4, items.len() as u64);
            items.iter().for_each(|i| cbor(i, out))
        }
        C::M(pairs) => {
            head(out, 5, pairs.len() as u64);
            for (k, v) in pairs {
                cbor(&C::T(k), out);
                cbor(v, out);
            }
        }
    }
}

fn component(offset: u64, length: u64, zstd: bool) -> C {
    let mut m = vec![("offset", C::U(offset)), ("length", C::U(length))];
    if zstd {
        m.push(("encoding", C::T("zstd")));
    }
    C::M(m)
}

fn tensor(
    dtype: &'static str,
    shape: &[u64],
    format: &'static str,
    comps: Vec<(&'static str, C)>,
) -> C {
    C::M(vec![
        ("dtype", C::T(dtype)),
        ("shape", C::A(shape.iter().map(|&d| C::U(d)).collect())),
        ("format", C::T(format)),
        ("components", C::M(comps)),
    ])
}

/// A .zt file: the magic, `blob` from byte 64, then the manifest of `tensors`.
fn zt_file(blob: &[u8], tensors: Vec<(&'static str, C)>) -> Vec<u8> {
    let root = C::M(vec![
        ("version", C::T("1.0")),
        ("generator", C::T("test")),
        ("attributes", C::M(vec![])),
        ("tensors", C::M(tensors)),
    ]);
    zt_with_manifest(blob, &root)
}

fn zt_with_manifest(blob: &[u8], root: &C) -> Vec<u8> {
    let mut m = Vec::new();
    cbor(root, &mut m);
    let mut f = b"ZTEN1000".to_vec();
    f.resize(64, 0);
    f.extend(blob);
    f.extend(&m);
    f.extend((m.len() as u64).to_le_bytes());
    f
}

/// One u8 value at element 5 of a 1-D tensor of `n` elements, as sparse COO.
fn sparse_coo(n: u64) -> Vec<u8> {
    let mut blob = vec![7u8];
    blob.resize(64, 0);
    blob.extend(5u64.to_le_bytes());
    zt_file(
        &blob,
        vec![(
            "t",
            tensor(
                "uint8",
                &[n],
                "sparse_coo",
                vec![
                    ("values", component(64, 1, false)),
                    ("coords", component(128, 8, false)),
                ],
            ),
        )],
    )
}

/// A dense u8 tensor of `n` zeros stored as one zstd frame.
fn zstd_dense(n: u64) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(zeros.len() as u64) as usize;
        std::io::Write::write_all(&mut enc, &zeros[..k]).unwrap();
        left -= k as u64;
    }
    let z = enc.finish().unwrap();
    zt_file(
        &z,
        vec![(
            "t",
            tensor(
                "uint8",
                &[n],
                "dense",
                vec![("data", component(64, z.len() as u64, true))],
            ),
        )],
    )
}

// ---- PNG ----

/// A 1×1 PNG with the text chunks `add` writes between the header and the image data.
fn png_with(path: &Path, add: impl FnOnce(&mut png::Writer<&mut Vec<u8>>)) {
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, 1, 1);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().unwrap();
        add(&mut w);
        w.write_image_data(&[0, 0, 0]).unwrap();
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn infotext_parsing_is_linear_in_the_chunk_size() {
    let dir = tempfile::tempdir().unwrap();
    let mib = 1 << 20;
    let repeat = |unit: &str| unit.repeat(mib / unit.len());
    let many_keys: String = (0..mib / 12).map(|i| format!("K{i:07}: v, ")).collect();
    let texts = [
        ("word_run", repeat("a")),
        ("spaced_words", repeat("a ")),
        ("commas", repeat(",")),
        ("quotes", repeat("\"")),
        ("open_quotes", repeat("Kk: \"x, ")),
        ("escaped_quotes", repeat("Kk: \"\\\", ")),
        ("one_char_keys", repeat("a:")),
        ("many_distinct_keys", many_keys),
        ("same_key", repeat("Steps: 1, ")),
        (
            "prompt_then_runs",
            format!("a prompt\nNegative prompt: n\n{}", repeat("ab ")),
        ),
    ];
    for (name, text) in texts {
        let p = dir.path().join(format!("{name}.png"));
        common_png(&p, &text);
        let r = run_env(&["inspect", "--json", s(&p)], &[], Duration::from_secs(60));
        assert_eq!(r.code, Some(0), "{}", r.describe(name));
        assert!(r.cpu < Duration::from_secs(10), "{}", r.describe(name));
    }
}

fn common_png(path: &Path, text: &str) {
    zimage::image_out::write_png(path, &[0, 0, 0], 1, 1, &[("parameters", text)]).unwrap();
}

#[test]
fn png_text_chunks_inflate_within_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    // Each chunk is about 64 KiB on disk and 64 MiB inflated.
    let mut z = png::text_metadata::ZTXtChunk::new("z", "a".repeat(64 << 20));
    z.compress_text().unwrap();
    let p = dir.path().join("bomb.png");
    png_with(&p, |w| {
        for _ in 0..3 {
            w.write_text_chunk(&z).unwrap();
        }
    });
    let size = std::fs::metadata(&p).unwrap().len();
    assert!(size < 1 << 20, "{size}");
    let r = run(&["inspect", s(&p)]);
    assert_refused(&r, "bomb.png", "zTXt bomb");
    assert!(
        r.stderr.contains("8388608"),
        "{}",
        r.describe("limit named")
    );
    assert!(r.peak_rss < 200 << 20, "{}", r.describe("zTXt bomb"));

    // Many chunks each under the per-chunk limit, together far over the total.
    let mut i = png::text_metadata::ZTXtChunk::new("i", "b".repeat(5 << 20));
    i.compress_text().unwrap();
    let p = dir.path().join("many.png");
    png_with(&p, |w| {
        for _ in 0..30 {
            w.write_text_chunk(&i).unwrap();
        }
    });
    let size = std::fs::metadata(&p).unwrap().len();
    assert!(size < 1 << 20, "{size}");
    let r = run(&["inspect", s(&p)]);
    assert_refused(&r, "many.png", "many inflating chunks");
    assert!(
        r.stderr.contains("33554432"),
        "{}",
        r.describe("total named")
    );
    assert!(
        r.peak_rss < 200 << 20,
        "{}",
        r.describe("many inflating chunks")
    );

    // More chunks than a PNG may have.
    let p = dir.path().join("chunks.png");
    png_with(&p, |w| {
        for _ in 0..5000 {
            w.write_text_chunk(&png::text_metadata::TEXtChunk::new("k", "v"))
                .unwrap();
        }
    });
    assert_refused(&run(&["inspect", s(&p)]), "chunks.png", "many chunks");

    // Small chunks still read.
    let p = dir.path().join("small.png");
    png_with(&p, |w| {
        let mut t = png::text_metadata::ZTXtChunk::new(
            "parameters",
            "a cat\nSteps: 20, Sampler: Euler, CFG scale: 7",
        );
        t.compress_text().unwrap();
        w.write_text_chunk(&t).unwrap();
    });
    let r = run(&["inspect", "--json", s(&p)]);
    assert_eq!(r.code, Some(0), "{}", r.describe("small zTXt"));
    assert!(r.stdout.contains("Euler"), "{}", r.stdout);
}

#[test]
fn sparse_tensors_past_the_dense_limit_are_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("huge.zt");
    // 16 GiB declared, 312-ish bytes on disk.
    std::fs::write(&input, sparse_coo(1 << 34)).unwrap();
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    for out in ["m.safetensors", "m.zt"] {
        let before = entries(&out_dir);
        let r = run(&["convert", s(&input), s(&out_dir.join(out))]);
        assert_refused(&r, "huge.zt", out);
        assert!(
            r.stderr.contains("ZIMAGE_MAX_DENSE_BYTES"),
            "{}",
            r.describe(out)
        );
        assert!(r.peak_rss < 200 << 20, "{}", r.describe(out));
        assert_eq!(
            entries(&out_dir),
            before,
            "a failed convert leaves nothing behind"
        );
    }
    let store = dir.path().join("store");
    let r = run(&["--store", s(&store), "create", "huge", "--from", s(&input)]);
    assert_refused(&r, "huge.zt", "create");

    // The limit is the user's to move.
    let small = dir.path().join("small.zt");
    std::fs::write(&small, sparse_coo(2000)).unwrap();
    let out = out_dir.join("small.safetensors");
    let low = [("ZIMAGE_MAX_DENSE_BYTES", "1000")];
    let r = run_env(
        &["convert", s(&small), s(&out)],
        &low,
        Duration::from_secs(30),
    );
    assert_refused(&r, "small.zt", "lowered limit");
    assert!(!out.exists());
    let high = [("ZIMAGE_MAX_DENSE_BYTES", "2000")];
    let r = run_env(
        &["convert", s(&small), s(&out)],
        &high,
        Duration::from_secs(30),
    );
    assert_eq!(r.code, Some(0), "{}", r.describe("raised limit"));
    let bytes = std::fs::read(&out).unwrap();
    let data = &bytes[bytes.len() - 2000..];
    assert_eq!(data[5], 7);
    assert_eq!(data.iter().filter(|&&b| b != 0).count(), 1);
    let bad = [("ZIMAGE_MAX_DENSE_BYTES", "lots")];
    let r = run_env(
        &["convert", s(&small), s(&out)],
        &bad,
        Duration::from_secs(30),
    );
    assert_refused(&r, "small.zt", "unparsable limit");
}

#[test]
fn compressed_tensors_are_decoded_without_holding_them_whole() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("zeros.zt");
    std::fs::write(&input, zstd_dense(384 << 20)).unwrap();
    assert!(std::fs::metadata(&input).unwrap().len() < 1 << 20);
    let out = dir.path().join("zeros.safetensors");
    let r = run(&["convert", s(&input), s(&out)]);
    assert_eq!(r.code, Some(0), "{}", r.describe("zstd dense"));
    assert!(r.peak_rss < 192 << 20, "{}", r.describe("zstd dense"));
    assert_eq!(std::fs::metadata(&out).unwrap().len() % 8, 0);

    // Declared past the limit: refused before a byte is decoded.
    let bomb = dir.path().join("bomb.zt");
    let z = zstd::encode_all(&[0u8; 1024][..], 1).unwrap();
    let f = zt_file(
        &z,
        vec![(
            "t",
            tensor(
                "uint8",
                &[1 << 40],
                "dense",
                vec![("data", component(64, z.len() as u64, true))],
            ),
        )],
    );
    std::fs::write(&bomb, f).unwrap();
    let r = run(&["convert", s(&bomb), s(&dir.path().join("bomb.safetensors"))]);
    assert_refused(&r, "bomb.zt", "declared bomb");
    assert!(
        r.stderr.contains("ZIMAGE_MAX_DENSE_BYTES"),
        "{}",
        r.describe("bomb")
    );
}

#[test]
fn converting_many_tensors_is_not_quadratic() {
    let dir = tempfile::tempdir().unwrap();
    let n = 100_000;
    let names: Vec<String> = (0..n).map(|i| format!("layers.{i}.w")).collect();
    let tensors: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = names
        .iter()
        .map(|name| (name.as_str(), Dtype::U8, vec![1], vec![1u8]))
        .collect();
    let input = dir.path().join("many.safetensors");
    write_safetensors(&input, &tensors);
    for out in ["many.zt", "many2.safetensors"] {
        let out = dir.path().join(out);
        let r = run(&["convert", s(&input), s(&out)]);
        assert_eq!(r.code, Some(0), "{}", r.describe("convert"));
        assert!(r.cpu < Duration::from_secs(10), "{}", r.describe("convert"));
    }
    let r = run(&[
        "convert",
        s(&dir.path().join("many.zt")),
        s(&dir.path().join("back.safetensors")),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.describe("back"));
    for cmd in [&["inspect"][..], &["hash", "--structural"]] {
        let mut args = cmd.to_vec();
        args.push(s(&input));
        let r = run(&args);
        assert_eq!(r.code, Some(0), "{}", r.describe("inspect"));
        assert!(r.cpu < Duration::from_secs(10), "{}", r.describe("inspect"));
    }
}

#[test]
fn a_tampered_dfsn_container_is_not_imported() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    write_safetensors(&model, &[("w", Dtype::F32, vec![4], vec![0u8; 16])]);
    let container = dir.path().join("m.dfsn");
    let r = run(&["dfsn", "pack", s(&model), "-o", s(&container)]);
    assert_eq!(r.code, Some(0), "{}", r.describe("pack"));
    let mut bytes = std::fs::read(&container).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    let tampered = dir.path().join("tampered.dfsn");
    std::fs::write(&tampered, bytes).unwrap();
    let store = dir.path().join("store");
    let r = run(&["--store", s(&store), "create", "t", "--from", s(&tampered)]);
    assert_refused(&r, "tampered.dfsn", "create from a tampered container");
    assert!(
        r.stderr.contains("not imported"),
        "{}",
        r.describe("create")
    );
    let r = run(&[
        "--store",
        s(&store),
        "create",
        "ok",
        "--from",
        s(&container),
    ]);
    assert_eq!(
        r.code,
        Some(0),
        "{}",
        r.describe("create from a sound container")
    );
}

#[test]
fn outputs_go_through_symlinks_and_refuse_special_files() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_safetensors(&input, &[("w", Dtype::U8, vec![3], vec![1, 2, 3])]);
    for ext in ["zt", "safetensors"] {
        let real = dir.path().join(format!("real.{ext}"));
        let link = dir.path().join(format!("link.{ext}"));
        std::fs::write(&real, b"old").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let r = run(&["convert", s(&input), s(&link)]);
        assert_eq!(r.code, Some(0), "{}", r.describe(ext));
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_ne!(std::fs::read(&real).unwrap(), b"old");
    }
    let fifo = dir.path().join("fifo.zt");
    mkfifo(&fifo);
    let before = entries(dir.path());
    let r = run(&["convert", s(&input), s(&fifo)]);
    assert_refused(&r, "fifo.zt", "FIFO output");
    assert_eq!(entries(dir.path()), before);
    let r = run(&["dfsn", "pack", s(&input), "-o", "/dev/null"]);
    assert_refused(&r, "/dev/null", "dfsn pack to /dev/null");
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

/// A safetensors file with `json` as its header and `data` bytes after it.
fn st(json: &str, data: usize) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend(json.as_bytes());
    v.resize(v.len() + data, 0);
    v
}

fn hostile_inputs(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let mut files: Vec<(&'static str, Vec<u8>)> = vec![
        ("empty.safetensors", vec![]),
        ("three_bytes.safetensors", vec![1, 2, 3]),
        ("len_max.safetensors", {
            let mut v = u64::MAX.to_le_bytes().to_vec();
            v.extend(b"{}");
            v
        }),
        ("len_past_end.safetensors", {
            let mut v = 1000u64.to_le_bytes().to_vec();
            v.extend(b"{}");
            v
        }),
        ("not_utf8.safetensors", {
            let mut v = 4u64.to_le_bytes().to_vec();
            v.extend([b'{', 0xff, 0xfe, b'}']);
            v
        }),
        (
            "deep_json.safetensors",
            st(
                &format!("{}{}", "{\"a\":".repeat(5000), "}".repeat(5000)),
                0,
            ),
        ),
        (
            "deep_metadata.safetensors",
            st(
                &format!(
                    "{{\"__metadata__\":{{\"k\":{}1{}}}}}",
                    "[".repeat(100_000),
                    "]".repeat(100_000)
                ),
                0,
            ),
        ),
        (
            "negative_shape.safetensors",
            st(
                r#"{"t":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#,
                1,
            ),
        ),
        (
            "huge_shape.safetensors",
            st(
                r#"{"t":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#,
                8,
            ),
        ),
        (
            "offsets_max.safetensors",
            st(
                r#"{"t":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,18446744073709551615]}}"#,
                8,
            ),
        ),
        (
            "float_shape.safetensors",
            st(
                r#"{"t":{"dtype":"U8","shape":[1e400],"data_offsets":[0,1]}}"#,
                1,
            ),
        ),
        (
            "nan_metadata.safetensors",
            st(
                r#"{"__metadata__":{"x":NaN},"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
                1,
            ),
        ),
        (
            "duplicate_names.safetensors",
            st(
                r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
                2,
            ),
        ),
        (
            "overlap.safetensors",
            st(
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#,
                3,
            ),
        ),
        (
            "truncated_data.safetensors",
            st(
                r#"{"a":{"dtype":"U8","shape":[64],"data_offsets":[0,64]}}"#,
                10,
            ),
        ),
        (
            "unknown_dtype.safetensors",
            st(
                r#"{"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}}"#,
                2,
            ),
        ),
        (
            "lone_surrogate_name.safetensors",
            st(
                r#"{"\udcff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
                1,
            ),
        ),
        ("non_utf8_name.safetensors", {
            let json = b"{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
            let mut v = (json.len() as u64).to_le_bytes().to_vec();
            v.extend(json);
            v.push(0);
            v
        }),
        ("zt_truncated.zt", b"ZTEN1000\0\0".to_vec()),
        ("zt_manifest_max.zt", {
            let mut v = b"ZTEN1000".to_vec();
            v.resize(64, 0);
            v.extend(u64::MAX.to_le_bytes());
            v
        }),
        ("zt_manifest_garbage.zt", {
            let mut v = b"ZTEN1000".to_vec();
            v.extend([0xbf; 32]);
            v.extend(32u64.to_le_bytes());
            v
        }),
        ("zt_cbor_huge_array.zt", {
            let mut v = b"ZTEN1000".to_vec();
            let m = [0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
            v.extend(m);
            v.extend((m.len() as u64).to_le_bytes());
            v
        }),
        ("zt_cbor_huge_text.zt", {
            let mut v = b"ZTEN1000".to_vec();
            let m = [0x7b, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00];
            v.extend(m);
            v.extend((m.len() as u64).to_le_bytes());
            v
        }),
        ("zt_deep_cbor.zt", {
            let mut v = b"ZTEN1000".to_vec();
            let m = vec![0x81u8; 100_000];
            v.extend(&m);
            v.extend((m.len() as u64).to_le_bytes());
            v
        }),
        (
            "zt_shape_overflow.zt",
            zt_file(
                &[0; 64],
                vec![(
                    "t",
                    tensor(
                        "float64",
                        &[1 << 62, 1 << 62],
                        "dense",
                        vec![("data", component(64, 64, false))],
                    ),
                )],
            ),
        ),
        (
            "zt_offset_overflow.zt",
            zt_file(
                &[0; 64],
                vec![(
                    "t",
                    tensor(
                        "uint8",
                        &[8],
                        "dense",
                        vec![("data", component(u64::MAX - 63, 8, false))],
                    ),
                )],
            ),
        ),
        ("zt_sparse_huge.zt", sparse_coo(1 << 38)),
        ("zt_csr_huge.zt", {
            let mut blob = vec![1u8];
            blob.resize(64, 0);
            blob.extend(0u64.to_le_bytes());
            blob.resize(128, 0);
            blob.extend(0u64.to_le_bytes());
            blob.extend(1u64.to_le_bytes());
            zt_file(
                &blob,
                vec![(
                    "t",
                    tensor(
                        "uint8",
                        &[1, 1 << 40],
                        "sparse_csr",
                        vec![
                            ("values", component(64, 1, false)),
                            ("indices", component(128, 8, false)),
                            ("indptr", component(192, 16, false)),
                        ],
                    ),
                )],
            )
        }),
        ("zt_zstd_bomb.zt", vec![]),
        (
            "zt_overlap.zt",
            zt_file(
                &[0; 64],
                vec![
                    (
                        "a",
                        tensor(
                            "uint8",
                            &[64],
                            "dense",
                            vec![("data", component(64, 64, false))],
                        ),
                    ),
                    (
                        "b",
                        tensor(
                            "uint8",
                            &[64],
                            "dense",
                            vec![("data", component(64, 64, false))],
                        ),
                    ),
                ],
            ),
        ),
        ("dfsn_truncated.dfsn", b"DFSN\x00\x02".to_vec()),
        ("dfsn_offsets_max.dfsn", {
            let mut v = b"DFSN\x00\x02".to_vec();
            v.resize(0x26, 0);
            v.extend([0xff; 8]);
            v.resize(0x200, 0);
            v
        }),
        ("dfsn_metadata_deep.dfsn", {
            let mut v = b"DFSN\x00\x02".to_vec();
            v.resize(0x26, 0);
            v.extend(0x100u32.to_be_bytes());
            v.extend(0x30100u32.to_be_bytes());
            v.resize(0x100, 0);
            v.extend("[".repeat(0x30000).as_bytes());
            v
        }),
        (
            "garbage.png",
            b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\xff\xff\xff\xff".to_vec(),
        ),
        (
            "random.bin",
            (0..4096u32)
                .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
                .collect(),
        ),
    ];
    // A frame that inflates to far more than its tensor's shape.
    if let Some(f) = files.iter_mut().find(|(n, _)| *n == "zt_zstd_bomb.zt") {
        let z = zstd::encode_all(&vec![0u8; 1 << 24][..], 19).unwrap();
        f.1 = zt_file(
            &z,
            vec![(
                "t",
                tensor(
                    "uint8",
                    &[1 << 10],
                    "dense",
                    vec![("data", component(64, z.len() as u64, true))],
                ),
            )],
        );
    }
    let mut out: Vec<(&'static str, PathBuf)> = files
        .into_iter()
        .map(|(name, bytes)| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            (name, p)
        })
        .collect();
    let sub = dir.join("a_directory.safetensors");
    std::fs::create_dir(&sub).unwrap();
    out.push(("a_directory.safetensors", sub));
    let fifo = dir.join("a_fifo.safetensors");
    mkfifo(&fifo);
    out.push(("a_fifo.safetensors", fifo));
    out
}

/// Files whose manifest is sound, whose data cannot be decoded.
const READABLE_MANIFESTS: [&str; 3] = ["zt_sparse_huge.zt", "zt_csr_huge.zt", "zt_zstd_bomb.zt"];

#[test]
fn hostile_files_are_refused_without_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = hostile_inputs(dir.path());
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    for (name, path) in &inputs {
        let p = s(path);
        let out_zt = out_dir.join("o.zt");
        let out_st = out_dir.join("o.safetensors");
        let commands: Vec<(&str, Vec<&str>)> = vec![
            ("inspect", vec!["inspect", p]),
            ("hash", vec!["hash", p]),
            ("hash --structural", vec!["hash", "--structural", p]),
            ("convert to .zt", vec!["convert", p, s(&out_zt)]),
            ("convert to .safetensors", vec!["convert", p, s(&out_st)]),
            ("dfsn verify", vec!["dfsn", "verify", p]),
            ("diff", vec!["diff", p, p]),
        ];
        for (what, args) in commands {
            let r = run_env(&args, &[], Duration::from_secs(20));
            let d = r.describe(&format!("{name} / {what}"));
            assert!(
                r.signal.is_none() && r.code != Some(101) && r.code != Some(134),
                "{d}"
            );
            assert!(r.cpu < Duration::from_secs(10), "{d}");
            assert!(r.peak_rss < 512 << 20, "{d}");
            // A plain hash reads any regular file; the structural views read safetensors as
            // laxly as weight-inspect does; a zTensor file whose manifest is sound lists
            // although its data cannot be decoded. Everything else is refused.
            let must_refuse = match what {
                "hash" => !path.is_file(),
                "hash --structural" | "diff" => false,
                "inspect" => !READABLE_MANIFESTS.contains(name),
                _ => true,
            };
            if must_refuse || r.code != Some(0) {
                assert_refused(&r, name, &d);
            }
            assert!(
                entries(&out_dir).is_empty(),
                "{d}: left {:?}",
                entries(&out_dir)
            );
        }
    }
}
