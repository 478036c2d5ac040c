//! A strict safetensors header parser and a header writer.
//!
//! Layout: `u64 LE N | N bytes of JSON header | data`, with `data_offsets` relative to the start of
//! the data. The parser enforces every rule a strict reader should (size caps, UTF-8, one JSON
//! object, no duplicate keys, known dtypes, offsets that tile the data area exactly with no holes,
//! overlap or trailing bytes) and names the tensor and field at fault. It accepts what the
//! reference implementation accepts: leading and trailing JSON whitespace, `"__metadata__": null`,
//! unknown fields inside a tensor entry, zero-size tensors and scalars.
//!
//! The writer produces the headers our store writes: entries in the caller's order with keys
//! `dtype, shape, data_offsets` (the order Ollama's Go writer uses), `__metadata__` first when
//! present, and the header padded with spaces so that the data starts on a multiple of `align`.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest accepted header, as in the reference implementation (decimal 100 MB).
pub const MAX_HEADER_SIZE: u64 = 100_000_000;
/// Bytes of the little-endian header-length prefix.
pub const LEN_PREFIX: u64 = 8;
/// Key of the optional string-to-string metadata map.
pub const METADATA_KEY: &str = "__metadata__";

/// Element types of the safetensors format, named exactly as in the header.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    BOOL,
    F4,
    F6_E2M3,
    F6_E3M2,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    F8_E8M0,
    F8_E4M3FNUZ,
    F8_E5M2FNUZ,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
}

