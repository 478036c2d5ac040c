//! Soak figures for `zimage serve` under `--memory-limit`: a mixed stream of requests from a few
//! clients on loopback (every API, small and large, pictures that decode and picture bombs,
//! over-long prompts and subnormal numbers that are refused), bounded in count and time; then
//! the latency of one small request and the server's resident memory, idle before and after.
//!
//! `cargo build --release && cargo run --release --example serve_soak [-- REQUESTS SECONDS]`
//! (default 300 requests, at most 300 s). It runs the `zimage` binary beside its own folder
//! (`target/release/zimage`), or the one `ZIMAGE_BIN` names, on the demo model.

use base64::Engine;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CLIENTS: usize = 4;
const MEMORY_LIMIT: &str = "2GB";

/// One request of the stream: its name, method, path and body.
struct Kind {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    body: String,
}

/// Sends one request and reads the whole answer: its status, its text and how long it took.
fn send(port: u16, method: &str, path: &str, body: &str) -> (u16, String, Duration) {
    let start = Instant::now();
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new(), start.elapsed());
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text, start.elapsed())
}

/// `VmRSS` and `VmHWM` of process `pid`, in MB.
fn memory_mb(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1e3)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A PNG of `side`² pixels; `bomb`: 16-bit RGBA zeros, a small file that decodes large.
fn png(side: u32, bomb: bool) -> String {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, side, side);
    let (color, depth, bytes) = if bomb {
        (png::ColorType::Rgba, png::BitDepth::Sixteen, 8)
    } else {
        (png::ColorType::Rgb, png::BitDepth::Eight, 3)
    };
    enc.set_color(color);
    enc.set_depth(depth);
    let mut writer = enc.write_header().expect("png header");
    let mut stream = writer.stream_writer().expect("png stream");
    for y in 0..side {
        let row: Vec<u8> = (0..side as usize * bytes)
            .map(|x| if bomb { 0 } else { (x as u32 ^ y) as u8 })
            .collect();
        stream.write_all(&row).expect("png row");
    }
    stream.finish().expect("png end");
    writer.finish().expect("png end");
    base64::engine::general_purpose::STANDARD.encode(out)
}

