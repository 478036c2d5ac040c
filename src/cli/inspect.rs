//! `zimage inspect`. (being written)
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A model file (safetensors, .zt, .dfsn, a store blob), a PNG, or a stored model's name.
    pub target: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_store: Option<PathBuf>, _a: InspectArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`inspect` is not built yet")
}
