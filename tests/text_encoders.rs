//! FLUX.1's two text encoders and their tokenizers against what diffusers 0.42.1's
//! `FluxPipeline.encode_prompt` (transformers 5.23.0) computes with the tiny models of
//! `models/text-encoders-tiny` (`models/make_text_encoders_tiny.py`): token ids exactly, hidden
//! states in f32 to 1e-5, and in bf16 to bf16's rounding.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use zimage::clip_tokenizer::ClipTokenizer;
use zimage::mlx::{io, Array, Dtype};
use zimage::models::clip_text::{pooled_position, ClipActivation, ClipTextConfig, ClipTextModel};
use zimage::models::t5::{relative_position_bucket, T5Config, T5Encoder};
use zimage::models::Checkpoint;
use zimage::t5_tokenizer::T5Tokenizer;

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/text-encoders-tiny")
}

/// The reference tensors and the prompts they were made from.
struct Reference {
    tensors: HashMap<String, Array>,
    prompts: Vec<String>,
    t5_length: usize,
}

fn reference() -> Reference {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/text-encoders.safetensors");
    let st = io::load_safetensors(&path).unwrap();
    let case: serde_json::Value = serde_json::from_str(&st.metadata["case"]).unwrap();
    Reference {
        tensors: st.tensors,
        prompts: serde_json::from_value(case["prompts"].clone()).unwrap(),
        t5_length: case["t5_length"].as_u64().unwrap() as usize,
    }
}

impl Reference {
    fn array(&self, name: &str) -> Array {
        let a = self.tensors.get(name);
        a.unwrap_or_else(|| panic!("no `{name}` in the reference"))
            .clone()
    }

    fn ids(&self, name: &str) -> Vec<u32> {
        let ids = self.array(name).to_vec::<i64>().unwrap();
        ids.into_iter().map(|i| i as u32).collect()
    }
}

fn reader(folder: &str) -> impl Fn(&str) -> Result<Option<Vec<u8>>, String> {
    let dir = model_dir().join(folder);
    move |name: &str| Ok(std::fs::read(dir.join(name)).ok())
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(model_dir().join(path)).unwrap()
}

fn checkpoint(component: &str, dtype: Dtype) -> Checkpoint {
    let path = model_dir().join(component).join("model.safetensors");
    Checkpoint::new(
        component,
        io::load_safetensors(&path).unwrap().tensors,
        dtype,
    )
}

fn clip(dtype: Dtype, act: Option<ClipActivation>) -> ClipTextModel {
    let file = "text_encoder/config.json";
    let mut cfg = ClipTextConfig::from_json(&read(file), file).unwrap();
    if let Some(act) = act {
        cfg.hidden_act = act;
    }
    ClipTextModel::new(&cfg, checkpoint("text_encoder", dtype)).unwrap()
}

fn t5(dtype: Dtype) -> T5Encoder {
    let file = "text_encoder_2/config.json";
    let cfg = T5Config::from_json(&read(file), file).unwrap();
    T5Encoder::new(&cfg, checkpoint("text_encoder_2", dtype)).unwrap()
}

fn values(a: &Array) -> Vec<f32> {
    a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap()
}

