//! `zimage generate` against hostile inputs: flags out of range, outputs that are links,
//! devices or folders, noise and tokenizer files that are devices, FIFOs or huge, and model
//! configs whose values would divide by zero, index out of bounds or overflow. Every refusal
//! is one line naming the flag or the file and key, with exit code 2; none is a panic.

mod common;

use common::{copy_model, s};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny")
}

/// A copy of the demo model in `dir/model`: configs copied (to be edited), weights linked.
fn model_copy(dir: &Path) -> PathBuf {
    let root = dir.join("model");
    copy_model(&demo(), &root);
    root
}

/// Sets `key` of the JSON file `rel` in `model` to `value` (`Value::Null` removes it).
fn edit_config(model: &Path, rel: &str, key: &str, value: Value) {
    let path = model.join(rel);
    let mut json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let map = json.as_object_mut().unwrap();
    if value.is_null() {
        map.remove(key);
    } else {
        map.insert(key.into(), value);
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
}

/// Runs `zimage generate` with `args`, in `dir` (a fresh store and cache there), and kills it
/// if it runs past 60 s: a read that blocks fails the test instead of hanging it.
fn generate(dir: &Path, args: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_zimage"))
        .current_dir(dir)
        .env("ZIMAGE_CACHE_DIR", dir.join("cache"))
        .env_remove("ZIMAGE_MEMORY_LIMIT")
        .arg("--store")
        .arg(dir.join("store"))
        .arg("generate")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::output_within(child, Duration::from_secs(60), || {
        panic!("zimage generate {args:?} still running after 60 s")
    })
}

/// Runs generate on `model` (a diffusers directory) at 64×64, one step, writing into `dir`.
fn generate_on(dir: &Path, model: &Path, extra: &[&str]) -> Output {
    let out = dir.join("out.png");
    let mut args = vec![
        "a red fox",
        "--model",
        s(model),
        "--width",
        "64",
        "--height",
        "64",
        "--steps",
        "1",
        "-o",
        s(&out),
    ];
    args.extend_from_slice(extra);
    generate(dir, &args)
}

/// Asserts a refusal: exit code 2 (an error, not a panic's 101 or an abort's 134), and one
/// line of error that contains every one of `needles`. Returns the line.
fn assert_refused(out: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let errors: Vec<&&str> = lines.iter().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "one error line expected: {stderr}");
    for n in needles {
        assert!(errors[0].contains(n), "`{n}` not in: {stderr}");
    }
    errors[0].to_string()
}

fn assert_no_png(dir: &Path) {
    assert!(!dir.join("out.png").exists());
}

/// Entries of `dir` other than the store and cache a run makes.
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "store" && n != "cache" && n != "model")
        .collect()
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

