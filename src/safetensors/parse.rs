//! Reading and checking a header: every rule a strict reader enforces.

use super::*;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Read;

/// Reads the 8-byte length prefix; `file_len` is the whole file's size.
pub fn header_len_from_prefix(prefix: &[u8], file_len: u64) -> Result<u64> {
    let bytes: [u8; 8] = prefix
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(Error::HeaderTooSmall(file_len))?;
    let n = u64::from_le_bytes(bytes);
    if n > MAX_HEADER_SIZE {
        return Err(Error::HeaderTooLarge(n));
    }
    match LEN_PREFIX.checked_add(n) {
        Some(end) if end <= file_len => Ok(n),
        _ => Err(Error::InvalidHeaderLength {
            header_len: n,
            file_len,
        }),
    }
}

/// Parses a whole safetensors file held in memory (or mapped).
pub fn parse(file: &[u8]) -> Result<Header> {
    let file_len = file.len() as u64;
    let n = header_len_from_prefix(file, file_len)?;
    let json = &file[LEN_PREFIX as usize..(LEN_PREFIX + n) as usize];
    parse_header_json(json, n, file_len)
}

/// Reads and validates the header of a file of `file_len` bytes from `reader`, which must be
/// positioned at the start of the file. Reads only the header, never the data.
pub fn read_header<R: Read>(reader: &mut R, file_len: u64) -> Result<Header> {
    let mut prefix = [0u8; 8];
    if file_len < LEN_PREFIX {
        return Err(Error::HeaderTooSmall(file_len));
    }
    reader.read_exact(&mut prefix)?;
    let n = header_len_from_prefix(&prefix, file_len)?;
    let mut json = vec![0u8; n as usize];
    reader.read_exact(&mut json)?;
    parse_header_json(&json, n, file_len)
}

/// Reads and validates the header of the file at `path`; errors name the file.
pub fn read_header_file(path: &Path) -> Result<Header> {
    let run = || -> Result<Header> {
        let (mut f, len) = crate::files::open_regular(path)?;
        read_header(&mut std::io::BufReader::new(&mut f), len)
    };
    run().map_err(|e| e.in_file(path))
}

/// Parses and validates the `n` JSON bytes of a header against a file of `file_len` bytes.
pub fn parse_header_json(json: &[u8], n: u64, file_len: u64) -> Result<Header> {
    let text = std::str::from_utf8(json)?;
    let entries: OrderedEntries =
        serde_json::from_str(text).map_err(|e| Error::InvalidJson(e.to_string()))?;

    let mut seen_metadata = false;
    let mut metadata = None;
    let mut tensors = Vec::with_capacity(entries.0.len());
    let mut index = HashMap::with_capacity(entries.0.len());
    for (key, value) in entries.0 {
        if key == METADATA_KEY {
            if std::mem::replace(&mut seen_metadata, true) {
                return Err(Error::DuplicateKey(key));
            }
            metadata = parse_metadata(value)?;
            continue;
        }
        if index.insert(key.clone(), tensors.len()).is_some() {
            return Err(Error::DuplicateKey(key));
        }
        tensors.push(parse_entry(key, value)?);
    }
    validate(&tensors)?;
    let header = Header {
        tensors,
        metadata,
        header_len: n,
        index,
    };
    if header.file_len() != file_len {
        return Err(Error::LengthMismatch {
            expected: header.file_len(),
            got: file_len,
        });
    }
    Ok(header)
}

fn parse_metadata(value: Value) -> Result<Option<BTreeMap<String, String>>> {
    match value {
        Value::Null => Ok(None),
        Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                other => Err(Error::BadMetadata(format!(
                    "value of `{k}` is {other}, expected a string"
                ))),
            })
            .collect::<Result<_>>()
            .map(Some),
        other => Err(Error::BadMetadata(format!("got {other}"))),
    }
}

fn parse_entry(name: String, value: Value) -> Result<TensorInfo> {
    let bad = |field: &'static str, reason: &str| Error::BadField {
        name: name.clone(),
        field,
        reason: reason.to_string(),
    };
    let Value::Object(obj) = value else {
        return Err(bad("(entry)", "is not an object"));
    };
    let dtype_str = match obj.get("dtype") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("dtype", "is not a string")),
        None => return Err(bad("dtype", "is missing")),
    };
    let dtype = Dtype::parse(&dtype_str).ok_or_else(|| Error::UnknownDtype {
        name: name.clone(),
        dtype: dtype_str,
    })?;
    let shape = match obj.get("shape") {
        Some(Value::Array(dims)) => dims
            .iter()
            .map(|d| {
                d.as_u64()
                    .ok_or_else(|| bad("shape", "must hold non-negative integers"))
            })
            .collect::<Result<Vec<u64>>>()?,
        Some(_) => return Err(bad("shape", "is not an array")),
        None => return Err(bad("shape", "is missing")),
    };
    let data_offsets = match obj.get("data_offsets") {
        Some(Value::Array(o)) if o.len() == 2 => match (o[0].as_u64(), o[1].as_u64()) {
            (Some(b), Some(e)) => (b, e),
            _ => return Err(bad("data_offsets", "must hold non-negative integers")),
        },
        Some(_) => {
            return Err(bad(
                "data_offsets",
                "must be an array of exactly 2 integers",
            ))
        }
        None => return Err(bad("data_offsets", "is missing")),
    };
    Ok(TensorInfo {
        name,
        dtype,
        shape,
        data_offsets,
    })
}

/// Offsets must tile `[0, end)` exactly, and each span must match its dtype and shape.
fn validate(tensors: &[TensorInfo]) -> Result<()> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.data_offsets);
    let mut expected_begin = 0u64;
    for t in order {
        let (begin, end) = t.data_offsets;
        if begin != expected_begin || end < begin {
            return Err(Error::InvalidOffset {
                name: t.name.clone(),
                begin,
                end,
                expected: expected_begin,
            });
        }
        let overflow = || Error::Overflow {
            name: t.name.clone(),
        };
        let numel = t
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(overflow)?;
        let bits = numel.checked_mul(t.dtype.bits()).ok_or_else(overflow)?;
        if bits % 8 != 0 {
            return Err(Error::MisalignedSlice {
                name: t.name.clone(),
                numel,
                dtype: t.dtype,
            });
        }
        if end - begin != bits / 8 {
            return Err(Error::SizeMismatch {
                name: t.name.clone(),
                shape: t.shape.clone(),
                dtype: t.dtype,
                expected: bits / 8,
                got: end - begin,
            });
        }
        expected_begin = end;
    }
    Ok(())
}

/// The top-level JSON object as an ordered list of entries, so duplicates stay visible.
struct OrderedEntries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for OrderedEntries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedEntries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(OrderedEntries(out))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Err(E::custom("expected a JSON object, got null"))
            }
        }
        d.deserialize_map(V)
    }
}
