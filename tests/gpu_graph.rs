//! The GPU graph on MLX's CPU backend (`ZIMAGE_GRAPH=gpu`): an unknown value is refused naming
//! the variable; at the real widths (2 main blocks, 512², 2 steps, bf16 weights; computed in f32,
//! since MLX's CPU bf16 products do not use the BLAS and would take many minutes) MLX's peak in
//! each phase lies within 15% of the GPU estimate, and evaluating block by block keeps what is
//! alive after each block level; its images match the CPU graph's closely, an int4 model's too
//! with its packed layers widened for the image tokens' products. The same model imported in
//! int4 and int8 (256², 1 step) holds within 15% of its estimate in every phase and the process,
//! and under a limit of 60% of its peak either runs with the same image or is refused before
//! loading, naming a limit under which it then does.
//! FLUX.2 [klein] at klein 4B's widths (1 double + 1 single block, 256², 1 step), bf16 and
//! int4, holds the same on the CPU graph and the GPU graph, and keeps within the same limit.

#[path = "../models/synthetic.rs"]
mod synthetic;

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::sync::{Arc, Mutex, Weak};
use synthetic::{Spec, WeightDtype};

fn demo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny")
}

/// `zimage [--store STORE] generate PROMPT --model MODEL -o PNG ARGS…` with `env` set.
fn generate_in(
    store: Option<&Path>,
    model: &Path,
    png: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_zimage"));
    if let Some(store) = store {
        cmd.arg("--store").arg(store);
    }
    cmd.args(["generate", "a red fox in the snow", "--model"])
        .arg(model)
        .arg("-o")
        .arg(png)
        .args(args)
        .env_remove("ZIMAGE_GRAPH")
        .env_remove("ZIMAGE_DEBUG_BLOCKS")
        .env_remove("ZIMAGE_MEMORY_LIMIT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// `zimage generate PROMPT --model MODEL -o PNG ARGS…` with `env` set.
fn generate(model: &Path, png: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    generate_in(None, model, png, args, env)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn ok(out: Output) -> String {
    let log = stderr(&out);
    assert!(out.status.success(), "{log}");
    log
}

/// The numbers of a `-v` line after its first word: `estimate denoise 123.4 MB MLX peak …`.
fn numbers(line: &str) -> Vec<f64> {
    line.split_whitespace()
        .filter_map(|w| {
            w.trim_matches(|c| c == '(' || c == ')' || c == '%')
                .parse()
                .ok()
        })
        .collect()
}

/// Each phase's (estimate, MLX peak) in MB, from `-v`'s `estimate` lines.
fn estimates(log: &str) -> BTreeMap<String, (f64, f64)> {
    log.lines()
        .filter_map(|l| l.strip_prefix("estimate "))
        .map(|l| {
            let phase = l.split_whitespace().next().unwrap().to_string();
            let n = numbers(l);
            (phase, (n[0], n[1]))
        })
        .collect()
}

/// `ZIMAGE_DEBUG_BLOCKS`'s lines: (block, MLX active MB after it).
fn blocks(log: &str) -> Vec<(String, f64)> {
    log.lines()
        .filter_map(|l| l.strip_prefix("block "))
        .map(|l| {
            let name = l.split_whitespace().next().unwrap().to_string();
            (name, numbers(l)[0])
        })
        .collect()
}

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mse = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    if mse == 0.0 {
        return f64::INFINITY;
    }
    10.0 * (255.0f64 * 255.0 / mse).log10()
}

fn pixels(png: &Path) -> Vec<u8> {
    image::open(png).unwrap().to_rgb8().into_raw()
}

/// The model at the real widths (2 main blocks, 1 refiner of each kind, 2 text layers, bf16
/// weights), written once for the tests that hold it at the same time: it takes 2.8 GB, and
/// the disk of a test machine is not always large. It goes when the last of them drops it.
fn real_width_model() -> Arc<tempfile::TempDir> {
    static SHARED: Mutex<Weak<tempfile::TempDir>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(dir) = shared.upgrade() {
        return dir;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = Spec {
        layers: 2,
        refiner_layers: 1,
        text_layers: 2,
        dtype: WeightDtype::Bf16,
        seed: 7,
    };
    let model = dir.path().join("model");
    synthetic::write_with(&model, &spec, &synthetic::Options { sync: false }).unwrap();
    let dir = Arc::new(dir);
    *shared = Arc::downgrade(&dir);
    dir
}

/// Megabytes of a size as messages write it: `972 MB`, `1.10 GB`.
fn megabytes(number: &str, unit: &str) -> f64 {
    let n: f64 = number.parse().unwrap();
    match unit {
        "GB" => n * 1000.0,
        "MB" => n,
        _ => panic!("{number} {unit} is not a size"),
    }
}

/// Checks that every phase's MLX peak (`-v`'s `estimate` lines) and the process's peak RSS lie
/// within 15% of their estimates; returns each phase's (estimate, MLX peak) in MB.
fn estimates_hold(log: &str, what: &str) -> BTreeMap<String, (f64, f64)> {
    let within = |name: &str, estimate: f64, peak: f64| {
        let off = estimate / peak - 1.0;
        eprintln!(
            "{what} {name}: estimate {estimate:.1} MB, measured {peak:.1} MB ({:+.1}%)",
            off * 100.0
        );
        assert!(
            off.abs() <= 0.15,
            "{what} {name}: estimate {estimate:.1} MB, measured {peak:.1} MB ({:+.1}%)",
            off * 100.0
        );
    };
    let phases = estimates(log);
    for phase in ["text", "denoise", "decode"] {
        let (estimate, peak) = phases[phase];
        within(phase, estimate, peak);
    }
    // `peak RSS 1.10 GB measured, 972 MB estimated (-11.7%), budget …`
    let rss: Vec<&str> = (log.lines())
        .find_map(|l| l.strip_prefix("peak RSS "))
        .unwrap_or_else(|| panic!("no peak RSS line: {log}"))
        .split_whitespace()
        .collect();
    within(
        "process",
        megabytes(rss[3], rss[4].trim_end_matches(',')),
        megabytes(rss[0], rss[1]),
    );
    phases
}

#[test]
fn an_unknown_graph_is_refused_naming_the_variable() {
    let tmp = tempfile::tempdir().unwrap();
    let png = tmp.path().join("x.png");
    let out = generate(&demo(), &png, &[], &[("ZIMAGE_GRAPH", "tpu")]);
    let log = stderr(&out);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("ZIMAGE_GRAPH") && log.contains("tpu"), "{log}");
    assert_eq!(log.trim().lines().count(), 1, "{log}");
    assert!(!png.exists());
}

#[test]
fn the_gpu_graph_draws_the_cpu_graphs_image() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--width", "64", "--height", "64", "--steps", "3", "--seed", "3",
    ];
    let run = |name: &str, extra: &[&str], env: &[(&str, &str)]| {
        let png = tmp.path().join(name);
        let mut all = args.to_vec();
        all.extend(extra);
        ok(generate(&demo(), &png, &all, env));
        pixels(&png)
    };
    let gpu = run("gpu.png", &[], &[("ZIMAGE_GRAPH", "gpu")]);
    // The same arithmetic (bf16) in the CPU graph's own kernels and evaluation order.
    let cpu_bf16 = run("cpu-bf16.png", &["--dtype", "bf16"], &[]);
    // The CPU graph's default: f32.
    let cpu_f32 = run("cpu-f32.png", &[], &[]);
    let same_dtype = psnr(&gpu, &cpu_bf16);
    let against_f32 = psnr(&gpu, &cpu_f32);
    eprintln!("gpu graph vs cpu graph: bf16 {same_dtype:.1} dB, f32 {against_f32:.1} dB");
    assert!(same_dtype >= 40.0, "{same_dtype:.1} dB");
    assert!(against_f32 >= 30.0, "{against_f32:.1} dB");
}

