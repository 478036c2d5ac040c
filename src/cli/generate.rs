//! `zimage generate`.
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// The prompt.
    pub prompt: String,
}

pub fn run(_store: Option<PathBuf>, _a: GenerateArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`generate` is not built yet")
}
