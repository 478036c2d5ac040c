//! `zimage generate`: prompt → PNG.
use anyhow::{anyhow, bail, Context};
use image::GenericImageView;
use indicatif::{ProgressBar, ProgressStyle};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zimage::controlnet_source::{self, ControlNetSource};
use zimage::diffusers_dir::DiffusersDir;
use zimage::files;
use zimage::generation;
use zimage::image_in;
use zimage::image_out;
use zimage::loader::{ReadPath, StoreSource};
use zimage::memory_plan::{self, gb, MemoryPlan};
use zimage::mlx::fast::Products;
use zimage::mlx::Dtype;
use zimage::models::Residency;
use zimage::pipeline::{
    self, ControlNetLoader, ControlSpec, ModelSource, Pipeline, Progress, Request,
};
use zimage::safetensors;
use zimage::store::{ImportOptions, Store};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// The prompt.
    pub prompt: String,
    /// Stored model to use, or a diffusers directory (default: the first Z-Image in the store,
    /// else the embedded demo model).
    #[arg(long)]
    pub model: Option<String>,
    /// Image width in pixels (a multiple of 16 up to 8192; default: the model's VAE sample size).
    #[arg(long, allow_negative_numbers = true)]
    pub width: Option<u32>,
    /// Image height in pixels (a multiple of 16 up to 8192; default: the model's VAE sample size).
    #[arg(long, allow_negative_numbers = true)]
    pub height: Option<u32>,
    /// Denoising steps, 1 to 1000 (Turbo: 8).
    #[arg(long, default_value_t = generation::DEFAULT_STEPS, allow_negative_numbers = true)]
    pub steps: usize,
    /// Seed of the initial noise (drawn as torch's CPU generator draws it).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Classifier-free guidance scale, ≥ 0; 0 turns it off (Turbo: 0).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub guidance: f32,
    /// Negative prompt, used when guidance > 0.
    #[arg(long)]
    pub negative: Option<String>,
    /// Output PNG.
    #[arg(long, short, default_value = "zimage.png")]
    pub output: PathBuf,
    /// Initial latents: a safetensors file with one f32 tensor `noise` of shape [1, 16, H/8, W/8].
    #[arg(long)]
    pub noise: Option<PathBuf>,
    /// Compute dtype (default: bf16 on a GPU, f32 on the CPU).
    #[arg(long, value_enum)]
    pub dtype: Option<ComputeDtype>,
    /// Inputs of the linear layers' matrix products on the CPU: f32 (the reference's
    /// arithmetic) or bf16 (about twice as fast where the CPU has AVX512-BF16: both operands
    /// rounded to 8 significant bits, f32 sums, everything between the products in f32;
    /// unquantized weights then stay as stored). A GPU computes in `--dtype`.
    #[arg(long, value_enum, default_value_t = ProductsArg::F32)]
    pub products: ProductsArg,
    /// Memory the run may use, e.g. 12GB (default: ZIMAGE_MEMORY_LIMIT, else 85% of the
    /// machine's memory). A request estimated above it is refused before anything loads.
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
    /// How weights are held: unquantized ones in the compute dtype (fastest; f32 on the CPU) or
    /// as stored (each layer widened as it runs); or, for a stored model on the CPU, the
    /// transformer's streamed: mapped from the store and let go of block by block, so that the
    /// process holds one block (each step reads them again, from the OS's file cache while it
    /// keeps them). Auto takes the first that fits the memory budget.
    #[arg(long, value_enum, default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,
    /// A LoRA to apply, with its scale (default 1); repeat for several. diffusers/PEFT,
    /// ComfyUI and kohya files are recognised by their keys.
    #[arg(long = "lora", value_name = "FILE[:SCALE]", value_parser = lora_arg)]
    pub loras: Vec<zimage::lora::LoraSpec>,
    /// Skip LoRA keys that name no layer of the model instead of refusing the file.
    #[arg(long)]
    pub lora_lenient: bool,
    /// Start from this picture (PNG, JPEG or WebP) instead of noise: image-to-image, or with
    /// `--mask` inpainting. Without `--width/--height` the output takes its size, each side
    /// rounded down to a multiple of 16; another size is reached by a Lanczos-3 resize (close to,
    /// not bit-identical with, the PIL resize diffusers uses).
    #[arg(long, value_name = "IN.png")]
    pub image: Option<PathBuf>,
    /// Repaint only where this mask is white (black keeps the picture); read as grey and
    /// binarised at half, as diffusers does. Must be the picture's size. Needs `--image`.
    #[arg(long, value_name = "MASK.png")]
    pub mask: Option<PathBuf>,
    /// How far the picture is taken back toward noise, in (0, 1] (default: 0.6 for
    /// image-to-image, 1.0 for inpainting): the schedule's first steps are skipped accordingly.
    #[arg(long, allow_negative_numbers = true)]
    pub strength: Option<f64>,
    /// A control image (PNG, JPEG or WebP: a pose, an edge or depth map, a line drawing) whose
    /// layout --controlnet holds while the prompt paints. It is encoded by the VAE; without
    /// --width/--height (or --image) the output takes its size, each side rounded down to a
    /// multiple of 16. With --image and --mask: ControlNet inpainting (a 2.x ControlNet).
    #[arg(long, value_name = "CONTROL.png")]
    pub control: Option<PathBuf>,
    /// The Z-Image ControlNet Union that reads --control: a stored name, a diffusers directory,
    /// or a published single .safetensors file (1.0, 2.0 and 2.1 are recognised).
    #[arg(long, value_name = "PATH|NAME")]
    pub controlnet: Option<String>,
    /// How strongly the control image steers, within [0, 2] (default 0.75); 0 gives the
    /// unsteered picture.
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub control_scale: Option<f32>,
    /// Report time and peak memory of each phase, and the memory estimate.
    #[arg(long, short)]
    pub verbose: bool,
    /// Generate this many times in one process, models kept loaded, and write the last image:
    /// with --verbose, the later runs' phases time a warm process.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
}