/// A sparse file of `len` bytes: no blocks written, so a test costs nothing to make it.
fn sparse_file(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

// --- Outputs -----------------------------------------------------------------------------

#[test]
fn output_through_a_symlink_writes_its_target_and_keeps_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    let target = dir.path().join("target.png");
    std::fs::write(&target, b"old").unwrap();
    let link = dir.path().join("link.png");
    std::os::unix::fs::symlink("target.png", &link).unwrap();
    let out = generate(
        dir.path(),
        &[
            "x",
            "--model",
            s(&model),
            "--width",
            "64",
            "--height",
            "64",
            "--steps",
            "1",
            "-o",
            s(&link),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let img = image::open(&target).unwrap();
    assert_eq!((img.width(), img.height()), (64, 64));
    let mut names = leftovers(dir.path());
    names.sort();
    assert_eq!(
        names,
        ["link.png", "target.png"],
        "no temporary left beside"
    );
}

#[test]
fn output_to_dev_null_writes_into_it_and_leaves_the_device() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    let out = generate(
        dir.path(),
        &[
            "x",
            "--model",
            s(&model),
            "--width",
            "64",
            "--height",
            "64",
            "--steps",
            "1",
            "-o",
            "/dev/null",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let meta = std::fs::symlink_metadata("/dev/null").unwrap();
    assert!(meta.file_type().is_char_device());
}

#[test]
fn a_preview_that_is_a_fifo_is_given_up_with_a_warning_and_the_image_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    let fifo = dir.path().join("preview.png");
    mkfifo(&fifo);
    // Nobody reads the FIFO: a writer that opened it would wait for ever.
    let out = generate_on(dir.path(), &model, &["--preview", s(&fifo)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: --preview") && stderr.contains("is a FIFO"),
        "{stderr}"
    );
    assert!(dir.path().join("out.png").exists());
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(meta.file_type().is_fifo(), "the FIFO is left as it was");
}

#[test]
fn output_to_stdout_is_the_png_alone() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    let out = generate_on(dir.path(), &model, &[]);
    assert!(out.status.success(), "{out:?}");
    let out = generate(
        dir.path(),
        &[
            "a red fox",
            "--model",
            s(&model),
            "--width",
            "64",
            "--height",
            "64",
            "--steps",
            "1",
            "-o",
            "/dev/stdout",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        out.stdout,
        std::fs::read(dir.path().join("out.png")).unwrap()
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrote /dev/stdout"));
}

#[test]
fn output_that_is_a_directory_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("pictures");
    std::fs::create_dir(&folder).unwrap();
    // The model does not exist: the output is refused before it is looked for.
    let out = generate(dir.path(), &["x", "--model", "absent", "-o", s(&folder)]);
    assert_refused(&out, &["--output", "is a directory"]);
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0);
}

#[test]
fn output_in_a_missing_folder_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/folder/out.png");
    let out = generate(dir.path(), &["x", "--model", "absent", "-o", s(&path)]);
    assert_refused(&out, &["--output", "does not exist"]);
}

#[test]
fn a_failed_generate_leaves_nothing_in_the_output_folder() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    edit_config(&model, "vae/config.json", "norm_num_groups", json!(0));
    let folder = dir.path().join("pictures");
    std::fs::create_dir(&folder).unwrap();
    let out = generate(
        dir.path(),
        &["x", "--model", s(&model), "-o", s(&folder.join("a.png"))],
    );
    assert_refused(&out, &["norm_num_groups"]);
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0);
}

// --- Numeric flags -----------------------------------------------------------------------

/// Every flag out of range is refused by name and range before the model is looked for (the
/// model named does not exist, so a later check would report that instead).
#[test]
fn numeric_flags_out_of_range_are_refused_before_any_model_loads() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--steps", "18446744073709551615"],
            &["--steps", "1..=1000"],
        ),
        (&["--steps", "1000000000"], &["--steps", "1..=1000"]),
        (&["--steps", "0"], &["--steps", "1..=1000"]),
        (&["--steps", "1001"], &["--steps", "1..=1000"]),
        (&["--guidance", "NaN"], &["--guidance", "finite", "≥ 0"]),
        (&["--guidance", "inf"], &["--guidance", "finite"]),
        (&["--guidance", "-inf"], &["--guidance", "finite"]),
        (&["--guidance", "-1"], &["--guidance", "≥ 0"]),
        (&["--guidance", "1e39"], &["--guidance", "finite"]),
        // A side's multiple is the model's own token cell, checked once the model is read
        // (`generate_cli`, `klein_cli`); its bounds are every model's.
        (&["--width", "0"], &["--width", "1..=8192"]),
        (&["--width", "8208"], &["--width", "1..=8192"]),
        (&["--width", "4294967295"], &["--width", "1..=8192"]),
        (&["--height", "0"], &["--height", "1..=8192"]),
        (&["--height", "65536"], &["--height", "1..=8192"]),
        (
            &["--width", "8192", "--height", "8192"],
            &["--width × --height", "16777216"],
        ),
        (&["--memory-limit", "lots"], &["--memory-limit", "lots"]),
        (&["--memory-limit", "10"], &["--memory-limit", "too small"]),
        (
            &["--memory-limit", "12 parsecs"],
            &["--memory-limit", "unit"],
        ),
        // A subnormal f32: no setting anyone means.
        (&["--guidance", "1e-40"], &["--guidance", "finite"]),
    ];
    for (flags, needles) in cases {
        let mut args = vec!["x", "--model", "absent-model"];
        args.extend_from_slice(flags);
        let start = Instant::now();
        let out = generate(dir.path(), &args);
        let line = assert_refused(&out, needles);
        assert!(!line.contains("absent-model"), "{flags:?}: {line}");
        assert!(start.elapsed() < Duration::from_secs(10), "{flags:?}");
    }
    // A prompt past the bound is refused by its length, naming the bound.
    let long = "fox ".repeat(20_000);
    let out = generate(dir.path(), &[&long, "--model", "absent-model"]);
    assert_refused(&out, &["--prompt is 80000 bytes", "65536"]);
}

