//! Store subcommands: create, list, show, rm, gc, verify, profile.
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::Family;
use zimage::families::{controlnet_at, describe_stored_controlnet};
use zimage::formats::{dfsn, ztensor, FileKind};
use zimage::generation_defaults::{GenerationDefaults, WithDefaults};
use zimage::hub::{FetchOptions, HubEnv, HubRepo};
use zimage::loader::{self, ReadPath};
use zimage::memory_plan;
use zimage::safetensors::Dtype;
use zimage::store::import::TensorSourceSync;
use zimage::store::{self, ImportOptions, Quantization, SafetensorsFile, Store};

#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// Model name, e.g. `z-image` or `me/z-image:tiny`.
    pub name: String,
    /// Source: a diffusers directory (or `hf.co/OWNER/REPO[:REVISION]`, one on Hugging Face,
    /// downloaded through its cache), or one model file (.safetensors, .zt or .dfsn); with
    /// `--lora`, the stored model the new one derives from. With component files, the
    /// directory whose components they replace.
    #[arg(long, required_unless_present_any = ["transformer", "text_encoder", "text_encoder_2", "vae"])]
    pub from: Option<PathBuf>,
    /// The transformer: a safetensors file (diffusers names or the family's original ones, as
    /// ComfyUI ships it), several shards, or a shard index.
    #[arg(long, num_args = 1.., value_name = "FILE")]
    pub transformer: Vec<PathBuf>,
    /// The text encoder: a safetensors file (Qwen3 with or without the `model.` prefix,
    /// Qwen3-VL in transformers' names, or CLIP's text model as ComfyUI's `clip_l.safetensors`),
    /// several shards, or a shard index.
    #[arg(long, num_args = 1.., value_name = "FILE")]
    pub text_encoder: Vec<PathBuf>,
    /// The second text encoder of a pipeline that has one: T5's encoder as a safetensors file
    /// in transformers' names (ComfyUI's `t5xxl_fp16.safetensors`, fp8 too) or a GGUF file in
    /// llama.cpp's names, several shards, or a shard index.
    #[arg(long, num_args = 1.., value_name = "FILE")]
    pub text_encoder_2: Vec<PathBuf>,
    /// The VAE: a safetensors file in diffusers' or the LDM/Flux layout (`ae.safetensors`).
    #[arg(long, num_args = 1.., value_name = "FILE")]
    pub vae: Vec<PathBuf>,
    /// The tokenizer: a folder of tokenizer files or one of them (default: `--from`'s, else
    /// the demo model's, which the binary carries).
    #[arg(long, value_name = "DIR|FILE")]
    pub tokenizer: Option<PathBuf>,
    /// The second text encoder's tokenizer: a folder of tokenizer files or one of them
    /// (default: `--from`'s; needed without `--from` by a model that has a second encoder).
    #[arg(long, value_name = "DIR|FILE")]
    pub tokenizer_2: Option<PathBuf>,
    /// For a single-file source: the component its tensors go under (`transformer`, …).
    #[arg(long, default_value = "model", value_parser = super::component_arg)]
    pub component: String,
    /// Convert float tensors to this dtype.
    #[arg(long, value_enum)]
    pub dtype: Option<StoredDtype>,
    /// Quantize linear weights (MLX affine, group 64; norms, embeddings, biases and the VAE stay as they are).
    #[arg(long, value_enum)]
    pub quantize: Option<QuantizeArg>,
    /// Start tensor data on this boundary (e.g. 16384) so blobs can be mapped without a copy.
    #[arg(long, default_value_t = 8)]
    pub align: u64,
    /// A LoRA the new model carries, with its scale (default 1); repeat for several. The model
    /// shares every blob of the stored model `--from` names and adds the LoRAs' tensors;
    /// `generate` applies them unfused.
    #[arg(long = "lora", value_name = "FILE[:SCALE]", value_parser = super::generate::lora_arg,
          conflicts_with_all = ["dtype", "quantize", "transformer", "text_encoder", "text_encoder_2", "vae", "tokenizer", "tokenizer_2"])]
    pub loras: Vec<zimage::lora::LoraSpec>,
    /// With `--lora`: store LoRA keys that name no layer of the model, skipped when applied,
    /// instead of refusing the file.
    #[arg(long, requires = "loras")]
    pub lora_lenient: bool,
    /// The denoising steps `generate` uses for this model when a request names none (over
    /// what the source records; without either, 8).
    #[arg(long, value_name = "N", conflicts_with = "loras")]
    pub default_steps: Option<usize>,
    /// The guidance scale used when a request names none (without it, 0: no guidance).
    #[arg(
        long,
        value_name = "F",
        allow_hyphen_values = true,
        conflicts_with = "loras"
    )]
    pub default_guidance: Option<f32>,
    /// The negative prompt used when a request names none.
    #[arg(long, value_name = "TEXT", conflicts_with = "loras")]
    pub default_negative: Option<String>,
    /// The scheduler shift used instead of the scheduler config's.
    #[arg(
        long,
        value_name = "F",
        allow_hyphen_values = true,
        conflicts_with = "loras"
    )]
    pub default_shift: Option<f32>,
    /// Guided runs cap the guided prediction's norm at the prompt's own (`--cfg-normalization`).
    #[arg(long, conflicts_with = "loras")]
    pub default_cfg_normalization: bool,
    /// Guided runs stop guiding past this model time (`--cfg-truncation`), within [0, 1].
    #[arg(
        long,
        value_name = "F",
        allow_hyphen_values = true,
        conflicts_with = "loras"
    )]
    pub default_cfg_truncation: Option<f64>,
}

