//! `benches/gpu_compare.sh` as far as it goes without a GPU: its arguments, its refusal to run
//! the comparison where there is no NVIDIA GPU, the imports of a synthetic model (at depth 1),
//! and the table assembled from recorded numbers.

#[path = "../models/synthetic.rs"]
mod synthetic;

mod common;

use common::{s, zimage_in};
use std::path::Path;
use std::process::{Command, Output};
use synthetic::{Spec, WeightDtype};

fn script(args: &[&str]) -> Output {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/gpu_compare.sh");
    Command::new("bash").arg(path).args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn arguments_are_checked_before_anything_runs() {
    let help = script(&["--help"]);
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--sizes LIST"));
    for (args, said) in [
        (
            &["--steps", "x"][..],
            "--steps takes a positive whole number",
        ),
        (&["--sizes", "1024,"][..], "--sizes takes sizes"),
        (&["--frobnicate", "1"][..], "unknown option `--frobnicate`"),
        (&["--work"][..], "--work needs a value"),
    ] {
        let out = script(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(said), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn the_comparison_refuses_in_one_line_without_an_nvidia_gpu() {
    // This suite runs where there is no NVIDIA GPU: the CUDA build is tested by its ldd check.
    let work = tempfile::tempdir().unwrap();
    for stage in ["all", "run"] {
        let out = script(&[stage, "--work", s(work.path())]);
        assert_eq!(out.status.code(), Some(3), "{stage}: {}", stderr(&out));
        assert_eq!(
            stderr(&out).trim(),
            "gpu_compare: no NVIDIA GPU (nvidia-smi finds none): the comparison needs one"
        );
    }
}

#[test]
fn imports_the_synthetic_model_in_bf16_and_int4() {
    let work = tempfile::tempdir().unwrap();
    let model = work.path().join("model");
    let spec = Spec {
        layers: 1,
        refiner_layers: 1,
        // The pipeline reads the text encoder's second-to-last layer: two at the least.
        text_layers: 2,
        dtype: WeightDtype::Bf16,
        seed: 3,
    };
    synthetic::write_with(&model, &spec, &synthetic::Options { sync: false }).unwrap();
    let args = [
        "import",
        "--work",
        s(work.path()),
        "--model-dir",
        s(&model),
        "--zimage",
        env!("CARGO_BIN_EXE_zimage"),
    ];
    let out = script(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let store = work.path().join("store");
    for (tag, quantized) in [("bf16", false), ("int4", true)] {
        let show = zimage_in(
            &store,
            &["show", &format!("bench/synthetic:{tag}"), "--json"],
        );
        assert!(show.status.success(), "{}", stderr(&show));
        let text = String::from_utf8_lossy(&show.stdout);
        assert_eq!(text.contains("int4"), quantized, "{tag}: {text}");
    }
    // A second import stage finds both models and leaves them be.
    let again = script(&args);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(!String::from_utf8_lossy(&again.stdout).contains("tensors"));
}

#[test]
fn the_table_is_assembled_from_recorded_numbers() {
    let work = tempfile::tempdir().unwrap();
    let results = work.path().join("results");
    std::fs::create_dir_all(&results).unwrap();
    let record = |name: &str, text: &str| std::fs::write(results.join(name), text).unwrap();
    record(
        "zimage-bf16.txt",
        "weights_gbps 6.5\nstep_warm_s 0.4\ndecode_first_s 1.5\ndecode_warm_s 0.5\npsnr_db 42.5\n",
    );
    record(
        "zimage-bf16.1024.txt",
        "wall_ms 16000\ngpu_peak_mib 16384\n",
    );
    record("zimage-int4.2048.txt", "wall_ms 30000\ngpu_peak_mib 8192\n");
    record(
        "diffusers-bf16.txt",
        "weights_gbps 5\ncold_s 40\nstep_warm_s 0.5\ndecode_first_s 1\ndecode_warm_s 0.5\n",
    );
    record(
        "diffusers-bf16.1024.txt",
        "wall_ms 52000\ngpu_peak_mib 24576\n",
    );
    let out = script(&["table", "--work", s(work.path())]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    let row = |label: &str| -> String {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| {label} |")))
            .unwrap_or_else(|| panic!("no row `{label}` in\n{table}"))
            .to_string()
    };
    // zimage's cold time is its process's wall clock; diffusers' its own from interpreter start.
    assert_eq!(
        row("cold process → PNG, 1024² (s)"),
        "| cold process → PNG, 1024² (s) | 16 | — | 40 | 0.40× | — |"
    );
    assert_eq!(
        row("weights → GPU (GB/s)"),
        "| weights → GPU (GB/s) | 6.5 | — | 5 | 1.30× | — |"
    );
    assert_eq!(
        row("GPU peak, 1024² (GB)"),
        "| GPU peak, 1024² (GB) | 17.2 | — | 25.8 | 0.67× | — |"
    );
    assert_eq!(
        row("GPU peak, 2048² (GB)"),
        "| GPU peak, 2048² (GB) | — | 8.59 | — | — | — |"
    );
    assert_eq!(
        row("PSNR vs diffusers (dB)"),
        "| PSNR vs diffusers (dB) | 42.5 | — | — | — | — |"
    );

    // A malformed record names its file and line.
    record("zimage-int4.txt", "step_warm_s fast\n");
    let bad = script(&["table", "--work", s(work.path())]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("zimage-int4.txt:1: `fast` is not a number"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn two_runs_in_one_process_give_the_warm_records() {
    // `generate --runs 2 -v` on the embedded demo model, read as the comparison reads it.
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("warm.png");
    let out = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .env("ZIMAGE_CACHE_DIR", dir.path().join("cache"))
        .args(["--store", s(&dir.path().join("empty-store"))])
        .args(["generate", "a fox", "--width", "64", "--height", "64"])
        .args(["--steps", "2", "--runs", "2", "-v", "-o", s(&png)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(png.is_file());
    let log = dir.path().join("warm.log");
    std::fs::write(&log, &out.stderr).unwrap();
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/gpu_compare.py");
    let parsed = Command::new("python3")
        .arg(helper)
        .args(["zimage-log", s(&log)])
        .output()
        .unwrap();
    assert!(parsed.status.success(), "{}", stderr(&parsed));
    let keys: Vec<String> = String::from_utf8_lossy(&parsed.stdout)
        .lines()
        .map(|l| {
            let (key, value) = l.split_once(' ').unwrap();
            assert!(value.parse::<f64>().unwrap() >= 0.0, "{l}");
            key.to_string()
        })
        .collect();
    assert_eq!(keys, ["step_warm_s", "decode_first_s", "decode_warm_s"]);
}
