//! A safetensors header read the way weight-inspect reads it, which is laxer than our strict
//! parser (`crate::safetensors`): any dtype string, offsets and data length unchecked, any JSON
//! value in `__metadata__`. That laxness is what the structural hash is defined over, so a file
//! weight-inspect hashes is hashed here too. One difference: a zero-size tensor (`end ==
//! begin`), which weight-inspect rejects, is read here with a byte length of 0.

use super::Error;
use crate::files::FileError;
use crate::formats::{Listing, TensorEntry};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// weight-inspect's header cap, 100 MiB (not the 100 MB of the safetensors crate).
pub const MAX_HEADER_LEN: u64 = 100 * 1024 * 1024;

/// The structural view of a safetensors file read from `reader` (positioned at its first byte),
/// `len` bytes long, as weight-inspect reads it. `path` names it in errors.
pub fn read_safetensors_listing<R: Read>(
    reader: &mut R,
    len: u64,
    path: &Path,
) -> Result<Listing, Error> {
    let path_buf = || path.to_path_buf();
    if len < 8 {
        return Err(Error::TooSmall {
            path: path_buf(),
            len,
        });
    }
    let mut prefix = [0u8; 8];
    reader
        .read_exact(&mut prefix)
        .map_err(FileError::io(path))?;
    let header_len = u64::from_le_bytes(prefix);
    if header_len > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge {
            path: path_buf(),
            header_len,
        });
    }
    if header_len > len - 8 {
        return Err(Error::HeaderPastEnd {
            path: path_buf(),
            header_len,
            file_len: len,
        });
    }
    let mut header = Vec::with_capacity(header_len as usize);
    reader
        .take(header_len)
        .read_to_end(&mut header)
        .map_err(FileError::io(path))?;
    if (header.len() as u64) < header_len {
        return Err(Error::HeaderPastEnd {
            path: path_buf(),
            header_len,
            file_len: 8 + header.len() as u64,
        });
    }
    let text = std::str::from_utf8(&header).map_err(|source| Error::NotUtf8 {
        path: path_buf(),
        cause: source,
    })?;
    listing_from_header(text, path)
}