impl CreateArgs {
    /// The generation defaults the options give, checked.
    fn defaults(&self) -> anyhow::Result<GenerationDefaults> {
        let d = GenerationDefaults {
            steps: self.default_steps,
            guidance: self.default_guidance,
            shift: self.default_shift,
            negative_prompt: self.default_negative.clone(),
            cfg_normalization: self.default_cfg_normalization.then_some(true),
            cfg_truncation: self.default_cfg_truncation,
        };
        d.validate().map_err(|e| {
            // `steps` → `--default-steps`, as the user typed it.
            let flag = |field: &str| format!("--default-{}", field.replace('_', "-"));
            let e = [
                "negative_prompt",
                "cfg_truncation",
                "steps",
                "guidance",
                "shift",
            ]
            .iter()
            .fold(e, |e, f| e.replace(&format!("`{f}`"), &flag(f)));
            anyhow::anyhow!(e.replace("--default-negative-prompt", "--default-negative"))
        })?;
        Ok(d)
    }
}

/// The float dtypes an import can convert to.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredDtype {
    Bf16,
    F16,
    F32,
}

impl From<StoredDtype> for Dtype {
    fn from(d: StoredDtype) -> Dtype {
        match d {
            StoredDtype::Bf16 => Dtype::BF16,
            StoredDtype::F16 => Dtype::F16,
            StoredDtype::F32 => Dtype::F32,
        }
    }
}

/// The quantizations an import can write.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantizeArg {
    Int8,
    Int4,
}

impl From<QuantizeArg> for Quantization {
    fn from(q: QuantizeArg) -> Quantization {
        match q {
            QuantizeArg::Int8 => Quantization::Int8,
            QuantizeArg::Int4 => Quantization::Int4,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {}

#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    pub name: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct RmArgs {
    pub name: String,
}

#[derive(clap::Args, Debug)]
pub struct GcArgs {}

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Remove everything found without asking (for scripts).
    #[arg(long, short)]
    pub yes: bool,
}

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    pub name: String,
}

#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    pub name: String,
    /// Map page-aligned blobs instead of reading them through MLX's loader.
    #[arg(long)]
    pub mmap: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn open(store: Option<PathBuf>) -> anyhow::Result<Store> {
    Ok(Store::locate(store.as_deref())?)
}

