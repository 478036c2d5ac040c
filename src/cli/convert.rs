//! `zimage convert IN OUT`: safetensors ↔ zTensor v1.0, one tensor at a time.
//!
//! The input's format is told by its content, the output's by its extension. Safetensors
//! `__metadata__` and zTensor attributes carry over to each other; sparse zTensor tensors are
//! written dense. Outputs appear atomically (a temporary file in the target folder, synced, then
//! renamed).

use anyhow::{bail, Context};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zimage::formats::ztensor::{self, Checksum, WriteOptions, ZDtype, ZtFile};
use zimage::formats::FileKind;
use zimage::safetensors::{self, Dtype, Header, TensorSpec};

/// The checksums a zTensor file may carry per component.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChecksumArg {
    None,
    Crc32c,
    Sha256,
}

#[derive(clap::Args, Debug)]
pub struct ConvertArgs {
    /// The file to read: safetensors or zTensor v1.0 (told by its content).
    pub input: PathBuf,
    /// The file to write: `.zt` or `.safetensors` (told by its extension).
    pub output: PathBuf,
    /// Compress every tensor with zstd (.zt output only).
    #[arg(long)]
    pub compress: bool,
    /// Digest stored with every component (.zt output only) [default: crc32c].
    #[arg(long, value_name = "ALGO", value_enum)]
    pub checksum: Option<ChecksumArg>,
}

/// One tensor of the input, as the output sees it.
struct Item {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    nbytes: u64,
    /// Where a safetensors tensor's bytes start in the file (unused for zTensor).
    offset: u64,
}

enum Input {
    Safetensors {
        path: PathBuf,
        file: File,
        header: Header,
    },
    ZTensor(ZtFile),
}

impl Input {
    fn open(path: &Path) -> anyhow::Result<Input> {
        let kind = FileKind::of_file(path).with_context(|| format!("`{}`", path.display()))?;
        match kind {
            FileKind::Safetensors => {
                let header = safetensors::read_header_file(path)?;
                let (file, _) = zimage::files::open_regular(path)?;
                Ok(Input::Safetensors {
                    path: path.to_path_buf(),
                    file,
                    header,
                })
            }
            FileKind::ZTensor => {
                let zt = ZtFile::open(path)?;
                // Every tensor that must be decoded is checked against the limit before
                // anything is written.
                for t in zt.tensors() {
                    if zt.raw_dense_range(t).is_none() {
                        zt.check_dense_limit(t)?;
                    }
                }
                Ok(Input::ZTensor(zt))
            }
            other => bail!(
                "`{}` is {}; `convert` reads safetensors and zTensor v1.0 files",
                path.display(),
                other.describe()
            ),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Input::Safetensors { .. } => "safetensors",
            Input::ZTensor(_) => "zTensor",
        }
    }

    /// Tensors in the order the input stores them, so that reads run forward through it.
    fn items(&self) -> Vec<Item> {
        match self {
            Input::Safetensors { header, .. } => {
                let mut ts: Vec<_> = header.tensors.iter().collect();
                ts.sort_by_key(|t| (t.data_offsets.0, t.data_offsets.1));
                ts.into_iter()
                    .map(|t| Item {
                        name: t.name.clone(),
                        dtype: t.dtype,
                        shape: t.shape.clone(),
                        nbytes: t.nbytes(),
                        offset: header.data_start() + t.data_offsets.0,
                    })
                    .collect()
            }
            Input::ZTensor(zt) => zt
                .tensors()
                .map(|t| Item {
                    name: t.name.clone(),
                    dtype: t.dtype.safetensors(),
                    shape: t.shape.clone(),
                    nbytes: t.dense_len,
                    offset: 0,
                })
                .collect(),
        }
    }

    fn metadata(&self) -> Option<BTreeMap<String, String>> {
        match self {
            Input::Safetensors { header, .. } => header.metadata.clone(),
            Input::ZTensor(zt) => Some(zt.attributes().clone()).filter(|a| !a.is_empty()),
        }
    }

    fn warnings(&self) -> &[String] {
        match self {
            Input::Safetensors { .. } => &[],
            Input::ZTensor(zt) => zt.warnings(),
        }
    }

    /// Writes one tensor's dense little-endian bytes to `out`.
    fn copy(&self, item: &Item, out: &mut dyn Write) -> anyhow::Result<()> {
        match self {
            Input::Safetensors { path, file, .. } => {
                let io = || format!("`{}`: tensor `{}`", path.display(), item.name);
                let mut reader = st_range(file, item).with_context(io)?;
                let n = std::io::copy(&mut reader, out).with_context(io)?;
                if n != item.nbytes {
                    bail!(
                        "`{}`: tensor `{}` is cut short ({n} of {} bytes); the file is truncated",
                        path.display(),
                        item.name,
                        item.nbytes
                    );
                }
                Ok(())
            }
            Input::ZTensor(zt) => Ok(zt.copy_dense(&item.name, out)?),
        }
    }
}

