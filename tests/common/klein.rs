//! A FLUX.2 \[klein\] transformer of one double-stream and one single-stream block at widths a
//! test chooses: its tensors in diffusers' names, filled as `make_klein_tiny.py` fills them.

use super::controlnet::fill;

/// The widths a transformer's tensors follow.
pub struct Widths {
    /// The stream width D (heads × head size).
    pub inner: usize,
    /// The MLP's hidden width.
    pub mlp: usize,
    /// The text features' width (`joint_attention_dim`).
    pub joint: usize,
    /// The packed latent channels (`in_channels`).
    pub channels: usize,
    /// The timestep sinusoid's width (`timestep_guidance_channels`).
    pub sinusoid: usize,
    /// One attention head's size.
    pub head: usize,
}

/// Every weight of the two-block transformer (without `.weight`), with its shape.
pub fn shapes(w: &Widths) -> Vec<(String, Vec<usize>)> {
    let (d, m) = (w.inner, w.mlp);
    let mut shapes: Vec<(String, Vec<usize>)> = [
        ("x_embedder", vec![d, w.channels]),
        ("context_embedder", vec![d, w.joint]),
        (
            "time_guidance_embed.timestep_embedder.linear_1",
            vec![d, w.sinusoid],
        ),
        ("time_guidance_embed.timestep_embedder.linear_2", vec![d, d]),
        ("double_stream_modulation_img.linear", vec![6 * d, d]),
        ("double_stream_modulation_txt.linear", vec![6 * d, d]),
        ("single_stream_modulation.linear", vec![3 * d, d]),
        ("norm_out.linear", vec![2 * d, d]),
        ("proj_out", vec![w.channels, d]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    let b = "transformer_blocks.0.attn.";
    let image = ["to_q", "to_k", "to_v", "to_out.0"];
    let text = ["add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"];
    for n in image.iter().chain(&text) {
        shapes.push((format!("{b}{n}"), vec![d, d]));
    }
    for n in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
        shapes.push((format!("{b}{n}"), vec![w.head]));
    }
    for f in ["ff", "ff_context"] {
        shapes.push((
            format!("transformer_blocks.0.{f}.linear_in"),
            vec![2 * m, d],
        ));
        shapes.push((format!("transformer_blocks.0.{f}.linear_out"), vec![d, m]));
    }
    let s = "single_transformer_blocks.0.attn.";
    shapes.push((format!("{s}to_qkv_mlp_proj"), vec![3 * d + 2 * m, d]));
    shapes.push((format!("{s}to_out"), vec![d, d + m]));
    shapes.push((format!("{s}norm_q"), vec![w.head]));
    shapes.push((format!("{s}norm_k"), vec![w.head]));
    shapes
}

/// Every tensor of the two-block transformer as `(name.weight, shape, values)`: the generator's
/// fill, with the modulations ×16 so that the blocks change the stream.
pub fn weights(w: &Widths) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    shapes(w)
        .into_iter()
        .map(|(name, shape)| {
            let name = format!("{name}.weight");
            let mut v = fill(&name, &shape);
            if name.contains("modulation") || name.starts_with("norm_out.") {
                v.iter_mut().for_each(|x| *x *= 16.0);
            }
            (name, shape, v)
        })
        .collect()
}
