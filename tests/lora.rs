//! LoRA files in every layout on the demo model: generating with a random LoRA applied unfused
//! equals generating with a model whose weights were merged by hand (`W + s·alpha/r·B·A` in
//! f64, then f32); a zero LoRA leaves the image bit for bit; bad files are refused clearly.

mod common;

use common::{s, write_safetensors, zimage, zimage_in};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::zimage::Pipeline;
use zimage::lora::{Adapters, LoraSpec};
use zimage::mlx::Dtype;
use zimage::pipeline::Request;
use zimage::safetensors::{self, Dtype as StDtype};

const RANK: usize = 4;
/// `s·alpha/r` every layout's test arrives at.
const EFFECTIVE: f64 = 0.75;
const SIDE: u32 = 32;

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny")
}

fn request() -> Request {
    Request {
        prompt: "a lighthouse at dusk".into(),
        negative_prompt: None,
        width: SIDE,
        height: SIDE,
        steps: 1,
        guidance: 0.0,
        cfg_normalization: false,
        cfg_truncation: 1.0,
        seed: 7,
        noise: None,
        input: None,
    }
}

/// A linear layer of the demo transformer: its name, `[out, in]` and weight.
struct Layer {
    name: String,
    out: usize,
    inp: usize,
    weight: Vec<f64>,
}

fn bf16_to_f64(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(2)
        .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64)
        .collect()
}

/// The demo transformer's file, header and bytes.
fn transformer_file() -> &'static (safetensors::Header, Vec<u8>) {
    static FILE: OnceLock<(safetensors::Header, Vec<u8>)> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = demo().join("transformer/diffusion_pytorch_model.safetensors");
        let bytes = std::fs::read(path).unwrap();
        (safetensors::parse(&bytes).unwrap(), bytes)
    })
}

fn tensor_bytes<'a>(h: &safetensors::Header, bytes: &'a [u8], name: &str) -> &'a [u8] {
    let t = h.tensor(name).unwrap();
    let start = (h.data_start() + t.data_offsets.0) as usize;
    &bytes[start..start + t.nbytes() as usize]
}

/// Every linear layer of the transformer: attention, feed-forward, adaLN, refiners, embedders.
fn layers() -> &'static [Layer] {
    static LAYERS: OnceLock<Vec<Layer>> = OnceLock::new();
    LAYERS.get_or_init(|| {
        let (h, bytes) = transformer_file();
        h.tensors
            .iter()
            .filter(|t| t.name.ends_with(".weight") && t.shape.len() == 2)
            .map(|t| Layer {
                name: t.name.trim_end_matches(".weight").to_string(),
                out: t.shape[0] as usize,
                inp: t.shape[1] as usize,
                weight: bf16_to_f64(tensor_bytes(h, bytes, &t.name)),
            })
            .collect()
    })
}

/// A small deterministic generator: uniform values in `[-amp, amp]`.
struct Rng(u64);
impl Rng {
    fn next(&mut self, amp: f64) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
    }
}

