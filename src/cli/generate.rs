//! `zimage generate`: flags → a generation job → PNG files.
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{mpsc, Arc};
use zimage::diffusers_dir::DiffusersDir;
use zimage::generation::{
    self, Cancel, ControlJob, ControlNetChoice, Engine, Hires, Job, ModelChoice, Picture,
    PictureInput,
};
use zimage::image_in;
use zimage::memory_plan::gb;
use zimage::mlx::fast::Products;
use zimage::mlx::Dtype;
use zimage::models::Residency;
use zimage::preview::Preview;
use zimage::store::{ImportOptions, Store};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// The prompt.
    pub prompt: String,
    /// Stored model to use, or a diffusers directory (default: the first image model in the store,
    /// else the embedded demo model).
    #[arg(long)]
    pub model: Option<String>,
    /// Image width in pixels (a multiple of the model's token cell, 16 for the real models, up to
    /// 8192; default: the model's VAE sample size).
    #[arg(long, allow_negative_numbers = true)]
    pub width: Option<u32>,
    /// Image height in pixels (a multiple of the model's token cell, 16 for the real models, up to
    /// 8192; default: the model's VAE sample size).
    #[arg(long, allow_negative_numbers = true)]
    pub height: Option<u32>,
    /// Denoising steps, 1 to 1000 (default: the model's recorded default, else 8 as for Turbo).
    #[arg(long, allow_negative_numbers = true)]
    pub steps: Option<usize>,
    /// Seed of the initial noise (drawn as torch's CPU generator draws it).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Classifier-free guidance scale, ≥ 0; 0 turns it off (default: the model's recorded
    /// default, else 0 as for Turbo).
    #[arg(long, allow_hyphen_values = true)]
    pub guidance: Option<f32>,
    /// Negative prompt, used when guidance > 0 (default: the model's recorded one, if any).
    #[arg(long)]
    pub negative: Option<String>,
    /// With guidance, cap each step's guided prediction at the norm of the prompt's own
    /// (diffusers' `cfg_normalization`).
    #[arg(long)]
    pub cfg_normalization: bool,
    /// With guidance, run unguided once the model time (0 at pure noise, 1 at the end) passes
    /// F, within [0, 1] (diffusers' `cfg_truncation`; default 1: guided throughout).
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub cfg_truncation: Option<f64>,
    /// True classifier-free guidance for a guidance-distilled model: a second prediction from
    /// --negative each step, mixed at this scale (> 1; 1 is off).
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    pub true_cfg: Option<f32>,
    /// Output PNG; with --count N the images are numbered (`zimage-1.png` … `zimage-N.png`).
    #[arg(long, short, default_value = "zimage.png")]
    pub output: PathBuf,
    /// How many images, the k-th drawn from seed + k − 1; the model loads once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=generation::MAX_COUNT as i64))]
    pub count: u32,
    /// A hires pass: the image made at the requested size, upscaled this many times in pixel
    /// space (Lanczos-3), then reworked by image-to-image at the larger size (e.g. 1.5 or 2).
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    pub hires_scale: Option<f32>,
    /// How far the hires pass takes the upscaled picture back toward noise, in (0, 1]
    /// (default 0.7).
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub hires_strength: Option<f64>,
    /// The hires pass's schedule length (default: --steps); as in image-to-image, only the last
    /// steps × strength of them run.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub hires_steps: Option<usize>,
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
    /// Memory the run may use, e.g. 12GB (default: ZIMAGE_MEMORY_LIMIT, else the GPU's
    /// recommended working set or free memory, else 85% of the machine's memory). A request
    /// estimated above it is refused before anything loads, naming the smallest that works.
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
    /// A reference picture to edit from (models that take references; repeat for up to 4).
    /// Each is scaled to at most 1024² pixels and centre-cropped to the model's token cell; without
    /// `--width/--height` the output takes the first one's size.
    #[arg(long = "ref", value_name = "FILE")]
    pub references: Vec<PathBuf>,
    /// Start from this picture (PNG, JPEG or WebP) instead of noise: image-to-image, or with
    /// `--mask` inpainting. Without `--width/--height` the output takes its size, each side
    /// rounded down to a multiple of the model's token cell; another size is reached by Pillow's
    /// Lanczos resize, as diffusers resizes it.
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
    /// With --mask: inpaint only the masked area, with PADDING pixels around it (default 32),
    /// cut out and made at the full --width×--height, then pasted back; the picture outside
    /// the mask stays exactly as it was (A1111's "Inpaint area: Only masked").
    #[arg(long, value_name = "PADDING", num_args = 0..=1, default_missing_value = "32")]
    pub only_masked: Option<u32>,
    /// A control image (PNG, JPEG or WebP: a pose, an edge or depth map, a line drawing) whose
    /// layout --controlnet holds while the prompt paints. It is encoded by the VAE; without
    /// --width/--height (or --image) the output takes its size, each side rounded down to a
    /// multiple of 16. With --image and --mask: ControlNet inpainting (a 2.x ControlNet).
    #[arg(long, value_name = "CONTROL.png")]
    pub control: Option<PathBuf>,
    /// The ControlNet that reads --control: a stored name, a diffusers directory,
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
    /// Write each denoising step's latents as a small PNG to this file (replaced atomically
    /// each step), one pixel per latent cell; the final image is the same with or without.
    #[arg(long, value_name = "FILE.png")]
    pub preview: Option<PathBuf>,
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

