//! AUTOMATIC1111's API (`/sdapi/v1/`) as its clients call it: the `webuiapi` package drives
//! txt2img, img2img with a mask, a model switch through the options, progress and interrupt,
//! and gets the pixels `zimage generate` makes; bad input gets a 4xx that says what is wrong
//! and the server goes on serving.

mod common;

use common::s;
use common::server::{demo_store, get, json, pixels, post, Server};
use std::path::Path;
use std::process::Command;

/// The pixels `zimage generate "a red fox in the snow" --model tiny` makes with `flags`.
fn cli_generate(store: &Path, dir: &Path, flags: &[&str]) -> (u32, u32, Vec<u8>) {
    let png = dir.join("cli.png");
    let mut args = vec![
        "generate",
        "a red fox in the snow",
        "--model",
        "tiny",
        "--steps",
        "2",
        "--guidance",
        "0",
        "-o",
        s(&png),
    ];
    args.extend(flags);
    let out = common::zimage_in(store, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    pixels(&std::fs::read(&png).unwrap())
}

/// The reference inputs' 96×80 picture and its mask.
fn picture_and_mask() -> (std::path::PathBuf, std::path::PathBuf) {
    let inputs = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs");
    (
        inputs.join("picture-96x80.png"),
        inputs.join("mask-96x80.png"),
    )
}

/// The pixels of the command line's inpaint of `picture` (96×80) under `mask` at strength
/// 0.8 from seed 7, with `flags`.
fn cli_inpaint(
    store: &Path,
    dir: &Path,
    picture: &Path,
    mask: &Path,
    flags: &[&str],
) -> (u32, u32, Vec<u8>) {
    let mut args = vec![
        "--image",
        s(picture),
        "--mask",
        s(mask),
        "--strength",
        "0.8",
        "--seed",
        "7",
        "--width",
        "96",
        "--height",
        "80",
    ];
    args.extend(flags);
    cli_generate(store, dir, &args)
}

/// What a client script run by `command` reports: the JSON of its last line (webuiapi prints
/// what its model helper does before it). A script that fails shows its errors and the log.
fn client_report(command: &mut Command, server: &Server) -> serde_json::Value {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{:?}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    json(stdout.lines().last().unwrap_or_default())
}

/// The demo store with a second name for the demo model, created after `tiny`.
fn two_model_store(dir: &Path) -> std::path::PathBuf {
    let store = demo_store(dir);
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let out = common::zimage_in(&store, &["create", "other", "--from", s(&demo)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    store
}

/// How long a test waits for a job to reach a step before it fails: a deadline for a job that
/// never gets there, not a timing (a machine busy with builds may take minutes to load).
const PATIENCE_S: u64 = 300;

#[test]
fn webuiapi_gets_the_pixels_zimage_generate_makes() {
    let dir = tempfile::tempdir().unwrap();
    let store = two_model_store(dir.path());
    let server = Server::start(&store, &["--default-model", "tiny"], &[]);
    let python = common::test_python();
    let (picture, mask) = picture_and_mask();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/a1111_clients.py");
    let report = client_report(
        Command::new(python).arg(script).args([
            &server.url(),
            s(dir.path()),
            s(&picture),
            s(&mask),
            "other",
        ]),
        &server,
    );
    let hash = report["models"][0]
        .as_str()
        .unwrap()
        .split(" [")
        .nth(1)
        .unwrap()
        .to_string();
    assert_eq!(
        report["models"],
        serde_json::json!([format!("other [{hash}"), format!("tiny [{hash}")])
    );
    assert_eq!(report["samplers"], serde_json::json!(["Euler"]));
    assert_eq!(report["schedulers"], serde_json::json!(["automatic"]));
    assert_eq!(report["upscalers"], serde_json::json!(["None", "Lanczos"]));
    assert_eq!(report["current"], format!("tiny [{hash}"));

    // A batch of two from seed 7: seeds 7 and 8, each the CLI's image for its seed.
    let t = &report["txt2img"];
    assert_eq!(t["seed"], 7);
    assert_eq!(t["all_seeds"], serde_json::json!([7, 8]));
    assert_eq!(
        (t["width"].clone(), t["height"].clone()),
        (64.into(), 64.into())
    );
    assert_eq!(t["steps"], 2);
    assert_eq!(t["cfg_scale"], 0.0);
    assert_eq!(t["sampler_name"], "Euler");
    assert_eq!(t["sd_model_name"], "tiny");
    assert_eq!(report["txt2img_infotexts"], serde_json::json!([true, true]));
    assert_eq!(report["txt2img_parameters_prompt"], "a red fox in the snow");
    for (k, seed) in [(0, "7"), (1, "8")] {
        let got = pixels(&std::fs::read(dir.path().join(format!("txt2img-{k}.png"))).unwrap());
        let cli = cli_generate(
            &store,
            dir.path(),
            &["--width", "64", "--height", "64", "--seed", seed],
        );
        assert!(got == cli, "txt2img image {k} differs from the CLI's");
    }

    // Inpainting: the CLI's image for the same picture, mask and strength.
    assert_eq!(report["img2img"]["denoising_strength"], 0.8);
    assert_eq!(report["img2img_infotexts"], serde_json::json!([true]));
    let got = pixels(&std::fs::read(dir.path().join("img2img.png")).unwrap());
    let cli = cli_inpaint(&store, dir.path(), &picture, &mask, &[]);
    assert!(got == cli, "img2img differs from the CLI's");

    // The options switch the model requests run on, and back.
    assert_eq!(report["switched"], true);
    assert_eq!(report["switched_model_name"], "other");
    assert_eq!(report["switched_back"], true);
    assert!(server
        .log()
        .iter()
        .any(|l| l.contains("POST /sdapi/v1/txt2img other 200")));

    // Progress was read during the long run, which the interrupt then stopped.
    let p = &report["progress"];
    assert!(p["progress"].as_f64().unwrap() > 0.0, "{p}");
    assert!(p["progress"].as_f64().unwrap() < 1.0, "{p}");
    assert_eq!(p["state"]["sampling_steps"], 1000);
    assert_eq!(p["state"]["job_count"], 1);
    assert!(p["state"]["job"]
        .as_str()
        .unwrap()
        .contains("/sdapi/v1/txt2img"));
    assert_eq!(report["interrupt"], serde_json::json!({}));
    assert_eq!(report["interrupted_status"], 409, "{report}");
    assert!(report["interrupted_detail"]
        .as_str()
        .unwrap()
        .starts_with("interrupted after step"));
    assert_eq!(report["idle_progress"]["state"]["job_count"], 0);
    assert_eq!(report["idle_progress"]["progress"], 0.0);
}

#[test]
fn bad_input_gets_a_4xx_that_says_what_is_wrong() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    let port = server.port;
    let inputs = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs");
    let b64 = |p: &str| {
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(inputs.join(p)).unwrap())
    };
    let small = r#""steps": 2, "width": 64, "height": 64, "cfg_scale": 0"#;
    let cases = [
        (
            "/sdapi/v1/img2img",
            format!(r#"{{"prompt": "x", {small}, "init_images": ["not base64!"]}}"#),
            400,
            "init_images[0]` is not base64",
        ),
        (
            "/sdapi/v1/img2img",
            format!(
                r#"{{"prompt": "x", {small}, "init_images": ["{}"], "mask": "{}", "inpaint_full_res": false}}"#,
                b64("picture-96x80.png"),
                b64("mask-128x128.png")
            ),
            400,
            "give a mask of the picture's size",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "x", {small}, "sampler_name": "DPM++ 2M"}}"#),
            400,
            "zimage has one sampler, `Euler`",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "x", {small}, "sampler_name": "Euler a"}}"#),
            400,
            "`Euler a`",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "x", {small}, "batch_size": 10000}}"#),
            400,
            "batch_size × n_iter is 10000 × 1",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(
                r#"{{"prompt": "x", {small}, "override_settings": {{"sd_model_checkpoint": "sdxl.safetensors [31e35c80fc]"}}}}"#
            ),
            404,
            "checkpoint `sdxl.safetensors [31e35c80fc]` is not in the store",
        ),
        (
            "/sdapi/v1/options",
            r#"{"sd_model_checkpoint": "nope"}"#.to_string(),
            404,
            "checkpoint `nope` is not in the store",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "x", {small}, "enable_hr": true, "hr_upscaler": "Latent"}}"#),
            400,
            "hr_upscaler `Latent`",
        ),
        (
            "/sdapi/v1/img2img",
            format!(
                r#"{{"prompt": "x", {small}, "init_images": ["{}"], "mask": "{}", "inpaint_full_res": true, "inpaint_full_res_padding": -1}}"#,
                b64("picture-96x80.png"),
                b64("mask-96x80.png")
            ),
            400,
            "inpaint_full_res_padding is -1",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "x", {small}, "restore_faces": true}}"#),
            400,
            "face restoration",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "x", {small}, "scheduler": "Karras"}}"#),
            400,
            "scheduler `Karras`",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(
                r#"{{"prompt": "x", {small}, "override_settings": {{"CLIP_stop_at_last_layers": 2}}}}"#
            ),
            400,
            "override_settings.CLIP_stop_at_last_layers",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "x", {small}, "seed": -5}}"#),
            400,
            "seed is -5",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(
                r#"{{"prompt": "x", {small}, "alwayson_scripts": {{"ControlNet": {{"args": "on"}}}}}}"#
            ),
            400,
            "give a list of units",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(
                r#"{{"prompt": "x", {small}, "alwayson_scripts": {{"ControlNet": {{"args": [{{"model": "cn", "image": 5}}]}}}}}}"#
            ),
            400,
            "args[0].image` is a number",
        ),
        // A subnormal blur would reach the blur, which asserts a normal sigma.
        (
            "/sdapi/v1/img2img",
            format!(
                r#"{{"prompt": "x", {small}, "init_images": ["{}"], "mask": "{}", "mask_blur": 1e-40}}"#,
                b64("picture-96x80.png"),
                b64("mask-96x80.png")
            ),
            400,
            "mask_blur is 0.0000",
        ),
        // Values of the wrong JSON type are refused, not taken as unset.
        (
            "/sdapi/v1/txt2img",
            format!(
                r#"{{"prompt": "x", {small}, "alwayson_scripts": {{"controlnet": {{"args": [{{"model": "cn", "weight": "5", "image": "AAAA"}}]}}}}}}"#
            ),
            400,
            "args[0].weight` is a string; give a number",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(
                r#"{{"prompt": "x", {small}, "alwayson_scripts": {{"controlnet": {{"args": [{{"model": "cn", "guidance_start": "0.5", "image": "AAAA"}}]}}}}}}"#
            ),
            400,
            "args[0].guidance_start` is a string",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "x", {small}, "alwayson_scripts": {{"controlnet": "canny"}}}}"#),
            400,
            "field `alwayson_scripts.controlnet` is a string",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "{}", {small}}}"#, "fox ".repeat(20_000)),
            400,
            "bytes; a prompt may have at most 65536",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(
                r#"{{"prompt": "x", {small}, "alwayson_scripts": {{"ControlNet": {{"args": [{{"model": "cn", "image": "@@"}}]}}}}}}"#
            ),
            400,
            "is not base64",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(
                r#"{{"prompt": "x", {small}, "alwayson_scripts": {{"ControlNet": {{"args": [{{"model": "None", "image": "AAAA"}}]}}}}}}"#
            ),
            400,
            "args[0].model` is empty",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(
                r#"{{"prompt": "x", {small}, "alwayson_scripts": {{"ControlNet": {{"args": [{{"model": "nothere", "image": "{}"}}]}}}}}}"#,
                b64("picture-96x80.png")
            ),
            404,
            "nothere",
        ),
        (
            "/sdapi/v1/img2img",
            format!(r#"{{"prompt": "x", {small}}}"#),
            400,
            "field `init_images` is required",
        ),
        (
            "/sdapi/v1/txt2img",
            format!(r#"{{"prompt": "x", {small}, "steps": "many"}}"#),
            400,
            "field `steps`",
        ),
    ];
    for (path, body, status, needle) in &cases {
        let (got, answer) = post(port, path, body);
        assert_eq!(got, *status, "{path}: {answer}");
        let detail = json(&answer)["detail"].as_str().unwrap().to_string();
        assert!(
            detail.contains(needle),
            "{path}: `{detail}` lacks `{needle}`"
        );
    }
    // The server goes on serving, on the store's only model.
    let (status, answer) = post(
        port,
        "/sdapi/v1/txt2img",
        &format!(
            r#"{{"prompt": "x", {small}, "seed": -1, "enable_hr": true, "hr_scale": 1.5, "hr_upscaler": "Lanczos", "denoising_strength": 0.5}}"#
        ),
    );
    assert_eq!(status, 200, "{answer}");
    let answer = json(&answer);
    let info = json(answer["info"].as_str().unwrap());
    assert_eq!(info["sd_model_name"], "tiny");
    let (w, h, _) = pixels(&common::server::b64(answer["images"][0].as_str().unwrap()));
    assert_eq!((w, h), (96, 96), "the hires pass scales 64 by 1.5");
    assert!(info["infotexts"][0]
        .as_str()
        .unwrap()
        .contains("Hires upscale: 1.5"));
    let seed = info["seed"].as_u64().unwrap();
    assert!(seed < 1 << 32, "a random seed fits A1111's 32 bits: {seed}");
    let (status, answer) = get(port, "/sdapi/v1/sd-models");
    assert_eq!(status, 200);
    assert_eq!(json(&answer)[0]["model_name"], "tiny");
}

