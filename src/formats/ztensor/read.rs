//! Opening a .zt file: the manifest is read and every structural rule checked up front (magic,
//! manifest bounds here; version, dtypes, shapes, component ranges and sizes, overlap in
//! `manifest.rs`); digests are checked and data decoded when a tensor's bytes are asked for.
//!
//! Data is read with positioned reads, never mapped: a file shortened under us gives an I/O
//! error rather than a crash, and only the bytes asked for are read.

use super::digest::{Digest, Hasher};
use super::{Error, ZDtype, MAGIC};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Largest manifest we read into memory (the 1.1 spec's limit; v1.0 names none).
pub const MAX_MANIFEST_SIZE: u64 = 1 << 30;
/// Chunk size of streamed copies and digest checks.
const CHUNK: usize = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Raw,
    Zstd,
}

/// A byte range of the file that holds one part of a tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    pub offset: u64,
    /// Stored bytes (compressed size when zstd).
    pub length: u64,
    pub encoding: Encoding,
    /// `None` when absent or of an algorithm the spec does not name (see [`ZtFile::warnings`]).
    pub digest: Option<Digest>,
}

/// How a tensor's components make up its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    Dense {
        data: Component,
    },
    /// Rows of a 2-D tensor; `indices` and `indptr` are u64 LE.
    Csr {
        values: Component,
        indices: Component,
        indptr: Component,
    },
    /// `coords` is u64 LE, all dim-0 indices first, then dim 1, …
    Coo {
        values: Component,
        coords: Component,
    },
    /// A format later writers may add (the spec allows it without a version change): listed,
    /// but not decoded.
    Other {
        format: String,
        components: BTreeMap<String, Component>,
    },
}

impl Layout {
    pub fn format(&self) -> &str {
        match self {
            Layout::Dense { .. } => "dense",
            Layout::Csr { .. } => "sparse_csr",
            Layout::Coo { .. } => "sparse_coo",
            Layout::Other { format, .. } => format,
        }
    }

    /// `(role, component)` pairs.
    pub fn components(&self) -> Vec<(&str, &Component)> {
        match self {
            Layout::Dense { data } => vec![("data", data)],
            Layout::Csr {
                values,
                indices,
                indptr,
            } => vec![("values", values), ("indices", indices), ("indptr", indptr)],
            Layout::Coo { values, coords } => vec![("values", values), ("coords", coords)],
            Layout::Other { components, .. } => {
                components.iter().map(|(r, c)| (r.as_str(), c)).collect()
            }
        }
    }
}

/// One tensor of the manifest, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    pub name: String,
    pub dtype: ZDtype,
    /// `[]` is a scalar.
    pub shape: Vec<u64>,
    pub numel: u64,
    /// Bytes of the dense little-endian data (`numel × dtype size`).
    pub dense_len: u64,
    pub layout: Layout,
}

/// An open, validated .zt file.
#[derive(Debug)]
pub struct ZtFile {
    pub(super) path: PathBuf,
    file: File,
    pub(super) version: String,
    pub(super) generator: String,
    pub(super) attributes: BTreeMap<String, String>,
    pub(super) tensors: BTreeMap<String, TensorMeta>,
    pub(super) warnings: Vec<String>,
}