#[test]
fn numbers_that_do_not_parse_are_refused_by_flag() {
    let dir = tempfile::tempdir().unwrap();
    for flags in [
        ["--steps", "-1"],
        ["--steps", "1e9"],
        ["--width", "-16"],
        ["--seed", "18446744073709551616"],
        ["--guidance", "lots"],
    ] {
        let mut args = vec!["x", "--model", "absent-model"];
        args.extend_from_slice(&flags);
        let out = generate(dir.path(), &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(flags[0]), "{flags:?}: {stderr}");
    }
}

#[test]
fn any_u64_is_a_seed() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    let out = generate_on(dir.path(), &model, &["--seed", "18446744073709551615"]);
    assert!(out.status.success(), "{out:?}");
}

// --- Noise -------------------------------------------------------------------------------

#[test]
fn noise_from_dev_zero_is_refused_at_once_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    let start = Instant::now();
    let out = generate_on(dir.path(), &model, &["--noise", "/dev/zero"]);
    assert_refused(&out, &["--noise", "/dev/zero", "character device"]);
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_no_png(dir.path());
}

#[test]
fn noise_from_a_fifo_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    let fifo = dir.path().join("noise.fifo");
    mkfifo(&fifo);
    // Nothing ever writes to the FIFO: opening it to read would block until the deadline.
    let out = generate_on(dir.path(), &model, &["--noise", s(&fifo)]);
    assert_refused(&out, &["--noise", "noise.fifo", "FIFO"]);
}

#[test]
fn noise_larger_than_its_shape_needs_is_refused_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    let noise = dir.path().join("noise.safetensors");
    sparse_file(&noise, 1 << 30);
    let out = generate_on(dir.path(), &model, &["--noise", s(&noise)]);
    assert_refused(
        &out,
        &[
            "--noise",
            "noise.safetensors",
            "1073741824 bytes",
            "more than",
        ],
    );
}

#[test]
fn noise_with_non_finite_values_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    let noise = dir.path().join("noise.safetensors");
    let mut values = vec![0u8; 16 * 8 * 8 * 4];
    values[40..44].copy_from_slice(&f32::NAN.to_le_bytes());
    common::write_safetensors(
        &noise,
        &[(
            "noise",
            zimage::safetensors::Dtype::F32,
            vec![1, 16, 8, 8],
            values,
        )],
    );
    let out = generate_on(dir.path(), &model, &["--noise", s(&noise)]);
    assert_refused(&out, &["noise value 10", "NaN", "finite"]);
}

// --- Tokenizer and config files ----------------------------------------------------------

#[test]
fn an_oversized_tokenizer_json_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    sparse_file(&model.join("tokenizer/tokenizer.json"), 2 << 30);
    let start = Instant::now();
    let out = generate_on(dir.path(), &model, &[]);
    assert_refused(
        &out,
        &[
            "tokenizer.json",
            "2147483648 bytes",
            "67108864 bytes a tokenizer file",
        ],
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn tokenizer_and_config_files_that_are_fifos_are_refused() {
    for rel in [
        "tokenizer/vocab.json",
        "tokenizer/tokenizer.json",
        "transformer/config.json",
        "model_index.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "text_encoder/model.safetensors.index.json",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let model = model_copy(dir.path());
        let path = model.join(rel);
        let _ = std::fs::remove_file(&path);
        mkfifo(&path);
        let out = generate_on(dir.path(), &model, &[]);
        let name = Path::new(rel).file_name().unwrap().to_str().unwrap();
        assert_refused(&out, &[name, "FIFO"]);
    }
}

#[test]
fn an_oversized_config_json_is_refused_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    sparse_file(&model.join("vae/config.json"), 1 << 30);
    let out = generate_on(dir.path(), &model, &[]);
    assert_refused(&out, &["vae/config.json", "16777216 bytes a config file"]);
}

#[test]
fn a_directory_that_is_not_a_zimage_pipeline_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    edit_config(
        &model,
        "model_index.json",
        "_class_name",
        json!("StableDiffusionXLPipeline"),
    );
    let out = generate_on(dir.path(), &model, &[]);
    assert_refused(
        &out,
        &[
            "model_index.json",
            "_class_name",
            "StableDiffusionXLPipeline",
        ],
    );
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = generate_on(dir.path(), &empty, &[]);
    assert_refused(&out, &["empty", "model_index.json"]);
}