pub fn create(s: Option<PathBuf>, mut a: CreateArgs) -> anyhow::Result<ExitCode> {
    let store = open(s)?;
    if !a.loras.is_empty() {
        return create_derived(&store, &a);
    }
    let defaults = a.defaults()?;
    if let Some(from) = a.from.take() {
        a.from = Some(from_hub(from)?);
    }
    let composed = !(a.transformer.is_empty()
        && a.text_encoder.is_empty()
        && a.text_encoder_2.is_empty()
        && a.vae.is_empty())
        || a.tokenizer.is_some()
        || a.tokenizer_2.is_some();
    let (source, from): (Box<dyn TensorSourceSync>, String) = if composed {
        let model = super::components::compose(&super::components::ComponentFiles {
            from: a.from.as_deref(),
            transformer: &a.transformer,
            text_encoder: &a.text_encoder,
            text_encoder_2: &a.text_encoder_2,
            vae: &a.vae,
            tokenizer: a.tokenizer.as_deref(),
            tokenizer_2: a.tokenizer_2.as_deref(),
        })?;
        (Box::new(model), "the component files".to_string())
    } else {
        let from = a.from.as_deref().context("--from is needed")?;
        (
            open_source(from, &a.component)?,
            format!("`{}`", from.display()),
        )
    };
    // What `generate` would refuse is refused before anything is stored.
    zimage::import_check::check(source.as_ref())
        .with_context(|| format!("importing {from} as `{}`", a.name))?;
    let opts = ImportOptions {
        dtype: a.dtype.map(Dtype::from),
        quantize: a.quantize.map(Quantization::from),
        align: a.align,
    };
    let total = source
        .tensors()
        .iter()
        .fold(0u64, |n, t| n.saturating_add(t.nbytes));
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} importing [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let source = WithDefaults {
        inner: source.as_ref(),
        given: defaults,
        source_name: a.from.clone().unwrap_or_default(),
    };
    let summary = store.create(&a.name, &source, &opts, &|done| bar.set_position(done));
    bar.finish_and_clear();
    let summary = summary.with_context(|| format!("importing {from} as `{}`", a.name))?;
    println!(
        "created {}: {} tensors, {} blobs written ({}), {} already present ({})",
        a.name,
        summary.tensors,
        summary.blobs_written,
        human(summary.bytes_written),
        summary.blobs_present,
        human(summary.bytes_present)
    );
    print_ggml_report(&summary.ggml);
    Ok(ExitCode::SUCCESS)
}

/// `--from hf.co/OWNER/REPO[:REVISION]` (when no such path exists): the repository's pipeline
/// files in the Hugging Face cache, and the snapshot folder that holds them.
fn from_hub(from: PathBuf) -> anyhow::Result<PathBuf> {
    let Some(repo) = from
        .to_str()
        .filter(|_| !from.exists())
        .and_then(HubRepo::parse)
    else {
        return Ok(from);
    };
    let repo = repo?;
    let bar = super::progress::Bar::files("downloading");
    let fetched = zimage::hub::fetch(&repo, &HubEnv::from_env(), &FetchOptions::default(), &bar);
    bar.bar.finish_and_clear();
    let fetched = fetched.with_context(|| format!("downloading `{}`", repo.store_name))?;
    Ok(fetched.snapshot)
}

/// How a GGUF import stored each tensor type, and the largest error any re-quantization made.
fn print_ggml_report(r: &zimage::store::import::GgmlReport) {
    for (path, n) in &r.paths {
        println!("  {n} tensors {path}");
    }
    if let Some((tensor, err)) = &r.max_requantize_error {
        println!("  largest re-quantization error: {err:e} (`{tensor}`)");
    }
}

/// `create NAME --from BASE --lora FILE…`: a model that shares BASE's blobs and carries LoRAs.
fn create_derived(store: &Store, a: &CreateArgs) -> anyhow::Result<ExitCode> {
    let from = a.from.as_deref().context("--lora needs --from")?;
    let base = from.to_string_lossy();
    let original_names = |index: &[u8]| Family::from_model_index(index).map(|f| f.original_names());
    let derived = zimage::lora::stored::create(
        store,
        &a.name,
        &base,
        &a.loras,
        a.lora_lenient,
        &original_names,
    );
    let derived = match derived {
        Err(zimage::lora::Error::Store(
            store::StoreError::NotFound(_) | store::StoreError::Name(_),
        )) if from.exists() => bail!(
            "with --lora, --from names a stored model, and `{}` is not one; import it first (`zimage create BASE --from {}`), then `zimage create {} --from BASE --lora …`",
            base, base, a.name
        ),
        other => other.with_context(|| format!("creating `{}` from `{base}`", a.name))?,
    };
    println!(
        "created {}: {} layers shared with {base}, {} LoRAs ({} tensors, {} blobs written, {})",
        a.name,
        derived.shared_layers,
        derived.loras,
        derived.lora_tensors,
        derived.blobs_written,
        human(derived.bytes_written)
    );
    Ok(ExitCode::SUCCESS)
}

