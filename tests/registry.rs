//! pull and push against a real registry (Debian's `docker-registry`, the CNCF distribution
//! registry), started on a free loopback port with its storage in a temporary folder, and
//! against small hand-made servers for the ways a registry can misbehave.

mod common;

use common::registry::Registry;
use common::{s, write_safetensors, zimage_in};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zimage::safetensors::Dtype;

fn tiny_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn failed(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    err
}

/// The number in `N <word>` of a summary line (`3 blobs downloaded`).
fn count_before(text: &str, word: &str) -> usize {
    let at = text
        .find(word)
        .unwrap_or_else(|| panic!("`{word}` in {text}"));
    text[..at]
        .split_whitespace()
        .last()
        .unwrap()
        .trim_start_matches('(')
        .parse()
        .unwrap()
}

fn manifest_bytes(store: &Path, name: &str) -> Vec<u8> {
    let n = zimage::store::ModelName::parse(name).unwrap();
    std::fs::read(store.join(n.manifest_path())).unwrap()
}

fn digests(manifest: &[u8]) -> HashSet<String> {
    let m = zimage::store::Manifest::parse(manifest).unwrap();
    m.digests().map(str::to_string).collect()
}

/// Files in `blobs/` (partial ones included).
fn blob_files(store: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(store.join("blobs")) else {
        return Vec::new();
    };
    let mut v: Vec<String> = dir
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A small model of `count` tensors of `floats` f32 each, one file.
fn synthetic(dir: &Path, count: usize, floats: usize, seed: u32) -> PathBuf {
    let path = dir.join(format!("synthetic-{seed}.safetensors"));
    let tensors: Vec<(String, Vec<u8>)> = (0..count)
        .map(|i| {
            let bytes = (0..floats)
                .flat_map(|j| ((seed as f32) + (i * floats + j) as f32).to_le_bytes())
                .collect();
            (format!("layers.{i}.weight"), bytes)
        })
        .collect();
    let refs: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, b)| (n.as_str(), Dtype::F32, vec![floats as u64], b.clone()))
        .collect();
    write_safetensors(&path, &refs);
    path
}

fn generate(store: &Path, model: &str, out: &Path) -> Vec<u8> {
    ok(&zimage_in(
        store,
        &[
            "generate",
            "a fox",
            "--model",
            model,
            "--width",
            "64",
            "--height",
            "64",
            "--steps",
            "2",
            "--seed",
            "7",
            "-o",
            s(out),
        ],
    ));
    image::open(out).unwrap().to_rgb8().into_raw()
}

#[test]
fn a_model_pushed_removed_and_pulled_back_verifies_and_generates_the_same_pixels() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    ok(&zimage_in(
        &store,
        &["create", "tiny", "--from", s(&tiny_model())],
    ));
    let before = generate(&store, "tiny", &dir.path().join("before.png"));
    let remote = format!("{}/me/tiny:v1", registry.host);
    let out = ok(&zimage_in(
        &store,
        &["push", "tiny", "--to", &remote, "--insecure"],
    ));
    let stored = manifest_bytes(&store, "tiny");
    assert_eq!(count_before(&out, "blobs uploaded"), digests(&stored).len());

    // The registry keeps the manifest as it was sent: layer names, dtypes and shapes intact.
    let served = registry.get("/v2/me/tiny/manifests/v1");
    assert_eq!(served.status(), 200);
    assert_eq!(served.bytes().unwrap().to_vec(), stored);

    // A second push finds every blob there.
    let out = ok(&zimage_in(
        &store,
        &["push", "tiny", "--to", &remote, "--insecure"],
    ));
    assert_eq!(count_before(&out, "blobs uploaded"), 0);

    ok(&zimage_in(&store, &["rm", "tiny"]));
    ok(&zimage_in(&store, &["gc"]));
    assert!(blob_files(&store).is_empty(), "{:?}", blob_files(&store));
    let out = ok(&zimage_in(&store, &["pull", &remote, "--insecure"]));
    assert_eq!(
        count_before(&out, "blobs downloaded"),
        digests(&stored).len()
    );
    assert_eq!(manifest_bytes(&store, &remote), stored);
    ok(&zimage_in(&store, &["verify", &remote]));
    let after = generate(&store, &remote, &dir.path().join("after.png"));
    assert_eq!(before, after);
}

