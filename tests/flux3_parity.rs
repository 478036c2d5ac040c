//! FLUX.3 [klein] against diffusers 0.42.1 dumps of the tiny FLUX.3 models (f32): tokens,
//! prompt features over the window, the schedule, the first step's velocity, the final latents
//! and the picture, from the seed alone, for text → image on the flow map, the guided base
//! model, and edits with one and with two references.

mod common;

use common::compare_pixels;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::flux3_klein::references::Prepared;
use zimage::families::flux3_klein::transformer::Rope;
use zimage::families::flux3_klein::{pipeline, Flux3Pipeline};
use zimage::mlx::{io, Array, Dtype};
use zimage::pipeline::Request;

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

struct Case {
    tensors: HashMap<String, Array>,
    call: serde_json::Value,
}

impl Case {
    fn load(name: &str) -> Case {
        let path = models().join(format!("reference/flux3-{name}.safetensors"));
        let st = io::load_safetensors(&path).unwrap();
        Case {
            call: serde_json::from_str(&st.metadata["case"]).unwrap(),
            tensors: st.tensors,
        }
    }

    fn array(&self, name: &str) -> Array {
        let a = self.tensors.get(name);
        a.unwrap_or_else(|| panic!("no `{name}` in the reference"))
            .clone()
    }

    fn unbatched(&self, name: &str) -> Array {
        self.array(name)
            .squeeze(0)
            .unwrap()
            .astype(Dtype::F32)
            .unwrap()
    }

    fn model(&self) -> String {
        self.call["model"].as_str().unwrap().to_string()
    }

    /// The request, its size the call's or, where it names none, the first reference's.
    fn request(&self, references: &Prepared) -> Request {
        let c = &self.call;
        let first = references.pictures.first();
        let width = c["width"]
            .as_u64()
            .map_or_else(|| first.unwrap().width, |w| w as u32);
        let height = c["height"]
            .as_u64()
            .map_or_else(|| first.unwrap().height, |h| h as u32);
        Request {
            prompt: c["prompt"].as_str().unwrap().into(),
            negative_prompt: None,
            width,
            height,
            steps: c["num_inference_steps"].as_u64().unwrap() as usize,
            guidance: c["guidance"].as_f64().unwrap_or(1.0) as f32,
            cfg_normalization: false,
            cfg_truncation: 1.0,
            seed: c["seed"].as_u64().unwrap(),
            noise: None,
            input: None,
        }
    }

    /// The call's reference pictures, prepared as FLUX.3 prepares them.
    fn references(&self) -> Prepared {
        let Some(paths) = self.call["image"].as_array() else {
            return Prepared::default();
        };
        let images: Vec<image::DynamicImage> = (paths.iter())
            .map(|p| image::open(models().join("reference").join(p.as_str().unwrap())).unwrap())
            .collect();
        let labelled: Vec<(&image::DynamicImage, &str)> =
            images.iter().map(|i| (i, "reference")).collect();
        Prepared::new(&labelled).unwrap()
    }
}

fn values(a: &Array) -> Vec<f32> {
    a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap()
}