/// What `--from` names: a diffusers directory or a single model file, told by its content.
fn open_source(from: &Path, component: &str) -> anyhow::Result<Box<dyn TensorSourceSync>> {
    if let Some(controlnets) = controlnet_at(from, component).map_err(|e| anyhow::anyhow!(e))? {
        return controlnets.open(from).map_err(|e| anyhow::anyhow!(e));
    }
    if from.is_dir() {
        return Ok(Box::new(DiffusersDir::open(from)?));
    }
    // A FIFO or a device would block or never end: refused before anything opens it.
    zimage::files::open_regular(from)?;
    let kind =
        FileKind::of_file(from).with_context(|| format!("cannot read `{}`", from.display()))?;
    let len = std::fs::metadata(from)?.len();
    Ok(match kind {
        FileKind::Safetensors => Box::new(SafetensorsFile::open(from, 0, len, component)?),
        FileKind::ZTensor => Box::new(ztensor::ZtSource::open(from, component)?),
        FileKind::Gguf => Box::new(zimage::formats::gguf::GgufSource::open(from, component)?),
        FileKind::Dfsn => {
            let c = dfsn::Container::open(from)?;
            if c.model_type != dfsn::ModelType::Safetensors {
                bail!("`{}` holds a pickled checkpoint; only safetensors models can be imported", from.display());
            }
            // The container vouches for its model with a hash: a model that does not match it
            // was damaged or changed, and is not imported.
            let v = dfsn::verify(from)?;
            if !v.ok() {
                bail!("`{}`: the model bytes hash to {}, but the container says {}; the file is damaged or was changed, so it is not imported (see `zimage dfsn verify`)", from.display(), v.actual_sha256, v.stored_sha256);
            }
            let mut source = SafetensorsFile::open(from, c.model_offset, c.model_len, component)?;
            source.extra_metadata = Some(c.metadata);
            Box::new(source)
        }
        other => bail!(
            "`{}` is {}; `--from` takes a diffusers directory, or a .safetensors, .zt, .dfsn or .gguf file",
            from.display(),
            other.describe()
        ),
    })
}

