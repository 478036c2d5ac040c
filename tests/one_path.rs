//! One path from a request to images: the same requests sent through `zimage generate`,
//! Ollama's `/api/generate` and OpenAI's `/v1/images/*` come back as the same PNG, byte for
//! byte, and the same bad requests are refused alike (a non-zero exit on the command line, a
//! 4xx in each API, with the same message).

use base64::Engine;
use std::path::{Path, PathBuf};

mod common;
use common::s;
use common::server::{b64, demo_store, form_request, json, post, raw, FormPart, Server};

const PROMPT: &str = "a red fox in the snow";

fn inputs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/reference/inputs")
}

fn encoded(path: &Path) -> String {
    base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap())
}

/// A request as each front end takes it; `None` where that front end has no way to say it.
struct Case {
    name: &'static str,
    cli: Vec<String>,
    ollama: Option<String>,
    openai: Option<OpenAi>,
}

enum OpenAi {
    Json(String),
    Edit(Vec<FormPart>),
}

/// What a front end answered: a PNG, or an error (exit code or status, and the message).
#[derive(Debug)]
enum Answer {
    Png(Vec<u8>),
    Refused(u16, String),
}

fn cli(store: &Path, dir: &Path, flags: &[String]) -> Answer {
    let png = dir.join("cli.png");
    let _ = std::fs::remove_file(&png);
    let mut args: Vec<&str> = vec!["generate", PROMPT, "-o", s(&png)];
    args.extend(flags.iter().map(String::as_str));
    let out = common::zimage_in(store, &args);
    if out.status.success() {
        Answer::Png(std::fs::read(&png).unwrap())
    } else {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Answer::Refused(out.status.code().unwrap_or(-1) as u16, err)
    }
}

fn ollama(port: u16, body: &str) -> Answer {
    let (status, answer) = post(port, "/api/generate", body);
    let v = json(&answer);
    match status {
        200 => Answer::Png(b64(v["image"].as_str().expect("an image"))),
        _ => Answer::Refused(status, v["error"].as_str().unwrap_or_default().into()),
    }
}

fn openai(port: u16, request: &OpenAi) -> Answer {
    let (status, answer) = match request {
        OpenAi::Json(body) => post(port, "/v1/images/generations", body),
        OpenAi::Edit(parts) => raw(port, &form_request("/v1/images/edits", parts)),
    };
    let v = json(&answer);
    match status {
        200 => Answer::Png(b64(v["data"][0]["b64_json"].as_str().expect("an image"))),
        _ => Answer::Refused(
            status,
            v["error"]["message"].as_str().unwrap_or_default().into(),
        ),
    }
}

