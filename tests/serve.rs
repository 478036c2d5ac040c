//! `zimage serve` end to end: the real server on a free loopback port, driven by the official
//! `ollama` and `openai` Python clients and by raw HTTP, on the embedded demo model.

use sha2::Digest;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;
use common::s;
use common::server::*;

/// `zimage generate` on the same store, read back as pixels.
fn cli_pixels(store: &Path, dir: &Path, seed: u64, steps: u32) -> (u32, u32, Vec<u8>) {
    cli_pixels_with(store, dir, seed, steps, &[])
}

/// [`cli_pixels`] with `extra` arguments (e.g. `--lora FILE`).
fn cli_pixels_with(
    store: &Path,
    dir: &Path,
    seed: u64,
    steps: u32,
    extra: &[&str],
) -> (u32, u32, Vec<u8>) {
    let (steps, seed) = (steps.to_string(), seed.to_string());
    let mut args = vec![
        "--width", "64", "--height", "64", "--steps", &steps, "--seed", &seed,
    ];
    args.extend(extra);
    cli_generate(store, dir, &args)
}

/// The pixels `zimage generate "a red fox in the snow" --model tiny` makes with `flags`.
fn cli_generate(store: &Path, dir: &Path, flags: &[&str]) -> (u32, u32, Vec<u8>) {
    let png = dir.join("cli.png");
    let mut args = vec![
        "generate",
        "a red fox in the snow",
        "--model",
        "tiny",
        "-o",
        s(&png),
    ];
    args.extend(flags);
    let out = common::zimage_in(store, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    pixels(&std::fs::read(&png).unwrap())
}

#[test]
fn official_clients_get_the_pixels_zimage_generate_makes() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    let python = common::test_python();
    let inputs = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs");
    let picture = inputs.join("picture-96x80.png");
    let mask = inputs.join("mask-96x80.png");
    let rgba_mask = dir.path().join("mask-rgba.png");
    write_alpha_mask(&mask, &rgba_mask);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve_clients.py");
    let out = Command::new(python)
        .arg(script)
        .args([
            &server.url(),
            "tiny",
            s(dir.path()),
            s(&picture),
            s(&rgba_mask),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{:?}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    let report = json(String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(report["list"], serde_json::json!(["tiny:latest"]));
    assert_eq!(report["show_capabilities"], serde_json::json!(["image"]));
    assert_eq!(report["progress"], serde_json::json!([[1, 2], [2, 2]]));
    assert_eq!(report["ps"], serde_json::json!(["tiny:latest"]));
    assert_eq!(report["openai_models"], serde_json::json!(["tiny:latest"]));
    assert_eq!(report["missing_model"][0], 404);
    let url = report["url"].as_str().unwrap();
    assert!(url.starts_with(&server.url()), "{url}");
    assert!(
        report["several_note"]
            .as_str()
            .is_some_and(|n| n.contains("1 more `image[]`")),
        "{report}"
    );

    let expected = cli_pixels(&store, dir.path(), 7, 2);
    for name in [
        "ollama.png",
        "ollama-stream.png",
        "openai.png",
        "openai-url.png",
    ] {
        let png = std::fs::read(dir.path().join(name)).unwrap();
        assert!(
            pixels(&png) == expected,
            "{name} differs from `zimage generate`"
        );
    }
    assert_eq!(report["edit_strength"][0], 400);

    let img2img = cli_pixels_from(
        &store,
        dir.path(),
        &["--image", s(&picture), "--strength", "0.75"],
    );
    let png = std::fs::read(dir.path().join("ollama-img2img.png")).unwrap();
    assert!(
        pixels(&png) == img2img,
        "Ollama's images differ from `zimage generate --image`"
    );
    let png = std::fs::read(dir.path().join("openai-edit-several.png")).unwrap();
    assert!(
        pixels(&png) == img2img,
        "an edit with several image[] files differs from `zimage generate --image` of the first"
    );
    let inpaint = cli_pixels_from(
        &store,
        dir.path(),
        &[
            "--image",
            s(&picture),
            "--mask",
            s(&mask),
            "--strength",
            "0.7",
        ],
    );
    let png = std::fs::read(dir.path().join("openai-edit.png")).unwrap();
    assert!(
        pixels(&png) == inpaint,
        "OpenAI's edit differs from `zimage generate --image --mask`"
    );
    assert!(img2img != inpaint && img2img != expected);

    let text = zimage::image_out::read_png_text(&dir.path().join("ollama.png")).unwrap();
    let params = &text.iter().find(|(k, _)| k == "parameters").unwrap().1;
    assert!(
        params.contains("Seed: 7") && params.contains("Steps: 2"),
        "{params}"
    );
    assert!(server
        .log()
        .iter()
        .any(|l| l.starts_with("POST /api/generate tiny 200")));
}

/// The pixels `zimage generate` makes for the clients' prompt, seed 7 and 2 steps, with `extra`
/// flags.
fn cli_pixels_from(store: &Path, dir: &Path, extra: &[&str]) -> (u32, u32, Vec<u8>) {
    let mut args = vec!["--steps", "2", "--seed", "7"];
    args.extend_from_slice(extra);
    cli_generate(store, dir, &args)
}

/// `mask` (white repaints) in OpenAI's convention: an RGBA picture, transparent where the
/// picture is repainted, with colours that say nothing.
fn write_alpha_mask(mask: &Path, out: &Path) {
    let grey = image::open(mask).unwrap().to_luma8();
    let rgba = image::RgbaImage::from_fn(grey.width(), grey.height(), |x, y| {
        let alpha = if grey.get_pixel(x, y).0[0] >= 128 {
            0
        } else {
            255
        };
        image::Rgba([(x * 7) as u8, (y * 13) as u8, 200, alpha])
    });
    rgba.save(out).unwrap();
}

/// Checks an error answer: its status, its API's shape, and a one-line message with `needle`.
fn assert_api_error(
    path: &str,
    (got, answer): (u16, String),
    status: u16,
    needle: &str,
    shown: &str,
) {
    assert_eq!(got, status, "{shown}: {answer}");
    let v = json(&answer);
    let message = if path.starts_with("/v1/") {
        assert!(v["error"]["type"].is_string(), "{answer}");
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    } else {
        v["error"].as_str().unwrap_or_default().to_string()
    };
    assert!(message.contains(needle), "{shown}: {message}");
    assert!(!message.contains('\n'), "{message}");
}

/// Plants an Ollama text model (a GGUF layer) in the store.
fn plant_text_model(store: &Path) {
    let blobs = store.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let hex = format!("{:x}", sha2::Sha256::digest(bytes));
        std::fs::write(blobs.join(format!("sha256-{hex}")), bytes).unwrap();
        (format!("sha256:{hex}"), bytes.len())
    };
    let (config, config_len) =
        put(br#"{"model_format":"gguf","model_family":"llama","file_type":"Q4_0"}"#);
    let (weights, weights_len) = put(b"GGUF not really");
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": config, "size": config_len},
        "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": weights, "size": weights_len}],
    });
    let dir = store.join("manifests/registry.ollama.ai/library/llama3");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("latest"), manifest.to_string()).unwrap();
}