#[test]
fn an_int4_model_widened_per_layer_draws_the_quantized_products_image() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let out = common::zimage_in(
        &store,
        &[
            "create",
            "q",
            "--from",
            common::s(&demo()),
            "--quantize",
            "int4",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // 256²: 256 image tokens, the fewest rows whose products widen the packed weights.
    let run = |name: &str, extra: &[&str], env: &[(&str, &str)]| {
        let png = tmp.path().join(name);
        let mut args = vec![
            "--width", "256", "--height", "256", "--steps", "2", "--seed", "5",
        ];
        args.extend(extra);
        ok(generate_in(Some(&store), Path::new("q"), &png, &args, env));
        pixels(&png)
    };
    let widened = run("gpu.png", &[], &[("ZIMAGE_GRAPH", "gpu")]);
    let packed = run("cpu.png", &["--dtype", "bf16"], &[]);
    let db = psnr(&widened, &packed);
    eprintln!("int4, widened per layer vs the CPU graph's products: {db:.1} dB");
    assert!(db >= 40.0, "{db:.1} dB");
    // In f32 the two graphs' own kernels round apart in the last bit (the unquantized model
    // shows how often); widening adds no more to that than the parity bounds allow.
    let f32 = ["--dtype", "f32"];
    let widened = run("gpu-f32.png", &f32, &[("ZIMAGE_GRAPH", "gpu")]);
    let packed = run("cpu-f32.png", &f32, &[]);
    let (same, most) = identical(&widened, &packed);
    let demo = |name: &str, env: &[(&str, &str)]| {
        let png = tmp.path().join(name);
        let args = [
            "--width", "256", "--height", "256", "--steps", "2", "--seed", "5",
        ];
        ok(generate(&demo(), &png, &[&args[..], &f32].concat(), env));
        pixels(&png)
    };
    let own = identical(
        &demo("demo-gpu.png", &[("ZIMAGE_GRAPH", "gpu")]),
        &demo("demo-cpu.png", &[]),
    )
    .0;
    eprintln!(
        "int4 in f32, widened vs quantized products: {same:.5} identical (the graphs alone: \
         {own:.5}), max diff {most}"
    );
    assert!(
        same >= own - 0.001 && most <= 1,
        "{same:.5} identical vs {own:.5}, max diff {most}"
    );
}

/// The share of identical values of two images and their largest difference.
fn identical(a: &[u8], b: &[u8]) -> (f64, u8) {
    assert_eq!(a.len(), b.len());
    let diffs: Vec<u8> = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).collect();
    let same = diffs.iter().filter(|&&d| d == 0).count() as f64 / diffs.len() as f64;
    (same, diffs.iter().copied().max().unwrap_or(0))
}

