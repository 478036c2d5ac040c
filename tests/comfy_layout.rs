//! ComfyUI's single files (original-layout transformer with fused q|k|v, `model.`-prefixed
//! Qwen3, LDM-layout VAE) imported with `create --transformer/--text-encoder/--vae`, and
//! written back with `export --format comfy`.
//!
//! The model unlike the demo (width 320 with five 64-wide heads, a 32-wide text encoder with
//! four query and two key-value heads, a three-level VAE of 32/64/64 channels) is written by
//! this test twice: as a diffusers directory, and as ComfyUI's three files through the name
//! table below, which spells out each tensor's name in both layouts.

mod common;

use common::{s, write_safetensors, zimage_in};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use zimage::safetensors::Dtype;
use zimage::store::Store;

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny")
}

/// A deterministic stream of values in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// One tensor of the model: its diffusers name, its ComfyUI name, shape and f32 values.
struct Entry {
    diffusers: String,
    comfy: String,
    shape: Vec<u64>,
    values: Vec<f32>,
}

#[derive(Default)]
struct Component {
    entries: Vec<Entry>,
}

impl Component {
    /// Adds a tensor: weights of two or more axes scaled to 1/sqrt(fan-in), vectors near 1
    /// (norm weights, `one = true`) or near 0 (biases).
    fn add(&mut self, rng: &mut Rng, diffusers: &str, comfy: &str, shape: &[u64], one: bool) {
        let n: u64 = shape.iter().product();
        let fan_in: u64 = shape.iter().skip(1).product::<u64>().max(1);
        let values = (0..n)
            .map(|_| {
                let u = rng.next();
                match (shape.len(), one) {
                    (1, true) => 1.0 + 0.1 * u,
                    (1, false) => 0.1 * u,
                    _ => u * (3.0 / fan_in as f32).sqrt(),
                }
            })
            .collect();
        self.entries.push(Entry {
            diffusers: diffusers.to_string(),
            comfy: comfy.to_string(),
            shape: shape.to_vec(),
            values,
        });
    }
}

const DIM: u64 = 320;
const HEAD: u64 = 64;
const FFN: u64 = 853; // int(320 / 3 * 8)
const CAP: u64 = 32;
const VOCAB: u64 = 151936;

