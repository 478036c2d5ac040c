//! The ControlNet's configuration (`ZImageControlNetModel`'s `config.json`), the three published
//! variants of the Z-Image-Turbo Fun ControlNet Union, and recognising a variant from a single
//! file's tensors.
//!
//! The published single files carry no config. diffusers 0.42.1 tells them apart by their
//! tensors (`loaders/single_file_utils.py`): a 15th control layer means 2.x, and of those a
//! control noise refiner whose first `before_proj` is missing or all zero means 2.0 (whose
//! control layers serve as the refiner), else 2.1; without the 15th layer it is 1.0. The configs
//! below are the ones it then fetches for each.

use super::transformer::DitConfig;
use crate::safetensors::{Header, TensorInfo};

/// How a 2.x ControlNet makes its hints for the transformer's noise refiner
/// (`add_control_noise_refiner`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefinerMode {
    /// The main control blocks run over the image tokens first (2.0).
    ControlLayers,
    /// Blocks of its own, `control_noise_refiner.*` (2.1).
    ControlNoiseRefiner,
}

/// `config.json` of a `ZImageControlNetModel`, defaults as diffusers' constructor has them.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct ControlNetConfig {
    /// The transformer layers whose output each control block's hint is added to.
    pub control_layers_places: Vec<i32>,
    /// The noise-refiner layers the refiner hints are added to (2.x).
    #[serde(default)]
    pub control_refiner_layers_places: Option<Vec<i32>>,
    /// Channels of the control latents (the VAE's 16, zero-padded to this).
    pub control_in_dim: i32,
    /// `None`: 1.0, whose control tokens pass plain refiner blocks.
    #[serde(default)]
    pub add_control_noise_refiner: Option<RefinerMode>,
    #[serde(default = "patch_size")]
    pub all_patch_size: Vec<i32>,
    #[serde(default = "f_patch_size")]
    pub all_f_patch_size: Vec<i32>,
    #[serde(default = "dim")]
    pub dim: i32,
    #[serde(default = "n_refiner_layers")]
    pub n_refiner_layers: i32,
    #[serde(default = "n_heads")]
    pub n_heads: i32,
    #[serde(default = "n_heads")]
    pub n_kv_heads: i32,
    #[serde(default = "norm_eps")]
    pub norm_eps: f32,
    #[serde(default = "qk_norm")]
    pub qk_norm: bool,
}

fn patch_size() -> Vec<i32> {
    vec![2]
}
fn f_patch_size() -> Vec<i32> {
    vec![1]
}
fn dim() -> i32 {
    3840
}
fn n_refiner_layers() -> i32 {
    2
}
fn n_heads() -> i32 {
    30
}
fn norm_eps() -> f32 {
    1e-5
}
fn qk_norm() -> bool {
    true
}

/// The published Z-Image-Turbo Fun ControlNet Union versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlNetVersion {
    V1_0,
    V2_0,
    V2_1,
}