#[test]
fn an_inverted_mask_repaints_what_the_mask_keeps() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    let (picture, mask) = picture_and_mask();
    let mut inverted = image::open(&mask).unwrap().to_luma8();
    image::imageops::invert(&mut inverted);
    let inverted_path = dir.path().join("inverted.png");
    inverted.save(&inverted_path).unwrap();
    let b64 =
        |p: &Path| base64::engine::general_purpose::STANDARD.encode(std::fs::read(p).unwrap());
    let body = format!(
        r#"{{"prompt": "a red fox in the snow", "steps": 2, "cfg_scale": 0, "seed": 7, "width": 96, "height": 80,
            "init_images": ["data:image/png;base64,{}"], "mask": "{}", "inpainting_mask_invert": 1,
            "mask_blur": 0, "inpaint_full_res": false, "inpainting_fill": 1, "denoising_strength": 0.8,
            "sampler_name": "Euler", "scheduler": "Automatic"}}"#,
        b64(&picture),
        b64(&mask)
    );
    let (status, answer) = post(server.port, "/sdapi/v1/img2img", &body);
    assert_eq!(status, 200, "{answer}");
    let got = pixels(&common::server::b64(
        json(&answer)["images"][0].as_str().unwrap(),
    ));
    let cli = cli_inpaint(&store, dir.path(), &picture, &inverted_path, &[]);
    assert!(
        got == cli,
        "the inverted mask's image differs from the CLI's"
    );
    // Skip, with nothing running, changes nothing and answers as A1111 does.
    let (status, answer) = post(server.port, "/sdapi/v1/skip", "");
    assert_eq!((status, json(&answer)), (200, serde_json::json!({})));
}

