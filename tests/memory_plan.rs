//! The memory plan at the real Z-Image-Turbo, FLUX.2 \[klein\], FLUX.3 \[klein\] and FLUX.1
//! sizes (tensor sizes only, nothing allocated): the estimate per phase and residency, the
//! choices it makes under a budget, and the refusal's advice.

#[path = "../models/synthetic.rs"]
mod synthetic;

mod common;

use zimage::families::zimage::DitConfig;
use zimage::memory_plan::{ModelSizes, RequestShape, TensorSize};
use zimage::models::vae_tiling::{decoder_tensor_shapes, flux_vae_config};
use zimage::models::{Qwen3Config, Residency};

const GB: u64 = 1_000_000_000;

fn qwen3() -> Qwen3Config {
    serde_json::from_value(serde_json::json!({
        "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0
    }))
    .unwrap()
}

fn dit() -> DitConfig {
    serde_json::from_value(serde_json::json!({
        "all_patch_size": [2], "all_f_patch_size": [1], "in_channels": 16, "dim": 3840,
        "n_layers": 30, "n_refiner_layers": 2, "n_heads": 30, "norm_eps": 1e-5, "qk_norm": true,
        "cap_feat_dim": 2560, "rope_theta": 256.0, "t_scale": 1000.0,
        "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512]
    }))
    .unwrap()
}

fn tensor(name: String, shape: &[u64], bytes_per_value: u64) -> TensorSize {
    TensorSize {
        stored_bytes: shape.iter().product::<u64>() * bytes_per_value,
        name,
        shape: shape.to_vec(),
        packed: false,
    }
}

/// The real text encoder's tensors in bf16 (spec §2.6).
fn text_encoder() -> Vec<TensorSize> {
    let mut t = vec![tensor(
        "model.embed_tokens.weight".into(),
        &[151936, 2560],
        2,
    )];
    for i in 0..36 {
        let p = format!("model.layers.{i}");
        for (n, s) in [
            ("self_attn.q_proj.weight", &[4096u64, 2560][..]),
            ("self_attn.k_proj.weight", &[1024, 2560]),
            ("self_attn.v_proj.weight", &[1024, 2560]),
            ("self_attn.o_proj.weight", &[2560, 4096]),
            ("self_attn.q_norm.weight", &[128]),
            ("self_attn.k_norm.weight", &[128]),
            ("mlp.gate_proj.weight", &[9728, 2560]),
            ("mlp.up_proj.weight", &[9728, 2560]),
            ("mlp.down_proj.weight", &[2560, 9728]),
            ("input_layernorm.weight", &[2560]),
            ("post_attention_layernorm.weight", &[2560]),
        ] {
            t.push(tensor(format!("{p}.{n}"), s, 2));
        }
    }
    t.push(tensor("model.norm.weight".into(), &[2560], 2));
    t
}

/// The real transformer's tensors in bf16 (spec §3.1).
fn transformer() -> Vec<TensorSize> {
    let mut t = vec![
        tensor("cap_embedder.1.weight".into(), &[3840, 2560], 2),
        tensor("all_x_embedder.2-1.weight".into(), &[3840, 64], 2),
        tensor("t_embedder.mlp.0.weight".into(), &[1024, 256], 2),
        tensor("t_embedder.mlp.2.weight".into(), &[256, 1024], 2),
        tensor(
            "all_final_layer.2-1.adaLN_modulation.1.weight".into(),
            &[3840, 256],
            2,
        ),
        tensor("all_final_layer.2-1.linear.weight".into(), &[64, 3840], 2),
    ];
    let blocks = (0..30)
        .map(|i| format!("layers.{i}"))
        .chain((0..2).map(|i| format!("noise_refiner.{i}")))
        .chain((0..2).map(|i| format!("context_refiner.{i}")));
    for p in blocks {
        for n in ["to_q", "to_k", "to_v", "to_out.0"] {
            t.push(tensor(
                format!("{p}.attention.{n}.weight"),
                &[3840, 3840],
                2,
            ));
        }
        t.push(tensor(
            format!("{p}.feed_forward.w1.weight"),
            &[10240, 3840],
            2,
        ));
        t.push(tensor(
            format!("{p}.feed_forward.w3.weight"),
            &[10240, 3840],
            2,
        ));
        t.push(tensor(
            format!("{p}.feed_forward.w2.weight"),
            &[3840, 10240],
            2,
        ));
        if !p.starts_with("context") {
            t.push(tensor(
                format!("{p}.adaLN_modulation.0.weight"),
                &[15360, 256],
                2,
            ));
        }
        for n in [
            "attention_norm1",
            "attention_norm2",
            "ffn_norm1",
            "ffn_norm2",
        ] {
            t.push(tensor(format!("{p}.{n}.weight"), &[3840], 2));
        }
    }
    t
}