impl ControlNetVersion {
    pub fn name(self) -> &'static str {
        match self {
            ControlNetVersion::V1_0 => "1.0",
            ControlNetVersion::V2_0 => "2.0",
            ControlNetVersion::V2_1 => "2.1",
        }
    }

    /// The configuration of the published file of this version (the real widths).
    pub fn published_config(self) -> ControlNetConfig {
        let every = |step: i32, count: i32| (0..count).map(|k| k * step).collect::<Vec<_>>();
        let (places, refiner_places, in_dim, mode) = match self {
            ControlNetVersion::V1_0 => (every(5, 6), None, 16, None),
            ControlNetVersion::V2_0 => (
                every(2, 15),
                Some(vec![0, 1]),
                33,
                Some(RefinerMode::ControlLayers),
            ),
            ControlNetVersion::V2_1 => (
                every(2, 15),
                Some(vec![0, 1]),
                33,
                Some(RefinerMode::ControlNoiseRefiner),
            ),
        };
        ControlNetConfig {
            control_layers_places: places,
            control_refiner_layers_places: refiner_places,
            control_in_dim: in_dim,
            add_control_noise_refiner: mode,
            all_patch_size: patch_size(),
            all_f_patch_size: f_patch_size(),
            dim: dim(),
            n_refiner_layers: n_refiner_layers(),
            n_heads: n_heads(),
            n_kv_heads: n_heads(),
            norm_eps: norm_eps(),
            qk_norm: qk_norm(),
        }
    }

    /// The version a single file's tensors are, as diffusers' single-file loader decides it;
    /// `None` when the file is no Z-Image ControlNet. `is_zero` reads one tensor and says
    /// whether every element is ±0 (only asked of a 2.x file's first refiner `before_proj`).
    pub fn recognise<E>(
        header: &Header,
        is_zero: impl FnOnce(&TensorInfo) -> Result<bool, E>,
    ) -> Result<Option<ControlNetVersion>, E> {
        if header
            .tensor("control_layers.14.adaLN_modulation.0.weight")
            .is_some()
        {
            let zero = match header.tensor("control_noise_refiner.0.before_proj.weight") {
                Some(t) => is_zero(t)?,
                None => true,
            };
            return Ok(Some(match zero {
                true => ControlNetVersion::V2_0,
                false => ControlNetVersion::V2_1,
            }));
        }
        Ok(header
            .tensor("control_all_x_embedder.2-1.weight")
            .map(|_| ControlNetVersion::V1_0))
    }
}

impl ControlNetConfig {
    /// The published version this layout is (by its refiner mode alone).
    pub fn version(&self) -> ControlNetVersion {
        match self.add_control_noise_refiner {
            None => ControlNetVersion::V1_0,
            Some(RefinerMode::ControlLayers) => ControlNetVersion::V2_0,
            Some(RefinerMode::ControlNoiseRefiner) => ControlNetVersion::V2_1,
        }
    }

    /// The noise-refiner layers that receive hints (none for 1.0).
    pub fn refiner_places(&self) -> &[i32] {
        match self.add_control_noise_refiner {
            None => &[],
            Some(_) => self.control_refiner_layers_places.as_deref().unwrap_or(&[]),
        }
    }

    /// Checks what the model sizes, indexes or divides by, before anything is allocated.
    pub fn validate(&self) -> Result<(), String> {
        use crate::models::{check_finite, check_range, MAX_COUNT, MAX_WIDTH};
        const WHAT: &str = "controlnet";
        let (patch, f_patch) = (&self.all_patch_size, &self.all_f_patch_size);
        let widths = [self.dim, self.n_heads, self.n_refiner_layers];
        super::transformer::check_dit_shape(WHAT, patch, f_patch, widths)?;
        check_range(WHAT, "control_in_dim", self.control_in_dim, 1..=MAX_WIDTH)?;
        check_finite(WHAT, "norm_eps", self.norm_eps as f64, true)?;
        if !self.qk_norm {
            return Err("controlnet `qk_norm: false` is not supported".into());
        }
        if self.dim % self.n_heads != 0 {
            return Err(format!(
                "controlnet `dim` {} is not divisible by `n_heads` {}",
                self.dim, self.n_heads
            ));
        }
        let places = &self.control_layers_places;
        if places.is_empty() || places[0] != 0 || places.windows(2).any(|p| p[0] >= p[1]) {
            return Err(format!(
                "controlnet `control_layers_places` {places:?} must start at 0 and increase"
            ));
        }
        check_range(
            WHAT,
            "control_layers_places",
            places.len() as i32,
            1..=MAX_COUNT,
        )?;
        let refiner = self.refiner_places();
        if refiner.windows(2).any(|p| p[0] >= p[1]) || refiner.first().is_some_and(|&p| p < 0) {
            return Err(format!(
                "controlnet `control_refiner_layers_places` {refiner:?} must be increasing layer indices"
            ));
        }
        // Each refiner place takes one hint of the blocks that make them.
        let made = match self.add_control_noise_refiner {
            None => 0,
            Some(RefinerMode::ControlLayers) => places.len(),
            Some(RefinerMode::ControlNoiseRefiner) => self.n_refiner_layers as usize,
        };
        if refiner.len() > made {
            return Err(format!(
                "controlnet `control_refiner_layers_places` {refiner:?} asks for {} refiner hints; its refiner makes {made}",
                refiner.len()
            ));
        }
        Ok(())
    }