// --- Config values -----------------------------------------------------------------------

/// Writes each `(file, key, value)` into a fresh copy of the demo model and asserts that
/// generate refuses it with one line naming the file and `needle` (the key at fault).
fn assert_bad_configs(cases: &[(&str, &str, Value, &str)]) {
    for (rel, key, value, needle) in cases {
        let dir = tempfile::tempdir().unwrap();
        let model = model_copy(dir.path());
        edit_config(&model, rel, key, value.clone());
        let out = generate_on(dir.path(), &model, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(rel),
            "{rel} {key}={value}: file not named: {stderr}"
        );
        assert_refused(&out, &[needle]);
        assert_no_png(dir.path());
    }
}

#[test]
fn bad_transformer_configs_are_refused_naming_the_key() {
    const T: &str = "transformer/config.json";
    assert_bad_configs(&[
        (T, "axes_lens", json!([1536]), "axes_lens"),
        (T, "axes_lens", json!([1536, 512, 0]), "axes_lens"),
        (
            T,
            "axes_lens",
            json!([2_000_000_000, 512, 512]),
            "axes_lens",
        ),
        (T, "axes_lens", json!([1536, 512, 70000]), "axes_lens"),
        (T, "axes_dims", json!([32, 48]), "axes_dims"),
        (T, "axes_dims", json!([-2, 82, 48]), "axes_dims"),
        (T, "n_heads", json!(0), "n_heads"),
        (T, "n_heads", json!(-2), "n_heads"),
        (T, "dim", json!(255), "dim"),
        (T, "dim", json!(2_147_483_647), "dim"),
        (T, "in_channels", json!(0), "in_channels"),
        (T, "in_channels", json!(8), "latent_channels"),
        (T, "n_layers", json!(0), "n_layers"),
        (T, "rope_theta", json!(-1.0), "rope_theta"),
        (T, "norm_eps", json!(0.0), "norm_eps"),
        (T, "all_patch_size", json!([0]), "all_patch_size"),
        (T, "cap_feat_dim", json!(32), "cap_feat_dim"),
        (T, "dim", Value::Null, "dim"),
    ]);
}

#[test]
fn bad_vae_configs_are_refused_naming_the_key() {
    const V: &str = "vae/config.json";
    assert_bad_configs(&[
        (V, "block_out_channels", json!([]), "block_out_channels"),
        (
            V,
            "block_out_channels",
            json!(vec![64; 40]),
            "block_out_channels",
        ),
        (
            V,
            "block_out_channels",
            json!([32, 32, 0, 64]),
            "block_out_channels",
        ),
        (V, "norm_num_groups", json!(0), "norm_num_groups"),
        (V, "norm_num_groups", json!(7), "norm_num_groups"),
        (V, "layers_per_block", json!(-1), "layers_per_block"),
        (V, "layers_per_block", json!(1_000_000), "layers_per_block"),
        (V, "scaling_factor", json!(0.0), "scaling_factor"),
        (V, "out_channels", json!(4), "out_channels"),
        (V, "latent_channels", json!(0), "latent_channels"),
        (V, "sample_size", json!(100), "sample_size"),
    ]);
}

#[test]
fn bad_text_encoder_configs_are_refused_naming_the_key() {
    const E: &str = "text_encoder/config.json";
    assert_bad_configs(&[
        (E, "num_key_value_heads", json!(0), "num_key_value_heads"),
        (E, "num_key_value_heads", json!(3), "num_key_value_heads"),
        (E, "num_attention_heads", json!(0), "num_attention_heads"),
        (E, "head_dim", json!(7), "head_dim"),
        (E, "head_dim", json!(0), "head_dim"),
        (E, "vocab_size", json!(1000), "vocab_size"),
        (E, "vocab_size", json!(0), "vocab_size"),
        (E, "num_hidden_layers", json!(1), "num_hidden_layers"),
        (E, "hidden_size", json!(0), "hidden_size"),
        (E, "rms_norm_eps", json!(-1.0), "rms_norm_eps"),
        (E, "intermediate_size", json!(-48), "intermediate_size"),
    ]);
}

#[test]
fn bad_scheduler_configs_are_refused_naming_the_key() {
    const S: &str = "scheduler/scheduler_config.json";
    assert_bad_configs(&[
        (S, "shift", json!(0.0), "shift"),
        (S, "shift", json!(-3.0), "shift"),
        (S, "num_train_timesteps", json!(0), "num_train_timesteps"),
        (
            S,
            "use_dynamic_shifting",
            json!(true),
            "use_dynamic_shifting",
        ),
    ]);
}

