//! Writes the seed corpora: small valid inputs for every fuzz target, made by zimage's own
//! writers where it has one, so that the fuzzers start past the magic numbers and checksums.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example seeds -- fuzz/seeds`

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;
use zimage::formats::{infotext, ztensor};
use zimage::safetensors::{header_bytes, Dtype, TensorSpec};
use zimage::store::manifest::{self, Layer, Manifest};

fn main() {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/seeds".into()),
    );
    let mut seeds = Seeds { out, total: 0 };
    safetensors_header(&mut seeds);
    blob_classification(&mut seeds, "blob_classification");
    blob_classification(&mut seeds, "blob_load");
    manifests(&mut seeds);
    model_names(&mut seeds);
    ztensor_files(&mut seeds);
    dfsn_files(&mut seeds);
    png_files(&mut seeds);
    image_inputs(&mut seeds);
    infotexts(&mut seeds);
    edit_forms(&mut seeds);
    ollama_bodies(&mut seeds);
    println!("{} bytes of seeds in {}", seeds.total, seeds.out.display());
}

struct Seeds {
    out: PathBuf,
    total: usize,
}

impl Seeds {
    fn put(&mut self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.out.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
        self.total += bytes.len();
    }
}

fn spec(name: &str, dtype: Dtype, shape: &[u64]) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
    }
}

/// A safetensors file: the writer's header, then counting bytes for the data.
fn safetensors(specs: &[TensorSpec], metadata: Option<&BTreeMap<String, String>>) -> Vec<u8> {
    let mut bytes = header_bytes(specs, metadata, 8).unwrap();
    let data: u64 = specs.iter().map(|s| s.nbytes().unwrap()).sum();
    bytes.extend((0..data).map(|i| i as u8));
    bytes
}

fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn safetensors_header(s: &mut Seeds) {
    let t = "safetensors_header";
    s.put(
        t,
        "one_bf16",
        &safetensors(&[spec("data", Dtype::BF16, &[2, 3])], None),
    );
    s.put(
        t,
        "several_with_metadata",
        &safetensors(
            &[
                spec("a.weight", Dtype::F32, &[2, 2]),
                spec("a.bias", Dtype::F16, &[2]),
                spec("scalar", Dtype::I64, &[]),
                spec("empty", Dtype::U8, &[0, 4]),
                spec("nibbles", Dtype::F4, &[4]),
            ],
            Some(&meta(&[("format", "pt"), ("note", "ünïcode")])),
        ),
    );
    // The reference writer's layout: no padding, `__metadata__` last, unknown fields.
    let json =
        r#"{"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3],"extra":1},"__metadata__":null}"#;
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(json.as_bytes());
    file.extend_from_slice(&[1, 2, 3]);
    s.put(t, "reference_layout", &file);
    s.put(t, "empty_header", b"\x02\0\0\0\0\0\0\0{}");
}

/// Blobs as each generation of Ollama wrote them, behind the mode byte target `t` reads.
fn blob_classification(s: &mut Seeds, t: &str) {
    let blob = |mode: u8, blobs: &[Vec<u8>]| {
        let mut v = vec![mode];
        for (i, b) in blobs.iter().enumerate() {
            if i > 0 {
                v.extend_from_slice(b"@@BLOB@@");
            }
            v.extend_from_slice(b);
        }
        v
    };
    let v1 = safetensors(&[spec("data", Dtype::F32, &[2, 2])], None);
    s.put(t, "v1", &blob(0, &[v1.clone()]));
    s.put(t, "v1_declared_mmap", &blob(4 | 8, &[v1]));
    let v2 = safetensors(&[spec("w", Dtype::BF16, &[4])], None);
    s.put(t, "v2_named", &blob(4, &[v2]));
    // Group 32, 4 bits: 2 rows of 64 columns are 8 packed u32 and 2 scales a row.
    let v1_quantized = [
        safetensors(&[spec("data", Dtype::U32, &[2, 8])], None),
        safetensors(&[spec("data", Dtype::F16, &[2, 2])], None),
        safetensors(&[spec("data", Dtype::F16, &[2, 2])], None),
    ];
    s.put(t, "v1_quantized", &blob(1, &v1_quantized));
    s.put(t, "v1_scale_without_bias", &blob(2, &v1_quantized[..2]));
    let v2_quantized = |quant_type: &str, group: &str| {
        safetensors(
            &[
                spec("c/w", Dtype::U32, &[2, 8]),
                spec("c/w.scale", Dtype::F16, &[2, 2]),
                spec("c/w.bias", Dtype::F16, &[2, 2]),
            ],
            Some(&meta(&[("quant_type", quant_type), ("group_size", group)])),
        )
    };
    s.put(
        t,
        "v2_quantized_int4",
        &blob(0, &[v2_quantized("int4", "32")]),
    );
    s.put(
        t,
        "v2_quantized_mxfp4",
        &blob(8, &[v2_quantized("mxfp4", "32")]),
    );
    let no_metadata = safetensors(
        &[
            spec("w", Dtype::U32, &[2, 8]),
            spec("w.scale", Dtype::F16, &[2, 1]),
            spec("w.bias", Dtype::F16, &[2, 1]),
        ],
        None,
    );
    s.put(t, "v2_quantized_inferred_bits", &blob(4, &[no_metadata]));
}