    /// Checks that this ControlNet fits the transformer `dit` it hooks into.
    pub fn check_fits(&self, dit: &DitConfig) -> Result<(), String> {
        if self.dim != dit.dim || self.n_heads != dit.n_heads {
            return Err(format!(
                "the controlnet is {} wide with {} heads; the model's transformer is {} wide with {}",
                self.dim, self.n_heads, dit.dim, dit.n_heads
            ));
        }
        let last = |p: &[i32]| p.last().copied().unwrap_or(-1);
        if last(&self.control_layers_places) >= dit.n_layers {
            return Err(format!(
                "the controlnet adds into transformer layers {:?}; the model has {}",
                self.control_layers_places, dit.n_layers
            ));
        }
        if last(self.refiner_places()) >= dit.n_refiner_layers {
            return Err(format!(
                "the controlnet adds into noise-refiner layers {:?}; the model has {}",
                self.refiner_places(),
                dit.n_refiner_layers
            ));
        }
        if self.control_in_dim < dit.in_channels {
            return Err(format!(
                "the controlnet reads {} control channels, fewer than the model's {} latent channels",
                self.control_in_dim, dit.in_channels
            ));
        }
        Ok(())
    }
}

impl ControlNetConfig {
    /// Every tensor a diffusers `ZImageControlNetModel` of this configuration holds (the names
    /// of the published single files too), with its shape.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let d = self.dim as usize;
        let f = (d as f64 / 3.0 * 8.0) as usize;
        let hd = d / self.n_heads as usize;
        let adaln = d.min(256);
        let mut out = Vec::new();
        let mut add = |name: String, shape: Vec<usize>| out.push((name, shape));
        let mut block = |p: &str, before: bool, after: bool| {
            for m in ["to_q", "to_k", "to_v"] {
                add(format!("{p}.attention.{m}.weight"), vec![d, d]);
            }
            add(format!("{p}.attention.to_out.0.weight"), vec![d, d]);
            add(format!("{p}.attention.norm_q.weight"), vec![hd]);
            add(format!("{p}.attention.norm_k.weight"), vec![hd]);
            add(format!("{p}.feed_forward.w1.weight"), vec![f, d]);
            add(format!("{p}.feed_forward.w2.weight"), vec![d, f]);
            add(format!("{p}.feed_forward.w3.weight"), vec![f, d]);
            for n in [
                "attention_norm1",
                "ffn_norm1",
                "attention_norm2",
                "ffn_norm2",
            ] {
                add(format!("{p}.{n}.weight"), vec![d]);
            }
            add(format!("{p}.adaLN_modulation.0.weight"), vec![4 * d, adaln]);
            add(format!("{p}.adaLN_modulation.0.bias"), vec![4 * d]);
            for (proj, present) in [("before_proj", before), ("after_proj", after)] {
                if present {
                    add(format!("{p}.{proj}.weight"), vec![d, d]);
                    add(format!("{p}.{proj}.bias"), vec![d]);
                }
            }
        };
        for (i, &place) in self.control_layers_places.iter().enumerate() {
            block(&format!("control_layers.{i}"), place == 0, true);
        }
        for i in 0..self.n_refiner_layers as usize {
            let p = format!("control_noise_refiner.{i}");
            match self.add_control_noise_refiner {
                None => block(&p, false, false),
                Some(RefinerMode::ControlNoiseRefiner) => block(&p, i == 0, true),
                Some(RefinerMode::ControlLayers) => {}
            }
        }
        out.push((
            "control_all_x_embedder.2-1.weight".into(),
            vec![d, 4 * self.control_in_dim as usize],
        ));
        out.push(("control_all_x_embedder.2-1.bias".into(), vec![d]));
        out
    }
}