fn transformer(rng: &mut Rng) -> Component {
    let mut c = Component::default();
    let p = "model.diffusion_model.";
    // ComfyUI's transformer file carries the `model.diffusion_model.` prefix.
    let both = |c: &mut Component, rng: &mut Rng, d: &str, o: &str, shape: &[u64], one| {
        c.add(rng, d, &format!("{p}{o}"), shape, one)
    };
    for (d, o, shape, one) in [
        (
            "t_embedder.mlp.0.weight",
            "t_embedder.mlp.0.weight",
            vec![1024, 256],
            false,
        ),
        (
            "t_embedder.mlp.0.bias",
            "t_embedder.mlp.0.bias",
            vec![1024],
            false,
        ),
        (
            "t_embedder.mlp.2.weight",
            "t_embedder.mlp.2.weight",
            vec![256, 1024],
            false,
        ),
        (
            "t_embedder.mlp.2.bias",
            "t_embedder.mlp.2.bias",
            vec![256],
            false,
        ),
        (
            "cap_embedder.0.weight",
            "cap_embedder.0.weight",
            vec![CAP],
            true,
        ),
        (
            "cap_embedder.1.weight",
            "cap_embedder.1.weight",
            vec![DIM, CAP],
            false,
        ),
        (
            "cap_embedder.1.bias",
            "cap_embedder.1.bias",
            vec![DIM],
            false,
        ),
        (
            "all_x_embedder.2-1.weight",
            "x_embedder.weight",
            vec![DIM, 64],
            false,
        ),
        (
            "all_x_embedder.2-1.bias",
            "x_embedder.bias",
            vec![DIM],
            false,
        ),
        ("x_pad_token", "x_pad_token", vec![1, DIM], false),
        ("cap_pad_token", "cap_pad_token", vec![1, DIM], false),
        (
            "all_final_layer.2-1.linear.weight",
            "final_layer.linear.weight",
            vec![64, DIM],
            false,
        ),
        (
            "all_final_layer.2-1.linear.bias",
            "final_layer.linear.bias",
            vec![64],
            false,
        ),
        (
            "all_final_layer.2-1.adaLN_modulation.1.weight",
            "final_layer.adaLN_modulation.1.weight",
            vec![DIM, 256],
            false,
        ),
        (
            "all_final_layer.2-1.adaLN_modulation.1.bias",
            "final_layer.adaLN_modulation.1.bias",
            vec![DIM],
            false,
        ),
    ] {
        both(&mut c, rng, d, o, &shape, one);
    }
    for (block, modulated) in [
        ("layers.0", true),
        ("layers.1", true),
        ("noise_refiner.0", true),
        ("context_refiner.0", false),
    ] {
        // q, k and v are separate tensors in diffusers and rows of one `qkv` in ComfyUI's file.
        for part in ["q", "k", "v"] {
            c.add(
                rng,
                &format!("{block}.attention.to_{part}.weight"),
                &format!("{p}{block}.attention.qkv.weight"),
                &[DIM, DIM],
                false,
            );
        }
        for (d, o, shape, one) in [
            (
                "attention.to_out.0.weight",
                "attention.out.weight",
                vec![DIM, DIM],
                false,
            ),
            (
                "attention.norm_q.weight",
                "attention.q_norm.weight",
                vec![HEAD],
                true,
            ),
            (
                "attention.norm_k.weight",
                "attention.k_norm.weight",
                vec![HEAD],
                true,
            ),
            (
                "attention_norm1.weight",
                "attention_norm1.weight",
                vec![DIM],
                true,
            ),
            (
                "attention_norm2.weight",
                "attention_norm2.weight",
                vec![DIM],
                true,
            ),
            ("ffn_norm1.weight", "ffn_norm1.weight", vec![DIM], true),
            ("ffn_norm2.weight", "ffn_norm2.weight", vec![DIM], true),
            (
                "feed_forward.w1.weight",
                "feed_forward.w1.weight",
                vec![FFN, DIM],
                false,
            ),
            (
                "feed_forward.w2.weight",
                "feed_forward.w2.weight",
                vec![DIM, FFN],
                false,
            ),
            (
                "feed_forward.w3.weight",
                "feed_forward.w3.weight",
                vec![FFN, DIM],
                false,
            ),
        ] {
            both(
                &mut c,
                rng,
                &format!("{block}.{d}"),
                &format!("{block}.{o}"),
                &shape,
                one,
            );
        }
        if modulated {
            both(
                &mut c,
                rng,
                &format!("{block}.adaLN_modulation.0.weight"),
                &format!("{block}.adaLN_modulation.0.weight"),
                &[4 * DIM, 256],
                false,
            );
            both(
                &mut c,
                rng,
                &format!("{block}.adaLN_modulation.0.bias"),
                &format!("{block}.adaLN_modulation.0.bias"),
                &[4 * DIM],
                false,
            );
        }
    }
    c
}

fn text_encoder(rng: &mut Rng) -> Component {
    let mut c = Component::default();
    let mut same = |c: &mut Component, n: &str, shape: &[u64], one| c.add(rng, n, n, shape, one);
    same(&mut c, "model.embed_tokens.weight", &[VOCAB, CAP], false);
    for i in 0..2 {
        for (n, shape, one) in [
            ("input_layernorm.weight", vec![CAP], true),
            ("self_attn.q_proj.weight", vec![64, CAP], false),
            ("self_attn.k_proj.weight", vec![32, CAP], false),
            ("self_attn.v_proj.weight", vec![32, CAP], false),
            ("self_attn.o_proj.weight", vec![CAP, 64], false),
            ("self_attn.q_norm.weight", vec![16], true),
            ("self_attn.k_norm.weight", vec![16], true),
            ("post_attention_layernorm.weight", vec![CAP], true),
            ("mlp.gate_proj.weight", vec![64, CAP], false),
            ("mlp.up_proj.weight", vec![64, CAP], false),
            ("mlp.down_proj.weight", vec![CAP, 64], false),
        ] {
            same(&mut c, &format!("model.layers.{i}.{n}"), &shape, one);
        }
    }
    same(&mut c, "model.norm.weight", &[CAP], true);
    c
}

