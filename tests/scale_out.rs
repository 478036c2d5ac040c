//! Several `zimage serve` replicas behind nginx, on loopback: each pulls the demo model from a
//! local registry (`--pull`) before it is ready, nginx (configured from `deploy/nginx.conf`)
//! spreads requests over them, a replica drains on SIGTERM without losing a request, and
//! `/metrics` counts every job once. Also: the bundle (`deploy/bundle.sh`) runs from another
//! folder with no cache, the Kubernetes manifests pass a schema check, and a bad `--pull` or an
//! unreadable store is reported.

mod common;

use common::registry::Registry;
use common::server::{free_port, Server, BIN};
use common::{s, zimage_in};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NGINX: &str = "/usr/sbin/nginx";
const PATCHELF: &str = "/usr/bin/patchelf";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The demo model pushed to `registry` as `me/tiny:v1`; its name there.
fn push_demo(registry: &Registry, dir: &Path) -> String {
    let store = dir.join("pusher");
    let demo = repo().join("models/z-image-tiny");
    let out = zimage_in(&store, &["create", "tiny", "--from", s(&demo)]);
    assert!(out.status.success(), "{out:?}");
    let name = format!("{}/me/tiny:v1", registry.host);
    let out = zimage_in(&store, &["push", "tiny", "--to", &name, "--insecure"]);
    assert!(out.status.success(), "{out:?}");
    name
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

fn get(port: u16, path: &str) -> (u16, String) {
    let r = client()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

/// A replica on the store at `store`, once it listens. Another test may take the free port
/// between its choice and the server's bind: then it starts again on another.
fn start_server(store: &Path, args: &[&str]) -> Server {
    start_server_with(store, args, &[])
}

fn start_server_with(store: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
    for _ in 0..3 {
        let mut server = Server::start(store, args, env);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if server.log().iter().any(|l| l.contains("listening on")) {
                return server;
            }
            if server.child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = server.log();
        assert!(
            log.iter().any(|l| l.contains("is in use")),
            "the server did not start: {log:?}"
        );
    }
    panic!("no free port for the server");
}

/// Waits until the replica says it is ready.
fn wait_ready(server: &Server, within: Duration) {
    let start = Instant::now();
    loop {
        let (status, body) = get(server.port, "/readyz");
        if status == 200 {
            return;
        }
        assert!(
            start.elapsed() < within,
            "not ready after {within:?}: {body}; log: {:?}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The sum of `zimage_jobs_total` over its labels, and the `ok` ones alone.
fn jobs_total(port: u16) -> (u64, u64) {
    let (status, text) = get(port, "/metrics");
    assert_eq!(status, 200, "{text}");
    let mut all = 0;
    let mut ok = 0;
    for line in text.lines().filter(|l| l.starts_with("zimage_jobs_total{")) {
        let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        all += n;
        if line.contains("outcome=\"ok\"") {
            ok += n;
        }
    }
    (all, ok)
}

/// nginx in the foreground with `deploy/nginx.conf`, its replicas and port swapped for these.
struct Nginx {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Nginx {
    fn start(replicas: [u16; 2]) -> Nginx {
        common::apt_install(&["nginx"], &[NGINX], "the scale-out test");
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path();
        // nginx's workers may run as another user than the test: they write their temporary
        // files in folders anyone may write.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(prefix, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut temps = String::new();
        for t in ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            let path = prefix.join(t);
            std::fs::create_dir(&path).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
            temps.push_str(&format!("    {t}_temp_path {};\n", path.display()));
        }
        let port = free_port();
        let deployed = std::fs::read_to_string(repo().join("deploy/nginx.conf")).unwrap();
        let conf = deployed
            .replace("zimage-1:11434", &format!("127.0.0.1:{}", replicas[0]))
            .replace("zimage-2:11434", &format!("127.0.0.1:{}", replicas[1]))
            .replace("listen 8080;", &format!("listen 127.0.0.1:{port};"))
            .replace(
                "http {\n",
                &format!("http {{\n    access_log off;\n{temps}"),
            );
        for needle in [
            format!("127.0.0.1:{}", replicas[1]),
            format!("listen 127.0.0.1:{port}"),
            "access_log off".into(),
        ] {
            assert!(conf.contains(&needle), "deploy/nginx.conf changed: {conf}");
        }
        let conf_path = prefix.join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let child = Command::new(NGINX)
            .arg("-p")
            .arg(prefix)
            .arg("-c")
            .arg(&conf_path)
            .arg("-g")
            .arg(format!(
                "daemon off; pid {}; error_log {} warn;",
                prefix.join("nginx.pid").display(),
                prefix.join("error.log").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts");
        let nginx = Nginx { child, port, dir };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nginx did not start: {}",
                nginx.errors()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        nginx
    }

    fn errors(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One tiny generation through nginx, Ollama's API for even `i`, OpenAI's for odd; its
/// PNG's size, or why it failed.
fn generate(port: u16, model: &str, i: usize) -> Result<(u32, u32), String> {
    let (path, body) = if i.is_multiple_of(2) {
        (
            "/api/generate",
            serde_json::json!({"model": model, "prompt": format!("a fox {i}"), "width": 64,
                "height": 64, "steps": 2, "stream": false, "options": {"seed": i}}),
        )
    } else {
        (
            "/v1/images/generations",
            serde_json::json!({"model": model, "prompt": format!("a fox {i}"), "size": "64x64",
                "steps": 2, "seed": i, "response_format": "b64_json"}),
        )
    };
    let r = client()
        .post(format!("http://127.0.0.1:{port}{path}"))
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .map_err(|e| format!("{path}: {e}"))?;
    let status = r.status().as_u16();
    let text = r.text().map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("{path}: {status} {text}"));
    }
    let answer: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let image = answer["image"]
        .as_str()
        .or(answer["data"][0]["b64_json"].as_str())
        .ok_or_else(|| format!("{path}: no image in {text}"))?;
    let (w, h, _) = common::server::pixels(&common::server::b64(image));
    Ok((w, h))
}

/// `count` requests from `clients` threads, each sending its share one after the other;
/// `sent` counts the answered ones. Panics naming every failure.
fn load(port: u16, model: &str, count: usize, clients: usize, sent: Arc<AtomicUsize>) {
    let next = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (next, sent, model) = (next.clone(), sent.clone(), model.to_string());
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= count {
                        return failures;
                    }
                    match generate(port, &model, i) {
                        Ok((64, 64)) => {}
                        Ok(size) => failures.push(format!("request {i}: an image of {size:?}")),
                        Err(e) => failures.push(format!("request {i}: {e}")),
                    }
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let failures: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Generation requests a replica answered with 200, by its log.
fn answered(server: &Server) -> usize {
    server
        .log()
        .iter()
        .filter(|l| {
            (l.starts_with("POST /api/generate ") || l.starts_with("POST /v1/images/generations "))
                && l.split(' ').nth(3) == Some("200")
        })
        .count()
}

#[test]
fn two_replicas_behind_nginx_share_the_work_and_one_drains_without_losing_a_request() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let model = push_demo(&registry, dir.path());
    let replica = |n: usize| {
        start_server(
            &dir.path().join(format!("store-{n}")),
            &["--pull", &model, "--insecure", "--drain-timeout", "60"],
        )
    };
    let a = replica(1);
    let mut b = replica(2);
    // Alive at once; ready once the model is in.
    assert_eq!(get(a.port, "/healthz").0, 200);
    wait_ready(&a, Duration::from_secs(60));
    wait_ready(&b, Duration::from_secs(60));
    let nginx = Nginx::start([a.port, b.port]);

    // 40 at once, Ollama's and OpenAI's: all answered, each counted once, on both replicas.
    load(nginx.port, &model, 40, 40, Arc::new(AtomicUsize::new(0)));
    let (on_a, on_b) = (jobs_total(a.port), jobs_total(b.port));
    assert_eq!(on_a.0 + on_b.0, 40, "a: {on_a:?}, b: {on_b:?}");
    assert_eq!(
        on_a.1 + on_b.1,
        40,
        "every job ended well: {on_a:?}, {on_b:?}"
    );
    assert!(
        on_a.0 > 0 && on_b.0 > 0,
        "one replica did all: {on_a:?} {on_b:?}"
    );
    let (_, metrics) = get(a.port, "/metrics");
    for family in [
        "zimage_queue_depth",
        "zimage_running_jobs",
        "zimage_generation_seconds_bucket",
        "zimage_step_seconds_bucket",
        "zimage_model_load_seconds_count",
        "zimage_resident_memory_bytes",
        "zimage_mlx_active_memory_bytes",
    ] {
        assert!(metrics.contains(family), "no {family} in {metrics}");
    }

    // A client that polls A1111's progress reaches one replica every time.
    for _ in 0..6 {
        assert_eq!(get(nginx.port, "/sdapi/v1/progress").0, 200);
    }
    let polls = |s: &Server| {
        s.log()
            .iter()
            .filter(|l| l.starts_with("GET /sdapi/v1/progress "))
            .count()
    };
    let mut seen = [polls(&a), polls(&b)];
    seen.sort();
    assert_eq!(seen, [0, 6], "the polls went to both replicas");

    // Again, from 8 clients one request after another; SIGTERM to one replica once it has
    // started on its share: what it holds is finished, the rest goes to the other.
    let sent = Arc::new(AtomicUsize::new(0));
    let before_a = on_a.0 as usize;
    let loader = {
        let (sent, model, port) = (sent.clone(), model.clone(), nginx.port);
        std::thread::spawn(move || load(port, &model, 40, 8, sent))
    };
    let start = Instant::now();
    while jobs_total(b.port).0 < on_b.0 + 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no work reached the replica"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let at_signal = sent.load(Ordering::SeqCst);
    let st = Command::new("kill")
        .args(["-TERM", &b.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = b.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the drained replica did not end: {:?}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "{:?}", b.log());
    b.wait_for_log("drained: every request was answered");
    loader.join().unwrap();
    assert!(at_signal < 40, "the load ended before the signal");
    // Every request was made exactly once: by the drained replica before it went, or by the
    // other.
    let (all_a, ok_a) = jobs_total(a.port);
    assert_eq!(all_a, ok_a, "{:?}", a.log());
    assert_eq!(
        answered(&b) + ok_a as usize,
        80,
        "a: {ok_a} (had {before_a}); b's log: {:?}",
        b.log()
    );
    assert!(
        ok_a as usize > before_a,
        "the other replica took no new work"
    );
    let refused = b.log().iter().filter(|l| l.contains(" 503 ")).count();
    eprintln!(
        "signal after {at_signal} of 40; the drained replica answered {} in all and refused {refused} while draining; the other answered {ok_a}",
        answered(&b)
    );
    drop(nginx);
}

#[test]
fn a_pull_of_a_model_the_registry_lacks_stops_the_server_with_one_line_and_exit_2() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("{}/me/none:v1", registry.host);
    let child = Command::new(BIN)
        .arg("--store")
        .arg(dir.path().join("store"))
        .args([
            "serve",
            "--host",
            "127.0.0.1:0",
            "--insecure",
            "--pull",
            &missing,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::output_within(child, Duration::from_secs(30), || {
        panic!("the server did not stop")
    });
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("me/none"), "{stderr}");

    // A name that is no name is refused before the server listens.
    let out = zimage_in(
        &dir.path().join("store"),
        &["serve", "--host", "127.0.0.1:0", "--pull", "Bad Name!"],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--pull"), "{stderr}");
}

#[test]
fn a_replica_whose_store_cannot_be_read_is_alive_but_not_ready_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    // A file where the models' folder should be: unreadable as a folder, even to root.
    std::fs::write(store.join("manifests"), b"").unwrap();
    let server = start_server(&store, &[]);
    assert_eq!(get(server.port, "/healthz").0, 200);
    let (status, body) = get(server.port, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("manifests"), "{body}");
    let line = server.wait_for_log("not ready:");
    assert!(line.contains("manifests"), "{line}");
}

#[test]
fn the_bundle_runs_from_another_folder_without_the_cache_or_a_compiler_on_a_read_only_store() {
    common::apt_install(&["patchelf"], &[PATCHELF], "the bundle test");
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("dist/zimage");
    let out = Command::new("bash")
        .arg(repo().join("deploy/bundle.sh"))
        .arg(BIN)
        .arg(&folder)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(dir.path().join("dist/zimage.tar.gz").is_file());
    let program = folder.join("zimage");

    // Its MLX comes from the bundle.
    let ldd = Command::new("ldd").arg(&program).output().unwrap();
    let ldd = String::from_utf8_lossy(&ldd.stdout).to_string();
    let libmlx = ldd
        .lines()
        .find(|l| l.contains("libmlx"))
        .unwrap_or_else(|| panic!("no libmlx in {ldd}"));
    assert!(
        libmlx.contains(s(&folder.join("lib"))),
        "libmlx resolves outside the bundle: {libmlx}"
    );
    assert!(!ldd.contains("not found"), "{ldd}");

    // From another folder, with a HOME of its own (no ~/.cache/zimage) and nothing on PATH.
    let elsewhere = dir.path().join("elsewhere");
    let home = dir.path().join("home");
    let empty = dir.path().join("empty-path");
    for d in [&elsewhere, &home, &empty] {
        std::fs::create_dir_all(d).unwrap();
    }
    let run = |args: &[&str]| {
        Command::new(&program)
            .args(args)
            .current_dir(&elsewhere)
            .env_clear()
            .env("HOME", &home)
            .env("PATH", &empty)
            .output()
            .unwrap()
    };
    let demo = repo().join("models/z-image-tiny");
    let out = run(&["--store", "store", "create", "tiny", "--from", s(&demo)]);
    assert!(out.status.success(), "{out:?}");
    let out = run(&[
        "--store", "store", "generate", "a fox", "--model", "tiny", "--width", "64", "--height",
        "64", "--steps", "2", "--seed", "3", "-o", "fox.png",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(elsewhere.join("fox.png").is_file());
    assert!(!home.join(".cache/zimage/lib").exists());

    // The same store, read-only to the user who serves from it (as on a shared read-only
    // volume): it generates without the store's lock. As root, that user is `nobody`.
    use std::os::unix::fs::PermissionsExt;
    let open = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
    open(dir.path(), 0o755).unwrap();
    open(&elsewhere, 0o777).unwrap();
    let store = elsewhere.join("store");
    let root = String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout).unwrap();
    let mut cmd = if root.trim() == "0" {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&program);
        c
    } else {
        let st = Command::new("chmod")
            .args(["-R", "a-w"])
            .arg(&store)
            .status();
        assert!(st.unwrap().success());
        Command::new(&program)
    };
    let out = cmd
        .args([
            "--store",
            s(&store),
            "generate",
            "a fox",
            "--model",
            "tiny",
            "--width",
            "64",
        ])
        .args([
            "--height",
            "64",
            "--steps",
            "2",
            "--seed",
            "3",
            "-o",
            "fox-ro.png",
        ])
        .current_dir(&elsewhere)
        .env_clear()
        .env("HOME", &home)
        .env("ZIMAGE_CACHE_DIR", &elsewhere)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let _ = Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(&store)
        .status();
    assert!(out.status.success(), "{out:?}");
    assert!(elsewhere.join("fox-ro.png").is_file());
}

#[test]
fn the_kubernetes_manifests_pass_a_schema_check() {
    let venv = common::test_cache().join("venv-kubernetes");
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import kubernetes_validate"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        std::fs::create_dir_all(common::test_cache()).unwrap();
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 is needed to check the manifests");
        assert!(made.success(), "cannot create a venv at {}", venv.display());
        let installed = Command::new(&python)
            .args(["-m", "pip", "install", "-q", "kubernetes-validate"])
            .status()
            .unwrap();
        assert!(
            installed.success(),
            "pip could not install kubernetes-validate"
        );
    }
    let dir = repo().join("deploy/kubernetes");
    // Every manifest; KEDA's ScaledObject, a custom resource, has no schema there and is
    // only read as YAML.
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    manifests.sort();
    assert!(manifests.len() >= 4, "{manifests:?}");
    let out = Command::new(venv.join("bin/kubernetes-validate"))
        .arg("--strict")
        .args(&manifests)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A metric's value in a replica's `/metrics`.
fn metric(port: u16, name: &str) -> f64 {
    let (_, text) = get(port, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

fn wait_metric(port: u16, name: &str, value: f64) {
    let start = Instant::now();
    while metric(port, name) != value {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{name} never {value}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_drain_past_its_timeout_stops_what_is_left_answers_it_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::server::demo_store(dir.path());
    let mut server = start_server(&store, &["--drain-timeout", "2"]);
    let port = server.port;
    let post = move |steps: usize| {
        std::thread::spawn(move || {
            let body = serde_json::json!({"model": "tiny", "prompt": "a fox", "width": 64,
                "height": 64, "steps": steps, "stream": false});
            let r = client()
                .post(format!("http://127.0.0.1:{port}/api/generate"))
                .header("Content-Type", "application/json")
                .body(body.to_string())
                .send()
                .unwrap();
            (r.status().as_u16(), r.text().unwrap())
        })
    };
    // One long job runs, another waits behind it.
    let long = post(1000);
    wait_metric(port, "zimage_running_jobs", 1.0);
    let queued = post(2);
    wait_metric(port, "zimage_queue_depth", 1.0);

    let st = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    server.wait_for_log("draining");
    // While it drains: not ready, and new work is refused with Retry-After.
    let (status, body) = get(port, "/readyz");
    assert_eq!((status, body.contains("draining")), (503, true), "{body}");
    let r = client()
        .post(format!("http://127.0.0.1:{port}/v1/images/generations"))
        .header("Content-Type", "application/json")
        .body(r#"{"model": "tiny", "prompt": "a fox", "size": "64x64"}"#)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert!(r.headers().contains_key("retry-after"));

    let start = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(1), "{:?}", server.log());
    // Both were answered: the running one stopped, the waiting one told to come again.
    let (status, body) = long.join().unwrap();
    assert_eq!(status, 409, "{body}");
    let (status, body) = queued.join().unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("send it again"), "{body}");
    assert!(server.log().iter().any(|l| l.contains("timed out")));
}

#[test]
fn probes_answer_without_the_key_and_for_any_host_and_metrics_need_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::server::demo_store(dir.path());
    let keyed = start_server(&store, &["--api-key", "s3cret"]);
    assert_eq!(get(keyed.port, "/healthz").0, 200);
    assert_eq!(get(keyed.port, "/readyz").0, 200);
    assert_eq!(get(keyed.port, "/metrics").0, 401);
    let r = client()
        .get(format!("http://127.0.0.1:{}/metrics", keyed.port))
        .bearer_auth("s3cret")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    drop(keyed);

    // Without a key the server answers requests for this machine only; a probe by another
    // name (a pod's address, a Service's name) is answered all the same.
    let open = start_server(&store, &[]);
    let by_name = |path: &str| {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: zimage.example:11434\r\nConnection: close\r\n\r\n"
        );
        common::server::raw(open.port, request.as_bytes()).0
    };
    assert_eq!(by_name("/readyz"), 200);
    assert_eq!(by_name("/healthz"), 200);
    assert_eq!(by_name("/api/tags"), 403);
}

#[test]
fn a_replica_pulls_a_hugging_face_model_before_it_is_ready_and_generates_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    common::copy_model(&repo().join("models/z-image-tiny"), &repo_dir);
    let hub = common::hub::HubServer::start(&repo_dir, "tiny-org/z-image-tiny", None);
    let hf_home = dir.path().join("hf");
    let name = "hf.co/tiny-org/z-image-tiny";
    let server = start_server_with(
        &dir.path().join("store"),
        &["--pull", name],
        &[("HF_ENDPOINT", &hub.url), ("HF_HOME", s(&hf_home))],
    );
    wait_ready(&server, Duration::from_secs(60));
    server.wait_for_log("every model is in the store");
    let r = client()
        .post(format!("http://127.0.0.1:{}/api/generate", server.port))
        .header("Content-Type", "application/json")
        .body(
            serde_json::json!({"model": name, "prompt": "a fox", "width": 64, "height": 64,
                "steps": 2, "stream": false})
            .to_string(),
        )
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}