#[test]
fn an_unknown_default_model_stops_serve_before_it_listens() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let out = common::zimage_in(
        &store,
        &["serve", "--host", "127.0.0.1:0", "--default-model", "nope"],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--default-model: model `nope` not found"),
        "{stderr}"
    );
}

#[test]
fn webuiapi_controlnet_units_steer_as_the_command_line_does() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let cn = dir.path().join("cn");
    common::controlnet::write_tiny_dir("2.1", &cn);
    let created = common::zimage_in(&store, &["create", "cn", "--from", s(&cn)]);
    assert!(created.status.success(), "{created:?}");
    let server = Server::start(&store, &["--default-model", "tiny"], &[]);
    let control =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs/picture-96x80.png");
    let out_png = dir.path().join("controlled.png");
    // webuiapi's own unit, as its users build one: the model as the extension lists it.
    let script = r#"
import json, sys, webuiapi
from PIL import Image
url, control, out = sys.argv[1:4]
api = webuiapi.WebUIApi(baseurl=f"{url}/sdapi/v1", sampler="Euler", scheduler="automatic")
models = api.controlnet_model_list()
unit = webuiapi.ControlNetUnit(image=Image.open(control), module="none", model=models[0] + " [0123abcd]", weight=0.7)
r = api.txt2img(prompt="a red fox in the snow", seed=7, steps=2, cfg_scale=0, width=96, height=80, controlnet_units=[unit])
r.image.save(out)
refused = {}
for name, u in [("module", webuiapi.ControlNetUnit(image=Image.open(control), module="canny", model=models[0])),
                ("guidance_end", webuiapi.ControlNetUnit(image=Image.open(control), model=models[0], guidance_end=0.5))]:
    try:
        api.txt2img(prompt="x", steps=2, cfg_scale=0, width=96, height=80, controlnet_units=[u])
        refused[name] = None
    except RuntimeError as e:
        refused[name] = [e.args[0], json.loads(e.args[1])["detail"]]