fn vae() -> Vec<TensorSize> {
    decoder_tensor_shapes(&flux_vae_config())
        .into_iter()
        .map(|(n, s)| {
            let s: Vec<u64> = s.iter().map(|&d| d as u64).collect();
            tensor(n, &s, 4)
        })
        .collect()
}

fn request(side: u32) -> RequestShape {
    RequestShape {
        width: side,
        height: side,
        prompt_tokens: 40,
        prompts: 1,
        reference_tokens: 0,
        compute_bytes: 4,
        encodes: None,
        graph: zimage::platform::Graph::Cpu,
        device: zimage::mlx::Device::Cpu,
    }
}

const BASE: u64 = 150_000_000;

/// The real model's sizes and configs, owned, for [`RealModel::sizes`].
struct RealModel {
    text_encoder: Vec<TensorSize>,
    transformer: Vec<TensorSize>,
    vae: Vec<TensorSize>,
    text_config: Qwen3Config,
    dit_config: DitConfig,
    vae_config: zimage::models::VaeConfig,
}

impl RealModel {
    fn new() -> RealModel {
        RealModel {
            text_encoder: text_encoder(),
            transformer: transformer(),
            vae: vae(),
            text_config: qwen3(),
            dit_config: dit(),
            vae_config: flux_vae_config(),
        }
    }

    fn sizes(&self) -> ModelSizes<'_> {
        ModelSizes {
            text_encoder: &self.text_encoder,
            transformer: &self.transformer,
            vae: &self.vae,
            text_config: (&self.text_config).into(),
            denoiser: zimage::families::zimage::denoiser(
                &self.dit_config,
                &self.text_config,
                &self.vae_config,
            ),
            vae_config: &self.vae_config,
            controlnet: &[],
        }
    }
}

#[test]
fn real_sizes_per_phase_and_residency() {
    let real = RealModel::new();
    let m = real.sizes();
    let tr = &real.transformer;
    // The transformer: 6.15 B parameters (spec), 24.6 GB in f32, 12.3 GB in bf16.
    let params: u64 = tr.iter().map(|t| t.shape.iter().product::<u64>()).sum();
    assert!((6_100_000_000..6_200_000_000).contains(&params), "{params}");
    let f32_weights = m.denoise_weights(Residency::Compute, 4);
    let bf16_weights = m.denoise_weights(Residency::Stored, 4);
    assert!((24 * GB..25 * GB).contains(&f32_weights), "{f32_weights}");
    assert!((12 * GB..13 * GB).contains(&bf16_weights), "{bf16_weights}");
    // The text encoder's last layer and norm are not loaded; its table stays bf16 either way.
    let text_stored = m.text_weights(Residency::Stored, 4);
    let used_layers = 35 * 100_925_440u64 * 2 + 151936 * 2560 * 2;
    assert!(
        text_stored.abs_diff(used_layers) < 10_000_000,
        "{text_stored} vs {used_layers}"
    );
    assert!(m.text_weights(Residency::Compute, 4) < 2 * text_stored);
    // The peak is the denoise phase, and a quantized import shrinks it.
    let e = m.estimate(&request(256), Residency::Stored, None, BASE);
    assert_eq!(e.peak(), e.base + e.denoise);
    let (qt, qr) = m.quantized_variant(4);
    let int4 = ModelSizes {
        text_encoder: &qt,
        transformer: &qr,
        ..m
    };
    let e4 = int4.estimate(&request(256), Residency::Stored, None, BASE);
    assert!(e4.peak() < e.peak() / 3, "{} vs {}", e4.peak(), e.peak());
    assert!(
        e4.peak() < 4_500_000_000,
        "int4 at the real depth: {}",
        e4.peak()
    );
}

