//! Models straight from a Hugging Face Hub: `hf.co/OWNER/REPO[:REVISION]`.
//!
//! - [`mod@env`]: the endpoint, cache folder and token, as huggingface_hub reads them;
//! - [`api`]: a revision's file list, and the files of a diffusers pipeline in it;
//! - [`cache`]: Hugging Face's cache layout, shared with the `hf` tool and diffusers;
//! - [`http`]: requests with the token sent to the Hub's origin only;
//! - [`download`]: one file into the cache, resumed, verified against the Hub's sha256.
//!
//! A pull lists the revision, takes the pipeline's files the cache lacks into the cache, then
//! imports the snapshot folder into the store as `create --from DIR` would. Files land in the
//! cache rather than a temporary folder so that a later pull (of any revision that shares
//! them), `hf`, and diffusers reuse them, and an interrupted download resumes.

pub mod api;
pub mod cache;
pub mod download;
pub mod env;
pub mod http;

pub use api::{HubFile, HubRepo, Listing};
pub use env::HubEnv;

use crate::registry::printable;
use crate::store::{ImportOptions, ImportSummary, Store};
use cache::RepoCache;
use http::Hub;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The largest file list read (a repository of thousands of files lists in a few MB).
const LISTING_LIMIT: u64 = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(transparent)]
    Name(#[from] crate::store::name::NameError),
    #[error("HF_ENDPOINT `{endpoint}` is no URL: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("cannot reach {url}: {reason}")]
    Network { url: String, reason: String },
    #[error("{url}: {reason}")]
    Protocol { url: String, reason: String },
    #[error(
        "`{repo}` is private, gated or not there (the Hub answered 401 to a request without a \
         token): check the name, or set HF_TOKEN (or run `hf auth login`) and accept the \
         model's terms at {page}"
    )]
    NeedsLogin { repo: String, page: String },
    #[error(
        "the Hub refused the token for `{repo}` (401): check the name, and the token in \
         HF_TOKEN or from `hf auth login`"
    )]
    BadToken { repo: String },
    #[error(
        "the Hub denies access to `{repo}` (403{detail}): accept the model's terms at {page} \
         with the account of the token, and give a fine-grained token read access to gated \
         repositories"
    )]
    Forbidden {
        repo: String,
        page: String,
        detail: String,
    },
    #[error(
        "`{repo}` at revision `{revision}` is not on {endpoint} (404): check the name and revision"
    )]
    NotFound {
        repo: String,
        revision: String,
        endpoint: String,
    },
    #[error("{url}: the Hub answered {status}{detail}")]
    Status {
        url: String,
        status: u16,
        detail: String,
    },
    #[error(
        "`{path}` downloads as {size} bytes hashing to {hash} {actual}, but the Hub states \
         {expected_size} bytes with {hash} {expected}; refused, nothing was stored (run the \
         pull again; if it repeats, the file on the Hub is damaged)"
    )]
    Mismatch {
        path: String,
        size: u64,
        /// What was hashed: `sha256` (an LFS file) or `git blob id`.
        hash: &'static str,
        actual: String,
        expected_size: u64,
        expected: String,
    },
    #[error(
        "`{repo}` at `{revision}` has no model_index.json (nor modular_model_index.json): \
         zimage pulls diffusers pipelines (import single files with `zimage create NAME --from \
         FILE`)"
    )]
    NotAPipeline { repo: String, revision: String },
    #[error("`{path}` of `{repo}` cannot be read: {reason}")]
    BadIndex {
        repo: String,
        path: String,
        reason: String,
    },
    #[error("{url}: the Hub's file list is not what it should be: {reason}")]
    BadListing { url: String, reason: String },
    #[error(
        "`{path}` is listed at {size} bytes, more than the {limit} bytes zimage reads of a \
         {what}; refused before downloading it (the repository `{repo}` is damaged, or not a \
         pipeline zimage reads)"
    )]
    TooLarge {
        repo: String,
        path: String,
        size: u64,
        limit: u64,
        what: &'static str,
    },
    #[error(
        "`{}` in the Hugging Face cache is {kind} where zimage keeps {expected}; zimage \
         writes nothing outside the cache nor into a file of another kind: move it away and \
         pull again",
        crate::shown::path(path)
    )]
    Foreign {
        path: PathBuf,
        kind: &'static str,
        expected: &'static str,
    },
    #[error("stopped before every download finished")]
    Stopped,
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error(transparent)]
    Model(#[from] crate::diffusers_dir::Error),
    #[error(transparent)]
    DoesNotFit(#[from] crate::import_check::DoesNotFit),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

impl HubError {
    /// A failure a retry may cure: the connection, a stall, a server error.
    pub fn is_transient(&self) -> bool {
        match self {
            HubError::Network { .. } => true,
            HubError::Status { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

/// What a pull reports while it runs (a progress bar, or the lines of `/api/pull`).
pub trait PullProgress: Sync {
    /// A step: `listing files`, `importing`.
    fn status(&self, status: &str);
    /// More files to download (the cache lacks them), and their sizes.
    fn downloads(&self, files: &[&HubFile]);
    /// Bytes of `file` that arrived (or that an earlier run had) since the last call.
    fn advance(&self, file: &HubFile, bytes: u64);
    fn file_done(&self, file: &HubFile);
    /// The import into the store: source bytes done of `total`.
    fn importing(&self, done: u64, total: u64);
    /// Whether the pull is to stop (its client left): downloads end at their next read,
    /// leaving what they have for a later pull to continue, and nothing is imported.
    fn stopped(&self) -> bool {
        false
    }
}

/// Nothing shown.
pub struct Quiet;

impl PullProgress for Quiet {
    fn status(&self, _: &str) {}
    fn downloads(&self, _: &[&HubFile]) {}
    fn advance(&self, _: &HubFile, _: u64) {}
    fn file_done(&self, _: &HubFile) {}
    fn importing(&self, _: u64, _: u64) {}
}

#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Files downloaded at once.
    pub parallel: usize,
    /// A response that sends nothing for this long is given up (and retried).
    pub stall_timeout: Duration,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            parallel: 8,
            stall_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FetchSummary {
    pub commit: String,
    /// The snapshot folder the pipeline's files are in.
    pub snapshot: PathBuf,
    pub files: usize,
    pub files_cached: usize,
    pub bytes_cached: u64,
    pub files_downloaded: usize,
    pub bytes_downloaded: u64,
    /// Bytes an earlier, interrupted run had already downloaded.
    pub bytes_resumed: u64,
}

/// Brings the pipeline files of `repo` into the Hugging Face cache: those it holds are reused,
/// the rest downloaded and verified. Nothing touches the store.
pub fn fetch(
    repo: &HubRepo,
    env: &HubEnv,
    opts: &FetchOptions,
    progress: &dyn PullProgress,
) -> Result<FetchSummary, HubError> {
    let hub = Hub::new(&env.endpoint, env.token.clone(), opts.stall_timeout)?;
    progress.status("listing files");
    let listing = list(&hub, repo)?;
    let cache = RepoCache::new(&env.cache, &repo.owner, &repo.repo);
    cache.write_ref(&repo.revision, &listing.commit)?;
    let mut summary = FetchSummary {
        commit: listing.commit.clone(),
        snapshot: cache.snapshot(&listing.commit),
        ..FetchSummary::default()
    };
    // A modular pipeline keeps its index in another file; the snapshot keeps it as it is, and
    // the import reads it as a directory's.
    let index = (listing.file("model_index.json"))
        .or_else(|| listing.file(crate::diffusers_dir::MODULAR_INDEX))
        .ok_or_else(|| HubError::NotAPipeline {
            repo: repo.id(),
            revision: repo.revision.clone(),
        })?;
    let get = Fetcher {
        hub: &hub,
        repo,
        commit: &listing.commit,
        cache: &cache,
        progress,
        parallel: opts.parallel,
        resumed: AtomicU64::new(0),
    };
    // The index says which components there are, so it comes first.
    check_size(&cache, repo, index)?;
    get.ensure(&[index], &mut summary)?;
    let bytes = crate::files::read_bounded(
        &cache.blob(&index.etag),
        crate::diffusers_dir::CONFIG_LIMIT,
        "config file",
    )?;
    let bad_index = |reason: String| HubError::BadIndex {
        repo: repo.id(),
        path: index.path.clone(),
        reason,
    };
    let bytes = match index.path == crate::diffusers_dir::MODULAR_INDEX {
        true => crate::diffusers_dir::classic_index(&bytes).map_err(bad_index)?,
        false => bytes,
    };
    let components = api::components(&bytes).map_err(bad_index)?;
    let rest: Vec<&HubFile> = api::pipeline_files(&listing, &components)
        .into_iter()
        .filter(|f| f.path != index.path)
        .collect();
    for f in &rest {
        check_size(&cache, repo, f)?;
    }
    get.ensure(&rest, &mut summary)?;
    Ok(summary)
}

/// A file zimage reads whole (a config, a tokenizer file, a shard index) is refused before a
/// byte of it downloads when the list states it larger than zimage would read; the download
/// itself stops at the size the list states. Weights are read in parts, and bounded by the
/// size stated alone. What an earlier run left of a refused file is removed.
fn check_size(cache: &RepoCache, repo: &HubRepo, f: &HubFile) -> Result<(), HubError> {
    if f.path.ends_with(".safetensors") {
        return Ok(());
    }
    let (limit, what) = crate::diffusers_dir::config_limit(&f.path);
    if f.size <= limit {
        return Ok(());
    }
    cache.discard_incomplete(&f.etag)?;
    Err(HubError::TooLarge {
        repo: repo.id(),
        path: printable(&f.path, 200),
        size: f.size,
        limit,
        what,
    })
}

/// The revision's commit and files, from the Hub's API.
fn list(hub: &Hub, repo: &HubRepo) -> Result<Listing, HubError> {
    let url = hub.url(&format!(
        "api/models/{}/revision/{}?blobs=true",
        repo.id(),
        repo.revision
    ));
    let response = hub.get(&url, &|r| r)?;
    let response = check_status(hub, repo, &url, response)?;
    let mut body = Vec::new();
    use std::io::Read;
    response
        .take(LISTING_LIMIT + 1)
        .read_to_end(&mut body)
        .map_err(|e| hub.read_error(&url, &e))?;
    let bad = |reason: String| HubError::BadListing {
        url: url.clone(),
        reason,
    };
    if body.len() as u64 > LISTING_LIMIT {
        return Err(bad(format!("more than {LISTING_LIMIT} bytes")));
    }
    Listing::parse(&body).map_err(bad)
}

/// The response when it is a success; otherwise the one-line error its status means.
pub(crate) fn check_status(
    hub: &Hub,
    repo: &HubRepo,
    url: &str,
    response: reqwest::blocking::Response,
) -> Result<reqwest::blocking::Response, HubError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let message = response
        .headers()
        .get("x-error-message")
        .and_then(|m| m.to_str().ok())
        .map(|m| format!(": {}", printable(m, 200)))
        .unwrap_or_default();
    Err(match status.as_u16() {
        401 if hub.has_token() => HubError::BadToken { repo: repo.id() },
        401 => HubError::NeedsLogin {
            repo: repo.id(),
            page: hub.page(&repo.id()),
        },
        403 => HubError::Forbidden {
            repo: repo.id(),
            page: hub.page(&repo.id()),
            detail: message,
        },
        404 => HubError::NotFound {
            repo: repo.id(),
            revision: repo.revision.clone(),
            endpoint: hub.url(""),
        },
        s => HubError::Status {
            url: url.to_string(),
            status: s,
            detail: message,
        },
    })
}

/// Files into the cache for one pull.
struct Fetcher<'a> {
    hub: &'a Hub,
    repo: &'a HubRepo,
    commit: &'a str,
    cache: &'a RepoCache,
    progress: &'a dyn PullProgress,
    parallel: usize,
    /// Bytes earlier runs had left, in the files downloaded so far.
    resumed: AtomicU64,
}

impl Fetcher<'_> {
    /// One file into the cache and the snapshot.
    fn one(&self, f: &HubFile, stop: &AtomicBool) -> Result<(), HubError> {
        if self.progress.stopped() {
            return Err(HubError::Stopped);
        }
        let url = self.hub.url(&format!(
            "{}/resolve/{}/{}",
            self.repo.id(),
            self.commit,
            f.path
        ));
        let had = download::download(
            self.hub,
            self.repo,
            self.commit,
            &url,
            self.cache,
            f,
            self.progress,
            stop,
        )?;
        self.resumed.fetch_add(had, Ordering::Relaxed);
        self.cache.link(self.commit, f)?;
        self.progress.file_done(f);
        Ok(())
    }

    /// Every file of `files` in the cache and in the snapshot: the cached ones linked, the
    /// others downloaded several at once (the first failure stops the rest).
    fn ensure(&self, files: &[&HubFile], summary: &mut FetchSummary) -> Result<(), HubError> {
        let (cached, missing): (Vec<&HubFile>, Vec<&HubFile>) =
            files.iter().partition(|f| self.cache.holds(f));
        for f in &cached {
            self.cache.link(self.commit, f)?;
        }
        summary.files += files.len();
        summary.files_cached += cached.len();
        summary.bytes_cached += cached.iter().map(|f| f.size).sum::<u64>();
        if missing.is_empty() {
            return Ok(());
        }
        self.progress.downloads(&missing);
        let stop = AtomicBool::new(false);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.parallel.clamp(1, missing.len()))
            .build()
            .map_err(|e| HubError::Network {
                url: self.hub.url(""),
                reason: format!("cannot start the download threads: {e}"),
            })?;
        // The first failure is the one to tell; the downloads it stopped fail as `Stopped`.
        let first_error = std::sync::Mutex::new(None);
        let outcome = pool.install(|| {
            use rayon::prelude::*;
            missing.par_iter().try_for_each(|f| {
                self.one(f, &stop).map_err(|e| {
                    stop.store(true, Ordering::Relaxed);
                    let mut first = first_error.lock().unwrap_or_else(|e| e.into_inner());
                    if first.is_none() && !matches!(e, HubError::Stopped) {
                        *first = Some(e);
                    }
                })
            })
        });
        if let Some(e) = first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        if outcome.is_err() {
            return Err(HubError::Stopped);
        }
        let bytes: u64 = missing.iter().map(|f| f.size).sum();
        let resumed = self.resumed.swap(0, Ordering::Relaxed);
        summary.files_downloaded += missing.len();
        summary.bytes_downloaded += bytes - resumed.min(bytes);
        summary.bytes_resumed += resumed;
        Ok(())
    }
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PullSummary {
    pub name: String,
    pub fetch: FetchSummary,
    pub import: ImportSummary,
}

/// Pulls `repo` into the Hugging Face cache (see [`fetch`]), then imports it into `store` as
/// `name` (default: `hf.co/OWNER/REPO[:REVISION]`) with `import` options.
pub fn pull(
    store: &Store,
    repo: &HubRepo,
    name: Option<&str>,
    env: &HubEnv,
    opts: &FetchOptions,
    import: &ImportOptions,
    progress: &dyn PullProgress,
) -> Result<PullSummary, HubError> {
    let name = name.unwrap_or(&repo.store_name).to_string();
    // A bad name is refused before anything downloads.
    crate::store::ModelName::parse(&name)?;
    let fetched = fetch(repo, env, opts, progress)?;
    if progress.stopped() {
        return Err(HubError::Stopped);
    }
    progress.status("importing");
    let source = crate::diffusers_dir::DiffusersDir::open(&fetched.snapshot)?;
    crate::import_check::check(&source)?;
    let total = crate::store::import::TensorSource::tensors(&source)
        .iter()
        .fold(0u64, |n, t| n.saturating_add(t.nbytes));
    let summary = store.create(&name, &source, import, &|done| {
        progress.importing(done, total)
    })?;
    Ok(PullSummary {
        name,
        fetch: fetched,
        import: summary,
    })
}