print(json.dumps({"models": models, "modules": api.controlnet_module_list(), "refused": refused}))
"#;
    let report = client_report(
        Command::new(common::test_python()).args([
            "-c",
            script,
            &server.url(),
            s(&control),
            s(&out_png),
        ]),
        &server,
    );
    assert_eq!(report["models"], serde_json::json!(["cn"]));
    assert_eq!(report["modules"], serde_json::json!(["none"]));
    assert_eq!(report["refused"]["module"][0], 400, "{report}");
    assert!(report["refused"]["module"][1]
        .as_str()
        .unwrap()
        .contains("preprocessor"));
    assert_eq!(report["refused"]["guidance_end"][0], 400, "{report}");
    let got = pixels(&std::fs::read(&out_png).unwrap());
    let cli = cli_generate(
        &store,
        dir.path(),
        &[
            "--seed",
            "7",
            "--width",
            "96",
            "--height",
            "80",
            "--controlnet",
            "cn",
            "--control",
            s(&control),
            "--control-scale",
            "0.7",
        ],
    );
    assert!(got == cli, "the ControlNet image differs from the CLI's");
}

#[test]
fn skip_drops_the_current_image_and_the_batch_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    let port = server.port;
    let body = r#"{"prompt": "a red fox in the snow", "steps": 300, "cfg_scale": 0, "seed": 7,
                   "width": 64, "height": 64, "batch_size": 2}"#;
    let run = std::thread::spawn(move || post(port, "/sdapi/v1/txt2img", body));
    let start = std::time::Instant::now();
    loop {
        let p = json(&get(port, "/sdapi/v1/progress").1);
        if p["state"]["job_no"] == 0 && p["state"]["sampling_step"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(start.elapsed().as_secs() < PATIENCE_S, "{p}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (status, _) = post(port, "/sdapi/v1/skip", "");
    assert_eq!(status, 200);
    let (status, answer) = run.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    let answer = json(&answer);
    let info = json(answer["info"].as_str().unwrap());
    assert_eq!(answer["images"].as_array().unwrap().len(), 1, "{info}");
    assert_eq!(info["all_seeds"], serde_json::json!([8]));
    let got = pixels(&common::server::b64(answer["images"][0].as_str().unwrap()));
    let png = dir.path().join("seed8.png");
    let out = common::zimage_in(
        &store,
        &[
            "generate",
            "a red fox in the snow",
            "--model",
            "tiny",
            "--width",
            "64",
            "--height",
            "64",
            "--seed",
            "8",
            "--steps",
            "300",
            "-o",
            s(&png),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli = pixels(&std::fs::read(&png).unwrap());
    assert!(
        got == cli,
        "the image after the skip differs from the CLI's for its seed"
    );
}

#[test]
fn only_masked_inpaints_the_cut_out_and_keeps_the_rest_of_the_picture() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    let (picture, mask) = picture_and_mask();
    let b64 = |p: &Path| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(p).unwrap())
    };
    let body = format!(
        r#"{{"prompt": "a red fox in the snow", "steps": 2, "cfg_scale": 0, "seed": 7, "width": 96, "height": 80,
            "init_images": ["{}"], "mask": "{}", "mask_blur": 0, "inpaint_full_res": true,
            "inpaint_full_res_padding": 8, "inpainting_fill": 1, "denoising_strength": 0.8}}"#,
        b64(&picture),
        b64(&mask)
    );
    let (status, answer) = post(server.port, "/sdapi/v1/img2img", &body);
    assert_eq!(status, 200, "{answer}");
    let answer = json(&answer);
    let png = common::server::b64(answer["images"][0].as_str().unwrap());
    let infotext = json(answer["info"].as_str().unwrap())["infotexts"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        infotext.contains("Inpaint area: Only masked, Masked area padding: 8"),
        "{infotext}"
    );
    let got = pixels(&png);
    let cli = cli_inpaint(&store, dir.path(), &picture, &mask, &["--only-masked", "8"]);
    assert!(got == cli, "only-masked inpainting differs from the CLI's");
    // Outside the mask the picture is kept exactly; inside it is repainted.
    let original = image::open(&picture).unwrap().to_rgb8();
    let keep = image::open(&mask).unwrap().to_luma8();
    let (mut kept, mut changed) = (0, 0);
    for (x, y, m) in keep.enumerate_pixels() {
        let i = ((y * 96 + x) * 3) as usize;
        let same = got.2[i..i + 3] == original.get_pixel(x, y).0;
        if m.0[0] < 128 {
            assert!(same, "pixel ({x}, {y}) outside the mask changed");
            kept += 1;
        } else if !same {
            changed += 1;
        }
    }
    assert!(kept > 0 && changed > 0, "kept {kept}, changed {changed}");
    // Without a mask there is no area to cut out.
    let (status, answer) = post(
        server.port,
        "/sdapi/v1/img2img",
        &format!(
            r#"{{"prompt": "x", "steps": 2, "init_images": ["{}"], "mask": "{}", "inpaint_full_res": true, "inpaint_full_res_padding": 5000}}"#,
            b64(&picture),
            b64(&mask)
        ),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("inpaint_full_res_padding"), "{answer}");
}