impl ZtFile {
    /// Opens `path` and checks its structure; reads the manifest only.
    pub fn open(path: &Path) -> Result<ZtFile, Error> {
        let io = Error::io(path);
        let (file, file_len) = crate::files::open_regular(path).map_err(|e| Error::Invalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let bad = |reason: String| Error::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        // Magic (8) + manifest size (8) is the least a file can be.
        if file_len < 16 {
            return Err(bad(format!(
                "file is {file_len} bytes, too short for a zTensor file (truncated?)"
            )));
        }
        let mut magic = [0u8; 8];
        file.read_exact_at(&mut magic, 0).map_err(&io)?;
        if &magic != MAGIC {
            return Err(bad(format!(
                "does not start with `ZTEN1000` (found {:?}); it is not a zTensor v1.0 file",
                String::from_utf8_lossy(&magic)
            )));
        }
        let mut size = [0u8; 8];
        file.read_exact_at(&mut size, file_len - 8).map_err(&io)?;
        let manifest_size = u64::from_le_bytes(size);
        // The spec writes `manifest_size < FILE_SIZE - 16`, but a file with no tensors is exactly
        // magic + manifest + size, so equality must pass (crate 1.0.0 accepts it and writes it).
        if manifest_size > file_len - 16 {
            return Err(bad(format!(
                "manifest size {manifest_size} runs past the start of the {file_len}-byte file (truncated or not a zTensor file)"
            )));
        }
        if manifest_size > MAX_MANIFEST_SIZE {
            return Err(bad(format!(
                "manifest size {manifest_size} exceeds the {MAX_MANIFEST_SIZE}-byte limit"
            )));
        }
        let manifest_start = file_len - 8 - manifest_size;
        let mut cbor = vec![0u8; manifest_size as usize];
        file.read_exact_at(&mut cbor, manifest_start).map_err(&io)?;

        let mut out = ZtFile {
            path: path.to_path_buf(),
            file,
            version: String::new(),
            generator: String::new(),
            attributes: BTreeMap::new(),
            tensors: BTreeMap::new(),
            warnings: Vec::new(),
        };
        out.parse_manifest(&cbor, manifest_start)?;
        out.check_overlap()?;
        Ok(out)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn version(&self) -> &str {
        &self.version
    }
    pub fn generator(&self) -> &str {
        &self.generator
    }
    pub fn attributes(&self) -> &BTreeMap<String, String> {
        &self.attributes
    }
    /// Tensors sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorMeta> {
        self.tensors.values()
    }
    pub fn len(&self) -> usize {
        self.tensors.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
    pub fn tensor(&self, name: &str) -> Result<&TensorMeta, Error> {
        self.tensors.get(name).ok_or_else(|| Error::NotFound {
            path: self.path.clone(),
            tensor: name.to_string(),
        })
    }
    /// Things a reader should hear about but that do not stop it: a newer minor version, a
    /// digest of an unknown algorithm (its component is read unverified).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// A raw dense tensor's `(offset, length)` in the file: its bytes can be used in place.
    pub fn raw_dense_range(&self, t: &TensorMeta) -> Option<(u64, u64)> {
        match &t.layout {
            Layout::Dense { data } if data.encoding == Encoding::Raw => {
                Some((data.offset, data.length))
            }
            _ => None,
        }
    }

    /// Streams a tensor's dense little-endian bytes to `out`: a raw dense tensor as stored
    /// (its digest checked at the end: on a mismatch the caller must discard what was written),
    /// any other decoded without holding its dense form in memory. A compressed or sparse
    /// tensor is refused when its dense size is over [`max_dense_bytes`], before anything is
    /// written.
    pub fn copy_dense(&self, name: &str, out: &mut dyn Write) -> Result<(), Error> {
        let t = self.tensor(name)?;
        let Some((offset, length)) = self.raw_dense_range(t) else {
            return self.copy_decoded(t, out);
        };
        let Layout::Dense { data } = &t.layout else {
            unreachable!("raw_dense_range is dense only")
        };
        let mut hasher = Hasher::like(data.digest.as_ref());
        let mut buf = vec![0u8; CHUNK.min(length as usize)];
        let mut at = offset;
        while at < offset + length {
            let n = (offset + length - at).min(buf.len() as u64) as usize;
            self.file
                .read_exact_at(&mut buf[..n], at)
                .map_err(Error::io(&self.path))?;
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(Error::io(&self.path))?;
            at += n as u64;
        }
        self.check_digest(t, "data", data.digest.as_ref(), hasher)
    }

    /// Checks the digests of every component of every tensor without decoding anything.
    pub fn verify(&self) -> Result<(), Error> {
        for t in self.tensors.values() {
            for (role, c) in t.layout.components() {
                self.check_stored(t, role, c)?;
            }
        }
        Ok(())
    }

    /// A tensor's dense little-endian bytes: decompressed, digests checked, sparse tensors
    /// scattered into zeros. A compressed or sparse tensor is bounded by [`max_dense_bytes`].
    pub fn read_dense(&self, name: &str) -> Result<Vec<u8>, Error> {
        let t = self.tensor(name)?;
        if self.raw_dense_range(t).is_none() {
            self.check_dense_limit(t)?;
        }
        let len = usize::try_from(t.dense_len).map_err(|_| Error::Tensor {
            path: self.path.clone(),
            tensor: t.name.clone(),
            reason: "too large for this machine's memory".into(),
        })?;
        let mut out = Vec::with_capacity(len);
        self.copy_dense(name, &mut out)?;
        Ok(out)
    }

    /// Refuses to decode a tensor whose dense form is larger than the user allows
    /// ([`max_dense_bytes`]).
    pub fn check_dense_limit(&self, t: &TensorMeta) -> Result<(), Error> {
        let limit = max_dense_bytes().map_err(|reason| Error::Invalid {
            path: self.path.clone(),
            reason,
        })?;
        if t.dense_len > limit {
            return Err(Error::Tensor {
                path: self.path.clone(),
                tensor: t.name.clone(),
                reason: format!(
                    "its {} form of shape {:?} ({}) is {} bytes, more than the {limit} bytes zimage decodes for one tensor; set {MAX_DENSE_BYTES_VAR} to a larger number of bytes to allow it",
                    t.layout.format(),
                    t.shape,
                    t.dtype.name(),
                    t.dense_len
                ),
            });
        }
        Ok(())
    }

    /// A compressed dense or a sparse tensor, written out dense.
    fn copy_decoded(&self, t: &TensorMeta, out: &mut dyn Write) -> Result<(), Error> {
        self.check_dense_limit(t)?;
        let size = t.dtype.size();
        let bad = |reason: String| Error::Tensor {
            path: self.path.clone(),
            tensor: t.name.clone(),
            reason,
        };
        match &t.layout {
            Layout::Dense { data } => self.copy_zstd(t, "data", data, out),
            Layout::Csr {
                values,
                indices,
                indptr,
            } => {
                let (rows, cols) = (t.shape[0], t.shape[1]);
                let vals = self.decoded(t, "values", values, t.dense_len, None)?;
                check_values_len(t, vals.len() as u64)
                    .map_err(|r| self.component_error(t, "values", r))?;
                let nnz = vals.len() as u64 / size;
                let idx_len = nnz
                    .checked_mul(8)
                    .ok_or_else(|| bad(format!("{nnz} values overflow the indices size")))?;
                let idx = u64s(self.decoded(t, "indices", indices, idx_len, Some(idx_len))?);
                let ptr_len = rows
                    .checked_add(1)
                    .and_then(|r| r.checked_mul(8))
                    .ok_or_else(|| bad(format!("{rows} rows overflow the indptr size")))?;
                let ptr = u64s(self.decoded(t, "indptr", indptr, ptr_len, Some(ptr_len))?);
                let cerr = |role: &str, r: String| self.component_error(t, role, r);
                if ptr[0] != 0 || ptr[rows as usize] != nnz {
                    return Err(cerr(
                        "indptr",
                        format!(
                            "must run from 0 to the {nnz} values, runs from {} to {}",
                            ptr[0], ptr[rows as usize]
                        ),
                    ));
                }
                // Rising from 0 to nnz keeps every row's range inside `indices`.
                if let Some(r) = ptr.windows(2).position(|w| w[1] < w[0]) {
                    return Err(cerr(
                        "indptr",
                        format!("decreases at row {r} ({} then {})", ptr[r], ptr[r + 1]),
                    ));
                }
                let mut places = Vec::with_capacity(idx.len());
                for r in 0..rows as usize {
                    for k in ptr[r]..ptr[r + 1] {
                        let col = idx[k as usize];
                        if col >= cols {
                            return Err(cerr(
                                "indices",
                                format!(
                                    "column {col} at position {k} is outside the {cols} columns"
                                ),
                            ));
                        }
                        places.push((r as u64 * cols + col, k));
                    }
                }
                let repeat = |at: u64| {
                    let (r, col) = (at / cols, at % cols);
                    cerr("indices", format!("row {r} lists column {col} twice"))
                };
                write_scattered(t, places, &vals, out, repeat).map_err(|e| self.write_error(e))
            }
            Layout::Coo { values, coords } => {
                let ndim = t.shape.len() as u64;
                let vals = self.decoded(t, "values", values, t.dense_len, None)?;
                check_values_len(t, vals.len() as u64)
                    .map_err(|r| self.component_error(t, "values", r))?;
                let nnz = vals.len() as u64 / size;
                let want = nnz
                    .checked_mul(ndim)
                    .and_then(|n| n.checked_mul(8))
                    .ok_or_else(|| {
                        bad(format!(
                            "{nnz} values × {ndim} dimensions overflow the coords size"
                        ))
                    })?;
                let coords = u64s(self.decoded(t, "coords", coords, want, Some(want))?);
                let mut places = Vec::with_capacity(nnz as usize);
                for k in 0..nnz {
                    let mut at = 0u64;
                    for (d, &dim) in t.shape.iter().enumerate() {
                        let i = coords[(d as u64 * nnz + k) as usize];
                        if i >= dim {
                            return Err(self.component_error(
                                t,
                                "coords",
                                format!(
                                    "index {i} of value {k} is outside dimension {d} of size {dim}"
                                ),
                            ));
                        }
                        // Below numel, which fits in 64 bits: no overflow.
                        at = at * dim + i;
                    }
                    places.push((at, k));
                }
                let repeat = |at: u64| {
                    let mut index = vec![0u64; t.shape.len()];
                    let mut rest = at;
                    for (slot, &dim) in index.iter_mut().zip(&t.shape).rev() {
                        *slot = rest % dim;
                        rest /= dim;
                    }
                    self.component_error(
                        t,
                        "coords",
                        format!("coordinate {index:?} is given twice"),
                    )
                };
                write_scattered(t, places, &vals, out, repeat).map_err(|e| self.write_error(e))
            }
            Layout::Other { format, .. } => Err(bad(format!(
                "format `{format}` is not one zimage can decode (dense, sparse_csr, sparse_coo)"
            ))),
        }
    }

    fn write_error(&self, e: Scatter) -> Error {
        match e {
            Scatter::Repeat(e) => e,
            Scatter::Io(e) => Error::io(&self.path)(e),
        }
    }

    /// A zstd dense component, streamed: its stored bytes' digest is checked first, then it is
    /// decoded to exactly the tensor's dense size (a stream that would give more is refused
    /// after that many bytes, so a small file cannot inflate without bound).
    fn copy_zstd(
        &self,
        t: &TensorMeta,
        role: &str,
        c: &Component,
        out: &mut dyn Write,
    ) -> Result<(), Error> {
        self.check_stored(t, role, c)?;
        let damaged = |e: std::io::Error| {
            self.component_error(t, role, format!("zstd data is damaged ({e})"))
        };
        let stored = At {
            file: &self.file,
            at: c.offset,
            end: c.offset + c.length,
        };
        let mut decoder = zstd::stream::read::Decoder::new(stored).map_err(&damaged)?;
        let mut buf = vec![0u8; CHUNK.min(t.dense_len.max(1) as usize)];
        let mut written = 0u64;
        while written < t.dense_len {
            let want = (t.dense_len - written).min(buf.len() as u64) as usize;
            let n = match decoder.read(&mut buf[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(damaged(e)),
            };
            out.write_all(&buf[..n]).map_err(Error::io(&self.path))?;
            written += n as u64;
        }
        let more = written == t.dense_len && decoder.read(&mut [0u8; 1]).map_err(&damaged)? > 0;
        if written != t.dense_len || more {
            let got = if more {
                format!("more than {}", t.dense_len)
            } else {
                written.to_string()
            };
            return Err(self.component_error(
                t,
                role,
                format!(
                    "decodes to {got} bytes, but {} are needed (shape {:?} of {})",
                    t.dense_len,
                    t.shape,
                    t.dtype.name()
                ),
            ));
        }
        Ok(())
    }

    /// Checks a component's digest by streaming its stored bytes.
    fn check_stored(&self, t: &TensorMeta, role: &str, c: &Component) -> Result<(), Error> {
        if c.digest.is_none() {
            return Ok(());
        }
        let mut hasher = Hasher::like(c.digest.as_ref());
        let mut buf = vec![0u8; CHUNK.min(c.length as usize)];
        let mut at = c.offset;
        while at < c.offset + c.length {
            let n = (c.offset + c.length - at).min(buf.len() as u64) as usize;
            self.file
                .read_exact_at(&mut buf[..n], at)
                .map_err(Error::io(&self.path))?;
            hasher.update(&buf[..n]);
            at += n as u64;
        }
        self.check_digest(t, role, c.digest.as_ref(), hasher)
    }

    fn component_error(&self, t: &TensorMeta, role: &str, reason: String) -> Error {
        Error::Component {
            path: self.path.clone(),
            tensor: t.name.clone(),
            component: role.to_string(),
            reason,
        }
    }

    /// The stored bytes of a component, digest checked.
    fn stored_bytes(&self, t: &TensorMeta, role: &str, c: &Component) -> Result<Vec<u8>, Error> {
        let len = usize::try_from(c.length).map_err(|_| {
            self.component_error(t, role, "too large for this machine's memory".into())
        })?;
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, c.offset)
            .map_err(Error::io(&self.path))?;
        let mut hasher = Hasher::like(c.digest.as_ref());
        hasher.update(&buf);
        self.check_digest(t, role, c.digest.as_ref(), hasher)?;
        Ok(buf)
    }

    fn check_digest(
        &self,
        t: &TensorMeta,
        role: &str,
        want: Option<&Digest>,
        hasher: Hasher,
    ) -> Result<(), Error> {
        match (want, hasher.finish()) {
            (Some(want), Some(got)) if *want != got => Err(Error::DigestMismatch {
                path: self.path.clone(),
                tensor: t.name.clone(),
                component: role.to_string(),
                expected: want.text(),
                actual: got.text(),
            }),
            _ => Ok(()),
        }
    }

    /// A component's decoded bytes: at most `limit` (so that a small compressed blob cannot
    /// expand without bound), exactly `exact` when given.
    fn decoded(
        &self,
        t: &TensorMeta,
        role: &str,
        c: &Component,
        limit: u64,
        exact: Option<u64>,
    ) -> Result<Vec<u8>, Error> {
        let max = max_dense_bytes().map_err(|reason| Error::Invalid {
            path: self.path.clone(),
            reason,
        })?;
        if c.encoding == Encoding::Zstd && exact.unwrap_or(limit) > max {
            return Err(self.component_error(
                t,
                role,
                format!(
                    "would decode to {} bytes, more than the {max} bytes zimage decodes for one tensor; set {MAX_DENSE_BYTES_VAR} to a larger number of bytes to allow it",
                    exact.unwrap_or(limit)
                ),
            ));
        }
        let stored = self.stored_bytes(t, role, c)?;
        let bytes = match c.encoding {
            Encoding::Raw => stored,
            Encoding::Zstd => {
                let decoder = zstd::stream::read::Decoder::new(&stored[..]).map_err(|e| {
                    self.component_error(t, role, format!("cannot start zstd decoding: {e}"))
                })?;
                let mut out = Vec::new();
                decoder
                    .take(limit.saturating_add(1))
                    .read_to_end(&mut out)
                    .map_err(|e| {
                        self.component_error(t, role, format!("zstd data is damaged ({e})"))
                    })?;
                if out.len() as u64 > limit {
                    return Err(self.component_error(
                        t,
                        role,
                        format!("decompresses to more than the {limit} bytes the tensor can hold"),
                    ));
                }
                out
            }
        };
        match exact {
            Some(n) if bytes.len() as u64 != n => Err(self.component_error(
                t,
                role,
                format!(
                    "decodes to {} bytes, but {n} are needed (shape {:?} of {})",
                    bytes.len(),
                    t.shape,
                    t.dtype.name()
                ),
            )),
            _ => Ok(bytes),
        }
    }
}

pub(super) fn check_values_len(t: &TensorMeta, len: u64) -> Result<(), String> {
    if !len.is_multiple_of(t.dtype.size()) {
        return Err(format!(
            "holds {len} bytes, not a whole number of {} values",
            t.dtype.name()
        ));
    }
    if len > t.dense_len {
        return Err(format!(
            "holds {} values, more than the {} elements of shape {:?}",
            len / t.dtype.size(),
            t.numel,
            t.shape
        ));
    }
    Ok(())
}

/// Why scattering sparse values stopped.
enum Scatter {
    /// Two values at one position: whether they add up or overwrite would be a guess.
    Repeat(Error),
    Io(std::io::Error),
}

/// Writes the dense form of a sparse tensor: zeros, with value `k` at element `at` for each
/// `(at, k)` of `places`. Sorting the places first keeps memory to the values and their places,
/// however large the dense form; a place given twice is refused through `repeat`.
fn write_scattered(
    t: &TensorMeta,
    mut places: Vec<(u64, u64)>,
    vals: &[u8],
    out: &mut dyn Write,
    repeat: impl Fn(u64) -> Error,
) -> Result<(), Scatter> {
    places.sort_unstable();
    if let Some(w) = places.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Scatter::Repeat(repeat(w[0].0)));
    }
    let size = t.dtype.size();
    let mut written = 0u64;
    for (at, k) in places {
        // `at` is below numel and `k` below nnz, so these products stay under the sizes
        // already checked.
        let start = at * size;
        write_zeros(out, start - written).map_err(Scatter::Io)?;
        let k = (k * size) as usize;
        out.write_all(&vals[k..k + size as usize])
            .map_err(Scatter::Io)?;
        written = start + size;
    }
    write_zeros(out, t.dense_len - written).map_err(Scatter::Io)
}

