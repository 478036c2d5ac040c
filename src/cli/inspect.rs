//! `zimage inspect`: what a file or stored model holds, in one report that prints as text or
//! JSON. Files are told by their content, not their extension.

use super::store::human;
use super::target::{self, Target};
use anyhow::Context;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zimage::formats::{dfsn, infotext, ztensor, FileKind, Listing};
use zimage::image_out;
use zimage::safetensors;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A model file (.safetensors, .zt, .dfsn, .gguf, a store blob), a PNG, or a stored model's name.
    pub target: String,
    /// For a stored model: only this component (`text_encoder`, `transformer`, `vae`).
    #[arg(long, value_parser = super::component_arg)]
    pub component: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Labelled facts, then (for model files) the tensors.
struct Report {
    facts: Vec<(&'static str, Value)>,
    listing: Option<Listing>,
}

pub fn run(store: Option<PathBuf>, a: InspectArgs) -> anyhow::Result<ExitCode> {
    let report = match target::resolve(store.as_deref(), &a.target)? {
        Target::File { path, kind } => {
            if a.component.is_some() {
                anyhow::bail!(
                    "`--component` applies to stored models, and `{}` is a file",
                    path.display()
                );
            }
            inspect_file(&path, kind)?
        }
        t @ Target::Model { .. } => inspect_model(&t, a.component.as_deref())?,
    };
    if a.json {
        let mut obj = serde_json::Map::new();
        for (k, v) in report.facts {
            obj.insert(k.to_string(), v);
        }
        if let Some(l) = report.listing {
            obj.insert("tensors".into(), serde_json::to_value(&l.tensors)?);
            obj.insert("metadata".into(), serde_json::to_value(&l.metadata)?);
        }
        println!("{}", serde_json::to_string_pretty(&Value::Object(obj))?);
    } else {
        print_text(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn inspect_file(path: &Path, kind: FileKind) -> anyhow::Result<Report> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("`{}`", path.display()))?
        .len();
    let mut facts = vec![
        ("path", json!(path.display().to_string())),
        ("size", json!(size)),
    ];
    let listing = match kind {
        FileKind::Safetensors => {
            let header = safetensors::read_header_file(path)?;
            facts.push(("format", json!(safetensors_flavour(path, &header))));
            facts.push(("header_bytes", json!(header.header_len)));
            facts.push(("data_offset", json!(header.data_start())));
            if zimage::lora::is_adapter(&header) {
                facts.extend(lora_facts(path));
            }
            Some(zimage::formats::listing_of_file(path)?)
        }
        FileKind::ZTensor => {
            let file = ztensor::ZtFile::open(path)?;
            facts.push(("format", json!(format!("zTensor {}", file.version()))));
            facts.push(("generator", json!(file.generator())));
            let mut layouts = std::collections::BTreeMap::<String, usize>::new();
            for t in file.tensors() {
                for (role, c) in t.layout.components() {
                    let digest = match &c.digest {
                        Some(ztensor::Digest::Crc32c(_)) => "crc32c",
                        Some(ztensor::Digest::Sha256(_)) => "sha256",
                        None => "no digest",
                    };
                    let key = format!("{} {role} {:?} {digest}", t.layout.format(), c.encoding)
                        .to_lowercase();
                    *layouts.entry(key).or_default() += 1;
                }
            }
            facts.push(("components", json!(layouts)));
            if !file.warnings().is_empty() {
                facts.push(("warnings", json!(file.warnings())));
            }
            Some(zimage::formats::listing_of_file(path)?)
        }
        FileKind::Dfsn => {
            let c = dfsn::Container::open(path)?;
            facts.push(("format", json!("DFSN container")));
            facts.push((
                "model_type",
                json!(format!("{:?}", c.model_type).to_lowercase()),
            ));
            facts.push(("model_sha256", json!(c.sha256_hex())));
            facts.push(("model_offset", json!(c.model_offset)));
            facts.push(("model_bytes", json!(c.model_len)));
            facts.push(("container_metadata", c.metadata.clone()));
            match c.model_type {
                dfsn::ModelType::Safetensors => Some(dfsn::listing(path)?),
                dfsn::ModelType::Ckpt => None,
            }
        }
        FileKind::Gguf => {
            facts.extend(gguf_facts(path)?);
            Some(zimage::formats::listing_of_file(path)?)
        }
        FileKind::Png => {
            facts.push(("format", json!("PNG image")));
            let chunks = image_out::read_png_text(path)?
                .iter()
                .map(|(key, text)| png_chunk(key, text))
                .collect();
            facts.push(("text", Value::Array(chunks)));
            None
        }
        other => anyhow::bail!(
            "`{}` is {}; `inspect` reads safetensors, .zt, .dfsn, .gguf and PNG files",
            path.display(),
            other.describe()
        ),
    };
    if let Some(l) = &listing {
        facts.extend(tensor_totals(l));
    }
    Ok(Report { facts, listing })
}

/// A GGUF file's version, layout and tensor types, with what an import does with each type.
fn gguf_facts(path: &Path) -> anyhow::Result<Vec<(&'static str, Value)>> {
    let g = zimage::formats::gguf::read_file(path)?;
    let mut types = std::collections::BTreeMap::<String, usize>::new();
    for t in &g.tensors {
        let path = match t.ggml_type.import_path() {
            Some(p) => format!("imports as {}", p.describe(t.ggml_type)),
            None => "not importable".to_string(),
        };
        *types
            .entry(format!("{} ({path})", t.ggml_type))
            .or_default() += 1;
    }
    Ok(vec![
        ("format", json!(format!("GGUF v{}", g.version))),
        ("alignment", json!(g.alignment)),
        ("data_offset", json!(g.data_start)),
        ("metadata_keys", json!(g.metadata.len())),
        ("tensor_types", json!(types)),
    ])
}

/// A safetensors file as the store writes blobs: one tensor keyed `data` (the seed's form) or
/// keyed by its name, or a quantized weight with its `.scale`/`.bias` companions.
/// What an adapter file holds: layout, rank, alpha, targets and the base it is for; a file
/// that cannot be applied says why.
fn lora_facts(path: &Path) -> Vec<(&'static str, Value)> {
    let file = match zimage::lora::LoraFile::read(path, true) {
        Ok(f) => f,
        Err(e) => return vec![("lora", json!(format!("not applicable: {e}")))],
    };
    let s = file.summary();
    let alpha = if s.alphas.is_empty() {
        "none (alpha = rank, scale 1)".to_string()
    } else {
        s.alphas
            .iter()
            .map(f64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let rank = match s.rank {
        (lo, hi) if lo == hi => lo.to_string(),
        (lo, hi) => format!("{lo}..{hi}"),
    };
    let mut facts = vec![
        ("lora_layout", json!(s.layout.describe())),
        ("lora_pairs", json!(s.pairs)),
        ("lora_rank", json!(rank)),
        ("lora_alpha", json!(alpha)),
        (
            "lora_targets",
            json!(s
                .targets
                .iter()
                .map(|(t, n)| format!("{t} ×{n}"))
                .collect::<Vec<_>>()),
        ),
        (
            "lora_base",
            json!(zimage::families::lora_base_guess(&s.targets)),
        ),
    ];
    if !file.skipped.is_empty() {
        facts.push(("lora_unmatched", json!(file.skipped.len())));
    }
    facts
}

fn safetensors_flavour(path: &Path, header: &safetensors::Header) -> &'static str {
    let in_store = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("sha256-"));
    match (in_store, header.tensors.len()) {
        (false, _) => "safetensors",
        (true, 1) if header.tensors[0].name == "data" => "store blob: one tensor keyed `data`",
        (true, 1) => "store blob: one tensor keyed by name",
        (true, _) => "store blob: quantized tensor with scales and biases",
    }
}

fn inspect_model(t: &Target, component: Option<&str>) -> anyhow::Result<Report> {
    let Target::Model { model, store } = t else {
        unreachable!("called for stored models")
    };
    let listing = t.listing(component)?;
    let mut facts = vec![
        ("model", json!(model.name.short())),
        (
            "format",
            json!("stored model (manifest and per-tensor blobs)"),
        ),
        ("identity", json!(model.manifest.model_identity())),
        ("manifest", json!(model.manifest_digest)),
        ("size", json!(model.size())),
        ("components", json!(model.manifest.components())),
    ];
    let loras = zimage::lora::stored::records(store, model)?;
    if !loras.is_empty() {
        let shown: Vec<String> = loras
            .iter()
            .map(|(_, r)| {
                format!(
                    "{} ({} pairs, {})",
                    zimage::lora::stored::describe(r),
                    r.pairs,
                    r.layout.describe()
                )
            })
            .collect();
        facts.push(("loras", json!(shown)));
    }
    facts.extend(tensor_totals(&listing));
    Ok(Report {
        facts,
        listing: Some(listing),
    })
}

fn tensor_totals(l: &Listing) -> Vec<(&'static str, Value)> {
    // Shapes and lengths come from the file: totals saturate rather than overflow.
    let params = l.tensors.iter().fold(0u64, |sum, t| {
        let n = t.shape.iter().fold(1u64, |n, &d| n.saturating_mul(d));
        sum.saturating_add(n)
    });
    let bytes = l
        .tensors
        .iter()
        .fold(0u64, |sum, t| sum.saturating_add(t.byte_length));
    let mut dtypes = std::collections::BTreeMap::<String, usize>::new();
    for t in &l.tensors {
        *dtypes.entry(t.dtype.to_uppercase()).or_default() += 1;
    }
    vec![
        ("tensor_count", json!(l.tensors.len())),
        ("parameters", json!(params)),
        ("tensor_bytes", json!(bytes)),
        ("dtypes", json!(dtypes)),
    ]
}

/// A PNG text chunk; A1111's `parameters` and the JSON chunks (ComfyUI's `prompt` and
/// `workflow`, our `zimage`) are parsed.
fn png_chunk(key: &str, text: &str) -> Value {
    if key == image_out::PARAMETERS_KEY {
        let info = infotext::parse(text);
        let params: serde_json::Map<String, Value> = info
            .params
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        return json!({ "key": key, "text": text, "prompt": info.prompt, "negative_prompt": info.negative_prompt, "parameters": params });
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v.is_object() || v.is_array() => json!({ "key": key, "json": v }),
        _ => json!({ "key": key, "text": text }),
    }
}

fn print_text(r: &Report) {
    for (k, v) in &r.facts {
        let shown = match (k, v) {
            (&("size" | "tensor_bytes" | "model_bytes"), Value::Number(n)) => {
                human(n.as_u64().unwrap_or(0))
            }
            (&("dtypes" | "components"), Value::Object(m)) => m
                .iter()
                .map(|(d, n)| format!("{d}×{n}"))
                .collect::<Vec<_>>()
                .join(" "),
            (&"text", Value::Array(chunks)) => {
                chunks.iter().map(chunk_text).collect::<Vec<_>>().join("\n")
            }
            (_, Value::String(s)) => s.clone(),
            (_, Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string).unwrap_or(i.to_string()))
                .collect::<Vec<_>>()
                .join(", "),
            (_, other) => other.to_string(),
        };
        println!("{:<16}{shown}", k.replace('_', " "));
    }
    let Some(l) = &r.listing else { return };
    if !l.metadata.is_empty() {
        println!("metadata");
        for (k, v) in &l.metadata {
            println!(
                "  {k}: {}",
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string())
            );
        }
    }
    if l.tensors.is_empty() {
        return;
    }
    let width = l
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!();
    println!(
        "{:<width$}  {:<8} {:<22} {:>10}",
        "NAME", "DTYPE", "SHAPE", "BYTES"
    );
    for t in &l.tensors {
        let shape = format!("{:?}", t.shape);
        println!(
            "{:<width$}  {:<8} {:<22} {:>10}",
            t.name,
            t.dtype.to_uppercase(),
            shape,
            t.byte_length
        );
    }
}

/// A PNG text chunk as `key` and its content, indented below.
fn chunk_text(chunk: &Value) -> String {
    let key = chunk["key"].as_str().unwrap_or("");
    let body = match (chunk.get("json"), chunk.get("parameters")) {
        (Some(j), _) => serde_json::to_string_pretty(j).unwrap_or_default(),
        (None, Some(Value::Object(params))) => {
            let mut lines = vec![format!(
                "prompt: {}",
                chunk["prompt"].as_str().unwrap_or("")
            )];
            if let Some(n) = chunk["negative_prompt"].as_str().filter(|n| !n.is_empty()) {
                lines.push(format!("negative prompt: {n}"));
            }
            lines.extend(
                params
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap_or(""))),
            );
            lines.join("\n")
        }
        _ => chunk["text"].as_str().unwrap_or("").to_string(),
    };
    format!("`{key}`\n{}", indent(&body))
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