#[test]
fn the_plan_takes_the_fastest_mode_that_fits_and_refuses_what_cannot() {
    let real = RealModel::new();
    let m = real.sizes();
    // Plenty: f32 copies of everything, an untiled decode.
    let plan = m.plan(&request(1024), 64 * GB, "", BASE, false).unwrap();
    assert_eq!(plan.residency, Residency::Compute);
    assert!(plan.tiling.is_none());
    // A 24 GB machine: bf16 as stored; within budget.
    let plan = m.plan(&request(1024), 20 * GB, "", BASE, false).unwrap();
    assert_eq!(plan.residency, Residency::Stored);
    assert!(plan.estimate.peak() <= 20 * GB);
    // A 2048² decode does not fit next to little room: tiles.
    let e = m.estimate(&request(2048), Residency::Stored, None, BASE);
    let tight = e.base + e.denoise.max(e.text) + 1_000_000;
    if e.decode > e.denoise {
        let plan = m.plan(&request(2048), tight, "", BASE, false).unwrap();
        assert!(plan.tiling.is_some());
        assert!(plan.estimate.peak() <= tight);
    }
    // 8 GB: no mode fits; the error says how much is needed and what would fit.
    let err = m
        .plan(&request(1024), 8 * GB, " (--memory-limit 8GB)", BASE, false)
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("budget of 8.00 GB (--memory-limit 8GB)"),
        "{text}"
    );
    assert!(text.contains("--quantize int"), "{text}");
}

/// A real-size 2.1 ControlNet (bf16, as published) is counted in the denoise phase: its weights
/// as held, and what its pass holds beside the transformer's.
#[test]
fn a_controlnet_adds_its_weights_and_hints_to_the_denoise_phase() {
    let real = RealModel::new();
    let m = real.sizes();
    let cfg = zimage::families::zimage::ControlNetVersion::V2_1.published_config();
    let cn: Vec<TensorSize> = common::controlnet::tensor_shapes(&cfg)
        .into_iter()
        .map(|(n, s)| tensor(n, &s.iter().map(|&d| d as u64).collect::<Vec<_>>(), 2))
        .collect();
    let steered = ModelSizes {
        controlnet: &cn,
        ..m
    };
    let weights = steered.controlnet_weights(Residency::Stored, 4);
    let params: u64 = cn.iter().map(|t| t.shape.iter().product::<u64>()).sum();
    // Linear weights as stored (bf16), norms and biases widened to f32.
    assert!(
        (params * 2..params * 2 + params / 50).contains(&weights),
        "{weights}"
    );
    let req = request(1024);
    let plain = m.estimate(&req, Residency::Stored, None, BASE);
    let with = steered.estimate(&req, Residency::Stored, None, BASE);
    let hints = with.denoise - plain.denoise - weights;
    println!(
        "2.1 ControlNet at 1024²: {params} parameters, weights {weights} B as stored, hints {hints} B"
    );
    assert!(with.denoise > plain.denoise + weights);
    // One hint at a time, the control stream before and after a block and what the blocks
    // read, [4096 + 64, 3840] each in the compute dtype.
    assert_eq!(hints, 4 * 4160 * 3840 * 4);
    assert_eq!((with.text, with.decode), (plain.text, plain.decode));
}

/// Where the transformer can stream (a stored model on the CPU): a quantized model streams
/// unasked, its denoise phase holding one block's weights and its text phase one layer's; a bf16 model keeps the faster modes
/// while they fit and streams where nothing else does.
#[test]
fn streaming_holds_one_block_and_is_chosen_for_quantized_models_or_when_nothing_else_fits() {
    let real = RealModel::new();
    let m = real.sizes();
    let (qt, qr) = m.quantized_variant(4);
    let int4 = ModelSizes {
        text_encoder: &qt,
        transformer: &qr,
        ..m
    };
    let req = request(1024);
    let stored = int4.estimate(&req, Residency::Stored, None, BASE);
    let streamed = int4.estimate(&req, Residency::Streamed, None, BASE);
    let weights = int4.denoise_weights(Residency::Streamed, 4);
    // One main block at int4 (about 177 M parameters at 4.5 bits) plus the small tensors.
    assert!(
        (90_000_000..200_000_000).contains(&weights),
        "streamed weights {weights}"
    );
    assert!(streamed.denoise + 3_000_000_000 < stored.denoise);
    // The text encoder streams too: one layer and the embedding table (kept bf16) are held.
    assert!(
        streamed.text + 1_500_000_000 < stored.text,
        "{} vs {}",
        streamed.text,
        stored.text
    );
    let plan = int4.plan(&req, 64 * GB, "", BASE, true).unwrap();
    assert_eq!(plan.residency, Residency::Streamed);
    let plan = int4.plan(&req, 64 * GB, "", BASE, false).unwrap();
    assert_ne!(plan.residency, Residency::Streamed);
    // bf16: the f32 copies while they fit; streamed when only that fits.
    let plan = m.plan(&req, 64 * GB, "", BASE, true).unwrap();
    assert_eq!(plan.residency, Residency::Compute);
    let e = m.estimate(&req, Residency::Streamed, None, BASE);
    let plan = m.plan(&req, e.peak() + 1, "", BASE, true).unwrap();
    assert_eq!(plan.residency, Residency::Streamed);
    assert!(m.plan(&req, e.peak() + 1, "", BASE, false).is_err());
}