#[test]
fn interrupt_after_an_image_answers_with_the_images_made() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    let port = server.port;
    let body = r#"{"prompt": "a red fox in the snow", "steps": 300, "cfg_scale": 0, "seed": 7,
                   "width": 64, "height": 64, "batch_size": 1, "n_iter": 3}"#;
    let run = std::thread::spawn(move || post(port, "/sdapi/v1/txt2img", body));
    let start = std::time::Instant::now();
    loop {
        let p = json(&get(port, "/sdapi/v1/progress").1);
        if p["state"]["job_no"] == 1 && p["state"]["sampling_step"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(
            !run.is_finished(),
            "the job ended early: {:?}",
            server.log()
        );
        assert!(start.elapsed().as_secs() < PATIENCE_S, "{p}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(post(port, "/sdapi/v1/interrupt", "").0, 200);
    let (status, answer) = run.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    let answer = json(&answer);
    let info = json(answer["info"].as_str().unwrap());
    assert_eq!(answer["images"].as_array().unwrap().len(), 1, "{info}");
    assert_eq!(info["all_seeds"], serde_json::json!([7]));
    assert!(server
        .log()
        .iter()
        .any(|l| l.contains("interrupted; answered with the 1 image made before")));
}

/// A body as chat front ends (SillyTavern's `auto` source) send it: every field at its default,
/// settings that change no pixel, the UI's saving switches. It runs, and gives the CLI's image.
#[test]
fn a_chat_front_ends_full_body_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    let body = r#"{"prompt": "a red fox in the snow", "negative_prompt": "", "sampler_name": "Euler",
        "scheduler": "Automatic", "steps": 2, "cfg_scale": 0, "width": 64, "height": 64,
        "seed": 7, "restore_faces": false, "enable_hr": false, "hr_upscaler": "Latent",
        "hr_scale": 2, "hr_second_pass_steps": 0, "denoising_strength": 0.7, "batch_size": 1,
        "n_iter": 1, "clip_skip": 1, "save_images": true, "send_images": true,
        "do_not_save_grid": false, "do_not_save_samples": false,
        "override_settings": {"CLIP_stop_at_last_layers": 1, "sd_vae": "", "samples_save": true,
                              "forge_additional_modules": []},
        "override_settings_restore_afterwards": true, "alwayson_scripts": {}}"#;
    let (status, answer) = post(server.port, "/sdapi/v1/txt2img", body);
    assert_eq!(status, 200, "{answer}");
    let got = pixels(&common::server::b64(
        json(&answer)["images"][0].as_str().unwrap(),
    ));
    let cli = cli_generate(
        &store,
        dir.path(),
        &["--width", "64", "--height", "64", "--seed", "7"],
    );
    assert!(got == cli, "the image differs from the CLI's");
}