#[test]
fn malformed_requests_get_4xx_in_each_apis_shape_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    plant_text_model(&store);
    let server = Server::start(&store, &[], &[]);
    let port = server.port;
    let gen = "/api/generate";
    let oai = "/v1/images/generations";
    // Just over the 1 MiB limit, so that the socket buffers take it all.
    let huge = format!(r#"{{"model":"tiny","prompt":"{}"}}"#, "a".repeat(1_100_000));
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("POST", gen, "{not json".into(), 400, "is not JSON"),
        ("POST", gen, "".into(), 400, "empty"),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","width":"wide"}"#.into(),
            400,
            "field `width`",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","width":-64}"#.into(),
            400,
            "field `width`",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","steps":100000}"#.into(),
            400,
            "steps is 100000",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","steps":0}"#.into(),
            400,
            "steps is 0",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","width":1000000,"height":64}"#.into(),
            400,
            "width is 1000000",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","width":8192,"height":8192}"#.into(),
            400,
            "pixels",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","width":65,"height":64}"#.into(),
            400,
            "multiples of 16",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","guidance":-1}"#.into(),
            400,
            "guidance is -1",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","guidance":1e300}"#.into(),
            400,
            "guidance is inf",
        ),
        (
            "POST",
            gen,
            r#"{"model":"nope","prompt":"x"}"#.into(),
            404,
            "not found",
        ),
        (
            "POST",
            gen,
            r#"{"model":"../../etc/passwd","prompt":"x"}"#.into(),
            400,
            "invalid model name",
        ),
        (
            "POST",
            gen,
            r#"{"model":"a/../b","prompt":"x"}"#.into(),
            400,
            "invalid model name",
        ),
        (
            "POST",
            gen,
            r#"{"prompt":"x"}"#.into(),
            400,
            "`model` is required",
        ),
        (
            "POST",
            gen,
            r#"{"model":"llama3","prompt":"x"}"#.into(),
            400,
            "not an image model",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","keep_alive":"forever-ish"}"#.into(),
            400,
            "keep_alive",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x","options":{"seed":"abc"}}"#.into(),
            400,
            "options.seed",
        ),
        (
            "POST",
            gen,
            r#"{"model":"tiny","prompt":"x"} trailing"#.into(),
            400,
            "after its JSON",
        ),
        ("POST", gen, r#"[1,2,3]"#.into(), 400, "JSON array"),
        (
            "POST",
            gen,
            r#""just a string""#.into(),
            400,
            "not the JSON object",
        ),
        (
            "POST",
            "/api/show",
            r#"{"model":"ghost"}"#.into(),
            404,
            "not found",
        ),
        (
            "DELETE",
            "/api/delete",
            r#"{"model":"../x"}"#.into(),
            400,
            "invalid model name",
        ),
        (
            "DELETE",
            "/api/delete",
            r#"{"model":"ghost"}"#.into(),
            404,
            "not found",
        ),
        ("GET", gen, "".into(), 405, "does not take GET"),
        ("GET", "/api/nothing", "".into(), 404, "no route"),
        (
            "POST",
            oai,
            r#"{"model":"tiny","prompt":"x","n":1000000}"#.into(),
            400,
            "n is 1000000",
        ),
        (
            "POST",
            oai,
            r#"{"model":"tiny","prompt":"x","n":0}"#.into(),
            400,
            "n is 0",
        ),
        (
            "POST",
            oai,
            r#"{"model":"tiny","prompt":"x","size":"huge"}"#.into(),
            400,
            "WIDTHxHEIGHT",
        ),
        (
            "POST",
            oai,
            r#"{"model":"tiny","prompt":"x","size":"99999x99999"}"#.into(),
            400,
            "width is 99999",
        ),
        (
            "POST",
            oai,
            r#"{"model":"tiny","prompt":"x","response_format":"jpeg"}"#.into(),
            400,
            "neither \"b64_json\" nor \"url\"",
        ),
        (
            "POST",
            oai,
            r#"{"model":"tiny"}"#.into(),
            400,
            "`prompt` is required",
        ),
        (
            "POST",
            oai,
            r#"{"model":"nope","prompt":"x"}"#.into(),
            404,
            "not found",
        ),
        (
            "POST",
            oai,
            r#"{"model":"tiny","prompt":"x","n":"two"}"#.into(),
            400,
            "field `n`",
        ),
        ("POST", oai, huge, 413, "larger than"),
        ("GET", "/v1/nothing", "".into(), 404, "no route"),
    ];
    for (method, path, body, status, needle) in &cases {
        let answer = raw(
            port,
            &request(method, path, "Content-Type: application/json\r\n", body),
        );
        let shown = format!(
            "{method} {path} {}",
            body.chars().take(80).collect::<String>()
        );
        assert_api_error(path, answer, *status, needle, &shown);
    }
    // Pictures make bodies larger than other requests, but not without end: the declared
    // length alone gets the answer.
    let declared = format!(
        "POST {gen} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{",
        70 << 20
    );
    let answer = raw(port, declared.as_bytes());
    assert_api_error(gen, answer, 413, "larger than", "a 70 MiB body");

    let inputs = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs");
    let picture = std::fs::read(inputs.join("picture-96x80.png")).unwrap();
    let small_mask = std::fs::read(inputs.join("mask-128x128.png")).unwrap();
    let edits = "/v1/images/edits";
    let text = |k: &'static str, v: &'static str| (k, None, v.as_bytes().to_vec());
    let file = |k: &'static str, bytes: &[u8]| (k, Some("in.png"), bytes.to_vec());
    let form_cases: Vec<(Vec<FormPart>, u16, &str)> = vec![
        (
            vec![text("model", "tiny"), text("prompt", "x")],
            400,
            "field `image` is required",
        ),
        (
            // No model means the server's current one: the request is read and checked on.
            vec![
                text("prompt", "x"),
                file("image", &picture),
                text("strength", "7"),
            ],
            400,
            "strength is 7",
        ),
        (
            vec![
                text("model", "tiny"),
                text("prompt", "x"),
                file("image", b"hello"),
            ],
            400,
            "`image`: not a PNG",
        ),
        (
            vec![
                text("model", "tiny"),
                text("prompt", "x"),
                file("image", &picture),
                file("mask", &small_mask),
            ],
            400,
            "field `mask` is 128×128",
        ),
        (
            vec![
                text("model", "tiny"),
                text("prompt", "x"),
                file("image", &picture),
                file("mask", &picture),
                file("mask", &picture),
            ],
            400,
            "given twice",
        ),
        (
            vec![
                text("model", "tiny"),
                text("prompt", "x"),
                text("n", "two"),
                file("image", &picture),
            ],
            400,
            "field `n`",
        ),
        (
            vec![
                text("model", "tiny"),
                text("prompt", "x"),
                text("strength", "0"),
                file("image", &picture),
            ],
            400,
            "strength is 0",
        ),
    ];
    for (parts, status, needle) in &form_cases {
        let names: Vec<&str> = parts.iter().map(|p| p.0).collect();
        let answer = raw(port, &form_request(edits, parts));
        assert_api_error(edits, answer, *status, needle, &format!("{names:?}"));
    }
    let answer = post(port, edits, r#"{"model":"tiny","prompt":"x"}"#);
    assert_api_error(edits, answer, 400, "multipart", "a JSON edit");
    let answer = post(port, oai, r#"{"model":"tiny","prompt":"x","strength":0.5}"#);
    assert_api_error(
        oai,
        answer,
        400,
        "strength needs a picture",
        "strength alone",
    );
    // A request the server cannot even parse as HTTP, then a good one: still serving.
    let (status, _) = raw(port, b"GARBAGE\r\n\r\n");
    assert!((400..500).contains(&status), "{status}");
    let (status, body) = post(
        port,
        gen,
        r#"{"model":"tiny","prompt":"a fox","width":64,"height":64,"steps":1,"stream":false}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(json(&body)["image"].is_string());
    // Text models are listed all the same.
    let (_, tags) = get(port, "/api/tags");
    let names: Vec<String> = json(&tags)["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["llama3:latest", "tiny:latest"]);
}

#[test]
fn an_api_key_is_required_when_given_and_when_listening_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let out = Command::new(BIN)
        .args(["--store", s(&store), "serve", "--host", "0.0.0.0:0"])
        .env_remove("ZIMAGE_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--api-key"));

    let server = Server::start(&store, &[], &[("ZIMAGE_API_KEY", "sesame")]);
    let port = server.port;
    let body = r#"{"model":"tiny","prompt":"x","width":64,"height":64,"steps":1,"stream":false}"#;
    let (status, answer) = post(port, "/api/generate", body);
    assert_eq!(status, 401);
    assert!(json(&answer)["error"].as_str().unwrap().contains("Bearer"));
    let (status, answer) = raw(
        port,
        &request("GET", "/v1/models", "Authorization: Bearer wrong\r\n", ""),
    );
    assert_eq!(status, 401);
    assert_eq!(json(&answer)["error"]["type"], "authentication_error");
    let (status, _) = raw(
        port,
        &request("GET", "/v1/models", "Authorization: Bearer sesame\r\n", ""),
    );
    assert_eq!(status, 200);
    assert_eq!(get(port, "/"), (200, "zimage is running".to_string()));
}

#[test]
fn a_taken_port_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = Command::new(BIN)
        .args(["--store", s(&dir.path().join("store")), "serve"])
        .env("OLLAMA_HOST", format!("127.0.0.1:{port}"))
        .env_remove("ZIMAGE_HOST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use") && err.contains("--host"), "{err}");
}