/// A resnet of the VAE: diffusers prefix `d`, LDM prefix `o`.
fn resnet(c: &mut Component, rng: &mut Rng, d: &str, o: &str, cin: u64, cout: u64) {
    for (n, shape, one) in [
        ("norm1.weight", vec![cin], true),
        ("norm1.bias", vec![cin], false),
        ("conv1.weight", vec![cout, cin, 3, 3], false),
        ("conv1.bias", vec![cout], false),
        ("norm2.weight", vec![cout], true),
        ("norm2.bias", vec![cout], false),
        ("conv2.weight", vec![cout, cout, 3, 3], false),
        ("conv2.bias", vec![cout], false),
    ] {
        c.add(rng, &format!("{d}.{n}"), &format!("{o}.{n}"), &shape, one);
    }
    if cin != cout {
        c.add(
            rng,
            &format!("{d}.conv_shortcut.weight"),
            &format!("{o}.nin_shortcut.weight"),
            &[cout, cin, 1, 1],
            false,
        );
        c.add(
            rng,
            &format!("{d}.conv_shortcut.bias"),
            &format!("{o}.nin_shortcut.bias"),
            &[cout],
            false,
        );
    }
}

/// The mid block: two resnets around an attention whose projections LDM stores as 1×1 convs.
fn mid(c: &mut Component, rng: &mut Rng, half: &str, ch: u64) {
    resnet(
        c,
        rng,
        &format!("{half}.mid_block.resnets.0"),
        &format!("{half}.mid.block_1"),
        ch,
        ch,
    );
    for (d, o) in [
        ("group_norm", "norm"),
        ("to_q", "q"),
        ("to_k", "k"),
        ("to_v", "v"),
        ("to_out.0", "proj_out"),
    ] {
        let (dp, op) = (
            format!("{half}.mid_block.attentions.0.{d}"),
            format!("{half}.mid.attn_1.{o}"),
        );
        let shape = if d == "group_norm" {
            vec![ch]
        } else {
            vec![ch, ch]
        };
        c.add(
            rng,
            &format!("{dp}.weight"),
            &format!("{op}.weight"),
            &shape,
            d == "group_norm",
        );
        c.add(
            rng,
            &format!("{dp}.bias"),
            &format!("{op}.bias"),
            &[ch],
            false,
        );
    }
    resnet(
        c,
        rng,
        &format!("{half}.mid_block.resnets.1"),
        &format!("{half}.mid.block_2"),
        ch,
        ch,
    );
}

const CHANNELS: [u64; 3] = [32, 64, 64];

fn vae(rng: &mut Rng) -> Component {
    let mut c = Component::default();
    let n = CHANNELS.len();
    let same = |c: &mut Component, rng: &mut Rng, d: &str, o: &str, shape: &[u64], one| {
        c.add(rng, d, o, shape, one)
    };
    same(
        &mut c,
        rng,
        "encoder.conv_in.weight",
        "encoder.conv_in.weight",
        &[32, 3, 3, 3],
        false,
    );
    same(
        &mut c,
        rng,
        "encoder.conv_in.bias",
        "encoder.conv_in.bias",
        &[32],
        false,
    );
    let mut cin = CHANNELS[0];
    for (i, &cout) in CHANNELS.iter().enumerate() {
        resnet(
            &mut c,
            rng,
            &format!("encoder.down_blocks.{i}.resnets.0"),
            &format!("encoder.down.{i}.block.0"),
            cin,
            cout,
        );
        if i + 1 < n {
            same(
                &mut c,
                rng,
                &format!("encoder.down_blocks.{i}.downsamplers.0.conv.weight"),
                &format!("encoder.down.{i}.downsample.conv.weight"),
                &[cout, cout, 3, 3],
                false,
            );
            same(
                &mut c,
                rng,
                &format!("encoder.down_blocks.{i}.downsamplers.0.conv.bias"),
                &format!("encoder.down.{i}.downsample.conv.bias"),
                &[cout],
                false,
            );
        }
        cin = cout;
    }
    mid(&mut c, rng, "encoder", 64);
    same(
        &mut c,
        rng,
        "encoder.conv_norm_out.weight",
        "encoder.norm_out.weight",
        &[64],
        true,
    );
    same(
        &mut c,
        rng,
        "encoder.conv_norm_out.bias",
        "encoder.norm_out.bias",
        &[64],
        false,
    );
    same(
        &mut c,
        rng,
        "encoder.conv_out.weight",
        "encoder.conv_out.weight",
        &[32, 64, 3, 3],
        false,
    );
    same(
        &mut c,
        rng,
        "encoder.conv_out.bias",
        "encoder.conv_out.bias",
        &[32],
        false,
    );
    same(
        &mut c,
        rng,
        "decoder.conv_in.weight",
        "decoder.conv_in.weight",
        &[64, 16, 3, 3],
        false,
    );
    same(
        &mut c,
        rng,
        "decoder.conv_in.bias",
        "decoder.conv_in.bias",
        &[64],
        false,
    );
    mid(&mut c, rng, "decoder", 64);
    // diffusers counts up blocks from the lowest resolution; LDM from the highest.
    let mut cin = 64;
    for (i, &cout) in CHANNELS.iter().rev().enumerate() {
        let ldm = n - 1 - i;
        for j in 0..2 {
            resnet(
                &mut c,
                rng,
                &format!("decoder.up_blocks.{i}.resnets.{j}"),
                &format!("decoder.up.{ldm}.block.{j}"),
                if j == 0 { cin } else { cout },
                cout,
            );
        }
        if i + 1 < n {
            same(
                &mut c,
                rng,
                &format!("decoder.up_blocks.{i}.upsamplers.0.conv.weight"),
                &format!("decoder.up.{ldm}.upsample.conv.weight"),
                &[cout, cout, 3, 3],
                false,
            );
            same(
                &mut c,
                rng,
                &format!("decoder.up_blocks.{i}.upsamplers.0.conv.bias"),
                &format!("decoder.up.{ldm}.upsample.conv.bias"),
                &[cout],
                false,
            );
        }
        cin = cout;
    }
    same(
        &mut c,
        rng,
        "decoder.conv_norm_out.weight",
        "decoder.norm_out.weight",
        &[32],
        true,
    );
    same(
        &mut c,
        rng,
        "decoder.conv_norm_out.bias",
        "decoder.norm_out.bias",
        &[32],
        false,
    );
    same(
        &mut c,
        rng,
        "decoder.conv_out.weight",
        "decoder.conv_out.weight",
        &[3, 32, 3, 3],
        false,
    );
    same(
        &mut c,
        rng,
        "decoder.conv_out.bias",
        "decoder.conv_out.bias",
        &[3],
        false,
    );
    c
}

fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Writes `c` in diffusers layout to `path`.
fn write_diffusers(path: &Path, c: &Component) {
    let tensors: Vec<_> = c
        .entries
        .iter()
        .map(|e| {
            (
                e.diffusers.as_str(),
                Dtype::F32,
                e.shape.clone(),
                bytes(&e.values),
            )
        })
        .collect();
    write_safetensors(path, &tensors);
}

/// Writes `c` in ComfyUI's layout to `paths` (tensors dealt out between the files in turn):
/// entries sharing a ComfyUI name are concatenated along their first axis, 1×1 convolutions
/// (the VAE's attention) get their unit axes, and `extra` tensors are added.
/// One tensor to write: name, dtype, shape, bytes.
type Written<'a> = (&'a str, Dtype, Vec<u64>, Vec<u8>);

fn write_comfy(paths: &[PathBuf], c: &Component, conv_attention: bool, extra: &[(&str, Vec<u64>)]) {
    let mut joined: BTreeMap<&str, (Vec<u64>, Vec<f32>)> = BTreeMap::new();
    for e in &c.entries {
        let slot = joined.entry(e.comfy.as_str()).or_insert_with(|| {
            let mut s = e.shape.clone();
            s[0] = 0;
            (s, Vec::new())
        });
        slot.0[0] += e.shape[0];
        slot.1.extend(&e.values);
    }
    let mut files: Vec<Vec<Written>> = vec![Vec::new(); paths.len()];
    for (i, (name, (mut shape, values))) in joined.into_iter().enumerate() {
        if conv_attention
            && name.contains(".attn_1.")
            && name.ends_with(".weight")
            && shape.len() == 2
        {
            shape.extend([1, 1]);
        }
        files[i % paths.len()].push((name, Dtype::F32, shape, bytes(&values)));
    }
    for (name, shape) in extra {
        let n: u64 = shape.iter().product();
        files[0].push((
            *name,
            Dtype::F32,
            shape.clone(),
            bytes(&vec![1.0; n as usize]),
        ));
    }
    for (path, tensors) in paths.iter().zip(&files) {
        write_safetensors(path, tensors);
    }
}

