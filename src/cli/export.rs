//! `zimage export NAME --format comfy|gguf DIR`: a stored model as files other tools load.
use std::path::PathBuf;
use std::process::ExitCode;
use zimage::layouts::export::export_comfy;
use zimage::layouts::export_gguf::export_gguf;
use zimage::store::Store;

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The stored model.
    pub name: String,
    /// The file layout to write.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// Where to write: ComfyUI's `models/` folder (files go to `diffusion_models/`,
    /// `text_encoders/` and `vae/` inside it; the GGUF transformer to `diffusion_models/`).
    pub dir: PathBuf,
    /// Leave out the config zimage writes into each file's metadata (so the files are as
    /// plain as those published elsewhere, and an import infers the config or takes it from
    /// `--from`).
    #[arg(long)]
    pub no_config: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// ComfyUI's files: the original-layout transformer, the text encoder (Qwen3, or CLIP's
    /// with T5's beside it as `NAME_2`) and the LDM-layout VAE (float models only).
    Comfy,
    /// The transformer as a GGUF file in the original layout, as stable-diffusion.cpp and
    /// ComfyUI-GGUF load it, each tensor in the ggml type nearest to how it is stored (a GGUF
    /// import's Q4_0, Q5_0 and Q8_0 blocks come back byte for byte; int4 → Q4_1, int8 → Q8_0).
    Gguf,
}

pub fn run(store: Option<PathBuf>, a: ExportArgs) -> anyhow::Result<ExitCode> {
    let store = Store::locate(store.as_deref())?;
    let model = store.open(&a.name)?;
    let stem = file_stem(&model.name.short());
    match a.format {
        ExportFormat::Comfy => {
            for f in export_comfy(&store, &model, &a.dir, &stem, !a.no_config)? {
                println!(
                    "{}: {} ({} tensors, {} bytes)",
                    f.component.dir(),
                    f.path.display(),
                    f.tensors,
                    f.bytes
                );
            }
        }
        ExportFormat::Gguf => {
            let e = export_gguf(&store, &model, &a.dir, &stem, !a.no_config)?;
            println!(
                "transformer: {} ({} tensors, {} bytes)",
                e.path.display(),
                e.tensors,
                e.bytes
            );
            for (path, n) in &e.paths {
                println!("  {n} tensors {path}");
            }
            if let Some((tensor, err)) = &e.max_error {
                println!("  largest change of a stored value: {err:.3e} (in `{tensor}`)");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A file name from a model name: `me/z-image:q8` → `z-image_q8`.
fn file_stem(short: &str) -> String {
    let last = short.rsplit('/').next().unwrap_or(short);
    last.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect::<String>()
        .trim_start_matches('.')
        .to_string()
}
