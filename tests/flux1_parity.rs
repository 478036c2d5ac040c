//! FLUX.1 against diffusers 0.42.1 dumps of the tiny \[dev\], \[schnell\] and Kontext models (f32),
//! stage by stage: CLIP's and T5's ids and outputs, noise and schedule, each step's transformer
//! output, the VAE's input and output, and the picture from the seed alone; text → image with
//! embedded guidance, \[schnell\], true CFG, a Kontext edit, image-to-image and inpainting.

mod common;

use common::compare_pixels;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::flux1::{kontext, pipeline as flux1, Flux1Pipeline};
use zimage::mlx::{io, Array, Dtype};
use zimage::pipeline::reference::Reference;
use zimage::pipeline::{ImageInput, Request};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

/// One reference run: its tensors and the call's arguments.
struct Case {
    tensors: HashMap<String, Array>,
    call: serde_json::Value,
}

impl Case {
    fn load(name: &str) -> Case {
        let path = models().join(format!("reference/flux1-{name}.safetensors"));
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

    /// A tensor without its batch axis, f32.
    fn unbatched(&self, name: &str) -> Array {
        self.array(name)
            .squeeze(0)
            .unwrap()
            .astype(Dtype::F32)
            .unwrap()
    }

    fn ids(&self, name: &str) -> Vec<u32> {
        let a = self.array(name).astype(Dtype::I32).unwrap();
        let v = a.reshape(&[-1]).unwrap().to_vec::<i32>().unwrap();
        v.into_iter().map(|i| i as u32).collect()
    }

    fn request(&self) -> Request {
        let c = &self.call;
        Request {
            prompt: c["prompt"].as_str().unwrap().into(),
            negative_prompt: c["negative_prompt"].as_str().map(str::to_string),
            width: c["width"].as_u64().unwrap() as u32,
            height: c["height"].as_u64().unwrap() as u32,
            steps: c["num_inference_steps"].as_u64().unwrap() as usize,
            guidance: c["guidance_scale"].as_f64().unwrap() as f32,
            cfg_normalization: false,
            cfg_truncation: 1.0,
            seed: c["seed"].as_u64().unwrap(),
            noise: None,
            input: None,
        }
    }

    fn picture(&self, key: &str) -> image::DynamicImage {
        let path = models()
            .join("reference")
            .join(self.call[key].as_str().unwrap());
        image::open(path).unwrap()
    }
}

fn values(a: &Array) -> Vec<f32> {
    a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap()
}

/// The largest difference, after checking the shapes agree.
fn max_abs(ours: &Array, theirs: &Array) -> f32 {
    assert_eq!(ours.shape(), theirs.shape(), "shapes differ");
    let (a, b) = (values(ours), values(theirs));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn pipeline(model: &str, dtype: Dtype) -> Flux1Pipeline<DiffusersDir> {
    let dir = DiffusersDir::open(&models().join(model)).unwrap();
    Flux1Pipeline::new(dir, dtype).unwrap()
}

/// The prompts, the schedule and each step's transformer output from the reference's own
/// inputs.
fn check_stages(case: &Case, p: &Flux1Pipeline<DiffusersDir>, reference_grid: Option<(i32, i32)>) {
    let req = case.request();
    let name = case.call["case"].as_str().unwrap();
    assert_eq!(p.clip_ids(&req.prompt).unwrap(), case.ids("clip_ids"));
    assert_eq!(p.t5_ids(&req.prompt).unwrap(), case.ids("t5_ids"));
    let prompt = p.prompt(&req.prompt).unwrap();
    let d = max_abs(&prompt.pooled, &case.unbatched("pooled_prompt_embeds"));
    assert!(d < 1e-5, "{name}: pooled differs by {d}");
    let d = max_abs(&prompt.rows, &case.unbatched("prompt_embeds"));
    assert!(d < 1e-4, "{name}: T5 rows differ by {d}");
    let negative = req.negative_prompt.as_ref().map(|n| {
        let neg = p.prompt(n).unwrap();
        let d = max_abs(&neg.rows, &case.unbatched("negative_prompt_embeds"));
        assert!(d < 1e-4, "{name}: negative rows differ by {d}");
        neg
    });

    // The schedule, bit for bit, over the output's tokens.
    let (h, w) = p.grid(&req);
    let schedule = p
        .configs
        .scheduler
        .line_schedule(req.steps, (h * w) as usize);
    assert_eq!(schedule.sigmas, values(&case.array("sigmas")), "{name} σ");
    assert_eq!(
        schedule.timesteps,
        values(&case.array("timesteps")),
        "{name} t"
    );

    let transformer = p.load_transformer().unwrap();
    let cfg = &p.configs.transformer;
    let text = prompt.rows.dim(0) as usize;
    let ids = zimage::families::flux1::rope::ids(text, (h, w), reference_grid);
    let rope = zimage::families::flux1::rope::tables(&ids, &cfg.axes_dims_rope).unwrap();
    let condition = reference_grid.map(|_| case.unbatched("condition_latents"));
    let steps = case.call["steps_run"].as_u64().unwrap() as usize;
    let first = req.steps - steps;
    for k in 0..steps {
        let t = schedule.timesteps[first + k];
        let sent = values(&case.array(&format!("step{k}.timestep")))[0];
        assert_eq!(sent, t / 1000.0, "{name} step {k}: timestep");
        let input = case.unbatched(&format!("step{k}.model_input"));
        let tokens = match &condition {
            Some(c) => zimage::mlx::ops::concatenate(&[&input, c], 0).unwrap(),
            None => input,
        };
        let guidance = p.embedded_guidance(&req);
        let forward = |q: &flux1::Prompt| {
            let out = transformer
                .forward(&tokens, t, guidance, &q.pooled, &q.rows, &rope)
                .unwrap();
            out.slice_axis(0, 0, h * w).unwrap()
        };
        let d = max_abs(
            &forward(&prompt),
            &case.unbatched(&format!("step{k}.model_output")),
        );
        println!("{name} step {k} transformer max |Δ| {d:e}");
        assert!(
            d < 1e-4,
            "{name} step {k}: transformer output differs by {d}"
        );
        if let Some(neg) = &negative {
            let theirs = case.unbatched(&format!("step{k}.model_output_neg"));
            let d = max_abs(&forward(neg), &theirs);
            assert!(d < 1e-4, "{name} step {k}: negative output differs by {d}");
        }
    }

    // The VAE's input (unpacked) and its output.
    let z = flux1::unpack(&case.unbatched("final_latents"), (h, w)).unwrap();
    let vae_input = case.unbatched("vae_input");
    let scale = p.configs.vae.scaling_factor;
    let shift = p.configs.vae.shift_factor.unwrap();
    let d = max_abs(&((&z / scale).unwrap() + shift).unwrap(), &vae_input);
    assert!(d < 1e-5, "{name}: vae_input differs by {d}");
    let decoded = p.load_vae().unwrap().decode(&z).unwrap();
    let want = case.unbatched("decoded").transpose(&[1, 2, 0]).unwrap();
    let d = max_abs(&decoded, &want);
    println!("{name} decoded max |Δ| {d:e}");
    assert!(d < 1e-4, "{name}: decoded image differs by {d}");
}

/// The whole run from the seed alone: final latents and the picture.
fn check_whole(
    case: &Case,
    p: &mut Flux1Pipeline<DiffusersDir>,
    req: &Request,
    reference: Option<&Reference>,
) {
    let name = case.call["case"].as_str().unwrap();
    let out = p
        .generate_from(req, reference, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    let d = max_abs(&out.latents, &case.unbatched("final_latents"));
    println!("{name} final latents max |Δ| {d:e}");
    assert!(d < 1e-3, "{name}: final latents differ by {d}");
    let theirs = case.array("image").to_vec::<u8>().unwrap();
    let (same, worst) = compare_pixels(&out.rgb, &theirs);
    println!(
        "{name} image: {:.4}% of values identical, worst off by {worst}",
        same * 100.0
    );
    assert!(
        same >= 0.999 && worst <= 1,
        "{name}: {same} identical, worst {worst}"
    );
}

#[test]
fn dev_text_to_image_with_embedded_guidance_matches_diffusers() {
    let case = Case::load("t2i-dev");
    let mut p = pipeline("flux1-dev-tiny", Dtype::F32);
    check_stages(&case, &p, None);
    // μ on the line through (256, 0.5) and (4096, 1.15), for 11 × 7 tokens.
    let mu = values(&case.array("mu"))[0] as f64;
    assert!((p.configs.scheduler.line_mu(77) - mu).abs() < 1e-6);
    // The noise, drawn over the VAE's latent grid and then packed.
    let req = case.request();
    let (h, w) = p.grid(&req);
    let c = p.configs.vae.latent_channels;
    let noise = zimage::torch_rng::Generator::new(req.seed)
        .randn((c * 4 * h * w) as usize)
        .unwrap();
    let noise = Array::from_slice(&noise, &[c, 2 * h, 2 * w]).unwrap();
    let noise = flux1::pack(&flux1::patchify(&noise).unwrap()).unwrap();
    let d = max_abs(&noise, &case.unbatched("latents_init"));
    assert!(d <= 4.0 * f32::EPSILON, "seeded noise differs by {d}");
    check_whole(&case, &mut p, &req, None);
}

#[test]
fn schnell_without_guidance_matches_diffusers() {
    let case = Case::load("t2i-schnell");
    let mut p = pipeline("flux1-schnell-tiny", Dtype::F32);
    assert!(!p.configs.transformer.guidance_embeds);
    assert_eq!(p.t5_ids("").unwrap().len(), 256, "[schnell]'s T5 window");
    // A static shift of 1: the sigmas are numpy's linspace.
    let sigmas = values(&case.array("sigmas"));
    assert_eq!(
        &sigmas[..3],
        &[1.0, (2.0f64 / 3.0) as f32, (1.0f64 / 3.0) as f32]
    );
    check_stages(&case, &p, None);
    let req = case.request();
    assert_eq!(p.embedded_guidance(&req), None);
    check_whole(&case, &mut p, &req, None);
}

#[test]
fn true_cfg_with_a_negative_prompt_matches_diffusers() {
    let case = Case::load("true-cfg");
    let mut p = pipeline("flux1-dev-tiny", Dtype::F32);
    p.set_true_cfg(case.call["true_cfg_scale"].as_f64().unwrap() as f32);
    let req = case.request();
    assert!(p.guided(&req));
    check_stages(&case, &p, None);
    check_whole(&case, &mut p, &req, None);
}

#[test]
fn true_cfg_without_a_negative_prompt_is_refused() {
    let mut p = pipeline("flux1-dev-tiny", Dtype::F32);
    p.set_true_cfg(2.0);
    let mut req = Case::load("t2i-dev").request();
    req.negative_prompt = None;
    let err = p.validate(&req).unwrap_err().to_string();
    assert!(
        err.contains("--true-cfg") && err.contains("--negative"),
        "{err}"
    );
}

#[test]
fn kontext_editing_matches_diffusers() {
    let case = Case::load("kontext");
    let mut p = pipeline("flux1-kontext-tiny", Dtype::F32);
    assert!(p.configs.kontext);
    // The reference at its own size (auto-resize off in the dump), as the encoder takes it.
    let img = case.picture("image");
    let reference = Reference {
        rgb: img.to_rgb8().into_raw(),
        width: img.width(),
        height: img.height(),
    };
    let x = zimage::models::vae_encoder::image_to_array(
        &reference.rgb,
        reference.width,
        reference.height,
    )
    .unwrap();
    let theirs = case
        .unbatched("encode0.input")
        .transpose(&[1, 2, 0])
        .unwrap();
    assert_eq!(max_abs(&x, &theirs), 0.0, "reference prepared differently");
    let encoder = p.load_vae_encoder().unwrap();
    let tokens = p.reference_tokens(&encoder, &reference).unwrap();
    let d = max_abs(&tokens, &case.unbatched("condition_latents"));
    println!("kontext reference tokens max |Δ| {d:e}");
    assert!(d < 1e-4, "reference tokens differ by {d}");
    let cell = p.cell();
    let grid = (
        (reference.height / cell) as i32,
        (reference.width / cell) as i32,
    );
    // The ids: text zeros, the output at (0, i, j), the picture at (1, i, j).
    let (h, w) = p.grid(&case.request());
    let ids = zimage::families::flux1::rope::ids(0, (h, w), Some(grid));
    let theirs = values(&case.array("img_ids"));
    let ours: Vec<f32> = ids.iter().flatten().map(|&v| v as f32).collect();
    assert_eq!(ours, theirs, "image and reference ids");
    check_stages(&case, &p, Some(grid));
    check_whole(&case, &mut p, &case.request(), Some(&reference));
}

#[test]
fn kontext_stretches_the_picture_to_the_nearest_preferred_resolution() {
    let case = Case::load("kontext-resize");
    let img = case.picture("image");
    let want = (
        case.call["reference_width"].as_u64().unwrap() as u32,
        case.call["reference_height"].as_u64().unwrap() as u32,
    );
    assert_eq!(
        kontext::preferred_size((img.width(), img.height()), 8, 1024),
        want
    );
    let r = kontext::prepare(&img, 8, 1024, "picture").unwrap();
    assert_eq!((r.width, r.height), want);
    // diffusers' stretched picture, exactly the 8-bit picture it fed the encoder.
    let theirs = case.picture("resized").to_rgb8().into_raw();
    let (same, worst) = compare_pixels(&r.rgb, &theirs);
    println!(
        "stretched picture: {:.4}% of values identical, worst off by {worst}",
        same * 100.0
    );
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, worst {worst}"
    );
}

/// An image task's input as the runner prepares it: the picture (and mask) at the request's
/// size.
fn image_input(case: &Case, mask: bool) -> ImageInput {
    let req = case.request();
    let (w, h) = (req.width, req.height);
    let rgb = zimage::image_in::picture(&case.picture("image"), w, h).into_raw();
    let mask = mask.then(|| zimage::image_in::mask(&case.picture("mask_image"), w, h));
    ImageInput {
        rgb,
        mask,
        strength: case.call["strength"].as_f64().unwrap(),
    }
}

#[test]
fn image_to_image_matches_diffusers() {
    let case = Case::load("img2img");
    let mut p = pipeline("flux1-dev-tiny", Dtype::F32);
    let input = image_input(&case, false);
    let x = zimage::models::vae_encoder::image_to_array(&input.rgb, 80, 64).unwrap();
    let theirs = case
        .unbatched("encode0.input")
        .transpose(&[1, 2, 0])
        .unwrap();
    let d = max_abs(&x, &theirs);
    assert!(
        d <= 2.0 / 255.0 + 1e-6,
        "the stretched picture differs by {d}"
    );
    check_stages(&case, &p, None);
    let req = Request {
        input: Some(input),
        ..case.request()
    };
    check_whole(&case, &mut p, &req, None);
}

#[test]
fn inpainting_matches_diffusers() {
    let case = Case::load("inpaint");
    let mut p = pipeline("flux1-dev-tiny", Dtype::F32);
    let input = image_input(&case, true);
    let mask = p
        .token_mask(input.mask.as_deref().unwrap(), (80, 64))
        .unwrap();
    assert_eq!(values(&mask), values(&case.unbatched("mask")), "token mask");
    check_stages(&case, &p, None);
    let req = Request {
        input: Some(input),
        ..case.request()
    };
    check_whole(&case, &mut p, &req, None);
}

/// bf16 follows the reference's roundings: its final latents are held to a few bf16 steps.
#[test]
fn bf16_follows_the_reference_run_in_bf16() {
    let case = Case::load("t2i-dev-bf16");
    let mut p = pipeline("flux1-dev-tiny", Dtype::BF16);
    let req = case.request();
    let out = p
        .generate(&req, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    let d = max_abs(&out.latents, &case.unbatched("final_latents"));
    let f32_case = Case::load("t2i-dev");
    let own = max_abs(
        &case.unbatched("final_latents"),
        &f32_case.unbatched("final_latents"),
    );
    println!("bf16 final latents max |Δ| {d:e} (the reference's own f32 ↔ bf16: {own:e})");
    assert!(d < own / 2.0, "bf16 final latents differ by {d}");
}