#[test]
fn the_gpu_graph_counts_one_widened_layer_over_the_image_tokens_and_none_over_the_prompt() {
    let real = RealModel::new();
    let m = real.sizes();
    let (qt, qr) = m.quantized_variant(4);
    let int4 = ModelSizes {
        text_encoder: &qt,
        transformer: &qr,
        ..m
    };
    let bf16 = |graph| RequestShape {
        compute_bytes: 2,
        graph,
        ..request(1024)
    };
    let cpu = int4.estimate(
        &bf16(zimage::platform::Graph::Cpu),
        Residency::Stored,
        None,
        BASE,
    );
    let gpu = int4.estimate(
        &bf16(zimage::platform::Graph::Gpu),
        Residency::Stored,
        None,
        BASE,
    );
    // Weights as held are the same in both graphs; the GPU graph adds the widest quantized
    // layer (w1, w3 or w2: 10240 × 3840) in bf16 for the image tokens' products, and the text
    // encoder's 40 prompt rows keep the quantized product.
    let widened = 10240 * 3840 * 2;
    let weights = int4.denoise_weights(Residency::Stored, 2);
    assert!(
        gpu.denoise > weights + widened,
        "{} vs {}",
        gpu.denoise,
        weights
    );
    assert!(gpu.text < cpu.text, "{} vs {}", gpu.text, cpu.text);
    // At 1024², int4 on the GPU graph: the transformer's packed weights (~3.4 GB) and one
    // block's transients, well under the 9 GB the GPU path is meant to hold.
    assert!(gpu.denoise < 6 * GB, "{}", gpu.denoise);
}

/// Z-Image-Turbo in int4 at 1024² on a GPU (bf16, attention fused, one layer widened at a time)
/// fits 5 GB, every phase and the process; the preflight names the same smallest budget, and
/// refuses a smaller one naming it.
#[test]
fn the_real_size_int4_model_at_1024_fits_5_gb_on_a_gpu() {
    let real = RealModel::new();
    let m = real.sizes();
    let (qt, qr) = m.quantized_variant(4);
    let int4 = ModelSizes {
        text_encoder: &qt,
        transformer: &qr,
        ..m
    };
    let req = RequestShape {
        compute_bytes: 2,
        graph: zimage::platform::Graph::Gpu,
        device: zimage::mlx::Device::Gpu,
        ..request(1024)
    };
    let needs = int4.smallest_budget(&req, BASE, false);
    let plan = int4.plan(&req, needs, "", BASE, false).unwrap();
    let e = plan.estimate;
    eprintln!(
        "int4 1024² GPU: text {} denoise {} decode {} base {} process {} (smallest budget {}, {:?}, tiles {:?})",
        e.text, e.denoise, e.decode, e.base, e.peak(), needs, plan.residency,
        plan.tiling.as_ref().map(|t| t.tile_latent)
    );
    assert!(e.peak() <= needs && needs <= 5 * GB, "{needs}");
    let err = int4
        .plan(&req, needs - 20_000_000, "", BASE, false)
        .unwrap_err();
    let text = err.to_string();
    let named = zimage::memory_plan::gb(needs);
    assert!(text.contains(&format!("needs at least {named}")), "{text}");
}

/// A real-size FLUX.2 \[klein\] (bf16, as published): the synthetic model's tensors and
/// configs, sizes only.
struct KleinModel {
    text_encoder: Vec<TensorSize>,
    transformer: Vec<TensorSize>,
    vae: Vec<TensorSize>,
    text_config: Qwen3Config,
    transformer_config: zimage::families::flux2_klein::Flux2Config,
    vae_config: zimage::models::VaeConfig,
}