/// A random rank-4 pair per layer, `(A [r, in], B [out, r])`, rounded to f32.
fn random_pairs(zero: bool) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    layers()
        .iter()
        .map(|l| {
            let a = (0..RANK * l.inp).map(|_| rng.next(0.08) as f32).collect();
            let b = (0..l.out * RANK)
                .map(|_| if zero { 0.0 } else { rng.next(0.08) as f32 })
                .collect();
            (a, b)
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    Diffusers,
    DiffusersDefault,
    Peft,
    ComfyAlpha,
    ComfyNoAlpha,
    Kohya,
    KohyaDoubleUnderscore,
}

/// The alpha a layout's file carries (none: alpha = rank).
fn alpha(layout: Layout) -> Option<f32> {
    match layout {
        Layout::ComfyAlpha | Layout::Kohya | Layout::KohyaDoubleUnderscore => Some(2.0),
        _ => None,
    }
}

/// The user scale that makes `s·alpha/r` = [`EFFECTIVE`].
fn user_scale(layout: Layout) -> f32 {
    (EFFECTIVE / alpha(layout).map_or(1.0, |a| a as f64 / RANK as f64)) as f32
}

fn keys(layout: Layout, module: &str) -> [String; 3] {
    let flat = module.replace('.', "_");
    let (down, up, alpha) = match layout {
        Layout::Diffusers => (
            format!("transformer.{module}.lora_A.weight"),
            format!("transformer.{module}.lora_B.weight"),
            String::new(),
        ),
        Layout::DiffusersDefault => (
            format!("transformer.{module}.lora_A.default.weight"),
            format!("transformer.{module}.lora_B.default.weight"),
            String::new(),
        ),
        Layout::Peft => (
            format!("base_model.model.{module}.lora_A.weight"),
            format!("base_model.model.{module}.lora_B.weight"),
            String::new(),
        ),
        Layout::ComfyAlpha | Layout::ComfyNoAlpha => (
            format!("diffusion_model.{module}.lora_A.weight"),
            format!("diffusion_model.{module}.lora_B.weight"),
            format!("diffusion_model.{module}.alpha"),
        ),
        Layout::Kohya => (
            format!("lora_unet_{flat}.lora_down.weight"),
            format!("lora_unet_{flat}.lora_up.weight"),
            format!("lora_unet_{flat}.alpha"),
        ),
        Layout::KohyaDoubleUnderscore => (
            format!("lora_unet__{flat}.lora_down.weight"),
            format!("lora_unet__{flat}.lora_up.weight"),
            format!("lora_unet__{flat}.alpha"),
        ),
    };
    [down, up, alpha]
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes the pairs as a LoRA file in `layout`.
fn write_lora(path: &Path, layout: Layout, pairs: &[(Vec<f32>, Vec<f32>)]) {
    let mut tensors = Vec::new();
    for (l, (a, b)) in layers().iter().zip(pairs) {
        let [down, up, alpha_key] = keys(layout, &l.name);
        tensors.push((
            down,
            StDtype::F32,
            vec![RANK as u64, l.inp as u64],
            f32_bytes(a),
        ));
        tensors.push((
            up,
            StDtype::F32,
            vec![l.out as u64, RANK as u64],
            f32_bytes(b),
        ));
        if let Some(alpha) = alpha(layout) {
            tensors.push((alpha_key, StDtype::F32, vec![], f32_bytes(&[alpha])));
        }
    }
    let refs: Vec<(&str, StDtype, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
        .collect();
    write_safetensors(path, &refs);
}

/// A copy of the demo model whose transformer holds `W + EFFECTIVE·B·A`, computed in f64 and
/// stored as f32.
fn merged_model(dir: &Path, pairs: &[(Vec<f32>, Vec<f32>)]) -> PathBuf {
    let out = dir.join("merged");
    copy_dir(&demo(), &out);
    let (h, bytes) = transformer_file();
    let mut merged: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (l, (a, b)) in layers().iter().zip(pairs) {
        let mut w = l.weight.clone();
        for (o, row) in w.chunks_exact_mut(l.inp).enumerate() {
            let mut ba = vec![0f64; l.inp];
            for k in 0..RANK {
                let bk = b[o * RANK + k] as f64;
                for (acc, &ak) in ba.iter_mut().zip(&a[k * l.inp..(k + 1) * l.inp]) {
                    *acc += bk * ak as f64;
                }
            }
            for (wi, bai) in row.iter_mut().zip(ba) {
                *wi += EFFECTIVE * bai;
            }
        }
        let w32: Vec<f32> = w.iter().map(|&x| x as f32).collect();
        merged.insert(format!("{}.weight", l.name), f32_bytes(&w32));
    }
    let tensors: Vec<(&str, StDtype, Vec<u64>, Vec<u8>)> = h
        .tensors
        .iter()
        .map(|t| match merged.get(&t.name) {
            Some(w) => (t.name.as_str(), StDtype::F32, t.shape.clone(), w.clone()),
            None => (
                t.name.as_str(),
                t.dtype,
                t.shape.clone(),
                tensor_bytes(h, bytes, &t.name).to_vec(),
            ),
        })
        .collect();
    write_safetensors(
        &out.join("transformer/diffusion_pytorch_model.safetensors"),
        &tensors,
    );
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The image of `model` in f32 with the LoRAs `specs` applied.
fn generate(model: &Path, specs: &[LoraSpec]) -> Vec<u8> {
    let mut p = Pipeline::new(DiffusersDir::open(model).unwrap(), Dtype::F32, false).unwrap();
    if !specs.is_empty() {
        let [te, tr, _] = p.tensor_sizes().unwrap();
        p.set_adapters(Adapters::load(specs, None, &te, &tr, false, Dtype::F32).unwrap());
    }
    p.generate(&request(), &mut |_| {}).unwrap().rgb
}

/// The merged model's image, made once for every layout's test.
fn merged_image() -> &'static Vec<u8> {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        generate(&merged_model(dir.path(), &random_pairs(false)), &[])
    })
}

fn base_image() -> &'static Vec<u8> {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| generate(&demo(), &[]))
}