/// The listing of a header's JSON text.
pub fn listing_from_header(text: &str, path: &Path) -> Result<Listing, Error> {
    let json: Value = serde_json::from_str(text).map_err(|source| Error::NotJson {
        path: path.to_path_buf(),
        cause: source,
    })?;
    let Value::Object(entries) = json else {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            reason: "header is not a JSON object".into(),
        });
    };
    let mut metadata = BTreeMap::new();
    let mut tensors = BTreeMap::new();
    for (key, value) in &entries {
        if key == "__metadata__" {
            // weight-inspect skips a `__metadata__` that is not an object rather than failing.
            if let Value::Object(meta) = value {
                metadata.extend(meta.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        } else if let Value::Object(fields) = value {
            tensors.insert(key.clone(), tensor_entry(key, fields, path)?);
        }
        // Other non-object entries are skipped, as weight-inspect skips them.
    }
    Ok(Listing {
        format: "safetensors".into(),
        tensors: tensors.into_values().collect(),
        metadata,
    })
}

fn tensor_entry(
    name: &str,
    fields: &Map<String, Value>,
    path: &Path,
) -> Result<TensorEntry, Error> {
    let bad = |field: &str, reason: String| Error::BadTensor {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        field: field.to_string(),
        reason,
    };
    let dtype = match fields.get("dtype") {
        Some(Value::String(s)) => s.to_lowercase(),
        Some(other) => return Err(bad("dtype", format!("is not a string: {other}"))),
        None => return Err(bad("dtype", "is missing".into())),
    };
    let shape = match fields.get("shape") {
        Some(Value::Array(dims)) => dims
            .iter()
            .enumerate()
            .map(|(i, d)| {
                d.as_u64().ok_or_else(|| {
                    bad(
                        "shape",
                        format!("has {d} at index {i}, not an unsigned integer"),
                    )
                })
            })
            .collect::<Result<Vec<u64>, Error>>()?,
        Some(other) => return Err(bad("shape", format!("is not an array: {other}"))),
        None => return Err(bad("shape", "is missing".into())),
    };
    // Like weight-inspect, only the first two offsets are read.
    let (begin, end) = match fields.get("data_offsets") {
        Some(Value::Array(offsets)) if offsets.len() >= 2 => {
            let offset = |i: usize| {
                offsets[i].as_u64().ok_or_else(|| {
                    bad(
                        "data_offsets",
                        format!("has {} at index {i}, not an unsigned integer", offsets[i]),
                    )
                })
            };
            (offset(0)?, offset(1)?)
        }
        Some(other) => {
            return Err(bad(
                "data_offsets",
                format!("is not an array of two offsets: {other}"),
            ))
        }
        None => return Err(bad("data_offsets", "is missing".into())),
    };
    if end < begin {
        return Err(bad(
            "data_offsets",
            format!("ends at {end}, before its start {begin}"),
        ));
    }
    Ok(TensorEntry {
        name: name.to_string(),
        dtype,
        shape,
        byte_length: end - begin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn file(header: &str) -> Vec<u8> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes
    }

    fn read(bytes: &[u8]) -> Result<Listing, Error> {
        read_safetensors_listing(
            &mut &bytes[..],
            bytes.len() as u64,
            Path::new("m.safetensors"),
        )
    }

    #[test]
    fn reads_tensors_sorted_with_lowercase_dtypes() {
        let l = read(&file(
            r#"{"z":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[4,6]},"a":{"dtype":"WHATEVER","shape":[],"data_offsets":[0,4],"extra":1}}"#,
        ))
        .unwrap();
        assert_eq!(l.format, "safetensors");
        let got: Vec<_> = l
            .tensors
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.dtype.as_str(),
                    t.shape.clone(),
                    t.byte_length,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![("a", "whatever", vec![], 4), ("z", "f8_e4m3", vec![2], 2)]
        );
    }

    #[test]
    fn zero_size_tensors_are_read() {
        let l = read(&file(
            r#"{"e":{"dtype":"F32","shape":[0,4],"data_offsets":[8,8]}}"#,
        ))
        .unwrap();
        assert_eq!(l.tensors[0].byte_length, 0);
        assert_eq!(l.tensors[0].shape, vec![0, 4]);
    }

    #[test]
    fn metadata_of_any_json_type() {
        let l = read(&file(r#"{"__metadata__":{"s":"x","n":3,"f":0.5,"b":false,"z":null,"o":{"k":1}},"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#))
            .unwrap();
        assert_eq!(l.metadata.len(), 6);
        assert_eq!(l.metadata["o"], json!({"k": 1}));
        assert_eq!(l.metadata["f"], json!(0.5));
    }

    #[test]
    fn non_object_metadata_and_entries_are_skipped() {
        let l = read(&file(r#"{"__metadata__":"nope","odd":5,"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#)).unwrap();
        assert!(l.metadata.is_empty());
        assert_eq!(l.tensors.len(), 1);
    }

    #[test]
    fn duplicate_keys_keep_the_last() {
        let l = read(&file(
            r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"__metadata__":{"a":"1","a":"2"}}"#,
        ))
        .unwrap();
        assert_eq!(l.tensors.len(), 1);
        assert_eq!(
            (l.tensors[0].dtype.as_str(), l.tensors[0].byte_length),
            ("f16", 4)
        );
        assert_eq!(l.metadata["a"], json!("2"));
    }

    #[test]
    fn leading_and_trailing_whitespace_is_accepted() {
        let l = read(&file(
            " \t{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}   ",
        ))
        .unwrap();
        assert_eq!(l.tensors.len(), 1);
    }

    fn err(bytes: &[u8]) -> String {
        let e = read(bytes).unwrap_err().to_string();
        assert!(e.starts_with("`m.safetensors`: "), "{e}");
        e
    }

    #[test]
    fn malformed_files_are_errors_naming_file_and_field() {
        assert!(err(b"\x01\0\0").contains("too small"));
        assert!(err(&u64::MAX.to_le_bytes()).contains("exceeds"));
        let mut past = 100u64.to_le_bytes().to_vec();
        past.extend_from_slice(b"{}");
        assert!(err(&past).contains("past the end"));
        assert!(err(&file("{\"a\":\"\u{0}\"")).contains("not JSON"));
        let mut bad_utf8 = 2u64.to_le_bytes().to_vec();
        bad_utf8.extend_from_slice(&[0xff, 0xfe]);
        assert!(err(&bad_utf8).contains("UTF-8"));
        assert!(err(&file("[1]")).contains("not a JSON object"));
        let e = err(&file(r#"{"w":{"shape":[1],"data_offsets":[0,1]}}"#));
        assert!(
            e.contains("tensor `w`") && e.contains("`dtype` is missing"),
            "{e}"
        );
        let e = err(&file(
            r#"{"w":{"dtype":"F32","shape":[1,-2],"data_offsets":[0,1]}}"#,
        ));
        assert!(e.contains("`shape`") && e.contains("index 1"), "{e}");
        let e = err(&file(
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
        ));
        assert!(e.contains("`data_offsets`"), "{e}");
        let e = err(&file(
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}"#,
        ));
        assert!(e.contains("before its start"), "{e}");
    }
}