/// The largest difference, after checking the shapes agree.
fn max_abs(ours: &Array, theirs: &Array) -> f32 {
    assert_eq!(ours.shape(), theirs.shape(), "shapes differ");
    let (a, b) = (values(ours), values(theirs));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The largest magnitude in `a`, to state a bf16 bound relative to the values.
fn max_value(a: &Array) -> f32 {
    values(a).iter().fold(0.0, |m, v| m.max(v.abs()))
}

/// How far our bf16 output and transformers' bf16 output each lie from transformers' f32 one:
/// two faithful bf16 runs round differently, so ours is held to the reference's own distance.
fn drift(ours: &Array, theirs_bf16: &Array, theirs_f32: &Array) -> (f32, f32) {
    (max_abs(ours, theirs_f32), max_abs(theirs_bf16, theirs_f32))
}

#[test]
fn clip_ids_match_transformers() {
    let r = reference();
    let tok = ClipTokenizer::from_files(reader("tokenizer")).unwrap();
    assert_eq!(tok.window(), 32);
    for (i, prompt) in r.prompts.iter().enumerate() {
        let ids = tok.encode(prompt).unwrap();
        assert_eq!(
            ids,
            r.ids(&format!("p{i}.clip_ids")),
            "prompt {i}: {prompt:?}"
        );
    }
    // The long prompt is cut: start, 30 pieces, end; the empty one is start, end, padding.
    let long = tok.encode(&r.prompts[1]).unwrap();
    let (bos, eos) = (long[0], long[31]);
    assert!(long[1..31].iter().all(|&id| id != eos));
    let empty = tok.encode("").unwrap();
    assert_eq!(&empty[..2], &[bos, eos]);
    assert!(
        empty[2..].iter().all(|&id| id == eos),
        "padded with <|endoftext|>"
    );
}

#[test]
fn t5_ids_match_transformers() {
    let r = reference();
    let tok = T5Tokenizer::from_files(reader("tokenizer_2"), r.t5_length).unwrap();
    for (i, prompt) in r.prompts.iter().enumerate() {
        let ids = tok.encode(prompt).unwrap();
        assert_eq!(
            ids,
            r.ids(&format!("p{i}.t5_ids")),
            "prompt {i}: {prompt:?}"
        );
    }
    // </s> (1) closes every prompt, the long one cut to 47 pieces; <pad> (0) fills the rest.
    let long = tok.encode(&r.prompts[1]).unwrap();
    assert_eq!(long.len(), r.t5_length);
    assert_eq!(long[r.t5_length - 1], 1);
    assert_eq!(tok.encode("").unwrap()[..2], [1, 0]);
    let other = T5Tokenizer::from_files(reader("tokenizer_2"), 8).unwrap();
    assert_eq!(
        other.encode(&r.prompts[1]).unwrap()[..],
        long[..7].iter().chain([&1]).copied().collect::<Vec<_>>()[..]
    );
}

#[test]
fn clip_f32_matches_transformers() {
    let r = reference();
    let model = clip(Dtype::F32, None);
    let mut worst = (0f32, 0f32);
    for i in 0..r.prompts.len() {
        let out = model.forward(&r.ids(&format!("p{i}.clip_ids"))).unwrap();
        let hidden = max_abs(&out.hidden, &r.array(&format!("p{i}.clip_hidden")));
        let pooled = max_abs(&out.pooled, &r.array(&format!("p{i}.clip_pooled")));
        eprintln!("CLIP f32 prompt {i}: hidden max |Δ| {hidden:.2e}, pooled {pooled:.2e}");
        worst = (worst.0.max(hidden), worst.1.max(pooled));
    }
    assert!(worst.0 < 1e-5 && worst.1 < 1e-5, "{worst:?}");
}

#[test]
fn clip_with_exact_gelu_matches_transformers() {
    let r = reference();
    let model = clip(Dtype::F32, Some(ClipActivation::Gelu));
    let out = model.forward(&r.ids("p0.clip_ids")).unwrap();
    let hidden = max_abs(&out.hidden, &r.array("gelu.p0.clip_hidden"));
    let pooled = max_abs(&out.pooled, &r.array("gelu.p0.clip_pooled"));
    eprintln!("CLIP gelu f32: hidden max |Δ| {hidden:.2e}, pooled {pooled:.2e}");
    assert!(hidden < 1e-5 && pooled < 1e-5);
    // The activation matters: quick_gelu's output is far from gelu's.
    let quick = clip(Dtype::F32, None)
        .forward(&r.ids("p0.clip_ids"))
        .unwrap();
    assert!(max_abs(&quick.pooled, &r.array("gelu.p0.clip_pooled")) > 1e-3);
}

#[test]
fn clip_bf16_is_close_to_transformers_bf16() {
    let r = reference();
    let model = clip(Dtype::BF16, None);
    for i in 0..r.prompts.len() {
        let out = model.forward(&r.ids(&format!("p{i}.clip_ids"))).unwrap();
        assert_eq!(out.hidden.dtype(), Dtype::BF16);
        let theirs = r.array(&format!("bf16.p{i}.clip_hidden"));
        let hidden = max_abs(&out.hidden, &theirs);
        let pooled = max_abs(&out.pooled, &r.array(&format!("bf16.p{i}.clip_pooled")));
        let scale = max_value(&theirs);
        let (ours_f32, theirs_f32) =
            drift(&out.hidden, &theirs, &r.array(&format!("p{i}.clip_hidden")));
        eprintln!(
            "CLIP bf16 prompt {i}: hidden max |Δ| {hidden:.2e}, pooled {pooled:.2e} (values to {scale:.2}); \
             from f32: ours {ours_f32:.2e}, transformers' {theirs_f32:.2e}"
        );
        assert!(hidden < 0.04 * scale && pooled < 0.04 * scale, "prompt {i}");
        assert!(ours_f32 < 2.0 * theirs_f32, "prompt {i}");
    }
}

#[test]
fn t5_f32_matches_transformers() {
    let r = reference();
    let model = t5(Dtype::F32);
    let mut worst = 0f32;
    for i in 0..r.prompts.len() {
        let out = model.encode(&r.ids(&format!("p{i}.t5_ids"))).unwrap();
        let d = max_abs(&out, &r.array(&format!("p{i}.t5_hidden")));
        eprintln!("T5 f32 prompt {i}: max |Δ| {d:.2e}");
        worst = worst.max(d);
    }
    assert!(worst < 1e-5, "{worst}");
}

#[test]
fn t5_bf16_is_close_to_transformers_bf16() {
    let r = reference();
    let model = t5(Dtype::BF16);
    for i in 0..r.prompts.len() {
        let out = model.encode(&r.ids(&format!("p{i}.t5_ids"))).unwrap();
        assert_eq!(out.dtype(), Dtype::BF16);
        let theirs = r.array(&format!("bf16.p{i}.t5_hidden"));
        let d = max_abs(&out, &theirs);
        let scale = max_value(&theirs);
        let (ours_f32, theirs_f32) = drift(&out, &theirs, &r.array(&format!("p{i}.t5_hidden")));
        eprintln!(
            "T5 bf16 prompt {i}: max |Δ| {d:.2e} (values to {scale:.2}); \
             from f32: ours {ours_f32:.2e}, transformers' {theirs_f32:.2e}"
        );
        assert!(d < 0.04 * scale, "prompt {i}");
        assert!(ours_f32 < 2.0 * theirs_f32, "prompt {i}");
    }
}

#[test]
fn relative_buckets_match_transformers() {
    let r = reference();
    let check = |name: &str, buckets: i32, distance: i32| {
        let want = r.array(name).to_vec::<i64>().unwrap();
        let l = (want.len() as i32 + 1) / 2;
        for (k, &w) in want.iter().enumerate() {
            let offset = k as i32 - (l - 1);
            assert_eq!(
                relative_position_bucket(offset, buckets, distance) as i64,
                w,
                "{name}: offset {offset}"
            );
        }
    };
    check("buckets.tiny", 20, 40);
    check("buckets.real", 32, 128);
    // flux1-spec §3.4's table for T5-XXL (32 buckets, max distance 128), keys before the query.
    let spec = [
        (7, 7),
        (8, 8),
        (11, 8),
        (12, 9),
        (16, 10),
        (23, 11),
        (32, 12),
        (46, 13),
        (64, 14),
        (90, 14),
        (91, 15),
        (700, 15),
    ];
    for (distance, bucket) in spec {
        assert_eq!(
            relative_position_bucket(-distance, 32, 128),
            bucket,
            "−{distance}"
        );
        assert_eq!(
            relative_position_bucket(distance, 32, 128),
            bucket + 16,
            "+{distance}"
        );
    }
    assert_eq!(relative_position_bucket(0, 32, 128), 0);
}

#[test]
fn the_pooled_row_is_the_first_end_of_text() {
    // FLUX.1's config (`eos_token_id` 2): the first occurrence of the largest id.
    assert_eq!(pooled_position(&[49406, 320, 2368, 49407, 49407], 2), 3);
    assert_eq!(pooled_position(&[49406, 49407, 49407], 2), 1);
    // A config with the real end-of-text id: its first occurrence, else row 0.
    assert_eq!(pooled_position(&[5, 9, 7, 7], 7), 2);
    assert_eq!(pooled_position(&[5, 9], 7), 0);
}

#[test]
fn configs_name_the_file_and_the_key_at_fault() {
    let file = "text_encoder/config.json";
    let good = String::from_utf8(read(file)).unwrap();
    let cases = [
        (good.replace("\"quick_gelu\"", "\"relu\""), "hidden_act"),
        (good.replace("\"hidden_size\": 48,", ""), "hidden_size"),
        (
            good.replace("\"num_attention_heads\": 6", "\"num_attention_heads\": 5"),
            "num_attention_heads",
        ),
        (
            good.replace("\"vocab_size\": 625", "\"vocab_size\": \"many\""),
            "vocab_size",
        ),
    ];
    for (text, key) in cases {
        let err = ClipTextConfig::from_json(text.as_bytes(), file)
            .expect_err(key)
            .to_string();
        assert!(err.contains(file) && err.contains(key), "{err}");
    }
    let file = "text_encoder_2/config.json";
    let good = String::from_utf8(read(file)).unwrap();
    let cases = [
        (
            good.replace("\"gated-gelu\"", "\"relu\""),
            "feed_forward_proj",
        ),
        (good.replace("\"d_kv\": 12,", ""), "d_kv"),
        (
            good.replace(
                "\"relative_attention_num_buckets\": 20",
                "\"relative_attention_num_buckets\": 2",
            ),
            "relative_attention_num_buckets",
        ),
    ];
    for (text, key) in cases {
        let err = T5Config::from_json(text.as_bytes(), file)
            .expect_err(key)
            .to_string();
        assert!(err.contains(file) && err.contains(key), "{err}");
    }
}

#[test]
fn a_missing_tensor_is_named() {
    let file = "text_encoder/config.json";
    let cfg = ClipTextConfig::from_json(&read(file), file).unwrap();
    let path = model_dir().join("text_encoder/model.safetensors");
    let mut tensors = io::load_safetensors(&path).unwrap().tensors;
    tensors.remove("text_model.encoder.layers.1.mlp.fc2.bias");
    let err = ClipTextModel::new(&cfg, Checkpoint::new("text_encoder", tensors, Dtype::F32))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("text_encoder") && err.contains("encoder.layers.1.mlp.fc2.bias"),
        "{err}"
    );

    let file = "text_encoder_2/config.json";
    let cfg = T5Config::from_json(&read(file), file).unwrap();
    let path = model_dir().join("text_encoder_2/model.safetensors");
    let mut tensors = io::load_safetensors(&path).unwrap().tensors;
    tensors.remove("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
    let err = T5Encoder::new(&cfg, Checkpoint::new("text_encoder_2", tensors, Dtype::F32))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("text_encoder_2") && err.contains("relative_attention_bias"),
        "{err}"
    );
    // T5 v1.1 overflows f16.
    let err = T5Encoder::new(&cfg, checkpoint("text_encoder_2", Dtype::F16))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("f16"), "{err}");
}

#[test]
fn tokenizer_files_missing_are_named() {
    let none = |_: &str| Ok(None);
    let err = ClipTokenizer::from_files(none).err().unwrap().to_string();
    assert!(
        err.contains("vocab.json") && err.contains("merges.txt"),
        "{err}"
    );
    let err = T5Tokenizer::from_files(none, 16).err().unwrap().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    let err = T5Tokenizer::from_files(reader("tokenizer_2"), 513)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("513"), "{err}");
}

#[test]
fn ids_the_models_cannot_read_are_refused() {
    let model = clip(Dtype::F32, None);
    let err = model.forward(&[0; 41]).err().unwrap().to_string();
    assert!(err.contains("max_position_embeddings"), "{err}");
    let err = model.forward(&[0, 625]).err().unwrap().to_string();
    assert!(err.contains("625") && err.contains("vocab_size"), "{err}");
    let err = t5(Dtype::F32).encode(&[320]).err().unwrap().to_string();
    assert!(err.contains("320") && err.contains("vocab_size"), "{err}");
}