/// At least 99.5% of values identical and none off by more than 1.
fn assert_parity(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len());
    let differing = got.iter().zip(want).filter(|(a, b)| a != b).count();
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap_or(0);
    assert!(
        max <= 1 && differing * 1000 <= got.len() * 5,
        "{what}: {differing} of {} values differ, max by {max}",
        got.len()
    );
}

fn check_layout(layout: Layout) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lora.safetensors");
    write_lora(&file, layout, &random_pairs(false));
    let spec = LoraSpec {
        path: file,
        scale: user_scale(layout),
    };
    let got = generate(&demo(), &[spec]);
    assert_ne!(&got, base_image(), "{layout:?}: the LoRA changed nothing");
    assert_parity(&got, merged_image(), &format!("{layout:?}"));
}

#[test]
fn diffusers_layout_matches_merged_weights() {
    check_layout(Layout::Diffusers);
}

#[test]
fn diffusers_layout_with_default_adapter_segment_matches_merged_weights() {
    check_layout(Layout::DiffusersDefault);
}

#[test]
fn peft_base_model_layout_matches_merged_weights() {
    check_layout(Layout::Peft);
}

#[test]
fn comfy_layout_with_alpha_matches_merged_weights() {
    check_layout(Layout::ComfyAlpha);
}

#[test]
fn comfy_layout_without_alpha_means_scale_one() {
    check_layout(Layout::ComfyNoAlpha);
}

#[test]
fn kohya_layout_scales_by_alpha_over_rank() {
    check_layout(Layout::Kohya);
}

#[test]
fn kohya_double_underscore_prefix_maps_to_the_same_layers() {
    check_layout(Layout::KohyaDoubleUnderscore);
}

#[test]
fn zero_lora_gives_the_base_image_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("zero.safetensors");
    write_lora(&file, Layout::Kohya, &random_pairs(true));
    let got = generate(
        &demo(),
        &[LoraSpec {
            path: file,
            scale: 1.0,
        }],
    );
    assert_eq!(&got, base_image());
}

#[test]
fn two_loras_stack_as_their_sum() {
    // Half the effect from each of two files in different layouts equals the whole from one.
    let dir = tempfile::tempdir().unwrap();
    let pairs = random_pairs(false);
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    write_lora(&a, Layout::Diffusers, &pairs);
    write_lora(&b, Layout::Kohya, &pairs);
    let got = generate(
        &demo(),
        &[
            LoraSpec {
                path: a,
                scale: user_scale(Layout::Diffusers) / 2.0,
            },
            LoraSpec {
                path: b,
                scale: user_scale(Layout::Kohya) / 2.0,
            },
        ],
    );
    assert_parity(&got, merged_image(), "two stacked halves");
}

/// A one-layer LoRA file in the diffusers layout with `module` as its target.
fn one_layer_lora(path: &Path, module: &str, inp: u64, out: u64) {
    write_safetensors(
        path,
        &[
            (
                &format!("transformer.{module}.lora_A.weight"),
                StDtype::F32,
                vec![2, inp],
                vec![0; 8 * inp as usize],
            ),
            (
                &format!("transformer.{module}.lora_B.weight"),
                StDtype::F32,
                vec![out, 2],
                vec![0; 8 * out as usize],
            ),
        ],
    );
}

fn generate_cli(extra: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.png");
    let mut args = vec![
        "generate",
        "x",
        "--model",
        s(&demo()).to_owned().leak(),
        "--width",
        "32",
        "--height",
        "32",
        "--steps",
        "1",
        "-o",
        s(&out).to_owned().leak(),
    ];
    args.extend(extra);
    zimage(&args)
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn unknown_key_is_refused_naming_the_key_and_the_closest_layer() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo.safetensors");
    one_layer_lora(&file, "layers.0.attention.to_qq", 256, 256);
    let o = generate_cli(&["--lora", s(&file)]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`transformer.layers.0.attention.to_qq.lora_A.weight`")
            && err.contains("closest is `layers.0.attention.to_q`")
            && err.contains("--lora-lenient"),
        "{err}"
    );
    let o = generate_cli(&["--lora", s(&file), "--lora-lenient"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("skipped 2 keys"), "{}", stderr(&o));
}

#[test]
fn lokr_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lokr.safetensors");
    write_safetensors(
        &file,
        &[
            (
                "lora_unet_layers_0_attention_to_q.lokr_w1",
                StDtype::F32,
                vec![4, 4],
                vec![0; 64],
            ),
            (
                "lora_unet_layers_0_attention_to_q.lokr_w2",
                StDtype::F32,
                vec![64, 64],
                vec![0; 64 * 64 * 4],
            ),
        ],
    );
    let o = generate_cli(&["--lora", s(&file)]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("LoKr") && err.contains("lokr_w1"), "{err}");
}