#[test]
fn the_gpu_graph_holds_what_its_estimate_says_at_the_real_widths() {
    let tmp = tempfile::tempdir().unwrap();
    let shared = real_width_model();
    let model = shared.path().join("model");
    let png = tmp.path().join("gpu.png");
    let log = ok(generate(
        &model,
        &png,
        &[
            "--width",
            "512",
            "--height",
            "512",
            "--steps",
            "2",
            "-v",
            "--weights",
            "compute",
            "--dtype",
            "f32",
        ],
        &[("ZIMAGE_GRAPH", "gpu"), ("ZIMAGE_DEBUG_BLOCKS", "1")],
    ));
    eprintln!("{log}");

    let phases = estimates_hold(&log, "bf16");

    // Block by block: once the first step has cast every weight, what is alive after each
    // block of the second step is the same (the weights, the stream and what the step keeps),
    // so no block's transients outlive it; and the step's peak above that is one block's
    // transients, within the estimate's share for them.
    let denoising: Vec<f64> = blocks(&log)
        .into_iter()
        .filter(|(name, _)| name.starts_with("layers.") || name.starts_with("noise_refiner."))
        .map(|(_, active)| active)
        .collect();
    assert_eq!(denoising.len(), 2 * 3, "{log}");
    let second = &denoising[3..];
    let (low, high) = second
        .iter()
        .fold((f64::MAX, 0.0f64), |(l, h), &a| (l.min(a), h.max(a)));
    assert!(high - low < 50.0, "active after each block: {second:?} MB");
    let transients = phases["denoise"].1 - high;
    assert!(
        (100.0..800.0).contains(&transients),
        "one block's transients: {transients:.1} MB"
    );

    // MLX's cache stays within the limit the plan set for each phase: one block's transients.
    let limit = log
        .lines()
        .find_map(|l| l.strip_prefix("memory   MLX keeps at most "))
        .map(|l| {
            let mut words = l.split_whitespace();
            let n: f64 = words.next().unwrap().parse().unwrap();
            match words.next() {
                Some("GB") => n * 1000.0,
                _ => n,
            }
        })
        .unwrap_or_else(|| panic!("no cache limit reported: {log}"));
    assert!((100.0..800.0).contains(&limit), "cache limit {limit} MB");
    for line in log
        .lines()
        .filter(|l| l.starts_with("denoise ") || l.starts_with("decode "))
    {
        // `denoise 27.0 s MLX peak 3464.0 MB cache 464.8 MB …`: the cache is the third number.
        let cache = numbers(line)[2];
        assert!(
            cache <= limit + 1.0,
            "{line}: cache above the limit of {limit} MB"
        );
    }
}

