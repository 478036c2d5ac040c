//! `zimage pull hf.co/OWNER/REPO` against a Hub-like server on 127.0.0.1 serving the demo
//! model (`tests/common/hub.rs`): a fresh pull, a modular pipeline's, a resumed one, one from a full Hugging Face
//! cache, a file whose sha256 or git blob id is not the Hub's, a gated model, the one-line
//! failures; pulls of one repository at once, and a hostile Hub or cache: a config listed at a
//! terabyte, zeros without end, links and FIFOs in the cache, a Hub that sends two bytes a
//! second to a client that leaves.

mod common;

use common::hub::{HubServer, COMMIT};
use common::{s, zimage_in};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const REPO: &str = "tiny-org/z-image-tiny";
const NAME: &str = "hf.co/tiny-org/z-image-tiny";
const TRANSFORMER: &str = "transformer/diffusion_pytorch_model.safetensors";
const VAE: &str = "vae/diffusion_pytorch_model.safetensors";

struct Setup {
    dir: tempfile::TempDir,
    hub: HubServer,
}

impl Setup {
    /// The demo model as a repository, with files a pipeline does not take beside it.
    fn new(token: Option<&str>) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
        common::copy_model(&demo, &repo);
        std::fs::write(repo.join("README.md"), "# tiny\n").unwrap();
        std::fs::write(
            repo.join("transformer/diffusion_pytorch_model.fp16.safetensors"),
            b"a variant the pull leaves on the Hub",
        )
        .unwrap();
        let hub = HubServer::start(&repo, REPO, token);
        Setup { dir, hub }
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    fn hf_home(&self) -> PathBuf {
        self.dir.path().join("hf")
    }

    fn cached_repo(&self) -> PathBuf {
        self.hf_home().join("hub/models--tiny-org--z-image-tiny")
    }

    /// `zimage ARGS` with this Hub and cache, and no token unless `env` gives one.
    fn run(&self, store: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_zimage"));
        cmd.arg("--store")
            .arg(store)
            .args(args)
            .env("HF_ENDPOINT", &self.hub.url)
            .env("HF_HOME", self.hf_home())
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_CACHE")
            .env_remove("HF_TOKEN_PATH");
        for (k, v) in env {
            cmd.env(k, v);
        }
        // A pull that blocks fails the test instead of hanging it.
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        common::output_within(child, Duration::from_secs(120), || {
            panic!("zimage {args:?} still running after 120 s")
        })
    }

    fn pull(&self, env: &[(&str, &str)]) -> Output {
        self.run(&self.store(), &["pull", NAME], env)
    }

    /// The bytes of the files a pipeline takes (all but the README and the variant).
    fn pipeline_bytes(&self) -> u64 {
        (self.hub.state.files.iter())
            .filter(|f| !f.path.ends_with(".md") && !f.path.contains(".fp16."))
            .map(|f| f.bytes.len() as u64)
            .sum()
    }
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Exit 2 with one line on stderr; that line.
fn one_line_error(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

fn stored_models(store: &Path) -> String {
    ok(&zimage_in(store, &["list"]))
}

#[test]
fn a_fresh_pull_takes_the_pipeline_into_the_cache_and_stores_what_create_would() {
    let t = Setup::new(None);
    let out = ok(&t.pull(&[]));
    assert!(out.contains(&format!("pulled {NAME}")), "{out}");
    assert_eq!(t.hub.bytes_sent(), t.pipeline_bytes());
    let seen = t.hub.seen();
    assert!(
        seen.iter()
            .all(|r| !r.path.contains("README") && !r.path.contains(".fp16.")),
        "{seen:?}"
    );
    // LFS files came from the CDN origin, the others from the Hub's.
    let transformer = t.hub.file(TRANSFORMER);
    assert!(seen
        .iter()
        .any(|r| r.origin == "cdn" && r.path.ends_with(&transformer.sha256)));
    // The Hugging Face cache holds them as huggingface_hub lays them out.
    let cached = t.cached_repo();
    assert_eq!(
        std::fs::read_to_string(cached.join("refs/main")).unwrap(),
        COMMIT
    );
    let link = cached.join("snapshots").join(COMMIT).join(TRANSFORMER);
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("../../../blobs").join(&transformer.sha256)
    );
    assert_eq!(std::fs::read(&link).unwrap(), transformer.bytes.as_ref());
    // The store holds what `create --from` the same folder makes: every blob already there.
    assert!(stored_models(&t.store()).contains(NAME));
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let created = ok(&zimage_in(
        &t.store(),
        &["create", "local", "--from", s(&demo)],
    ));
    assert!(created.contains(" 0 blobs written"), "{created}");
}

/// A modular pipeline (FLUX.3 [klein]'s layout) keeps its index in `modular_model_index.json`,
/// whose components carry a third entry: it pulls, and stores what `create --from` its folder
/// makes.
#[test]
fn a_modular_pipeline_pulls_and_stores_what_its_folder_creates() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/flux3-klein-tiny");
    assert!(tiny.join("modular_model_index.json").is_file());
    assert!(!tiny.join("model_index.json").exists());
    let repo = dir.path().join("repo");
    common::copy_model(&tiny, &repo);
    let hub = HubServer::start(&repo, "tiny-org/flux3-klein-tiny", None);
    let t = Setup { dir, hub };
    let name = "hf.co/tiny-org/flux3-klein-tiny";
    let out = ok(&t.run(&t.store(), &["pull", name], &[]));
    assert!(out.contains(&format!("pulled {name}")), "{out}");
    let seen = t.hub.seen();
    let index = seen
        .iter()
        .any(|r| r.path.ends_with("/modular_model_index.json"));
    assert!(index, "{seen:?}");
    let shown = ok(&zimage_in(&t.store(), &["show", name]));
    assert!(shown.contains("FLUX.3 [klein]"), "{shown}");
    let created = ok(&zimage_in(
        &t.store(),
        &["create", "local", "--from", s(&tiny)],
    ));
    assert!(created.contains(" 0 blobs written"), "{created}");
}

