//! The FLUX.2 transformer at klein 4B's real widths (D 3072, 24 heads of 128, text features 7680,
//! MLP 9216, sinusoid 256, RoPE axes 4 × 32), one double-stream and one single-stream block,
//! against diffusers 0.42.1: the tiny model's sizes all differ from the real ones, so this
//! catches a size that only the tiny model has. The weights are the generator
//! `make_klein_tiny.py` used (modulations ×16, so that the blocks change the stream).

mod common;

use common::controlnet::fill;
use std::collections::HashMap;
use zimage::mlx::{io, Array, Dtype};
use zimage::models::flux2::{rope, Flux2Config, Flux2Transformer};
use zimage::models::Checkpoint;

/// Every tensor of the two-block transformer, with its shape.
fn shapes() -> Vec<(String, Vec<usize>)> {
    let (d, m, j, c) = (3072usize, 9216usize, 7680usize, 128usize);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("x_embedder".into(), vec![d, c]),
        ("context_embedder".into(), vec![d, j]),
        (
            "time_guidance_embed.timestep_embedder.linear_1".into(),
            vec![d, 256],
        ),
        (
            "time_guidance_embed.timestep_embedder.linear_2".into(),
            vec![d, d],
        ),
        ("double_stream_modulation_img.linear".into(), vec![6 * d, d]),
        ("double_stream_modulation_txt.linear".into(), vec![6 * d, d]),
        ("single_stream_modulation.linear".into(), vec![3 * d, d]),
        ("norm_out.linear".into(), vec![2 * d, d]),
        ("proj_out".into(), vec![c, d]),
    ];
    let b = "transformer_blocks.0.";
    for n in [
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_add_out",
    ] {
        shapes.push((format!("{b}attn.{n}"), vec![d, d]));
    }
    for n in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
        shapes.push((format!("{b}attn.{n}"), vec![128]));
    }
    for f in ["ff", "ff_context"] {
        shapes.push((format!("{b}{f}.linear_in"), vec![2 * m, d]));
        shapes.push((format!("{b}{f}.linear_out"), vec![d, m]));
    }
    let s = "single_transformer_blocks.0.attn.";
    shapes.push((format!("{s}to_qkv_mlp_proj"), vec![3 * d + 2 * m, d]));
    shapes.push((format!("{s}to_out"), vec![d, d + m]));
    shapes.push((format!("{s}norm_q"), vec![128]));
    shapes.push((format!("{s}norm_k"), vec![128]));
    shapes
}

#[test]
fn the_transformer_at_real_widths_matches_diffusers() {
    let mut tensors = HashMap::new();
    for (name, shape) in shapes() {
        let name = format!("{name}.weight");
        let mut v = fill(&name, &shape);
        if name.contains("modulation") || name.starts_with("norm_out.") {
            v.iter_mut().for_each(|x| *x *= 16.0);
        }
        let sh: Vec<i32> = shape.iter().map(|&x| x as i32).collect();
        tensors.insert(name, Array::from_slice(&v, &sh).unwrap());
    }
    let cfg: Flux2Config = serde_json::from_value(serde_json::json!({
        "patch_size": 1, "in_channels": 128, "num_layers": 1, "num_single_layers": 1,
        "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 7680,
        "timestep_guidance_channels": 256, "mlp_ratio": 3.0, "axes_dims_rope": [32, 32, 32, 32],
        "rope_theta": 2000, "eps": 1e-6, "guidance_embeds": false}))
    .unwrap();
    let model =
        Flux2Transformer::new(&cfg, Checkpoint::new("transformer", tensors, Dtype::F32)).unwrap();
    let st = io::load_safetensors(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/models/reference/klein-blocks-real.safetensors"
    )))
    .unwrap();
    let get = |n: &str| {
        st.tensors[n]
            .squeeze(0)
            .unwrap()
            .astype(Dtype::F32)
            .unwrap()
    };
    let ids = rope::ids(5, (2, 3), &[]);
    let tables = rope::tables(&ids, &cfg.axes_dims_rope, cfg.rope_theta).unwrap();
    // The reference's timestep 0.75 is t/1000: the schedule's t is 750.
    let out = model
        .forward(
            &get("hidden_states"),
            750.0,
            &get("encoder_hidden_states"),
            &tables,
        )
        .unwrap();
    let a = out.to_vec::<f32>().unwrap();
    let b = get("output").to_vec::<f32>().unwrap();
    let d = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    println!("real-width output max |Δ| {d:e}");
    assert!(d < 1e-4, "the output differs by {d}");
}
