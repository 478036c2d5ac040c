//! Pull throughput against a local registry, next to one `curl` download of the same bytes.
//!
//! Starts Debian's `docker-registry` on a free loopback port (storage in a temporary folder),
//! pushes a generated model of `BLOBS` tensor blobs (about 1 MiB each, 1 GiB in all) and a
//! model of one blob of the same total size, then times, in each of `ROUNDS` rounds:
//!
//! - `curl` of the single blob into a file;
//! - `zimage pull` of the model of many blobs into an empty store (hash-verified, synced);
//! - one `curl` of every blob of that model, `PARALLEL` at once, each into its own file (no
//!   hashing, no sync): what this registry serves many blobs at, whoever asks.
//!
//! The filesystem is synced (untimed) before each, so none pays for another's dirty pages;
//! what each wrote is removed at the end, so no measurement allocates files among the inodes
//! the previous one freed.
//!
//! `cargo build --release && cargo run --release --example registry_bench [BLOBS] [MIB_EACH] [PARALLEL] [ROUNDS]`

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use zimage::safetensors::Dtype;
use zimage::store::blob::{tensor_blob_header, BlobWriter};
use zimage::store::manifest::{config_blob, Layer, Manifest, CONFIG_MEDIA_TYPE, TENSOR_MEDIA_TYPE};
use zimage::store::{ModelName, Store};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let blobs: u64 = args.get(1).map_or(1000, |a| a.parse().expect("BLOBS"));
    let mib: u64 = args.get(2).map_or(1, |a| a.parse().expect("MIB_EACH"));
    let parallel: Option<String> = args.get(3).cloned();
    let rounds: usize = args.get(4).map_or(2, |a| a.parse().expect("ROUNDS"));
    let zimage = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("zimage");
    assert!(
        zimage.exists(),
        "build the binary first (`cargo build --release`): {}",
        zimage.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("registry").display()
        ),
    )
    .unwrap();
    let mut registry = Command::new("/usr/bin/docker-registry")
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker-registry (apt-get install docker-registry)");
    let host = format!("127.0.0.1:{port}");
    while TcpStream::connect(&host).is_err() {
        std::thread::sleep(Duration::from_millis(50));
    }

    let source = Store::at(&dir.path().join("source"));
    let floats = mib << 18;
    eprintln!("generating {blobs} blobs of {mib} MiB…");
    let many = model(&source, "many", blobs, floats);
    let one = model(&source, "one", 1, floats * blobs);
    for name in ["many", "one"] {
        let st = Command::new(&zimage)
            .arg("--store")
            .arg(&source.root)
            .args([
                "push",
                name,
                "--to",
                &format!("{host}/bench/{name}"),
                "--insecure",
            ])
            .status()
            .unwrap();
        assert!(st.success(), "push {name}");
    }
    let total = many.total_size();

    let blob = &one.layers[0];
    let url = format!("http://{host}/v2/bench/one/blobs/{}", blob.digest);
    let mb = |bytes: u64, s: f64| bytes as f64 / s / 1e6;
    // Every blob of the model, as a `curl --config` list: each URL into its own file.
    let many_config = dir.path().join("many.curl");
    let blob_urls: String = std::iter::once(&many.config)
        .chain(&many.layers)
        .enumerate()
        .map(|(i, l)| {
            format!(
                "url = \"http://{host}/v2/bench/many/blobs/{}\"\noutput = \"{i}\"\n",
                l.digest
            )
        })
        .collect();
    std::fs::write(&many_config, blob_urls).unwrap();
    let at_once = parallel.clone().unwrap_or_else(|| "6".into());
    let timed = |command: &mut Command| {
        sync();
        let started = Instant::now();
        let st = command.status().unwrap();
        assert!(st.success(), "{command:?}");
        started.elapsed().as_secs_f64()
    };
    // Rounds alternate, so all three see the same load on the machine.
    let (mut pull_total, mut curl_total, mut curls_total) = (0.0, 0.0, 0.0);
    let mut written = Vec::new();
    for round in 0..rounds {
        let out = dir.path().join(format!("curl-{round}.out"));
        let curl_s = timed(
            Command::new("curl")
                .args(["-sSf", "-o"])
                .arg(&out)
                .arg(&url),
        );
        written.push(out);

        let target = dir.path().join(format!("target-{round}"));
        let pull_s = timed(
            Command::new(&zimage)
                .arg("--store")
                .arg(&target)
                .args(["pull", &format!("{host}/bench/many"), "--insecure"])
                .args(parallel.iter().flat_map(|p| ["--parallel", p.as_str()])),
        );
        written.push(target);

        let files = dir.path().join(format!("curls-{round}"));
        std::fs::create_dir(&files).unwrap();
        let curls_s = timed(
            Command::new("curl")
                .args(["-sSf", "--parallel", "--parallel-max", &at_once, "--config"])
                .arg(&many_config)
                .current_dir(&files),
        );
        written.push(files);
        println!(
            "round {round}: zimage pull: {} blobs, {total} bytes in {pull_s:.2} s = {:.0} MB/s",
            many.layers.len() + 1,
            mb(total, pull_s)
        );
        println!(
            "round {round}: curl -sSf -o FILE {url}: {} bytes in {curl_s:.2} s = {:.0} MB/s",
            blob.size,
            mb(blob.size, curl_s)
        );
        println!(
            "round {round}: curl --parallel-max {at_once} of the same {} blobs into files: \
             {curls_s:.2} s = {:.0} MB/s",
            many.layers.len() + 1,
            mb(total, curls_s)
        );
        pull_total += pull_s;
        curl_total += curl_s;
        curls_total += curls_s;
    }
    println!(
        "pull reaches {:.0}% of curl's throughput (all rounds together); curl of the same blobs, \
         {at_once} at once, reaches {:.0}%",
        100.0 * mb(total, pull_total) / mb(blob.size, curl_total),
        100.0 * mb(total, curls_total) / mb(blob.size, curl_total)
    );
    for path in written {
        let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
    }
    let _ = registry.kill();
    let _ = registry.wait();
}

