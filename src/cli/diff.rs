//! `zimage diff`. (being written)
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    pub a: String,
    pub b: String,
}

pub fn run(_store: Option<PathBuf>, _a: DiffArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`diff` is not built yet")
}
