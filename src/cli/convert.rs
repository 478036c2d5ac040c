//! `zimage convert`. (being written)
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct ConvertArgs {
    pub input: PathBuf,
    pub output: PathBuf,
}

pub fn run(_a: ConvertArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`convert` is not built yet")
}