/// Writes every dirty page of every filesystem to the disk.
fn sync() {
    let st = Command::new("sync").status().unwrap();
    assert!(st.success(), "sync");
}

/// A stored model of `count` f32 tensors of `floats` each, distinct bytes in every blob.
fn model(store: &Store, name: &str, count: u64, floats: u64) -> Manifest {
    let mut layers = Vec::new();
    let mut chunk = vec![0u8; 1 << 20];
    for i in 0..count {
        let mut w = BlobWriter::new(&store.root).unwrap();
        w.write(&tensor_blob_header(Dtype::F32, &[floats], 8).unwrap())
            .unwrap();
        let mut left = floats * 4;
        let mut state = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ floats;
        while left > 0 {
            let n = (chunk.len() as u64).min(left) as usize;
            for word in chunk[..n].chunks_mut(8) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
            }
            w.write(&chunk[..n]).unwrap();
            left -= n as u64;
        }
        let (digest, size, _) = w.finish().unwrap();
        layers.push(Layer {
            media_type: TENSOR_MEDIA_TYPE.into(),
            digest,
            size,
            from: None,
            name: Some(format!("transformer/layers.{i}.weight")),
            dtype: Some("F32".into()),
            shape: Some(vec![floats]),
        });
    }
    let config = config_blob("");
    let (digest, size, _) = zimage::store::blob::write_blob(&store.root, &config).unwrap();
    let manifest = Manifest::new(
        Layer {
            media_type: CONFIG_MEDIA_TYPE.into(),
            digest,
            size,
            from: None,
            name: None,
            dtype: None,
            shape: None,
        },
        layers,
    );
    store
        .write_manifest(&ModelName::parse(name).unwrap(), &manifest)
        .unwrap();
    manifest
}