#[test]
fn a_pull_into_a_store_holding_the_text_encoder_downloads_only_the_other_blobs() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    ok(&zimage_in(
        &first,
        &["create", "tiny", "--from", s(&tiny_model())],
    ));
    let remote = format!("{}/me/tiny", registry.host);
    ok(&zimage_in(
        &first,
        &["push", "tiny", "--to", &remote, "--insecure"],
    ));
    let all = digests(&manifest_bytes(&first, "tiny"));

    // Another store already holds the same text encoder, imported from its own files.
    let second = dir.path().join("second");
    for (i, shard) in ["model-00001-of-00002", "model-00002-of-00002"]
        .iter()
        .enumerate()
    {
        let file = tiny_model().join(format!("text_encoder/{shard}.safetensors"));
        ok(&zimage_in(
            &second,
            &[
                "create",
                &format!("te{i}"),
                "--from",
                s(&file),
                "--component",
                "text_encoder",
            ],
        ));
    }
    let held: HashSet<String> = blob_files(&second)
        .iter()
        .map(|f| f.replacen("sha256-", "sha256:", 1))
        .filter(|d| all.contains(d))
        .collect();
    assert!(held.len() > 10, "the text encoder's blobs are shared");

    let out = ok(&zimage_in(&second, &["pull", &remote, "--insecure"]));
    assert_eq!(count_before(&out, "already present"), held.len(), "{out}");
    assert_eq!(
        count_before(&out, "blobs downloaded"),
        all.len() - held.len()
    );
    ok(&zimage_in(&second, &["verify", &remote]));
}

/// Forwards requests to a registry; while `stall` is set, a blob request gets the headers and
/// the first half of the bytes, then nothing.
fn stalling_proxy(upstream: String, stall: Arc<AtomicBool>) -> String {
    serve(move |req, stream| {
        let client = reqwest::blocking::Client::new();
        let mut r = client.request(
            req.method.parse().unwrap(),
            format!("http://{upstream}{}", req.path),
        );
        for (k, v) in &req.headers {
            if k != "host" {
                r = r.header(k.as_str(), v.as_str());
            }
        }
        let resp = r.send().unwrap();
        let status = resp.status().as_u16();
        let headers: Vec<(String, String)> = resp
            .headers()
            .iter()
            .filter(|(k, _)| {
                ["content-type", "content-range", "docker-content-digest"].contains(&k.as_str())
            })
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        let body = resp.bytes().unwrap().to_vec();
        let mut head = format!(
            "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        if stall.load(Ordering::SeqCst) && req.path.contains("/blobs/") && body.len() > 1 << 20 {
            stream.write_all(&body[..body.len() / 2])?;
            stream.flush()?;
            while stall.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            return Ok(());
        }
        stream.write_all(&body)
    })
}

#[test]
fn a_pull_killed_midway_and_run_again_resumes_completes_and_verifies() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // One blob of 12 MB, so the pull is surely midway when it is killed.
    let model = synthetic(dir.path(), 1, 3 << 20, 1);
    ok(&zimage_in(&store, &["create", "big", "--from", s(&model)]));
    ok(&zimage_in(
        &store,
        &[
            "push",
            "big",
            "--to",
            &format!("{}/me/big", registry.host),
            "--insecure",
        ],
    ));
    let stored = manifest_bytes(&store, "big");
    let stall = Arc::new(AtomicBool::new(true));
    let proxy = stalling_proxy(registry.host.clone(), stall.clone());
    let remote = format!("{proxy}/me/big");

    let target = dir.path().join("target");
    let mut child = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .args(["--store", s(&target), "pull", &remote, "--insecure"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let partial = loop {
        let found = blob_files(&target)
            .into_iter()
            .find(|f| f.starts_with(".partial-"))
            .map(|f| target.join("blobs").join(f))
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= 2 << 20));
        if let Some(p) = found {
            break p;
        }
        assert!(Instant::now() < deadline, "the pull never got midway");
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    stall.store(false, Ordering::SeqCst);
    assert!(partial.exists());
    assert!(!target
        .join(
            zimage::store::ModelName::parse(&remote)
                .unwrap()
                .manifest_path()
        )
        .exists());

    let out = ok(&zimage_in(&target, &["pull", &remote, "--insecure"]));
    assert!(out.contains("resumed"), "{out}");
    assert!(!partial.exists());
    assert_eq!(manifest_bytes(&target, &remote), stored);
    ok(&zimage_in(&target, &["verify", &remote]));
}