/// Starts a streamed generation, reads `lines` progress lines, and hangs up.
fn hang_up_after(port: u16, steps: u32, lines: usize) {
    hang_up_when(port, steps, |seen| seen >= lines);
}

/// Streams a long run and hangs up once `done(progress lines seen)` says so.
fn hang_up_when(port: u16, steps: u32, done: impl Fn(usize) -> bool) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body =
        format!(r#"{{"model":"tiny","prompt":"a fox","width":64,"height":64,"steps":{steps}}}"#);
    stream
        .write_all(&request("POST", "/api/generate", "", &body))
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut seen = 0;
    let mut line = String::new();
    while !done(seen) {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0);
        if line.contains("\"completed\"") {
            seen += 1;
        }
    }
}

#[test]
fn a_client_that_leaves_stops_its_run_within_one_step() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    hang_up_after(server.port, 1000, 2);
    let line = server.wait_for_log("the client left after step");
    let numbers: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    // "... left after step L of the run; stopped after step S ..."
    let (left, stopped) = (numbers[0], numbers[1]);
    assert!(left >= 2 && stopped <= left + 1, "{line}");

    // Queued: a long run holds the worker until the second request has been abandoned.
    let port = server.port;
    let abandoned = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let release = abandoned.clone();
    let long = std::thread::spawn(move || {
        hang_up_when(port, 1000, |seen| {
            seen >= 1 && release.load(std::sync::atomic::Ordering::SeqCst)
        })
    });
    // The long run is under way once the queue holds it (its first step is slower than this).
    std::thread::sleep(Duration::from_millis(300));
    let mut queued = TcpStream::connect(("127.0.0.1", port)).unwrap();
    queued
        .write_all(&request(
            "POST",
            "/api/generate",
            "",
            r#"{"model":"tiny","prompt":"queued","width":64,"height":64,"steps":1000,"stream":false}"#,
        ))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(queued);
    abandoned.store(true, std::sync::atomic::Ordering::SeqCst);
    long.join().unwrap();
    server.wait_for_log("left while queued; not run");
    // The server is free again at once.
    let (status, _) = post(
        port,
        "/api/generate",
        r#"{"model":"tiny","prompt":"a fox","width":64,"height":64,"steps":1,"stream":false}"#,
    );
    assert_eq!(status, 200);
}