impl KleinModel {
    fn new(size: synthetic::klein::Size) -> KleinModel {
        use synthetic::klein;
        let bf16 = |defs: Vec<synthetic::TensorDef>| -> Vec<TensorSize> {
            defs.into_iter()
                .map(|t| tensor(t.name, &t.shape, 2))
                .collect()
        };
        let spec = klein::KleinSpec {
            size,
            dtype: synthetic::WeightDtype::Bf16,
            seed: 0,
        };
        let configs = klein::config_files(&spec);
        let config = |path: &str| {
            let (_, text) = configs.iter().find(|(p, _)| p == path).unwrap();
            text.clone()
        };
        KleinModel {
            text_encoder: bf16(synthetic::qwen3_tensors(&size.text, size.text_layers)),
            transformer: bf16(klein::transformer_tensors(&size)),
            vae: bf16(klein::vae_tensors()),
            text_config: serde_json::from_str(&config("text_encoder/config.json")).unwrap(),
            transformer_config: serde_json::from_str(&config("transformer/config.json")).unwrap(),
            vae_config: serde_json::from_str(&config("vae/config.json")).unwrap(),
        }
    }

    fn sizes(&self) -> ModelSizes<'_> {
        ModelSizes {
            text_encoder: &self.text_encoder,
            transformer: &self.transformer,
            vae: &self.vae,
            text_config: (&self.text_config).into(),
            denoiser: zimage::families::flux2_klein::denoiser(&self.transformer_config, 16),
            vae_config: &self.vae_config,
            controlnet: &[],
        }
    }
}

/// klein's request at 1024² on a GPU: the padded 512-token prompt, bf16.
fn klein_request(prompts: u32) -> RequestShape {
    RequestShape {
        prompt_tokens: 512,
        prompts,
        compute_bytes: 2,
        graph: zimage::platform::Graph::Gpu,
        device: zimage::mlx::Device::Gpu,
        ..request(1024)
    }
}

/// FLUX.2 [klein] 4B in int4 at 1024² on a GPU fits 5 GB, every phase and the process: its
/// text encoder runs 27 of Qwen3-4B's 36 layers over 512 tokens; the denoiser's sequence is
/// the image's 4096 tokens and the 512 text rows. The preflight refuses less, naming the figure.
#[test]
fn klein_4b_in_int4_at_1024_fits_5_gb_on_a_gpu() {
    let real = KleinModel::new(synthetic::klein::KLEIN_4B);
    let m = real.sizes();
    // Only the 27 layers klein reads and the table (kept bf16) are held for the text phase.
    let params_per_layer = 100_925_440u64;
    let held = m.text_weights(Residency::Stored, 2);
    let expected = 27 * params_per_layer * 2 + 151936 * 2560 * 2;
    assert!(held.abs_diff(expected) < 10_000_000, "{held} vs {expected}");
    let (qt, qr) = m.quantized_variant(4);
    let int4 = ModelSizes {
        text_encoder: &qt,
        transformer: &qr,
        ..m
    };
    let req = klein_request(1);
    let needs = int4.smallest_budget(&req, BASE, false);
    let plan = int4.plan(&req, needs, "", BASE, false).unwrap();
    let e = plan.estimate;
    eprintln!(
        "klein 4B int4 1024² GPU: text {} denoise {} decode {} base {} process {} (smallest budget {}, {:?}, tiles {:?})",
        e.text, e.denoise, e.decode, e.base, e.peak(), needs, plan.residency,
        plan.tiling.as_ref().map(|t| t.tile_latent)
    );
    assert!(e.peak() <= needs && needs <= 5 * GB, "{needs}");
    let err = int4
        .plan(&req, needs - 20_000_000, "", BASE, false)
        .unwrap_err();
    let named = zimage::memory_plan::gb(needs);
    assert!(
        err.to_string().contains(&format!("needs at least {named}")),
        "{err}"
    );
    // A base model's guidance keeps both prompts' features (the text phase peaks at its load).
    let guided = int4.estimate(&klein_request(2), plan.residency, None, BASE);
    assert!(guided.text >= e.text && guided.denoise > e.denoise);
    // References join the sequence: two 1024² pictures triple the image's tokens.
    let edit = RequestShape {
        reference_tokens: 2 * 4096,
        encodes: Some((1024, 1024)),
        ..req
    };
    let edited = int4.estimate(&edit, plan.residency, None, BASE);
    assert!(edited.denoise > e.denoise && edited.encode > 0);
}