#[test]
fn a_blob_corrupted_in_the_registry_fails_the_pull_and_leaves_no_blob_and_no_manifest() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let model = synthetic(dir.path(), 3, 1000, 2);
    ok(&zimage_in(&store, &["create", "m", "--from", s(&model)]));
    let remote = format!("{}/me/m", registry.host);
    ok(&zimage_in(
        &store,
        &["push", "m", "--to", &remote, "--insecure"],
    ));
    let manifest = zimage::store::Manifest::parse(&manifest_bytes(&store, "m")).unwrap();
    let victim = manifest.layers[1].digest.clone();
    let data = registry.blob_data(&victim);
    let mut bytes = std::fs::read(&data).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();

    let target = dir.path().join("target");
    let err = failed(&zimage_in(
        &target,
        &["pull", &remote, "--insecure", "--parallel", "1"],
    ));
    assert!(err.contains("hash to"), "{err}");
    assert!(err.contains(&victim), "{err}");
    let files = blob_files(&target);
    assert!(
        !files
            .iter()
            .any(|f| f.contains(&victim[7..]) || f.starts_with(".partial")),
        "{files:?}"
    );
    assert!(
        !target.join("manifests").exists()
            || std::fs::read_dir(target.join("manifests"))
                .unwrap()
                .next()
                .is_none()
    );
}

#[test]
fn basic_auth_logs_in_and_a_wrong_password_is_a_clear_error() {
    let registry = Registry::start_with(Some(("alice", "s3cret")));
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let model = synthetic(dir.path(), 2, 100, 3);
    ok(&zimage_in(&store, &["create", "m", "--from", s(&model)]));
    let remote = format!("{}/team/m", registry.host);

    let err = failed(&zimage_in(
        &store,
        &["push", "m", "--to", &remote, "--insecure"],
    ));
    assert!(
        err.contains("asks for a login") && err.contains("--user"),
        "{err}"
    );

    ok(&zimage_in(
        &store,
        &[
            "push",
            "m",
            "--to",
            &remote,
            "--insecure",
            "--user",
            "alice:s3cret",
        ],
    ));
    let creds = dir.path().join("credentials");
    std::fs::write(
        &creds,
        format!("# logins\n{} alice:s3cret\n", registry.host),
    )
    .unwrap();
    let target = dir.path().join("target");
    ok(&zimage_in(
        &target,
        &["pull", &remote, "--insecure", "--credentials", s(&creds)],
    ));
    ok(&zimage_in(&target, &["verify", &remote]));

    let err = failed(&zimage_in(
        &target,
        &["pull", &remote, "--insecure", "--user", "alice:wrong"],
    ));
    assert!(err.contains("refused user `alice`"), "{err}");
    assert!(!err.contains("wrong"), "the password is not printed: {err}");
}

// ---------------------------------------------------------------------------------------------
// Hand-made servers.

/// A request as the hand-made servers see it.
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Serves each connection's one request with `handler` on its own thread; returns `host:port`.
/// The listener lives until the test process ends.
fn serve(
    handler: impl Fn(&Request, &mut TcpStream) -> std::io::Result<()> + Send + Sync + 'static,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let handler = Arc::new(handler);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let handler = handler.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let mut parts = line.split_whitespace();
                let method = parts.next().unwrap_or("").to_string();
                let path = parts.next().unwrap_or("").to_string();
                let mut headers = Vec::new();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                    }
                }
                let req = Request {
                    method,
                    path,
                    headers,
                };
                let len: u64 = req
                    .header("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let _ = std::io::copy(&mut (&mut reader).take(len), &mut std::io::sink());
                let _ = handler(&req, &mut stream);
            });
        }
    });
    host
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)
}