#[test]
fn pair_that_does_not_fit_its_layer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wide.safetensors");
    one_layer_lora(&file, "layers.0.attention.to_q", 3072, 3072);
    let o = generate_cli(&["--lora", s(&file), "--lora-lenient"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("do not fit layer `layers.0.attention.to_q`"),
        "{err}"
    );
}

#[test]
fn quantized_base_takes_a_lora_unfused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let o = zimage_in(
        &store,
        &["create", "q8", "--from", s(&demo()), "--quantize", "int8"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let run = |lora: Option<&Path>, png: &str| -> Vec<u8> {
        let extra: Vec<&str> = lora.map_or(vec![], |l| vec!["--lora", s(l)]);
        generate_stored(&store, "q8", &extra, &dir.path().join(png))
    };
    let zero = dir.path().join("zero.safetensors");
    write_lora(&zero, Layout::ComfyNoAlpha, &random_pairs(true));
    let full = dir.path().join("full.safetensors");
    write_lora(&full, Layout::ComfyNoAlpha, &random_pairs(false));
    let base = run(None, "base.png");
    // The base path is untouched: a zero LoRA on packed weights changes no pixel.
    assert_eq!(run(Some(&zero), "zero.png"), base);
    assert_ne!(run(Some(&full), "full.png"), base);
}

#[test]
fn inspect_describes_a_lora_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("style.safetensors");
    write_lora(&file, Layout::Kohya, &random_pairs(false));
    let o = zimage(&["inspect", s(&file), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        j["lora_layout"].as_str().unwrap().starts_with("kohya"),
        "{j}"
    );
    assert_eq!(j["lora_rank"], "4");
    assert_eq!(j["lora_alpha"], "2");
    assert_eq!(j["lora_pairs"], layers().len());
    let targets = j["lora_targets"].to_string();
    assert!(
        targets.contains("transformer: layers_*_attention_to_q ×2")
            && targets.contains("all_final_layer_2-1_linear ×1"),
        "{targets}"
    );
    assert!(
        j["lora_base"].as_str().unwrap().starts_with("Z-Image"),
        "{j}"
    );
}

#[test]
fn png_metadata_names_each_lora_with_its_hash_and_scale() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("my_style.safetensors");
    write_lora(&file, Layout::Diffusers, &random_pairs(false));
    let png = dir.path().join("out.png");
    let o = zimage(&[
        "generate",
        "x",
        "--model",
        s(&demo()),
        "--width",
        "32",
        "--height",
        "32",
        "--steps",
        "1",
        "--lora",
        &format!("{}:0.6", s(&file)),
        "-o",
        s(&png),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let hash = zimage::formats::model_hash::hash_file(&file)
        .unwrap()
        .safetensors
        .unwrap()
        .addnet[..12]
        .to_string();
    let chunks = zimage::image_out::read_png_text(&png).unwrap();
    let text = |key: &str| {
        chunks
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, t)| t.clone())
            .unwrap()
    };
    let info = zimage::formats::infotext::parse(&text(zimage::image_out::PARAMETERS_KEY));
    assert_eq!(
        info.get("Lora hashes"),
        Some(format!("my_style: {hash}").as_str())
    );
    let j: serde_json::Value = serde_json::from_str(&text(zimage::image_out::ZIMAGE_KEY)).unwrap();
    let lora = &j["loras"][0];
    assert_eq!(lora["file"], s(&file));
    assert_eq!(lora["scale"], 0.6f32 as f64);
    assert_eq!(lora["hash"], hash);
}