/// klein 9B's figures at the same request, for the record: larger in every phase but the
/// decode, which shares the VAE.
#[test]
fn klein_9b_holds_more_than_4b_but_the_same_decode() {
    let four = KleinModel::new(synthetic::klein::KLEIN_4B);
    let nine = KleinModel::new(synthetic::klein::KLEIN_9B);
    let int4 = |k: &KleinModel| {
        let m = k.sizes();
        let (qt, qr) = m.quantized_variant(4);
        let sized = ModelSizes {
            text_encoder: &qt,
            transformer: &qr,
            ..m
        };
        sized.estimate(&klein_request(1), Residency::Stored, None, BASE)
    };
    let (a, b) = (int4(&four), int4(&nine));
    eprintln!(
        "klein 9B int4 1024² GPU: text {} denoise {} decode {} process {}",
        b.text,
        b.denoise,
        b.decode,
        b.peak()
    );
    assert!(b.text > a.text && b.denoise > a.denoise);
    assert_eq!(a.decode, b.decode);
}

/// A real-size FLUX.3 \[klein\] (bf16, as the synthetic model writes it): its tensors and
/// configs, sizes only.
struct Flux3Model {
    text_encoder: Vec<TensorSize>,
    transformer: Vec<TensorSize>,
    vae: Vec<TensorSize>,
    text_config: Qwen3Config,
    transformer_config: zimage::families::flux3_klein::Flux3Config,
    vae_config: zimage::models::VaeConfig,
}

impl Flux3Model {
    fn new(flow_map: bool) -> Flux3Model {
        use synthetic::flux3;
        let bf16 = |defs: Vec<synthetic::TensorDef>| -> Vec<TensorSize> {
            defs.into_iter()
                .map(|t| tensor(t.name, &t.shape, 2))
                .collect()
        };
        let spec = flux3::Flux3Spec {
            size: flux3::FLUX3_KLEIN,
            flow_map,
            dtype: synthetic::WeightDtype::Bf16,
            seed: 0,
        };
        let configs = flux3::config_files(&spec);
        let config = |path: &str| {
            let (_, text) = configs.iter().find(|(p, _)| p == path).unwrap();
            text.clone()
        };
        let text: zimage::families::flux3_klein::configs::VisionLanguageConfig =
            serde_json::from_str(&config("text_encoder/config.json")).unwrap();
        Flux3Model {
            text_encoder: bf16(flux3::text_encoder_tensors(&spec.size)),
            transformer: bf16(flux3::transformer_tensors(&spec.size, flow_map)),
            vae: bf16(synthetic::klein::vae_tensors()),
            text_config: text.text_config,
            transformer_config: serde_json::from_str(&config("transformer/config.json")).unwrap(),
            vae_config: serde_json::from_str(&config("vae/config.json")).unwrap(),
        }
    }

    fn sizes(&self) -> ModelSizes<'_> {
        ModelSizes {
            text_encoder: &self.text_encoder,
            transformer: &self.transformer,
            vae: &self.vae,
            text_config: (&self.text_config).into(),
            denoiser: zimage::families::flux3_klein::denoiser(&self.transformer_config, 16),
            vae_config: &self.vae_config,
            controlnet: &[],
        }
    }
}

/// FLUX.3's request at 1024² on a GPU, bf16: a text window of `tokens` rows (a multiple of 80,
/// at most 8192) for each of `prompts` prompts, and `references` 1024² pictures.
fn flux3_request(tokens: u32, prompts: u32, references: u32) -> RequestShape {
    RequestShape {
        prompt_tokens: tokens,
        prompts,
        reference_tokens: references * 4096,
        encodes: (references > 0).then_some((1024, 1024)),
        compute_bytes: 2,
        graph: zimage::platform::Graph::Gpu,
        device: zimage::mlx::Device::Gpu,
        ..request(1024)
    }
}

/// FLUX.3's [`figures`].
fn flux3_figures(
    m: &ModelSizes,
    what: &str,
    req: &RequestShape,
) -> (u64, zimage::memory_plan::MemoryPlan) {
    figures("FLUX.3 [klein]", m, what, req)
}

