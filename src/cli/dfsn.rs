//! `zimage dfsn`. (being written)
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DfsnArgs {}

pub fn run(_store: Option<PathBuf>, _a: DfsnArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`dfsn` is not built yet")
}