/// The diffusers directory: these configs, and the demo's tokenizer, scheduler and index.
fn write_diffusers_dir(dir: &Path, te: &Component, tr: &Component, vae: &Component) {
    for sub in [
        "text_encoder",
        "transformer",
        "vae",
        "tokenizer",
        "scheduler",
    ] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    for f in [
        "model_index.json",
        "scheduler/scheduler_config.json",
        "tokenizer/vocab.json",
        "tokenizer/merges.txt",
        "tokenizer/tokenizer_config.json",
    ] {
        std::fs::copy(demo().join(f), dir.join(f)).unwrap();
    }
    write_diffusers(&dir.join("text_encoder/model.safetensors"), te);
    write_diffusers(
        &dir.join("transformer/diffusion_pytorch_model.safetensors"),
        tr,
    );
    write_diffusers(&dir.join("vae/diffusion_pytorch_model.safetensors"), vae);
    let configs = [
        (
            "text_encoder/config.json",
            serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": VOCAB,
            "hidden_size": CAP, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
            "attention_bias": false, "tie_word_embeddings": true, "max_position_embeddings": 40960}),
        ),
        (
            "transformer/config.json",
            serde_json::json!({
            "_class_name": "ZImageTransformer2DModel", "all_patch_size": [2], "all_f_patch_size": [1],
            "in_channels": 16, "dim": DIM, "n_layers": 2, "n_refiner_layers": 1, "n_heads": 5,
            "n_kv_heads": 5, "norm_eps": 1e-5, "qk_norm": true, "cap_feat_dim": CAP,
            "rope_theta": 256.0, "t_scale": 1000.0, "axes_dims": [16, 24, 24],
            "axes_lens": [1536, 512, 512]}),
        ),
        (
            "vae/config.json",
            serde_json::json!({
            "_class_name": "AutoencoderKL", "act_fn": "silu", "block_out_channels": CHANNELS,
            "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"], "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"],
            "in_channels": 3, "out_channels": 3, "latent_channels": 16, "layers_per_block": 1,
            "norm_num_groups": 32, "mid_block_add_attention": true, "sample_size": 1024,
            "scaling_factor": 0.3611, "shift_factor": 0.1159, "force_upcast": true,
            "use_quant_conv": false, "use_post_quant_conv": false}),
        ),
    ];
    for (f, v) in configs {
        std::fs::write(dir.join(f), serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    }
}

fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An f32 image of `model` from seed 7.
fn generate(store: &Path, model: &str, png: &Path, size: u32) -> image::RgbImage {
    let size = size.to_string();
    ok(zimage_in(
        store,
        &[
            "generate",
            "a red fox in the snow",
            "--model",
            model,
            "--width",
            &size,
            "--height",
            &size,
            "--steps",
            "2",
            "--seed",
            "7",
            "--dtype",
            "f32",
            "-o",
            s(png),
        ],
    ));
    image::open(png).unwrap().to_rgb8()
}

/// Share of identical channel values and the largest difference.
fn compare(a: &image::RgbImage, b: &image::RgbImage) -> (f64, u8) {
    assert_eq!(a.dimensions(), b.dimensions());
    let (mut same, mut worst) = (0usize, 0u8);
    for (x, y) in a.as_raw().iter().zip(b.as_raw()) {
        same += (x == y) as usize;
        worst = worst.max(x.abs_diff(*y));
    }
    (same as f64 / a.as_raw().len() as f64, worst)
}

/// Tensor layer name → digest.
fn tensor_blobs(store: &Path, model: &str) -> BTreeMap<String, String> {
    let m = Store::at(store).open(model).unwrap();
    m.manifest
        .layers
        .iter()
        .filter(|l| l.is_tensor())
        .map(|l| (l.name.clone().unwrap(), l.digest.clone()))
        .collect()
}

#[test]
fn comfy_trio_of_a_model_unlike_the_demo_gives_the_diffusers_image_from_the_same_blobs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let store = root.join("store");
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let (te, tr, va) = (text_encoder(&mut rng), transformer(&mut rng), vae(&mut rng));
    write_diffusers_dir(&root.join("diffusers"), &te, &tr, &va);
    let comfy = root.join("comfy");
    std::fs::create_dir_all(&comfy).unwrap();
    let (t, e1, e2, v) = (
        comfy.join("z.safetensors"),
        comfy.join("te-1.safetensors"),
        comfy.join("te-2.safetensors"),
        comfy.join("ae.safetensors"),
    );
    write_comfy(
        std::slice::from_ref(&t),
        &tr,
        false,
        &[("model.diffusion_model.norm_final.weight", vec![DIM])],
    );
    write_comfy(&[e1.clone(), e2.clone()], &te, false, &[]);
    write_comfy(std::slice::from_ref(&v), &va, true, &[]);

    ok(zimage_in(
        &store,
        &["create", "diffusers", "--from", s(&root.join("diffusers"))],
    ));
    let created = ok(zimage_in(
        &store,
        &[
            "create",
            "comfy",
            "--transformer",
            s(&t),
            "--text-encoder",
            s(&e1),
            s(&e2),
            "--vae",
            s(&v),
        ],
    ));
    assert!(
        created.contains("transformer: ") && created.contains("original layout"),
        "{created}"
    );
    assert!(
        created.contains("norm_final.weight"),
        "the unused norm is reported: {created}"
    );

    // Every tensor is the same blob as the diffusers import's.
    let (a, b) = (
        tensor_blobs(&store, "diffusers"),
        tensor_blobs(&store, "comfy"),
    );
    assert_eq!(a.len(), b.len());
    for (name, digest) in &a {
        assert_eq!(b.get(name), Some(digest), "{name}");
    }
    assert!(created.contains(", 0 blobs written"), "{created}");

    let one = generate(&store, "diffusers", &root.join("a.png"), 64);
    let two = generate(&store, "comfy", &root.join("b.png"), 64);
    let (same, worst) = compare(&one, &two);
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, max off by {worst}"
    );
}