/// A one-blob model as a registry would serve it: (manifest bytes, config digest, blob digest,
/// blob bytes).
fn one_blob_model() -> (Vec<u8>, String, Vec<u8>) {
    use sha2::Digest;
    let blob = b"0123456789abcdef".repeat(64);
    let digest = format!("sha256:{:x}", sha2::Sha256::digest(&blob));
    let config = zimage::store::manifest::config_blob("");
    let config_digest = format!("sha256:{:x}", sha2::Sha256::digest(&config));
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"{config_digest}","size":{}}},"layers":[{{"mediaType":"application/vnd.ollama.image.json","digest":"{digest}","size":{},"name":"model_index.json"}}]}}"#,
        config.len(),
        blob.len()
    );
    (manifest.into_bytes(), digest, blob)
}

/// A server for [`one_blob_model`] whose blob requests `blob` answers.
fn model_server(
    blob: impl Fn(&Request, &mut TcpStream, &[u8]) -> std::io::Result<()> + Send + Sync + 'static,
) -> String {
    let (manifest, _, bytes) = one_blob_model();
    let config = zimage::store::manifest::config_blob("");
    serve(move |req, stream| {
        if req.path.contains("/manifests/") {
            respond(stream, "200 OK", &[], &manifest)
        } else if req.path.ends_with(&format!(
            "{:x}",
            <sha2::Sha256 as sha2::Digest>::digest(&config)
        )) {
            respond(stream, "200 OK", &[], &config)
        } else {
            blob(req, stream, &bytes)
        }
    })
}

fn pull_from(host: &str, extra: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("{host}/me/m");
    let mut args = vec!["pull", name.as_str(), "--insecure"];
    args.extend_from_slice(extra);
    let out = zimage_in(&dir.path().join("store"), &args);
    (out, dir)
}

/// Nothing of the model in the store: no blob, no partial file, no manifest.
fn assert_nothing_kept(dir: &Path) {
    let store = dir.join("store");
    let (_, digest, _) = one_blob_model();
    let files: Vec<String> = blob_files(&store)
        .into_iter()
        .filter(|f| f.starts_with(".partial") || f.ends_with(&digest[7..]))
        .collect();
    assert!(files.is_empty(), "{files:?}");
    assert!(!store.join("manifests").exists());
}

#[test]
fn a_registry_that_sends_more_bytes_than_the_manifest_says_is_stopped() {
    let host = model_server(|_, stream, bytes| {
        stream.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")?;
        stream.write_all(bytes)?;
        stream.write_all(b"and more")
    });
    let (out, dir) = pull_from(&host, &[]);
    let err = failed(&out);
    assert!(err.contains("sent more than the 1024 bytes"), "{err}");
    assert_nothing_kept(dir.path());
}

#[test]
fn an_endless_blob_stream_is_stopped_at_the_declared_size() {
    let host = model_server(|_, stream, _| {
        stream.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")?;
        let chunk = vec![b'x'; 64 << 10];
        loop {
            stream.write_all(&chunk)?;
        }
    });
    let (out, dir) = pull_from(&host, &[]);
    let err = failed(&out);
    assert!(err.contains("sent more than"), "{err}");
    assert_nothing_kept(dir.path());
}