/// A FLUX.1 repository as Black Forest Labs lays it out: the diffusers pipeline with its second
/// text encoder and tokenizer, and beside it the original single files (`flux1-dev.safetensors`,
/// `ae.safetensors`) a pull leaves on the Hub. It stores what `create --from` its folder makes.
#[test]
fn a_pipeline_with_two_text_encoders_pulls_its_folders_and_not_the_single_files() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/flux1-dev-tiny");
    let repo = dir.path().join("repo");
    common::copy_model(&tiny, &repo);
    for single in ["flux1-dev.safetensors", "ae.safetensors"] {
        std::fs::write(
            repo.join(single),
            b"an original file the pull leaves on the Hub",
        )
        .unwrap();
    }
    let hub = HubServer::start(&repo, "tiny-org/flux1-dev-tiny", None);
    let t = Setup { dir, hub };
    let name = "hf.co/tiny-org/flux1-dev-tiny";
    let out = ok(&t.run(&t.store(), &["pull", name], &[]));
    assert!(out.contains(&format!("pulled {name}")), "{out}");
    let seen: Vec<String> = t.hub.seen().iter().map(|r| r.path.clone()).collect();
    for wanted in [
        "text_encoder_2/model.safetensors",
        "tokenizer_2/tokenizer.json",
        "tokenizer/vocab.json",
    ] {
        assert!(
            seen.iter().any(|p| p.ends_with(wanted)),
            "{wanted}: {seen:?}"
        );
    }
    assert!(
        !seen
            .iter()
            .any(|p| p.ends_with("/flux1-dev.safetensors") || p.ends_with("/ae.safetensors")),
        "{seen:?}"
    );
    let shown = ok(&zimage_in(&t.store(), &["show", name]));
    assert!(
        shown.contains("FLUX.1") && shown.contains("text_encoder_2"),
        "{shown}"
    );
    let created = ok(&zimage_in(
        &t.store(),
        &["create", "local", "--from", s(&tiny)],
    ));
    assert!(created.contains(" 0 blobs written"), "{created}");
}

