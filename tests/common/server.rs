//! A `zimage serve` process on a free loopback port for the tests, and raw HTTP to it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_zimage");

/// A store holding the demo model as `tiny`.
pub fn demo_store(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let out = super::zimage_in(&store, &["create", "tiny", "--from", super::s(&demo)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    store
}

/// A running server; killed when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn start(store: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.arg("--store")
            .arg(store)
            .args(["serve", "--host", &format!("127.0.0.1:{port}")])
            .args(args)
            .env_remove("ZIMAGE_API_KEY")
            .env_remove("ZIMAGE_KEEP_ALIVE")
            .env_remove("ZIMAGE_MAX_QUEUE")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let server = Server { child, port, log };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the server did not start: {:?}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits for a log line containing `needle`.
    pub fn wait_for_log(&self, needle: &str) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self.log().into_iter().find(|l| l.contains(needle)) {
                return l;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no log line with `{needle}`: {:?}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Resident memory of the server process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let out = Command::new("ps")
            .args(["-o", "rss=", "-p", &self.child.id().to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends raw bytes and reads the whole answer: (status, body with chunking undone).
pub fn raw(port: u16, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // A server that refuses a body early may stop reading it; its answer still comes.
    let _ = stream.write_all(request);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

pub fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

pub fn request(method: &str, path: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub fn post(port: u16, path: &str, body: &str) -> (u16, String) {
    raw(
        port,
        &request("POST", path, "Content-Type: application/json\r\n", body),
    )
}

pub fn get(port: u16, path: &str) -> (u16, String) {
    raw(port, &request("GET", path, "", ""))
}

pub fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The RGB pixels of a PNG.
pub fn pixels(png: &[u8]) -> (u32, u32, Vec<u8>) {
    let img = image::load_from_memory(png).unwrap().to_rgb8();
    (img.width(), img.height(), img.into_raw())
}

pub fn b64(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

/// A form field: its name, a file name for files, and its bytes.
pub type FormPart = (&'static str, Option<&'static str>, Vec<u8>);

/// A `multipart/form-data` POST of `parts`, as HTTP clients send one.
pub fn form_request(path: &str, parts: &[FormPart]) -> Vec<u8> {
    let boundary = "zimage-test-boundary-7MA4YWxkTrZu0gW";
    let mut body = Vec::new();
    for (name, file, bytes) in parts {
        body.extend(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"").bytes(),
        );
        if let Some(f) = file {
            body.extend(format!("; filename=\"{f}\"\r\nContent-Type: image/png").bytes());
        }
        body.extend(b"\r\n\r\n");
        body.extend(bytes);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{boundary}--\r\n").bytes());
    let mut out = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend(body);
    out
}

/// A rank-4 LoRA on the attention of the demo's two main blocks, in the diffusers layout, with
/// values that change the image.
pub fn write_attention_lora(path: &Path) {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut values = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2).to_le_bytes()
            })
            .collect()
    };
    let mut tensors = Vec::new();
    for layer in 0..2 {
        for m in ["to_q", "to_k", "to_v", "to_out.0"] {
            let module = format!("transformer.layers.{layer}.attention.{m}");
            tensors.push((
                format!("{module}.lora_A.weight"),
                vec![4, 256],
                values(4 * 256),
            ));
            tensors.push((
                format!("{module}.lora_B.weight"),
                vec![256, 4],
                values(256 * 4),
            ));
        }
    }
    let refs: Vec<(&str, zimage::safetensors::Dtype, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.as_str(),
                zimage::safetensors::Dtype::F32,
                s.clone(),
                b.clone(),
            )
        })
        .collect();
    super::write_safetensors(path, &refs);
}