fn layer(media_type: &str, bytes: &[u8], name: Option<&str>) -> Layer {
    Layer {
        media_type: media_type.into(),
        digest: format!("sha256:{:x}", Sha256::digest(bytes)),
        size: bytes.len() as u64,
        from: None,
        name: name.map(Into::into),
        dtype: None,
        shape: None,
    }
}

fn manifests(s: &mut Seeds) {
    let t = "manifest";
    let config = layer(
        manifest::CONFIG_MEDIA_TYPE,
        &manifest::config_blob("bf16"),
        None,
    );
    let mut tensor = layer(
        manifest::TENSOR_MEDIA_TYPE,
        b"w",
        Some("vae/decoder.conv_in.weight"),
    );
    tensor.dtype = Some("BF16".into());
    tensor.shape = Some(vec![4, 3, 3, 3]);
    let quantized = layer(
        manifest::TENSOR_MEDIA_TYPE,
        b"q",
        Some("transformer/layers.0.attention.to_q.weight"),
    );
    let json = layer(manifest::JSON_MEDIA_TYPE, b"{}", Some("model_index.json"));
    let alt = layer(
        manifest::CONFIG_FILE_MEDIA_TYPE_ALT,
        b"{}",
        Some("vae/config.json"),
    );
    let m = Manifest::new(config.clone(), vec![tensor, quantized, json, alt]);
    s.put(t, "written", &m.to_bytes());
    s.put(t, "no_layers", &Manifest::new(config, vec![]).to_bytes());
    s.put(
        t,
        "ollama_with_unknown_fields",
        br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","size":213},"layers":[{"mediaType":"application/vnd.ollama.image.tensor","digest":"sha256-BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB","size":88,"name":"vae/x","from":"/tmp/x","status":"ignored"}]}"#,
    );
}

fn model_names(s: &mut Seeds) {
    let t = "model_name";
    let hex = format!("{:x}", Sha256::digest(b"zimage"));
    for (name, text) in [
        ("bare", "z-image"),
        ("namespaced", "x/z-image-turbo:tiny"),
        ("host_with_port", "localhost:5000/me/tiny:v1"),
        ("full", "registry.ollama.ai/library/z-image:latest"),
        ("digest", &format!("sha256:{hex}")),
        (
            "digest_dash_upper",
            &format!("sha256-{}", hex.to_uppercase()),
        ),
    ] {
        s.put(t, name, text.as_bytes());
    }
}

fn f32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn ztensor_files(s: &mut Seeds) {
    let t = "ztensor";
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, opts: ztensor::WriteOptions, fill: &dyn Fn(&mut ztensor::Writer)| {
        let path = dir.path().join(name);
        let mut w = ztensor::Writer::create(&path, opts).unwrap();
        fill(&mut w);
        w.finish().unwrap();
        std::fs::read(&path).unwrap()
    };
    let dense = |w: &mut ztensor::Writer| {
        w.add_dense(
            "a",
            ztensor::ZDtype::Float32,
            &[2, 2],
            &f32s(&[1.0, 2.0, 3.0, 4.0]),
        )
        .unwrap();
        w.add_dense("b", ztensor::ZDtype::Uint8, &[3], &[7, 8, 9])
            .unwrap();
    };
    let sparse = |w: &mut ztensor::Writer| {
        let values = f32s(&[1.0, 2.0, 3.0]);
        w.add_csr(
            "csr",
            ztensor::ZDtype::Float32,
            &[3, 4],
            &values,
            &[0, 3, 1],
            &[0, 2, 2, 3],
        )
        .unwrap();
        w.add_coo(
            "coo",
            ztensor::ZDtype::Float32,
            &[2, 3],
            &values,
            &[0, 1, 1, 0, 2, 1],
        )
        .unwrap();
    };
    let mut attributes = BTreeMap::new();
    attributes.insert("source".to_string(), "seeds".to_string());
    let opts = |compress, checksum| ztensor::WriteOptions {
        compress,
        checksum,
        attributes: attributes.clone(),
    };
    s.put(
        t,
        "dense_crc32c",
        &write("a.zt", opts(false, ztensor::Checksum::Crc32c), &dense),
    );
    s.put(
        t,
        "dense_zstd_sha256",
        &write("b.zt", opts(true, ztensor::Checksum::Sha256), &dense),
    );
    s.put(
        t,
        "sparse_raw",
        &write("c.zt", opts(false, ztensor::Checksum::None), &sparse),
    );
    s.put(
        t,
        "sparse_zstd",
        &write("d.zt", opts(true, ztensor::Checksum::Crc32c), &sparse),
    );
    s.put(
        t,
        "empty",
        &write("e.zt", ztensor::WriteOptions::default(), &|_| {}),
    );
}

