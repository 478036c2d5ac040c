//! The synthetic Z-Image of `models/synthetic.rs`: at the real widths, every tensor the spec
//! lists (zimage-spec §2.6, §3.1, §5.7) with its exact name and shape, real-depth sizes as §8
//! gives them, configs the loader accepts, and an image through the store, quantized to int4.
//! The synthetic FLUX.2 \[klein\], FLUX.3 \[klein\] and FLUX.1 at their specs' sizes; a shallow
//! FLUX.1 of each variant through the store, `show`'s kind and memory, and an image.

#[path = "../models/synthetic.rs"]
mod synthetic;

mod common;

use common::{s, zimage_in};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::time::Instant;
use synthetic::{Spec, WeightDtype};
use zimage::diffusers_dir::DiffusersDir;

type Shapes = BTreeMap<String, Vec<u64>>;

/// The text encoder's tensors as zimage-spec §2.6 lists them, `model.`-prefixed, for `layers`.
fn spec_text_encoder(layers: u32) -> Shapes {
    let mut m = Shapes::new();
    m.insert("model.embed_tokens.weight".into(), vec![151936, 2560]);
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        for (n, shape) in [
            ("input_layernorm.weight", vec![2560]),
            ("self_attn.q_proj.weight", vec![4096, 2560]),
            ("self_attn.k_proj.weight", vec![1024, 2560]),
            ("self_attn.v_proj.weight", vec![1024, 2560]),
            ("self_attn.o_proj.weight", vec![2560, 4096]),
            ("self_attn.q_norm.weight", vec![128]),
            ("self_attn.k_norm.weight", vec![128]),
            ("post_attention_layernorm.weight", vec![2560]),
            ("mlp.gate_proj.weight", vec![9728, 2560]),
            ("mlp.up_proj.weight", vec![9728, 2560]),
            ("mlp.down_proj.weight", vec![2560, 9728]),
        ] {
            m.insert(format!("{p}.{n}"), shape);
        }
    }
    m.insert("model.norm.weight".into(), vec![2560]);
    m
}

/// The transformer's tensors as zimage-spec §3.1 lists them.
fn spec_transformer(layers: u32, refiners: u32) -> Shapes {
    let mut m = Shapes::new();
    for (n, shape) in [
        ("t_embedder.mlp.0.weight", vec![1024, 256]),
        ("t_embedder.mlp.0.bias", vec![1024]),
        ("t_embedder.mlp.2.weight", vec![256, 1024]),
        ("t_embedder.mlp.2.bias", vec![256]),
        ("cap_embedder.0.weight", vec![2560]),
        ("cap_embedder.1.weight", vec![3840, 2560]),
        ("cap_embedder.1.bias", vec![3840]),
        ("all_x_embedder.2-1.weight", vec![3840, 64]),
        ("all_x_embedder.2-1.bias", vec![3840]),
        ("x_pad_token", vec![1, 3840]),
        ("cap_pad_token", vec![1, 3840]),
        (
            "all_final_layer.2-1.adaLN_modulation.1.weight",
            vec![3840, 256],
        ),
        ("all_final_layer.2-1.adaLN_modulation.1.bias", vec![3840]),
        ("all_final_layer.2-1.linear.weight", vec![64, 3840]),
        ("all_final_layer.2-1.linear.bias", vec![64]),
    ] {
        m.insert(n.into(), shape);
    }
    let blocks = (0..refiners)
        .map(|i| (format!("noise_refiner.{i}"), true))
        .chain((0..refiners).map(|i| (format!("context_refiner.{i}"), false)))
        .chain((0..layers).map(|i| (format!("layers.{i}"), true)));
    for (p, modulated) in blocks {
        for (n, shape) in [
            ("attention.to_q.weight", vec![3840, 3840]),
            ("attention.to_k.weight", vec![3840, 3840]),
            ("attention.to_v.weight", vec![3840, 3840]),
            ("attention.to_out.0.weight", vec![3840, 3840]),
            ("attention.norm_q.weight", vec![128]),
            ("attention.norm_k.weight", vec![128]),
            ("attention_norm1.weight", vec![3840]),
            ("attention_norm2.weight", vec![3840]),
            ("ffn_norm1.weight", vec![3840]),
            ("ffn_norm2.weight", vec![3840]),
            ("feed_forward.w1.weight", vec![10240, 3840]),
            ("feed_forward.w3.weight", vec![10240, 3840]),
            ("feed_forward.w2.weight", vec![3840, 10240]),
        ] {
            m.insert(format!("{p}.{n}"), shape);
        }
        if modulated {
            m.insert(format!("{p}.adaLN_modulation.0.weight"), vec![15360, 256]);
            m.insert(format!("{p}.adaLN_modulation.0.bias"), vec![15360]);
        }
    }
    m
}

