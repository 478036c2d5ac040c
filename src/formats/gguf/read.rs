//! Reading and checking a GGUF header: every count and length is held against the bytes left
//! in the file before anything is allocated for it.

use super::*;
use std::collections::HashSet;
use std::io::Read;

/// Most values in one array: a tokenizer's vocabulary is a few hundred thousand.
const MAX_ARRAY_LEN: u64 = 1 << 24;

/// The most memory the metadata of one file may take once read (values and their strings):
/// a tokenizer's vocabulary and merges take a few tens of MB; a file of millions of one-byte
/// array values would otherwise take some thirty times its size.
pub const MAX_METADATA_MEMORY: u64 = 256 << 20;

/// A reader that knows how many bytes the file has left, and how much memory the values read
/// so far take.
struct Bounded<R> {
    inner: R,
    pos: u64,
    len: u64,
    held: u64,
}

impl<R: Read> Bounded<R> {
    /// Counts `bytes` more of memory held by the metadata, refusing past the cap.
    fn hold(&mut self, bytes: u64, field: &dyn Fn() -> String) -> Result<()> {
        self.held = self.held.saturating_add(bytes);
        if self.held > MAX_METADATA_MEMORY {
            return Err(Error::TooMany {
                field: format!("{} (bytes of memory the metadata takes read)", field()),
                count: self.held,
                limit: MAX_METADATA_MEMORY,
            });
        }
        Ok(())
    }

    fn need(&self, n: u64, field: &dyn Fn() -> String) -> Result<()> {
        if self.len.saturating_sub(self.pos) < n {
            return Err(Error::Truncated {
                field: field(),
                at: self.pos,
                needed: n,
                file_len: self.len,
            });
        }
        Ok(())
    }

    fn left(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn array<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N]> {
        self.need(N as u64, field)?;
        let mut b = [0u8; N];
        self.inner.read_exact(&mut b)?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A length-prefixed UTF-8 string of at most `max` bytes.
    fn string(&mut self, max: u64, field: &dyn Fn() -> String) -> Result<String> {
        let n = self.u64(field)?;
        if n > max {
            return Err(Error::TooMany {
                field: format!("{} (string length)", field()),
                count: n,
                limit: max,
            });
        }
        self.need(n, field)?;
        let mut b = vec![0u8; n as usize];
        self.inner.read_exact(&mut b)?;
        self.pos += n;
        String::from_utf8(b).map_err(|e| Error::Invalid {
            field: field(),
            reason: format!("is not UTF-8 ({e})"),
        })
    }

    fn value(&mut self, type_id: u32, depth: u32, field: &dyn Fn() -> String) -> Result<Value> {
        Ok(match type_id {
            0 => Value::U8(self.array::<1>(field)?[0]),
            1 => Value::I8(self.array::<1>(field)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            4 => Value::U32(self.u32(field)?),
            5 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            7 => match self.array::<1>(field)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(Error::Invalid {
                        field: field(),
                        reason: format!("a bool must be 0 or 1, got {b}"),
                    })
                }
            },
            8 => {
                let text = self.string(self.left(), field)?;
                self.hold(text.len() as u64, field)?;
                Value::String(text)
            }
            9 => self.array_value(depth, field)?,
            10 => Value::U64(self.u64(field)?),
            11 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            id => {
                return Err(Error::Invalid {
                    field: field(),
                    reason: format!("unknown value type {id}"),
                })
            }
        })
    }

    fn array_value(&mut self, depth: u32, field: &dyn Fn() -> String) -> Result<Value> {
        if depth >= MAX_NESTING {
            return Err(Error::TooMany {
                field: format!("{} (array nesting)", field()),
                count: u64::from(depth) + 1,
                limit: u64::from(MAX_NESTING),
            });
        }
        let type_id = self.u32(field)?;
        let count = self.u64(field)?;
        let min_size = match type_id {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            id => {
                return Err(Error::Invalid {
                    field: field(),
                    reason: format!("array of unknown value type {id}"),
                })
            }
        };
        if count > MAX_ARRAY_LEN {
            return Err(Error::TooMany {
                field: format!("{} (array length)", field()),
                count,
                limit: MAX_ARRAY_LEN,
            });
        }
        // The smallest each value can be: a count the file cannot hold is refused unread.
        let at_least = count.saturating_mul(min_size);
        self.need(at_least, &|| {
            format!("{} ({count} values of {})", field(), type_name(type_id))
        })?;
        self.hold(
            count.saturating_mul(std::mem::size_of::<Value>() as u64),
            field,
        )?;
        let mut values = Vec::with_capacity(count as usize);
        for i in 0..count {
            values.push(self.value(type_id, depth + 1, &|| format!("{}[{i}]", field()))?);
        }
        Ok(Value::Array { type_id, values })
    }
}

