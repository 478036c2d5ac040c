//! FLUX.2 [klein] behind the servers: Ollama's `images` and OpenAI's several `image[]`
//! without a mask are the reference pictures klein edits from, through the one runner.

mod common;

use base64::Engine as _;
use common::server::{b64, form_request, get, json, pixels, post, raw, Server};
use common::{compare_pixels, klein_reference_image, s, zimage_in};
use std::path::Path;

fn models() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/models"))
}

#[test]
fn klein_edits_from_the_pictures_an_api_request_carries() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let out = zimage_in(
        &store,
        &[
            "create",
            "klein",
            "--from",
            s(&models().join("flux2-klein-tiny")),
        ],
    );
    assert!(out.status.success());
    let picture = std::fs::read(models().join("reference/inputs/picture-96x80.png")).unwrap();
    let server = Server::start(&store, &[], &[]);

    // The page offers the model with klein's defaults (a distilled model: 4 steps, guidance 1).
    let (status, info) = get(server.port, "/ui/api/info");
    assert_eq!(status, 200, "{info}");
    let info = json(&info);
    let model = info["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["short"] == "klein");
    let model = model.unwrap_or_else(|| panic!("no klein model in {info}"));
    assert_eq!(
        (model["steps"].as_u64(), model["guidance"].as_f64()),
        (Some(4), Some(1.0))
    );

    // Ollama: the reference's edit (seed 5, 4 steps by the distilled model's default).
    let body = serde_json::json!({
        "model": "klein", "prompt": "make it snowy", "stream": false,
        "images": [base64::engine::general_purpose::STANDARD.encode(&picture)],
        "options": {"seed": 5},
    });
    let (status, answer) = post(server.port, "/api/generate", &body.to_string());
    assert_eq!(status, 200, "{answer}");
    let (w, h, ours) = pixels(&b64(json(&answer)["image"].as_str().unwrap()));
    assert_eq!((w, h), (96, 80));
    let (same, worst) = compare_pixels(&ours, &klein_reference_image("edit1"));
    assert!(
        same >= 0.999 && worst <= 1,
        "{same} identical, worst {worst}"
    );

    // OpenAI: two `image[]` files without a mask, both references; none left out.
    let parts = vec![
        ("model", None, b"klein".to_vec()),
        ("prompt", None, b"the fox in the snow".to_vec()),
        ("size", None, b"64x64".to_vec()),
        ("image[]", Some("a.png"), picture.clone()),
        ("image[]", Some("b.png"), picture.clone()),
    ];
    let (status, answer) = raw(server.port, &form_request("/v1/images/edits", &parts));
    assert_eq!(status, 200, "{answer}");
    let answer = json(&answer);
    let (w, h, _) = pixels(&b64(answer["data"][0]["b64_json"].as_str().unwrap()));
    assert_eq!((w, h), (64, 64));
    assert!(answer.get("zimage_note").is_none(), "{answer}");
}
