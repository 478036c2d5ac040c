//! `zimage serve`: the HTTP server for Ollama's, OpenAI's and AUTOMATIC1111's image APIs.
use anyhow::{anyhow, bail, Context};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use zimage::server::{self, worker, AppState};
use zimage::store::Store;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on, as Ollama reads OLLAMA_HOST: `HOST[:PORT]`, `:PORT`,
    /// `http://HOST[:PORT]` (default: ZIMAGE_HOST, else OLLAMA_HOST, else 127.0.0.1:11434).
    #[arg(long)]
    pub host: Option<String>,
    /// A key clients must send as `Authorization: Bearer KEY` (default: ZIMAGE_API_KEY);
    /// required when listening on an address other machines can reach.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// How long a model stays loaded after a request: seconds or a duration like 5m; negative
    /// keeps it until another model is asked for (default: ZIMAGE_KEEP_ALIVE, else 5m).
    #[arg(long, allow_hyphen_values = true)]
    pub keep_alive: Option<String>,
    /// Requests that may wait while one runs; more get 503 (default: ZIMAGE_MAX_QUEUE, else 64).
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Memory a generation may use, e.g. 12GB (default: ZIMAGE_MEMORY_LIMIT, else the GPU's
    /// recommended working set or free memory, else 85% of the machine's memory); a request
    /// estimated above it is refused with 400.
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
    /// Inputs of the linear layers' matrix products on the CPU, as `zimage generate --products`.
    #[arg(long, value_enum, default_value_t = super::generate::ProductsArg::F32)]
    pub products: super::generate::ProductsArg,
    /// A folder of LoRA files requests may apply by name (`"loras": [{"path": "style.safetensors",
    /// "scale": 0.8}]`); without it requests apply none (default: ZIMAGE_LORA_DIR).
    #[arg(long, value_name = "DIR")]
    pub lora_dir: Option<PathBuf>,
    /// The model requests that name none run on (A1111's clients, until one picks another);
    /// default: the image model used or created most recently.
    #[arg(long, value_name = "NAME")]
    pub default_model: Option<String>,
    /// The folder the web page (`/ui`) keeps its images in, each a PNG with its settings
    /// (default: ZIMAGE_GALLERY, else `gallery` in the store's folder).
    #[arg(long, value_name = "DIR")]
    pub gallery_dir: Option<PathBuf>,
    /// A model to pull into the store before the server reports ready on `/readyz`
    /// (repeatable): a registry's name, or `hf.co/OWNER/REPO[:REVISION]`, as `zimage pull`
    /// takes them. One that cannot be pulled stops the server (exit 2).
    #[arg(long = "pull", value_name = "NAME")]
    pub pulls: Vec<String>,
    /// Speak plain HTTP to the registry of the `--pull` models (one on this machine or your
    /// network), as `zimage pull --insecure`.
    #[arg(long)]
    pub insecure: bool,
    /// On SIGTERM or SIGINT, how long the server may take to finish the requests it holds
    /// (it takes no new one meanwhile); past it they are stopped and it exits with 1.
    #[arg(long, value_name = "SECS", default_value_t = server::drain::DEFAULT_TIMEOUT.as_secs())]
    pub drain_timeout: u64,
}

/// A setting from its flag, else from the first of `vars` that is set.
fn setting(flag: Option<String>, vars: &[&str]) -> Option<(String, String)> {
    flag.map(|v| (v, "--".to_string())).or_else(|| {
        vars.iter().find_map(|var| {
            std::env::var(var)
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| (v, (*var).to_string()))
        })
    })
}