fn max_abs(ours: &Array, theirs: &Array) -> f32 {
    assert_eq!(ours.shape(), theirs.shape(), "shapes differ");
    let (a, b) = (values(ours), values(theirs));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn pipeline(model: &str) -> Flux3Pipeline<DiffusersDir> {
    let dir = DiffusersDir::open(&models().join(model)).unwrap();
    Flux3Pipeline::new(dir, Dtype::F32).unwrap()
}

/// One case stage by stage, then whole from the seed: ≥ 99.9% of the picture's values equal
/// to diffusers', none off by more than 1.
fn check(name: &str) {
    let case = Case::load(name);
    let mut p = pipeline(&case.model());
    let references = case.references();
    let req = case.request(&references);
    assert_eq!(
        p.guided(&req),
        case.tensors.contains_key("negative_prompt_embeds")
    );

    // Tokens: Qwen3-VL-Instruct's template, no think block.
    let ids = p.token_ids(&req.prompt).unwrap();
    let want: Vec<u32> = (case.call["token_ids"].as_array().unwrap().iter())
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, want);
    assert_eq!(
        pipeline::window(ids.len()),
        case.call["window"].as_u64().unwrap() as usize
    );

    // Prompt features over the whole window, padding rows included.
    let encoder = p.load_text_encoder().unwrap();
    let embeds = p.prompt_embeds(&encoder, &req.prompt).unwrap();
    let d = max_abs(&embeds, &case.unbatched("prompt_embeds"));
    println!("{name} prompt_embeds max |Δ| {d:e}");
    assert!(d < 1e-4, "prompt_embeds differ by {d}");
    let negative = match p.guided(&req) {
        true => {
            let n = p.prompt_embeds(&encoder, "").unwrap();
            let d = max_abs(&n, &case.unbatched("negative_prompt_embeds"));
            println!("{name} negative_prompt_embeds max |Δ| {d:e}");
            assert!(d < 1e-4, "negative_prompt_embeds differ by {d}");
            Some(n)
        }
        false => None,
    };
    drop(encoder);

    // The schedule, bit for bit.
    let schedule = p.schedule(req.steps);
    assert_eq!(schedule.sigmas, values(&case.array("sigmas")));
    assert_eq!(schedule.timesteps, values(&case.array("timesteps")));

    // The references' tokens and the first step's velocity, from diffusers' own input.
    let grid = p.grid(&req);
    let mut grids = Vec::new();
    let refs = match references.pictures.is_empty() {
        true => None,
        false => {
            let encoder = p.load_vae_encoder().unwrap();
            let (tokens, g) = p.reference_tokens(&encoder, &references).unwrap();
            let d = max_abs(&tokens, &case.unbatched("image_cond_latents"));
            println!("{name} reference tokens max |Δ| {d:e}");
            assert!(d < 1e-4, "reference tokens differ by {d}");
            grids = g;
            Some(tokens)
        }
    };
    let transformer = p.load_transformer().unwrap();
    let cfg = &p.configs.transformer.clone();
    let x = case.unbatched("step0.model_input");
    let t = case.array("step0.timestep").to_vec::<f32>().unwrap()[0] * 1000.0;
    let target =
        (case.tensors.get("step0.target_timestep")).map(|a| a.to_vec::<f32>().unwrap()[0] * 1000.0);
    let rope = Rope::new(cfg, embeds.dim(0) as usize, grid, &grids).unwrap();
    let v = transformer
        .forward(&x, (t, target), &embeds, refs.as_ref(), &rope)
        .unwrap();
    let d = max_abs(&v, &case.unbatched("step0.model_output"));
    println!("{name} step 0 velocity max |Δ| {d:e}");
    assert!(d < 1e-3, "step 0 velocity differs by {d}");
    if let Some(n) = &negative {
        let rope = Rope::new(cfg, n.dim(0) as usize, grid, &grids).unwrap();
        let v = (transformer.forward(&x, (t, target), n, refs.as_ref(), &rope)).unwrap();
        let d = max_abs(&v, &case.unbatched("step0.model_output_neg"));
        println!("{name} step 0 unconditional velocity max |Δ| {d:e}");
        assert!(d < 1e-3, "step 0 unconditional velocity differs by {d}");
    }
    drop(transformer);

    // Whole, from the seed alone.
    let out = p
        .generate_from(&req, &references, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    let (h, w) = grid;
    let c = cfg.in_channels;
    let latents = out
        .latents
        .transpose(&[1, 0])
        .unwrap()
        .reshape(&[c, h, w])
        .unwrap();
    let d = max_abs(&latents, &case.unbatched("final_latents"));
    println!("{name} final latents max |Δ| {d:e}");
    let theirs = case.array("image");
    let shape = theirs.shape();
    assert_eq!((out.height, out.width), (shape[0] as u32, shape[1] as u32));
    let (same, worst) = compare_pixels(&out.rgb, &theirs.to_vec::<u8>().unwrap());
    println!(
        "{name} image: {:.4}% of values identical, worst off by {worst}",
        same * 100.0
    );
    assert!(
        same >= 0.999 && worst <= 1,
        "{name}: {:.4}% identical, worst off by {worst}",
        same * 100.0
    );
}

#[test]
fn text_to_image_on_the_flow_map_matches_diffusers() {
    check("t2i");
}

#[test]
fn the_base_model_with_guidance_matches_diffusers() {
    check("base-cfg");
}

#[test]
fn an_edit_from_one_reference_matches_diffusers_and_is_cropped_back() {
    check("edit1");
}

#[test]
fn an_edit_from_two_references_matches_diffusers() {
    check("edit2");
}

/// bf16 follows diffusers' own bf16 run, its q/k norms kept in f32 as diffusers keeps them:
/// the final latents stay well within the reference's own f32 ↔ bf16 distance.
#[test]
fn bf16_follows_the_reference_run_in_bf16() {
    let case = Case::load("t2i-bf16");
    let full = Case::load("t2i");
    let dir = DiffusersDir::open(&models().join(case.model())).unwrap();
    let mut p = Flux3Pipeline::new(dir, Dtype::BF16).unwrap();
    let req = case.request(&Prepared::default());
    let out = p
        .generate_from(&req, &Prepared::default(), &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
    let (h, w) = p.grid(&req);
    let c = p.configs.transformer.in_channels;
    let latents = (out.latents.transpose(&[1, 0]).unwrap())
        .reshape(&[c, h, w])
        .unwrap();
    let theirs = case.unbatched("final_latents");
    let d = max_abs(&latents, &theirs);
    let own = max_abs(&full.unbatched("final_latents"), &theirs);
    println!("bf16 final latents max |Δ| {d:e} (the reference's f32 ↔ bf16: {own:e})");
    assert!(d < own / 4.0, "bf16 final latents differ by {d}");
}

#[test]
fn pictures_to_start_from_and_masks_are_refused_by_name() {
    let p = pipeline("flux3-klein-tiny");
    let mut req = Case::load("t2i").request(&Prepared::default());
    let rgb = vec![0u8; (req.width * req.height * 3) as usize];
    req.input = Some(zimage::pipeline::ImageInput {
        rgb,
        mask: None,
        strength: 0.6,
    });
    let e = p.validate(&req).unwrap_err().to_string();
    assert!(e.contains("--image") && e.contains("FLUX.3 [klein]"), "{e}");
    req.input.as_mut().unwrap().mask = Some(vec![1u8; (req.width * req.height) as usize]);
    let e = p.validate(&req).unwrap_err().to_string();
    assert!(e.contains("--mask") && e.contains("FLUX.3 [klein]"), "{e}");
}

#[test]
fn a_modular_index_reads_as_the_classic_one() {
    let dir = DiffusersDir::open(&models().join("flux3-klein-tiny")).unwrap();
    let family = zimage::families::Family::of(&dir).unwrap();
    assert_eq!(family.name(), "FLUX.3 [klein]");
    let index: serde_json::Value = serde_json::from_slice(dir.index.as_ref().unwrap()).unwrap();
    assert_eq!(
        index["transformer"],
        serde_json::json!(["diffusers", "Flux3Transformer2DModel"])
    );
}
