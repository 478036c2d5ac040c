//! Registry subcommands: pull, push.
use super::progress::Bar;
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use zimage::hub::{FetchOptions, HubEnv, HubRepo};
use zimage::registry::{self, Client, ClientOptions, Credentials};
use zimage::store::{ImportOptions, ModelName, Store};

/// How to reach and log in to a registry, as pull and push take it.
#[derive(clap::Args, Debug)]
pub struct RemoteArgs {
    /// Speak plain HTTP (a registry on this machine or your network); HTTPS otherwise.
    #[arg(long)]
    pub insecure: bool,
    /// Log in as USER:PASSWORD (HTTP basic, or for a token when the registry asks for one).
    #[arg(long, value_name = "USER:PASSWORD")]
    pub user: Option<String>,
    /// Read the login from FILE: lines of `HOST USER:PASSWORD`.
    #[arg(long, value_name = "FILE", conflicts_with = "user")]
    pub credentials: Option<PathBuf>,
    /// Blobs moved at once.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub parallel: u16,
    /// Give up on a response that sends nothing for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub stall_timeout: u64,
}

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// Model name: `z-image`, `x/z-image-turbo:latest`, `localhost:5000/me/tiny:v1`, or a
    /// diffusers repository on Hugging Face: `hf.co/OWNER/REPO[:REVISION]`.
    pub name: String,
    /// For `hf.co/…`: quantize linear weights as the import stores them.
    #[arg(long, value_enum)]
    pub quantize: Option<super::store::QuantizeArg>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(clap::Args, Debug)]
pub struct PushArgs {
    /// A stored model.
    pub name: String,
    /// Where to: `HOST/NAMESPACE/MODEL:TAG` (default: the model's own name).
    #[arg(long, value_name = "HOST/NS/MODEL:TAG")]
    pub to: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

fn client(host: &str, a: &RemoteArgs) -> anyhow::Result<Client> {
    let credentials = match (&a.user, &a.credentials) {
        (Some(u), _) => Some(Credentials::parse(u, "--user")?),
        (None, Some(file)) => Credentials::from_file(file, host)?,
        (None, None) => None,
    };
    Ok(Client::new(
        host,
        ClientOptions {
            insecure: a.insecure,
            credentials,
            stall_timeout: Duration::from_secs(a.stall_timeout),
        },
    )?)
}

pub fn pull(s: Option<PathBuf>, a: PullArgs) -> anyhow::Result<ExitCode> {
    let store = Store::locate(s.as_deref())?;
    if let Some(repo) = HubRepo::parse(&a.name) {
        let import = ImportOptions {
            quantize: a.quantize.map(Into::into),
            ..ImportOptions::default()
        };
        return hub_pull(&store, &repo?, &a.remote, &import);
    }
    anyhow::ensure!(
        a.quantize.is_none(),
        "--quantize applies to `hf.co/…` pulls; a registry's model comes as it was pushed"
    );
    let name = ModelName::parse(&a.name)?;
    let client = client(&name.host, &a.remote)?;
    let bar = Bar::new("pulling");
    let summary = registry::pull(&store, &a.name, &client, a.remote.parallel.into(), &bar);
    bar.bar.finish_and_clear();
    let summary = summary.with_context(|| format!("pulling `{}`", name.short()))?;
    println!(
        "pulled {}: {} blobs downloaded ({}{}), {} already present ({})",
        name.short(),
        summary.blobs_downloaded,
        super::store::human(summary.bytes_downloaded),
        if summary.bytes_resumed > 0 {
            format!(
                ", {} of it resumed",
                super::store::human(summary.bytes_resumed)
            )
        } else {
            String::new()
        },
        summary.blobs_present,
        super::store::human(summary.bytes_present)
    );
    Ok(ExitCode::SUCCESS)
}

/// The files of a diffusers repository on a Hugging Face Hub, through its cache, into the
/// store; `--insecure` and the login options are the Hub's own (HF_ENDPOINT, HF_TOKEN).
pub fn fetch_options(a: &RemoteArgs) -> FetchOptions {
    FetchOptions {
        parallel: a.parallel.into(),
        stall_timeout: Duration::from_secs(a.stall_timeout),
    }
}

fn hub_pull(
    store: &Store,
    repo: &HubRepo,
    remote: &RemoteArgs,
    import: &ImportOptions,
) -> anyhow::Result<ExitCode> {
    let env = HubEnv::from_env();
    let bar = Bar::files("pulling");
    let summary = zimage::hub::pull(
        store,
        repo,
        None,
        &env,
        &fetch_options(remote),
        import,
        &bar,
    );
    bar.bar.finish_and_clear();
    let s = summary.with_context(|| format!("pulling `{}`", repo.store_name))?;
    println!(
        "pulled {} ({} at {}): {} files downloaded ({}{}), {} already in the Hugging Face cache ({}); {} tensors, {} blobs written ({})",
        s.name,
        repo.id(),
        &s.fetch.commit[..12.min(s.fetch.commit.len())],
        s.fetch.files_downloaded,
        super::store::human(s.fetch.bytes_downloaded),
        if s.fetch.bytes_resumed > 0 {
            format!(", {} resumed", super::store::human(s.fetch.bytes_resumed))
        } else {
            String::new()
        },
        s.fetch.files_cached,
        super::store::human(s.fetch.bytes_cached),
        s.import.tensors,
        s.import.blobs_written,
        super::store::human(s.import.bytes_written),
    );
    Ok(ExitCode::SUCCESS)
}

pub fn push(s: Option<PathBuf>, a: PushArgs) -> anyhow::Result<ExitCode> {
    let store = Store::locate(s.as_deref())?;
    let local = ModelName::parse(&a.name)?;
    let dest = match &a.to {
        Some(to) => ModelName::parse(to).context("--to")?,
        None => local.clone(),
    };
    let client = client(&dest.host, &a.remote)?;
    let bar = Bar::new("pushing");
    let summary = registry::push(
        &store,
        &a.name,
        &dest,
        &client,
        a.remote.parallel.into(),
        &bar,
    );
    bar.bar.finish_and_clear();
    let summary = summary.with_context(|| format!("pushing `{}` to `{}`", local.short(), dest))?;
    println!(
        "pushed {} to {}: {} blobs uploaded ({}), {} already there ({})",
        local.short(),
        dest,
        summary.blobs_uploaded,
        super::store::human(summary.bytes_uploaded),
        summary.blobs_present,
        super::store::human(summary.bytes_present)
    );
    Ok(ExitCode::SUCCESS)
}