/// The ControlNet fields of a JSON body: `net` steered by the test's control image at `scale`.
fn steer(net: &str, scale: f32) -> String {
    let control = encoded(&inputs().join("picture-128x128.png"));
    format!(r#","controlnet":"{net}","control_image":"{control}","control_scale":{scale}"#)
}

fn flags(list: &[&str]) -> Vec<String> {
    list.iter().map(|f| f.to_string()).collect()
}

fn text(field: &'static str, value: &str) -> FormPart {
    (field, None, value.as_bytes().to_vec())
}

fn file(field: &'static str, path: &Path) -> FormPart {
    (field, Some("picture.png"), std::fs::read(path).unwrap())
}

/// `mask` (white repaints) in OpenAI's convention: transparent where the picture is repainted.
fn alpha_mask(mask: &Path, out: &Path) {
    let grey = image::open(mask).unwrap().to_luma8();
    let rgba = image::RgbaImage::from_fn(grey.width(), grey.height(), |x, y| {
        let alpha = if grey.get_pixel(x, y).0[0] >= 128 {
            0
        } else {
            255
        };
        image::Rgba([90, 90, 90, alpha])
    });
    rgba.save(out).unwrap();
}

fn good_cases(dir: &Path, lora: &Path) -> Vec<Case> {
    let picture = inputs().join("picture-96x80.png");
    let mask = inputs().join("mask-96x80.png");
    let control = inputs().join("picture-128x128.png");
    let rgba_mask = dir.join("mask-rgba.png");
    alpha_mask(&mask, &rgba_mask);
    let base = |extra: &str| {
        format!(
            r#"{{"model":"tiny","prompt":"{PROMPT}","steps":2,"stream":false,"options":{{"seed":7}},"seed":7{extra}}}"#
        )
    };
    let edit = |extra: Vec<FormPart>| {
        let mut parts = vec![
            text("model", "tiny"),
            text("prompt", PROMPT),
            text("steps", "2"),
            text("seed", "7"),
            file("image", &picture),
        ];
        parts.extend(extra);
        OpenAi::Edit(parts)
    };
    let common = ["--model", "tiny", "--steps", "2", "--seed", "7"];
    let with = |extra: &[&str]| {
        let mut f = flags(&common);
        f.extend(flags(extra));
        f
    };
    let lora_name = lora.file_name().unwrap().to_str().unwrap();
    let lora_flag = format!("{}:0.8", s(lora));
    vec![
        Case {
            name: "plain",
            cli: with(&["--width", "64", "--height", "48"]),
            ollama: Some(base(r#","width":64,"height":48"#)),
            openai: Some(OpenAi::Json(base(r#","size":"64x48""#))),
        },
        Case {
            name: "img2img",
            cli: with(&["--image", s(&picture), "--strength", "0.75"]),
            ollama: Some(base(&format!(
                r#","images":["{}"],"strength":0.75"#,
                encoded(&picture)
            ))),
            openai: Some(edit(vec![text("strength", "0.75")])),
        },
        Case {
            name: "inpaint",
            cli: with(&[
                "--image",
                s(&picture),
                "--mask",
                s(&mask),
                "--strength",
                "0.7",
            ]),
            ollama: None,
            openai: Some(edit(vec![
                file("mask", &rgba_mask),
                text("strength", "0.7"),
            ])),
        },
        Case {
            name: "controlnet",
            cli: with(&[
                "--control",
                s(&control),
                "--controlnet",
                "cn",
                "--control-scale",
                "0.9",
            ]),
            ollama: Some(base(&steer("cn", 0.9))),
            openai: Some(OpenAi::Json(base(&steer("cn", 0.9)))),
        },
        Case {
            name: "lora",
            cli: with(&["--width", "64", "--height", "64", "--lora", &lora_flag]),
            ollama: Some(base(&format!(
                r#","width":64,"height":64,"loras":[{{"path":"{lora_name}","scale":0.8}}]"#
            ))),
            openai: Some(OpenAi::Json(base(&format!(
                r#","size":"64x64","loras":[{{"path":"{lora_name}","scale":0.8}}]"#
            )))),
        },
    ]
}

/// Bad requests, each with the words every front end's message must hold.
fn bad_cases(dir: &Path) -> Vec<(Case, &'static str)> {
    let picture = inputs().join("picture-96x80.png");
    let small_mask = inputs().join("mask-128x128.png");
    let broken = dir.join("broken.png");
    std::fs::write(&broken, b"\x89PNG\r\n\x1a\nnot really").unwrap();
    let base =
        |extra: &str| format!(r#"{{"model":"tiny","prompt":"{PROMPT}","stream":false{extra}}}"#);
    let edit = |extra: Vec<FormPart>| {
        let mut parts = vec![text("model", "tiny"), text("prompt", PROMPT)];
        parts.extend(extra);
        OpenAi::Edit(parts)
    };
    let model = ["--model", "tiny"];
    let with = |extra: &[&str]| {
        let mut f = flags(&model);
        f.extend(flags(extra));
        f
    };
    let control = inputs().join("picture-128x128.png");
    vec![
        (
            Case {
                name: "no steps",
                cli: with(&["--steps", "0"]),
                ollama: Some(base(r#","steps":0"#)),
                openai: Some(OpenAi::Json(base(r#","steps":0"#))),
            },
            "steps is 0",
        ),
        (
            Case {
                name: "negative guidance",
                cli: with(&["--guidance", "-1"]),
                ollama: Some(base(r#","guidance":-1"#)),
                openai: Some(OpenAi::Json(base(r#","guidance":-1"#))),
            },
            "guidance is -1",
        ),
        (
            Case {
                name: "a side not a multiple of 16",
                cli: with(&["--width", "70", "--height", "64"]),
                ollama: Some(base(r#","width":70,"height":64"#)),
                openai: Some(OpenAi::Json(base(r#","size":"70x64""#))),
            },
            "width is 70",
        ),
        (
            Case {
                name: "strength above 1",
                cli: with(&["--image", s(&picture), "--strength", "1.5"]),
                ollama: Some(base(&format!(
                    r#","images":["{}"],"options":{{"strength":1.5}}"#,
                    encoded(&picture)
                ))),
                openai: Some(edit(vec![file("image", &picture), text("strength", "1.5")])),
            },
            "strength is 1.5",
        ),
        (
            Case {
                name: "a model not in the store",
                cli: flags(&["--model", "no-such-model"]),
                ollama: Some(r#"{"model":"no-such-model","prompt":"a fox","stream":false}"#.into()),
                openai: Some(OpenAi::Json(
                    r#"{"model":"no-such-model","prompt":"a fox"}"#.into(),
                )),
            },
            "not found",
        ),
        (
            Case {
                name: "a mask of another size",
                cli: with(&["--image", s(&picture), "--mask", s(&small_mask)]),
                ollama: None,
                openai: Some(edit(vec![
                    file("image", &picture),
                    file("mask", &small_mask),
                ])),
            },
            "give a mask of the picture's size",
        ),
        (
            Case {
                name: "a control scale above 2",
                cli: with(&[
                    "--control",
                    s(&control),
                    "--controlnet",
                    "cn",
                    "--control-scale",
                    "5",
                ]),
                ollama: Some(base(&steer("cn", 5.0))),
                openai: Some(OpenAi::Json(base(&steer("cn", 5.0)))),
            },
            "scale is 5",
        ),
        (
            Case {
                name: "a broken picture",
                cli: with(&["--image", s(&broken)]),
                ollama: Some(base(&format!(r#","images":["{}"]"#, encoded(&broken)))),
                openai: Some(edit(vec![file("image", &broken)])),
            },
            "png",
        ),
        (
            Case {
                name: "a ControlNet not in the store",
                cli: with(&["--control", s(&control), "--controlnet", "no-such-net"]),
                ollama: Some(base(&format!(
                    r#","controlnet":"no-such-net","control_image":"{}""#,
                    encoded(&control)
                ))),
                openai: Some(OpenAi::Json(base(&format!(
                    r#","controlnet":"no-such-net","control_image":"{}""#,
                    encoded(&control)
                )))),
            },
            "not found",
        ),
    ]
}

#[test]
fn the_same_request_gives_the_same_answer_from_every_front_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let cn = dir.path().join("cn");
    common::controlnet::write_tiny_dir("2.1", &cn);
    let created = common::zimage_in(&store, &["create", "cn", "--from", s(&cn)]);
    assert!(created.status.success(), "{created:?}");
    let loras = dir.path().join("loras");
    std::fs::create_dir_all(&loras).unwrap();
    // The server resolves LoRA names inside its folder; the command line is given that path.
    let loras = loras.canonicalize().unwrap();
    let lora = loras.join("style.safetensors");
    common::server::write_attention_lora(&lora);
    let server = Server::start(&store, &["--lora-dir", s(&loras)], &[]);

    let mut pictures = Vec::new();
    for case in good_cases(dir.path(), &lora) {
        let Answer::Png(expected) = cli(&store, dir.path(), &case.cli) else {
            panic!("{}: the command line refused it", case.name)
        };
        if let Some(body) = &case.ollama {
            match ollama(server.port, body) {
                Answer::Png(png) => assert!(png == expected, "{}: Ollama's PNG differs", case.name),
                other => panic!("{}: Ollama answered {other:?}", case.name),
            }
        }
        if let Some(request) = &case.openai {
            match openai(server.port, request) {
                Answer::Png(png) => assert!(png == expected, "{}: OpenAI's PNG differs", case.name),
                other => panic!("{}: OpenAI answered {other:?}", case.name),
            }
        }
        pictures.push(expected);
    }
    // Each case drew something of its own.
    for (i, a) in pictures.iter().enumerate() {
        for b in &pictures[i + 1..] {
            assert!(a != b, "two cases gave the same image");
        }
    }

    for (case, needle) in bad_cases(dir.path()) {
        let mut answers = vec![("command line", cli(&store, dir.path(), &case.cli))];
        if let Some(body) = &case.ollama {
            answers.push(("Ollama", ollama(server.port, body)));
        }
        if let Some(request) = &case.openai {
            answers.push(("OpenAI", openai(server.port, request)));
        }
        let not_found = needle == "not found";
        for (front, answer) in answers {
            let Answer::Refused(code, message) = answer else {
                panic!("{}: {front} made an image", case.name)
            };
            match front {
                "command line" => assert_eq!(code, 2, "{}: {message}", case.name),
                _ if not_found => assert_eq!(code, 404, "{}: {front}: {message}", case.name),
                _ => assert_eq!(code, 400, "{}: {front}: {message}", case.name),
            }
            assert!(
                message.to_lowercase().contains(&needle.to_lowercase()),
                "{}: {front} said `{message}`, without `{needle}`",
                case.name
            );
            assert!(!message.trim().contains('\n'), "{}: {message}", case.name);
        }
    }
    // The server kept serving through every refusal.
    assert!(matches!(
        ollama(
            server.port,
            r#"{"model":"tiny","prompt":"a fox","width":32,"height":32,"steps":1,"stream":false}"#
        ),
        Answer::Png(_)
    ));
}

#[test]
fn a_models_recorded_defaults_hold_wherever_the_request_is_silent() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let created = common::zimage_in(
        &store,
        &[
            "create",
            "base",
            "--from",
            s(&tiny),
            "--default-steps",
            "3",
            "--default-guidance",
            "2.5",
            "--default-negative",
            "blurry",
            "--default-cfg-truncation",
            "0.5",
        ],
    );
    assert!(created.status.success(), "{created:?}");
    let size = ["--width", "64", "--height", "48", "--seed", "3"];
    let mut silent = flags(&["--model", "base"]);
    silent.extend(flags(&size));
    let mut spelled = flags(&[
        "--model",
        "tiny",
        "--steps",
        "3",
        "--guidance",
        "2.5",
        "--negative",
        "blurry",
        "--cfg-truncation",
        "0.5",
    ]);
    spelled.extend(flags(&size));
    let rgb = |png: &[u8]| image::load_from_memory(png).unwrap().to_rgb8().into_raw();
    let Answer::Png(spelled) = cli(&store, dir.path(), &spelled) else {
        panic!("the spelled-out run was refused")
    };
    let mut plain = flags(&["--model", "tiny"]);
    plain.extend(flags(&size));
    let Answer::Png(turbo) = cli(&store, dir.path(), &plain) else {
        panic!("the plain run was refused")
    };
    assert!(rgb(&spelled) != rgb(&turbo), "the defaults changed nothing");

    let server = Server::start(&store, &[], &[]);
    let body = r#"{"model":"base","prompt":"a red fox in the snow","width":64,"height":48,"stream":false,"options":{"seed":3},"seed":3}"#;
    let answers = [
        ("command line", cli(&store, dir.path(), &silent)),
        ("Ollama", ollama(server.port, body)),
        (
            "OpenAI",
            openai(
                server.port,
                &OpenAi::Json(body.replace(r#""width":64,"height":48"#, r#""size":"64x48""#)),
            ),
        ),
    ];
    for (front, answer) in answers {
        let Answer::Png(png) = answer else {
            panic!("{front} refused a silent request: {answer:?}")
        };
        assert!(
            rgb(&png) == rgb(&spelled),
            "{front} did not use the model's defaults"
        );
    }
}

/// A FLUX.2 [klein] request as each front end takes it, the page's JSON API and A1111's among
/// them; `None` where that front end has no way to say it.
struct KleinCase {
    name: &'static str,
    cli: Vec<String>,
    ollama: Option<String>,
    openai: Option<OpenAi>,
    /// `(path, body)`: txt2img or img2img.
    a1111: Option<(&'static str, String)>,
    /// The body the page posts to `/ui/api/jobs`.
    page: Option<String>,
}

fn a1111(port: u16, (path, body): &(&str, String)) -> Answer {
    let (status, answer) = post(port, path, body);
    let v = json(&answer);
    match status {
        200 => Answer::Png(b64(v["images"][0].as_str().expect("an image"))),
        _ => Answer::Refused(status, v["detail"].as_str().unwrap_or_default().into()),
    }
}

/// A page job run to its end; its one image, as the gallery keeps it.
fn page_job(port: u16, gallery: &Path, body: &str) -> Answer {
    let (status, answer) = post(port, "/ui/api/jobs", body);
    let v = json(&answer);
    if status != 200 {
        return Answer::Refused(status, v["error"].as_str().unwrap_or_default().into());
    }
    let id = v["id"].as_str().unwrap();
    let started = std::time::Instant::now();
    loop {
        let (_, state) = common::server::get(port, &format!("/ui/api/jobs/{id}"));
        let state = json(&state);
        match state["state"].as_str() {
            Some("queued" | "running") => {}
            Some("done") => {
                let file = state["images"][0]["file"].as_str().unwrap();
                return Answer::Png(std::fs::read(gallery.join(file)).unwrap());
            }
            _ => panic!("page job {id} ended without an image: {state}"),
        }
        assert!(started.elapsed().as_secs() < 120, "page job {id}: {state}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The JSON object `base` with the fields of `extra` added, as a body.
fn merged(mut base: serde_json::Value, extra: serde_json::Value) -> String {
    let (Some(body), serde_json::Value::Object(extra)) = (base.as_object_mut(), extra) else {
        panic!("bodies are JSON objects")
    };
    body.extend(extra);
    base.to_string()
}

fn data_url(path: &Path) -> String {
    format!("data:image/png;base64,{}", encoded(path))
}

/// What each server front end answers to `case` (`None` where it cannot express it).
fn server_answers(
    case: &KleinCase,
    port: u16,
    gallery: &Path,
) -> [(&'static str, Option<Answer>); 4] {
    [
        ("Ollama", case.ollama.as_ref().map(|b| ollama(port, b))),
        ("OpenAI", case.openai.as_ref().map(|r| openai(port, r))),
        ("A1111", case.a1111.as_ref().map(|r| a1111(port, r))),
        (
            "the page",
            case.page.as_ref().map(|b| page_job(port, gallery, b)),
        ),
    ]
}

fn klein_cases(dir: &Path, lora: &Path) -> Vec<KleinCase> {
    let picture = inputs().join("picture-96x80.png");
    let mask = inputs().join("mask-96x80.png");
    let reference = inputs().join("picture-128x128.png");
    let rgba_mask = dir.join("mask-rgba.png");
    alpha_mask(&mask, &rgba_mask);
    let json_body = |extra| {
        let base = serde_json::json!({
            "model": "klein", "prompt": PROMPT, "steps": 2, "seed": 7, "stream": false,
            "options": {"seed": 7},
        });
        merged(base, extra)
    };
    let a1111_body = |extra: serde_json::Value| {
        let base = serde_json::json!({
            "prompt": PROMPT, "steps": 2, "seed": 7, "sampler_name": "Euler",
            "scheduler": "Automatic", "override_settings": {"sd_model_checkpoint": "klein"},
        });
        merged(base, extra)
    };
    let page_body = |extra| {
        let base = serde_json::json!({"model": "klein", "prompt": PROMPT, "steps": 2, "seed": 7});
        merged(base, extra)
    };
    let with = |extra: &[&str]| {
        let mut f = flags(&["--model", "klein", "--steps", "2", "--seed", "7"]);
        f.extend(flags(extra));
        f
    };
    let form = |extra: Vec<FormPart>| {
        let mut parts = vec![
            text("model", "klein"),
            text("prompt", PROMPT),
            text("steps", "2"),
            text("seed", "7"),
        ];
        parts.extend(extra);
        OpenAi::Edit(parts)
    };
    let (pic, refer) = (encoded(&picture), encoded(&reference));
    vec![
        KleinCase {
            name: "text to image",
            cli: with(&["--width", "64", "--height", "48"]),
            ollama: Some(json_body(serde_json::json!({"width": 64, "height": 48}))),
            openai: Some(OpenAi::Json(json_body(
                serde_json::json!({"size": "64x48"}),
            ))),
            a1111: Some((
                "/sdapi/v1/txt2img",
                a1111_body(serde_json::json!({"width": 64, "height": 48})),
            )),
            page: Some(page_body(serde_json::json!({"width": 64, "height": 48}))),
        },
        KleinCase {
            name: "an edit from a reference",
            cli: with(&["--ref", s(&picture)]),
            ollama: Some(json_body(serde_json::json!({"images": [pic]}))),
            openai: Some(form(vec![file("image", &picture)])),
            // A1111's `init_images[0]` is the picture img2img starts from, never a reference.
            a1111: None,
            page: Some(page_body(
                serde_json::json!({"references": [data_url(&picture)]}),
            )),
        },
        KleinCase {
            name: "image to image with a reference",
            cli: with(&[
                "--image",
                s(&picture),
                "--strength",
                "0.75",
                "--ref",
                s(&reference),
            ]),
            ollama: None,
            openai: None,
            a1111: Some((
                "/sdapi/v1/img2img",
                a1111_body(serde_json::json!({
                    "init_images": [pic, refer], "denoising_strength": 0.75,
                })),
            )),
            page: Some(page_body(serde_json::json!({
                "picture": data_url(&picture), "strength": 0.75,
                "references": [data_url(&reference)],
            }))),
        },
        KleinCase {
            name: "inpaint",
            cli: with(&[
                "--image",
                s(&picture),
                "--mask",
                s(&mask),
                "--strength",
                "0.7",
            ]),
            // Ollama's `images` are a klein model's references; it has no mask.
            ollama: None,
            openai: Some(form(vec![
                file("image", &picture),
                file("mask", &rgba_mask),
                text("strength", "0.7"),
            ])),
            a1111: Some((
                "/sdapi/v1/img2img",
                a1111_body(serde_json::json!({
                    "init_images": [pic], "mask": encoded(&mask), "denoising_strength": 0.7,
                })),
            )),
            page: Some(page_body(serde_json::json!({
                "picture": data_url(&picture), "mask": data_url(&mask), "strength": 0.7,
            }))),
        },
        KleinCase {
            name: "a LoRA",
            cli: with(&[
                "--width",
                "64",
                "--height",
                "48",
                "--lora",
                &format!("{}:0.8", s(lora)),
            ]),
            ollama: Some(json_body(serde_json::json!({
                "width": 64, "height": 48, "loras": [{"path": "kstyle.safetensors", "scale": 0.8}],
            }))),
            openai: None,
            a1111: Some((
                "/sdapi/v1/txt2img",
                a1111_body(serde_json::json!({
                    "prompt": format!("{PROMPT} <lora:kstyle:0.8>"), "width": 64, "height": 48,
                })),
            )),
            page: None,
        },
        KleinCase {
            name: "a hires pass",
            cli: with(&[
                "--width",
                "64",
                "--height",
                "48",
                "--hires-scale",
                "1.5",
                "--hires-strength",
                "0.6",
            ]),
            ollama: None,
            openai: None,
            a1111: Some((
                "/sdapi/v1/txt2img",
                a1111_body(serde_json::json!({
                    "width": 64, "height": 48, "enable_hr": true, "hr_scale": 1.5,
                    "hr_upscaler": "Lanczos", "denoising_strength": 0.6,
                })),
            )),
            page: None,
        },
        KleinCase {
            name: "inpainting the masked area alone",
            cli: with(&[
                "--image",
                s(&picture),
                "--mask",
                s(&mask),
                "--strength",
                "0.7",
                "--only-masked",
                "8",
            ]),
            ollama: None,
            openai: None,
            a1111: Some((
                "/sdapi/v1/img2img",
                a1111_body(serde_json::json!({
                    "init_images": [pic], "mask": encoded(&mask), "denoising_strength": 0.7,
                    "inpaint_full_res": true, "inpaint_full_res_padding": 8,
                })),
            )),
            page: None,
        },
        KleinCase {
            name: "image to image",
            cli: with(&["--image", s(&picture), "--strength", "0.75"]),
            ollama: None,
            // Without a mask, OpenAI's edit gives a klein model references.
            openai: None,
            a1111: Some((
                "/sdapi/v1/img2img",
                a1111_body(serde_json::json!({"init_images": [pic], "denoising_strength": 0.75})),
            )),
            page: Some(page_body(
                serde_json::json!({"picture": data_url(&picture), "strength": 0.75}),
            )),
        },
    ]
}

/// Bad klein requests (and a reference for Z-Image), each with the words every front end's
/// message must hold.
fn klein_bad_cases(dir: &Path) -> Vec<(KleinCase, &'static str)> {
    let picture = inputs().join("picture-96x80.png");
    let control = inputs().join("picture-128x128.png");
    let small = dir.join("small.png");
    image::RgbImage::from_pixel(48, 48, image::Rgb([200, 40, 40]))
        .save(&small)
        .unwrap();
    let text_file = dir.join("notes.png");
    std::fs::write(&text_file, b"a shopping list, not a picture").unwrap();
    let page =
        |model: &str, extra| merged(serde_json::json!({"model": model, "prompt": PROMPT}), extra);
    let body = |model: &str, extra: serde_json::Value| {
        page(model, extra).replacen('{', r#"{"stream":false,"#, 1)
    };
    let a1111_body = |extra: serde_json::Value| {
        let base = serde_json::json!({
            "prompt": PROMPT, "override_settings": {"sd_model_checkpoint": "klein"},
        });
        merged(base, extra)
    };
    let klein = |extra: &[&str]| {
        let mut f = flags(&["--model", "klein"]);
        f.extend(flags(extra));
        f
    };
    let form = |extra: Vec<FormPart>| {
        let mut parts = vec![text("model", "klein"), text("prompt", PROMPT)];
        parts.extend(extra);
        OpenAi::Edit(parts)
    };
    let unit = serde_json::json!({"controlnet": {"args": [{
        "enabled": true, "model": "cn", "image": encoded(&control), "weight": 0.9,
    }]}});
    vec![
        (
            KleinCase {
                name: "a reference under 64 pixels",
                cli: klein(&["--ref", s(&small)]),
                ollama: Some(body(
                    "klein",
                    serde_json::json!({"images": [encoded(&small)]}),
                )),
                openai: Some(form(vec![file("image", &small)])),
                a1111: Some((
                    "/sdapi/v1/img2img",
                    a1111_body(
                        serde_json::json!({"init_images": [encoded(&picture), encoded(&small)]}),
                    ),
                )),
                page: Some(page(
                    "klein",
                    serde_json::json!({"references": [data_url(&small)]}),
                )),
            },
            "a reference needs at least 64 pixels",
        ),
        (
            KleinCase {
                name: "a reference that is not a picture",
                cli: klein(&["--ref", s(&text_file)]),
                ollama: Some(body(
                    "klein",
                    serde_json::json!({"images": [encoded(&text_file)]}),
                )),
                openai: Some(form(vec![file("image", &text_file)])),
                a1111: Some((
                    "/sdapi/v1/img2img",
                    a1111_body(serde_json::json!({
                        "init_images": [encoded(&picture), encoded(&text_file)],
                    })),
                )),
                page: Some(page(
                    "klein",
                    serde_json::json!({"references": [data_url(&text_file)]}),
                )),
            },
            "not a PNG, JPEG or WebP image",
        ),
        (
            KleinCase {
                name: "a ControlNet for klein",
                cli: klein(&["--control", s(&control), "--controlnet", "cn"]),
                ollama: Some(body(
                    "klein",
                    serde_json::json!({
                        "controlnet": "cn", "control_image": encoded(&control),
                    }),
                )),
                openai: Some(OpenAi::Json(body(
                    "klein",
                    serde_json::json!({
                        "controlnet": "cn", "control_image": encoded(&control),
                    }),
                ))),
                a1111: Some((
                    "/sdapi/v1/txt2img",
                    a1111_body(serde_json::json!({"alwayson_scripts": unit})),
                )),
                page: Some(page(
                    "klein",
                    serde_json::json!({
                        "controlnet": "cn", "control_image": data_url(&control),
                    }),
                )),
            },
            "not available for FLUX.2 [klein] models",
        ),
        (
            KleinCase {
                name: "a side not a multiple of the token cell",
                cli: klein(&["--width", "76", "--height", "64"]),
                ollama: Some(body(
                    "klein",
                    serde_json::json!({"width": 76, "height": 64}),
                )),
                openai: Some(OpenAi::Json(body(
                    "klein",
                    serde_json::json!({"size": "76x64"}),
                ))),
                a1111: Some((
                    "/sdapi/v1/txt2img",
                    a1111_body(serde_json::json!({"width": 76, "height": 64})),
                )),
                page: Some(page(
                    "klein",
                    serde_json::json!({"width": 76, "height": 64}),
                )),
            },
            "width is 76",
        ),
        (
            KleinCase {
                name: "a reference for Z-Image",
                cli: flags(&["--model", "tiny", "--ref", s(&picture)]),
                // Ollama's and OpenAI's pictures are Z-Image's picture to start from, and
                // A1111 has no references.
                ollama: None,
                openai: None,
                a1111: None,
                page: Some(page(
                    "tiny",
                    serde_json::json!({"references": [data_url(&picture)]}),
                )),
            },
            "--ref is not available for Z-Image models",
        ),
    ]
}

/// Every file under `dir`, to see that a refusal wrote nothing.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).map(|d| d.filter_map(Result::ok).map(|e| e.path()));
    let mut files: Vec<PathBuf> = entries.into_iter().flatten().collect();
    files.sort();
    files
}

#[test]
fn the_same_klein_request_gives_the_same_png_from_every_front_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let cn = dir.path().join("cn");
    common::controlnet::write_tiny_dir("2.1", &cn);
    for (name, from) in [("klein", models.join("flux2-klein-tiny")), ("cn", cn)] {
        let created = common::zimage_in(&store, &["create", name, "--from", s(&from)]);
        assert!(created.status.success(), "{created:?}");
    }
    let gallery = dir.path().join("gallery");
    // The server resolves LoRA names inside its folder; the command line is given that path.
    let loras = dir.path().join("loras");
    std::fs::create_dir_all(&loras).unwrap();
    let loras = loras.canonicalize().unwrap();
    let lora = loras.join("kstyle.safetensors");
    std::fs::copy(models.join("reference/klein-lora-peft.safetensors"), &lora).unwrap();
    let flags = ["--gallery-dir", s(&gallery), "--lora-dir", s(&loras)];
    let server = Server::start(&store, &flags, &[]);

    let mut pictures = Vec::new();
    for case in klein_cases(dir.path(), &lora) {
        let Answer::Png(expected) = cli(&store, dir.path(), &case.cli) else {
            panic!("{}: the command line refused it", case.name)
        };
        for (front, answer) in server_answers(&case, server.port, &gallery) {
            match answer {
                None => {}
                // The same file, metadata and all.
                Some(Answer::Png(png)) => {
                    assert!(png == expected, "{}: {front}'s PNG differs", case.name)
                }
                Some(other) => panic!("{}: {front} answered {other:?}", case.name),
            }
        }
        pictures.push(expected);
    }
    for (i, a) in pictures.iter().enumerate() {
        for b in &pictures[i + 1..] {
            assert!(a != b, "two klein cases gave the same image");
        }
    }
    // The edit names its reference: its pixels' sha256 and size, as the infotext parses back.
    let edit = &pictures[1];
    let path = dir.path().join("edit.png");
    std::fs::write(&path, edit).unwrap();
    let chunks = zimage::image_out::read_png_text(&path).unwrap();
    let text = |key: &str| chunks.iter().find(|(k, _)| k == key).unwrap().1.clone();
    let parsed = zimage::formats::infotext::parse(&text("parameters"));
    let rgb = image::open(inputs().join("picture-96x80.png"))
        .unwrap()
        .to_rgb8();
    let sha = {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(rgb.as_raw()))
    };
    assert_eq!(
        parsed.get("Reference 1 hash"),
        Some(&sha[..10]),
        "{parsed:?}"
    );
    assert_eq!(parsed.get("Reference 1 size"), Some("96x80"));
    let recorded = json(&text("zimage"));
    assert_eq!(
        recorded["references"],
        serde_json::json!([{"width": 96, "height": 80, "sha256": sha}])
    );

    let written = files_in(&gallery);
    for (case, needle) in klein_bad_cases(dir.path()) {
        let command_line = ("command line", Some(cli(&store, dir.path(), &case.cli)));
        let answers =
            std::iter::once(command_line).chain(server_answers(&case, server.port, &gallery));
        for (front, answer) in answers {
            let Some(answer) = answer else { continue };
            let Answer::Refused(code, message) = answer else {
                panic!("{}: {front} made an image", case.name)
            };
            match front {
                "command line" => assert_eq!(code, 2, "{}: {message}", case.name),
                _ => assert!(
                    (400..500).contains(&code),
                    "{}: {front}: {code} {message}",
                    case.name
                ),
            }
            assert!(
                message.contains(needle),
                "{}: {front} said `{message}`, without `{needle}`",
                case.name
            );
            assert!(!message.trim().contains('\n'), "{}: {message}", case.name);
        }
        assert!(
            !dir.path().join("cli.png").exists(),
            "{}: the command line wrote",
            case.name
        );
        assert_eq!(
            files_in(&gallery),
            written,
            "{}: the page kept an image",
            case.name
        );
    }
}

/// FLUX.3 [klein] requests as each front end takes them: text to image on the distilled model,
/// guidance with a negative prompt on the base model, and edits from one and two references.
fn flux3_cases() -> Vec<KleinCase> {
    let picture = inputs().join("picture-96x80.png");
    let second = inputs().join("picture-128x128.png");
    let (pic, sec) = (encoded(&picture), encoded(&second));
    let ollama = |model: &str, extra| {
        let base = serde_json::json!({
            "model": model, "prompt": PROMPT, "steps": 2, "seed": 7, "stream": false,
            "options": {"seed": 7},
        });
        merged(base, extra)
    };
    let a1111 = |model: &str, extra| {
        let base = serde_json::json!({
            "prompt": PROMPT, "steps": 2, "seed": 7, "sampler_name": "Euler",
            "scheduler": "Automatic", "override_settings": {"sd_model_checkpoint": model},
        });
        merged(base, extra)
    };
    let page = |model: &str, extra| {
        merged(
            serde_json::json!({"model": model, "prompt": PROMPT, "steps": 2, "seed": 7}),
            extra,
        )
    };
    let with = |model: &str, extra: &[&str]| {
        let mut f = flags(&["--model", model, "--steps", "2", "--seed", "7"]);
        f.extend(flags(extra));
        f
    };
    let form = |extra: Vec<FormPart>| {
        let mut parts = vec![
            text("model", "flux3"),
            text("prompt", PROMPT),
            text("steps", "2"),
            text("seed", "7"),
        ];
        parts.extend(extra);
        OpenAi::Edit(parts)
    };
    let negative = "blurry, dark";
    vec![
        KleinCase {
            name: "text to image",
            cli: with("flux3", &["--width", "64", "--height", "48"]),
            ollama: Some(ollama(
                "flux3",
                serde_json::json!({"width": 64, "height": 48}),
            )),
            openai: Some(OpenAi::Json(ollama(
                "flux3",
                serde_json::json!({"size": "64x48"}),
            ))),
            a1111: Some((
                "/sdapi/v1/txt2img",
                a1111("flux3", serde_json::json!({"width": 64, "height": 48})),
            )),
            page: Some(page(
                "flux3",
                serde_json::json!({"width": 64, "height": 48}),
            )),
        },
        KleinCase {
            name: "guidance and a negative prompt on the base model",
            cli: with(
                "flux3base",
                &[
                    "--width",
                    "48",
                    "--height",
                    "64",
                    "--guidance",
                    "2.5",
                    "--negative",
                    negative,
                ],
            ),
            ollama: Some(ollama(
                "flux3base",
                serde_json::json!({
                    "width": 48, "height": 64, "guidance": 2.5, "negative_prompt": negative,
                }),
            )),
            openai: None,
            a1111: Some((
                "/sdapi/v1/txt2img",
                a1111(
                    "flux3base",
                    serde_json::json!({
                        "width": 48, "height": 64, "cfg_scale": 2.5, "negative_prompt": negative,
                    }),
                ),
            )),
            page: Some(page(
                "flux3base",
                serde_json::json!({
                    "width": 48, "height": 64, "guidance": 2.5, "negative_prompt": negative,
                }),
            )),
        },
        KleinCase {
            name: "an edit from a reference",
            cli: with("flux3", &["--ref", s(&picture)]),
            ollama: Some(ollama("flux3", serde_json::json!({"images": [pic]}))),
            openai: Some(form(vec![file("image", &picture)])),
            // A model that only edits from references reads every `init_images` as one.
            a1111: Some((
                "/sdapi/v1/img2img",
                a1111("flux3", serde_json::json!({"init_images": [pic]})),
            )),
            page: Some(page(
                "flux3",
                serde_json::json!({"references": [data_url(&picture)]}),
            )),
        },
        KleinCase {
            name: "an edit from two references",
            cli: with("flux3", &["--ref", s(&picture), "--ref", s(&second)]),
            ollama: Some(ollama("flux3", serde_json::json!({"images": [pic, sec]}))),
            openai: Some(form(vec![
                file("image[]", &picture),
                file("image[]", &second),
            ])),
            a1111: Some((
                "/sdapi/v1/img2img",
                a1111("flux3", serde_json::json!({"init_images": [pic, sec]})),
            )),
            page: Some(page(
                "flux3",
                serde_json::json!({"references": [data_url(&picture), data_url(&second)]}),
            )),
        },
    ]
}

/// What FLUX.3 [klein] has no way to do, asked of every front end that can ask it.
fn flux3_bad_cases(dir: &Path) -> Vec<(KleinCase, &'static str)> {
    let picture = inputs().join("picture-96x80.png");
    let mask = inputs().join("mask-96x80.png");
    let rgba_mask = dir.join("flux3-mask-rgba.png");
    alpha_mask(&mask, &rgba_mask);
    let (pic, m) = (encoded(&picture), encoded(&mask));
    let a1111 = |extra| {
        let base = serde_json::json!({
            "prompt": PROMPT, "override_settings": {"sd_model_checkpoint": "flux3"},
        });
        merged(base, extra)
    };
    let page = |extra| {
        merged(
            serde_json::json!({"model": "flux3", "prompt": PROMPT}),
            extra,
        )
    };
    let with = |extra: &[&str]| {
        let mut f = flags(&["--model", "flux3"]);
        f.extend(flags(extra));
        f
    };
    vec![
        (
            KleinCase {
                name: "image to image on FLUX.3",
                cli: with(&["--image", s(&picture), "--strength", "0.7"]),
                ollama: None,
                openai: None,
                a1111: None,
                page: Some(page(
                    serde_json::json!({"picture": data_url(&picture), "strength": 0.7}),
                )),
            },
            "image is not available for FLUX.3 [klein] models",
        ),
        (
            KleinCase {
                name: "inpainting on FLUX.3",
                cli: with(&["--image", s(&picture), "--mask", s(&mask)]),
                ollama: None,
                openai: Some(OpenAi::Edit(vec![
                    text("model", "flux3"),
                    text("prompt", PROMPT),
                    file("image", &picture),
                    file("mask", &rgba_mask),
                ])),
                a1111: Some((
                    "/sdapi/v1/img2img",
                    a1111(serde_json::json!({"init_images": [pic], "mask": m})),
                )),
                page: Some(page(serde_json::json!({
                    "picture": data_url(&picture), "mask": data_url(&mask),
                }))),
            },
            "mask is not available for FLUX.3 [klein] models",
        ),
        (
            KleinCase {
                name: "a hires pass on FLUX.3",
                cli: with(&["--width", "64", "--height", "48", "--hires-scale", "1.5"]),
                ollama: None,
                openai: None,
                a1111: Some((
                    "/sdapi/v1/txt2img",
                    a1111(serde_json::json!({
                        "width": 64, "height": 48, "enable_hr": true, "hr_scale": 1.5,
                        "hr_upscaler": "Lanczos",
                    })),
                )),
                page: Some(page(serde_json::json!({
                    "width": 64, "height": 48, "hires_scale": 1.5,
                }))),
            },
            "hires-scale is not available for FLUX.3 [klein] models",
        ),
    ]
}

#[test]
fn the_same_flux3_request_gives_the_same_png_from_every_front_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    for (name, from) in [
        ("flux3", models.join("flux3-klein-tiny")),
        ("flux3base", models.join("flux3-klein-tiny-base")),
    ] {
        let created = common::zimage_in(&store, &["create", name, "--from", s(&from)]);
        assert!(created.status.success(), "{created:?}");
    }
    let gallery = dir.path().join("gallery");
    let server = Server::start(&store, &["--gallery-dir", s(&gallery)], &[]);

    let mut pictures = Vec::new();
    for case in flux3_cases() {
        let Answer::Png(expected) = cli(&store, dir.path(), &case.cli) else {
            panic!("{}: the command line refused it", case.name)
        };
        for (front, answer) in server_answers(&case, server.port, &gallery) {
            match answer {
                None => {}
                Some(Answer::Png(png)) => {
                    assert!(png == expected, "{}: {front}'s PNG differs", case.name)
                }
                Some(other) => panic!("{}: {front} answered {other:?}", case.name),
            }
        }
        pictures.push(expected);
    }
    for (i, a) in pictures.iter().enumerate() {
        for b in &pictures[i + 1..] {
            assert!(a != b, "two FLUX.3 cases gave the same image");
        }
    }
    // The page's form offers what FLUX.3 has: references, no picture to start from, no mask,
    // no hires pass.
    let (_, info) = common::server::get(server.port, "/ui/api/info");
    let info = json(&info);
    let flux3 = (info["models"].as_array())
        .and_then(|all| all.iter().find(|m| m["short"] == "flux3"))
        .unwrap_or_else(|| panic!("no flux3 in {info}"));
    assert_eq!(
        flux3["takes"],
        serde_json::json!({
            "controlnet": false, "cfg_normalization": false, "cfg_truncation": false,
            "references": true, "picture": false, "mask": false, "hires": false,
        })
    );

    let written = files_in(&gallery);
    for (case, needle) in flux3_bad_cases(dir.path()) {
        let command_line = ("command line", Some(cli(&store, dir.path(), &case.cli)));
        let answers =
            std::iter::once(command_line).chain(server_answers(&case, server.port, &gallery));
        for (front, answer) in answers {
            let Some(answer) = answer else { continue };
            let Answer::Refused(code, message) = answer else {
                panic!("{}: {front} made an image", case.name)
            };
            match front {
                "command line" => assert_eq!(code, 2, "{}: {message}", case.name),
                _ => assert!(
                    (400..500).contains(&code),
                    "{}: {front}: {code} {message}",
                    case.name
                ),
            }
            assert!(
                message.contains(needle),
                "{}: {front} said `{message}`, without `{needle}`",
                case.name
            );
        }
        assert_eq!(
            files_in(&gallery),
            written,
            "{}: the page kept an image",
            case.name
        );
    }
}

/// FLUX.1 requests as each front end takes them: text to image and image-to-image on \[dev\]
/// (its guidance embedded), and a Kontext edit of one picture.
fn flux1_cases() -> Vec<KleinCase> {
    let picture = inputs().join("picture-96x80.png");
    let pic = encoded(&picture);
    let ollama = |model: &str, extra| {
        let base = serde_json::json!({
            "model": model, "prompt": PROMPT, "steps": 2, "seed": 7, "stream": false,
            "options": {"seed": 7},
        });
        merged(base, extra)
    };
    let a1111 = |model: &str, extra| {
        let base = serde_json::json!({
            "prompt": PROMPT, "steps": 2, "seed": 7, "sampler_name": "Euler",
            "scheduler": "Automatic", "override_settings": {"sd_model_checkpoint": model},
        });
        merged(base, extra)
    };
    let page = |model: &str, extra| {
        merged(
            serde_json::json!({"model": model, "prompt": PROMPT, "steps": 2, "seed": 7}),
            extra,
        )
    };
    let with = |model: &str, extra: &[&str]| {
        let mut f = flags(&["--model", model, "--steps", "2", "--seed", "7"]);
        f.extend(flags(extra));
        f
    };
    let form = |model: &'static str, extra: Vec<FormPart>| {
        let mut parts = vec![
            text("model", model),
            text("prompt", PROMPT),
            text("steps", "2"),
            text("seed", "7"),
        ];
        parts.extend(extra);
        OpenAi::Edit(parts)
    };
    vec![
        KleinCase {
            name: "text to image on [dev]",
            cli: with(
                "flux1",
                &["--width", "88", "--height", "56", "--guidance", "4"],
            ),
            ollama: Some(ollama(
                "flux1",
                serde_json::json!({"width": 88, "height": 56, "guidance": 4}),
            )),
            openai: None,
            a1111: Some((
                "/sdapi/v1/txt2img",
                a1111(
                    "flux1",
                    serde_json::json!({"width": 88, "height": 56, "cfg_scale": 4}),
                ),
            )),
            page: Some(page(
                "flux1",
                serde_json::json!({"width": 88, "height": 56, "guidance": 4}),
            )),
        },
        KleinCase {
            name: "true guidance with a negative prompt on [dev]",
            cli: with(
                "flux1",
                &[
                    "--width",
                    "72",
                    "--height",
                    "64",
                    "--guidance",
                    "3.5",
                    "--negative",
                    "blurry, dark",
                    "--true-cfg",
                    "2",
                ],
            ),
            ollama: Some(ollama(
                "flux1",
                serde_json::json!({
                    "width": 72, "height": 64, "guidance": 3.5, "negative_prompt": "blurry, dark",
                    "true_cfg": 2,
                }),
            )),
            openai: None,
            // Forge's pair: `distilled_cfg_scale` the embedded guidance, `cfg_scale` true CFG.
            a1111: Some((
                "/sdapi/v1/txt2img",
                a1111(
                    "flux1",
                    serde_json::json!({
                        "width": 72, "height": 64, "distilled_cfg_scale": 3.5, "cfg_scale": 2,
                        "negative_prompt": "blurry, dark",
                    }),
                ),
            )),
            page: Some(page(
                "flux1",
                serde_json::json!({
                    "width": 72, "height": 64, "guidance": 3.5, "negative_prompt": "blurry, dark",
                    "true_cfg": 2,
                }),
            )),
        },
        KleinCase {
            name: "text to image at [dev]'s own guidance",
            cli: with("flux1", &["--width", "64", "--height", "48"]),
            ollama: Some(ollama(
                "flux1",
                serde_json::json!({"width": 64, "height": 48}),
            )),
            openai: Some(OpenAi::Json(ollama(
                "flux1",
                serde_json::json!({"size": "64x48"}),
            ))),
            a1111: None,
            page: None,
        },
        KleinCase {
            name: "image to image on [dev]",
            cli: with("flux1", &["--image", s(&picture), "--strength", "0.75"]),
            ollama: Some(ollama(
                "flux1",
                serde_json::json!({"images": [pic], "strength": 0.75}),
            )),
            openai: Some(form(
                "flux1",
                vec![file("image", &picture), text("strength", "0.75")],
            )),
            a1111: Some((
                "/sdapi/v1/img2img",
                a1111(
                    "flux1",
                    serde_json::json!({"init_images": [pic], "denoising_strength": 0.75}),
                ),
            )),
            page: Some(page(
                "flux1",
                serde_json::json!({"picture": data_url(&picture), "strength": 0.75}),
            )),
        },
        KleinCase {
            name: "a Kontext edit",
            cli: with("flux1k", &["--ref", s(&picture)]),
            ollama: Some(ollama("flux1k", serde_json::json!({"images": [pic]}))),
            // One picture and no mask: Kontext's edit.
            openai: Some(form("flux1k", vec![file("image", &picture)])),
            // A model that only edits reads `init_images` as the picture to edit.
            a1111: Some((
                "/sdapi/v1/img2img",
                a1111("flux1k", serde_json::json!({"init_images": [pic]})),
            )),
            page: Some(page(
                "flux1k",
                serde_json::json!({"references": [data_url(&picture)]}),
            )),
        },
    ]
}

/// What a FLUX.1 model has no way to do, asked of every front end that can ask it.
fn flux1_bad_cases(dir: &Path) -> Vec<(KleinCase, &'static str)> {
    let picture = inputs().join("picture-96x80.png");
    let mask = inputs().join("mask-96x80.png");
    let rgba_mask = dir.join("flux1-mask-rgba.png");
    alpha_mask(&mask, &rgba_mask);
    let page =
        |model: &str, extra| merged(serde_json::json!({"model": model, "prompt": PROMPT}), extra);
    let with = |model: &str, extra: &[&str]| {
        let mut f = flags(&["--model", model]);
        f.extend(flags(extra));
        f
    };
    let none = |name, cli| KleinCase {
        name,
        cli,
        ollama: None,
        openai: None,
        a1111: None,
        page: None,
    };
    vec![
        (
            none(
                "true CFG without a negative prompt",
                with("flux1", &["--true-cfg", "2"]),
            ),
            "--true-cfg runs a second prediction from the negative prompt",
        ),
        (
            none(
                "true CFG on a family without it",
                with("flux3", &["--true-cfg", "2", "--negative", "dark"]),
            ),
            "--true-cfg is not available for FLUX.3 [klein] models",
        ),
        (
            KleinCase {
                page: Some(page(
                    "flux1",
                    serde_json::json!({"references": [data_url(&picture)]}),
                )),
                ..none(
                    "a reference on [dev]",
                    with("flux1", &["--ref", s(&picture)]),
                )
            },
            "--ref is not available for FLUX.1 [dev] models",
        ),
        (
            KleinCase {
                page: Some(page(
                    "flux1k",
                    serde_json::json!({"picture": data_url(&picture), "strength": 0.7}),
                )),
                ..none(
                    "image to image on Kontext",
                    with("flux1k", &["--image", s(&picture)]),
                )
            },
            "--image is not available for FLUX.1 Kontext [dev] models",
        ),
        (
            KleinCase {
                openai: Some(OpenAi::Edit(vec![
                    text("model", "flux1k"),
                    text("prompt", PROMPT),
                    file("image", &picture),
                    file("mask", &rgba_mask),
                ])),
                ..none(
                    "inpainting on Kontext",
                    with("flux1k", &["--image", s(&picture), "--mask", s(&mask)]),
                )
            },
            "--mask is not available for FLUX.1 Kontext [dev] models",
        ),
    ]
}

#[test]
fn the_same_flux1_request_gives_the_same_png_from_every_front_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    for (name, from) in [
        ("flux1", models.join("flux1-dev-tiny")),
        ("flux1k", models.join("flux1-kontext-tiny")),
        ("flux3", models.join("flux3-klein-tiny")),
    ] {
        let created = common::zimage_in(&store, &["create", name, "--from", s(&from)]);
        assert!(created.status.success(), "{created:?}");
    }
    let gallery = dir.path().join("gallery");
    let server = Server::start(&store, &["--gallery-dir", s(&gallery)], &[]);

    let mut pictures = Vec::new();
    for case in flux1_cases() {
        let Answer::Png(expected) = cli(&store, dir.path(), &case.cli) else {
            panic!("{}: the command line refused it", case.name)
        };
        for (front, answer) in server_answers(&case, server.port, &gallery) {
            match answer {
                None => {}
                Some(Answer::Png(png)) => {
                    assert!(png == expected, "{}: {front}'s PNG differs", case.name)
                }
                Some(other) => panic!("{}: {front} answered {other:?}", case.name),
            }
        }
        pictures.push(expected);
    }
    for (i, a) in pictures.iter().enumerate() {
        for b in &pictures[i + 1..] {
            assert!(a != b, "two FLUX.1 cases gave the same image");
        }
    }
    // The page's form offers what each model has: [dev] starts from a picture, Kontext edits
    // one given as a reference.
    let (_, info) = common::server::get(server.port, "/ui/api/info");
    let info = json(&info);
    let takes = |short: &str| {
        (info["models"].as_array())
            .and_then(|all| all.iter().find(|m| m["short"] == short))
            .unwrap_or_else(|| panic!("no {short} in {info}"))["takes"]
            .clone()
    };
    assert_eq!(
        takes("flux1"),
        serde_json::json!({
            "controlnet": false, "cfg_normalization": false, "cfg_truncation": false,
            "references": false, "picture": true, "mask": true, "hires": true,
        })
    );
    assert_eq!(
        takes("flux1k"),
        serde_json::json!({
            "controlnet": false, "cfg_normalization": false, "cfg_truncation": false,
            "references": true, "picture": false, "mask": false, "hires": false,
        })
    );

    let written = files_in(&gallery);
    for (case, needle) in flux1_bad_cases(dir.path()) {
        let command_line = ("command line", Some(cli(&store, dir.path(), &case.cli)));
        let answers =
            std::iter::once(command_line).chain(server_answers(&case, server.port, &gallery));
        for (front, answer) in answers {
            let Some(answer) = answer else { continue };
            let Answer::Refused(code, message) = answer else {
                panic!("{}: {front} made an image", case.name)
            };
            match front {
                "command line" => assert_eq!(code, 2, "{}: {message}", case.name),
                _ => assert!(
                    (400..500).contains(&code),
                    "{}: {front}: {code} {message}",
                    case.name
                ),
            }
            assert!(
                message.contains(needle),
                "{}: {front} said `{message}`, without `{needle}`",
                case.name
            );
        }
        assert_eq!(
            files_in(&gallery),
            written,
            "{}: the page kept an image",
            case.name
        );
    }
}
