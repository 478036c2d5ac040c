//! `zimage hash`. (being written)
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct HashArgs {
    pub target: String,
}

pub fn run(_store: Option<PathBuf>, _a: HashArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`hash` is not built yet")
}