#[test]
fn a_stalled_blob_stream_times_out_with_the_limit_named() {
    let host = model_server(|_, stream, bytes| {
        stream.write_all(
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", bytes.len()).as_bytes(),
        )?;
        stream.write_all(&bytes[..100])?;
        std::thread::sleep(Duration::from_secs(30));
        Ok(())
    });
    let started = Instant::now();
    let (out, _dir) = pull_from(&host, &["--stall-timeout", "1"]);
    let err = failed(&out);
    assert!(err.contains("sent nothing for 1 s"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn wrong_bytes_of_the_right_size_are_a_digest_error() {
    let host = model_server(|_, stream, bytes| {
        let mut wrong = bytes.to_vec();
        wrong[0] ^= 1;
        respond(stream, "200 OK", &[], &wrong)
    });
    let (out, dir) = pull_from(&host, &[]);
    let err = failed(&out);
    assert!(
        err.contains("hash to") && err.contains("nothing was kept"),
        "{err}"
    );
    assert_nothing_kept(dir.path());
}

#[test]
fn a_manifest_larger_than_the_limit_is_refused_unread() {
    let host = serve(|_, stream| {
        stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\n\r\n")?;
        stream.write_all(&[b' '; 1 << 16])
    });
    let (out, dir) = pull_from(&host, &[]);
    let err = failed(&out);
    assert!(err.contains("more than the 67108864"), "{err}");
    assert!(!dir.path().join("store/manifests").exists());
}

#[test]
fn digests_and_names_from_a_registry_are_validated_before_they_touch_the_disk() {
    let host = serve(|_, stream| {
        respond(
            stream,
            "200 OK",
            &[],
            br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{"mediaType":"x","digest":"sha256:../../../../tmp/evil","size":1},"layers":[]}"#,
        )
    });
    let (out, dir) = pull_from(&host, &[]);
    let err = failed(&out);
    assert!(err.contains("invalid digest"), "{err}");
    assert!(!dir.path().join("store/manifests").exists());
    assert!(blob_files(&dir.path().join("store")).is_empty());
}

#[test]
fn a_manifest_that_does_not_match_its_announced_digest_is_refused() {
    let (manifest, _, _) = one_blob_model();
    let host = serve(move |_, stream| {
        respond(
            stream,
            "200 OK",
            &[(
                "docker-content-digest",
                format!("sha256:{}", "ab".repeat(32)),
            )],
            &manifest,
        )
    });
    let (out, _dir) = pull_from(&host, &[]);
    let err = failed(&out);
    assert!(err.contains("but the registry says"), "{err}");
}

#[test]
fn a_bearer_challenge_is_answered_with_a_token_from_its_realm() {
    let (manifest, _, bytes) = one_blob_model();
    let config = zimage::store::manifest::config_blob("");
    let host_cell: Arc<std::sync::OnceLock<String>> = Arc::new(std::sync::OnceLock::new());
    let cell = host_cell.clone();
    let host = serve(move |req, stream| {
        let me = cell.get().unwrap();
        if req.path.starts_with("/token") {
            // "bob:pw" in base64.
            if req.header("authorization") != Some("Basic Ym9iOnB3") {
                return respond(stream, "401 Unauthorized", &[], b"{}");
            }
            assert!(
                req.path.contains("scope=repository%3Ame%2Fm%3Apull"),
                "{}",
                req.path
            );
            return respond(stream, "200 OK", &[], br#"{"token":"tok-123"}"#);
        }
        if req.header("authorization") != Some("Bearer tok-123") {
            let challenge = format!(
                r#"Bearer realm="http://{me}/token",service="test",scope="repository:me/m:pull""#
            );
            return respond(
                stream,
                "401 Unauthorized",
                &[("www-authenticate", challenge)],
                b"",
            );
        }
        if req.path.contains("/manifests/") {
            respond(stream, "200 OK", &[], &manifest)
        } else if req.path.ends_with(&format!(
            "{:x}",
            <sha2::Sha256 as sha2::Digest>::digest(&config)
        )) {
            respond(stream, "200 OK", &[], &config)
        } else {
            respond(stream, "200 OK", &[], &bytes)
        }
    });
    host_cell.set(host.clone()).unwrap();
    let (out, _dir) = pull_from(&host, &["--user", "bob:pw"]);
    let text = ok(&out);
    assert_eq!(count_before(&text, "blobs downloaded"), 2);

    let (out, _dir) = pull_from(&host, &["--user", "bob:nope"]);
    let err = failed(&out);
    assert!(
        err.contains("token service") && err.contains("refused user `bob`"),
        "{err}"
    );
}

#[test]
fn an_upload_location_that_leaves_http_is_refused() {
    let host = serve(|req, stream| {
        if req.method == "HEAD" {
            respond(stream, "404 Not Found", &[], b"")
        } else {
            respond(
                stream,
                "202 Accepted",
                &[("location", "file:///etc/passwd".to_string())],
                b"",
            )
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let model = synthetic(dir.path(), 1, 10, 4);
    ok(&zimage_in(&store, &["create", "m", "--from", s(&model)]));
    let err = failed(&zimage_in(
        &store,
        &["push", "m", "--to", &format!("{host}/me/m"), "--insecure"],
    ));
    assert!(
        err.contains("file:///etc/passwd") && err.contains("not HTTPS"),
        "{err}"
    );
}

#[test]
fn a_model_the_registry_lacks_is_named_in_the_error() {
    let host = serve(|_, stream| {
        respond(
            stream,
            "404 Not Found",
            &[],
            br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
        )
    });
    let (out, _dir) = pull_from(&host, &[]);
    let err = failed(&out);
    assert!(err.contains("is not in the registry"), "{err}");
}
