//! Format subcommands: inspect, hash, diff, convert, dfsn.
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    pub target: String,
}
#[derive(clap::Args, Debug)]
pub struct HashArgs {
    pub target: String,
}
#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    pub a: String,
    pub b: String,
}
#[derive(clap::Args, Debug)]
pub struct ConvertArgs {
    pub input: PathBuf,
    pub output: PathBuf,
}
#[derive(clap::Args, Debug)]
pub struct DfsnArgs {}

fn todo() -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
pub fn inspect(_s: Option<PathBuf>, _a: InspectArgs) -> anyhow::Result<ExitCode> { todo() }
pub fn hash(_s: Option<PathBuf>, _a: HashArgs) -> anyhow::Result<ExitCode> { todo() }
pub fn diff(_s: Option<PathBuf>, _a: DiffArgs) -> anyhow::Result<ExitCode> { todo() }
pub fn convert(_a: ConvertArgs) -> anyhow::Result<ExitCode> { todo() }
pub fn dfsn(_s: Option<PathBuf>, _a: DfsnArgs) -> anyhow::Result<ExitCode> { todo() }
