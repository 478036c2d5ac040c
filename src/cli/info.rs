//! `zimage info`.
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct InfoArgs {}

pub fn run(_a: InfoArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`info` is not built yet")
}