pub fn run(store: Option<PathBuf>, a: ServeArgs) -> anyhow::Result<ExitCode> {
    let store = Store::locate(store.as_deref())?;
    a.products.apply();
    for name in &a.pulls {
        check_pull_name(name)?;
    }
    let (host_text, host_from) = setting(a.host, &["ZIMAGE_HOST", "OLLAMA_HOST"])
        .unwrap_or_else(|| (String::new(), "the default".into()));
    let host_from = if host_from == "--" {
        "--host".to_string()
    } else {
        host_from
    };
    let (host, port) = server::parse_host(&host_text).map_err(|e| anyhow!("{host_from}: {e}"))?;
    let addrs = server::resolve(&host, port).map_err(|e| anyhow!("{host_from}: {e}"))?;
    let api_key = a
        .api_key
        .or_else(|| std::env::var("ZIMAGE_API_KEY").ok())
        .filter(|k| !k.is_empty());
    if api_key.is_none() && addrs.iter().any(|a| !a.ip().is_loopback()) {
        bail!(
            "{host_from} `{host_text}` listens where other machines can reach the server; give --api-key KEY (or ZIMAGE_API_KEY) so that only clients with the key can use it, or listen on 127.0.0.1"
        );
    }
    let keep_alive = match setting(a.keep_alive, &["ZIMAGE_KEEP_ALIVE"]) {
        Some((text, from)) => {
            let from = if from == "--" {
                "--keep-alive".into()
            } else {
                from
            };
            let value = match text.trim().parse::<f64>() {
                Ok(n) => serde_json::json!(n),
                Err(_) => serde_json::json!(text),
            };
            server::parse_keep_alive(&value).map_err(|e| anyhow!("{from}: {e}"))?
        }
        None => worker::KeepAlive::For(server::DEFAULT_KEEP_ALIVE),
    };
    let max_queue = match a.max_queue {
        Some(n) => n,
        None => match std::env::var("ZIMAGE_MAX_QUEUE") {
            Ok(v) if !v.is_empty() => v.trim().parse::<usize>().map_err(|_| {
                anyhow!(
                    "ZIMAGE_MAX_QUEUE is `{}`; give a number of requests, e.g. 64",
                    v.escape_debug()
                )
            })?,
            _ => server::DEFAULT_MAX_QUEUE,
        },
    };
    if let Some(limit) = &a.memory_limit {
        zimage::memory_plan::parse_size(limit).map_err(|e| anyhow!("--memory-limit: {e}"))?;
    }
    let (budget, _) =
        zimage::memory_plan::budget(a.memory_limit.as_deref()).map_err(|e| anyhow!(e))?;
    let lora_dir = match setting(
        a.lora_dir.map(|p| p.to_string_lossy().into_owned()),
        &["ZIMAGE_LORA_DIR"],
    ) {
        Some((dir, from)) => {
            let from = if from == "--" {
                "--lora-dir".into()
            } else {
                from
            };
            let canonical = std::fs::canonicalize(&dir)
                .ok()
                .filter(|d| d.is_dir())
                .ok_or_else(|| anyhow!("{from} `{dir}` is not a folder; give the folder that holds the LoRA files requests may name"))?;
            Some(canonical)
        }
        None => None,
    };
    let default_model = match &a.default_model {
        Some(name) => {
            let parsed = zimage::store::ModelName::parse(name)
                .map_err(|e| anyhow!("--default-model `{}`: {e}", name.escape_debug()))?;
            let model = store
                .open(&parsed.to_string())
                .map_err(|e| anyhow!("--default-model: {}", zimage::generation::open_error(e)))?;
            zimage::generation::check_image_model(&store, &model)
                .map_err(|e| anyhow!("--default-model: {e}"))?;
            Some(parsed)
        }
        None => None,
    };
    let gallery = a
        .gallery_dir
        .or_else(|| {
            std::env::var_os("ZIMAGE_GALLERY")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| store.root.join("gallery"));
    // The folder is made when the first image is kept; whatever of its path exists must be
    // folders for that to work.
    if let Some(file) = gallery
        .ancestors()
        .find(|p| p.exists())
        .filter(|p| !p.is_dir())
    {
        bail!(
            "the gallery folder `{}` cannot be made: `{}` is a file; give another with --gallery-dir DIR (or ZIMAGE_GALLERY)",
            gallery.display(),
            file.display()
        );
    }
    let listener = std::net::TcpListener::bind(&addrs[..]).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            anyhow!(
                "{host}:{port} is in use (by a running Ollama, or another server); stop it, or listen elsewhere with --host HOST:PORT (or ZIMAGE_HOST)"
            )
        } else {
            anyhow!("cannot listen on {host}:{port}: {e}; choose another address with --host HOST:PORT")
        }
    })?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let worker = worker::Worker::start(worker::Settings {
        store: store.clone(),
        keep_alive,
        max_queue,
        memory_limit: a.memory_limit,
        dtype: None,
    })
    .context("starting the generation thread")?;
    let state = Arc::new(AppState {
        store,
        worker,
        api_key,
        lora_dir,
        hosted: Default::default(),
        inputs: zimage::input_budget::Pool::for_budget(budget),
        default_model: std::sync::Mutex::new(default_model),
        gallery: server::ui::gallery::Gallery::new(gallery),
        page_jobs: Default::default(),
        readiness: Default::default(),
    });
    if let Some(reason) = server::probes::store_unreadable(&state.store.root) {
        state.readiness.log_change(Some(&reason));
    }
    state.readiness.pulls_to_come(a.pulls.len());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let drain_timeout = std::time::Duration::from_secs(a.drain_timeout);
    let (pulls, insecure) = (a.pulls, a.insecure);
    let clean = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        // The server drains on these signals instead of dying of them.
        let signals = server::drain::Signals::register()?;
        zimage::files::handle_termination_elsewhere();
        eprintln!("zimage serve listening on http://{local} (the page: http://{local}/ui)");
        start_pulls(&state, pulls, insecure)?;
        let clean = server::drain::serve(listener, state, signals, drain_timeout).await?;
        Ok::<_, anyhow::Error>(clean)
    })?;
    // Blocking work left (a readiness check) is not waited for: the requests are answered.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    // A --pull or /api/pull cut short by the end leaves no temporary file behind.
    let _ = zimage::files::remove_temporaries();
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A `--pull` name, checked before anything starts.
fn check_pull_name(name: &str) -> anyhow::Result<()> {
    match zimage::hub::HubRepo::parse(name) {
        Some(repo) => repo
            .map(drop)
            .map_err(|e| anyhow!("--pull `{}`: {e}", name.escape_debug())),
        None => zimage::store::ModelName::parse(name)
            .map(drop)
            .map_err(|e| anyhow!("--pull `{}`: {e}", name.escape_debug())),
    }
}

/// Pulls the `--pull` models one after the other on a thread of their own, while the server
/// answers its probes; the server is ready once all are in. A pull that fails ends the
/// process with one line and exit 2, as `zimage pull` would: a replica without its model
/// must not wait for traffic.
fn start_pulls(state: &Arc<AppState>, names: Vec<String>, insecure: bool) -> anyhow::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let state = state.clone();
    std::thread::Builder::new()
        .name("zimage-pull".into())
        .spawn(move || {
            for name in names {
                eprintln!("pulling {name} (--pull)");
                let args = super::registry::PullArgs {
                    name: name.clone(),
                    quantize: None,
                    remote: super::registry::RemoteArgs {
                        insecure,
                        user: None,
                        credentials: None,
                        parallel: 6,
                        stall_timeout: 30,
                    },
                };
                if let Err(e) = super::registry::pull(Some(state.store.root.clone()), args) {
                    eprintln!(
                        "error: --pull: {}",
                        zimage::shown::escape_controls(&format!("{e:#}"))
                    );
                    std::process::exit(2);
                }
                state.readiness.pulled_one();
            }
            eprintln!("--pull: every model is in the store");
        })
        .context("starting the thread that pulls the --pull models")?;
    Ok(())
}