fn write_zeros(out: &mut dyn Write, mut n: u64) -> std::io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// A byte range of a file as a reader, with positioned reads (the file's cursor is shared).
struct At<'a> {
    file: &'a File,
    at: u64,
    end: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.end - self.at).min(buf.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..n], self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// How many bytes one tensor may decode to when nothing else is said: compressed and sparse
/// tensors are written out dense, and a small file can declare any size.
pub const DEFAULT_MAX_DENSE_BYTES: u64 = 4 << 30;
/// The environment variable that raises (or lowers) [`DEFAULT_MAX_DENSE_BYTES`].
pub const MAX_DENSE_BYTES_VAR: &str = "ZIMAGE_MAX_DENSE_BYTES";

/// The most bytes one compressed or sparse tensor may decode to: `ZIMAGE_MAX_DENSE_BYTES`, or
/// [`DEFAULT_MAX_DENSE_BYTES`].
pub fn max_dense_bytes() -> Result<u64, String> {
    match std::env::var(MAX_DENSE_BYTES_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_MAX_DENSE_BYTES),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("{MAX_DENSE_BYTES_VAR} is `{v}`, not a whole number of bytes")),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!(
            "{MAX_DENSE_BYTES_VAR} is {v:?}, not a whole number of bytes"
        )),
    }
}

fn u64s(bytes: Vec<u8>) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunks")))
        .collect()
}

/// The first place given twice among `places`, which are sorted in place.
pub(super) fn first_repeat(places: &mut [u64]) -> Option<u64> {
    places.sort_unstable();
    places.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}