/// Quantized weights at the real widths on the GPU graph (256², one step): each phase's MLX
/// peak and the process's peak RSS within 15% of the estimate, in int4 and int8; and under a
/// limit of 60% of the int4 run's peak, either the same image or a refusal before loading that
/// names a limit under which the same image is then made.
#[test]
fn quantized_weights_hold_what_the_estimate_says_and_keep_within_a_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let shared = real_width_model();
    let model = shared.path().join("model");
    let store = tmp.path().join("store");
    let args = ["--width", "256", "--height", "256", "--steps", "1", "-v"];
    // f32 products: MLX's CPU bf16 products do not use the BLAS and would take many minutes.
    let args = [&args[..], &["--dtype", "f32", "--seed", "3"]].concat();
    let gpu = [("ZIMAGE_GRAPH", "gpu")];
    let mut int4 = None;
    // int8 first, removed once checked, so that one quantized copy is on the disk at a time.
    for q in ["int8", "int4"] {
        let out = common::zimage_in(
            &store,
            &["create", q, "--from", common::s(&model), "--quantize", q],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let png = tmp.path().join(format!("{q}.png"));
        let log = ok(generate_in(Some(&store), Path::new(q), &png, &args, &gpu));
        estimates_hold(&log, q);
        match q {
            "int8" => {
                for cmd in [&["rm", q][..], &["gc"]] {
                    let out = common::zimage_in(&store, cmd);
                    assert!(out.status.success(), "{}", stderr(&out));
                }
            }
            _ => int4 = Some((png, log)),
        }
    }
    let (png, log) = int4.unwrap();
    let peak = (log.lines())
        .find_map(|l| l.strip_prefix("peak RSS "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            megabytes(w[0], w[1])
        })
        .unwrap();
    let limited = |limit: &str| {
        let png = tmp.path().join(format!("limit-{limit}.png"));
        let mut all = args.clone();
        all.extend(["--memory-limit", limit]);
        let out = generate_in(Some(&store), Path::new("int4"), &png, &all, &gpu);
        (out, png)
    };
    let same_image = |limited: &Path, log: &str| {
        // Tiles change the decode's rounding at their seams; a whole decode is the same image,
        // but for the last bit where the plan holds the unquantized layers as stored (in f32
        // their products run another kernel; in bf16, the same).
        if log.contains("decode whole") {
            let (same, most) = identical(&pixels(limited), &pixels(&png));
            assert!(
                same >= 0.999 && most <= 1,
                "{same:.5}, max diff {most}: {log}"
            );
        }
    };
    let limit = format!("{:.0}MB", peak * 0.6);
    let (out, limited_png) = limited(&limit);
    let log = stderr(&out);
    if out.status.success() {
        same_image(&limited_png, &log);
        return;
    }
    // Refused in the preflight, before any phase ran, naming the smallest limit that works.
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(!log.lines().any(|l| l.starts_with("text ")), "{log}");
    let needs: Vec<&str> = log
        .split("needs at least ")
        .nth(1)
        .unwrap_or_else(|| panic!("no figure named: {log}"))
        .split_whitespace()
        .collect();
    let needs = megabytes(needs[0], needs[1]);
    eprintln!("--memory-limit {limit}: {}", log.trim());
    let (out, limited_png) = limited(&format!("{:.0}MB", needs.ceil()));
    let log = ok(out);
    same_image(&limited_png, &log);
    // MLX's peak in every phase stays under the limit it was given.
    for (phase, (_, peak)) in estimates(&log) {
        assert!(
            peak <= needs,
            "{phase}: MLX peak {peak} MB over {needs} MB: {log}"
        );
    }
}

