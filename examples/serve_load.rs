//! Load figures for `zimage serve`: 32 concurrent requests from 8 clients against a queue of 8,
//! on the embedded demo model, in this process. Prints throughput, p50/p99 latency of the
//! completed requests, how many got 503, and resident memory after the first request and
//! after the run.
//!
//! `cargo run --release --example serve_load [-- SIDE STEPS]` (default 64×64, 2 steps).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zimage::diffusers_dir::DiffusersDir;
use zimage::server::{self, worker, AppState};
use zimage::store::{ImportOptions, Store};

const CLIENTS: usize = 8;
const PER_CLIENT: usize = 4;
const QUEUE: usize = 8;

fn post(port: u16, body: &str) -> (u16, Duration) {
    let start = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let request = format!(
        "POST /api/generate HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read");
    let status = String::from_utf8_lossy(&answer[..answer.len().min(16)])
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, start.elapsed())
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or_else(
            || zimage::platform::peak_resident_bytes().unwrap_or(0) as f64 / 1e6,
            |kb| kb / 1e3,
        )
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let side: u32 = args.first().map_or(Ok(64), |a| a.parse())?;
    let steps: u32 = args.get(1).map_or(Ok(2), |a| a.parse())?;
    let dir = tempfile::tempdir()?;
    let store = Store::at(&dir.path().join("store"));
    let demo =
        DiffusersDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny"))?;
    store.create("tiny", &demo, &ImportOptions::default(), &|_| {})?;
    let worker = worker::Worker::start(worker::Settings {
        store: store.clone(),
        keep_alive: worker::KeepAlive::Forever,
        max_queue: QUEUE,
        memory_limit: None,
        dtype: None,
    })?;
    let state = Arc::new(AppState {
        store,
        worker,
        api_key: None,
        lora_dir: None,
        hosted: Default::default(),
        inputs: zimage::input_budget::Pool::for_budget(
            zimage::memory_plan::budget(None)
                .map_err(anyhow::Error::msg)?
                .0,
        ),
        default_model: Default::default(),
        gallery: server::ui::gallery::Gallery::new(dir.path().join("gallery")),
        page_jobs: Default::default(),
        readiness: Default::default(),
    });
    let runtime = tokio::runtime::Runtime::new()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let port = listener.local_addr()?.port();
    runtime.spawn(server::serve(listener, state));

    let body = format!(
        r#"{{"model":"tiny","prompt":"a red fox in the snow","width":{side},"height":{side},"steps":{steps},"stream":false,"options":{{"seed":1}}}}"#
    );
    let (status, first) = post(port, &body);
    assert_eq!(status, 200, "the first request failed");
    let rss_first = rss_mb();

    let start = Instant::now();
    let results: Vec<(u16, Duration)> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let body = &body;
                scope.spawn(move || {
                    let requests: Vec<_> = (0..PER_CLIENT)
                        .map(|_| scope.spawn(move || post(port, body)))
                        .collect();
                    requests
                        .into_iter()
                        .map(|r| r.join().expect("client"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().expect("client"))
            .collect()
    });
    let wall = start.elapsed();
    let rss_after = rss_mb();
    let mut done: Vec<Duration> = results.iter().filter(|r| r.0 == 200).map(|r| r.1).collect();
    done.sort();
    let busy = results.iter().filter(|r| r.0 == 503).count();
    let other = results.len() - done.len() - busy;
    let pct = |p: f64| done[((done.len() as f64 - 1.0) * p).round() as usize].as_secs_f64();
    println!(
        "{side}×{side}, {steps} steps; first request {:.3} s",
        first.as_secs_f64()
    );
    println!(
        "{} requests from {CLIENTS} clients, queue {QUEUE}: {} completed, {busy} got 503, {other} other, in {:.2} s",
        results.len(),
        done.len(),
        wall.as_secs_f64()
    );
    if !done.is_empty() {
        println!(
            "throughput {:.2} images/s; latency of completed requests p50 {:.3} s, p99 {:.3} s",
            done.len() as f64 / wall.as_secs_f64(),
            pct(0.5),
            pct(0.99)
        );
    }
    println!(
        "RSS after the first request {rss_first:.1} MB, after the run {rss_after:.1} MB ({:+.1}%)",
        (rss_after / rss_first - 1.0) * 100.0
    );
    Ok(())
}