#[test]
fn progress_shows_the_running_steps_picture_as_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = Server::start(&store, &[], &[]);
    let port = server.port;
    let body = r#"{"prompt": "a red fox in the snow", "steps": 300, "cfg_scale": 0, "seed": 7,
                   "width": 64, "height": 48}"#;
    let run = std::thread::spawn(move || post(port, "/sdapi/v1/txt2img", body));
    // The step and its picture, once the picture has changed since the first one seen.
    let mut first: Option<(u64, String)> = None;
    let start = std::time::Instant::now();
    let (step, picture) = loop {
        let p = json(&get(port, "/sdapi/v1/progress").1);
        let step = p["state"]["sampling_step"].as_u64().unwrap_or(0);
        if let Some(picture) = p["current_image"].as_str() {
            match &first {
                None => first = Some((step, picture.to_string())),
                Some((_, seen)) if seen != picture => break (step, picture.to_string()),
                Some(_) => {}
            }
        }
        assert!(start.elapsed().as_secs() < PATIENCE_S, "{p}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let (first_step, _) = first.unwrap();
    assert!(step > first_step, "{first_step} then {step}");
    // One pixel per latent cell: an eighth of the image each way.
    let (w, h, _) = pixels(&common::server::b64(&picture));
    assert_eq!((w, h), (8, 6));
    let skipped = json(&get(port, "/sdapi/v1/progress?skip_current_image=true").1);
    assert_eq!(skipped["current_image"], serde_json::Value::Null);
    post(port, "/sdapi/v1/interrupt", "");
    run.join().unwrap();
    let idle = json(&get(port, "/sdapi/v1/progress").1);
    assert_eq!(idle["current_image"], serde_json::Value::Null);
}
