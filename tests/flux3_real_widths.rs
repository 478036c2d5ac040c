//! The FLUX.3 transformer at the real widths (D 3072, 24 heads of 128, text features 20480,
//! MLP 9216, sinusoid 256, RoPE axes 4 × 32, a flow map), one mode block of each mode and one
//! joint block, against diffusers 0.42.1: the tiny model's sizes all differ from the real
//! ones, so this catches a size only the tiny model has. The weights are the generator
//! `make_flux3_tiny.py` used (modulations ×16, so that the blocks change the stream).

mod common;

use common::controlnet::fill;
use std::collections::HashMap;
use zimage::families::flux3_klein::transformer::Rope;
use zimage::families::flux3_klein::{Flux3Config, Flux3Transformer};
use zimage::mlx::{io, Array, Dtype};
use zimage::models::Checkpoint;

/// Every weight of the four-block transformer, with its shape.
fn shapes() -> Vec<(String, Vec<usize>)> {
    let (d, m, c, j, s, hd) = (3072, 9216, 128, 20480, 256, 128);
    let mut out: Vec<(String, Vec<usize>)> = vec![
        ("x_embedders.image".into(), vec![d, c]),
        ("x_embedders.image_cond".into(), vec![d, c]),
        ("context_embedder".into(), vec![d, j]),
        ("timestep_embedder.linear_1".into(), vec![d, s]),
        ("timestep_embedder.linear_2".into(), vec![d, d]),
        ("target_timestep_embedder.linear_1".into(), vec![d, s]),
        ("target_timestep_embedder.linear_2".into(), vec![d, d]),
        ("norm_out.linear".into(), vec![2 * d, d]),
        ("proj_out".into(), vec![c, d]),
    ];
    for stage in ["early_stream_modulations", "single_stream_modulations"] {
        for mode in ["image", "image_cond", "txt"] {
            out.push((format!("{stage}.{mode}.linear"), vec![3 * d, d]));
        }
    }
    let blocks = [
        "txt_mode_blocks.0",
        "mode_blocks.image.0",
        "mode_blocks.image_cond.0",
        "single_transformer_blocks.0",
    ];
    for b in blocks {
        for p in ["to_q", "to_k", "to_v", "to_out.0"] {
            out.push((format!("{b}.attn.{p}"), vec![d, d]));
        }
        out.push((format!("{b}.attn.norm_q"), vec![hd]));
        out.push((format!("{b}.attn.norm_k"), vec![hd]));
        out.push((format!("{b}.ff.linear_in"), vec![2 * m, d]));
        out.push((format!("{b}.ff.linear_out"), vec![d, m]));
    }
    out
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
    let cfg: Flux3Config = serde_json::from_value(serde_json::json!({
        "in_channels": 128, "cond_in_channels": 128, "num_layers": 1, "num_single_layers": 1,
        "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 20480,
        "timestep_channels": 256, "mlp_ratio": 3.0, "axes_dims_rope": [32, 32, 32, 32],
        "rope_theta": 10000, "eps": 1e-6, "flow_map": true}))
    .unwrap();
    let model =
        Flux3Transformer::new(&cfg, Checkpoint::new("transformer", tensors, Dtype::F32)).unwrap();
    let st = io::load_safetensors(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/models/reference/flux3-blocks-real.safetensors"
    )))
    .unwrap();
    let get = |n: &str| {
        st.tensors[n]
            .squeeze(0)
            .unwrap()
            .astype(Dtype::F32)
            .unwrap()
    };
    let rope = Rope::new(&cfg, 5, (2, 3), &[(2, 2)]).unwrap();
    // The reference's times are t/1000: 0.75 and 0.5 are the schedule's 750 and 500.
    let refs = get("image_cond_hidden_states");
    let out = model
        .forward(
            &get("hidden_states"),
            (750.0, Some(500.0)),
            &get("encoder_hidden_states"),
            Some(&refs),
            &rope,
        )
        .unwrap();
    let a = out.to_vec::<f32>().unwrap();
    let b = get("output").to_vec::<f32>().unwrap();
    let d = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    let scale = b.iter().map(|x| x.abs()).fold(0.0f32, f32::max);
    println!("real-width output max |Δ| {d:e} (values up to {scale:e})");
    assert!(d < 1e-4 * scale.max(1.0), "the output differs by {d}");
}