impl Dtype {
    pub const ALL: [Dtype; 22] = [
        Dtype::BOOL,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// The header spelling (`"BF16"`); case-sensitive, as the format requires.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::BOOL => "BOOL",
            Dtype::F4 => "F4",
            Dtype::F6_E2M3 => "F6_E2M3",
            Dtype::F6_E3M2 => "F6_E3M2",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8_E5M2 => "F8_E5M2",
            Dtype::F8_E4M3 => "F8_E4M3",
            Dtype::F8_E8M0 => "F8_E8M0",
            Dtype::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            Dtype::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::C64 => "C64",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    pub fn parse(s: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Bits per element (sub-byte types pack: F4 is 4 bits, F6_* are 6).
    pub fn bits(self) -> u64 {
        match self {
            Dtype::F4 => 4,
            Dtype::F6_E2M3 | Dtype::F6_E3M2 => 6,
            Dtype::BOOL
            | Dtype::U8
            | Dtype::I8
            | Dtype::F8_E5M2
            | Dtype::F8_E4M3
            | Dtype::F8_E8M0
            | Dtype::F8_E4M3FNUZ
            | Dtype::F8_E5M2FNUZ => 8,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::C64 | Dtype::F64 | Dtype::I64 | Dtype::U64 => 64,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor entry of a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// `[begin, end)` relative to the start of the data area.
    pub data_offsets: (u64, u64),
}

impl TensorInfo {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
    pub fn nbytes(&self) -> u64 {
        self.data_offsets.1 - self.data_offsets.0
    }
}

/// A parsed and validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Tensors in the order the header lists them.
    pub tensors: Vec<TensorInfo>,
    /// `None` when `__metadata__` is absent or `null`.
    pub metadata: Option<BTreeMap<String, String>>,
    /// `N`, the JSON length including any padding.
    pub header_len: u64,
    /// Position of each tensor in `tensors`, built once at parsing so that a lookup by name does
    /// not scan a header of many tensors.
    index: HashMap<String, usize>,
}

impl Header {
    /// File offset where the data area starts (`8 + N`).
    pub fn data_start(&self) -> u64 {
        LEN_PREFIX + self.header_len
    }
    /// Bytes in the data area.
    pub fn data_len(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.data_offsets.1)
            .max()
            .unwrap_or(0)
    }
    /// Total file size this header describes.
    pub fn file_len(&self) -> u64 {
        // Offsets come from the file: a sum past 64 bits is no file's length.
        self.data_start().saturating_add(self.data_len())
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let indexed = self.index.get(name).and_then(|&i| self.tensors.get(i));
        match indexed {
            Some(t) if t.name == name => Some(t),
            // `tensors` is public: when it no longer matches the index, it is searched.
            _ if self.index.len() != self.tensors.len() || indexed.is_some() => {
                self.tensors.iter().find(|t| t.name == name)
            }
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("file is {0} bytes, too small for the 8-byte header length")]
    HeaderTooSmall(u64),
    #[error("header length {0} exceeds the {MAX_HEADER_SIZE}-byte limit")]
    HeaderTooLarge(u64),
    #[error("header length {header_len} runs past the end of the {file_len}-byte file")]
    InvalidHeaderLength { header_len: u64, file_len: u64 },
    #[error("header is not valid UTF-8: {0}")]
    InvalidUtf8(#[from] std::str::Utf8Error),
    #[error("header is not a JSON object: {0}")]
    InvalidJson(String),
    #[error("header has the key `{0}` twice")]
    DuplicateKey(String),
    #[error("`__metadata__` must be null or a map of strings: {0}")]
    BadMetadata(String),
    #[error("tensor `{name}`: field `{field}` {reason}")]
    BadField {
        name: String,
        field: &'static str,
        reason: String,
    },
    #[error("tensor `{name}`: unknown dtype `{dtype}`")]
    UnknownDtype { name: String, dtype: String },
    #[error("tensor `{name}`: invalid data_offsets {begin}..{end} (expected to start at {expected}; the data must be tiled with no holes or overlap)")]
    InvalidOffset {
        name: String,
        begin: u64,
        end: u64,
        expected: u64,
    },
    #[error("tensor `{name}`: {numel} elements of {dtype} do not fill a whole number of bytes")]
    MisalignedSlice {
        name: String,
        numel: u64,
        dtype: Dtype,
    },
    #[error("tensor `{name}`: shape {shape:?} of {dtype} needs {expected} bytes, data_offsets span {got}")]
    SizeMismatch {
        name: String,
        shape: Vec<u64>,
        dtype: Dtype,
        expected: u64,
        got: u64,
    },
    #[error("tensor `{name}`: size computation overflows")]
    Overflow { name: String },
    #[error(
        "file is {got} bytes but its header describes {expected} (truncated or trailing data)"
    )]
    LengthMismatch { expected: u64, got: u64 },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The file is missing, unreadable or not a regular file; the message names it.
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error("`{}`: {source}", path.display())]
    InFile { path: PathBuf, source: Box<Error> },
}

impl Error {
    /// Attaches the file this error came from (once).
    pub fn in_file(self, path: &Path) -> Error {
        match self {
            e @ (Error::InFile { .. } | Error::File(_)) => e,
            e => Error::InFile {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

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

/// What the writer needs to know of one tensor; entries are laid out in the given order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// Data bytes of this tensor; errors on sub-byte counts that do not fill whole bytes.
    pub fn nbytes(&self) -> Result<u64> {
        let overflow = || Error::Overflow {
            name: self.name.clone(),
        };
        let numel = self
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(overflow)?;
        let bits = numel.checked_mul(self.dtype.bits()).ok_or_else(overflow)?;
        if bits % 8 != 0 {
            return Err(Error::MisalignedSlice {
                name: self.name.clone(),
                numel,
                dtype: self.dtype,
            });
        }
        Ok(bits / 8)
    }
}

/// Builds the length prefix and header (`8 + N` bytes) for tensors stored back to back in the
/// given order. The JSON is padded with spaces so that the data starts at a multiple of `align`
/// (8 gives the usual safetensors padding; 16384 puts data on a 16 KiB page boundary).
pub fn header_bytes(
    tensors: &[TensorSpec],
    metadata: Option<&BTreeMap<String, String>>,
    align: u64,
) -> Result<Vec<u8>> {
    assert!(
        align >= 8 && align.is_power_of_two(),
        "align must be a power of two >= 8"
    );
    let mut json = String::from("{");
    let mut first = true;
    let mut push_key = |json: &mut String, key: &str| {
        if !first {
            json.push(',');
        }
        first = false;
        json.push_str(&serde_json::to_string(key).expect("strings serialize"));
        json.push(':');
    };
    if let Some(meta) = metadata {
        push_key(&mut json, METADATA_KEY);
        json.push_str(&serde_json::to_string(meta).expect("string maps serialize"));
    }
    let mut offset = 0u64;
    for t in tensors {
        let end = offset
            .checked_add(t.nbytes()?)
            .ok_or_else(|| Error::Overflow {
                name: t.name.clone(),
            })?;
        push_key(&mut json, &t.name);
        json.push_str(&format!(
            "{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}",
            t.dtype,
            serde_json::to_string(&t.shape).expect("integers serialize"),
            offset,
            end
        ));
        offset = end;
    }
    json.push('}');

    let unpadded = LEN_PREFIX + json.len() as u64;
    let padded = unpadded.div_ceil(align) * align;
    let n = padded - LEN_PREFIX;
    if n > MAX_HEADER_SIZE {
        return Err(Error::HeaderTooLarge(n));
    }
    let mut out = Vec::with_capacity(padded as usize);
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    out.resize(padded as usize, b' ');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str, data_len: usize) -> Vec<u8> {
        let mut v = (json.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(json.as_bytes());
        v.resize(v.len() + data_len, 0);
        v
    }

    #[test]
    fn seed_example_header_is_byte_exact() {
        let spec = TensorSpec {
            name: "data".into(),
            dtype: Dtype::BF16,
            shape: vec![2560, 9728],
        };
        let h = header_bytes(&[spec], None, 8).unwrap();
        assert_eq!(h.len(), 88);
        assert_eq!(&h[..8], &[0x50, 0, 0, 0, 0, 0, 0, 0]);
        let json = std::str::from_utf8(&h[8..]).unwrap();
        assert_eq!(
            json,
            "{\"data\":{\"dtype\":\"BF16\",\"shape\":[2560,9728],\"data_offsets\":[0,49807360]}}       "
        );
        assert_eq!(88 + 49_807_360, 49_807_448);
    }

    #[test]
    fn written_headers_parse_back() {
        let specs = vec![
            TensorSpec {
                name: "a".into(),
                dtype: Dtype::F32,
                shape: vec![2, 3],
            },
            TensorSpec {
                name: "s".into(),
                dtype: Dtype::BF16,
                shape: vec![],
            },
            TensorSpec {
                name: "z".into(),
                dtype: Dtype::U8,
                shape: vec![0, 4],
            },
        ];
        let meta: BTreeMap<_, _> = [("k".to_string(), "v".to_string())].into();
        for align in [8, 64, 16384] {
            let mut f = header_bytes(&specs, Some(&meta), align).unwrap();
            assert_eq!(f.len() as u64 % align, 0);
            f.resize(f.len() + 24 + 2, 7);
            let h = parse(&f).unwrap();
            assert_eq!(h.tensors.len(), 3);
            assert_eq!(h.metadata.as_ref().unwrap()["k"], "v");
            assert_eq!(h.tensor("a").unwrap().data_offsets, (0, 24));
            assert_eq!(h.tensor("s").unwrap().data_offsets, (24, 26));
            assert_eq!(h.tensor("z").unwrap().data_offsets, (26, 26));
        }
    }

    #[test]
    fn accepts_what_the_reference_accepts() {
        // MLX-style: unpadded, sorted keys, null metadata; leading whitespace; unknown fields.
        let f = file(
            r#"{"__metadata__":null,"data":{"data_offsets":[0,4],"dtype":"F32","shape":[1]}}"#,
            4,
        );
        assert!(parse(&f).unwrap().metadata.is_none());
        let f = file(
            " \t{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2],\"extra\":1}}  ",
            2,
        );
        assert_eq!(parse(&f).unwrap().tensors[0].shape, vec![2]);
        assert!(parse(&file("{}", 0)).unwrap().tensors.is_empty());
    }

    #[test]
    fn rejects_each_malformation() {
        let e = |json: &str, data: usize| parse(&file(json, data)).unwrap_err();
        assert!(matches!(
            parse(&[1, 2, 3]).unwrap_err(),
            Error::HeaderTooSmall(3)
        ));
        let mut big = 200_000_000u64.to_le_bytes().to_vec();
        big.push(b'{');
        assert!(matches!(parse(&big).unwrap_err(), Error::HeaderTooLarge(_)));
        let mut short = 50u64.to_le_bytes().to_vec();
        short.extend_from_slice(b"{}");
        assert!(matches!(
            parse(&short).unwrap_err(),
            Error::InvalidHeaderLength { .. }
        ));
        let mut bad_utf8 = 2u64.to_le_bytes().to_vec();
        bad_utf8.extend_from_slice(&[0xff, 0xfe]);
        assert!(matches!(
            parse(&bad_utf8).unwrap_err(),
            Error::InvalidUtf8(_)
        ));
        assert!(matches!(e("[1]", 0), Error::InvalidJson(_)));
        assert!(matches!(e("{}\0\0", 0), Error::InvalidJson(_)));
        let dup = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        assert!(matches!(e(dup, 2), Error::DuplicateKey(k) if k == "a"));
        assert!(matches!(
            e(r#"{"__metadata__":{"k":1}}"#, 0),
            Error::BadMetadata(_)
        ));
        assert!(matches!(
            e(
                r#"{"t":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}}"#,
                2
            ),
            Error::UnknownDtype { .. }
        ));
        assert!(matches!(
            e(
                r#"{"t":{"dtype":"U8","shape":[-1],"data_offsets":[0,2]}}"#,
                2
            ),
            Error::BadField { field: "shape", .. }
        ));
        assert!(matches!(
            e(
                r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}"#,
                2
            ),
            Error::BadField {
                field: "data_offsets",
                ..
            }
        ));
        assert!(matches!(
            e(
                r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
                2
            ),
            Error::InvalidOffset { .. }
        ));
        let overlap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#;
        assert!(matches!(e(overlap, 3), Error::InvalidOffset { .. }));
        assert!(matches!(
            e(
                r#"{"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
                2
            ),
            Error::MisalignedSlice { .. }
        ));
        assert!(matches!(
            e(
                r#"{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
                4
            ),
            Error::SizeMismatch { .. }
        ));
        let huge =
            r#"{"t":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#;
        assert!(matches!(e(huge, 8), Error::Overflow { .. }));
        assert!(matches!(
            e(
                r#"{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
                3
            ),
            Error::LengthMismatch {
                expected: _,
                got: _
            }
        ));
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("broken.safetensors");
        std::fs::write(&p, [9u8; 4]).unwrap();
        let msg = read_header_file(&p).unwrap_err().to_string();
        assert!(
            msg.contains("broken.safetensors") && msg.contains("too small"),
            "{msg}"
        );
    }
}