pub(super) fn lora_arg(arg: &str) -> Result<zimage::lora::LoraSpec, String> {
    zimage::lora::LoraSpec::parse(arg).map_err(|e| e.to_string())
}

/// The dtypes the pipeline computes in.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComputeDtype {
    F32,
    Bf16,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductsArg {
    F32,
    Bf16,
}

impl ProductsArg {
    /// Makes the choice the process's, saying so when this CPU cannot honour it.
    pub fn apply(self) {
        let products = match self {
            ProductsArg::F32 => Products::F32,
            ProductsArg::Bf16 => Products::Bf16,
        };
        if products == Products::Bf16
            && zimage::platform::default_device() == zimage::mlx::Device::Cpu
            && !zimage::mlx::bf16_products_available()
        {
            eprintln!(
                "note: --products bf16: this CPU has no AVX512-BF16, so the products stay f32"
            );
        }
        Products::set_for_process(products);
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightsArg {
    Auto,
    Compute,
    Stored,
    Streamed,
}

/// The embedded demo model (random weights), shipped in the source tree.
const DEMO_NAME: &str = "zimage/z-image-tiny:demo";

/// The model to run: `--model`, else a Z-Image in the store, else the demo imported into a
/// small store of its own (so the user's store is left alone).
fn resolve_model(
    store: Option<PathBuf>,
    requested: Option<&str>,
) -> anyhow::Result<(StoreSource, bool)> {
    let user_store = Store::locate(store.as_deref())?;
    if let Some(name) = requested {
        let model = user_store.open(name)?;
        return Ok((
            StoreSource {
                store: user_store,
                model,
                read_path: ReadPath::MlxLoader,
            },
            false,
        ));
    }
    // A store that cannot be read is said, not silently passed over for the demo model.
    let models = user_store.list().unwrap_or_else(|e| {
        eprintln!("warning: cannot list the store ({e}); using the demo model");
        Vec::new()
    });
    for m in models {
        let is_zimage = user_store
            .config_file(&m, "model_index.json")
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|j| j["_class_name"] == "ZImagePipeline");
        if is_zimage && m.name.short() != DEMO_NAME {
            return Ok((
                StoreSource {
                    store: user_store,
                    model: m,
                    read_path: ReadPath::MlxLoader,
                },
                false,
            ));
        }
    }
    let cache = zimage::platform::cache_dir()
        .context("cannot place the demo store: set ZIMAGE_CACHE_DIR or HOME")?;
    let demo_store = Store::at(&cache.join("demo-store"));
    let model = match demo_store.open(DEMO_NAME) {
        Ok(m)
            if demo_store
                .verify(DEMO_NAME)
                .map(|r| r.problems.is_empty())
                .unwrap_or(false) =>
        {
            m
        }
        _ => {
            let dir = DiffusersDir::open(&super::demo::unpacked(&cache)?)?;
            demo_store.create(DEMO_NAME, &dir, &ImportOptions::default(), &|_| {})?;
            demo_store.open(DEMO_NAME)?
        }
    };
    Ok((
        StoreSource {
            store: demo_store,
            model,
            read_path: ReadPath::MlxLoader,
        },
        true,
    ))
}

/// Checks that the request fits the memory budget and chooses how to hold the weights and
/// decode; `--weights` overrides the choice of residency.
fn plan_memory<S: ModelSource>(
    pipeline: &Pipeline<S>,
    req: &Request,
    limit: Option<&str>,
    weights: WeightsArg,
) -> anyhow::Result<MemoryPlan> {
    let forced = match weights {
        // bf16 products read bf16 weights as they are: widening them first gains nothing.
        WeightsArg::Auto if Products::for_process() == Products::Bf16 => {
            Some(match pipeline.can_stream() {
                true => Residency::Streamed,
                false => Residency::Stored,
            })
        }
        WeightsArg::Auto => None,
        WeightsArg::Compute => Some(Residency::Compute),
        WeightsArg::Stored => Some(Residency::Stored),
        WeightsArg::Streamed => Some(Residency::Streamed),
    };
    Ok(generation::plan_memory(pipeline, req, limit, forced)?)
}

/// The most bytes a noise file may hold beyond its values: the length prefix and a header
/// naming one tensor (with room for metadata).
const NOISE_HEADER_LIMIT: u64 = 64 << 10;

/// Reads `--noise`: one f32 tensor `noise` of shape [1, C, h, w]. The file is refused by its
/// size before it is read, so a device or a huge file costs nothing.
fn read_noise(path: &Path, expected: [i32; 3]) -> anyhow::Result<Vec<f32>> {
    let values: u64 = expected.iter().map(|&d| d as u64).product();
    let limit = values * 4 + 8 + NOISE_HEADER_LIMIT;
    let bytes = files::read_bounded(path, limit, "noise file for this size")
        .map_err(|e| anyhow!("--noise: {e}"))?;
    let header = safetensors::parse(&bytes).map_err(|e| e.in_file(path))?;
    let t = header
        .tensor("noise")
        .with_context(|| format!("`{}` has no tensor `noise`", path.display()))?;
    if t.dtype != safetensors::Dtype::F32 {
        bail!(
            "`{}`: tensor `noise` is {}, expected F32",
            path.display(),
            t.dtype
        );
    }
    let want: Vec<u64> = std::iter::once(1)
        .chain(expected.iter().map(|&d| d as u64))
        .collect();
    if t.shape != want {
        bail!(
            "`{}`: tensor `noise` has shape {:?}, expected {want:?}",
            path.display(),
            t.shape
        );
    }
    let data = header
        .data_start()
        .checked_add(t.data_offsets.0)
        .zip(header.data_start().checked_add(t.data_offsets.1))
        .and_then(|(start, end)| bytes.get(start as usize..end as usize))
        .with_context(|| format!("`{}`: tensor `noise` lies outside the file", path.display()))?;
    Ok(data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Checks every numeric flag against its bounds, before anything loads. A side left to the
/// model's default is checked once the model is read; 16 stands in for it here, since it
/// passes every bound on its own.
fn check_flags(a: &GenerateArgs) -> anyhow::Result<()> {
    let side = |v: Option<u32>| v.unwrap_or(16);
    if let Some(e) =
        pipeline::request_range_error(a.steps as u64, a.guidance, side(a.width), side(a.height))
    {
        bail!("{e}");
    }
    if let Some(limit) = &a.memory_limit {
        memory_plan::parse_size(limit).map_err(|e| anyhow!("--memory-limit: {e}"))?;
    }
    if a.image.is_none() {
        if let Some(mask) = &a.mask {
            bail!(
                "--mask `{}` needs --image: a mask says which part of a picture to repaint",
                mask.display()
            );
        }
        if a.strength.is_some() {
            bail!(
                "--strength needs --image: it says how far the picture is taken back toward noise"
            );
        }
    }
    if let Some(s) = a.strength {
        if !(s > 0.0 && s <= 1.0) {
            bail!("--strength is {s}; it must be within (0, 1]");
        }
    }
    match (&a.control, &a.controlnet) {
        (Some(c), None) => bail!(
            "--control `{}` needs --controlnet: a control image steers a ControlNet (a stored name, a directory or a .safetensors file)",
            c.display()
        ),
        (None, Some(n)) => bail!(
            "--controlnet `{}` needs --control: the control image it follows",
            n.escape_debug()
        ),
        (None, None) if a.control_scale.is_some() => {
            bail!("--control-scale needs --control and --controlnet")
        }
        _ => {}
    }
    if let Some(e) = a.control_scale.and_then(pipeline::control::scale_error) {
        bail!("{e}");
    }
    if a.control.is_some() && a.image.is_some() && a.mask.is_none() {
        bail!("--control with --image needs --mask: a ControlNet repaints the masked part of a picture; it does not rework a whole one");
    }
    Ok(())
}

/// The picture `--control` names, decoded (before any model loads).
fn read_control(a: &GenerateArgs) -> anyhow::Result<Option<image::DynamicImage>> {
    let Some(path) = &a.control else {
        return Ok(None);
    };
    match image_in::read(path, "--control") {
        Ok(img) => Ok(Some(img)),
        Err(e @ image_in::Error::Decode { .. }) => Err(e.into()),
        Err(e) => Err(anyhow!("--control: {e}")),
    }
}

/// `--controlnet`: a directory or file when one is there, else a name in the store.
fn open_controlnet(store: Option<&Path>, arg: &str) -> anyhow::Result<Box<dyn ControlNetLoader>> {
    let path = Path::new(arg);
    if std::fs::symlink_metadata(path).is_ok() {
        let source = ControlNetSource::open(path).map_err(|e| anyhow!("--controlnet: {e}"))?;
        return Ok(Box::new(source));
    }
    let store = Store::locate(store)?;
    match controlnet_source::open_stored(store, arg) {
        Ok(stored) => Ok(Box::new(stored)),
        Err(e @ controlnet_source::Error::Store(_)) => Err(anyhow!(
            "--controlnet `{}` is neither a file, a directory nor a stored model: {e}",
            arg.escape_debug()
        )),
        Err(e) => Err(anyhow!("--controlnet: {e}")),
    }
}

/// The pictures `--image` and `--mask` name, decoded (before any model loads).
struct Inputs {
    image: image::DynamicImage,
    mask: Option<image::DynamicImage>,
}

fn read_inputs(a: &GenerateArgs) -> anyhow::Result<Option<Inputs>> {
    let Some(path) = &a.image else {
        return Ok(None);
    };
    let image = image_in::read(path, "--image")?;
    let mask = match &a.mask {
        Some(m) => {
            let mask = image_in::read(m, "--mask")?;
            if mask.dimensions() != image.dimensions() {
                bail!(
                    "--mask `{}` is {}×{}, but --image `{}` is {}×{}; give a mask of the picture's size",
                    m.display(),
                    mask.width(),
                    mask.height(),
                    path.display(),
                    image.width(),
                    image.height()
                );
            }
            Some(mask)
        }
        None => None,
    };
    Ok(Some(Inputs { image, mask }))
}

/// Refuses an output path that can never be written, before any work: a directory, or a
/// file in a folder that does not exist.
fn check_output(path: &Path) -> anyhow::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        bail!(
            "--output `{}` is a directory; give the path of a PNG file",
            path.display()
        );
    }
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if std::fs::symlink_metadata(path).is_err() && !folder.is_dir() {
        bail!(
            "--output `{}`: folder `{}` does not exist; create it first",
            path.display(),
            folder.display()
        );
    }
    Ok(())
}

/// `--model` as a diffusers directory, when it names one.
fn model_dir(model: Option<&str>) -> Option<&Path> {
    model.map(Path::new).filter(|p| p.is_dir())
}

/// A diffusers directory as a pipeline source, checked to be a Z-Image pipeline.
fn open_model_dir(dir: &Path) -> anyhow::Result<DiffusersDir> {
    let source = DiffusersDir::open(dir)?;
    let index = source
        .config_file("model_index.json")
        .map_err(|e| anyhow!("{e}"))?
        .unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(&index)
        .with_context(|| format!("`{}`", dir.join("model_index.json").display()))?;
    if json["_class_name"] != "ZImagePipeline" {
        bail!(
            "`{}`: `_class_name` is {}, not \"ZImagePipeline\"",
            dir.join("model_index.json").display(),
            json["_class_name"]
        );
    }
    Ok(source)
}

pub fn run(store: Option<PathBuf>, a: GenerateArgs) -> anyhow::Result<ExitCode> {
    check_flags(&a)?;
    check_output(&a.output)?;
    let inputs = read_inputs(&a)?;
    let control = match (read_control(&a)?, &a.controlnet) {
        (Some(image), Some(net)) => Some(Control {
            net: open_controlnet(store.as_deref(), net)?,
            spec: ControlSpec {
                controlnet: net.clone(),
                image,
                scale: a.control_scale.unwrap_or(pipeline::control::DEFAULT_SCALE),
            },
        }),
        _ => None,
    };
    zimage::platform::use_default_device()?;
    zimage::platform::prepare_device_memory();
    if let Some(dir) =
        zimage::platform::kernels_compile_first(zimage::mlx::runtime::kernel_cache_dir().as_deref())
    {
        eprintln!("{}", zimage::platform::first_compile_note(&dir));
    }
    a.products.apply();
    let dtype = match a.dtype {
        Some(ComputeDtype::Bf16) => Dtype::BF16,
        Some(ComputeDtype::F32) => Dtype::F32,
        None => zimage::platform::default_compute_dtype(),
    };
    if let Some(dir) = model_dir(a.model.as_deref()) {
        return generate(open_model_dir(dir)?, dtype, a, inputs, control);
    }
    let (source, demo) = resolve_model(store, a.model.as_deref())?;
    if demo {
        eprintln!("note: no Z-Image in the store; running the embedded demo model, whose weights are random");
    }
    generate(source, dtype, a, inputs, control)
}

/// `--control`'s picture, decoded, with the scale, and the ControlNet `--controlnet` names,
/// opened.
struct Control {
    spec: ControlSpec,
    net: Box<dyn ControlNetLoader>,
}

/// Each phase's time and peak memory, then the mean step and the total, and the part of a step
/// the ControlNet's hints took.
/// The denoising steps a request runs: image input skips the schedule's first ones.
fn steps_run(req: &pipeline::Request) -> usize {
    let skipped = req.input.as_ref().map_or(0, |i| i.first_step(req.steps));
    (req.steps - skipped).max(1)
}

fn print_phases(
    phases: &[zimage::pipeline::PhaseReport],
    steps: usize,
    control_seconds: Option<f64>,
) {
    for p in phases {
        let rss = p
            .peak_resident_bytes
            .map(|b| format!("   peak RSS so far {:>8.1} MB", b as f64 / 1e6))
            .unwrap_or_default();
        // On a GPU MLX's buffers are the device's memory: its peak plus what it keeps cached.
        let device = match zimage::mlx::default_device() {
            zimage::mlx::Device::Gpu => format!(
                "   device ≤ {:>8.1} MB",
                (p.peak_bytes + p.cache_bytes) as f64 / 1e6
            ),
            zimage::mlx::Device::Cpu => String::new(),
        };
        eprintln!(
            "{:<8} {:>8.3} s   MLX peak {:>8.1} MB   cache {:>8.1} MB{device}{rss}",
            p.phase,
            p.seconds,
            p.peak_bytes as f64 / 1e6,
            p.cache_bytes as f64 / 1e6
        );
    }
    let step = phases
        .iter()
        .find(|p| p.phase == "denoise")
        .map(|p| p.seconds / steps as f64)
        .unwrap_or(0.0);
    let total: f64 = phases.iter().map(|p| p.seconds).sum();
    eprintln!("step     {step:>8.3} s   total {total:.3} s");
    if let Some(s) = control_seconds {
        eprintln!(
            "control  {:>8.3} s   per step, the ControlNet's hints (part of the step above)",
            s / steps as f64
        );
    }
}

/// Runs one request on `source` (`--runs` times) and writes the PNG.
fn generate<S: ModelSource>(
    source: S,
    dtype: Dtype,
    a: GenerateArgs,
    inputs: Option<Inputs>,
    control: Option<Control>,
) -> anyhow::Result<ExitCode> {
    let model_name = source.name();
    let identity = source.identity();
    let mut pipeline = Pipeline::new(source, dtype, a.runs > 1)?;
    let control_spec = match control {
        Some(c) => {
            pipeline.set_controlnet(Some(c.net))?;
            Some(c.spec)
        }
        None => None,
    };
    let sample = pipeline.configs.vae.sample_size.unwrap_or(1024);
    // Without --width/--height an input picture gives the size, rounded as diffusers rounds it.
    let cell = 2 * pipeline.configs.vae.scale_factor() as u32;
    let (default_w, default_h) = match &inputs {
        Some(i) => {
            image_in::default_size(i.image.width(), i.image.height(), cell).ok_or_else(|| {
                anyhow!(
                    "--image is {}×{}; a picture needs at least {cell} pixels each way",
                    i.image.width(),
                    i.image.height()
                )
            })?
        }
        None => match control_spec.as_ref().map(|c| &c.image) {
            Some(c) => image_in::default_size(c.width(), c.height(), cell).ok_or_else(|| {
                anyhow!(
                    "--control is {}×{}; a control image needs at least {cell} pixels each way",
                    c.width(),
                    c.height()
                )
            })?,
            None => (sample, sample),
        },
    };
    let mut req = Request {
        prompt: a.prompt.clone(),
        negative_prompt: a.negative.clone(),
        width: a.width.unwrap_or(default_w),
        height: a.height.unwrap_or(default_h),
        steps: a.steps,
        guidance: a.guidance,
        seed: a.seed,
        noise: None,
        input: None,
    };
    pipeline.validate(&req)?;
    if let Some(i) = &inputs {
        let strength = a.strength.unwrap_or(if i.mask.is_some() {
            pipeline::condition::DEFAULT_INPAINT_STRENGTH
        } else {
            pipeline::condition::DEFAULT_STRENGTH
        });
        req.input = Some(pipeline::ImageInput {
            rgb: image_in::picture(&i.image, req.width, req.height).into_raw(),
            mask: i
                .mask
                .as_ref()
                .map(|m| image_in::mask(m, req.width, req.height)),
            strength,
        });
    }
    pipeline.validate(&req)?;
    if let Some(path) = &a.noise {
        req.noise = Some(read_noise(path, pipeline.latent_shape(&req))?);
        pipeline.validate(&req)?;
    }
    let control = control_spec.map(|c| c.input(req.width, req.height));
    if let Some(c) = &control {
        pipeline.validate_control(&req, c)?;
    }
    let adapters = pipeline.load_adapters(&a.loras, a.lora_lenient)?;
    for applied in &adapters.applied {
        if !applied.skipped.is_empty() {
            eprintln!(
                "note: LoRA `{}`: skipped {} keys that fit no layout or name no layer of the model (first: `{}`)",
                applied.file.display(),
                applied.skipped.len(),
                applied.skipped[0].escape_debug()
            );
        }
    }
    if !adapters.applied.is_empty() {
        pipeline.set_adapters(adapters);
    }
    let plan = plan_memory(&pipeline, &req, a.memory_limit.as_deref(), a.weights)?;
    pipeline.set_residency(plan.residency);
    pipeline.set_tiling(plan.tiling);

    let bar = ProgressBar::new(req.steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:30}] {pos}/{len} steps {elapsed}")
            .expect("valid template"),
    );
    let verbose = a.verbose;
    let mut run = 1;
    let out = loop {
        bar.reset();
        let out = pipeline.generate_controlled(&req, control.as_ref(), &mut |p| {
            match p {
                Progress::Phase(name) => bar.set_message(name),
                Progress::Step { index, .. } => bar.set_position(index as u64),
            }
            ControlFlow::Continue(())
        });
        bar.finish_and_clear();
        let out = out?;
        if run == a.runs {
            break out;
        }
        if verbose {
            eprintln!("run {run} of {}:", a.runs);
            print_phases(&out.phases, steps_run(&req), out.control_seconds);
        }
        run += 1;
    };

    let steered = generation::ControlProvenance::of(&pipeline, control.as_ref());
    let (parameters, request_json) = generation::png_text_controlled(
        &req,
        &generation::Provenance {
            model_name: &model_name,
            identity: &identity,
            dtype,
            noise_file: a.noise.as_deref(),
            loras: &pipeline.adapters().applied,
            shift: pipeline.configs.scheduler.shift,
        },
        steered.as_ref(),
    );
    image_out::write_png(
        &a.output,
        &out.rgb,
        out.width,
        out.height,
        &[
            (image_out::PARAMETERS_KEY, &parameters),
            (image_out::ZIMAGE_KEY, &request_json),
        ],
    )?;
    if verbose {
        if a.runs > 1 {
            eprintln!("run {run} of {}:", a.runs);
        }
        print_phases(&out.phases, steps_run(&req), out.control_seconds);
        let e = &plan.estimate;
        eprintln!(
            "memory   weights {}, decode {}; estimate: text {}, encode {}, denoise {}, decode {}, process {}",
            match plan.residency {
                Residency::Compute => "in the compute dtype",
                Residency::Stored => "as stored",
                Residency::Streamed => "streamed from the store, one block at a time",
            },
            match &plan.tiling {
                Some(t) => format!("in tiles of {} latent pixels", t.tile_latent),
                None => "whole".into(),
            },
            gb(e.text),
            gb(e.encode),
            gb(e.denoise),
            gb(e.decode),
            gb(e.base)
        );
        for p in &out.phases {
            let estimated = match p.phase {
                "text" => e.text,
                "encode" => e.encode,
                "denoise" => e.denoise,
                "decode" => e.decode,
                _ => continue,
            };
            eprintln!(
                "estimate {:<8} {:>8.1} MB   MLX peak {:>8.1} MB ({:+.1}%)",
                p.phase,
                estimated as f64 / 1e6,
                p.peak_bytes as f64 / 1e6,
                (estimated as f64 / (p.peak_bytes as f64).max(1.0) - 1.0) * 100.0
            );
        }
        if pipeline.controlnet().is_some() {
            let sizes = pipeline.tensor_sizes()?;
            let held = pipeline
                .model_sizes(&sizes)
                .controlnet_weights(plan.residency, dtype.size_bytes() as u64);
            eprintln!(
                "memory   the denoise estimate holds the ControlNet's weights, {}",
                gb(held)
            );
        }
        let measured = zimage::platform::peak_resident_bytes().unwrap_or(0);
        eprintln!(
            "peak RSS {} measured, {} estimated ({:+.1}%), budget {}",
            gb(measured),
            gb(e.peak()),
            (e.peak() as f64 / measured.max(1) as f64 - 1.0) * 100.0,
            gb(plan.budget)
        );
    }
    let wrote = format!(
        "wrote {} ({}×{}, {} steps, seed {})",
        a.output.display(),
        out.width,
        out.height,
        req.steps,
        req.seed
    );
    // A PNG written to stdout (`-o /dev/stdout`) must not be followed by text there.
    if is_stdout(&a.output) {
        eprintln!("{wrote}");
    } else {
        println!("{wrote}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `path` is the file this process's stdout writes to.
fn is_stdout(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        let stdout = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map(std::fs::File::from)
            .and_then(|f| f.metadata());
        match (std::fs::metadata(path), stdout) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}
