//! Store subcommands: create, list, show, rm, gc, verify, profile.
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// Model name, e.g. `z-image` or `me/z-image:tiny`.
    pub name: String,
    /// Source: a diffusers directory or a model file.
    #[arg(long)]
    pub from: PathBuf,
}
#[derive(clap::Args, Debug)]
pub struct ListArgs {}
#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    pub name: String,
}
#[derive(clap::Args, Debug)]
pub struct RmArgs {
    pub name: String,
}
#[derive(clap::Args, Debug)]
pub struct GcArgs {}
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    pub name: String,
}
#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    pub name: String,
}

fn todo() -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
pub fn create(_s: Option<PathBuf>, _a: CreateArgs) -> anyhow::Result<ExitCode> { todo() }
pub fn list(_s: Option<PathBuf>, _a: ListArgs) -> anyhow::Result<ExitCode> { todo() }
pub fn show(_s: Option<PathBuf>, _a: ShowArgs) -> anyhow::Result<ExitCode> { todo() }
pub fn rm(_s: Option<PathBuf>, _a: RmArgs) -> anyhow::Result<ExitCode> { todo() }
pub fn gc(_s: Option<PathBuf>, _a: GcArgs) -> anyhow::Result<ExitCode> { todo() }
pub fn verify(_s: Option<PathBuf>, _a: VerifyArgs) -> anyhow::Result<ExitCode> { todo() }
pub fn profile(_s: Option<PathBuf>, _a: ProfileArgs) -> anyhow::Result<ExitCode> { todo() }