/// The stream's kinds, in the order they repeat.
fn kinds() -> Vec<Kind> {
    let picture = png(64, false);
    let bomb = png(8192, true);
    let large = png(1024, false);
    let small = r#""width": 64, "height": 64, "steps": 1"#;
    let a1111_small = r#""width": 64, "height": 64, "steps": 1, "cfg_scale": 0"#;
    let kind = |name, method, path, body: String| Kind {
        name,
        method,
        path,
        body,
    };
    vec![
        kind(
            "ollama 64²",
            "POST",
            "/api/generate",
            format!(r#"{{"model": "tiny", "prompt": "a fox", "stream": false, {small}}}"#),
        ),
        kind(
            "openai 64²",
            "POST",
            "/v1/images/generations",
            r#"{"model": "tiny", "prompt": "a fox", "size": "64x64", "steps": 1}"#.into(),
        ),
        kind(
            "a1111 txt2img 64²",
            "POST",
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "a fox", {a1111_small}}}"#),
        ),
        kind(
            "a1111 inpaint 64²",
            "POST",
            "/sdapi/v1/img2img",
            format!(
                r#"{{"prompt": "a fox", {a1111_small}, "init_images": ["{picture}"], "mask": "{picture}", "mask_blur": 4}}"#
            ),
        ),
        kind(
            "page 64²",
            "POST",
            "/ui/api/jobs",
            format!(r#"{{"prompt": "a fox", {small}}}"#),
        ),
        kind(
            "a1111 txt2img 256²",
            "POST",
            "/sdapi/v1/txt2img",
            r#"{"prompt": "a fox", "width": 256, "height": 256, "steps": 2, "cfg_scale": 0}"#
                .into(),
        ),
        kind(
            "a1111 img2img 1024² picture to 64²",
            "POST",
            "/sdapi/v1/img2img",
            format!(r#"{{"prompt": "a fox", {a1111_small}, "init_images": ["{large}"]}}"#),
        ),
        kind(
            "a1111 bomb (refused)",
            "POST",
            "/sdapi/v1/img2img",
            format!(
                r#"{{"prompt": "a fox", {a1111_small}, "init_images": ["{bomb}"], "mask": "{bomb}"}}"#
            ),
        ),
        kind(
            "ollama bomb (refused)",
            "POST",
            "/api/generate",
            format!(
                r#"{{"model": "tiny", "prompt": "a fox", "stream": false, {small}, "images": ["{bomb}"]}}"#
            ),
        ),
        kind(
            "page 1 MB prompt (refused)",
            "POST",
            "/ui/api/jobs",
            format!(r#"{{"prompt": "{}", {small}}}"#, "fox ".repeat(250_000)),
        ),
        kind(
            "a1111 subnormal blur (refused)",
            "POST",
            "/sdapi/v1/img2img",
            format!(
                r#"{{"prompt": "a fox", {a1111_small}, "init_images": ["{picture}"], "mask": "{picture}", "mask_blur": 1e-40}}"#
            ),
        ),
        kind("listing", "GET", "/api/tags", String::new()),
    ]
}

/// The `zimage` binary: `ZIMAGE_BIN`, else the one built beside this example.
fn binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("ZIMAGE_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().expect("this example's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/PROFILE/examples")
        .join("zimage")
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let total: usize = args.first().map_or(Ok(300), |a| a.parse())?;
    let seconds: u64 = args.get(1).map_or(Ok(300), |a| a.parse())?;
    let bin = binary();
    anyhow::ensure!(
        bin.is_file(),
        "no zimage binary at {}; build it first or set ZIMAGE_BIN",
        bin.display()
    );
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let created = Command::new(&bin)
        .arg("--store")
        .arg(&store)
        .args(["create", "tiny", "--from"])
        .arg(&demo)
        .output()?;
    anyhow::ensure!(
        created.status.success(),
        "create: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let server = Server(
        Command::new(&bin)
            .arg("--store")
            .arg(&store)
            .args([
                "serve",
                "--host",
                &format!("127.0.0.1:{port}"),
                "--memory-limit",
                MEMORY_LIMIT,
            ])
            .args(["--keep-alive", "-1", "--gallery-dir"])
            .arg(dir.path().join("gallery"))
            .env_remove("ZIMAGE_API_KEY")
            .env_remove("ZIMAGE_MAX_QUEUE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let pid = server.0.id();
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "the server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let kinds = kinds();
    let (status, _, warm) = send(port, kinds[0].method, kinds[0].path, &kinds[0].body);
    anyhow::ensure!(status == 200, "the first request answered {status}");
    std::thread::sleep(Duration::from_secs(1));
    let (idle_before, _) = memory_mb(pid);

    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, u16, Duration)>> = Mutex::new(Vec::new());
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let run = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total || Instant::now() > deadline {
                    return;
                }
                let k = n % kinds.len();
                let (status, _, took) = send(port, kinds[k].method, kinds[k].path, &kinds[k].body);
                results.lock().unwrap().push((k, status, took));
            });
        }
    });
    let run = run.elapsed();
    // Page jobs run after their answer: wait for the worker to go idle.
    let idle_by = Instant::now() + Duration::from_secs(120);
    while Instant::now() < idle_by {
        let (_, progress, _) = send(port, "GET", "/sdapi/v1/progress", "");
        if progress.contains("\"job_count\":0") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, _, last) = send(port, kinds[0].method, kinds[0].path, &kinds[0].body);
    std::thread::sleep(Duration::from_secs(1));
    let (idle_after, peak) = memory_mb(pid);

    let results = results.into_inner().unwrap();
    println!("serve_soak: --memory-limit {MEMORY_LIMIT}, {CLIENTS} clients, demo model");
    println!(
        "requests {} in {:.1} s (first request {:.2} s)",
        results.len(),
        run.as_secs_f64(),
        warm.as_secs_f64()
    );
    for (k, kind) in kinds.iter().enumerate() {
        let mine: Vec<&(usize, u16, Duration)> = results.iter().filter(|r| r.0 == k).collect();
        let mut statuses: Vec<u16> = mine.iter().map(|r| r.1).collect();
        statuses.sort_unstable();
        statuses.dedup();
        let slowest = mine.iter().map(|r| r.2).max().unwrap_or_default();
        println!(
            "  {:<36} {:>4}  statuses {:?}  slowest {:.2} s",
            kind.name,
            mine.len(),
            statuses,
            slowest.as_secs_f64()
        );
    }
    let refused = results.iter().filter(|r| (400..500).contains(&r.1)).count();
    let busy = results.iter().filter(|r| r.1 == 503).count();
    let failed = results
        .iter()
        .filter(|r| r.1 == 0 || r.1 >= 500 && r.1 != 503)
        .count();
    println!("refused (4xx) {refused}, busy (503) {busy}, failed (5xx or no answer) {failed}");
    println!("RSS idle before {idle_before:.0} MB, after {idle_after:.0} MB, peak {peak:.0} MB");
    println!(
        "final small request: {status} in {:.3} s",
        last.as_secs_f64()
    );
    anyhow::ensure!(status == 200, "the final small request answered {status}");
    Ok(())
}