/// The VAE's tensors as zimage-spec §5.2 and §5.7 describe them: the encoder (106 tensors),
/// then the decoder (138).
fn spec_vae() -> Shapes {
    let mut m = Shapes::new();
    let conv = |m: &mut Shapes, p: &str, cin: u64, cout: u64, k: u64| {
        m.insert(format!("{p}.weight"), vec![cout, cin, k, k]);
        m.insert(format!("{p}.bias"), vec![cout]);
    };
    let norm = |m: &mut Shapes, p: &str, c: u64| {
        m.insert(format!("{p}.weight"), vec![c]);
        m.insert(format!("{p}.bias"), vec![c]);
    };
    let resnet = |m: &mut Shapes, p: &str, cin: u64, cout: u64| {
        norm(m, &format!("{p}.norm1"), cin);
        conv(m, &format!("{p}.conv1"), cin, cout, 3);
        norm(m, &format!("{p}.norm2"), cout);
        conv(m, &format!("{p}.conv2"), cout, cout, 3);
        if cin != cout {
            conv(m, &format!("{p}.conv_shortcut"), cin, cout, 1);
        }
    };
    m.insert("encoder.conv_in.weight".into(), vec![128, 3, 3, 3]);
    m.insert("encoder.conv_in.bias".into(), vec![128]);
    for (b, cin, cout) in [(0, 128, 128), (1, 128, 256), (2, 256, 512), (3, 512, 512)] {
        for r in 0..2 {
            let p = format!("encoder.down_blocks.{b}.resnets.{r}");
            resnet(&mut m, &p, if r == 0 { cin } else { cout }, cout);
        }
        if b < 3 {
            let p = format!("encoder.down_blocks.{b}.downsamplers.0.conv");
            m.insert(format!("{p}.weight"), vec![cout, cout, 3, 3]);
            m.insert(format!("{p}.bias"), vec![cout]);
        }
    }
    for r in 0..2 {
        resnet(&mut m, &format!("encoder.mid_block.resnets.{r}"), 512, 512);
    }
    norm(&mut m, "encoder.mid_block.attentions.0.group_norm", 512);
    for proj in ["to_q", "to_k", "to_v", "to_out.0"] {
        let p = format!("encoder.mid_block.attentions.0.{proj}");
        m.insert(format!("{p}.weight"), vec![512, 512]);
        m.insert(format!("{p}.bias"), vec![512]);
    }
    norm(&mut m, "encoder.conv_norm_out", 512);
    m.insert("encoder.conv_out.weight".into(), vec![32, 512, 3, 3]);
    m.insert("encoder.conv_out.bias".into(), vec![32]);

    m.insert("decoder.conv_in.weight".into(), vec![512, 16, 3, 3]);
    m.insert("decoder.conv_in.bias".into(), vec![512]);
    for r in 0..2 {
        resnet(&mut m, &format!("decoder.mid_block.resnets.{r}"), 512, 512);
    }
    norm(&mut m, "decoder.mid_block.attentions.0.group_norm", 512);
    for proj in ["to_q", "to_k", "to_v", "to_out.0"] {
        let p = format!("decoder.mid_block.attentions.0.{proj}");
        m.insert(format!("{p}.weight"), vec![512, 512]);
        m.insert(format!("{p}.bias"), vec![512]);
    }
    for (b, cin, cout) in [(0, 512, 512), (1, 512, 512), (2, 512, 256), (3, 256, 128)] {
        for r in 0..3 {
            let p = format!("decoder.up_blocks.{b}.resnets.{r}");
            resnet(&mut m, &p, if r == 0 { cin } else { cout }, cout);
        }
        if b < 3 {
            let p = format!("decoder.up_blocks.{b}.upsamplers.0.conv");
            m.insert(format!("{p}.weight"), vec![cout, cout, 3, 3]);
            m.insert(format!("{p}.bias"), vec![cout]);
        }
    }
    norm(&mut m, "decoder.conv_norm_out", 128);
    m.insert("decoder.conv_out.weight".into(), vec![3, 128, 3, 3]);
    m.insert("decoder.conv_out.bias".into(), vec![3]);
    m
}

/// Differences between what a component holds and what the spec lists, one line each.
fn differences(component: &str, got: &Shapes, want: &Shapes) -> Vec<String> {
    let mut out = Vec::new();
    for (name, shape) in want {
        match got.get(name) {
            None => out.push(format!("{component}: missing `{name}` {shape:?}")),
            Some(g) if g != shape => {
                out.push(format!("{component}: `{name}` is {g:?}, spec {shape:?}"))
            }
            _ => {}
        }
    }
    for name in got.keys().filter(|n| !want.contains_key(*n)) {
        out.push(format!("{component}: unexpected `{name}`"));
    }
    out
}

/// `count` elements of a tensor of the directory, from element `start`, as raw bytes.
fn read_elems(dir: &DiffusersDir, component: &str, name: &str, start: u64, count: u64) -> Vec<u8> {
    let t = dir.tensors[component]
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no `{component}/{name}`"));
    let esize = t.info.nbytes() / t.info.numel();
    let mut f = std::fs::File::open(&t.file).unwrap();
    f.seek(SeekFrom::Start(t.offset + start * esize)).unwrap();
    let mut buf = vec![0u8; (count * esize) as usize];
    f.read_exact(&mut buf).unwrap();
    buf
}

fn bf16_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

#[test]
fn real_depth_sizes_match_the_spec() {
    // zimage-spec §8 (tensors, params, bf16 bytes) and §1.1 (3 text-encoder shards).
    let real = synthetic::plan(&Spec::real());
    let te = real.component("text_encoder").unwrap();
    assert_eq!(
        (te.tensors, te.params, te.data_bytes, te.files),
        (398, 4_022_468_096, 8_044_936_192, 3)
    );
    let tr = real.component("transformer").unwrap();
    assert_eq!(
        (tr.tensors, tr.params, tr.data_bytes),
        (521, 6_154_908_736, 12_309_817_472)
    );
    let vae = real.component("vae").unwrap();
    assert_eq!(
        (vae.tensors, vae.params, vae.data_bytes),
        (244, 83_819_683, 167_639_366)
    );
    // Every shard stays under the limit, in f32 too (the Hub stores the transformer in f32:
    // 24,619,634,944 bytes of tensor data).
    let f32 = Spec {
        dtype: WeightDtype::F32,
        ..Spec::real()
    };
    let plans = synthetic::plan_components(&f32);
    let tr = plans.iter().find(|p| p.component == "transformer").unwrap();
    let data: u64 = tr.tensors.iter().map(|t| t.numel() * 4).sum();
    assert_eq!(data, 24_619_634_944);
    assert!(tr.files.len() > 1 && tr.index.is_some());
    for p in &plans {
        for f in &p.files {
            assert!(f.len - f.header.len() as u64 <= synthetic::MAX_SHARD_BYTES);
        }
    }
    // And the spec's names at the real depth, without writing anything.
    for p in synthetic::plan_components(&Spec::real()) {
        let got: Shapes = p
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        let want = match p.component {
            "text_encoder" => spec_text_encoder(36),
            "transformer" => spec_transformer(30, 2),
            _ => spec_vae(),
        };
        let diff = differences(p.component, &got, &want);
        assert!(diff.is_empty(), "{}", diff.join("\n"));
    }
}

/// The synthetic FLUX.2 [klein] at the real depths has klein-spec §10's parameter counts:
/// transformer 4B 3,875,544,576 in 169 tensors, 9B 9,078,581,248 in 233; the VAE 84,046,371;
/// Qwen3-4B 4.02 G and Qwen3-8B 7.57 G parameters.
#[test]
fn real_klein_sizes_match_the_spec() {
    use synthetic::klein;
    for (size, transformer, tensors, text) in [
        (klein::KLEIN_4B, 3_875_544_576u64, 169, 4_022_468_096u64),
        (klein::KLEIN_9B, 9_078_581_248, 233, 7_568_405_504),
    ] {
        let spec = klein::KleinSpec {
            size,
            dtype: WeightDtype::Bf16,
            seed: 0,
        };
        let plan = klein::plan(&spec);
        let tr = plan.component("transformer").unwrap();
        assert_eq!((tr.params, tr.tensors), (transformer, tensors));
        assert_eq!(plan.component("vae").unwrap().params, 84_046_371);
        assert_eq!(plan.component("text_encoder").unwrap().params, text);
    }
}

