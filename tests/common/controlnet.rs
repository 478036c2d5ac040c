//! The tiny ControlNets of `models/make_controlnet.py`, made again bit for bit: every tensor's
//! values come from a counter-based generator keyed by its name, so the repository keeps only
//! their configs (`models/controlnet-tiny/*/config.json`) and diffusers' outputs with them.

use std::path::{Path, PathBuf};
use zimage::families::zimage::ControlNetConfig;

/// `models/controlnet-tiny/LAYOUT`, holding its `config.json`.
pub fn tiny_dir(layout: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/controlnet-tiny")
        .join(layout)
}

pub fn tiny_config(layout: &str) -> ControlNetConfig {
    let text = std::fs::read_to_string(tiny_dir(layout).join("config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn fnv1a(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
    })
}

/// `n` values in [-1, 1): splitmix64 over `hash(name) + (i + 1)·golden`.
fn uniform(name: &str, n: usize) -> impl Iterator<Item = f32> {
    let h = fnv1a(name);
    (1..=n as u64).map(move |i| {
        let mut z = h.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u32 << 23) as f32 - 1.0
    })
}

/// The value of tensor `name`, as `fill` in make_controlnet.py computes it.
pub fn fill(name: &str, shape: &[usize]) -> Vec<f32> {
    let n = shape.iter().product();
    let u = uniform(name, n);
    if shape.len() == 2 {
        let s = 1.0f32 / (shape[1] as f32).sqrt();
        u.map(|v| v * s).collect()
    } else if name.contains("norm") {
        u.map(|v| v * 0.25 + 1.0).collect()
    } else {
        u.map(|v| v * 0.1).collect()
    }
}

/// Every tensor a diffusers `ZImageControlNetModel` of `cfg` holds, with its shape.
pub fn tensor_shapes(cfg: &ControlNetConfig) -> Vec<(String, Vec<usize>)> {
    cfg.tensor_shapes()
}

/// The tiny ControlNet's weights as f32 arrays.
pub fn tiny_tensors(
    cfg: &ControlNetConfig,
) -> std::collections::HashMap<String, zimage::mlx::Array> {
    tensor_shapes(cfg)
        .into_iter()
        .map(|(name, shape)| {
            let v = fill(&name, &shape);
            let dims: Vec<i32> = shape.iter().map(|&s| s as i32).collect();
            let a = zimage::mlx::Array::from_slice(&v, &dims).unwrap();
            (name, a)
        })
        .collect()
}

/// Writes the tiny ControlNet of `layout` as a diffusers directory (config + f32 weights).
pub fn write_tiny_dir(layout: &str, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        tiny_dir(layout).join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let cfg = tiny_config(layout);
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = tensor_shapes(&cfg)
        .into_iter()
        .map(|(name, shape)| {
            let bytes = fill(&name, &shape)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            (name, shape, bytes)
        })
        .collect();
    let refs: Vec<(&str, zimage::safetensors::Dtype, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.as_str(),
                zimage::safetensors::Dtype::F32,
                s.iter().map(|&x| x as u64).collect(),
                b.clone(),
            )
        })
        .collect();
    super::write_safetensors(&dir.join("diffusion_pytorch_model.safetensors"), &refs);
}
