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
