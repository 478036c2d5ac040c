//! FLUX.2 [klein] against diffusers 0.42.1 dumps of the tiny klein model (f32), stage by stage:
//! prompt features, noise and schedule, each step's transformer output, the VAE's input and
//! output, and the final picture from the seed alone.

mod common;

use common::compare_pixels;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::flux2_klein::{pipeline as klein, KleinPipeline};
use zimage::mlx::{io, Array, Dtype};
use zimage::pipeline::Request;

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
        let path = models().join(format!("reference/klein-{name}.safetensors"));
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
        let a = self.array(name);
        a.squeeze(0).unwrap().astype(Dtype::F32).unwrap()
    }

    fn request(&self) -> Request {
        let c = &self.call;
        let size = (c["width"].as_u64().unwrap(), c["height"].as_u64().unwrap());
        self.request_of(size.0 as u32, size.1 as u32)
    }

    /// The request, its size from the first reference where the call names none.
    fn request_sized(&self, first: &zimage::pipeline::reference::Reference) -> Request {
        let c = &self.call;
        let width = c["width"].as_u64().map_or(first.width, |w| w as u32);
        let height = c["height"].as_u64().map_or(first.height, |h| h as u32);
        self.request_of(width, height)
    }

    fn request_of(&self, width: u32, height: u32) -> Request {
        let c = &self.call;
        Request {
            prompt: c["prompt"].as_str().unwrap().into(),
            negative_prompt: None,
            width,
            height,
            steps: c["num_inference_steps"].as_u64().unwrap() as usize,
            guidance: c["guidance_scale"].as_f64().unwrap() as f32,
            cfg_normalization: false,
            cfg_truncation: 1.0,
            seed: c["seed"].as_u64().unwrap(),
            noise: None,
            input: None,
        }
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

fn pipeline(model: &str) -> KleinPipeline<DiffusersDir> {
    let dir = DiffusersDir::open(&models().join(model)).unwrap();
    KleinPipeline::new(dir, Dtype::F32).unwrap()
}

#[test]
fn text_to_image_matches_diffusers_stage_by_stage() {
    check_text_case("t2i", "flux2-klein-tiny");
}

#[test]
fn a_base_model_with_guidance_matches_diffusers() {
    check_text_case("base-cfg", "flux2-klein-tiny-base");
}

/// A text → image case (with classifier-free guidance when its reference has the negative
/// branch), stage by stage, then whole from the seed.
fn check_text_case(name: &str, model: &str) {
    let case = Case::load(name);
    let mut p = pipeline(model);
    let req = case.request();
    let guided = case.tensors.contains_key("negative_prompt_embeds");
    assert_eq!(p.guided(&req), guided);

    // Tokens: the chat template with its empty think block.
    let ids = p.token_ids(&req.prompt).unwrap();
    let want: Vec<u32> = case.call["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, want);

    // Prompt features over all 512 rows, padding rows included.
    let encoder = p.load_text_encoder().unwrap();
    let embeds = p.prompt_embeds(&encoder, &req.prompt).unwrap();
    let d = max_abs(&embeds, &case.unbatched("prompt_embeds"));
    println!("prompt_embeds max |Δ| {d:e}");
    assert!(d < 1e-4, "prompt_embeds differ by {d}");
    if guided {
        let negative = p.prompt_embeds(&encoder, "").unwrap();
        let d = max_abs(&negative, &case.unbatched("negative_prompt_embeds"));
        println!("negative_prompt_embeds max |Δ| {d:e}");
        assert!(d < 1e-4, "negative_prompt_embeds differ by {d}");
    }

    // Noise drawn in token space from the seed, packed (torch's vectorised Box–Muller may
    // round a value one ulp away, as for Z-Image).
    let (h, w) = p.grid(&req);
    let c = p.configs.transformer.in_channels;
    let noise = zimage::torch_rng::Generator::new(req.seed)
        .randn((c * h * w) as usize)
        .unwrap();
    let noise = klein::pack(&Array::from_slice(&noise, &[c, h, w]).unwrap()).unwrap();
    let d = max_abs(&noise, &case.unbatched("latents_init"));
    assert!(d <= 4.0 * f32::EPSILON, "seeded noise differs by {d}");

    // The schedule, bit for bit.
    let mu = zimage::scheduler::empirical_mu((h * w) as usize, req.steps);
    let schedule = zimage::scheduler::Schedule::exponential(req.steps, mu);
    assert_eq!(schedule.sigmas, values(&case.array("sigmas")));
    assert_eq!(schedule.timesteps, values(&case.array("timesteps")));

    // Each step's transformer output from the reference's own input.
    let transformer = p.load_transformer().unwrap();
    let cfg = &p.configs.transformer;
    let ids = zimage::families::flux2_klein::rope::ids(klein::MAX_SEQUENCE_LENGTH, (h, w), &[]);
    let rope =
        zimage::families::flux2_klein::rope::tables(&ids, &cfg.axes_dims_rope, cfg.rope_theta)
            .unwrap();
    let text = case.unbatched("prompt_embeds");
    for i in 0..req.steps {
        let input = case.unbatched(&format!("step{i}.model_input"));
        let out = transformer
            .forward(&input, schedule.timesteps[i], &text, &rope)
            .unwrap();
        let d = max_abs(&out, &case.unbatched(&format!("step{i}.model_output")));
        println!("step {i} transformer max |Δ| {d:e}");
        assert!(d < 1e-4, "step {i}: transformer output differs by {d}");
        if guided {
            let negative = case.unbatched("negative_prompt_embeds");
            let out = transformer
                .forward(&input, schedule.timesteps[i], &negative, &rope)
                .unwrap();
            let d = max_abs(&out, &case.unbatched(&format!("step{i}.model_output_neg")));
            assert!(d < 1e-4, "step {i}: unguided output differs by {d}");
        }
    }

    // The VAE's input (un-normalised, unpatchified) and its output.
    let z = p
        .vae_latents(&case.unbatched("final_latents"), (h, w))
        .unwrap();
    let d = max_abs(&z, &case.unbatched("vae_input"));
    println!("vae_input max |Δ| {d:e}");
    assert!(d < 1e-5, "vae_input differs by {d}");
    let decoded = p.load_vae().unwrap().decode(&z).unwrap();
    let want = case.unbatched("decoded").transpose(&[1, 2, 0]).unwrap();
    let d = max_abs(&decoded, &want);
    println!("decoded max |Δ| {d:e}");
    assert!(d < 1e-4, "decoded image differs by {d}");

    // The whole run from the seed alone.
    let out = p
        .generate(&req, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    let d = max_abs(&out.latents, &case.unbatched("final_latents"));
    println!("final latents max |Δ| {d:e}");
    let theirs = case.array("image").to_vec::<u8>().unwrap();
    let (same, worst) = compare_pixels(&out.rgb, &theirs);
    println!(
        "image: {:.4}% of values identical, worst off by {worst}",
        same * 100.0
    );
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, worst {worst}"
    );
}

#[test]
fn options_klein_lacks_are_refused_before_anything_loads() {
    let p = pipeline("flux2-klein-tiny");
    let mut req = Case::load("t2i").request();
    req.cfg_truncation = 0.5;
    let err = p.validate(&req).unwrap_err().to_string();
    assert!(err.contains("--cfg-truncation"), "{err}");
    req.cfg_truncation = 1.0;
    req.width = 90;
    let err = p.validate(&req).unwrap_err().to_string();
    assert!(err.contains("--width is 90"), "{err}");
}

/// bf16 follows the reference's roundings (the timestep quantised three times, the Euler
/// product in bf16): its final latents are held to the spread of two bf16 attention kernels in
/// the reference (0.031, one bf16 step at values of 4–8), a sixth of the reference's own f32 ↔
/// bf16 distance (0.29).
#[test]
fn bf16_follows_the_reference_run_in_bf16() {
    let case = Case::load("t2i-bf16");
    let dir = DiffusersDir::open(&models().join("flux2-klein-tiny")).unwrap();
    let mut p = KleinPipeline::new(dir, Dtype::BF16).unwrap();
    let req = case.request();
    let transformer = p.load_transformer().unwrap();
    for i in 0..req.steps {
        let sent = values(&case.array(&format!("step{i}.timestep")))[0];
        let t = values(&case.array("timesteps"))[i];
        let seen = transformer.model_time(t).unwrap();
        let want = Array::from_slice(&[sent * 1000.0], &[1]).unwrap();
        let want = values(&want.astype(Dtype::BF16).unwrap())[0];
        assert_eq!(
            seen, want,
            "step {i}: the model sees {seen}, the reference {want}"
        );
    }
    let out = p
        .generate(&req, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    let d = max_abs(&out.latents, &case.unbatched("final_latents"));
    println!("bf16 final latents max |Δ| {d:e}");
    assert!(d < 0.05, "bf16 final latents differ by {d}");
}

#[test]
fn editing_from_one_reference_matches_diffusers() {
    check_edit_case("edit1");
}

#[test]
fn editing_from_two_references_matches_diffusers() {
    check_edit_case("edit2");
}

/// An edit: the references prepared and encoded as diffusers does, each step's transformer
/// output over output and reference tokens, and the picture from the seed alone (its size
/// from the first reference when the call names none).
fn check_edit_case(name: &str) {
    let case = Case::load(name);
    let mut p = pipeline("flux2-klein-tiny");
    let cell = p.cell();
    let references: Vec<zimage::pipeline::reference::Reference> = case.call["image"]
        .as_array()
        .unwrap()
        .iter()
        .map(|path| {
            let path = models().join("reference").join(path.as_str().unwrap());
            let img = image::open(&path).unwrap();
            zimage::pipeline::reference::Reference::prepare(&img, cell, "reference").unwrap()
        })
        .collect();
    for (k, r) in references.iter().enumerate() {
        let ours = zimage::models::vae_encoder::image_to_array(&r.rgb, r.width, r.height).unwrap();
        let theirs = case
            .unbatched(&format!("encode{k}.input"))
            .transpose(&[1, 2, 0])
            .unwrap();
        assert_eq!(
            max_abs(&ours, &theirs),
            0.0,
            "reference {k} prepared differently"
        );
    }
    let encoder = p.load_vae_encoder().unwrap();
    let (tokens, grids) = p.reference_tokens(&encoder, &references).unwrap();
    let d = max_abs(&tokens, &case.unbatched("condition_latents"));
    println!("{name} reference tokens max |Δ| {d:e}");
    assert!(d < 1e-4, "reference tokens differ by {d}");

    let mut req = case.request_sized(&references[0]);
    req.guidance = case.call["guidance_scale"].as_f64().unwrap() as f32;
    let (h, w) = p.grid(&req);
    let cfg = &p.configs.transformer;
    let ids = zimage::families::flux2_klein::rope::ids(klein::MAX_SEQUENCE_LENGTH, (h, w), &grids);
    let rope =
        zimage::families::flux2_klein::rope::tables(&ids, &cfg.axes_dims_rope, cfg.rope_theta)
            .unwrap();
    let transformer = p.load_transformer().unwrap();
    let text = case.unbatched("prompt_embeds");
    let timesteps = values(&case.array("timesteps"));
    for (i, &t) in timesteps.iter().enumerate() {
        // The dumps hold the output rows; the reference rows are the condition tokens.
        let latents = case.unbatched(&format!("step{i}.model_input"));
        let input = zimage::mlx::ops::concatenate(&[&latents, &tokens], 0).unwrap();
        let out = transformer.forward(&input, t, &text, &rope).unwrap();
        let out = out.slice_axis(0, 0, h * w).unwrap();
        let d = max_abs(&out, &case.unbatched(&format!("step{i}.model_output")));
        println!("{name} step {i} transformer max |Δ| {d:e}");
        assert!(d < 1e-4, "step {i}: transformer output differs by {d}");
    }

    let out = p
        .generate_from(&req, &references, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    let d = max_abs(&out.latents, &case.unbatched("final_latents"));
    println!("{name} final latents max |Δ| {d:e}");
    let theirs = case.array("image").to_vec::<u8>().unwrap();
    let (same, worst) = compare_pixels(&out.rgb, &theirs);
    println!(
        "{name} image: {:.4}% of values identical, worst off by {worst}",
        same * 100.0
    );
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, worst {worst}"
    );
}

/// The picture diffusers encoded (`encode0.input`, in [-1, 1]) as the bytes it came from.
fn encoded_picture(case: &Case) -> (Vec<u8>, u32, u32) {
    let x = case.unbatched("encode0.input");
    let (h, w) = (x.dim(1) as u32, x.dim(2) as u32);
    let hwc = values(&x.transpose(&[1, 2, 0]).unwrap());
    let rgb = hwc
        .iter()
        .map(|v| ((v + 1.0) / 2.0 * 255.0).round() as u8)
        .collect();
    (rgb, w, h)
}

#[test]
fn inpainting_matches_diffusers() {
    let case = Case::load("inpaint");
    let mut p = pipeline("flux2-klein-tiny");
    let (rgb, width, height) = encoded_picture(&case);
    let mask_png = models()
        .join("reference")
        .join(case.call["mask_image"].as_str().unwrap());
    let mask = zimage::image_in::mask(&image::open(&mask_png).unwrap(), width, height);
    let input = zimage::pipeline::ImageInput {
        rgb,
        mask: Some(mask),
        strength: case.call["strength"].as_f64().unwrap(),
    };
    let tokens = klein::token_mask(input.mask.as_deref(), (width, height), p.cell());
    assert_eq!(tokens, values(&case.array("mask")), "token mask");

    let encoder = p.load_vae_encoder().unwrap();
    let (x0, _) = p
        .image_condition(&encoder, &input, (width, height))
        .unwrap();
    let d = max_abs(&x0, &case.unbatched("image_latents"));
    println!("inpaint image latents max |Δ| {d:e}");
    assert!(d < 1e-4, "image latents differ by {d}");

    let req = Request {
        input: Some(input),
        ..case.request_of(width, height)
    };
    let out = p
        .generate(&req, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    let d = max_abs(&out.latents, &case.unbatched("final_latents"));
    println!("inpaint final latents max |Δ| {d:e}");
    let theirs = case.array("image").to_vec::<u8>().unwrap();
    let (same, worst) = compare_pixels(&out.rgb, &theirs);
    println!(
        "inpaint image: {:.4}% of values identical, worst off by {worst}",
        same * 100.0
    );
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, worst {worst}"
    );
}

/// A base model inpainting with guidance and a reference picture beside its own.
#[test]
fn inpainting_with_a_reference_and_guidance_matches_diffusers() {
    let case = Case::load("inpaint-ref-cfg");
    let dir = DiffusersDir::open(&models().join("flux2-klein-tiny-base")).unwrap();
    let mut p = KleinPipeline::new(dir, Dtype::F32).unwrap();
    let (rgb, width, height) = encoded_picture(&case);
    let reference = models()
        .join("reference")
        .join(case.call["image_reference"].as_str().unwrap());
    let reference = zimage::pipeline::reference::Reference::prepare(
        &image::open(&reference).unwrap(),
        p.cell(),
        "ref",
    )
    .unwrap();
    let mask_png = models()
        .join("reference")
        .join(case.call["mask_image"].as_str().unwrap());
    let mask = zimage::image_in::mask(&image::open(&mask_png).unwrap(), width, height);
    let req = Request {
        guidance: case.call["guidance_scale"].as_f64().unwrap() as f32,
        input: Some(zimage::pipeline::ImageInput {
            rgb,
            mask: Some(mask),
            strength: case.call["strength"].as_f64().unwrap(),
        }),
        ..case.request_of(width, height)
    };
    assert!(p.guided(&req));
    let out = p
        .generate_from(&req, &[reference], &mut |_| ControlFlow::Continue(()))
        .unwrap();
    let d = max_abs(&out.latents, &case.unbatched("final_latents"));
    println!("inpaint-ref-cfg final latents max |Δ| {d:e}");
    let theirs = case.array("image").to_vec::<u8>().unwrap();
    let (same, worst) = compare_pixels(&out.rgb, &theirs);
    println!(
        "inpaint-ref-cfg image: {:.4}% of values identical, worst off by {worst}",
        same * 100.0
    );
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, worst {worst}"
    );
}

/// An edit in bf16 stays within the spread of the reference's own bf16 runs (see
/// [`bf16_follows_the_reference_run_in_bf16`]); the reference's f32 ↔ bf16 distance is 0.55.
#[test]
fn a_bf16_edit_follows_the_reference_run_in_bf16() {
    let case = Case::load("edit1-bf16");
    let dir = DiffusersDir::open(&models().join("flux2-klein-tiny")).unwrap();
    let mut p = KleinPipeline::new(dir, Dtype::BF16).unwrap();
    let path = models()
        .join("reference")
        .join(case.call["image"][0].as_str().unwrap());
    let reference = zimage::pipeline::reference::Reference::prepare(
        &image::open(&path).unwrap(),
        p.cell(),
        "ref",
    )
    .unwrap();
    let req = case.request_sized(&reference);
    let out = p
        .generate_from(&req, &[reference], &mut |_| ControlFlow::Continue(()))
        .unwrap();
    let d = max_abs(&out.latents, &case.unbatched("final_latents"));
    println!("bf16 edit final latents max |Δ| {d:e}");
    assert!(d < 0.05, "bf16 final latents differ by {d}");
}