#[test]
fn an_interrupted_download_resumes_where_it_broke_off() {
    let t = Setup::new(None);
    // The transformer (from the CDN) and the vocabulary (from the Hub) break off halfway once;
    // an earlier run left the VAE's first kilobyte.
    t.hub
        .state
        .cut_once
        .lock()
        .unwrap()
        .extend([TRANSFORMER.to_string(), "tokenizer/vocab.json".to_string()]);
    let vae = t.hub.file(VAE);
    let blobs = t.cached_repo().join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(
        blobs.join(format!("{}.incomplete", vae.sha256)),
        &vae.bytes[..1000],
    )
    .unwrap();
    let out = ok(&t.pull(&[]));
    assert!(out.contains("resumed"), "{out}");
    // No byte came twice.
    assert_eq!(t.hub.bytes_sent(), t.pipeline_bytes() - 1000);
    let ranges: Vec<(String, String)> = (t.hub.seen().into_iter())
        .filter_map(|r| Some((r.path, r.range?)))
        .collect();
    let transformer = t.hub.file(TRANSFORMER);
    let half = transformer.bytes.len() / 2;
    assert!(
        ranges.contains(&(
            format!("/lfs/{}", transformer.sha256),
            format!("bytes={half}-")
        )),
        "{ranges:?}"
    );
    assert!(
        ranges.contains(&(format!("/lfs/{}", vae.sha256), "bytes=1000-".to_string())),
        "{ranges:?}"
    );
    assert!(ranges
        .iter()
        .any(|(p, _)| p.ends_with("tokenizer/vocab.json")));
    assert!(std::fs::read_dir(&blobs).unwrap().all(|e| !e
        .unwrap()
        .path()
        .to_string_lossy()
        .ends_with(".incomplete")));
    ok(&zimage_in(&t.store(), &["verify", NAME]));
}

#[test]
fn a_pull_with_every_file_in_the_cache_downloads_nothing() {
    let t = Setup::new(None);
    ok(&t.pull(&[]));
    let sent = t.hub.bytes_sent();
    let requests = t.hub.seen().len();
    // Another store, the same cache: only the file list is asked for; `--quantize` applies.
    let other = t.dir.path().join("other");
    let out = ok(&t.run(&other, &["pull", NAME, "--quantize", "int8"], &[]));
    assert!(out.contains("0 files downloaded"), "{out}");
    let shown = ok(&zimage_in(&other, &["show", NAME]));
    assert!(shown.contains("MLX affine"), "{shown}");
    // `create --from hf.co/…` takes them from the cache too.
    let out = ok(&t.run(&other, &["create", "mine", "--from", NAME], &[]));
    assert!(out.contains("created mine"), "{out}");
    assert_eq!(t.hub.bytes_sent(), sent);
    let later = &t.hub.seen()[requests..];
    assert_eq!(later.len(), 2, "{later:?}");
    assert!(later.iter().all(|r| r.path.starts_with("/api/models/")));
}

#[test]
fn a_file_whose_sha256_is_not_the_hubs_is_refused_and_nothing_is_stored() {
    let t = Setup::new(None);
    *t.hub.state.wrong_sha256.lock().unwrap() = Some(VAE.to_string());
    let err = one_line_error(&t.pull(&[]));
    // The Hub's record (list and `X-Linked-Etag`) agrees with itself: the bytes, hashed as
    // they came, are what tells.
    assert!(
        err.contains(VAE) && err.contains("hashing to sha256"),
        "{err}"
    );
    assert!(err.contains("nothing was stored"), "{err}");
    assert!(!stored_models(&t.store()).contains("hf.co"));
    let blobs = t.cached_repo().join("blobs");
    let names: Vec<String> = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    let vae = &t.hub.file(VAE).sha256;
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with(vae) && !n.starts_with("0000")),
        "{names:?}"
    );
}

#[test]
fn a_file_outside_lfs_whose_bytes_are_not_its_git_blob_is_refused() {
    let t = Setup::new(None);
    let config = "transformer/config.json";
    *t.hub.state.altered.lock().unwrap() = Some(config.to_string());
    let err = one_line_error(&t.pull(&[]));
    let listed = &t.hub.file(config).blob_id;
    assert!(
        err.contains(config) && err.contains(&format!("git blob id {listed}")),
        "{err}"
    );
    assert!(err.contains("nothing was stored"), "{err}");
    assert!(!stored_models(&t.store()).contains("hf.co"));
    assert!(!t.cached_repo().join("blobs").join(listed).exists());
}