/// A safetensors tensor's bytes, read forward from its offset.
fn st_range<'a>(mut file: &'a File, item: &Item) -> std::io::Result<impl Read + 'a> {
    file.seek(SeekFrom::Start(item.offset))?;
    // A buffer no larger than the tensor: a file of many small tensors makes no large
    // allocation per tensor.
    let capacity = item.nbytes.clamp(8 << 10, 1 << 20) as usize;
    Ok(std::io::BufReader::with_capacity(capacity, file).take(item.nbytes))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Output {
    Safetensors,
    ZTensor,
}

fn output_kind(path: &Path) -> anyhow::Result<Output> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("zt") => Ok(Output::ZTensor),
        Some("safetensors") => Ok(Output::Safetensors),
        _ => bail!(
            "`{}`: cannot tell the output format; name it `*.zt` or `*.safetensors`",
            path.display()
        ),
    }
}

pub fn run(a: ConvertArgs) -> anyhow::Result<ExitCode> {
    let out_kind = output_kind(&a.output)?;
    if out_kind == Output::Safetensors && (a.compress || a.checksum.is_some()) {
        bail!("`--compress` and `--checksum` apply to .zt output only; drop them or name the output `*.zt`");
    }
    let checksum = match a.checksum.unwrap_or(ChecksumArg::Crc32c) {
        ChecksumArg::None => Checksum::None,
        ChecksumArg::Crc32c => Checksum::Crc32c,
        ChecksumArg::Sha256 => Checksum::Sha256,
    };
    let input = Input::open(&a.input)?;
    for w in input.warnings() {
        eprintln!("warning: `{}`: {w}", a.input.display());
    }
    let items = input.items();
    let size = match out_kind {
        Output::ZTensor => write_zt(
            &input,
            &items,
            &a.output,
            WriteOptions {
                compress: a.compress,
                checksum,
                attributes: input.metadata().unwrap_or_default(),
            },
        )?,
        Output::Safetensors => write_safetensors(&input, &items, &a.output)?,
    };
    let how = match out_kind {
        Output::ZTensor => format!(
            ", {}, {}",
            if a.compress { "zstd" } else { "raw" },
            checksum.name()
        ),
        Output::Safetensors => String::new(),
    };
    let data = items
        .iter()
        .fold(0u64, |sum, i| sum.saturating_add(i.nbytes));
    println!(
        "converted {} `{}` to `{}`: {} tensors, {} of data, {} written{how}",
        input.kind(),
        a.input.display(),
        a.output.display(),
        items.len(),
        super::store::human(data),
        super::store::human(size),
    );
    Ok(ExitCode::SUCCESS)
}

fn write_zt(input: &Input, items: &[Item], path: &Path, opts: WriteOptions) -> anyhow::Result<u64> {
    // Every dtype is checked before anything is written.
    let dtypes = items
        .iter()
        .map(|i| {
            ZDtype::from_safetensors(i.dtype).ok_or_else(|| ztensor::Error::UnsupportedDtype {
                path: input_path(input),
                tensor: i.name.clone(),
                dtype: i.dtype,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut w = ztensor::Writer::create(path, opts)?;
    for (item, dtype) in items.iter().zip(dtypes) {
        match input {
            Input::Safetensors { file, .. } => {
                let mut reader = st_range(file, item)
                    .with_context(|| format!("`{}`", input_path(input).display()))?;
                w.add_dense_from(&item.name, dtype, &item.shape, &mut reader)?;
            }
            // Streamed one tensor at a time; a digest mismatch fails the whole output.
            Input::ZTensor(zt) => w.add_dense_with(&item.name, dtype, &item.shape, &mut |out| {
                zt.copy_dense(&item.name, out)
            })?,
        }
    }
    Ok(w.finish()?)
}

fn write_safetensors(input: &Input, items: &[Item], path: &Path) -> anyhow::Result<u64> {
    let specs: Vec<TensorSpec> = items
        .iter()
        .map(|i| TensorSpec {
            name: i.name.clone(),
            dtype: i.dtype,
            shape: i.shape.clone(),
        })
        .collect();
    let header = safetensors::header_bytes(&specs, input.metadata().as_ref(), 8)
        .map_err(|e| e.in_file(path))?;
    let io = |e: std::io::Error| anyhow::anyhow!("`{}`: {e}", path.display());
    let target = zimage::files::output_path(path)?;
    let tmp = zimage::files::TempFile::beside(&target, ".zimage-st-").map_err(io)?;
    let mut out = BufWriter::with_capacity(1 << 20, tmp);
    out.write_all(&header).map_err(io)?;
    let mut size = header.len() as u64;
    for item in items {
        input.copy(item, &mut out)?;
        size += item.nbytes;
    }
    let tmp = out.into_inner().map_err(|e| io(e.into_error()))?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(&target).map_err(|e| io(e.error))?;
    Ok(size)
}

fn input_path(input: &Input) -> PathBuf {
    match input {
        Input::Safetensors { path, .. } => path.clone(),
        Input::ZTensor(zt) => zt.path().to_path_buf(),
    }
}