#[test]
fn shallow_model_has_the_spec_tensors_and_generates_through_the_store() {
    let total = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    let spec = Spec {
        layers: 1,
        refiner_layers: 1,
        text_layers: 2,
        dtype: WeightDtype::Bf16,
        seed: 7,
    };

    // 1. Write it (no fsync: the directory is gone at the end of the test).
    let t = Instant::now();
    let (summary, timing) =
        synthetic::write_with(&model, &spec, &synthetic::Options { sync: false }).unwrap();
    eprintln!(
        "wrote {:.2} GB in {:.1} s ({:.2} GB/s)\n{summary}",
        summary.file_bytes() as f64 / 1e9,
        t.elapsed().as_secs_f64(),
        summary.file_bytes() as f64 / 1e9 / timing.total_s
    );
    assert_eq!(summary, synthetic::plan(&spec));
    // A second write into the same directory is refused rather than mixing two models.
    let again = synthetic::write(&model, &spec).unwrap_err().to_string();
    assert!(again.contains("not empty"), "{again}");

    // 2. Every tensor, by name and shape, as the spec lists it (the index checked on opening).
    let dir = DiffusersDir::open(&model).unwrap();
    let mut diff = Vec::new();
    for (component, want) in [
        ("text_encoder", spec_text_encoder(spec.text_layers)),
        (
            "transformer",
            spec_transformer(spec.layers, spec.refiner_layers),
        ),
        ("vae", spec_vae()),
    ] {
        let tensors = &dir.tensors[component];
        assert!(tensors
            .iter()
            .all(|t| t.info.dtype == zimage::safetensors::Dtype::BF16));
        let got: Shapes = tensors
            .iter()
            .map(|t| (t.name.clone(), t.info.shape.clone()))
            .collect();
        assert_eq!(got.len(), tensors.len(), "{component}: duplicate names");
        diff.extend(differences(component, &got, &want));
        let files = tensors
            .iter()
            .map(|t| &t.file)
            .collect::<std::collections::BTreeSet<_>>();
        let s = summary.component(component).unwrap();
        assert_eq!((s.tensors, s.files), (got.len(), files.len()));
        let on_disk: u64 = files.iter().map(|f| f.metadata().unwrap().len()).sum();
        assert_eq!(s.file_bytes, on_disk, "{component}");
    }
    assert!(diff.is_empty(), "{}", diff.join("\n"));
    let count = |c: &str, prefix: &str| {
        dir.tensors[c]
            .iter()
            .filter(|t| t.name.starts_with(prefix))
            .count()
    };
    assert_eq!(dir.tensors["transformer"].len(), 15 + 15 + 15 + 13);
    assert_eq!(count("transformer", "layers.0."), 15);
    assert_eq!(count("transformer", "context_refiner.0."), 13);
    assert_eq!(dir.tensors["text_encoder"].len(), 1 + 2 * 11 + 1);
    assert_eq!(count("text_encoder", "model.layers.1."), 11);
    assert_eq!(dir.tensors["vae"].len(), 244);
    assert!(model
        .join("text_encoder/model.safetensors.index.json")
        .is_file());
    assert!(model
        .join("transformer/diffusion_pytorch_model.safetensors")
        .is_file());

    // 3. Configs: the real values, depth from the spec, accepted by the loader's own parsers.
    let json = |rel: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(model.join(rel)).unwrap()).unwrap()
    };
    let tr_cfg = json("transformer/config.json");
    let te_cfg = json("text_encoder/config.json");
    let vae_cfg = json("vae/config.json");
    let sch_cfg = json("scheduler/scheduler_config.json");
    assert_eq!(tr_cfg["dim"], 3840);
    assert_eq!(tr_cfg["n_layers"], 1);
    assert_eq!(tr_cfg["n_refiner_layers"], 1);
    assert_eq!(tr_cfg["axes_lens"], serde_json::json!([1536, 512, 512]));
    assert_eq!(te_cfg["num_hidden_layers"], 2);
    assert_eq!(te_cfg["tie_word_embeddings"], true);
    assert_eq!(
        vae_cfg["block_out_channels"],
        serde_json::json!([128, 256, 512, 512])
    );
    assert_eq!(sch_cfg["shift"], 3.0);
    serde_json::from_value::<zimage::families::zimage::DitConfig>(tr_cfg)
        .unwrap()
        .validate()
        .unwrap();
    serde_json::from_value::<zimage::models::Qwen3Config>(te_cfg)
        .unwrap()
        .validate()
        .unwrap();
    serde_json::from_value::<zimage::models::VaeConfig>(vae_cfg)
        .unwrap()
        .validate()
        .unwrap();
    let sch: zimage::scheduler::SchedulerConfig = serde_json::from_value(sch_cfg).unwrap();
    assert!(!sch.use_dynamic_shifting);
    assert_eq!(json("model_index.json")["_class_name"], "ZImagePipeline");
    for f in ["vocab.json", "merges.txt", "tokenizer_config.json"] {
        assert_eq!(
            std::fs::read(model.join("tokenizer").join(f)).unwrap(),
            std::fs::read(synthetic::tokenizer_source().join(f)).unwrap(),
            "{f}"
        );
    }

    // 4. Values: uniform matrices with std 1/sqrt(fan_in), ones and zeros, and the same bytes
    //    whichever chunk produced them.
    let q = "model.layers.0.self_attn.q_proj.weight";
    let v = bf16_values(&read_elems(&dir, "text_encoder", q, 0, 1 << 20));
    let mean = v.iter().map(|x| *x as f64).sum::<f64>() / v.len() as f64;
    let std = (v.iter().map(|x| (*x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
    let want = 1.0 / 2560f64.sqrt();
    assert!(mean.abs() < 0.01 * want, "mean {mean}");
    assert!((std / want - 1.0).abs() < 0.01, "std {std}, want {want}");
    let bound = want * 3f64.sqrt() * 1.01;
    assert!(v.iter().all(|x| (*x as f64).abs() <= bound));
    let w2 = "layers.0.feed_forward.w2.weight";
    let v = bf16_values(&read_elems(&dir, "transformer", w2, 0, 1 << 16));
    let std = (v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
    assert!((std * 10240f64.sqrt() - 1.0).abs() < 0.03, "std {std}");
    for (c, name, value) in [
        ("text_encoder", "model.norm.weight", 1.0),
        ("transformer", "layers.0.attention.norm_q.weight", 1.0),
        ("transformer", "t_embedder.mlp.0.bias", 0.0),
        ("vae", "decoder.conv_norm_out.bias", 0.0),
    ] {
        let n = dir.tensors[c]
            .iter()
            .find(|t| t.name == name)
            .unwrap()
            .info
            .numel();
        let v = bf16_values(&read_elems(&dir, c, name, 0, n));
        assert!(v.iter().all(|x| *x == value), "{name}");
    }
    let pad = bf16_values(&read_elems(&dir, "transformer", "x_pad_token", 0, 3840));
    assert!(pad.iter().any(|x| *x != 0.0) && pad.iter().all(|x| x.abs() < 0.04));
    // Across the boundary between two work chunks of the embedding table.
    let embed = synthetic::text_encoder_tensors(&spec).remove(0);
    let (start, n) = ((1 << 21) - 8, 16);
    assert_eq!(
        read_elems(&dir, "text_encoder", &embed.name, start, n),
        synthetic::tensor_bytes(&spec, "text_encoder", &embed, start, n)
    );

    // 5. Import with int4, then generate one step at 64×64.
    let store = tmp.path().join("store");
    let t = Instant::now();
    let out = zimage_in(
        &store,
        &["create", "synth", "--from", s(&model), "--quantize", "int4"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("imported with int4 in {:.1} s", t.elapsed().as_secs_f64());
    std::fs::remove_dir_all(&model).unwrap();
    let png = tmp.path().join("fox.png");
    let t = Instant::now();
    let out = zimage_in(
        &store,
        &[
            "generate",
            "a fox",
            "--model",
            "synth",
            "--width",
            "64",
            "--height",
            "64",
            "--steps",
            "1",
            "-o",
            s(&png),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("generated in {:.1} s", t.elapsed().as_secs_f64());
    let img = image::open(&png).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (64, 64));
    // Not one flat colour: a NaN or an infinity anywhere upstream ends as a constant image.
    let px = img.into_raw();
    let (lo, hi) = (px.iter().min().unwrap(), px.iter().max().unwrap());
    assert!(hi - lo > 16, "pixel range {lo}..{hi}");
    eprintln!("total {:.1} s", total.elapsed().as_secs_f64());
}

/// FLUX.3 [klein]'s transformer tensors as flux3-klein-spec §10.1 lists them (D 3072, M 9216,
/// text features 20480, 128-channel tokens; no biases), for `modes` blocks per mode and
/// `joint` joint blocks.
fn spec_flux3_transformer(modes: u32, joint: u32, flow_map: bool) -> Shapes {
    let (d, m) = (3072, 9216);
    let mut s = Shapes::new();
    for (n, shape) in [
        ("x_embedders.image.weight", vec![d, 128]),
        ("x_embedders.image_cond.weight", vec![d, 128]),
        ("context_embedder.weight", vec![d, 20480]),
        ("timestep_embedder.linear_1.weight", vec![d, 256]),
        ("timestep_embedder.linear_2.weight", vec![d, d]),
        ("norm_out.linear.weight", vec![2 * d, d]),
        ("proj_out.weight", vec![128, d]),
    ] {
        s.insert(n.into(), shape);
    }
    if flow_map {
        s.insert(
            "target_timestep_embedder.linear_1.weight".into(),
            vec![d, 256],
        );
        s.insert(
            "target_timestep_embedder.linear_2.weight".into(),
            vec![d, d],
        );
    }
    for stage in ["early_stream_modulations", "single_stream_modulations"] {
        for mode in ["image", "image_cond", "txt"] {
            s.insert(format!("{stage}.{mode}.linear.weight"), vec![3 * d, d]);
        }
    }
    let blocks = (0..modes)
        .flat_map(|b| {
            [
                format!("mode_blocks.image.{b}"),
                format!("mode_blocks.image_cond.{b}"),
                format!("txt_mode_blocks.{b}"),
            ]
        })
        .chain((0..joint).map(|b| format!("single_transformer_blocks.{b}")));
    for p in blocks {
        for (n, shape) in [
            ("attn.to_q.weight", vec![d, d]),
            ("attn.to_k.weight", vec![d, d]),
            ("attn.to_v.weight", vec![d, d]),
            ("attn.to_out.0.weight", vec![d, d]),
            ("attn.norm_q.weight", vec![128]),
            ("attn.norm_k.weight", vec![128]),
            ("ff.linear_in.weight", vec![2 * m, d]),
            ("ff.linear_out.weight", vec![d, m]),
        ] {
            s.insert(format!("{p}.{n}"), shape);
        }
    }
    s
}

/// Qwen3-VL-4B's language model as a `Qwen3VLForConditionalGeneration` save names it
/// (flux3-klein-spec §1.4): the Qwen3-4B tensors under `model.language_model.`.
fn spec_flux3_text_encoder(layers: u32) -> Shapes {
    (spec_text_encoder(layers).into_iter())
        .map(|(n, shape)| {
            let rest = n.strip_prefix("model.").unwrap();
            (format!("model.language_model.{rest}"), shape)
        })
        .collect()
}

/// `(path, bytes)` of a FLUX.3 spec's config files, as the import's last check reads them.
fn flux3_configs(spec: &synthetic::flux3::Flux3Spec) -> Vec<(String, Vec<u8>)> {
    (synthetic::flux3::config_files(spec).into_iter())
        .map(|(p, text)| (p, text.into_bytes()))
        .collect()
}

/// The synthetic FLUX.3 [klein] at the real depth has flux3-klein-spec §1.3–1.5's counts: the
/// transformer 359 tensors and 5,548,681,984 parameters as a flow map, 357 and 5,538,458,368
/// as the base model, every name and shape of §10.1; Qwen3-VL-4B's language model 398 tensors
/// and 4,022,468,096 parameters, of which the embedding and layers 0–31 (what FLUX.3 runs)
/// are 3,618,742,272; FLUX.2's VAE 84,046,371. Its configs pass FLUX.3's import check and its
/// modular index names the family.
#[test]
fn real_flux3_sizes_match_the_spec() {
    use synthetic::flux3;
    for (flow_map, tensors, params) in [(true, 359, 5_548_681_984u64), (false, 357, 5_538_458_368)]
    {
        let spec = flux3::Flux3Spec {
            size: flux3::FLUX3_KLEIN,
            flow_map,
            dtype: WeightDtype::Bf16,
            seed: 0,
        };
        let plan = flux3::plan(&spec);
        let tr = plan.component("transformer").unwrap();
        assert_eq!(
            (tr.tensors, tr.params),
            (tensors, params),
            "flow map {flow_map}"
        );
        let te = plan.component("text_encoder").unwrap();
        assert_eq!((te.tensors, te.params), (398, 4_022_468_096));
        assert_eq!(plan.component("vae").unwrap().params, 84_046_371);
        let read: u64 = (flux3::text_encoder_tensors(&spec.size).iter())
            .filter(|t| {
                let n = t.name.strip_prefix("model.language_model.").unwrap();
                let layer = n
                    .strip_prefix("layers.")
                    .map(|r| r.split('.').next().unwrap().parse::<u32>().unwrap());
                n.starts_with("embed_tokens.") || layer.is_some_and(|l| l < 32)
            })
            .map(|t| t.numel())
            .sum();
        assert_eq!(read, 3_618_742_272);
        for p in flux3::plan_components(&spec) {
            let got: Shapes = (p.tensors.iter())
                .map(|t| (t.name.clone(), t.shape.clone()))
                .collect();
            assert_eq!(
                got.len(),
                p.tensors.len(),
                "{}: duplicate names",
                p.component
            );
            let want = match p.component {
                "text_encoder" => spec_flux3_text_encoder(36),
                "transformer" => spec_flux3_transformer(5, 28, flow_map),
                _ => continue,
            };
            let diff = differences(p.component, &got, &want);
            assert!(diff.is_empty(), "{}", diff.join("\n"));
        }

        // The configs: what the import checks of the three together, and each as read.
        let configs = flux3_configs(&spec);
        zimage::families::flux3_klein::configs::check_files(&configs).unwrap();
        let config = |path: &str| -> serde_json::Value {
            let (_, bytes) = configs.iter().find(|(p, _)| p == path).unwrap();
            serde_json::from_slice(bytes).unwrap()
        };
        let t: zimage::families::flux3_klein::Flux3Config =
            serde_json::from_value(config("transformer/config.json")).unwrap();
        t.validate().unwrap();
        assert_eq!((t.dim(), t.mlp_dim(), t.flow_map), (3072, 9216, flow_map));
        assert_eq!((t.num_layers, t.num_single_layers), (5, 28));
        let te = config("text_encoder/config.json");
        assert_eq!(te["architectures"][0], "Qwen3VLForConditionalGeneration");
        assert_eq!(te["text_config"]["num_hidden_layers"], 36);
        let index = zimage::diffusers_dir::classic_index(
            &serde_json::to_vec(&config("modular_model_index.json")).unwrap(),
        )
        .unwrap();
        let family = zimage::families::Family::from_model_index(&index).unwrap();
        assert_eq!(family.name(), "FLUX.3 [klein]");
        let class = config("modular_model_index.json")["_class_name"].clone();
        let want = match flow_map {
            true => "Flux3DistilledModularPipeline",
            false => "Flux3ModularPipeline",
        };
        assert_eq!(class, want);
    }
}

/// A shallow FLUX.3 at the real widths, written: one joint block, no mode blocks, two text
/// layers (the fewest a Qwen3 config may state; 2.1 GB, deleted at the end). The directory opens in the modular layout with the
/// spec's names and shapes, FLUX.3's transformer binds every tensor at the real widths, and the
/// import's config check asks only for the text encoder's depth (FLUX.3 reads the hidden state
/// after layer 32, so an importable text encoder alone is 7.2 GB).
#[test]
fn shallow_flux3_opens_in_the_modular_layout_and_binds_at_the_real_widths() {
    use synthetic::flux3;
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    let spec = flux3::Flux3Spec {
        size: flux3::Size {
            mode_layers: 0,
            single_layers: 1,
            text_layers: 2,
            ..flux3::FLUX3_KLEIN
        },
        flow_map: true,
        dtype: WeightDtype::Bf16,
        seed: 3,
    };
    let t = Instant::now();
    let (summary, _) =
        flux3::write_with(&model, &spec, &synthetic::Options { sync: false }).unwrap();
    eprintln!(
        "wrote {:.2} GB in {:.1} s\n{summary}",
        summary.file_bytes() as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    assert_eq!(summary, flux3::plan(&spec));

    // The layout: a modular index read as the classic one, no scheduler (the blocks' default),
    // the tiny FLUX.3's tokenizer with Qwen3-VL's processor files.
    assert!(model.join("modular_model_index.json").is_file());
    assert!(!model.join("model_index.json").exists() && !model.join("scheduler").exists());
    for f in ["vocab.json", "merges.txt", "chat_template.json"] {
        assert_eq!(
            std::fs::read(model.join("tokenizer").join(f)).unwrap(),
            std::fs::read(flux3::tokenizer_source().join(f)).unwrap(),
            "{f}"
        );
    }
    let dir = DiffusersDir::open(&model).unwrap();
    let family = zimage::families::Family::from_model_index(dir.index.as_ref().unwrap()).unwrap();
    assert_eq!(family.name(), "FLUX.3 [klein]");
    let mut diff = Vec::new();
    for (component, want) in [
        ("text_encoder", spec_flux3_text_encoder(2)),
        ("transformer", spec_flux3_transformer(0, 1, true)),
    ] {
        let got: Shapes = (dir.tensors[component].iter())
            .map(|t| (t.name.clone(), t.info.shape.clone()))
            .collect();
        diff.extend(differences(component, &got, &want));
    }
    assert!(diff.is_empty(), "{}", diff.join("\n"));
    assert_eq!(
        dir.tensors["vae"].len(),
        summary.component("vae").unwrap().tensors
    );

    // The transformer binds at the real widths, as `generate` builds it.
    let config = std::fs::read(model.join("transformer/config.json")).unwrap();
    let cfg: zimage::families::flux3_klein::Flux3Config = serde_json::from_slice(&config).unwrap();
    use zimage::pipeline::ModelSource;
    let weights = dir.component("transformer").unwrap();
    let ckpt =
        zimage::models::Checkpoint::new("transformer", weights.tensors, zimage::mlx::Dtype::BF16);
    zimage::families::flux3_klein::Flux3Transformer::new(&cfg, ckpt).unwrap();

    // The import's config check: everything but the text encoder's depth.
    let err =
        zimage::families::flux3_klein::configs::check_files(&flux3_configs(&spec)).unwrap_err();
    assert!(
        err.contains("`text_config.num_hidden_layers` is 2"),
        "{err}"
    );
    let deep = flux3::Flux3Spec {
        size: flux3::Size {
            text_layers: 32,
            ..spec.size
        },
        ..spec.clone()
    };
    zimage::families::flux3_klein::configs::check_files(&flux3_configs(&deep)).unwrap();
}

/// FLUX.1's transformer tensors in diffusers' names as flux1-spec §11 lists them, with the
/// shapes of its "Diffusers shapes" paragraph (D 3072, MLP 12288; every linear with a bias),
/// for `double` double- and `single` single-stream blocks; the guidance embedder with
/// `guidance`.
fn spec_flux1_transformer(double: u32, single: u32, guidance: bool) -> Shapes {
    let (d, m) = (3072u64, 12288u64);
    let mut s = Shapes::new();
    let linear = |s: &mut Shapes, name: &str, out: u64, inp: u64| {
        s.insert(format!("{name}.weight"), vec![out, inp]);
        s.insert(format!("{name}.bias"), vec![out]);
    };
    let te = "time_text_embed";
    linear(&mut s, &format!("{te}.timestep_embedder.linear_1"), d, 256);
    linear(&mut s, &format!("{te}.timestep_embedder.linear_2"), d, d);
    linear(&mut s, &format!("{te}.text_embedder.linear_1"), d, 768);
    linear(&mut s, &format!("{te}.text_embedder.linear_2"), d, d);
    if guidance {
        linear(&mut s, &format!("{te}.guidance_embedder.linear_1"), d, 256);
        linear(&mut s, &format!("{te}.guidance_embedder.linear_2"), d, d);
    }
    linear(&mut s, "context_embedder", d, 4096);
    linear(&mut s, "x_embedder", d, 64);
    linear(&mut s, "norm_out.linear", 2 * d, d);
    linear(&mut s, "proj_out", 64, d);
    for b in 0..double {
        let p = format!("transformer_blocks.{b}");
        linear(&mut s, &format!("{p}.norm1.linear"), 6 * d, d);
        linear(&mut s, &format!("{p}.norm1_context.linear"), 6 * d, d);
        for n in [
            "to_q",
            "to_k",
            "to_v",
            "add_q_proj",
            "add_k_proj",
            "add_v_proj",
            "to_out.0",
            "to_add_out",
        ] {
            linear(&mut s, &format!("{p}.attn.{n}"), d, d);
        }
        for n in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
            s.insert(format!("{p}.attn.{n}.weight"), vec![128]);
        }
        for ff in ["ff", "ff_context"] {
            linear(&mut s, &format!("{p}.{ff}.net.0.proj"), m, d);
            linear(&mut s, &format!("{p}.{ff}.net.2"), d, m);
        }
    }
    for b in 0..single {
        let p = format!("single_transformer_blocks.{b}");
        linear(&mut s, &format!("{p}.norm.linear"), 3 * d, d);
        for n in ["to_q", "to_k", "to_v"] {
            linear(&mut s, &format!("{p}.attn.{n}"), d, d);
        }
        for n in ["norm_q", "norm_k"] {
            s.insert(format!("{p}.attn.{n}.weight"), vec![128]);
        }
        linear(&mut s, &format!("{p}.proj_mlp"), m, d);
        linear(&mut s, &format!("{p}.proj_out"), d, d + m);
    }
    s
}

/// CLIP-L's text tower as flux1-spec §2.3 names it, `layers` deep.
fn spec_flux1_clip(layers: u32) -> Shapes {
    let mut s = Shapes::new();
    let e = "text_model.embeddings";
    s.insert(format!("{e}.token_embedding.weight"), vec![49408, 768]);
    s.insert(format!("{e}.position_embedding.weight"), vec![77, 768]);
    for l in 0..layers {
        let p = format!("text_model.encoder.layers.{l}");
        for (n, out, inp) in [
            ("self_attn.q_proj", 768, 768),
            ("self_attn.k_proj", 768, 768),
            ("self_attn.v_proj", 768, 768),
            ("self_attn.out_proj", 768, 768),
            ("mlp.fc1", 3072, 768),
            ("mlp.fc2", 768, 3072),
        ] {
            s.insert(format!("{p}.{n}.weight"), vec![out, inp]);
            s.insert(format!("{p}.{n}.bias"), vec![out]);
        }
        for n in ["layer_norm1", "layer_norm2"] {
            s.insert(format!("{p}.{n}.weight"), vec![768]);
            s.insert(format!("{p}.{n}.bias"), vec![768]);
        }
    }
    s.insert("text_model.final_layer_norm.weight".into(), vec![768]);
    s.insert("text_model.final_layer_norm.bias".into(), vec![768]);
    s
}

/// T5 v1.1 XXL's encoder as flux1-spec §3.6 names it, `layers` deep: the tied table once, as
/// `shared.weight`.
fn spec_flux1_t5(layers: u32) -> Shapes {
    let mut s = Shapes::new();
    s.insert("shared.weight".into(), vec![32128, 4096]);
    for b in 0..layers {
        let p = format!("encoder.block.{b}.layer");
        for n in ["q", "k", "v", "o"] {
            s.insert(format!("{p}.0.SelfAttention.{n}.weight"), vec![4096, 4096]);
        }
        s.insert(format!("{p}.0.layer_norm.weight"), vec![4096]);
        for n in ["wi_0", "wi_1"] {
            s.insert(
                format!("{p}.1.DenseReluDense.{n}.weight"),
                vec![10240, 4096],
            );
        }
        s.insert(format!("{p}.1.DenseReluDense.wo.weight"), vec![4096, 10240]);
        s.insert(format!("{p}.1.layer_norm.weight"), vec![4096]);
    }
    if layers > 0 {
        s.insert(
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight".into(),
            vec![32, 64],
        );
    }
    s.insert("encoder.final_layer_norm.weight".into(), vec![4096]);
    s
}

/// The parameters of a set of shapes.
fn params_of(shapes: &Shapes) -> u64 {
    shapes.values().map(|s| s.iter().product::<u64>()).sum()
}

/// `(path, bytes)` of a FLUX.1 spec's config files, as the import's last check reads them.
fn flux1_configs(spec: &synthetic::flux1::Flux1Spec) -> Vec<(String, Vec<u8>)> {
    (synthetic::flux1::config_files(spec).into_iter())
        .map(|(p, text)| (p, text.into_bytes()))
        .collect()
}

/// The synthetic FLUX.1 at the real depths has flux1-spec §1.2–1.6's counts, computed from the
/// spec's shapes without writing anything: the transformer 1160 tensors and 11,901,408,320
/// parameters for \[dev\] and Kontext, 1156 and 11,891,178,560 for \[schnell\] (a double
/// block 339,831,296, a single block 141,591,808, the rest of \[dev\]'s 64,124,992); CLIP-L
/// 196 tensors and 123,060,480; T5-XXL's encoder 4,762,310,656 with its tied table counted once
/// (`shared.weight`; `encoder.embed_tokens.weight` is not saved again); the VAE 244 and
/// 83,819,683. Every name and shape is the spec's; the configs pass FLUX.1's import check, and
/// the index names the family and each variant's pipeline and scheduler.
#[test]
fn real_flux1_sizes_match_the_spec() {
    use synthetic::flux1::{self, Flux1Spec, Variant};
    // The spec's block and top-level figures, from its shapes.
    let double = params_of(&spec_flux1_transformer(1, 0, true))
        - params_of(&spec_flux1_transformer(0, 0, true));
    let single = params_of(&spec_flux1_transformer(0, 1, true))
        - params_of(&spec_flux1_transformer(0, 0, true));
    assert_eq!(double, 339_831_296);
    assert_eq!(single, 141_591_808);
    assert_eq!(params_of(&spec_flux1_transformer(0, 0, true)), 64_124_992);
    assert_eq!(params_of(&spec_flux1_t5(24)), 4_762_310_656);
    for (variant, tensors, params) in [
        (Variant::Dev, 1160, 11_901_408_320u64),
        (Variant::Schnell, 1156, 11_891_178_560),
        (Variant::Kontext, 1160, 11_901_408_320),
    ] {
        let spec = Flux1Spec::real(variant);
        let plan = flux1::plan(&spec);
        let count = |c: &str| {
            let s = plan.component(c).unwrap();
            (s.tensors, s.params)
        };
        assert_eq!(count("transformer"), (tensors, params), "{variant:?}");
        assert_eq!(count("text_encoder"), (196, 123_060_480));
        assert_eq!(count("text_encoder_2"), (219, 4_762_310_656));
        assert_eq!(count("vae"), (244, 83_819_683));
        // bf16 throughout: two bytes a parameter.
        assert_eq!(plan.data_bytes(), 2 * plan.params());
        for p in flux1::plan_components(&spec) {
            let got: Shapes = (p.tensors.iter())
                .map(|t| (t.name.clone(), t.shape.clone()))
                .collect();
            assert_eq!(
                got.len(),
                p.tensors.len(),
                "{}: duplicate names",
                p.component
            );
            let want = match p.component {
                "text_encoder" => spec_flux1_clip(12),
                "text_encoder_2" => spec_flux1_t5(24),
                "transformer" => spec_flux1_transformer(19, 38, variant.guidance()),
                _ => spec_vae(),
            };
            let diff = differences(p.component, &got, &want);
            assert!(diff.is_empty(), "{}", diff.join("\n"));
        }

        // The configs: what the import checks of the five together, and each as read.
        let configs = flux1_configs(&spec);
        zimage::families::flux1::configs::check_files(&configs).unwrap();
        let config = |path: &str| -> serde_json::Value {
            let (_, bytes) = configs.iter().find(|(p, _)| p == path).unwrap();
            serde_json::from_slice(bytes).unwrap()
        };
        let t: zimage::families::flux1::Flux1Config =
            serde_json::from_value(config("transformer/config.json")).unwrap();
        t.validate().unwrap();
        assert_eq!((t.dim(), t.mlp_dim()), (3072, 12288));
        assert_eq!((t.num_layers, t.num_single_layers), (19, 38));
        assert_eq!(t.guidance_embeds, variant != Variant::Schnell);
        let clip: zimage::models::ClipTextConfig =
            serde_json::from_value(config("text_encoder/config.json")).unwrap();
        clip.validate().unwrap();
        assert_eq!(
            (
                clip.vocab_size,
                clip.num_hidden_layers,
                clip.max_position_embeddings
            ),
            (49408, 12, 77)
        );
        let t5: zimage::models::T5Config =
            serde_json::from_value(config("text_encoder_2/config.json")).unwrap();
        t5.validate().unwrap();
        assert_eq!(
            (t5.vocab_size, t5.num_layers, t5.d_model),
            (32128, 24, 4096)
        );
        let sch = config("scheduler/scheduler_config.json");
        let dynamic = variant != Variant::Schnell;
        assert_eq!(sch["use_dynamic_shifting"], dynamic);
        assert_eq!(sch["shift"], if dynamic { 3.0 } else { 1.0 });
        for (key, value) in [
            ("base_shift", 0.5),
            ("max_shift", 1.15),
            ("base_image_seq_len", 256.0),
            ("max_image_seq_len", 4096.0),
        ] {
            assert_eq!(sch[key].as_f64(), Some(value), "{key}");
        }
        let index = config("model_index.json");
        let family =
            zimage::families::Family::from_model_index(&serde_json::to_vec(&index).unwrap())
                .unwrap();
        assert_eq!(family.name(), "FLUX.1");
        let class = match variant {
            Variant::Kontext => "FluxKontextPipeline",
            _ => "FluxPipeline",
        };
        assert_eq!(index["_class_name"], class);
        for (component, class) in [
            ("text_encoder", "CLIPTextModel"),
            ("text_encoder_2", "T5EncoderModel"),
            ("tokenizer", "CLIPTokenizer"),
            ("tokenizer_2", "T5TokenizerFast"),
            ("transformer", "FluxTransformer2DModel"),
            ("vae", "AutoencoderKL"),
        ] {
            assert_eq!(index[component][1], class, "{component}");
        }
    }
}

/// `zimage show NAME`'s lines for a model of the store.
fn shown(store: &std::path::Path, name: &str) -> String {
    let out = zimage_in(store, &["show", name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Megabytes of a figure `show` writes (`972 MB`, `8.10 GB`) at the start of `text`.
fn shown_megabytes(text: &str) -> f64 {
    let mut words = text.split_whitespace();
    let n: f64 = words.next().unwrap().parse().unwrap();
    match words.next().unwrap().trim_end_matches([',', ';']) {
        "GB" => n * 1000.0,
        "MB" => n,
        unit => panic!("`{unit}` is not a unit: {text}"),
    }
}

/// A shallow FLUX.1 at the real widths of each variant (one single-stream block, one CLIP
/// layer, one T5 block, and for \[schnell\] one double-stream block; bf16, 2.0 and 1.1 GB,
/// deleted at the end; Kontext is \[dev\]'s files under its own index): written, its names and
/// shapes the spec's and its stand-in tokenizers in place (CLIP's window the real 77), read by
/// the pipeline; imported (\[schnell\] in int4, the others as stored), `show` names the
/// family, the kind and the run-time memory at 1024²; \[schnell\] draws a 64×64 picture in one
/// step from the store.
#[test]
fn shallow_flux1_imports_shows_its_kind_and_memory_and_generates() {
    use synthetic::flux1::{self, Flux1Spec, Variant};
    use zimage::pipeline::ModelSource;
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let mut figures = Vec::new();
    for (variant, name, kind, double, quantize) in [
        (Variant::Schnell, "schnell", "[schnell]", 1, true),
        (Variant::Dev, "dev", "[dev]", 0, false),
        (Variant::Kontext, "kontext", "Kontext [dev]", 0, false),
    ] {
        let model = tmp.path().join(name);
        let size = flux1::Size {
            double_layers: double,
            single_layers: 1,
            clip_layers: 1,
            t5_layers: 1,
        };
        let spec = Flux1Spec {
            variant,
            size,
            dtype: WeightDtype::Bf16,
            seed: 5,
        };
        if variant == Variant::Kontext {
            // [dev]'s files under the editing pipeline: its weights linked, its configs the
            // writer's.
            common::copy_model(&tmp.path().join("dev"), &model);
            for (path, text) in flux1::config_files(&spec) {
                std::fs::write(model.join(path), text).unwrap();
            }
        } else {
            let t = Instant::now();
            let (summary, _) =
                flux1::write_with(&model, &spec, &synthetic::Options { sync: false }).unwrap();
            eprintln!(
                "{name}: wrote {:.2} GB in {:.1} s\n{summary}",
                summary.file_bytes() as f64 / 1e9,
                t.elapsed().as_secs_f64()
            );
            assert_eq!(summary, flux1::plan(&spec));
        }

        // The layout: every component's names and shapes, T5 sharded with its index.
        let dir = DiffusersDir::open(&model).unwrap();
        let mut diff = Vec::new();
        for (component, want) in [
            ("text_encoder", spec_flux1_clip(1)),
            ("text_encoder_2", spec_flux1_t5(1)),
            (
                "transformer",
                spec_flux1_transformer(double, 1, variant.guidance()),
            ),
            ("vae", spec_vae()),
        ] {
            let got: Shapes = (dir.tensors[component].iter())
                .map(|t| (t.name.clone(), t.info.shape.clone()))
                .collect();
            diff.extend(differences(component, &got, &want));
        }
        assert!(diff.is_empty(), "{}", diff.join("\n"));
        assert!(model
            .join("text_encoder_2/model.safetensors.index.json")
            .is_file());
        // The stand-in tokenizers, CLIP's window the real one.
        for (folder, source) in flux1::tokenizer_sources() {
            for f in ["vocab.json", "merges.txt", "tokenizer.json", "spiece.model"] {
                if source.join(f).is_file() {
                    assert_eq!(
                        std::fs::read(model.join(folder).join(f)).unwrap(),
                        std::fs::read(source.join(f)).unwrap(),
                        "{folder}/{f}"
                    );
                }
            }
        }
        let clip_tok: serde_json::Value = serde_json::from_slice(
            &std::fs::read(model.join("tokenizer/tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(clip_tok["model_max_length"], 77);

        // The pipeline reads it: the configs fit, both tokenizers load, CLIP's ids fill its
        // window, the transformer binds at the real widths.
        let p =
            zimage::families::flux1::Flux1Pipeline::new(&dir, zimage::mlx::Dtype::BF16).unwrap();
        assert_eq!(p.clip_ids("a red fox").unwrap().len(), 77);
        assert_eq!(p.configs.kontext, variant == Variant::Kontext);
        drop(p.load_transformer().unwrap());
        let weights = dir.component("text_encoder_2").unwrap();
        assert_eq!(weights.tensors.len(), spec_flux1_t5(1).len());

        // Imported, `show` names the family, the kind and the memory at the VAE's 1024².
        let mut args = vec!["create", name, "--from", s(&model)];
        if quantize {
            args.extend(["--quantize", "int4"]);
        }
        let t = Instant::now();
        let out = zimage_in(&store, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{name}: imported in {:.1} s", t.elapsed().as_secs_f64());
        // Kontext's links read [dev]'s files; the largest model goes at once.
        if variant == Variant::Schnell {
            std::fs::remove_dir_all(&model).unwrap();
        }
        let text = shown(&store, name);
        eprintln!("{text}");
        assert!(
            text.contains(&format!("family      FLUX.1 ({kind})\n")),
            "{text}"
        );
        assert!(text.contains(&format!("({kind} model)")), "{text}");
        let memory = (text.lines())
            .find_map(|l| l.strip_prefix("run-time memory at 1024×1024 ("))
            .unwrap_or_else(|| panic!("no run-time memory line: {text}"));
        let figure = |after: &str| memory.split(after).nth(1).unwrap();
        let peaks = figure("estimated peak: ");
        let compute = shown_megabytes(peaks);
        let stored = shown_megabytes(peaks.split(", ").nth(1).unwrap());
        let needs = shown_megabytes(figure("the smallest budget that runs it: "));
        assert!(
            needs > 0.0 && needs <= compute.max(stored) * 1.01,
            "{memory}"
        );
        figures.push((name, needs));

        if variant == Variant::Schnell {
            let png = tmp.path().join("fox.png");
            let t = Instant::now();
            let out = zimage_in(
                &store,
                &[
                    "generate",
                    "a fox",
                    "--model",
                    name,
                    "--width",
                    "64",
                    "--height",
                    "64",
                    "--steps",
                    "1",
                    "-o",
                    s(&png),
                ],
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!("{name}: generated in {:.1} s", t.elapsed().as_secs_f64());
            let img = image::open(&png).unwrap().to_rgb8();
            assert_eq!(img.dimensions(), (64, 64));
            // Not one flat colour: a NaN or an infinity anywhere upstream ends as a constant
            // image.
            let px = img.into_raw();
            let (lo, hi) = (px.iter().min().unwrap(), px.iter().max().unwrap());
            assert!(hi - lo > 16, "pixel range {lo}..{hi}");
        }
    }
    // [dev] as stored holds more than [schnell] in int4, one block fewer and all; Kontext is
    // [dev]'s model (what each process held before loading may differ a little).
    let needs = |n: &str| figures.iter().find(|(m, _)| *m == n).unwrap().1;
    assert!(needs("dev") > needs("schnell"), "{figures:?}");
    assert!(
        (needs("dev") - needs("kontext")).abs() <= 20.0,
        "{figures:?}"
    );
}