/// FLUX.3 \[klein\] in int4 at 1024² on a GPU, for a short prompt (one 80-row window), fits
/// 5 GB, distilled and base: its text encoder runs Qwen3-VL-4B's first 32 layers and keeps
/// eight hidden states per row; the denoiser's joint blocks attend over the text window, the
/// image's 4096 tokens and the references'. The preflight refuses less, naming the figure. A
/// long prompt (8192 rows) and two 1024² references are printed for the record.
#[test]
fn flux3_klein_in_int4_at_1024_fits_5_gb_on_a_gpu() {
    for flow_map in [true, false] {
        let real = Flux3Model::new(flow_map);
        let m = real.sizes();
        let kind = if flow_map { "distilled" } else { "base" };
        // Only the embedding table and the 32 layers FLUX.3 reads are held for the text phase
        // (the spec's 3,618,742,272 parameters), not layers 32–35 or the final norm.
        assert_eq!(m.text_weights(Residency::Stored, 2), 2 * 3_618_742_272);
        let (qt, qr) = m.quantized_variant(4);
        let int4 = ModelSizes {
            text_encoder: &qt,
            transformer: &qr,
            ..m
        };
        // The base model's guidance encodes a negative prompt and keeps both prompts' features.
        let prompts = if flow_map { 1 } else { 2 };
        let req = flux3_request(80, prompts, 0);
        let (needs, plan) =
            flux3_figures(&int4, &format!("{kind} int4 1024² GPU, 80 tokens"), &req);
        assert!(
            plan.estimate.peak() <= needs && needs <= 5 * GB,
            "{kind}: {needs}"
        );
        let err = int4
            .plan(&req, needs - 20_000_000, "", BASE, false)
            .unwrap_err();
        let named = zimage::memory_plan::gb(needs);
        assert!(
            err.to_string().contains(&format!("needs at least {named}")),
            "{err}"
        );
        // A long prompt's window widens the text phase and the joint blocks' sequence.
        let long = flux3_request(8192, prompts, 0);
        let (long_needs, long_plan) =
            flux3_figures(&int4, &format!("{kind} int4 1024² GPU, 8192 tokens"), &long);
        assert!(long_needs > needs);
        assert!(long_plan.estimate.text > plan.estimate.text);
        assert!(long_plan.estimate.denoise > plan.estimate.denoise);
        // Two 1024² references join the joint blocks' sequence and are encoded first.
        let edit = flux3_request(80, prompts, 2);
        let (_, edited) = flux3_figures(
            &int4,
            &format!("{kind} int4 1024² GPU, 80 tokens, two 1024² references"),
            &edit,
        );
        assert!(edited.estimate.denoise > plan.estimate.denoise && edited.estimate.encode > 0);
    }
}

/// A real-size FLUX.1 (bf16, as the synthetic model writes it): its tensors and configs, sizes
/// only. The text phase's tensors are T5's and CLIP's, as the family counts them.
struct Flux1Model {
    text_encoder: Vec<TensorSize>,
    transformer: Vec<TensorSize>,
    vae: Vec<TensorSize>,
    t5_config: zimage::models::T5Config,
    transformer_config: zimage::families::flux1::Flux1Config,
    vae_config: zimage::models::VaeConfig,
}

impl Flux1Model {
    fn new(variant: synthetic::flux1::Variant) -> Flux1Model {
        use synthetic::flux1;
        let bf16 = |defs: Vec<synthetic::TensorDef>| -> Vec<TensorSize> {
            defs.into_iter()
                .map(|t| tensor(t.name, &t.shape, 2))
                .collect()
        };
        let spec = flux1::Flux1Spec::real(variant);
        let configs = flux1::config_files(&spec);
        let config = |path: &str| {
            let (_, text) = configs.iter().find(|(p, _)| p == path).unwrap();
            text.clone()
        };
        let mut text = bf16(flux1::t5_tensors(spec.size.t5_layers));
        text.extend(bf16(flux1::clip_tensors(spec.size.clip_layers)));
        Flux1Model {
            text_encoder: text,
            transformer: bf16(flux1::transformer_tensors(&spec.size, variant.guidance())),
            vae: bf16(synthetic::vae_tensors()),
            t5_config: serde_json::from_str(&config("text_encoder_2/config.json")).unwrap(),
            transformer_config: serde_json::from_str(&config("transformer/config.json")).unwrap(),
            vae_config: serde_json::from_str(&config("vae/config.json")).unwrap(),
        }
    }

    fn sizes(&self) -> ModelSizes<'_> {
        use zimage::families::flux1::pipeline;
        ModelSizes {
            text_encoder: &self.text_encoder,
            transformer: &self.transformer,
            vae: &self.vae,
            text_config: pipeline::text_shape(&self.t5_config),
            denoiser: pipeline::denoiser(&self.transformer_config, 16),
            vae_config: &self.vae_config,
            controlnet: &[],
        }
    }
}