/// Reads and checks the header of a GGUF file of `file_len` bytes from `reader`, positioned at
/// its start. Reads the header only, never the tensor data.
pub fn read<R: Read>(reader: R, file_len: u64) -> Result<Gguf> {
    let mut r = Bounded {
        inner: reader,
        pos: 0,
        len: file_len,
        held: 0,
    };
    let magic: [u8; 4] = r.array(&|| "magic".into())?;
    if &magic != MAGIC {
        return Err(Error::BadMagic);
    }
    let version = r.u32(&|| "version".into())?;
    match version {
        2 | 3 => {}
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => return Err(Error::BigEndian(v)),
        v => return Err(Error::UnsupportedVersion(v)),
    }
    let n_tensors = r.u64(&|| "tensor_count".into())?;
    let n_kv = r.u64(&|| "metadata_kv_count".into())?;
    check_count("metadata_kv_count", n_kv, MAX_METADATA_KEYS, &r, 13)?;
    check_count("tensor_count", n_tensors, MAX_TENSORS, &r, 24)?;

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut keys = HashSet::new();
    for i in 0..n_kv {
        let key = r.string(MAX_NAME_LEN, &|| format!("metadata key #{i}"))?;
        let type_id = r.u32(&|| format!("metadata `{key}` (type)"))?;
        let value = r.value(type_id, 0, &|| format!("metadata `{key}`"))?;
        if !keys.insert(key.clone()) {
            return Err(Error::DuplicateKey(key));
        }
        metadata.push((key, value));
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => {
            return Err(Error::Invalid {
                field: "metadata `general.alignment`".into(),
                reason: format!("must be a u32 power of two, got {v:?}"),
            })
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let t = read_tensor_info(&mut r, i)?;
        if !names.insert(t.name.clone()) {
            return Err(Error::DuplicateTensor(t.name));
        }
        tensors.push(t);
    }
    let data_start = r.pos.div_ceil(alignment).saturating_mul(alignment);
    place_tensors(&mut tensors, alignment, data_start, file_len)?;
    Ok(Gguf {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
        file_len,
    })
}

/// A count over its limit, or more than the bytes left could hold at `min_size` each.
fn check_count<R: Read>(
    field: &str,
    count: u64,
    limit: u64,
    r: &Bounded<R>,
    min_size: u64,
) -> Result<()> {
    if count > limit {
        return Err(Error::TooMany {
            field: field.into(),
            count,
            limit,
        });
    }
    r.need(count.saturating_mul(min_size), &|| {
        format!("{field} ({count} entries of at least {min_size} bytes)")
    })
}

/// One tensor info, its offset still relative to the data section.
fn read_tensor_info<R: Read>(r: &mut Bounded<R>, i: u64) -> Result<TensorInfo> {
    let name = r.string(MAX_NAME_LEN, &|| format!("tensor #{i} (name)"))?;
    let bad = |reason: String| Error::BadTensor {
        name: name.clone(),
        reason,
    };
    let n_dims = r.u32(&|| format!("tensor `{name}` (n_dims)"))?;
    if n_dims > MAX_DIMS {
        return Err(bad(format!(
            "has {n_dims} dimensions; ggml allows at most {MAX_DIMS}"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(r.u64(&|| format!("tensor `{name}` (dimension {d})"))?);
    }
    let type_id = r.u32(&|| format!("tensor `{name}` (type)"))?;
    let offset = r.u64(&|| format!("tensor `{name}` (offset)"))?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| Error::UnknownType {
        name: name.clone(),
        id: type_id,
    })?;
    // The product of the non-zero dimensions must fit: a zero taken first would hide an
    // overflow from a product of them all, but not from one taken in another order.
    let nonzero = (dims.iter())
        .filter(|&&d| d != 0)
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| bad(format!("dimensions {dims:?} hold more than 2^63 values")))?;
    let numel = if dims.contains(&0) { 0 } else { nonzero };
    let inner = dims.first().copied().unwrap_or(1);
    if !inner.is_multiple_of(ggml_type.block_len()) {
        return Err(bad(format!(
            "its innermost dimension {inner} is not a multiple of {ggml_type}'s block of {}",
            ggml_type.block_len()
        )));
    }
    let nbytes = ggml_type.nbytes(numel).ok_or_else(|| {
        bad(format!(
            "{numel} values of {ggml_type} overflow a byte count"
        ))
    })?;
    dims.reverse();
    Ok(TensorInfo {
        name,
        ggml_type,
        shape: dims,
        offset,
        nbytes,
    })
}

/// Offsets must be aligned, inside the file and disjoint; they become absolute.
fn place_tensors(
    tensors: &mut [TensorInfo],
    alignment: u64,
    data_start: u64,
    file_len: u64,
) -> Result<()> {
    for t in tensors.iter_mut() {
        let bad = |reason: String| Error::BadTensor {
            name: t.name.clone(),
            reason,
        };
        if !t.offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "offset {} is not a multiple of the alignment {alignment}",
                t.offset
            )));
        }
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.nbytes))
            .filter(|&e| e <= file_len);
        if end.is_none() {
            return Err(bad(format!(
                "data at offset {} + {} bytes (from {data_start}) runs past the end of the {file_len}-byte file",
                t.offset, t.nbytes
            )));
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| (tensors[i].offset, tensors[i].nbytes));
    // The furthest end so far, and whose it is: every non-empty tensor must start at or after it.
    let mut reach: Option<(usize, u64)> = None;
    for &i in order.iter().filter(|&&i| tensors[i].nbytes > 0) {
        let t = &tensors[i];
        if let Some((j, end)) = reach.filter(|&(_, end)| t.offset < end) {
            return Err(Error::Overlap {
                first: tensors[j].name.clone(),
                second: t.name.clone(),
                start: t.offset,
                end: end.min(t.offset + t.nbytes),
            });
        }
        reach = Some((i, t.offset + t.nbytes));
    }
    for t in tensors.iter_mut() {
        t.offset += data_start;
    }
    Ok(())
}

/// Reads and checks the header of the GGUF file at `path`; errors name the file.
pub fn read_file(path: &Path) -> Result<Gguf> {
    let run = || -> Result<Gguf> {
        let (f, len) = crate::files::open_regular(path)?;
        read(std::io::BufReader::new(f), len)
    };
    run().map_err(|e| e.in_file(path))
}
