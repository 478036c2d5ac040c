//! Store import and load throughput on a generated model of about 1.1 GB.
//! `cargo bench --bench load` (set ZIMAGE_BENCH_DIR to choose where the files go).
//!
//! For each read path it prints, per component, the time to materialise the arrays next to two
//! plain sequential reads of the same blob files measured in the same run (all warm): one that
//! keeps every blob in memory, as loading does, and one through a single reused buffer.

use std::path::Path;
use std::time::Instant;
use zimage::diffusers_dir::DiffusersDir;
use zimage::loader::{self, ReadPath};
use zimage::safetensors::{self, Dtype, TensorSpec};
use zimage::store::{ImportOptions, Store};

const MB: usize = 1 << 20;

fn write_component(
    dir: &Path,
    file: &str,
    count: usize,
    bytes_each: usize,
    dtype: Dtype,
    salt: u8,
) {
    std::fs::create_dir_all(dir).unwrap();
    let elem = dtype.bits() as usize / 8;
    let specs: Vec<TensorSpec> = (0..count)
        .map(|i| TensorSpec {
            name: format!("blocks.{i}.weight"),
            dtype,
            shape: vec![(bytes_each / elem / 1024) as u64, 1024],
        })
        .collect();
    let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join(file)).unwrap());
    use std::io::Write;
    out.write_all(&safetensors::header_bytes(&specs, None, 8).unwrap())
        .unwrap();
    let mut buf = vec![0u8; bytes_each];
    for i in 0..count {
        for (j, b) in buf.iter_mut().enumerate() {
            *b = (j as u8)
                .wrapping_mul(31)
                .wrapping_add(i as u8)
                .wrapping_add(salt);
        }
        out.write_all(&buf).unwrap();
    }
}

fn main() {
    let base = std::env::var_os("ZIMAGE_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-load"));
    let _ = std::fs::remove_dir_all(&base);
    let src = base.join("src");
    write_component(
        &src.join("text_encoder"),
        "model.safetensors",
        25,
        16 * MB,
        Dtype::BF16,
        1,
    );
    write_component(
        &src.join("transformer"),
        "diffusion_pytorch_model.safetensors",
        40,
        16 * MB,
        Dtype::F32,
        2,
    );
    write_component(
        &src.join("vae"),
        "diffusion_pytorch_model.safetensors",
        10,
        8 * MB,
        Dtype::F32,
        3,
    );
    std::fs::write(src.join("model_index.json"), "{}").unwrap();
    let dir = DiffusersDir::open(&src).unwrap();
    let total: u64 = dir
        .tensors
        .values()
        .flatten()
        .map(|t| t.info.nbytes())
        .sum();
    println!(
        "generated model: {:.2} GB in {} tensors",
        total as f64 / 1e9,
        dir.tensors.values().map(Vec::len).sum::<usize>()
    );
    zimage::platform::use_default_device().unwrap();

    for (label, align) in [("default (8-byte aligned)", 8u64), ("--align 16384", 16384)] {
        let store = Store::at(&base.join(format!("store-{align}")));
        let t = Instant::now();
        let s = store
            .create(
                "bench",
                &dir,
                &ImportOptions {
                    align,
                    ..Default::default()
                },
                &|_| {},
            )
            .unwrap();
        let secs = t.elapsed().as_secs_f64();
        println!(
            "\nimport {label}: {:.2} s, {:.2} GB/s ({} blobs written)",
            secs,
            total as f64 / secs / 1e9,
            s.blobs_written
        );
        let model = store.open("bench").unwrap();
        let paths: &[ReadPath] = if align == 8 {
            &[ReadPath::MlxLoader]
        } else {
            &[ReadPath::MlxLoader, ReadPath::Mmap]
        };
        for &path in paths {
            let (manifest_s, comps) = loader::profile(&store, &model, path).unwrap();
            println!("  read path {path:?} (manifest {:.2} ms)", manifest_s * 1e3);
            println!(
                "  {:<13} {:>6} {:>9} {:>7} {:>11} {:>8} {:>11} {:>8} {:>6} {:>11} {:>6}",
                "component",
                "blobs",
                "GB",
                "mapped",
                "materialise",
                "GB/s",
                "seq read",
                "GB/s",
                "ratio",
                "streaming",
                "ratio"
            );
            for c in comps {
                println!(
                    "  {:<13} {:>6} {:>9.3} {:>7} {:>9.1}ms {:>8.2} {:>9.1}ms {:>8.2} {:>6.2} {:>9.1}ms {:>6.2}",
                    c.component, c.blobs, c.bytes as f64 / 1e9, c.mapped_blobs, c.materialise_seconds * 1e3, c.materialise_gbps,
                    c.sequential_read_seconds * 1e3, c.sequential_read_gbps, c.materialise_seconds / c.sequential_read_seconds,
                    c.streaming_read_seconds * 1e3, c.materialise_seconds / c.streaming_read_seconds
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&base);
}
