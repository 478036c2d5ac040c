//! `zimage dfsn`: pack a model into a DFSN container, read or edit its metadata, check its
//! hash, and get the model back out.
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zimage::formats::dfsn;

#[derive(clap::Args, Debug)]
pub struct DfsnArgs {
    #[command(subcommand)]
    pub command: DfsnCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum DfsnCommand {
    /// Pack a safetensors or ckpt model and JSON metadata into a new container.
    Pack {
        /// The model file (safetensors or ckpt).
        model: PathBuf,
        /// A JSON object to store as the metadata (default: `{}`).
        #[arg(long, value_name = "FILE")]
        meta: Option<PathBuf>,
        /// The container to write.
        #[arg(short, long, value_name = "OUT")]
        output: PathBuf,
    },
    /// Print a container's metadata, or change it in place (the model bytes and their hash
    /// stay as they are).
    Meta {
        /// The container.
        file: PathBuf,
        /// Set a key to a string value, keeping the other keys (repeatable).
        #[arg(long, value_name = "KEY=VALUE", conflicts_with = "from_file")]
        set: Vec<String>,
        /// Replace the metadata with this JSON object.
        #[arg(long = "file", value_name = "FILE")]
        from_file: Option<PathBuf>,
    },
    /// Re-hash the model bytes and compare them with the stored sha256 (exit 1 on a mismatch).
    Verify {
        /// The container.
        file: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the model inside a container to a file, after checking its hash.
    Unpack {
        /// The container.
        file: PathBuf,
        /// The model file to write.
        #[arg(short, long, value_name = "MODEL")]
        output: PathBuf,
    },
}

pub fn run(_store: Option<PathBuf>, a: DfsnArgs) -> anyhow::Result<ExitCode> {
    match a.command {
        DfsnCommand::Pack {
            model,
            meta,
            output,
        } => {
            let metadata = match &meta {
                Some(path) => read_json_object(path)?,
                None => serde_json::json!({}),
            };
            let c = dfsn::pack(&model, &metadata, &output)?;
            println!(
                "packed `{}` ({}, {} bytes, sha256 {}) into `{}`",
                model.display(),
                c.model_type.name(),
                c.model_len,
                c.sha256_hex(),
                output.display()
            );
        }
        DfsnCommand::Meta {
            file,
            set,
            from_file,
        } => {
            let container = dfsn::Container::open(&file)?;
            let metadata = if let Some(path) = &from_file {
                read_json_object(path)?
            } else if !set.is_empty() {
                let mut metadata = container.metadata.clone();
                let object = metadata
                    .as_object_mut()
                    .expect("container metadata is an object");
                for pair in &set {
                    let (key, value) = pair
                        .split_once('=')
                        .with_context(|| format!("`--set {pair}`: expected KEY=VALUE"))?;
                    object.insert(key.to_string(), value.into());
                }
                metadata
            } else {
                println!("{}", serde_json::to_string_pretty(&container.metadata)?);
                return Ok(ExitCode::SUCCESS);
            };
            let c = dfsn::set_metadata(&file, &metadata)?;
            println!("{}", serde_json::to_string_pretty(&c.metadata)?);
        }
        DfsnCommand::Verify { file, json } => {
            let v = dfsn::verify(&file)?;
            if json {
                let mut out = serde_json::to_value(&v)?;
                out["ok"] = v.ok().into();
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else if v.ok() {
                println!(
                    "ok: `{}` model bytes ({} bytes) match sha256 {}",
                    file.display(),
                    v.model_len,
                    v.stored_sha256
                );
            } else {
                println!(
                    "mismatch: `{}` model bytes ({} bytes) hash to {}, but the header says {}",
                    file.display(),
                    v.model_len,
                    v.actual_sha256,
                    v.stored_sha256
                );
            }
            if !v.ok() {
                return Ok(crate::cli::exit_check_failed());
            }
        }
        DfsnCommand::Unpack { file, output } => {
            let c = dfsn::unpack(&file, &output)?;
            println!(
                "wrote `{}` ({}, {} bytes, sha256 {})",
                output.display(),
                c.model_type.name(),
                c.model_len,
                c.sha256_hex()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A JSON object read from a file, for metadata.
fn read_json_object(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("`{}`", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("`{}` is not JSON", path.display()))?;
    if !value.is_object() {
        anyhow::bail!("`{}`: metadata must be a JSON object", path.display());
    }
    Ok(value)
}
