//! The FLUX.2 transformer at klein 4B's real widths (D 3072, 24 heads of 128, text features 7680,
//! MLP 9216, sinusoid 256, RoPE axes 4 × 32), one double-stream and one single-stream block,
//! against diffusers 0.42.1: the tiny model's sizes all differ from the real ones, so this
//! catches a size that only the tiny model has. The weights are the generator
//! `make_klein_tiny.py` used (modulations ×16, so that the blocks change the stream).

mod common;

use common::klein;
use std::collections::HashMap;
use zimage::families::flux2_klein::{rope, Flux2Config, Flux2Transformer};
use zimage::mlx::{io, Array, Dtype};
use zimage::models::Checkpoint;

#[test]
fn the_transformer_at_real_widths_matches_diffusers() {
    let widths = klein::Widths {
        inner: 3072,
        mlp: 9216,
        joint: 7680,
        channels: 128,
        sinusoid: 256,
        head: 128,
    };
    let mut tensors = HashMap::new();
    for (name, shape, v) in klein::weights(&widths) {
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
