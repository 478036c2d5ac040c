//! The web page of `zimage serve` (`/ui`): its JSON API and gallery against the real server
//! and the demo model, and the page itself driven in Debian's Chromium by Playwright
//! (`tests/web_page.py`): prompt, progress, result, gallery after a reload, reusing settings,
//! a painted mask, cancel, phone width and keyboard use.

mod common;

use common::browser::{ensure_chromium, playwright_python, CHROMIUM};
use common::server::{demo_store, get, json, post, raw, request, Server};
use common::{s, zimage_in};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A 256×256 picture (the demo model's size) to start img2img from.
fn write_picture(path: &Path) {
    let img = image::RgbImage::from_fn(256, 256, |x, y| {
        image::Rgb([(x % 256) as u8, (y % 256) as u8, ((x * y) % 251) as u8])
    });
    img.save(path).unwrap();
}

struct Page {
    _dir: tempfile::TempDir,
    store: PathBuf,
    gallery: PathBuf,
    loras: PathBuf,
}

fn page_setup() -> Page {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let loras = dir.path().join("loras");
    std::fs::create_dir_all(&loras).unwrap();
    common::server::write_attention_lora(&loras.join("style.safetensors"));
    let gallery = dir.path().join("gallery");
    Page {
        store,
        gallery,
        loras,
        _dir: dir,
    }
}

fn start(page: &Page, extra: &[&str]) -> Server {
    let mut args = vec![
        "--lora-dir",
        s(&page.loras),
        "--gallery-dir",
        s(&page.gallery),
        "--keep-alive",
        "-1",
    ];
    args.extend_from_slice(extra);
    Server::start(&page.store, &args, &[])
}

/// Polls a page job until it ends; its last state.
fn wait_job(port: u16, id: &str) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let (status, body) = get(port, &format!("/ui/api/jobs/{id}"));
        assert_eq!(status, 200, "{body}");
        let state = json(&body);
        if !matches!(state["state"].as_str(), Some("queued" | "running")) {
            return state;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "job {id} did not end: {state}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs a page job to its end, which must be `done`; its last state.
fn done_job(port: u16, body: &serde_json::Value) -> serde_json::Value {
    let (status, answer) = post(port, "/ui/api/jobs", &body.to_string());
    assert_eq!(status, 200, "{answer}");
    let done = wait_job(port, json(&answer)["id"].as_str().unwrap());
    assert_eq!(done["state"], "done", "{done}");
    done
}

/// The PNG of a gallery entry, as the page kept it.
fn gallery_png(page: &Page, entry: &serde_json::Value) -> Vec<u8> {
    std::fs::read(page.gallery.join(entry["file"].as_str().unwrap())).unwrap()
}

/// The PNG `zimage generate PROMPT --model tiny FLAGS` writes.
fn cli_png(page: &Page, prompt: &str, flags: &[&str]) -> Vec<u8> {
    model_cli_png(page, "tiny", prompt, flags)
}

/// The PNG `zimage generate PROMPT --model MODEL FLAGS` writes.
fn model_cli_png(page: &Page, model: &str, prompt: &str, flags: &[&str]) -> Vec<u8> {
    let out = page._dir.path().join("cli.png");
    let mut args = vec!["generate", prompt, "--model", model, "-o", s(&out)];
    args.extend(flags);
    let cli = zimage_in(&page.store, &args);
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    std::fs::read(&out).unwrap()
}

/// A small page job runs to its end: the server goes on serving.
fn still_serves(port: u16) {
    let body = r#"{"prompt": "after", "width": 32, "height": 32, "steps": 1}"#;
    let (status, answer) = post(port, "/ui/api/jobs", body);
    assert_eq!(status, 200, "{answer}");
    let id = json(&answer)["id"].as_str().unwrap().to_string();
    assert_eq!(wait_job(port, &id)["state"], "done");
}

fn data_url(png: &[u8]) -> String {
    use base64::Engine;
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    )
}

/// How long a test waits for a job to reach a step before it fails: a deadline for a job that
/// never gets there, not a timing (a machine busy with builds may take minutes to load).
const PATIENCE: Duration = Duration::from_secs(300);

#[test]
fn browsers_are_sent_to_the_page_and_api_clients_are_not() {
    let page = page_setup();
    let server = start(&page, &["--api-key", "secret"]);
    let (status, body) = get(server.port, "/");
    assert_eq!((status, body.as_str()), (200, "zimage is running"));
    let (status, _) = raw(
        server.port,
        &request(
            "GET",
            "/",
            "Accept: text/html,application/xhtml+xml\r\n",
            "",
        ),
    );
    assert_eq!(status, 303);
    // The page loads without the key, and asks for it; its API does not answer without it.
    let (status, html) = get(server.port, "/ui");
    assert_eq!(status, 200);
    assert!(html.contains("app.js"), "{html}");
    assert_eq!(get(server.port, "/ui/app.js").0, 200);
    assert_eq!(get(server.port, "/ui/app.css").0, 200);
    assert_eq!(get(server.port, "/ui/api/info").0, 401);
    let (status, body) = raw(
        server.port,
        &request(
            "GET",
            "/ui/api/info",
            "Authorization: Bearer secret\r\n",
            "",
        ),
    );
    assert_eq!(status, 200, "{body}");
    let info = json(&body);
    assert_eq!(info["models"][0]["short"], "tiny");
    assert_eq!(info["models"][0]["width"], 256);
    assert_eq!(info["loras"], serde_json::json!(["style.safetensors"]));
}

#[test]
fn page_jobs_equal_the_command_line_and_the_gallery_outlives_a_restart() {
    let page = page_setup();
    let server = start(&page, &[]);
    let port = server.port;
    let body = serde_json::json!({
        "model": "tiny", "prompt": "a red fox in snow", "width": 64, "height": 48,
        "steps": 3, "seed": 11, "count": 2,
        "loras": [{"path": "style.safetensors", "scale": 0.5}],
    });
    let done = done_job(port, &body);
    let images = done["images"].as_array().unwrap();
    assert_eq!(images.len(), 2);
    let second = &images[1];
    assert_eq!(second["settings"]["seed"], 12);
    assert_eq!(second["settings"]["prompt"], "a red fox in snow");
    assert_eq!(
        second["settings"]["loras"],
        serde_json::json!([{"path": "style.safetensors", "scale": 0.5}])
    );
    assert_eq!(
        (second["width"].as_u64(), second["height"].as_u64()),
        (Some(64), Some(48))
    );

    // The page's second image is the command line's run from its seed, byte for byte.
    let lora = format!("{}:0.5", s(&page.loras.join("style.safetensors")));
    let cli = cli_png(
        &page,
        "a red fox in snow",
        &[
            "--width", "64", "--height", "48", "--steps", "3", "--seed", "12", "--lora", &lora,
        ],
    );
    let file = second["file"].as_str().unwrap();
    let served = raw(
        port,
        &request("GET", &format!("/ui/gallery/{file}"), "", ""),
    )
    .0;
    assert_eq!(served, 200);
    assert_eq!(
        std::fs::read(page.gallery.join(file)).unwrap(),
        cli,
        "the page's image differs from the command line's"
    );

    // img2img with a mask painted white where to repaint.
    let picture = page._dir.path().join("picture.png");
    write_picture(&picture);
    let mut mask = image::GrayImage::new(256, 256);
    for (x, _, p) in mask.enumerate_pixels_mut() {
        p.0[0] = if x >= 128 { 255 } else { 0 };
    }
    let mut mask_png = Vec::new();
    mask.write_to(
        &mut std::io::Cursor::new(&mut mask_png),
        image::ImageFormat::Png,
    )
    .unwrap();
    let body = serde_json::json!({
        "prompt": "a red fox in snow", "steps": 4, "seed": 3, "strength": 0.8,
        "picture": data_url(&std::fs::read(&picture).unwrap()), "mask": data_url(&mask_png),
    });
    let done = done_job(port, &body);
    let inpainted = &done["images"][0];
    assert_eq!(inpainted["settings"]["strength"], 0.8);
    assert_eq!(inpainted["settings"]["inpaint"], true);
    let mask_file = page._dir.path().join("mask.png");
    std::fs::write(&mask_file, &mask_png).unwrap();
    let cli = cli_png(
        &page,
        "a red fox in snow",
        &[
            "--steps",
            "4",
            "--seed",
            "3",
            "--image",
            s(&picture),
            "--mask",
            s(&mask_file),
            "--strength",
            "0.8",
        ],
    );
    assert_eq!(
        gallery_png(&page, inpainted),
        cli,
        "the page's inpaint differs from the command line's"
    );

    // After a restart the gallery lists every image again, newest first, from the files.
    drop(server);
    let server = start(&page, &[]);
    let (status, body) = get(server.port, "/ui/api/gallery");
    assert_eq!(status, 200);
    let listed = json(&body);
    let files: Vec<&str> = listed["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["file"].as_str().unwrap())
        .collect();
    assert_eq!(files.len(), 3, "{listed}");
    assert_eq!(files[0], inpainted["file"].as_str().unwrap());
    assert!(files.contains(&file));
    // Deleting one leaves the others.
    let (status, _) = raw(
        server.port,
        &request("DELETE", &format!("/ui/api/gallery/{file}"), "", ""),
    );
    assert_eq!(status, 200);
    assert!(!page.gallery.join(file).exists());
}

#[test]
fn a_cancelled_page_job_keeps_no_image_and_queued_jobs_know_their_place() {
    let page = page_setup();
    let server = start(&page, &[]);
    let port = server.port;
    let long = serde_json::json!({"prompt": "a long one", "width": 64, "height": 64, "steps": 400, "count": 3});
    let (_, first) = post(port, "/ui/api/jobs", &long.to_string());
    let first = json(&first)["id"].as_str().unwrap().to_string();
    let (_, second) = post(port, "/ui/api/jobs", &long.to_string());
    let second = json(&second)["id"].as_str().unwrap().to_string();
    // The second waits behind the first.
    let start = Instant::now();
    loop {
        let a = json(&get(port, &format!("/ui/api/jobs/{first}")).1);
        if a["state"] == "running" && a["progress"]["step"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "{a}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let b = json(&get(port, &format!("/ui/api/jobs/{second}")).1);
    assert_eq!(
        (b["state"].as_str(), b["position"].as_u64()),
        (Some("queued"), Some(1)),
        "{b}"
    );
    // Cancelling the queued one ends it at once; the running one stops at its next step.
    let (status, body) = post(port, &format!("/ui/api/jobs/{second}/cancel"), "");
    assert_eq!(
        (status, json(&body)["cancelled"].as_bool()),
        (200, Some(true))
    );
    assert_eq!(
        json(&get(port, &format!("/ui/api/jobs/{second}")).1)["state"],
        "cancelled"
    );
    post(port, &format!("/ui/api/jobs/{first}/cancel"), "");
    let ended = wait_job(port, &first);
    assert_eq!(ended["state"], "cancelled", "{ended}");
    assert!(
        ended["error"].as_str().unwrap().contains("interrupted"),
        "{ended}"
    );
    let listed = json(&get(port, "/ui/api/gallery").1);
    assert_eq!(listed["images"], serde_json::json!([]));
    // The server goes on serving.
    still_serves(port);
}

#[test]
fn bad_page_requests_get_a_message_and_the_server_keeps_serving() {
    let page = page_setup();
    let server = start(&page, &[]);
    let port = server.port;
    let picture = page._dir.path().join("picture.png");
    write_picture(&picture);
    let picture = data_url(&std::fs::read(&picture).unwrap());
    let small_mask = {
        let mut png = Vec::new();
        image::GrayImage::new(64, 64)
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        data_url(&png)
    };
    let cases = [
        (
            serde_json::json!({"prompt": "x", "picture": "data:image/png;base64,@@@"}),
            400,
            "not base64",
        ),
        (
            serde_json::json!({"prompt": "x", "picture": picture, "mask": small_mask}),
            400,
            "mask",
        ),
        (
            serde_json::json!({"prompt": "x", "count": 10000}),
            400,
            "count",
        ),
        (
            serde_json::json!({"prompt": "x", "model": "nothere"}),
            404,
            "nothere",
        ),
        (
            serde_json::json!({"prompt": "x", "sampler": "DPM++"}),
            400,
            "sampler",
        ),
        (
            serde_json::json!({"prompt": "x", "strength": 0.5}),
            400,
            "strength",
        ),
        (
            serde_json::json!({"prompt": "x", "loras": [{"path": "../x.safetensors"}]}),
            400,
            "LoRA",
        ),
        (
            serde_json::json!({"prompt": "x", "width": 50, "height": 64}),
            400,
            "16",
        ),
        // Not dropped to run text → image instead.
        (
            serde_json::json!({"prompt": "x", "only_masked": 8}),
            400,
            "field `only_masked` needs `picture` and `mask`",
        ),
        (
            serde_json::json!({"prompt": "fox ".repeat(20_000)}),
            400,
            "prompt is 80000 bytes; a prompt may have at most 65536",
        ),
    ];
    for (body, want, words) in cases {
        let (status, answer) = post(port, "/ui/api/jobs", &body.to_string());
        assert_eq!(status, want, "{body}: {answer}");
        let message = json(&answer)["error"].as_str().unwrap().to_string();
        assert!(message.contains(words), "{body}: {message}");
    }
    // A page of another site may not queue jobs here; the page's own origin may.
    let job = r#"{"prompt": "x", "width": 32, "height": 32, "steps": 1}"#;
    let from = |origin: &str| {
        let headers = format!("Content-Type: application/json\r\nOrigin: {origin}\r\n");
        raw(port, &request("POST", "/ui/api/jobs", &headers, job))
    };
    let (status, answer) = from("https://evil.example");
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("refused"), "{answer}");
    // Another page on loopback may use the other APIs, but not the page's own.
    let (status, answer) = from("http://localhost:3000");
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("another site"), "{answer}");
    // The test client's Host is `localhost`.
    assert_eq!(from("http://localhost").0, 200);
    for path in [
        "/ui/gallery/..%2Fstore.png",
        "/ui/gallery/nothing.png",
        "/ui/api/jobs/99",
        "/ui/api/jobs/x",
    ] {
        assert_eq!(get(port, path).0, 404, "{path}");
    }
    still_serves(port);
}

/// The gallery serves and deletes its own regular files only, to its own page only: a link,
/// a FIFO or a folder under a gallery name is not found (and not followed, opened or removed),
/// and another site's `<img>` gets nothing.
#[test]
fn the_gallery_serves_its_regular_files_to_its_own_page_alone() {
    let page = page_setup();
    let server = start(&page, &[]);
    let port = server.port;
    std::fs::create_dir_all(&page.gallery).unwrap();
    let mut png = Vec::new();
    image::RgbImage::new(8, 8)
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    std::fs::write(page.gallery.join("kept.png"), &png).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", page.gallery.join("link.png")).unwrap();
    let fifo = page.gallery.join("fifo.png");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    std::fs::create_dir(page.gallery.join("folder.png")).unwrap();
    for name in ["link.png", "fifo.png", "folder.png"] {
        let (status, body) = get(port, &format!("/ui/gallery/{name}"));
        assert_eq!(status, 404, "{name}: {body}");
        let delete = request("DELETE", &format!("/ui/api/gallery/{name}"), "", "");
        let (status, body) = raw(port, &delete);
        assert_eq!(status, 404, "{name}: {body}");
    }
    assert!(std::fs::symlink_metadata(page.gallery.join("link.png")).is_ok());
    assert!(page.gallery.join("folder.png").is_dir());
    let fetch = |site: &str| {
        let headers = format!("Sec-Fetch-Site: {site}\r\n");
        raw(port, &request("GET", "/ui/gallery/kept.png", &headers, ""))
    };
    let (status, body) = fetch("cross-site");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("another site"), "{body}");
    assert_eq!(fetch("same-origin").0, 200);
    assert_eq!(get(port, "/ui/gallery/kept.png").0, 200);
    still_serves(port);
}

/// A gallery folder that can never be made stops `serve` before it listens.
#[test]
fn a_gallery_folder_under_a_file_stops_serve_at_start() {
    let page = page_setup();
    let file = page._dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let port = common::server::free_port().to_string();
    let out = zimage_in(
        &page.store,
        &[
            "serve",
            "--host",
            &format!("127.0.0.1:{port}"),
            "--gallery-dir",
            s(&file.join("gallery")),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("is a file") && stderr.contains("--gallery-dir"),
        "{stderr}"
    );
}

/// Runs the browser script `tests/SCRIPT` against `server` with `picture`, which must pass;
/// the summary it wrote into `shots` (where its screenshots stay, for a person to look at).
fn browser_script(
    python: &Path,
    script: &str,
    server: &Server,
    shots: &Path,
    picture: &Path,
) -> serde_json::Value {
    std::fs::create_dir_all(shots).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let started = Instant::now();
    let out = Command::new(python)
        .arg(&script)
        .arg(server.url())
        .arg(shots)
        .arg(picture)
        .env("CHROMIUM", CHROMIUM)
        .output()
        .unwrap();
    eprintln!(
        "browser script: {:.1} s\n{}\n{}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the browser test failed; server log: {:?}",
        server.log()
    );
    json(&std::fs::read_to_string(shots.join("summary.json")).unwrap())
}

#[test]
fn the_page_works_in_a_real_browser() {
    ensure_chromium();
    let python = playwright_python();
    let page = page_setup();
    let server = start(&page, &[]);
    let picture = page._dir.path().join("picture.png");
    write_picture(&picture);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-page");
    let summary = browser_script(&python, "web_page.py", &server, &shots, &picture);
    // What the page made from seed 7 is the command line's image from seed 7.
    let file = summary["txt2img_file"].as_str().unwrap();
    let made = std::fs::read(page.gallery.join(file)).unwrap();
    let cli = cli_png(&page, "a red fox in snow", &["--seed", "7"]);
    assert_eq!(made, cli);
    for shot in ["desktop.png", "phone.png"] {
        let (w, _) = image::image_dimensions(shots.join(shot)).unwrap();
        assert!(w > 0);
    }
}

#[test]
fn a_page_job_steered_by_a_controlnet_is_the_command_lines() {
    let page = page_setup();
    let cn = page._dir.path().join("cn");
    common::controlnet::write_tiny_dir("2.1", &cn);
    let created = zimage_in(&page.store, &["create", "cn", "--from", s(&cn)]);
    assert!(created.status.success(), "{created:?}");
    let server = start(&page, &[]);
    let info = json(&get(server.port, "/ui/api/info").1);
    assert_eq!(info["controlnets"], serde_json::json!(["cn"]));
    assert_eq!(info["models"].as_array().unwrap().len(), 1, "{info}");
    let control =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs/picture-96x80.png");
    let body = serde_json::json!({
        "model": "tiny", "prompt": "a red fox in snow", "steps": 2, "seed": 5,
        "controlnet": "cn", "control_image": data_url(&std::fs::read(&control).unwrap()),
        "control_scale": 0.6,
    });
    let done = done_job(server.port, &body);
    let entry = &done["images"][0];
    assert_eq!(entry["settings"]["controlnet"], "cn");
    assert_eq!(entry["settings"]["control_scale"], 0.6);
    let cli = cli_png(
        &page,
        "a red fox in snow",
        &[
            "--steps",
            "2",
            "--seed",
            "5",
            "--controlnet",
            "cn",
            "--control",
            s(&control),
            "--control-scale",
            "0.6",
        ],
    );
    assert_eq!(gallery_png(&page, entry), cli);
}

#[test]
fn every_api_sees_one_queue_and_one_running_job() {
    let page = page_setup();
    let server = start(&page, &[]);
    let port = server.port;
    let long = r#"{"prompt": "a long one", "width": 64, "height": 64, "steps": 400}"#;
    let (_, answer) = post(port, "/ui/api/jobs", long);
    let page_job = json(&answer)["id"].as_str().unwrap().to_string();
    let start = Instant::now();
    while json(&get(port, &format!("/ui/api/jobs/{page_job}")).1)["state"] != "running" {
        assert!(start.elapsed() < PATIENCE);
        std::thread::sleep(Duration::from_millis(20));
    }
    // An Ollama client streams while the page's job runs: it hears where it waits.
    let ollama = std::thread::spawn(move || {
        post(
            port,
            "/api/generate",
            r#"{"model": "tiny", "prompt": "a fox", "width": 64, "height": 64, "steps": 2}"#,
        )
    });
    let start = Instant::now();
    loop {
        let p = json(&get(port, "/sdapi/v1/progress").1);
        if p["state"]["job_count"] == 2 {
            assert!(
                p["state"]["job"].as_str().unwrap().contains("/ui/api/jobs"),
                "{p}"
            );
            break;
        }
        assert!(start.elapsed() < PATIENCE, "{p}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A1111's interrupt stops the page's job; the Ollama request runs next.
    assert_eq!(post(port, "/sdapi/v1/interrupt", "").0, 200);
    let ended = wait_job(port, &page_job);
    assert_eq!(ended["state"], "cancelled", "{ended}");
    let (status, body) = ollama.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let lines: Vec<serde_json::Value> = body.lines().map(json).collect();
    assert_eq!(lines[0]["queue_position"], 1, "{body}");
    assert_eq!(lines[0]["done"], false);
    assert!(
        lines.iter().any(|l| l["completed"] == 2 && l["total"] == 2),
        "{body}"
    );
    assert_eq!(lines.last().unwrap()["done"], true, "{body}");
}

#[test]
fn cancelling_a_batch_keeps_the_images_it_finished() {
    let page = page_setup();
    let server = start(&page, &[]);
    let port = server.port;
    let body = r#"{"prompt": "three foxes", "width": 64, "height": 64, "steps": 300, "count": 3, "seed": 4}"#;
    let (_, answer) = post(port, "/ui/api/jobs", body);
    let id = json(&answer)["id"].as_str().unwrap().to_string();
    let start = Instant::now();
    loop {
        let s = json(&get(port, &format!("/ui/api/jobs/{id}")).1);
        if s["progress"]["image"] == 2 && s["progress"]["step"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "{s}");
        std::thread::sleep(Duration::from_millis(10));
    }
    post(port, &format!("/ui/api/jobs/{id}/cancel"), "");
    let ended = wait_job(port, &id);
    assert_eq!(ended["state"], "cancelled", "{ended}");
    assert_eq!(ended["images"].as_array().unwrap().len(), 1, "{ended}");
    assert_eq!(ended["images"][0]["settings"]["seed"], 4);
    assert!(
        ended["error"]
            .as_str()
            .unwrap()
            .contains("kept in the gallery"),
        "{ended}"
    );
    let listed = json(&get(port, "/ui/api/gallery").1);
    assert_eq!(listed["images"].as_array().unwrap().len(), 1);
}

#[test]
fn a_page_inpaint_of_the_masked_area_alone_is_the_command_lines() {
    let page = page_setup();
    let server = start(&page, &[]);
    let inputs = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs");
    let (picture, mask) = (
        inputs.join("picture-96x80.png"),
        inputs.join("mask-96x80.png"),
    );
    let body = serde_json::json!({
        "prompt": "a red fox in snow", "steps": 2, "seed": 9, "strength": 0.9, "only_masked": 8,
        "picture": data_url(&std::fs::read(&picture).unwrap()),
        "mask": data_url(&std::fs::read(&mask).unwrap()),
    });
    let done = done_job(server.port, &body);
    let entry = &done["images"][0];
    assert_eq!(entry["settings"]["only_masked"], 8);
    let cli = cli_png(
        &page,
        "a red fox in snow",
        &[
            "--steps",
            "2",
            "--seed",
            "9",
            "--strength",
            "0.9",
            "--image",
            s(&picture),
            "--mask",
            s(&mask),
            "--only-masked",
            "8",
        ],
    );
    assert_eq!(gallery_png(&page, entry), cli);
}

#[test]
fn a_page_job_with_guidance_options_and_a_hires_pass_is_the_command_lines() {
    let page = page_setup();
    let server = start(&page, &[]);
    let body = serde_json::json!({
        "prompt": "a red fox in snow", "negative_prompt": "blurry", "width": 64, "height": 64,
        "steps": 3, "guidance": 2.0, "seed": 21, "cfg_normalization": true,
        "cfg_truncation": 0.5, "hires_scale": 1.5, "hires_strength": 0.5,
    });
    let done = done_job(server.port, &body);
    let entry = &done["images"][0];
    assert_eq!(
        (entry["width"].as_u64(), entry["height"].as_u64()),
        (Some(96), Some(96))
    );
    let settings = &entry["settings"];
    assert_eq!(
        (settings["width"].as_u64(), settings["seed"].as_u64()),
        (Some(64), Some(21))
    );
    assert_eq!(settings["cfg_normalization"], true);
    assert_eq!(settings["cfg_truncation"], 0.5);
    assert_eq!(settings["hires"]["scale"], 1.5);
    assert_eq!(settings["hires"]["strength"], 0.5);
    let cli = cli_png(
        &page,
        "a red fox in snow",
        &[
            "--negative",
            "blurry",
            "--width",
            "64",
            "--height",
            "64",
            "--steps",
            "3",
            "--guidance",
            "2",
            "--seed",
            "21",
            "--cfg-normalization",
            "--cfg-truncation",
            "0.5",
            "--hires-scale",
            "1.5",
            "--hires-strength",
            "0.5",
        ],
    );
    assert_eq!(gallery_png(&page, entry), cli);
    // The pass's settings need the pass.
    let (status, answer) = post(
        server.port,
        "/ui/api/jobs",
        r#"{"prompt": "x", "hires_strength": 0.5}"#,
    );
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("hires_scale"), "{answer}");
}

#[test]
fn a_running_page_job_shows_its_steps_picture_as_it_changes() {
    let page = page_setup();
    let server = start(&page, &[]);
    let port = server.port;
    let long = serde_json::json!({"prompt": "a long one", "width": 64, "height": 48, "steps": 300});
    let (_, id) = post(port, "/ui/api/jobs", &long.to_string());
    let id = json(&id)["id"].as_str().unwrap().to_string();
    let mut first: Option<(u64, String)> = None;
    let start = Instant::now();
    let (step, picture) = loop {
        let s = json(&get(port, &format!("/ui/api/jobs/{id}")).1);
        let step = s["progress"]["step"].as_u64().unwrap_or(0);
        if let Some(picture) = s["preview"].as_str() {
            match &first {
                None => first = Some((step, picture.to_string())),
                Some((_, seen)) if seen != picture => break (step, picture.to_string()),
                Some(_) => {}
            }
        }
        assert!(start.elapsed() < PATIENCE, "{s}");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(step > first.unwrap().0);
    let png = picture
        .strip_prefix("data:image/png;base64,")
        .expect("a PNG data URL");
    let (w, h, _) = common::server::pixels(&common::server::b64(png));
    // One pixel per latent cell: an eighth of the image each way.
    assert_eq!((w, h), (8, 6));
    post(port, &format!("/ui/api/jobs/{id}/cancel"), "");
    let ended = wait_job(port, &id);
    assert_eq!(ended["state"], "cancelled", "{ended}");
    assert_eq!(ended["preview"], serde_json::Value::Null);
}

/// The page with a FLUX.2 [klein] model, in Chromium (`tests/web_page_klein.py`): the form
/// offers references and hides ControlNet and the CFG options (and for FLUX.3 [klein] also the
/// picture to start from and the hires pass), a reference added in the form
/// gives its size to the edit, and Z-Image's form has no references. The page's edit is the
/// command line's `--ref` edit, byte for byte.
#[test]
fn the_page_edits_from_a_klein_reference_in_a_real_browser() {
    ensure_chromium();
    let python = playwright_python();
    let page = page_setup();
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    for (name, dir) in [("klein", "flux2-klein-tiny"), ("flux3", "flux3-klein-tiny")] {
        let created = zimage_in(
            &page.store,
            &["create", name, "--from", s(&models.join(dir))],
        );
        assert!(created.status.success(), "{created:?}");
    }
    let server = start(&page, &[]);
    let reference =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs/picture-96x80.png");
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-page-klein");
    let summary = browser_script(&python, "web_page_klein.py", &server, &shots, &reference);
    let made = std::fs::read(page.gallery.join(summary["klein_file"].as_str().unwrap())).unwrap();
    let cli = model_cli_png(
        &page,
        "klein",
        "make it snowy",
        &["--ref", s(&reference), "--seed", "5"],
    );
    assert!(
        made == cli,
        "the page's edit differs from the command line's"
    );
}