#[test]
fn a_gated_model_needs_the_token_which_never_reaches_the_cdn() {
    let t = Setup::new(Some("hf_secret"));
    let err = one_line_error(&t.pull(&[]));
    assert!(err.contains("401") && err.contains("HF_TOKEN"), "{err}");
    let err = one_line_error(&t.pull(&[("HF_TOKEN", "hf_wrong")]));
    assert!(err.contains("refused the token"), "{err}");
    ok(&t.pull(&[("HF_TOKEN", "hf_secret")]));
    let seen = t.hub.seen();
    assert!(seen.iter().any(|r| r.origin == "cdn"));
    for r in seen.iter().filter(|r| r.origin == "cdn") {
        assert_eq!(r.authorization, None, "{r:?}");
    }
    // The file `hf auth login` writes serves as well.
    std::fs::write(t.hf_home().join("token"), "hf_secret\n").unwrap();
    let other = t.dir.path().join("other");
    ok(&t.run(&other, &["pull", NAME], &[]));
    assert_eq!(
        t.hub.seen().last().unwrap().authorization.as_deref(),
        Some("Bearer hf_secret")
    );
}

#[test]
fn an_unknown_repository_revision_or_an_unreachable_hub_is_one_line() {
    let t = Setup::new(None);
    let err = one_line_error(&t.run(&t.store(), &["pull", "hf.co/tiny-org/nope"], &[]));
    assert!(
        err.contains("404") && err.contains("tiny-org/nope"),
        "{err}"
    );
    let err = one_line_error(&t.run(&t.store(), &["pull", &format!("{NAME}:v9")], &[]));
    assert!(err.contains("`v9`"), "{err}");
    let port = common::server::free_port();
    let err = one_line_error(&t.run(
        &t.store(),
        &["pull", NAME],
        &[("HF_ENDPOINT", &format!("http://127.0.0.1:{port}"))],
    ));
    assert!(err.contains("cannot reach"), "{err}");
    assert!(!stored_models(&t.store()).contains("hf.co"));
}

/// A server on an empty store that reaches the test Hub.
fn serve(t: &Setup) -> common::server::Server {
    let store = t.store();
    std::fs::create_dir_all(&store).unwrap();
    let hf_home = t.hf_home();
    common::server::Server::start(
        &store,
        &["--keep-alive", "-1"],
        &[("HF_ENDPOINT", &t.hub.url), ("HF_HOME", s(&hf_home))],
    )
}

#[test]
fn the_ollama_client_pulls_through_the_server() {
    let t = Setup::new(None);
    let server = serve(&t);
    let script = r#"
import json, sys, ollama
client = ollama.Client(host=sys.argv[1])
lines = [p.model_dump() for p in client.pull(sys.argv[2], stream=True)]
final = client.pull(sys.argv[2], stream=False).status
try:
    client.pull("hf.co/tiny-org/nope")
    refused = None
except ollama.ResponseError as e:
    refused = [e.status_code, e.error]
print(json.dumps({"lines": lines, "final": final, "refused": refused}))
"#;
    let out = Command::new(common::test_python())
        .args(["-c", script, &server.url(), NAME])
        .output()
        .unwrap();
    let report = common::server::json(&ok(&out));
    let lines = report["lines"].as_array().unwrap();
    assert_eq!(lines.last().unwrap()["status"], "success", "{lines:?}");
    let transformer = t.hub.file(TRANSFORMER);
    let digest = format!("sha256:{}", transformer.sha256);
    let size = transformer.bytes.len();
    assert!(
        lines.iter().any(|l| l["digest"] == digest.as_str()
            && l["completed"] == size
            && l["total"] == size),
        "{lines:?}"
    );
    assert_eq!(report["final"], "success");
    let refused = &report["refused"];
    assert_eq!(refused[0], 500, "{refused}");
    assert!(refused[1].as_str().unwrap().contains("404"), "{refused}");
    let (_, tags) = common::server::get(server.port, "/api/tags");
    assert!(tags.contains(NAME), "{tags}");
}

#[test]
fn the_page_pulls_a_model_into_an_empty_store_and_generates_with_it() {
    common::browser::ensure_chromium();
    let python = common::browser::playwright_python();
    let t = Setup::new(None);
    let server = serve(&t);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-page-pull");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web_page_pull.py");
    let out = Command::new(&python)
        .arg(&script)
        .args([&server.url(), NAME, s(&shots)])
        .env("CHROMIUM", common::browser::CHROMIUM)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\nserver log: {:?}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    assert!(stored_models(&t.store()).contains(NAME));
}

/// The `.incomplete` files in a cached repository's blobs.
fn incomplete_files(repo: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(repo.join("blobs")) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".incomplete"))
        .collect()
}

