//! Writing .zt files the way crate 1.0.0 writes them: the magic, each component at the next
//! multiple of 64 after zero padding, in the order tensors are added, then the CBOR manifest and
//! its size. Tensors stream to disk one at a time; only the manifest is held until the end.
//!
//! The file is written under a temporary name in the target folder, synced, then renamed, so a
//! crash never leaves a partial file under the final name.

use super::cbor;
use super::digest::{Digest, Hasher};
use super::read::first_repeat;
use super::{numel, Error, ZDtype, ALIGNMENT, GENERATOR, MAGIC, VERSION};
use crate::files::TempFile;
use std::collections::BTreeMap;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// Which digest each component gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    None,
    /// `crc32c:0x…`, what crate 1.0.0 writes and verifies.
    Crc32c,
    /// `sha256:…`, named by the spec; crate 1.0.0 reads such files but does not verify them.
    Sha256,
}

impl Checksum {
    pub fn name(self) -> &'static str {
        match self {
            Checksum::None => "none",
            Checksum::Crc32c => "crc32c",
            Checksum::Sha256 => "sha256",
        }
    }
    fn hasher(self) -> Hasher {
        match self {
            Checksum::None => Hasher::None,
            Checksum::Crc32c => Hasher::like(Some(&Digest::Crc32c(0))),
            Checksum::Sha256 => Hasher::like(Some(&Digest::Sha256([0; 32]))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// zstd (level 3, one frame per component) instead of raw bytes.
    pub compress: bool,
    pub checksum: Checksum,
    /// File-level text attributes.
    pub attributes: BTreeMap<String, String>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            compress: false,
            checksum: Checksum::Crc32c,
            attributes: BTreeMap::new(),
        }
    }
}

/// zstd level of compressed components (crate 1.0.0 asks for the library default, which is 3).
const ZSTD_LEVEL: i32 = 3;

struct StoredComponent {
    offset: u64,
    length: u64,
    zstd: bool,
    digest: Option<Digest>,
}

struct StoredTensor {
    dtype: ZDtype,
    shape: Vec<u64>,
    format: &'static str,
    components: BTreeMap<&'static str, StoredComponent>,
}

/// A .zt file being written.
pub struct Writer {
    path: PathBuf,
    /// Where the file lands: `path`, or the file a symlink at `path` points to.
    target: PathBuf,
    out: BufWriter<TempFile>,
    pos: u64,
    opts: WriteOptions,
    tensors: BTreeMap<String, StoredTensor>,
}

impl Writer {
    /// Starts a file that will appear at `path` when [`Writer::finish`] succeeds.
    pub fn create(path: &Path, opts: WriteOptions) -> Result<Writer, Error> {
        let target = crate::files::output_path(path).map_err(|e| Error::Invalid {
            path: path.to_path_buf(),
            reason: format!("cannot write a .zt file here: {e}"),
        })?;
        let tmp = TempFile::beside(&target, ".zimage-zt-").map_err(Error::io(path))?;
        let mut out = BufWriter::with_capacity(1 << 20, tmp);
        out.write_all(MAGIC).map_err(Error::io(path))?;
        Ok(Writer {
            path: path.to_path_buf(),
            target,
            out,
            pos: MAGIC.len() as u64,
            opts,
            tensors: BTreeMap::new(),
        })
    }

    fn bad(&self, tensor: &str, reason: String) -> Error {
        Error::Tensor {
            path: self.path.clone(),
            tensor: tensor.to_string(),
            reason,
        }
    }

