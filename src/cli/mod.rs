//! The command line: one file per group of subcommands, each turning its arguments into calls
//! on the library. Only this module prints.
//!
//! Exit codes: 0 success, 1 a check that ran and failed (`verify`, `diff --fail-on-diff`, …),
//! 2 an error (bad input, missing model, I/O).

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

mod components;
mod convert;
mod demo;
mod dfsn;
mod diff;
mod export;
mod generate;
mod hash;
mod info;
mod inspect;
mod progress;
mod registry;
mod serve;
mod store;
mod target;

/// `--component` as every command takes it: one rule, checked by clap before any work.
pub fn component_arg(name: &str) -> Result<String, String> {
    zimage::component::validate_component(name).map(|()| name.to_string())
}

/// A check ran and failed (`verify`, `diff --fail-on-diff`).
pub fn exit_check_failed() -> ExitCode {
    ExitCode::from(1)
}
/// Bad input, a missing model, an I/O or MLX failure.
pub fn exit_error() -> ExitCode {
    ExitCode::from(2)
}

/// Run diffusion image models on MLX, stored the way Ollama stores them.
#[derive(Parser, Debug)]
#[command(name = "zimage", version, about)]
pub struct Cli {
    /// Model store root (default: $ZIMAGE_MODELS, else $OLLAMA_MODELS, else ~/.ollama/models).
    #[arg(long, global = true, value_name = "DIR")]
    pub store: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// MLX version, devices, BLAS in use and a quick matmul throughput figure.
    Info(info::InfoArgs),
    /// Generate an image from a prompt.
    Generate(generate::GenerateArgs),
    /// Import a diffusers directory (or a .safetensors, .zt or .dfsn file) into the store.
    Create(store::CreateArgs),
    /// List stored models.
    List(store::ListArgs),
    /// Show a stored model: components, tensors, dtypes, sizes, shared blobs.
    Show(store::ShowArgs),
    /// Remove a stored model (its blobs stay until `gc`).
    Rm(store::RmArgs),
    /// Delete blobs that no manifest references.
    Gc(store::GcArgs),
    /// Re-hash every blob of a model and check every header against its layer.
    Verify(store::VerifyArgs),
    /// Find damaged manifests, models with missing blobs and leftover temporary files, and
    /// remove what you confirm.
    Doctor(store::DoctorArgs),
    /// Time loading a stored model, per component, against a plain sequential read.
    Profile(store::ProfileArgs),
    /// Describe a model file, blob, stored model or generated PNG.
    Inspect(inspect::InspectArgs),
    /// Model hashes (A1111, AutoV2, AutoV3, BLAKE3, CRC32) or the structural hash.
    Hash(hash::HashArgs),
    /// Structural diff of two model files or stored models.
    Diff(diff::DiffArgs),
    /// Convert between safetensors and zTensor.
    Convert(convert::ConvertArgs),
    /// Pack, edit, verify and unpack DFSN containers.
    Dfsn(dfsn::DfsnArgs),
    /// Write a stored model as files other tools load (ComfyUI's three files).
    Export(export::ExportArgs),
    /// Serve Ollama's, OpenAI's and AUTOMATIC1111's image APIs over HTTP (default 127.0.0.1:11434).
    Serve(serve::ServeArgs),
    /// Download a model from a registry (Ollama's by default), skipping blobs the store holds.
    Pull(registry::PullArgs),
    /// Upload a stored model to a registry.
    Push(registry::PushArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let store = cli.store;
    match cli.command {
        Command::Info(a) => info::run(a),
        Command::Generate(a) => generate::run(store, a),
        Command::Create(a) => store::create(store, a),
        Command::List(a) => store::list(store, a),
        Command::Show(a) => store::show(store, a),
        Command::Rm(a) => store::rm(store, a),
        Command::Gc(a) => store::gc(store, a),
        Command::Verify(a) => store::verify(store, a),
        Command::Doctor(a) => store::doctor(store, a),
        Command::Profile(a) => store::profile(store, a),
        Command::Inspect(a) => inspect::run(store, a),
        Command::Hash(a) => hash::run(store, a),
        Command::Diff(a) => diff::run(store, a),
        Command::Convert(a) => convert::run(a),
        Command::Dfsn(a) => dfsn::run(store, a),
        Command::Export(a) => export::run(store, a),
        Command::Serve(a) => serve::run(store, a),
        Command::Pull(a) => registry::pull(store, a),
        Command::Push(a) => registry::push(store, a),
    }
}