impl WeightsArg {
    fn residency(self) -> Option<Residency> {
        match self {
            WeightsArg::Auto => None,
            WeightsArg::Compute => Some(Residency::Compute),
            WeightsArg::Stored => Some(Residency::Stored),
            WeightsArg::Streamed => Some(Residency::Streamed),
        }
    }
}

/// The embedded demo model (random weights), shipped in the source tree.
const DEMO_NAME: &str = "zimage/z-image-tiny:demo";

/// The model to run: `--model` (a diffusers directory, or a stored name), else an image model
/// in the store, else the demo imported into a small store of its own (so the user's store is
/// left alone); and whether it is the demo.
fn resolve_model(
    store: Option<&Path>,
    requested: Option<&str>,
) -> anyhow::Result<(ModelChoice, bool)> {
    if let Some(dir) = requested.map(Path::new).filter(|p| p.is_dir()) {
        return Ok((ModelChoice::Directory(dir.to_path_buf()), false));
    }
    let user_store = Store::locate(store)?;
    if let Some(name) = requested {
        return Ok((
            ModelChoice::Stored {
                store: user_store,
                name: name.to_string(),
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
        let is_zimage =
            m.name.short() != DEMO_NAME && generation::check_image_model(&user_store, &m).is_ok();
        if is_zimage {
            return Ok((
                ModelChoice::Stored {
                    name: m.name.to_string(),
                    store: user_store,
                },
                false,
            ));
        }
    }
    let cache = zimage::platform::cache_dir()
        .context("cannot place the demo store: set ZIMAGE_CACHE_DIR or HOME")?;
    let demo_store = Store::at(&cache.join("demo-store"));
    let intact = demo_store.open(DEMO_NAME).is_ok()
        && demo_store
            .verify(DEMO_NAME)
            .map(|r| r.problems.is_empty())
            .unwrap_or(false);
    if !intact {
        let dir = DiffusersDir::open(&super::demo::unpacked(&cache)?)?;
        demo_store.create(DEMO_NAME, &dir, &ImportOptions::default(), &|_| {})?;
    }
    Ok((
        ModelChoice::Stored {
            store: demo_store,
            name: DEMO_NAME.to_string(),
        },
        true,
    ))
}

/// Checks the combinations of flags that only the command line has, before anything is read.
fn check_flags(a: &GenerateArgs) -> anyhow::Result<()> {
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
        if a.only_masked.is_some() {
            bail!("--only-masked needs --image and --mask: it inpaints the area the mask marks");
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
    if a.hires_scale.is_none() && (a.hires_strength.is_some() || a.hires_steps.is_some()) {
        bail!("--hires-strength and --hires-steps need --hires-scale: how much larger the second pass is");
    }
    if a.count > 1 && a.noise.is_some() {
        bail!("--count with --noise: every image would start from the same latents; leave one out");
    }
    Ok(())
}

/// Refuses an output path that can never be written, before any work: a directory, or a
/// file in a folder that does not exist.
fn check_output(path: &Path, flag: &str) -> anyhow::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        bail!(
            "{flag} `{}` is a directory; give the path of a PNG file",
            path.display()
        );
    }
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if std::fs::symlink_metadata(path).is_err() && !folder.is_dir() {
        bail!(
            "{flag} `{}`: folder `{}` does not exist; create it first",
            path.display(),
            folder.display()
        );
    }
    Ok(())
}

/// The picture a flag names, decoded from the bytes read and checked against the budget.
fn decode_picture(path: &Path, flag: &str, bytes: &[u8]) -> anyhow::Result<Picture> {
    // The error names the flag and the file already.
    let image = image_in::decode(bytes, flag, &path.to_string_lossy())?;
    Ok(Picture {
        image,
        label: format!("{flag} `{}`", zimage::shown::path(path)),
    })
}

/// `--controlnet`: a directory or file when one is there, else a name in the store.
fn controlnet_choice(store: Option<&Path>, arg: &str) -> anyhow::Result<ControlNetChoice> {
    let path = Path::new(arg);
    if std::fs::symlink_metadata(path).is_ok() {
        return Ok(ControlNetChoice::Path(path.to_path_buf()));
    }
    Ok(ControlNetChoice::Stored {
        store: Store::locate(store)?,
        name: arg.to_string(),
    })
}

/// The job the flags describe, without its pictures.
fn settings(a: &GenerateArgs, model: ModelChoice) -> Job {
    Job {
        negative_prompt: a.negative.clone(),
        width: a.width,
        height: a.height,
        steps: a.steps,
        guidance: a.guidance,
        // The flag turns it on; left out, the model's default holds.
        cfg_normalization: a.cfg_normalization.then_some(true),
        cfg_truncation: a.cfg_truncation,
        true_cfg: a.true_cfg,
        seed: a.seed,
        count: a.count,
        noise: a.noise.clone(),
        loras: a.loras.clone(),
        lora_lenient: a.lora_lenient,
        memory_limit: a.memory_limit.clone(),
        residency: a.weights.residency(),
        hires: a.hires_scale.map(|scale| Hires {
            scale,
            strength: a.hires_strength.unwrap_or(Hires::DEFAULT_STRENGTH),
            steps: a.hires_steps,
        }),
        preview: a.preview.is_some(),
        ..Job::new(model, a.prompt.clone())
    }
}

/// `--control` with `--controlnet` and `--control-scale`, its picture decoded already.
fn read_control(
    store: Option<&Path>,
    a: &GenerateArgs,
    image: Option<Picture>,
) -> anyhow::Result<Option<ControlJob>> {
    let (Some(image), Some(net)) = (image, &a.controlnet) else {
        return Ok(None);
    };
    Ok(Some(ControlJob {
        image,
        net: controlnet_choice(store, net)?,
        scale: a
            .control_scale
            .unwrap_or(zimage::generation::DEFAULT_CONTROL_SCALE),
    }))
}

/// Every input picture (`--image`, `--mask`, `--control`, each `--ref`), each file read once
/// and all their headers weighed together against the budget before one is decoded; then
/// decoded, in that order.
fn read_pictures(a: &GenerateArgs) -> anyhow::Result<Vec<Picture>> {
    let mut files: Vec<(&Path, &str)> = [
        (&a.image, "--image"),
        (&a.mask, "--mask"),
        (&a.control, "--control"),
    ]
    .into_iter()
    .filter_map(|(p, what)| p.as_deref().map(|p| (p, what)))
    .collect();
    files.extend(a.references.iter().map(|p| (p.as_path(), "--ref")));
    let contents = zimage::input_budget::read_files(&files, a.memory_limit.as_deref())?;
    (files.iter().zip(&contents))
        .map(|(&(path, flag), bytes)| decode_picture(path, flag, bytes))
        .collect()
}

pub fn run(store: Option<PathBuf>, a: GenerateArgs) -> anyhow::Result<ExitCode> {
    check_flags(&a)?;
    // Every bound is checked before a file is read or the model found.
    let mut job = settings(&a, ModelChoice::Directory(PathBuf::new()));
    job.check()?;
    check_output(&a.output, "--output")?;
    if let Some(preview) = &a.preview {
        check_output(preview, "--preview")?;
    }
    // In the order `read_pictures` reads them; `check_flags` saw each flag has its partner.
    let mut pictures = read_pictures(&a)?.into_iter();
    let mut next = |given: bool| given.then(|| pictures.next()).flatten();
    job.input = next(a.image.is_some()).map(|picture| PictureInput {
        picture,
        mask: next(a.mask.is_some()),
        strength: a.strength,
        only_masked: a.only_masked,
    });
    let control = next(a.control.is_some());
    job.references = pictures.collect();
    job.control = read_control(store.as_deref(), &a, control)?;
    job.check()?;
    let (model, demo) = resolve_model(store.as_deref(), a.model.as_deref())?;
    job.model = model;
    zimage::platform::use_default_device()?;
    zimage::platform::prepare_device_memory();
    if let Some(dir) =
        zimage::platform::kernels_compile_first(zimage::mlx::runtime::kernel_cache_dir().as_deref())
    {
        eprintln!("{}", zimage::platform::first_compile_note(&dir));
    }
    a.products.apply();
    let dtype = a.dtype.map(|d| match d {
        ComputeDtype::Bf16 => Dtype::BF16,
        ComputeDtype::F32 => Dtype::F32,
    });
    if demo {
        eprintln!("note: no image model in the store; running the embedded demo model, whose weights are random");
    }
    let keep_models = a.runs > 1 || a.count > 1 || a.hires_scale.is_some();
    let mut engine = Engine::new(dtype, keep_models);
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} steps {elapsed}")
            .expect("valid template"),
    );
    let mut outcome = None;
    let mut preview_file = preview_target(a.preview.as_deref()).map(PreviewFile::start);
    job.preview = preview_file.is_some();
    for run in 1..=a.runs {
        bar.reset();
        let out = generation::run(
            &job,
            &mut engine,
            &mut |p| {
                let label = match p.images {
                    1 => p.phase.to_string(),
                    n => format!("{} {}/{n}", p.phase, p.image),
                };
                bar.set_message(label);
                bar.set_length(p.steps as u64);
                bar.set_position(p.step as u64);
                if let (Some(file), Some(preview)) = (preview_file.as_mut(), &p.preview) {
                    file.send(preview);
                }
            },
            &Cancel::new(),
        );
        bar.finish_and_clear();
        let out = out?;
        if run == 1 {
            note_skipped_lora_keys(&out.loras);
            for note in &out.notes {
                eprintln!("warning: {note}");
            }
        }
        if a.verbose && a.runs > 1 {
            eprintln!("run {run} of {}:", a.runs);
        }
        if a.verbose && (run < a.runs || a.runs > 1) {
            for image in &out.images {
                print_phases(image);
            }
        }
        outcome = Some(out);
    }
    if let Some(e) = preview_file.and_then(PreviewFile::finish) {
        eprintln!("warning: --preview: {e}; the images are written all the same");
    }
    let out = outcome.expect("at least one run");
    let paths = output_paths(&a.output, out.images.len());
    for (image, path) in out.images.iter().zip(&paths) {
        zimage::files::write_output(path, &image.png)?;
    }
    if a.verbose {
        if a.runs == 1 {
            for image in &out.images {
                print_phases(image);
            }
        }
        print_memory(&out);
    }
    for (image, path) in out.images.iter().zip(&paths) {
        let wrote = format!(
            "wrote {} ({}×{}, {} steps, seed {})",
            path.display(),
            image.width,
            image.height,
            image.steps,
            image.seed
        );
        // A PNG written to stdout (`-o /dev/stdout`) must not be followed by text there.
        if is_stdout(path) {
            eprintln!("{wrote}");
        } else {
            println!("{wrote}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Where `--preview`'s pictures go: the file itself, or a link's target. A FIFO, a device or
/// another special file cannot take a picture per step without making a step wait for its
/// reader, so it is given up, with a warning, and the images are made all the same.
fn preview_target(preview: Option<&Path>) -> Option<PathBuf> {
    match zimage::files::output_path(preview?) {
        Ok(at) => Some(at),
        Err(e) => {
            eprintln!("warning: --preview: {e}; no previews are written, the images are");
            None
        }
    }
}

/// `--preview`'s file, written on a thread of its own with the newest step's picture, so that
/// no step waits for the disk.
struct PreviewFile {
    sender: mpsc::Sender<Arc<Preview>>,
    writer: std::thread::JoinHandle<Option<String>>,
    last: Option<Arc<Preview>>,
}

impl PreviewFile {
    fn start(path: PathBuf) -> PreviewFile {
        let (sender, pictures) = mpsc::channel::<Arc<Preview>>();
        let writer = std::thread::spawn(move || {
            let mut failed = None;
            while let Ok(mut picture) = pictures.recv() {
                // Steps that came while the last was written are passed over for the newest.
                while let Ok(newer) = pictures.try_recv() {
                    picture = newer;
                }
                // Replaced, never written into: a special file put there since the start is
                // refused rather than waited on.
                if let Err(e) = zimage::files::replace_regular(&path, &picture.png()) {
                    failed.get_or_insert(e.to_string());
                }
            }
            failed
        });
        PreviewFile {
            sender,
            writer,
            last: None,
        }
    }

    /// Queues `preview` unless it is the one queued last (phases repeat the step's).
    fn send(&mut self, preview: &Arc<Preview>) {
        if self.last.as_ref().is_some_and(|l| Arc::ptr_eq(l, preview)) {
            return;
        }
        self.last = Some(preview.clone());
        let _ = self.sender.send(preview.clone());
    }

    /// Waits for the last picture to be written; the first write that failed, if any.
    fn finish(self) -> Option<String> {
        drop(self.sender);
        self.writer
            .join()
            .unwrap_or(Some("the writer stopped".into()))
    }
}

/// Where each image goes: `output` itself for one, else `stem-1.png` … `stem-N.png` beside it.
fn output_paths(output: &Path, count: usize) -> Vec<PathBuf> {
    if count == 1 {
        return vec![output.to_path_buf()];
    }
    let stem = output
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "zimage".into());
    let ext = output
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_else(|| "png".into());
    (1..=count)
        .map(|k| output.with_file_name(format!("{stem}-{k}.{ext}")))
        .collect()
}

fn note_skipped_lora_keys(loras: &[zimage::lora::Applied]) {
    for applied in loras {
        if !applied.skipped.is_empty() {
            eprintln!(
                "note: LoRA `{}`: skipped {} keys that fit no layout or name no layer of the model (first: `{}`)",
                applied.file.display(),
                applied.skipped.len(),
                applied.skipped[0].escape_debug()
            );
        }
    }
}

/// Each phase's time and peak memory, then the mean step and the total, and the part of a step
/// the ControlNet's hints took.
fn print_phases(image: &generation::Image) {
    for p in &image.phases {
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
    let steps = image.steps_run.max(1);
    let step = image.seconds("denoise").as_secs_f64() / steps as f64;
    let total: f64 = image.phases.iter().map(|p| p.seconds).sum();
    eprintln!("step     {step:>8.3} s   total {total:.3} s");
    if let Some(s) = image.control_seconds {
        eprintln!(
            "control  {:>8.3} s   per step, the ControlNet's hints (part of the step above)",
            s / steps as f64
        );
    }
}

/// How the weights were held and decoded, the estimate beside the measured peak.
fn print_memory(out: &generation::Outcome) {
    let plan = &out.plan;
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
    if let Some(limit) = plan.cache_limit {
        eprintln!(
            "memory   MLX keeps at most {} of freed buffers for reuse within a phase",
            gb(limit)
        );
    }
    if let Some(image) = out.images.last() {
        for p in &image.phases {
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
    }
    if let Some(held) = out.controlnet_weights {
        eprintln!(
            "memory   the denoise estimate holds the ControlNet's weights, {}",
            gb(held)
        );
    }
    let measured = zimage::platform::peak_resident_bytes().unwrap_or(0);
    eprintln!(
        "peak RSS {} measured, {} estimated ({:+.1}%), budget {}{}",
        gb(measured),
        gb(e.peak()),
        (e.peak() as f64 / measured.max(1) as f64 - 1.0) * 100.0,
        gb(plan.budget),
        plan.budget_source
    );
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