pub fn list(s: Option<PathBuf>, _a: ListArgs) -> anyhow::Result<ExitCode> {
    let store = open(s)?;
    let scan = store.scan()?;
    for d in &scan.damaged {
        eprintln!(
            "warning: model `{}` has a damaged manifest (`{}`: {}); `zimage rm {}` removes it",
            d.name,
            d.path.display(),
            d.reason,
            d.name
        );
    }
    println!("{:<40} {:<14} {:>10}  MODIFIED", "NAME", "ID", "SIZE");
    for m in scan.models {
        let id = m
            .manifest_digest
            .trim_start_matches("sha256:")
            .get(..12)
            .unwrap_or("")
            .to_string();
        let modified: chrono_free::Ago = m.modified.into();
        let loras = lora_note(&store, &m)
            .map(|n| format!("  + {n}"))
            .or_else(|| controlnet_note(&store, &m).map(|n| format!("  {n}")))
            .or_else(|| {
                let family = family_of(&store, &m).filter(|f| !f.is_default());
                family.map(|f| format!("  {}", named_with_kind(&store, &m, f)))
            })
            .unwrap_or_default();
        println!(
            "{:<40} {:<14} {:>10}  {}{loras}",
            m.name.short(),
            id,
            human(m.size()),
            modified
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `LoRA style.safetensors ×0.8, …` for a model that carries LoRAs; a record that cannot be
/// read is said so.
fn lora_note(store: &Store, model: &store::StoredModel) -> Option<String> {
    if !zimage::lora::stored::carries_loras(model) {
        return None;
    }
    Some(match zimage::lora::stored::records(store, model) {
        Ok(records) => {
            let shown: Vec<String> = records
                .iter()
                .map(|(_, r)| zimage::lora::stored::describe(r))
                .collect();
            format!(
                "LoRA{} {}",
                if shown.len() == 1 { "" } else { "s" },
                shown.join(", ")
            )
        }
        Err(e) => format!("LoRAs unreadable: {e}"),
    })
}

/// `ControlNet 2.1 (…)` for a stored ControlNet; `None` for any other model.
fn controlnet_note(store: &Store, model: &store::StoredModel) -> Option<String> {
    let source = zimage::loader::StoreSource::new(store, model);
    Some(match describe_stored_controlnet(&source)? {
        Ok(line) | Err(line) => line,
    })
}

/// The estimate at the model's default size for a typical prompt (as its family sizes one);
/// `None` for a model that is no pipeline of a family zimage runs (no configs to size it by).
fn runtime_memory(store: &Store, model: &store::StoredModel) -> Option<memory_plan::RuntimeMemory> {
    let source = zimage::loader::StoreSource::new(store, model);
    let dtype = zimage::platform::default_compute_dtype();
    family_of(store, model)?.runtime_memory(&source, dtype)
}

pub fn show(s: Option<PathBuf>, a: ShowArgs) -> anyhow::Result<ExitCode> {
    let store = open(s)?;
    let model = store.open(&a.name)?;
    let summary = store::summarize(&store, &model)?;
    let users = store.blob_users()?;
    let shared: Vec<(&str, u64, Vec<String>)> = model
        .manifest
        .tensor_layers()
        .filter_map(|l| {
            let others: Vec<String> = users
                .get(&l.digest)?
                .iter()
                .filter(|n| **n != model.name.short())
                .cloned()
                .collect();
            (!others.is_empty()).then(|| (l.name.as_deref().unwrap_or(""), l.size, others))
        })
        .collect();
    let shared_bytes = shared.iter().fold(0u64, |n, s| n.saturating_add(s.1));
    let quantized: usize = summary.values().map(|c| c.quantized_tensors).sum();
    let quant = if quantized > 0 {
        format!("MLX affine ({quantized} tensors)")
    } else {
        "none".to_string()
    };
    let runtime = runtime_memory(&store, &model);
    let loras = zimage::lora::stored::records(&store, &model)?;
    let source = zimage::loader::StoreSource {
        store: store.clone(),
        model: model.clone(),
        read_path: ReadPath::Mmap,
    };
    let defaults = GenerationDefaults::of(&source)?;
    let configs = zimage::layouts::resolve::stored_origins(&store, &model)?;
    if a.json {
        let json = serde_json::json!({
            "runtime_memory": runtime.as_ref().map(|r| serde_json::json!({
                "width": r.side, "height": r.side, "compute_dtype": r.dtype.to_string(),
                "compute_dtype_weights": r.compute.peak(), "stored_weights": r.stored.peak(),
                "smallest_budget": r.needs,
            })),
            "name": model.name.short(),
            "full_name": model.name.to_string(),
            "manifest_digest": model.manifest_digest,
            "model_identity": model.manifest.model_identity(),
            "size": model.size(),
            "quantization": quant,
            "components": summary,
            "shared_blobs": shared.len(),
            "shared_bytes": shared_bytes,
            "loras": loras.iter().map(|(_, r)| r).collect::<Vec<_>>(),
            "controlnet": controlnet_note(&store, &model),
            "generation_defaults": defaults,
            "configs": configs.iter().map(|(path, values)| (path.clone(), values.clone())).collect::<std::collections::BTreeMap<_, _>>(),
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("model       {}", model.name.short());
    println!("identity    {}", model.manifest.model_identity());
    println!("manifest    {}", model.manifest_digest);
    println!("size        {}", human(model.size()));
    println!("quantized   {quant}");
    if let Some(note) = controlnet_note(&store, &model) {
        println!("kind        {note}");
    }
    let family = family_of(&store, &model);
    if let Some(f) = family {
        println!("family      {}", named_with_kind(&store, &model, f));
    }
    for (_, r) in &loras {
        println!(
            "lora        {} ({} pairs, {}, hash {}), applied unfused",
            zimage::lora::stored::describe(r),
            r.pairs,
            r.layout.describe(),
            r.hash
        );
    }
    let source = zimage::loader::StoreSource::new(&store, &model);
    let own = family.filter(|_| defaults.is_empty());
    match own.and_then(|f| f.own_defaults(&source)) {
        Some(d) => println!(
            "defaults    none recorded: {} steps, guidance {} ({} model)",
            d.steps, d.guidance, d.kind
        ),
        None if own.is_some_and(|f| !f.is_default()) => {}
        None => println!("defaults    {}", describe_defaults(&defaults)),
    }
    if let Some(r) = &runtime {
        println!(
            "run-time memory at {0}×{0} ({1} compute), estimated peak: {2} with weights in {1}, {3} with weights as stored; the smallest budget that runs it: {4}",
            r.side,
            r.dtype,
            memory_plan::gb(r.compute.peak()),
            memory_plan::gb(r.stored.peak()),
            memory_plan::gb(r.needs)
        );
    }
    println!();
    println!(
        "{:<14} {:>8} {:>14} {:>10}  DTYPES",
        "COMPONENT", "TENSORS", "PARAMETERS", "BYTES"
    );
    for (name, c) in &summary {
        let dtypes: Vec<String> = c.dtypes.iter().map(|(d, n)| format!("{d}×{n}")).collect();
        let q = if c.quantized_tensors > 0 {
            format!(" ({} quantized)", c.quantized_tensors)
        } else {
            String::new()
        };
        println!(
            "{:<14} {:>8} {:>14} {:>10}  {}{q}",
            name,
            c.tensors,
            c.parameters,
            human(c.bytes),
            dtypes.join(" ")
        );
    }
    println!();
    println!(
        "shared      {} blobs ({}) with other models",
        shared.len(),
        human(shared_bytes)
    );
    print_config_origins(&configs);
    Ok(ExitCode::SUCCESS)
}

/// The family of an image model (`None`: no `model_index.json`, or one zimage does not run).
fn family_of(store: &Store, model: &store::StoredModel) -> Option<Family> {
    let index = store.config_file(model, "model_index.json").ok()??;
    Family::from_model_index(&index).ok()
}

/// The family's name and, where the family tells its models apart, which kind this one is
/// (the name, then `([schnell])`).
fn named_with_kind(store: &Store, model: &store::StoredModel, family: Family) -> String {
    let source = zimage::loader::StoreSource::new(store, model);
    match family.own_defaults(&source) {
        Some(d) => format!("{} ({})", family.name(), d.kind),
        None => family.name().to_string(),
    }
}

/// The generation defaults a model records, in a line.
fn describe_defaults(d: &GenerationDefaults) -> String {
    if d.is_empty() {
        return format!(
            "none recorded: {} steps, no guidance, the scheduler's shift",
            zimage::generation::DEFAULT_STEPS
        );
    }
    let mut parts = Vec::new();
    if let Some(s) = d.steps {
        parts.push(format!("{s} steps"));
    }
    if let Some(g) = d.guidance {
        parts.push(format!("guidance {g}"));
    }
    if let Some(n) = &d.negative_prompt {
        parts.push(format!("negative {n:?}"));
    }
    if let Some(s) = d.shift {
        parts.push(format!("shift {s}"));
    }
    if d.cfg_normalization == Some(true) {
        parts.push("cfg normalization".into());
    }
    if let Some(t) = d.cfg_truncation {
        parts.push(format!("cfg truncation {t}"));
    }
    parts.join(", ")
}

/// Each config value with where it came from; a model imported whole says its files gave all.
fn print_config_origins(configs: &[(String, Vec<zimage::layouts::resolve::SourcedValue>)]) {
    use zimage::layouts::resolve::Origin;
    if configs
        .iter()
        .all(|(_, v)| v.iter().all(|s| s.origin == Origin::File))
    {
        println!("configs     every value from the model's own config files");
        return;
    }
    println!();
    println!("{:<26} {:<26} {:<24} FROM", "CONFIG", "KEY", "VALUE");
    for (path, values) in configs {
        for v in values {
            println!(
                "{:<26} {:<26} {:<24} {}",
                path,
                v.key,
                v.value.to_string(),
                v.origin.describe()
            );
        }
    }
}

pub fn rm(s: Option<PathBuf>, a: RmArgs) -> anyhow::Result<ExitCode> {
    let store = open(s)?;
    let removed = store.remove(&a.name)?;
    if let Some(reason) = &removed.damaged {
        eprintln!(
            "warning: the manifest of {} was damaged ({reason})",
            removed.name.short()
        );
    }
    println!(
        "deleted {} (run `zimage gc` to free its unshared blobs)",
        removed.name.short()
    );
    Ok(ExitCode::SUCCESS)
}

pub fn gc(s: Option<PathBuf>, _a: GcArgs) -> anyhow::Result<ExitCode> {
    let store = open(s)?;
    let swept = store.gc(&|| {
        eprintln!("waiting for other zimage processes (imports, loads) to finish with the store…")
    })?;
    println!(
        "deleted {} unreferenced blobs, freed {}",
        swept.blobs,
        human(swept.bytes)
    );
    if swept.temporaries > 0 {
        println!(
            "deleted {} temporary files of interrupted writes",
            swept.temporaries
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn doctor(s: Option<PathBuf>, a: DoctorArgs) -> anyhow::Result<ExitCode> {
    let store = open(s)?;
    let found = store.examine()?;
    if found.is_empty() {
        println!("{}: no damage found", store.root.display());
        return Ok(ExitCode::SUCCESS);
    }
    let mut answers = std::io::stdin().lines();
    let (mut fixed, mut left) = (0, 0);
    for damage in &found {
        println!("{damage}");
        let confirmed = a.yes || {
            eprint!("  {}? [y/N] ", damage.remedy());
            matches!(
                answers.next().transpose()?.as_deref().map(str::trim),
                Some("y" | "Y" | "yes")
            )
        };
        if confirmed {
            store.repair(damage)?;
            println!("  done: {}", damage.remedy());
            fixed += 1;
        } else {
            left += 1;
        }
    }
    println!("{fixed} repaired, {left} left as they are");
    Ok(if left == 0 {
        ExitCode::SUCCESS
    } else {
        super::exit_check_failed()
    })
}

pub fn verify(s: Option<PathBuf>, a: VerifyArgs) -> anyhow::Result<ExitCode> {
    let store = open(s)?;
    let report = store.verify(&a.name)?;
    for p in &report.problems {
        eprintln!("{p}");
    }
    println!(
        "checked {} blobs ({}): {}",
        report.blobs_checked,
        human(report.bytes_checked),
        if report.problems.is_empty() {
            "ok".to_string()
        } else {
            format!("{} problems", report.problems.len())
        }
    );
    Ok(if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        super::exit_check_failed()
    })
}

pub fn profile(s: Option<PathBuf>, a: ProfileArgs) -> anyhow::Result<ExitCode> {
    let store = open(s)?;
    zimage::platform::use_default_device()?;
    let model = store.open(&a.name)?;
    let path = if a.mmap {
        ReadPath::Mmap
    } else {
        ReadPath::MlxLoader
    };
    let (manifest_seconds, components) = loader::profile(&store, &model, path)?;
    if a.json {
        let json = serde_json::json!({ "model": model.name.short(), "read_path": path,
            "manifest_seconds": manifest_seconds, "components": components });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} via {:?}: manifest parsed in {:.2} ms",
        model.name.short(),
        path,
        manifest_seconds * 1e3
    );
    println!(
        "{:<14} {:>6} {:>10} {:>7} {:>10} {:>11} {:>9} {:>11} {:>9} {:>6} {:>11} {:>6}",
        "COMPONENT",
        "BLOBS",
        "BYTES",
        "MAPPED",
        "HEADERS",
        "MATERIALISE",
        "GB/s",
        "SEQ READ",
        "GB/s",
        "RATIO",
        "STREAMING",
        "RATIO"
    );
    for c in components {
        println!(
            "{:<14} {:>6} {:>10} {:>7} {:>8.1}ms {:>9.1}ms {:>9.2} {:>9.1}ms {:>9.2} {:>6.2} {:>9.1}ms {:>6.2}",
            c.component,
            c.blobs,
            human(c.bytes),
            c.mapped_blobs,
            c.header_seconds * 1e3,
            c.materialise_seconds * 1e3,
            c.materialise_gbps,
            c.sequential_read_seconds * 1e3,
            c.sequential_read_gbps,
            c.materialise_seconds / c.sequential_read_seconds,
            c.streaming_read_seconds * 1e3,
            c.materialise_seconds / c.streaming_read_seconds
        );
    }
    println!("SEQ READ reads every blob into memory and keeps it, as loading does; STREAMING reads them through one reused buffer.");
    Ok(ExitCode::SUCCESS)
}

pub fn human(bytes: u64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < units.len() {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// "3 minutes ago" without a date-time dependency.
mod chrono_free {
    use std::time::SystemTime;
    pub struct Ago(pub u64);
    impl From<SystemTime> for Ago {
        fn from(t: SystemTime) -> Ago {
            Ago(SystemTime::now()
                .duration_since(t)
                .map(|d| d.as_secs())
                .unwrap_or(0))
        }
    }
    impl std::fmt::Display for Ago {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let s = self.0;
            let (n, unit) = match s {
                0..=59 => return f.write_str("just now"),
                60..=3599 => (s / 60, "minute"),
                3600..=86399 => (s / 3600, "hour"),
                _ => (s / 86400, "day"),
            };
            write!(f, "{n} {unit}{} ago", if n == 1 { "" } else { "s" })
        }
    }
}