/// FLUX.1's request at 1024² on a GPU, bf16: T5's padded window of `tokens` rows (256 for
/// \[schnell\], 512 for \[dev\]) and `prompts` prompts (2 with true CFG).
fn flux1_request(tokens: u32, prompts: u32) -> RequestShape {
    RequestShape {
        prompt_tokens: tokens,
        prompts,
        compute_bytes: 2,
        graph: zimage::platform::Graph::Gpu,
        device: zimage::mlx::Device::Gpu,
        ..request(1024)
    }
}

/// The smallest budget of `req` and the plan made under it, printed phase by phase with the
/// weights as held.
fn figures(
    family: &str,
    m: &ModelSizes,
    what: &str,
    req: &RequestShape,
) -> (u64, zimage::memory_plan::MemoryPlan) {
    let needs = m.smallest_budget(req, BASE, false);
    let plan = m.plan(req, needs, "", BASE, false).unwrap();
    let e = plan.estimate;
    eprintln!(
        "{family} {what}: text {} (weights {}) encode {} denoise {} (weights {}) \
         decode {} base {} process {} (smallest budget {}, {:?}, tiles {:?})",
        e.text,
        m.text_weights(plan.residency, req.compute_bytes),
        e.encode,
        e.denoise,
        m.denoise_weights(plan.residency, req.compute_bytes),
        e.decode,
        e.base,
        e.peak(),
        needs,
        plan.residency,
        plan.tiling.as_ref().map(|t| t.tile_latent)
    );
    (needs, plan)
}

/// FLUX.1 in int4 at 1024² on a GPU: \[schnell\] (T5's 256-row window) fits 8 GB, every phase
/// and the process; \[dev\] (512 rows) needs a little more. The text phase holds T5 and CLIP
/// (all their tensors run), the denoise the transformer and one block's transients over the
/// image's 4096 tokens and T5's rows, which it keeps for every step. The preflight refuses
/// less, naming the figure. True CFG's second prompt is printed for the record.
#[test]
fn flux1_in_int4_at_1024_on_a_gpu() {
    use synthetic::flux1::Variant;
    let mut needs_of = Vec::new();
    for (variant, tokens) in [(Variant::Schnell, 256), (Variant::Dev, 512)] {
        let real = Flux1Model::new(variant);
        let m = real.sizes();
        // Every tensor of T5 (its tied table once) and CLIP is held for the text phase.
        assert_eq!(
            m.text_weights(Residency::Stored, 2),
            2 * (4_762_310_656 + 123_060_480)
        );
        let (qt, qr) = m.quantized_variant(4);
        let int4 = ModelSizes {
            text_encoder: &qt,
            transformer: &qr,
            ..m
        };
        let req = flux1_request(tokens, 1);
        let what = format!("{variant:?} int4 1024² GPU, {tokens} T5 rows");
        let (needs, plan) = figures("FLUX.1", &int4, &what, &req);
        assert!(plan.estimate.peak() <= needs, "{variant:?}: {needs}");
        let err = int4
            .plan(&req, needs - 20_000_000, "", BASE, false)
            .unwrap_err();
        let named = zimage::memory_plan::gb(needs);
        assert!(
            err.to_string().contains(&format!("needs at least {named}")),
            "{err}"
        );
        // T5's products over its window widen one quantized layer on the GPU graph (the
        // MLP's 10240 × 4096, in bf16), never its packed token table, which is read by rows;
        // the CPU graph keeps the widening scratch instead.
        let cpu = RequestShape {
            graph: zimage::platform::Graph::Cpu,
            ..req
        };
        let on_cpu = int4.estimate(&cpu, plan.residency, None, BASE);
        assert_eq!(
            plan.estimate.text - on_cpu.text,
            10240 * 4096 * 2 - (64 << 20),
            "{variant:?}"
        );
        let guided = flux1_request(tokens, 2);
        let (_, cfg) = figures("FLUX.1", &int4, &format!("{what}, true CFG"), &guided);
        assert!(cfg.estimate.denoise > plan.estimate.denoise);
        needs_of.push(needs);
    }
    assert!(needs_of[0] <= 8 * GB, "[schnell]: {}", needs_of[0]);
    assert!(needs_of[1] > needs_of[0]);
}