/// A container with a small metadata area (the writer's is 2 MiB): every offset is the
/// reader's to check.
fn dfsn(model_type: u16, metadata: &str, model: &[u8], little_endian: bool) -> Vec<u8> {
    let meta_at = 0x2Eu32;
    let model_at = meta_at + metadata.len() as u32 + 4;
    let (ty, m, o) = if little_endian {
        (
            model_type.to_le_bytes(),
            meta_at.to_le_bytes(),
            model_at.to_le_bytes(),
        )
    } else {
        (
            model_type.to_be_bytes(),
            meta_at.to_be_bytes(),
            model_at.to_be_bytes(),
        )
    };
    let mut v = b"DFSN".to_vec();
    v.extend_from_slice(&ty);
    v.extend_from_slice(&Sha256::digest(model));
    v.extend_from_slice(&m);
    v.extend_from_slice(&o);
    v.extend_from_slice(metadata.as_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(model);
    v
}

fn dfsn_files(s: &mut Seeds) {
    let t = "dfsn";
    let model = safetensors(&[spec("w", Dtype::F16, &[2])], Some(&meta(&[("k", "v")])));
    let metadata = r#"{"name":"tiny","tags":["a","b"],"nested":{"x":1}}"#;
    s.put(
        t,
        "safetensors_big_endian",
        &dfsn(2, metadata, &model, false),
    );
    s.put(
        t,
        "safetensors_little_endian",
        &dfsn(2, metadata, &model, true),
    );
    s.put(
        t,
        "ckpt_empty_metadata",
        &dfsn(1, "", b"PK\x03\x04not a zip", false),
    );
}

fn png_files(s: &mut Seeds) {
    let t = "png_text";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.png");
    let params = infotext::format(
        "a cat",
        "blurry",
        &[("Steps", "8"), ("Sampler", "Euler"), ("Size", "2x2")],
    );
    zimage::image_out::write_png(
        &path,
        &[0u8; 12],
        2,
        2,
        &[("parameters", &params), ("zimage", r#"{"prompt":"日本"}"#)],
    )
    .unwrap();
    s.put(t, "written", &std::fs::read(&path).unwrap());

    // Compressed chunks, which the writer never makes but other tools do.
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, 1, 1);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_depth(png::BitDepth::Eight);
        enc.add_ztxt_chunk("parameters".into(), params.clone())
            .unwrap();
        let mut w = enc.write_header().unwrap();
        let mut itxt = png::text_metadata::ITXtChunk::new("zimage", "{\"a\":\"ß\"}");
        itxt.compress_text().unwrap();
        w.write_text_chunk(&itxt).unwrap();
        w.write_image_data(&[0]).unwrap();
    }
    s.put(t, "compressed_chunks", &bytes);
}

/// Small pictures in each format and colour type the inputs accept.
fn image_inputs(s: &mut Seeds) {
    use image::{DynamicImage, ImageFormat, Rgba, RgbaImage};
    let t = "image_input";
    let rgba = RgbaImage::from_fn(20, 12, |x, y| {
        Rgba([
            (x * 12) as u8,
            (y * 20) as u8,
            128,
            if x > 10 { 0 } else { 255 },
        ])
    });
    let pictures = [
        ("rgba", DynamicImage::ImageRgba8(rgba.clone())),
        (
            "rgb",
            DynamicImage::ImageRgb8(DynamicImage::ImageRgba8(rgba.clone()).to_rgb8()),
        ),
        (
            "grey",
            DynamicImage::ImageLuma8(DynamicImage::ImageRgba8(rgba).to_luma8()),
        ),
    ];
    for (name, img) in &pictures {
        for (format, ext) in [
            (ImageFormat::Png, "png"),
            (ImageFormat::Jpeg, "jpg"),
            (ImageFormat::WebP, "webp"),
        ] {
            if format == ImageFormat::Jpeg && img.color().has_alpha() {
                continue;
            }
            let mut bytes = std::io::Cursor::new(Vec::new());
            img.write_to(&mut bytes, format).unwrap();
            s.put(t, &format!("{name}.{ext}"), bytes.get_ref());
        }
    }
}

fn infotexts(s: &mut Seeds) {
    let t = "infotext";
    let written = infotext::format(
        "a cat, sitting\non two lines",
        "blurry",
        &[
            ("Steps", "8"),
            ("Sampler", "Euler"),
            ("CFG scale", "1"),
            ("Seed", "42"),
            ("Size", "512x512"),
            ("Lora hashes", "a: 1, b: 2"),
            ("Hires fix", "Hires fix"),
        ],
    );
    s.put(t, "written", written.as_bytes());
    s.put(t, "prompt_only", b"just a prompt: with, two pairs: here");
    s.put(
        t,
        "a1111",
        "masterpiece\nNegative prompt: lowres\nSteps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, Seed: 1, Size: 512x768, Model hash: 6c6a70ac2a, Version: v1.10.1, Template: \"a \\\"q\\\", b\"".as_bytes(),
    );
}

/// A small PNG for the API bodies' seeds.
fn small_png(alpha: bool) -> Vec<u8> {
    let img = if alpha {
        image::DynamicImage::ImageRgba8(image::RgbaImage::from_fn(16, 16, |x, _| {
            image::Rgba([x as u8 * 16, 0, 0, if x < 8 { 0 } else { 255 }])
        }))
    } else {
        image::DynamicImage::ImageRgb8(image::RgbImage::from_fn(16, 16, |x, y| {
            image::Rgb([x as u8 * 16, y as u8 * 16, 128])
        }))
    };
    let mut out = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

/// Multipart forms of `/v1/images/edits` with the boundary the target gives them.
fn edit_forms(seeds: &mut Seeds) {
    let part = |name: &str, file: bool, bytes: &[u8]| {
        let mut out = format!(
            "--zimageboundary\r\nContent-Disposition: form-data; name=\"{name}\"{}\r\n\r\n",
            if file {
                "; filename=\"a.png\"\r\nContent-Type: image/png"
            } else {
                ""
            }
        )
        .into_bytes();
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\r\n");
        out
    };
    let end = b"--zimageboundary--\r\n".to_vec();
    let (picture, mask) = (small_png(false), small_png(true));
    let text = [
        part("model", false, b"z-image"),
        part("prompt", false, b"a fox"),
        part("n", false, b"2"),
        part("size", false, b"16x16"),
        part("strength", false, b"0.6"),
        part("loras", false, br#"[{"path":"a.safetensors","scale":0.5}]"#),
    ]
    .concat();
    let form = |parts: &[Vec<u8>]| [parts.concat(), end.clone()].concat();
    seeds.put(
        "edit_form",
        "picture",
        &form(&[text.clone(), part("image", true, &picture)]),
    );
    seeds.put(
        "edit_form",
        "picture-mask",
        &form(&[
            text.clone(),
            part("image", true, &picture),
            part("mask", true, &mask),
        ]),
    );
    seeds.put(
        "edit_form",
        "control-base64",
        &form(&[
            text,
            part("image[]", true, &picture),
            part("controlnet", false, b"union"),
            part("control_image", false, base64(&picture).as_bytes()),
        ]),
    );
}

/// Bodies of Ollama's `/api/generate` with pictures in base64.
fn ollama_bodies(seeds: &mut Seeds) {
    let picture = base64(&small_png(false));
    let bodies = [
        (
            "text",
            serde_json::json!({"model": "z-image", "prompt": "a fox", "width": 16, "height": 16, "steps": 2}),
        ),
        (
            "images",
            serde_json::json!({"model": "z-image", "prompt": "a fox", "images": [picture], "options": {"strength": 0.5, "seed": 3}}),
        ),
        (
            "data-url",
            serde_json::json!({"model": "z-image", "prompt": "a fox", "images": [format!("data:image/png;base64,{picture}")]}),
        ),
        (
            "control",
            serde_json::json!({"model": "z-image", "prompt": "a fox", "controlnet": "union", "control_image": picture, "control_scale": 0.7}),
        ),
        (
            "images-not-a-list",
            serde_json::json!({"model": "z-image", "prompt": "a fox", "images": "AAAA"}),
        ),
    ];
    for (name, body) in bodies {
        seeds.put("ollama_images", name, &serde_json::to_vec(&body).unwrap());
    }
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
