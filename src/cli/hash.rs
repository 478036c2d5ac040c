//! `zimage hash`: the hashes other tools show for a model file (A1111, Civitai, kohya), the
//! identity of a stored model, or the structural hash of either.
use crate::cli::target::{self, Target};
use std::path::PathBuf;
use std::process::ExitCode;
use zimage::formats::structural::Artifact;
use zimage::formats::{dfsn, model_hash, FileKind};

#[derive(clap::Args, Debug)]
pub struct HashArgs {
    /// A model file, or a stored model's name.
    pub target: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// The structural hash (tensor names, dtypes, shapes and metadata), as weight-inspect
    /// computes it, instead of the file hashes.
    #[arg(long)]
    pub structural: bool,
    /// With a stored model and `--structural`: hash this component only (`transformer`, `vae` …).
    #[arg(long, value_name = "NAME", value_parser = super::component_arg)]
    pub component: Option<String>,
}

pub fn run(store: Option<PathBuf>, a: HashArgs) -> anyhow::Result<ExitCode> {
    if a.component.is_some() && !a.structural {
        anyhow::bail!("`--component` goes with `--structural`");
    }
    let target = target::resolve(store.as_deref(), &a.target)?;
    let mut rows: Vec<(&str, String)> = Vec::new();
    let mut json = serde_json::Map::new();
    match &target {
        Target::File { path, kind } => {
            json.insert("file".into(), path.display().to_string().into());
            if !a.structural {
                // A container's hashes are its model's: what a tool shows for the model file.
                let hashes = if *kind == FileKind::Dfsn {
                    let c = dfsn::Container::open(path)?;
                    let hashes = model_hash::hash_region(path, c.model_offset, c.model_len)?;
                    if hashes.sha256 != c.sha256_hex() {
                        anyhow::bail!(
                            "`{}`: the model bytes hash to {}, but the container says {} (see `zimage dfsn verify`)",
                            path.display(),
                            hashes.sha256,
                            c.sha256_hex()
                        );
                    }
                    rows.push(("Container", "DFSN (hashes of the model inside)".into()));
                    json.insert("container".into(), "dfsn".into());
                    hashes
                } else {
                    model_hash::hash_file(path)?
                };
                rows.extend(hashes.rows());
                if let serde_json::Value::Object(fields) = serde_json::to_value(&hashes)? {
                    json.extend(fields);
                }
            }
        }
        Target::Model { model, .. } => {
            let identity = model.manifest.model_identity();
            json.insert("model".into(), model.name.short().into());
            json.insert("model_identity".into(), identity.clone().into());
            json.insert(
                "manifest_digest".into(),
                model.manifest_digest.clone().into(),
            );
            rows.push(("Model", model.name.short()));
            rows.push(("Model identity", identity));
            rows.push(("Manifest digest", model.manifest_digest.clone()));
        }
    }
    if a.structural {
        let artifact = Artifact::from_listing(&target.listing(a.component.as_deref())?);
        let (hash, id) = (artifact.hash(), artifact.id());
        if let Some(c) = &a.component {
            json.insert("component".into(), c.clone().into());
            rows.push(("Component", c.clone()));
        }
        json.insert("structural_hash".into(), hash.clone().into());
        json.insert("structural_id".into(), id.clone().into());
        rows.push(("Structural hash", hash));
        rows.push(("Structural id", id));
    }

    if a.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        let width = rows
            .iter()
            .map(|(label, _)| label.chars().count())
            .max()
            .unwrap_or(0);
        for (label, value) in rows {
            println!("{label:<width$}  {value}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