/// A FLUX.2 \[klein\] at klein 4B's real widths (24 heads × 128, text features 7680, the FLUX.2
/// VAE) with 1 double-stream and 1 single-stream block. Its text encoder keeps Qwen3-4B's
/// hidden size (the features are 3 × it) and the 28 layers klein needs (it reads layer 27's
/// output), narrowed to 4 heads and a 512-wide MLP so that it stays small; bf16 weights.
fn klein_real_width_model(dir: &Path) -> std::path::PathBuf {
    use synthetic::klein;
    let model = dir.join("klein");
    let spec = klein::KleinSpec {
        size: klein::Size {
            double_layers: 1,
            single_layers: 1,
            text: synthetic::TextWidths {
                hidden: 2560,
                intermediate: 512,
                heads: 4,
                kv_heads: 2,
            },
            text_layers: 28,
            ..klein::KLEIN_4B
        },
        dtype: WeightDtype::Bf16,
        seed: 7,
    };
    klein::write_with(&model, &spec, &synthetic::Options { sync: false }).unwrap();
    model
}

/// klein at the real widths (256², one step, f32 products), bf16 weights on the GPU graph and
/// int4 on both graphs: each phase's MLX peak and the process's peak RSS within 15% of the
/// estimate; under a limit of 60% of the int4 GPU run's peak, the same image or a refusal
/// before loading that names a limit under which it then runs.
#[test]
fn klein_holds_what_its_estimate_says_on_both_graphs_and_keeps_within_a_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let model = klein_real_width_model(tmp.path());
    let store = tmp.path().join("store");
    let out = common::zimage_in(
        &store,
        &[
            "create",
            "k4",
            "--from",
            common::s(&model),
            "--quantize",
            "int4",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let args = [
        "--width", "256", "--height", "256", "--steps", "1", "-v", "--dtype", "f32", "--seed", "3",
    ];
    let run = |name: &str, int4: bool, graph: &str, extra: &[&str]| {
        let png = tmp.path().join(name);
        let all = [&args[..], extra].concat();
        let env = [("ZIMAGE_GRAPH", graph)];
        let out = match int4 {
            true => generate_in(Some(&store), Path::new("k4"), &png, &all, &env),
            false => generate(&model, &png, &all, &env),
        };
        (out, png)
    };
    let mut int4_gpu = None;
    // bf16 on the CPU graph is Z-Image's case (its estimate is checked above); the three
    // others are where klein's own numbers meet a graph or a weight form of their own.
    for (graph, weights, int4) in [
        ("gpu", "bf16", false),
        ("cpu", "int4", true),
        ("gpu", "int4", true),
    ] {
        let (out, png) = run(&format!("{graph}-{weights}.png"), int4, graph, &[]);
        let log = ok(out);
        estimates_hold(&log, &format!("klein {graph} graph {weights}"));
        if int4 && graph == "gpu" {
            int4_gpu = Some((png, log));
        }
    }
    let (png, log) = int4_gpu.unwrap();
    let peak = (log.lines())
        .find_map(|l| l.strip_prefix("peak RSS "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            megabytes(w[0], w[1])
        })
        .unwrap();
    let limited = |limit: String| {
        run(
            &format!("limit-{limit}.png"),
            true,
            "gpu",
            &["--memory-limit", &limit],
        )
    };
    let (out, limited_png) = limited(format!("{:.0}MB", peak * 0.6));
    let log = stderr(&out);
    let (log, limited_png) = match out.status.success() {
        true => (log, limited_png),
        false => {
            // Refused in the preflight, before any phase ran, naming the smallest limit.
            assert_eq!(out.status.code(), Some(2), "{log}");
            assert!(!log.lines().any(|l| l.starts_with("text ")), "{log}");
            let needs: Vec<&str> = (log.split("needs at least ").nth(1))
                .unwrap_or_else(|| panic!("no figure named: {log}"))
                .split_whitespace()
                .collect();
            let needs = megabytes(needs[0], needs[1]);
            eprintln!("klein at 60% of its peak: {}", log.trim());
            let (out, png) = limited(format!("{:.0}MB", needs.ceil()));
            (ok(out), png)
        }
    };
    // A whole decode is the same image; tiles change the rounding at their seams.
    if log.contains("decode whole") {
        let (same, most) = identical(&pixels(&limited_png), &pixels(&png));
        assert!(
            same >= 0.999 && most <= 1,
            "{same:.5}, max diff {most}: {log}"
        );
    }
}