    fn check_new(&self, name: &str, shape: &[u64], dtype: ZDtype) -> Result<u64, Error> {
        if self.tensors.contains_key(name) {
            return Err(self.bad(name, "is added twice; tensor names must be unique".into()));
        }
        numel(shape)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| self.bad(name, format!("shape {shape:?} overflows 64 bits of bytes")))
    }

    /// Adds a dense tensor from its little-endian bytes. A tensor refused here leaves the file
    /// consistent; after an I/O error the writer should be dropped (nothing reaches `path`).
    pub fn add_dense(
        &mut self,
        name: &str,
        dtype: ZDtype,
        shape: &[u64],
        data: &[u8],
    ) -> Result<(), Error> {
        self.add_dense_from(name, dtype, shape, &mut &data[..])
    }

    /// Adds a dense tensor whose little-endian bytes `reader` yields: exactly the shape's size
    /// is read, in chunks, so a tensor never has to be in memory whole.
    pub fn add_dense_from(
        &mut self,
        name: &str,
        dtype: ZDtype,
        shape: &[u64],
        reader: &mut dyn Read,
    ) -> Result<(), Error> {
        let len = self.check_new(name, shape, dtype)?;
        let data = self.write_component(name, &mut reader.take(len), len)?;
        self.insert(name, dtype, shape, "dense", vec![("data", data)]);
        Ok(())
    }

    /// Adds a dense tensor whose little-endian bytes `fill` writes: exactly the shape's size must
    /// be written. For sources that push bytes (a decoder) rather than being read.
    pub fn add_dense_with(
        &mut self,
        name: &str,
        dtype: ZDtype,
        shape: &[u64],
        fill: &mut dyn FnMut(&mut dyn Write) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let len = self.check_new(name, shape, dtype)?;
        let data = self.write_component_with(name, len, fill)?;
        self.insert(name, dtype, shape, "dense", vec![("data", data)]);
        Ok(())
    }

    /// Adds a 2-D CSR tensor: `values` little-endian, `indices` the column of each value,
    /// `indptr` where each row's values start (rows + 1 entries).
    pub fn add_csr(
        &mut self,
        name: &str,
        dtype: ZDtype,
        shape: &[u64],
        values: &[u8],
        indices: &[u64],
        indptr: &[u64],
    ) -> Result<(), Error> {
        self.check_new(name, shape, dtype)?;
        let [rows, cols] = shape[..] else {
            return Err(self.bad(name, format!("sparse_csr needs a 2-D shape, got {shape:?}")));
        };
        let nnz = self.check_values(name, dtype, shape, values)?;
        if indices.len() as u64 != nnz || indptr.len() as u64 != rows.saturating_add(1) {
            let want = format!(
                "needs {nnz} indices and {} indptr entries",
                rows.saturating_add(1)
            );
            return Err(self.bad(
                name,
                format!("{want}, got {} and {}", indices.len(), indptr.len()),
            ));
        }
        if indptr[0] != 0 || indptr[rows as usize] != nnz || indptr.windows(2).any(|w| w[1] < w[0])
        {
            return Err(self.bad(name, format!("indptr must rise from 0 to {nnz}")));
        }
        let mut places = Vec::with_capacity(indices.len());
        for r in 0..rows as usize {
            for &col in &indices[indptr[r] as usize..indptr[r + 1] as usize] {
                if col >= cols {
                    return Err(self.bad(
                        name,
                        format!("row {r}: column {col} is outside the {cols} columns"),
                    ));
                }
                // Below rows × cols, which `check_new` found to fit in 64 bits.
                places.push(r as u64 * cols + col);
            }
        }
        if let Some(at) = first_repeat(&mut places) {
            let (r, col) = (at / cols, at % cols);
            return Err(self.bad(name, format!("row {r}: column {col} is repeated")));
        }
        let v = self.write_component(name, &mut &values[..], values.len() as u64)?;
        let i = self.write_component(name, &mut &le_bytes(indices)[..], nnz * 8)?;
        let p = self.write_component(name, &mut &le_bytes(indptr)[..], indptr.len() as u64 * 8)?;
        self.insert(
            name,
            dtype,
            shape,
            "sparse_csr",
            vec![("values", v), ("indices", i), ("indptr", p)],
        );
        Ok(())
    }

    /// Adds a COO tensor: `coords` holds all dim-0 indices, then all dim-1 indices, …
    pub fn add_coo(
        &mut self,
        name: &str,
        dtype: ZDtype,
        shape: &[u64],
        values: &[u8],
        coords: &[u64],
    ) -> Result<(), Error> {
        self.check_new(name, shape, dtype)?;
        let nnz = self.check_values(name, dtype, shape, values)?;
        if coords.len() as u64 != nnz * shape.len() as u64 {
            let (dims, got) = (shape.len(), coords.len());
            return Err(self.bad(
                name,
                format!(
                    "needs {} coords ({nnz} values × {dims} dims), got {got}",
                    nnz * dims as u64
                ),
            ));
        }
        let mut places = Vec::with_capacity(nnz as usize);
        for k in 0..nnz as usize {
            let mut at = 0;
            for (d, &dim) in shape.iter().enumerate() {
                let i = coords[d * nnz as usize + k];
                if i >= dim {
                    return Err(self.bad(
                        name,
                        format!("value {k}: index {i} is outside dimension {d} of size {dim}"),
                    ));
                }
                at = at * dim + i;
            }
            places.push(at);
        }
        if let Some(at) = first_repeat(&mut places) {
            return Err(self.bad(
                name,
                format!("two values share the coordinate at element {at}"),
            ));
        }
        let v = self.write_component(name, &mut &values[..], values.len() as u64)?;
        let c = self.write_component(name, &mut &le_bytes(coords)[..], coords.len() as u64 * 8)?;
        self.insert(
            name,
            dtype,
            shape,
            "sparse_coo",
            vec![("values", v), ("coords", c)],
        );
        Ok(())
    }

    fn check_values(
        &self,
        name: &str,
        dtype: ZDtype,
        shape: &[u64],
        values: &[u8],
    ) -> Result<u64, Error> {
        let n = values.len() as u64;
        if !n.is_multiple_of(dtype.size()) || n / dtype.size() > numel(shape).unwrap_or(0) {
            return Err(self.bad(
                name,
                format!(
                    "{n} value bytes are not a whole number of at most numel {} values",
                    dtype.name()
                ),
            ));
        }
        Ok(n / dtype.size())
    }

    fn insert(
        &mut self,
        name: &str,
        dtype: ZDtype,
        shape: &[u64],
        format: &'static str,
        comps: Vec<(&'static str, StoredComponent)>,
    ) {
        let components = comps.into_iter().collect();
        self.tensors.insert(
            name.to_string(),
            StoredTensor {
                dtype,
                shape: shape.to_vec(),
                format,
                components,
            },
        );
    }

    /// Pads to the next multiple of 64, then streams `len` bytes from `data`, compressing and
    /// hashing the stored bytes on the way.
    fn write_component(
        &mut self,
        tensor: &str,
        data: &mut dyn Read,
        len: u64,
    ) -> Result<StoredComponent, Error> {
        let path = self.path.clone();
        self.write_component_with(tensor, len, &mut |out| {
            std::io::copy(data, out)
                .map(|_| ())
                .map_err(Error::io(&path))
        })
    }

    /// Pads to the next multiple of 64, then stores what `fill` writes, which must be `len`
    /// bytes, compressing and hashing the stored bytes on the way.
    fn write_component_with(
        &mut self,
        tensor: &str,
        len: u64,
        fill: &mut dyn FnMut(&mut dyn Write) -> Result<(), Error>,
    ) -> Result<StoredComponent, Error> {
        let io = Error::io(&self.path);
        let pad = self.pos.next_multiple_of(ALIGNMENT) - self.pos;
        self.out
            .write_all(&[0u8; ALIGNMENT as usize][..pad as usize])
            .map_err(&io)?;
        let offset = self.pos + pad;
        let mut sink = Sink {
            out: &mut self.out,
            hasher: self.opts.checksum.hasher(),
            written: 0,
        };
        let (copied, filled) = if self.opts.compress {
            let mut enc = zstd::stream::write::Encoder::new(&mut sink, ZSTD_LEVEL).map_err(&io)?;
            let mut counted = Counted {
                out: &mut enc,
                n: 0,
            };
            let filled = fill(&mut counted);
            let n = counted.n;
            enc.finish().map_err(&io)?;
            (n, filled)
        } else {
            let mut counted = Counted {
                out: &mut sink,
                n: 0,
            };
            let filled = fill(&mut counted);
            (counted.n, filled)
        };
        let (length, digest) = (sink.written, sink.hasher.finish());
        // Whatever happens next, later components must start past these bytes.
        self.pos = offset + length;
        filled?;
        if copied != len {
            return Err(self.bad(
                tensor,
                format!("the source gave {copied} bytes, {len} expected (truncated input?)"),
            ));
        }
        Ok(StoredComponent {
            offset,
            length,
            zstd: self.opts.compress,
            digest,
        })
    }

    /// Writes the manifest and its size, syncs, and moves the file into place. Returns the
    /// file's size.
    pub fn finish(mut self) -> Result<u64, Error> {
        let io = Error::io(&self.path);
        let manifest = self.manifest();
        self.out.write_all(&manifest).map_err(&io)?;
        self.out
            .write_all(&(manifest.len() as u64).to_le_bytes())
            .map_err(&io)?;
        let tmp = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        tmp.as_file().sync_all().map_err(&io)?;
        tmp.persist(&self.target).map_err(|e| io(e.error))?;
        Ok(self.pos + manifest.len() as u64 + 8)
    }

    /// The manifest in crate 1.0.0's key order: root `version, generator, attributes, tensors`;
    /// tensor `dtype, shape, format, components`; component `offset, length[, encoding][, digest]`;
    /// map keys (names, roles, attributes) sorted bytewise.
    fn manifest(&self) -> Vec<u8> {
        let mut m = Vec::new();
        cbor::map(&mut m, 4);
        cbor::text(&mut m, "version");
        cbor::text(&mut m, VERSION);
        cbor::text(&mut m, "generator");
        cbor::text(&mut m, GENERATOR);
        cbor::text(&mut m, "attributes");
        cbor::map(&mut m, self.opts.attributes.len());
        for (k, v) in &self.opts.attributes {
            cbor::text(&mut m, k);
            cbor::text(&mut m, v);
        }
        cbor::text(&mut m, "tensors");
        cbor::map(&mut m, self.tensors.len());
        for (name, t) in &self.tensors {
            cbor::text(&mut m, name);
            cbor::map(&mut m, 4);
            cbor::text(&mut m, "dtype");
            cbor::text(&mut m, t.dtype.name());
            cbor::text(&mut m, "shape");
            cbor::array(&mut m, t.shape.len());
            for &d in &t.shape {
                cbor::uint(&mut m, d);
            }
            cbor::text(&mut m, "format");
            cbor::text(&mut m, t.format);
            cbor::text(&mut m, "components");
            cbor::map(&mut m, t.components.len());
            for (role, c) in &t.components {
                cbor::text(&mut m, role);
                cbor::map(&mut m, 2 + c.zstd as usize + c.digest.is_some() as usize);
                cbor::text(&mut m, "offset");
                cbor::uint(&mut m, c.offset);
                cbor::text(&mut m, "length");
                cbor::uint(&mut m, c.length);
                if c.zstd {
                    cbor::text(&mut m, "encoding");
                    cbor::text(&mut m, "zstd");
                }
                if let Some(d) = &c.digest {
                    cbor::text(&mut m, "digest");
                    cbor::text(&mut m, &d.text());
                }
            }
        }
        m
    }
}

/// The file as a component's bytes reach it: counted and hashed.
struct Sink<'a> {
    out: &'a mut BufWriter<TempFile>,
    hasher: Hasher,
    written: u64,
}

impl Write for Sink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// A writer that counts what passes through it.
struct Counted<'a> {
    out: &'a mut dyn Write,
    n: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

fn le_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
