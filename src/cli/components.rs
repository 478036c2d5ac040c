//! `create NAME --transformer FILE --text-encoder FILE [--text-encoder-2 FILE] --vae FILE
//! [--tokenizer …] [--tokenizer-2 …] [--from DIR]`: a model composed from component checkpoints
//! in whatever layout they come in.
use anyhow::{bail, Context};
use std::path::PathBuf;
use zimage::diffusers_dir::DiffusersDir;
use zimage::layouts::files::{read_tokenizer, turbo_defaults, Checkpoint, ComposedModel};
use zimage::layouts::{Component, Layout};

/// The component files `create` was given, and what they replace or take their tokenizer from.
pub struct ComponentFiles<'a> {
    pub from: Option<&'a std::path::Path>,
    pub transformer: &'a [PathBuf],
    pub text_encoder: &'a [PathBuf],
    pub text_encoder_2: &'a [PathBuf],
    pub vae: &'a [PathBuf],
    pub tokenizer: Option<&'a std::path::Path>,
    pub tokenizer_2: Option<&'a std::path::Path>,
}

pub fn compose(a: &ComponentFiles) -> anyhow::Result<ComposedModel> {
    let base = match &a.from {
        Some(dir) if dir.is_dir() => Some(DiffusersDir::open(dir)?),
        Some(other) => bail!(
            "with component files, --from names the diffusers directory they replace components of; `{}` is not a directory",
            other.display()
        ),
        None => None,
    };
    let given: [(Component, &[PathBuf]); 4] = [
        (Component::Transformer, a.transformer),
        (Component::TextEncoder, a.text_encoder),
        (Component::TextEncoder2, a.text_encoder_2),
        (Component::Vae, a.vae),
    ];
    let mut parts = Vec::new();
    for (component, files) in given {
        if files.is_empty() {
            continue;
        }
        let checkpoint = Checkpoint::open(files)?;
        let described = checkpoint.describe();
        let mapped = checkpoint
            .map(component)
            .with_context(|| format!("reading the {} from {described}", component.dir()))?;
        parts.push((mapped, described));
    }
    let mut tokenizers = Vec::new();
    for (path, folder) in [(a.tokenizer, "tokenizer"), (a.tokenizer_2, "tokenizer_2")] {
        if let Some(path) = path {
            tokenizers.push(read_tokenizer(path, folder)?);
        }
    }
    let model = ComposedModel::compose(
        base.as_ref(),
        turbo_defaults(zimage::embedded::DEMO_FILES),
        parts,
        tokenizers,
    )?;
    for o in &model.origins {
        let layout = match o.layout {
            Layout::Diffusers => "diffusers layout",
            Layout::Original => "original layout",
        };
        let dropped = if o.dropped.is_empty() {
            String::new()
        } else {
            format!("; unused, left out: {}", o.dropped.join(", "))
        };
        println!(
            "{}: {} ({layout}, {} tensors{dropped})",
            o.component.dir(),
            o.source,
            o.tensors
        );
    }
    Ok(model)
}