#[test]
fn a_prompt_longer_than_the_caption_positions_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    edit_config(
        &model,
        "transformer/config.json",
        "axes_lens",
        json!([40, 512, 512]),
    );
    let prompt = "fox ".repeat(100);
    let out = generate(
        dir.path(),
        &[
            &prompt,
            "--model",
            s(&model),
            "--width",
            "64",
            "--height",
            "64",
        ],
    );
    assert_refused(&out, &["axes_lens[0]", "shorten the prompt"]);
}

#[test]
fn a_size_beyond_the_position_tables_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_copy(dir.path());
    edit_config(
        &model,
        "transformer/config.json",
        "axes_lens",
        json!([1536, 4, 4]),
    );
    let out = generate(
        dir.path(),
        &[
            "x",
            "--model",
            s(&model),
            "--width",
            "128",
            "--height",
            "64",
        ],
    );
    assert_refused(&out, &["position tables"]);
}

// --- Input pictures ------------------------------------------------------------------------

fn reference_input(name: &str) -> String {
    demo()
        .parent()
        .unwrap()
        .join("reference/inputs")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_mask_or_a_strength_without_a_picture_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mask = reference_input("mask-128x128.png");
    let out = generate_on(dir.path(), &demo(), &["--mask", &mask]);
    assert_refused(&out, &["--mask", "mask-128x128.png", "needs --image"]);
    let out = generate_on(dir.path(), &demo(), &["--strength", "0.5"]);
    assert_refused(&out, &["--strength", "needs --image"]);
    // Not dropped to run text → image instead.
    for flags in [&["--only-masked"][..], &["--only-masked", "8"]] {
        let out = generate_on(dir.path(), &demo(), flags);
        assert_refused(&out, &["--only-masked", "needs --image and --mask"]);
    }
    assert_no_png(dir.path());
}

#[test]
fn a_strength_outside_zero_to_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let picture = reference_input("picture-128x128.png");
    for s in ["0", "1.5", "-0.2", "NaN", "1e-320"] {
        let out = generate_on(dir.path(), &demo(), &["--image", &picture, "--strength", s]);
        assert_refused(&out, &["--strength", "(0, 1]"]);
    }
    assert_no_png(dir.path());
}

#[test]
fn a_file_that_is_not_a_picture_is_refused_naming_flag_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake.png");
    std::fs::write(&fake, b"not a picture at all").unwrap();
    let out = generate_on(dir.path(), &demo(), &["--image", s(&fake)]);
    assert_refused(&out, &["--image", "fake.png", "not a PNG, JPEG or WebP"]);
    // A real PNG header over a truncated body.
    let picture = std::fs::read(reference_input("picture-128x128.png")).unwrap();
    std::fs::write(&fake, &picture[..picture.len() / 2]).unwrap();
    let picture = reference_input("picture-128x128.png");
    let out = generate_on(
        dir.path(),
        &demo(),
        &["--image", &picture, "--mask", s(&fake)],
    );
    assert_refused(&out, &["--mask", "fake.png"]);
    assert_no_png(dir.path());
    assert_eq!(leftovers(dir.path()), vec!["fake.png".to_string()]);
}

#[test]
fn a_mask_of_another_size_than_the_picture_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = generate_on(
        dir.path(),
        &demo(),
        &[
            "--image",
            &reference_input("picture-128x128.png"),
            "--mask",
            &reference_input("mask-96x80.png"),
        ],
    );
    assert_refused(&out, &["--mask", "96×80", "--image", "128×128"]);
    assert_no_png(dir.path());
}

#[test]
fn a_picture_larger_than_the_limits_is_refused_before_decoding_it() {
    let dir = tempfile::tempdir().unwrap();
    // A PNG header claiming 100000×100000 pixels: refused from its header alone.
    let mut png = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut png, 100_000, 100_000);
        enc.set_color(png::ColorType::Grayscale);
        let _ = enc.write_header().unwrap();
    }
    let big = dir.path().join("big.png");
    std::fs::write(&big, &png).unwrap();
    let out = generate_on(dir.path(), &demo(), &["--image", s(&big)]);
    assert_refused(&out, &["--image", "big.png"]);
    assert_no_png(dir.path());
}