#[test]
fn keep_alive_zero_unloads_and_delete_removes_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    let port = server.port;
    let (status, body) = post(port, "/api/generate", r#"{"model":"tiny"}"#);
    assert_eq!(
        (status, json(&body)["done_reason"].clone()),
        (200, "load".into())
    );
    let ps = json(&get(port, "/api/ps").1);
    assert_eq!(ps["models"][0]["name"], "tiny:latest");
    let (status, body) = post(port, "/api/generate", r#"{"model":"tiny","keep_alive":0}"#);
    assert_eq!(
        (status, json(&body)["done_reason"].clone()),
        (200, "unload".into())
    );
    assert_eq!(
        json(&get(port, "/api/ps").1)["models"],
        serde_json::json!([])
    );

    let (status, _) = raw(
        port,
        &request("DELETE", "/api/delete", "", r#"{"model":"tiny"}"#),
    );
    assert_eq!(status, 200);
    assert_eq!(
        json(&get(port, "/api/tags").1)["models"],
        serde_json::json!([])
    );
    let (status, _) = post(port, "/api/show", r#"{"model":"tiny"}"#);
    assert_eq!(status, 404);
}

#[test]
fn concurrent_clients_complete_or_get_503_and_memory_stays_flat() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &["--max-queue", "8"], &[]);
    let port = server.port;
    let body = |seed: u64| {
        format!(
            r#"{{"model":"tiny","prompt":"a red fox in the snow","width":64,"height":64,"steps":1,"stream":false,"options":{{"seed":{seed}}}}}"#
        )
    };
    let (status, first) = post(port, "/api/generate", &body(0));
    assert_eq!(status, 200, "{first}");
    let rss_after_first = server.rss_kib();
    let expected: Vec<_> = (0..4)
        .map(|seed| cli_pixels(&store, dir.path(), seed, 1))
        .collect();

    // 8 clients, each with 4 requests in flight at once.
    let results: Vec<(u64, u16, String)> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(move || {
                    let requests: Vec<_> = (0..4u64)
                        .map(|seed| {
                            scope.spawn(move || {
                                let (status, answer) = post(port, "/api/generate", &body(seed));
                                (seed, status, answer)
                            })
                        })
                        .collect();
                    requests
                        .into_iter()
                        .map(|r| r.join().unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect()
    });
    assert_eq!(results.len(), 32);
    let mut completed = 0;
    for (seed, status, answer) in &results {
        let v = json(answer);
        match status {
            200 => {
                let png = b64(v["image"].as_str().unwrap());
                assert!(
                    pixels(&png) == expected[*seed as usize],
                    "seed {seed}: wrong image"
                );
                completed += 1;
            }
            503 => assert!(v["error"].as_str().unwrap().contains("busy"), "{answer}"),
            other => panic!("status {other}: {answer}"),
        }
    }
    assert!(completed >= 9, "only {completed} of 32 completed");
    let rss = server.rss_kib();
    assert!(
        (rss as f64) < rss_after_first as f64 * 1.10,
        "RSS grew from {rss_after_first} KiB to {rss} KiB"
    );
}

/// `zimage generate` of the demo with `--lora`, as pixels.
fn cli_lora_pixels(store: &Path, dir: &Path, lora: &str) -> (u32, u32, Vec<u8>) {
    cli_pixels_with(store, dir, 7, 2, &["--lora", lora])
}

#[test]
fn a_request_lora_draws_what_the_cli_lora_flag_draws_and_bad_paths_are_400() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let loras = dir.path().join("loras");
    std::fs::create_dir_all(&loras).unwrap();
    let file = loras.join("style.safetensors");
    write_attention_lora(&file);
    std::fs::write(loras.join("notes.safetensors"), b"not a safetensors file").unwrap();
    std::fs::write(dir.path().join("outside.safetensors"), b"").unwrap();
    let server = Server::start(&store, &["--lora-dir", s(&loras)], &[]);
    let ollama = |loras: &str| {
        post(
            server.port,
            "/api/generate",
            &format!(
                r#"{{"model":"tiny","prompt":"a red fox in the snow","width":64,"height":64,"steps":2,"options":{{"seed":7}},"stream":false{loras}}}"#
            ),
        )
    };
    let with_lora = r#","loras":[{"path":"style.safetensors","scale":0.8}]"#;
    let (status, body) = ollama(with_lora);
    assert_eq!(status, 200, "{body}");
    let expected = cli_lora_pixels(&store, dir.path(), &format!("{}:0.8", s(&file)));
    let got = pixels(&b64(json(&body)["image"].as_str().unwrap()));
    assert!(
        got == expected,
        "the request's LoRA image differs from `--lora`'s"
    );
    assert!(
        got != cli_pixels(&store, dir.path(), 7, 2),
        "the LoRA changed nothing"
    );

    // The LoRA is the request's alone: the next request without one gets the plain image.
    let (status, body) = ollama("");
    assert_eq!(status, 200, "{body}");
    let plain = pixels(&b64(json(&body)["image"].as_str().unwrap()));
    assert!(
        plain == cli_pixels(&store, dir.path(), 7, 2),
        "the LoRA outlived its request"
    );

    let (status, body) = post(
        server.port,
        "/v1/images/generations",
        &format!(
            r#"{{"model":"tiny","prompt":"a red fox in the snow","size":"64x64","steps":2,"seed":7{with_lora}}}"#
        ),
    );
    assert_eq!(status, 200, "{body}");
    let got = pixels(&b64(json(&body)["data"][0]["b64_json"].as_str().unwrap()));
    assert!(
        got == expected,
        "OpenAI's LoRA image differs from `--lora`'s"
    );

    // A model that carries the LoRA draws the same, with no `loras` in the request.
    let spec = format!("{}:0.8", s(&file));
    let out = common::zimage_in(
        &store,
        &["create", "styled", "--from", "tiny", "--lora", &spec],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, body) = post(
        server.port,
        "/api/generate",
        r#"{"model":"styled","prompt":"a red fox in the snow","width":64,"height":64,"steps":2,"options":{"seed":7},"stream":false}"#,
    );
    assert_eq!(status, 200, "{body}");
    let got = pixels(&b64(json(&body)["image"].as_str().unwrap()));
    assert!(
        got == expected,
        "the derived model's image differs from `--lora`'s"
    );

    let refused = |loras: &str, needle: &str| {
        let (status, body) = ollama(&format!(r#","loras":{loras}"#));
        assert_eq!(status, 400, "{loras}: {body}");
        let message = json(&body)["error"].as_str().unwrap().to_string();
        assert!(message.contains(needle), "{loras}: {message}");
    };
    refused(
        r#"[{"path":"missing.safetensors"}]"#,
        "`missing.safetensors`: no such file in the server's LoRA folder",
    );
    refused(r#"[{"path":"../outside.safetensors"}]"#, "without `..`");
    refused(
        &format!(r#"[{{"path":"{}"}}]"#, s(&file)),
        "relative to the server's LoRA folder",
    );
    refused(r#"[{"path":"style.safetensors","scale":1e9}]"#, "scale");
    refused(r#"[{"path":"notes.safetensors"}]"#, "notes.safetensors");
    let (status, body) = post(
        server.port,
        "/v1/images/generations",
        r#"{"model":"tiny","prompt":"x","loras":[{"path":"missing.safetensors"}]}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(json(&body)["error"]["param"], "loras", "{body}");

    // A server started without a LoRA folder applies none, and says how to allow them.
    drop(server);
    let server = Server::start(&store, &[], &[]);
    let (status, body) = post(
        server.port,
        "/api/generate",
        &format!(r#"{{"model":"tiny","prompt":"x","stream":false{with_lora}}}"#),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("--lora-dir"), "{body}");
}

/// Ollama's `images` (base64 pictures) start an image-to-image run: the same pixels as
/// `zimage generate --image --strength` for the seed, the size taken from the picture; a
/// payload that is no picture and a strength outside (0, 1] are answered 400.
#[test]
fn ollama_images_run_image_to_image_as_the_command_line_does() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    let picture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs/picture-96x80.png");
    let encoded =
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(&picture).unwrap());
    let body = |image: &str, strength: &str| {
        format!(
            r#"{{"model":"tiny","prompt":"a red fox in the snow","images":["{image}"],"steps":2,"stream":false,"options":{{"seed":7,"strength":{strength}}}}}"#
        )
    };
    let (status, answer) = post(server.port, "/api/generate", &body(&encoded, "0.75"));
    assert_eq!(status, 200, "{answer}");
    let served = pixels(&b64(json(&answer)["image"].as_str().unwrap()));

    let expected = cli_pixels_from(
        &store,
        dir.path(),
        &["--image", s(&picture), "--strength", "0.75"],
    );
    assert_eq!((served.0, served.1), (96, 80));
    assert!(
        served == expected,
        "the served picture differs from `zimage generate`"
    );

    let not_a_picture = base64::engine::general_purpose::STANDARD.encode(b"hello");
    let (status, answer) = post(server.port, "/api/generate", &body(&not_a_picture, "0.5"));
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("images[0]"), "{answer}");
    let (status, answer) = post(server.port, "/api/generate", &body(&encoded, "1.5"));
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("strength"), "{answer}");
    let (status, _) = get(server.port, "/api/version");
    assert_eq!(status, 200, "the server keeps serving");
}

#[test]
fn a_stored_controlnet_steers_served_images_as_the_command_line_flags_do() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let cn = dir.path().join("cn");
    common::controlnet::write_tiny_dir("2.1", &cn);
    let created = common::zimage_in(&store, &["create", "cn", "--from", s(&cn)]);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let server = Server::start(&store, &[], &[]);
    let inputs = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs");
    let (control, picture, mask) = (
        inputs.join("picture-128x128.png"),
        inputs.join("picture-96x80.png"),
        inputs.join("mask-96x80.png"),
    );
    let control_bytes = std::fs::read(&control).unwrap();
    let encoded = base64::engine::general_purpose::STANDARD.encode(&control_bytes);
    let fields = |extra: &str| {
        format!(
            r#"{{"model":"tiny","prompt":"a red fox in the snow","steps":2,"stream":false,"options":{{"seed":7}},"seed":7,"response_format":"b64_json","controlnet":"cn","control_image":"{encoded}"{extra}}}"#
        )
    };

    let expected = cli_pixels_from(
        &store,
        dir.path(),
        &[
            "--control",
            s(&control),
            "--controlnet",
            "cn",
            "--control-scale",
            "0.9",
        ],
    );
    let (status, answer) = post(
        server.port,
        "/api/generate",
        &fields(r#","control_scale":0.9"#),
    );
    assert_eq!(status, 200, "{answer}");
    let served = b64(json(&answer)["image"].as_str().unwrap());
    assert!(
        pixels(&served) == expected,
        "Ollama's ControlNet image differs from the CLI's"
    );
    let png = dir.path().join("served.png");
    std::fs::write(&png, &served).unwrap();
    let text = zimage::image_out::read_png_text(&png).unwrap();
    let params = &text.iter().find(|(k, _)| k == "parameters").unwrap().1;
    assert!(params.contains("ControlNet scale: 0.9"), "{params}");

    let (status, answer) = post(
        server.port,
        "/v1/images/generations",
        &fields(r#","control_scale":0.9"#),
    );
    assert_eq!(status, 200, "{answer}");
    let served = b64(json(&answer)["data"][0]["b64_json"].as_str().unwrap());
    assert!(
        pixels(&served) == expected,
        "OpenAI's ControlNet image differs from the CLI's"
    );
    assert!(
        expected != cli_pixels_from(&store, dir.path(), &["--width", "128", "--height", "128"])
    );

    // ControlNet inpaint through the edit form, the mask in OpenAI's convention.
    let rgba_mask = dir.path().join("mask-rgba.png");
    write_alpha_mask(&mask, &rgba_mask);
    let form: Vec<FormPart> = vec![
        ("model", None, b"tiny".to_vec()),
        ("prompt", None, b"a red fox in the snow".to_vec()),
        ("steps", None, b"2".to_vec()),
        ("seed", None, b"7".to_vec()),
        ("controlnet", None, b"cn".to_vec()),
        ("image", Some("in.png"), std::fs::read(&picture).unwrap()),
        ("mask", Some("mask.png"), std::fs::read(&rgba_mask).unwrap()),
        ("control_image", Some("c.png"), control_bytes.clone()),
    ];
    let (status, answer) = raw(server.port, &form_request("/v1/images/edits", &form));
    assert_eq!(status, 200, "{answer}");
    let served = b64(json(&answer)["data"][0]["b64_json"].as_str().unwrap());
    let inpaint = cli_pixels_from(
        &store,
        dir.path(),
        &[
            "--image",
            s(&picture),
            "--mask",
            s(&mask),
            "--control",
            s(&control),
            "--controlnet",
            "cn",
        ],
    );
    assert!(
        pixels(&served) == inpaint,
        "the ControlNet edit differs from the CLI's inpaint"
    );

    let refused = [
        (
            format!(r#"{{"model":"tiny","prompt":"x","control_image":"{encoded}"}}"#),
            400,
            "needs `controlnet`",
        ),
        (
            r#"{"model":"tiny","prompt":"x","controlnet":"cn"}"#.to_string(),
            400,
            "needs `control_image`",
        ),
        (
            fields(r#","control_scale":2.5"#),
            400,
            "control_scale is 2.5",
        ),
        (
            fields("").replace(r#""controlnet":"cn""#, r#""controlnet":"nope""#),
            404,
            "nope",
        ),
        (
            fields("").replace(r#""controlnet":"cn""#, r#""controlnet":"tiny""#),
            400,
            "tiny",
        ),
    ];
    for (body, status, needle) in &refused {
        let answer = post(server.port, "/api/generate", body);
        assert_api_error("/api/generate", answer, *status, needle, needle);
    }
    let (status, _) = get(server.port, "/api/version");
    assert_eq!(status, 200, "the server keeps serving");
}

/// A server on loopback answers no web page of another site: neither a request for a name that
/// was made to resolve to it (DNS rebinding) nor a browser's request from a foreign origin.
/// Pages on loopback, desktop apps and origins listed in ZIMAGE_ORIGINS pass; a key admits
/// whoever holds it.
#[test]
fn web_pages_of_other_sites_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[("ZIMAGE_ORIGINS", "https://*.example.com")]);
    let port = server.port;
    let with = |headers: &str| raw(port, &request("GET", "/api/tags", headers, "")).0;
    assert_eq!(with(""), 200);
    assert_eq!(with("Origin: http://localhost:3000\r\n"), 200);
    assert_eq!(with("Origin: app://open-webui\r\n"), 200);
    assert_eq!(with("Origin: https://ui.example.com\r\n"), 200);
    assert_eq!(with("Origin: https://evil.example\r\n"), 403);
    let (status, body) = raw(
        port,
        &request(
            "POST",
            "/api/generate",
            "Origin: https://evil.example\r\nContent-Type: text/plain\r\n",
            r#"{"model":"tiny","prompt":"x"}"#,
        ),
    );
    assert_eq!(status, 403, "{body}");
    assert!(
        json(&body)["error"]
            .as_str()
            .unwrap()
            .contains("ZIMAGE_ORIGINS"),
        "{body}"
    );
    // A form of another site's page names no origin, but the browser says it is cross-site:
    // it may read, and changes nothing on any route.
    assert_eq!(with("Sec-Fetch-Site: cross-site\r\n"), 200);
    for (method, path) in [
        ("POST", "/api/generate"),
        ("POST", "/api/pull"),
        ("DELETE", "/api/delete"),
        ("POST", "/sdapi/v1/interrupt"),
        ("POST", "/v1/images/generations"),
    ] {
        let (status, body) = raw(
            port,
            &request(
                method,
                path,
                "Sec-Fetch-Site: cross-site\r\nContent-Type: text/plain\r\n",
                r#"{"model":"tiny","prompt":"x"}"#,
            ),
        );
        assert_eq!(status, 403, "{method} {path}: {body}");
        assert!(body.contains("another site"), "{body}");
    }
    // A name that is not this machine's: the request of a rebound domain.
    let rebound =
        format!("GET /api/tags HTTP/1.1\r\nHost: evil.example:{port}\r\nConnection: close\r\n\r\n");
    let (status, body) = raw(port, rebound.as_bytes());
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("evil.example"), "{body}");
    // A name or an origin in raw UTF-8 cannot be checked: refused, not taken as absent.
    let utf8_host =
        format!("GET /api/tags HTTP/1.1\r\nHost: évil.example:{port}\r\nConnection: close\r\n\r\n");
    let (status, body) = raw(port, utf8_host.as_bytes());
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("`host` header is not ASCII"), "{body}");
    for (method, path) in [("GET", "/api/tags"), ("DELETE", "/ui/api/gallery/a.png")] {
        let (status, body) = raw(
            port,
            &request(method, path, "Origin: https://évil.example\r\n", ""),
        );
        assert_eq!(status, 400, "{method} {path}: {body}");
        assert!(body.contains("`origin` header is not ASCII"), "{body}");
    }
    // Errors keep each API's shape.
    let (status, body) = raw(
        port,
        &request("GET", "/v1/models", "Origin: https://evil.example\r\n", ""),
    );
    assert_eq!(status, 403);
    assert!(json(&body)["error"]["message"].is_string(), "{body}");
    drop(server);

    // With a key, the key decides.
    let server = Server::start(&store, &["--api-key", "k"], &[]);
    let with = |headers: &str| raw(server.port, &request("GET", "/api/tags", headers, "")).0;
    assert_eq!(with("Origin: https://evil.example\r\n"), 401);
    assert_eq!(
        with("Origin: https://evil.example\r\nAuthorization: Bearer k\r\n"),
        200
    );
}