/// A POST whose answer may take minutes (six imports on a busy machine): its status and body.
fn post_waiting(port: u16, path: &str, body: &str) -> (u16, String) {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(300)))
        .unwrap();
    let request = common::server::request("POST", path, "Content-Type: application/json\r\n", body);
    stream.write_all(&request).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

/// Pulls at once link the same snapshot files at once: each link is made whole or left to the
/// other, never failed on for being there (`File exists`).
#[test]
fn links_made_at_once_by_many_pulls_never_fail() {
    use zimage::hub::{cache::RepoCache, HubFile};
    let dir = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(dir.path(), "o", "r");
    let f = HubFile {
        path: "text_encoder/config.json".into(),
        size: 2,
        etag: "ab".repeat(20),
        sha256: None,
    };
    let link = cache.snapshot(COMMIT).join(&f.path);
    for _ in 0..100 {
        let _ = std::fs::remove_file(&link);
        let barrier = std::sync::Barrier::new(8);
        let failures: Vec<String> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        cache.link(COMMIT, &f)
                    })
                })
                .collect();
            (threads.into_iter())
                .filter_map(|t| t.join().unwrap().err().map(|e| e.to_string()))
                .collect()
        });
        assert!(failures.is_empty(), "{failures:?}");
        let target = std::fs::read_link(&link).unwrap();
        assert_eq!(target, Path::new("../../../blobs").join(&f.etag));
    }
}

#[test]
fn six_pulls_of_one_repository_at_once_through_the_server_all_succeed() {
    let t = Setup::new(None);
    let server = serve(&t);
    let port = server.port;
    let body = format!(r#"{{"model":"{NAME}","stream":false}}"#);
    let pulls: Vec<_> = (0..6)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || post_waiting(port, "/api/pull", &body))
        })
        .collect();
    for pull in pulls {
        let (status, answer) = pull.join().unwrap();
        assert_eq!(status, 200, "{answer}");
    }
    let (_, tags) = common::server::get(port, "/api/tags");
    assert!(tags.contains(NAME), "{tags}");
    assert!(incomplete_files(&t.cached_repo()).is_empty());
}

#[test]
fn a_config_listed_larger_than_zimage_reads_is_refused_before_its_first_byte() {
    let t = Setup::new(None);
    // Listed at a terabyte, sent as zeros without end; an earlier run left 1 MiB of it.
    let index = t.hub.file("model_index.json").blob_id.clone();
    let blobs = t.cached_repo().join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(
        blobs.join(format!("{index}.incomplete")),
        vec![0u8; 1 << 20],
    )
    .unwrap();
    *t.hub.state.listed_size.lock().unwrap() = Some(("model_index.json".into(), 1 << 40));
    *t.hub.state.endless.lock().unwrap() = Some("model_index.json".into());
    let err = one_line_error(&t.pull(&[]));
    assert!(
        err.contains("`model_index.json` is listed at 1099511627776 bytes")
            && err.contains("refused before downloading"),
        "{err}"
    );
    assert_eq!(t.hub.bytes_sent(), 0);
    assert!(incomplete_files(&t.cached_repo()).is_empty());
    // Listed at its size but sent without end: cut at the size, the partial file deleted.
    *t.hub.state.listed_size.lock().unwrap() = None;
    *t.hub.state.endless.lock().unwrap() = Some("vae/config.json".into());
    let err = one_line_error(&t.pull(&[]));
    assert!(
        err.contains("sends more than") && err.contains("vae/config.json"),
        "{err}"
    );
    assert!(t.hub.bytes_sent() < t.pipeline_bytes() + (16 << 20));
    // Files the failure stopped keep theirs, for the next pull to continue; not this one.
    let vae_config = &t.hub.file("vae/config.json").blob_id;
    let left = incomplete_files(&t.cached_repo());
    assert!(!left.iter().any(|n| n.starts_with(vae_config)), "{left:?}");
    assert!(!stored_models(&t.store()).contains("hf.co"));
}