#[test]
fn export_to_comfy_and_back_gives_the_same_model_and_image() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    ok(zimage_in(&store, &["create", "demo", "--from", s(&demo())]));
    let out = tmp.path().join("comfy");
    ok(zimage_in(
        &store,
        &["export", "demo", "--format", "comfy", s(&out)],
    ));
    let t = out.join("diffusion_models/demo.safetensors");
    let e = out.join("text_encoders/demo.safetensors");
    let v = out.join("vae/demo.safetensors");

    // The files are in ComfyUI's layout.
    let names = |p: &Path| -> BTreeMap<String, Vec<u64>> {
        zimage::safetensors::read_header_file(p)
            .unwrap()
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect()
    };
    let tn = names(&t);
    assert_eq!(tn["layers.0.attention.qkv.weight"], vec![768, 256]);
    assert!(tn.contains_key("x_embedder.weight") && tn.contains_key("final_layer.linear.weight"));
    assert!(!tn
        .keys()
        .any(|n| n.contains("to_q") || n.contains("all_x_embedder")));
    assert!(names(&e).keys().all(|n| n.starts_with("model.")));
    let vn = names(&v);
    assert_eq!(vn["decoder.mid.attn_1.q.weight"], vec![64, 64, 1, 1]);
    assert_eq!(vn["decoder.up.1.block.0.conv1.weight"], vec![32, 64, 3, 3]);
    assert!(vn.contains_key("encoder.down.2.block.0.nin_shortcut.weight"));

    ok(zimage_in(
        &store,
        &[
            "create",
            "back",
            "--transformer",
            s(&t),
            "--text-encoder",
            s(&e),
            "--vae",
            s(&v),
        ],
    ));
    assert_eq!(tensor_blobs(&store, "demo"), tensor_blobs(&store, "back"));
    let one = generate(&store, "demo", &tmp.path().join("a.png"), 64);
    let two = generate(&store, "back", &tmp.path().join("b.png"), 64);
    assert_eq!(compare(&one, &two), (1.0, 0));
}

#[test]
fn a_component_replaces_the_one_of_from_and_shards_come_through_an_index() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    ok(zimage_in(&store, &["create", "demo", "--from", s(&demo())]));
    let index = demo().join("text_encoder/model.safetensors.index.json");
    let out = ok(zimage_in(
        &store,
        &[
            "create",
            "swapped",
            "--from",
            s(&demo()),
            "--text-encoder",
            s(&index),
        ],
    ));
    assert!(
        out.contains("text_encoder: ") && out.contains("diffusers layout"),
        "{out}"
    );
    assert_eq!(
        tensor_blobs(&store, "demo"),
        tensor_blobs(&store, "swapped")
    );
}

#[test]
fn an_unknown_layout_is_refused_with_what_was_expected_and_nothing_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let file = tmp.path().join("odd.safetensors");
    write_safetensors(
        &file,
        &[("blocks.0.weight", Dtype::F32, vec![2, 2], vec![0; 16])],
    );
    let out = zimage_in(
        &store,
        &[
            "create",
            "x",
            "--transformer",
            s(&file),
            "--from",
            s(&demo()),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("odd.safetensors")
            && err.contains("x_embedder.weight")
            && err.contains("blocks.0.weight"),
        "{err}"
    );
    assert!(Store::at(&store).open("x").is_err());

    // Without --from every weight component is needed.
    let out = zimage_in(&store, &["create", "x", "--transformer", s(&file)]);
    assert_eq!(out.status.code(), Some(2));
}