/// The pixels of a PNG generated at the test's size by the binary, against `store`.
fn generate_stored(store: &Path, model: &str, extra: &[&str], png: &Path) -> Vec<u8> {
    let mut args = vec![
        "generate",
        "x",
        "--model",
        model,
        "--width",
        "32",
        "--height",
        "32",
        "--steps",
        "1",
        "--dtype",
        "f32",
        "-o",
        s(png),
    ];
    args.extend(extra);
    let o = zimage_in(store, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    image::open(png).unwrap().to_rgb8().into_raw()
}

fn blob_count(store: &Path) -> usize {
    std::fs::read_dir(store.join("blobs")).unwrap().count()
}

/// A store holding the demo model as `base`.
fn store_with_base(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    let o = zimage_in(&store, &["create", "base", "--from", s(&demo())]);
    assert!(o.status.success(), "{}", stderr(&o));
    store
}

#[test]
fn derived_model_shares_the_base_blobs_and_draws_what_the_lora_flag_draws() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_base(dir.path());
    let file = dir.path().join("style.safetensors");
    write_lora(&file, Layout::Kohya, &random_pairs(false));
    let before = blob_count(&store);
    let spec = format!("{}:0.6", s(&file));
    let o = zimage_in(
        &store,
        &["create", "styled", "--from", "base", "--lora", &spec],
    );
    assert!(o.status.success(), "{}", stderr(&o));

    let st = zimage::store::Store::at(&store);
    let (base, styled) = (st.open("base").unwrap(), st.open("styled").unwrap());
    let digests = |m: &zimage::store::StoredModel| -> std::collections::BTreeSet<String> {
        m.manifest.digests().map(str::to_string).collect()
    };
    assert!(digests(&base).is_subset(&digests(&styled)));
    // Every base layer is named as it was; the LoRA adds one layer per tensor and a record.
    let tensors = 3 * layers().len();
    assert_eq!(
        styled.manifest.layers[..base.manifest.layers.len()],
        base.manifest.layers[..]
    );
    assert_eq!(
        styled.manifest.layers.len(),
        base.manifest.layers.len() + tensors + 1
    );
    assert_eq!(styled.manifest.config, base.manifest.config);
    // Only the LoRA's blobs were written (its alphas are all one blob).
    let written = blob_count(&store) - before;
    assert_eq!(written, 2 * layers().len() + 1 + 1);
    for l in &styled.manifest.layers[base.manifest.layers.len()..] {
        let name = l.name.as_deref().unwrap();
        assert!(name.starts_with("lora/0/"), "{name}");
        if l.is_lora_tensor() {
            let path = st.blob_path(&l.digest).unwrap();
            let h = safetensors::read_header_file(&path).unwrap();
            assert_eq!(h.tensors.len(), 1);
            assert_eq!(h.tensors[0].name, "data");
            assert_eq!(Some(&h.tensors[0].shape), l.shape.as_ref());
        }
    }
    let report = st.verify("styled").unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);

    let png = |n: &str| dir.path().join(n);
    let derived = generate_stored(&store, "styled", &[], &png("styled.png"));
    let flagged = generate_stored(&store, "base", &["--lora", &spec], &png("flag.png"));
    let plain = generate_stored(&store, "base", &[], &png("base.png"));
    assert_eq!(derived, flagged);
    assert_ne!(derived, plain);
    // The image names the stored LoRA as it names a flag's.
    let chunks = zimage::image_out::read_png_text(&png("styled.png")).unwrap();
    let params = &chunks.iter().find(|(k, _)| k == "parameters").unwrap().1;
    assert!(params.contains("Lora hashes: \"style: "), "{params}");

    // `--lora` on the command line adds to the model's own: 0.6 stored + 0.4 given ≈ 1.0.
    let stacked = generate_stored(
        &store,
        "styled",
        &["--lora", &format!("{}:0.4", s(&file))],
        &png("stacked.png"),
    );
    let whole = generate_stored(
        &store,
        "base",
        &["--lora", &format!("{}:1", s(&file))],
        &png("whole.png"),
    );
    assert_parity(&stacked, &whole, "stored and given LoRAs stacked");

    // Removing the base and collecting garbage leaves the derived model whole.
    assert!(zimage_in(&store, &["rm", "base"]).status.success());
    let o = zimage_in(&store, &["gc"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("deleted 0 unreferenced blobs"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let report = st.verify("styled").unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(
        generate_stored(&store, "styled", &[], &png("after.png")),
        derived
    );
}

#[test]
fn show_list_and_inspect_say_a_model_carries_loras() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_base(dir.path());
    let file = dir.path().join("detail.safetensors");
    write_lora(&file, Layout::Diffusers, &random_pairs(false));
    let spec = format!("{}:0.8", s(&file));
    let o = zimage_in(
        &store,
        &["create", "me/detailed", "--from", "base", "--lora", &spec],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = |args: &[&str]| {
        let o = zimage_in(&store, args);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let list = out(&["list"]);
    let line = list.lines().find(|l| l.starts_with("me/detailed")).unwrap();
    assert!(line.contains("LoRA detail.safetensors ×0.8"), "{list}");
    let base_line = list.lines().find(|l| l.starts_with("base")).unwrap();
    assert!(!base_line.contains("LoRA"), "{list}");
    let show = out(&["show", "me/detailed"]);
    assert!(
        show.contains("lora        detail.safetensors ×0.8"),
        "{show}"
    );
    let j: serde_json::Value =
        serde_json::from_str(&out(&["show", "me/detailed", "--json"])).unwrap();
    assert_eq!(j["loras"][0]["scale"], 0.8f32 as f64);
    assert_eq!(j["loras"][0]["pairs"], layers().len());
    assert_eq!(j["loras"][0]["layout"], "peft");
    let j: serde_json::Value =
        serde_json::from_str(&out(&["inspect", "me/detailed", "--json"])).unwrap();
    assert!(
        j["loras"][0]
            .as_str()
            .unwrap()
            .starts_with("detail.safetensors ×0.8"),
        "{j}"
    );
}

#[test]
fn bad_lora_fails_create_with_a_clear_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_base(dir.path());
    let good = dir.path().join("good.safetensors");
    write_lora(&good, Layout::Diffusers, &random_pairs(false));
    let typo = dir.path().join("typo.safetensors");
    one_layer_lora(&typo, "layers.0.attention.to_qq", 256, 256);
    let before = walk(&store);
    // A good file before the bad one: nothing of either is written.
    let o = zimage_in(
        &store,
        &[
            "create",
            "styled",
            "--from",
            "base",
            "--lora",
            s(&good),
            "--lora",
            s(&typo),
        ],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("typo.safetensors") && err.contains("closest is `layers.0.attention.to_q`"),
        "{err}"
    );
    let missing = dir.path().join("missing.safetensors");
    let o = zimage_in(
        &store,
        &["create", "styled", "--from", "base", "--lora", s(&missing)],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("missing.safetensors"), "{}", stderr(&o));
    let o = zimage_in(
        &store,
        &["create", "styled", "--from", "nobase", "--lora", s(&good)],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("`nobase` not found"), "{}", stderr(&o));
    assert_eq!(walk(&store), before);
}

/// Every file under `dir`, sorted, the store's lock file aside.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if !p.ends_with(".zimage-lock") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The share of values identical and the largest difference.
fn agreement(got: &[u8], want: &[u8]) -> (f64, u8) {
    assert_eq!(got.len(), want.len());
    let same = got.iter().zip(want).filter(|(a, b)| a == b).count();
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap_or(0);
    (same as f64 / got.len() as f64, max)
}

#[test]
fn peft_lora_matches_diffusers_load_lora_weights() {
    // models/make_lora_reference.py: a rank-4, alpha-8 LoRA made with peft on every attention
    // and feed-forward layer, saved by diffusers, and the image diffusers draws with it loaded.
    let refs = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference");
    let st = zimage::mlx::io::load_safetensors(&refs.join("lora.safetensors")).unwrap();
    let case: serde_json::Value = serde_json::from_str(&st.metadata["case"]).unwrap();
    let want = st.tensors["image_u8"].to_vec::<u8>().unwrap();
    let base = zimage::mlx::io::load_safetensors(&refs.join("square.safetensors")).unwrap();
    let base = base.tensors["image_u8"].to_vec::<u8>().unwrap();
    let (same, _) = agreement(&base, &want);
    assert!(
        same < 0.5,
        "the reference LoRA barely changes the image ({same})"
    );

    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("lora.png");
    let lora = refs.join(case["lora"].as_str().unwrap());
    let text = |k: &str| case[k].to_string();
    let o = zimage(&[
        "generate",
        case["prompt"].as_str().unwrap(),
        "--model",
        s(&demo()),
        "--width",
        &text("width"),
        "--height",
        &text("height"),
        "--steps",
        &text("steps"),
        "--seed",
        &text("seed"),
        "--dtype",
        "f32",
        "--lora",
        &format!("{}:{}", s(&lora), case["lora_scale"]),
        "-o",
        s(&png),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = image::open(&png).unwrap().to_rgb8().into_raw();
    let (same, max) = agreement(&got, &want);
    println!("LoRA parity: {:.4}% identical, max off {max}", same * 100.0);
    assert!(
        same >= 0.999 && max <= 1,
        "{:.4}% of values identical, max off {max}",
        same * 100.0
    );
}