#[cfg(unix)]
#[test]
fn links_out_of_the_cache_are_refused_and_nothing_outside_it_is_touched() {
    let t = Setup::new(None);
    let outside = t.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let victim = outside.join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let index = t.hub.file("model_index.json").blob_id.clone();
    let cases = [
        format!("blobs/{index}.incomplete"),
        "refs/main".to_string(),
        format!("snapshots/{COMMIT}/vae"),
        format!("snapshots/{COMMIT}"),
    ];
    for (i, rel) in cases.iter().enumerate() {
        let home = t.dir.path().join(format!("hf-{i}"));
        let at = home.join("hub/models--tiny-org--z-image-tiny").join(rel);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        // A file for a file's place, a folder holding a file for a folder's.
        let folder = rel.starts_with("snapshots");
        let target = match folder {
            true => {
                let d = outside.join(format!("folder-{i}"));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join("config.json"), "keep").unwrap();
                d
            }
            false => victim.clone(),
        };
        std::os::unix::fs::symlink(&target, &at).unwrap();
        let err = one_line_error(&t.run(&t.store(), &["pull", NAME], &[("HF_HOME", s(&home))]));
        assert!(
            err.contains("is a symbolic link") && err.contains(rel.as_str()),
            "{rel}: {err}"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep", "{rel}");
        if folder {
            let names: Vec<String> = std::fs::read_dir(&target)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .collect();
            assert_eq!(names, ["config.json"], "{rel}");
            let kept = std::fs::read_to_string(target.join("config.json")).unwrap();
            assert_eq!(kept, "keep", "{rel}");
        }
    }
    assert!(!stored_models(&t.store()).contains("hf.co"));
}

#[cfg(unix)]
#[test]
fn fifos_in_the_cache_fail_the_pull_at_once_instead_of_blocking_it() {
    let t = Setup::new(None);
    let index = t.hub.file("model_index.json").blob_id.clone();
    let cases = [
        "models--tiny-org--z-image-tiny/refs/main".to_string(),
        format!(".locks/models--tiny-org--z-image-tiny/{index}.lock"),
    ];
    for (i, rel) in cases.iter().enumerate() {
        let home = t.dir.path().join(format!("hf-{i}"));
        let fifo = home.join("hub").join(rel);
        std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let started = Instant::now();
        let err = one_line_error(&t.run(&t.store(), &["pull", NAME], &[("HF_HOME", s(&home))]));
        assert!(
            err.contains("is a FIFO") && err.contains(rel.as_str()),
            "{rel}: {err}"
        );
        assert!(started.elapsed() < Duration::from_secs(30), "{rel}");
    }
}

#[test]
fn a_server_pull_is_refused_to_other_sites_and_ends_when_its_client_leaves() {
    let t = Setup::new(None);
    let server = serve(&t);
    let port = server.port;
    let body = format!(r#"{{"model":"{NAME}","stream":false}}"#);
    // A form of another site's page: the browser names no origin, but says it is cross-site.
    let (status, answer) = common::server::raw(
        port,
        &common::server::request(
            "POST",
            "/api/pull",
            "Sec-Fetch-Site: cross-site\r\nContent-Type: text/plain\r\n",
            &body,
        ),
    );
    assert_eq!(status, 403, "{answer}");
    assert!(t.hub.seen().is_empty(), "{:?}", t.hub.seen());

    // The transformer comes two bytes a second; its client hangs up while it comes.
    *t.hub.state.slow.lock().unwrap() = Some(TRANSFORMER.to_string());
    let lfs = format!("/lfs/{}", t.hub.file(TRANSFORMER).sha256);
    let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let request = common::server::request(
        "POST",
        "/api/pull",
        "Content-Type: application/json\r\n",
        &body,
    );
    client.write_all(&request).unwrap();
    let start = Instant::now();
    while !t.hub.seen().iter().any(|r| r.path == lfs) {
        assert!(start.elapsed() < Duration::from_secs(30), "no download");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    drop(client);
    let left = Instant::now();
    while !t
        .hub
        .state
        .slow_dropped
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        assert!(
            left.elapsed() < Duration::from_secs(10),
            "the pull kept the Hub's connection after its client left: {:?}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, tags) = common::server::get(port, "/api/tags");
    assert!(!tags.contains(NAME), "{tags}");
    // The next pull continues what the last left and stores the model whole.
    *t.hub.state.slow.lock().unwrap() = None;
    let (status, answer) = common::server::post(port, "/api/pull", &body);
    assert_eq!(status, 200, "{answer}");
    assert!(incomplete_files(&t.cached_repo()).is_empty());
    ok(&zimage_in(&t.store(), &["verify", NAME]));
}
