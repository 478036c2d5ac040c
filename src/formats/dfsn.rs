//! The DFSN container ("Diffusion Format"): a ckpt or safetensors model behind a fixed header
//! that carries the model's sha256 and an editable JSON metadata area, so that metadata can
//! change without moving the model bytes or changing their hash.
//!
//! ```text
//! 0x000000  4 B    magic `DFSN`
//! 0x000004  2 B    type: 00 01 = ckpt, 00 02 = safetensors
//! 0x000006  32 B   sha256 of the model bytes (raw digest)
//! 0x000026  4 B    metadata offset: 00 00 01 00
//! 0x00002A  4 B    model offset:    00 20 01 00
//! 0x00002E         zero up to 0x100
//! 0x000100  2 MiB  metadata: UTF-8 JSON object, padded with NUL bytes
//! 0x200100         the model file, byte for byte, to the end of the file
//! ```
//!
//! The proposal (RupertAvery/DiffusionFormat) leaves several points open; this module decides:
//!
//! - Integers are big-endian: the proposal writes the offsets as the literal bytes `00000100`
//!   and `00200100`. The type is a u16.
//! - The sha256 is the raw 32-byte digest of the bytes from the model offset to the end of the
//!   file.
//! - Bytes 0x2E..0x100 are zero; the metadata area (0x100..0x200100, 2 MiB) holds compact JSON
//!   followed by NUL bytes.
//!
//! Reading is liberal where that is safe:
//!
//! - a little-endian header is read too. The type field decides, since 1 and 2 read as 256 and
//!   512 the other way round; offsets that cannot be right in that order (or that fit the file
//!   either way, with a model of the declared type only the other way) are read in the other;
//! - NUL and whitespace padding around the JSON is trimmed, and an area of padding alone
//!   reads as `{}`;
//! - offsets other than the defaults are accepted when consistent: metadata at or after 0x2E,
//!   the model after the metadata area, both within the file.
//!
//! It is strict where guessing would be unsafe: a file shorter than the header, offsets past
//! the end or out of order, metadata that is not a UTF-8 JSON object, and metadata larger than
//! its area are errors that name the file and the field.

use super::{hex, structural, FileKind, Listing};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The 4 bytes every DFSN container starts with.
pub const MAGIC: &[u8; 4] = b"DFSN";
/// Magic, type, sha256 and the two offsets.
pub const HEADER_LEN: u64 = 0x2E;
/// Where the writer puts the metadata.
pub const METADATA_OFFSET: u64 = 0x100;
/// Where the writer puts the model: a 2 MiB metadata area.
pub const MODEL_OFFSET: u64 = 0x200100;
/// The largest metadata area this reader loads; larger offsets are taken for a damaged header.
const MAX_METADATA_AREA: u64 = 64 << 20;
const COPY_CHUNK: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is not a container this reader accepts; `reason` names the field.
    #[error("`{}`: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    /// `pack` was given something other than a ckpt or safetensors file.
    #[error("`{}` is a {} file; a DFSN container holds a ckpt or safetensors model", path.display(), kind.name())]
    NotAModel { path: PathBuf, kind: FileKind },
    /// The metadata JSON does not fit the container's metadata area.
    #[error("`{}`: the metadata JSON is {len} bytes, more than the {room} bytes of its area", path.display())]
    MetadataTooLarge { path: PathBuf, len: u64, room: u64 },
    /// The model bytes do not hash to the header's `sha256`.
    #[error("`{}`: the model bytes hash to {actual}, but the header's `sha256` is {stored}", path.display())]
    HashMismatch {
        path: PathBuf,
        stored: String,
        actual: String,
    },
    /// A ckpt payload is a pickle, which has no tensor table to list.
    #[error("`{}` holds a ckpt model, which has no tensor listing (only a safetensors payload has one)", path.display())]
    NoListing { path: PathBuf },
    #[error(transparent)]
    Structural(#[from] structural::Error),
}

/// What the container holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelType {
    Ckpt,
    Safetensors,
}

impl ModelType {
    /// The header's type field.
    pub fn code(self) -> u16 {
        match self {
            ModelType::Ckpt => 1,
            ModelType::Safetensors => 2,
        }
    }

    pub fn from_code(code: u16) -> Option<ModelType> {
        match code {
            1 => Some(ModelType::Ckpt),
            2 => Some(ModelType::Safetensors),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ModelType::Ckpt => "ckpt",
            ModelType::Safetensors => "safetensors",
        }
    }
}

/// How the header's integers were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ByteOrder {
    /// What this module writes.
    Big,
    /// Accepted on reading when the big-endian reading is impossible.
    Little,
}

/// A parsed container header: where things are, and what it claims.
#[derive(Debug, Clone)]
pub struct Container {
    pub model_type: ModelType,
    /// The stored sha256 of the model bytes.
    pub sha256: [u8; 32],
    pub metadata: serde_json::Value,
    pub metadata_offset: u64,
    pub model_offset: u64,
    pub model_len: u64,
    /// The byte order the offsets were read in.
    pub byte_order: ByteOrder,
}

impl Container {
    pub fn open(path: &Path) -> Result<Container, Error> {
        let invalid = |reason: String| Error::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let (mut file, len) =
            crate::files::open_regular(path).map_err(|e| invalid(e.to_string()))?;
        if len < HEADER_LEN {
            return Err(invalid(format!(
                "truncated: {len} bytes, shorter than the {HEADER_LEN}-byte DFSN header"
            )));
        }
        let mut head = [0u8; HEADER_LEN as usize];
        file.read_exact(&mut head).map_err(io(path))?;
        if &head[..4] != MAGIC {
            return Err(invalid(format!(
                "bad magic {:?}, expected `DFSN`",
                String::from_utf8_lossy(&head[..4])
            )));
        }
        // The type field tells the byte order: 1 and 2 read as 256 and 512 the other way round.
        let type_bytes = [head[4], head[5]];
        let (model_type, order) = match (
            ModelType::from_code(u16::from_be_bytes(type_bytes)),
            ModelType::from_code(u16::from_le_bytes(type_bytes)),
        ) {
            (Some(t), _) => (t, ByteOrder::Big),
            (None, Some(t)) => (t, ByteOrder::Little),
            (None, None) => {
                return Err(invalid(format!(
                    "`type` is {:02x} {:02x}, expected 00 01 (ckpt) or 00 02 (safetensors)",
                    head[4], head[5]
                )))
            }
        };
        let mut sha256 = [0u8; 32];
        sha256.copy_from_slice(&head[6..38]);
        let read_offsets = |order: ByteOrder| {
            let word = |at: usize| -> u64 {
                let b: [u8; 4] = head[at..at + 4].try_into().expect("4 bytes");
                match order {
                    ByteOrder::Big => u32::from_be_bytes(b) as u64,
                    ByteOrder::Little => u32::from_le_bytes(b) as u64,
                }
            };
            (word(0x26), word(0x2A), order)
        };
        // Offsets in the type's byte order come first. The other order is tried only when
        // that reading is impossible, or when both fit the file and only the other one finds
        // a model of the declared type at its model offset.
        let primary = read_offsets(order);
        let other = read_offsets(if order == ByteOrder::Big {
            ByteOrder::Little
        } else {
            ByteOrder::Big
        });
        let (metadata_offset, model_offset, byte_order) =
            match (check_offsets(primary, len), check_offsets(other, len)) {
                (Ok(()), Err(_)) => primary,
                (Err(_), Ok(())) => other,
                (Err(reason), Err(_)) => return Err(invalid(reason)),
                (Ok(()), Ok(())) => {
                    let mut fits = |(_, model, _): (u64, u64, ByteOrder)| -> Result<bool, Error> {
                        let mut head = Vec::with_capacity(16);
                        file.seek(SeekFrom::Start(model)).map_err(io(path))?;
                        (&mut file)
                            .take(16)
                            .read_to_end(&mut head)
                            .map_err(io(path))?;
                        let kind = FileKind::sniff(&head, len - model);
                        Ok(kind.name() == model_type.name())
                    };
                    if !fits(primary)? && fits(other)? {
                        other
                    } else {
                        primary
                    }
                }
            };

        let area = model_offset - metadata_offset;
        if area > MAX_METADATA_AREA {
            return Err(invalid(format!(
                "the metadata area (`metadata offset` {metadata_offset:#x} to `model offset` {model_offset:#x}) is {area} bytes, more than the {MAX_METADATA_AREA} this reader accepts"
            )));
        }
        let mut raw = vec![0u8; area as usize];
        file.seek(SeekFrom::Start(metadata_offset))
            .map_err(io(path))?;
        file.read_exact(&mut raw).map_err(io(path))?;
        let metadata = parse_metadata(&raw).map_err(invalid)?;
        Ok(Container {
            model_type,
            sha256,
            metadata,
            metadata_offset,
            model_offset,
            model_len: len - model_offset,
            byte_order,
        })
    }

    /// The stored sha256 as 64 lowercase hex.
    pub fn sha256_hex(&self) -> String {
        hex(&self.sha256)
    }

    /// Bytes available to the metadata JSON.
    pub fn metadata_room(&self) -> u64 {
        self.model_offset - self.metadata_offset
    }
}

/// Whether a (metadata offset, model offset) reading fits a file of `len` bytes.
fn check_offsets((meta, model, _): (u64, u64, ByteOrder), len: u64) -> Result<(), String> {
    if meta < HEADER_LEN {
        return Err(format!(
            "`metadata offset` {meta:#x} lies inside the {HEADER_LEN:#x}-byte header"
        ));
    }
    if model < meta {
        return Err(format!(
            "`model offset` {model:#x} comes before `metadata offset` {meta:#x}"
        ));
    }
    if model > len {
        return Err(format!(
            "`model offset` {model:#x} is past the end of the file ({len} bytes)"
        ));
    }
    Ok(())
}

/// The metadata JSON object of an area, its padding trimmed.
fn parse_metadata(raw: &[u8]) -> Result<serde_json::Value, String> {
    let pad = |b: &u8| *b == 0 || b.is_ascii_whitespace();
    let start = raw.iter().position(|b| !pad(b)).unwrap_or(raw.len());
    let end = raw.iter().rposition(|b| !pad(b)).map_or(start, |i| i + 1);
    let text = std::str::from_utf8(&raw[start..end])
        .map_err(|e| format!("`metadata` is not UTF-8: {e}"))?;
    if text.is_empty() {
        return Ok(serde_json::Value::Object(Default::default()));
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(v) => Err(format!(
            "`metadata` is a JSON {}, expected an object",
            json_kind(&v)
        )),
        Err(e) => Err(format!("`metadata` is not JSON: {e}")),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// The metadata area's new content: compact JSON padded with NUL to `room` bytes.
fn metadata_area(metadata: &serde_json::Value, room: u64, path: &Path) -> Result<Vec<u8>, Error> {
    if !metadata.is_object() {
        let reason = format!(
            "`metadata` must be a JSON object, not a {}",
            json_kind(metadata)
        );
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            reason,
        });
    }
    let mut bytes = serde_json::to_vec(metadata).expect("JSON values serialize");
    if bytes.len() as u64 > room {
        return Err(Error::MetadataTooLarge {
            path: path.to_path_buf(),
            len: bytes.len() as u64,
            room,
        });
    }
    bytes.resize(room as usize, 0);
    Ok(bytes)
}

/// Packs the model file at `model` with `metadata` (a JSON object) into a new container at
/// `out`. The model is streamed and hashed as it is copied; `out` appears complete or not at
/// all (temp file in the same folder, fsync, rename).
pub fn pack(model: &Path, metadata: &serde_json::Value, out: &Path) -> Result<Container, Error> {
    let model_type = match FileKind::of_file(model).map_err(io(model))? {
        FileKind::Safetensors => ModelType::Safetensors,
        FileKind::Ckpt => ModelType::Ckpt,
        kind => {
            return Err(Error::NotAModel {
                path: model.to_path_buf(),
                kind,
            })
        }
    };
    let area = metadata_area(metadata, MODEL_OFFSET - METADATA_OFFSET, out)?;
    let mut src = std::fs::File::open(model).map_err(io(model))?;

    let target = output_target(out)?;
    let mut tmp = temp_beside(&target, out)?;
    let mut header = vec![0u8; METADATA_OFFSET as usize];
    header[..4].copy_from_slice(MAGIC);
    header[4..6].copy_from_slice(&model_type.code().to_be_bytes());
    header[0x26..0x2A].copy_from_slice(&(METADATA_OFFSET as u32).to_be_bytes());
    header[0x2A..0x2E].copy_from_slice(&(MODEL_OFFSET as u32).to_be_bytes());
    let file = tmp.as_file_mut();
    file.write_all(&header).map_err(io(out))?;
    file.write_all(&area).map_err(io(out))?;
    let (model_len, sha256) = copy_hashing(&mut src, file, model, out)?;
    // The hash is known only after the copy, so its slot is filled last.
    file.seek(SeekFrom::Start(6)).map_err(io(out))?;
    file.write_all(&sha256).map_err(io(out))?;
    file.sync_all().map_err(io(out))?;
    tmp.persist(&target).map_err(|e| io(out)(e.error))?;
    Ok(Container {
        model_type,
        sha256,
        metadata: metadata.clone(),
        metadata_offset: METADATA_OFFSET,
        model_offset: MODEL_OFFSET,
        model_len,
        byte_order: ByteOrder::Big,
    })
}

/// Replaces the metadata of the container at `path` in place: one write of its metadata area
/// and an fsync. The model bytes, their offset and the stored hash do not change. Metadata that
/// does not fit the area is refused before anything is written.
pub fn set_metadata(path: &Path, metadata: &serde_json::Value) -> Result<Container, Error> {
    let mut container = Container::open(path)?;
    let area = metadata_area(metadata, container.metadata_room(), path)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    file.seek(SeekFrom::Start(container.metadata_offset))
        .map_err(io(path))?;
    file.write_all(&area).map_err(io(path))?;
    file.sync_all().map_err(io(path))?;
    container.metadata = metadata.clone();
    Ok(container)
}

/// The outcome of checking a container's model bytes against its stored hash.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Verification {
    pub stored_sha256: String,
    pub actual_sha256: String,
    pub model_len: u64,
}

impl Verification {
    pub fn ok(&self) -> bool {
        self.stored_sha256 == self.actual_sha256
    }
}

/// Re-hashes the model bytes of the container at `path`.
pub fn verify(path: &Path) -> Result<Verification, Error> {
    let container = Container::open(path)?;
    let mut file = std::fs::File::open(path).map_err(io(path))?;
    file.seek(SeekFrom::Start(container.model_offset))
        .map_err(io(path))?;
    let (model_len, actual) = copy_hashing(&mut file, &mut std::io::sink(), path, path)?;
    Ok(Verification {
        stored_sha256: container.sha256_hex(),
        actual_sha256: hex(&actual),
        model_len,
    })
}

/// Writes the model inside the container at `path` to `out`, atomically, after checking it
/// against the stored hash (on a mismatch `out` is not written).
pub fn unpack(path: &Path, out: &Path) -> Result<Container, Error> {
    let container = Container::open(path)?;
    let mut src = std::fs::File::open(path).map_err(io(path))?;
    src.seek(SeekFrom::Start(container.model_offset))
        .map_err(io(path))?;
    let target = output_target(out)?;
    let mut tmp = temp_beside(&target, out)?;
    let (_, actual) = copy_hashing(&mut src, tmp.as_file_mut(), path, out)?;
    if actual != container.sha256 {
        return Err(Error::HashMismatch {
            path: path.to_path_buf(),
            stored: container.sha256_hex(),
            actual: hex(&actual),
        });
    }
    tmp.as_file().sync_all().map_err(io(out))?;
    tmp.persist(&target).map_err(|e| io(out)(e.error))?;
    Ok(container)
}

/// The structural view of the model inside a container, exactly as the model file alone gives
/// it, so that a container and its model have the same structural hash. The container's own
/// JSON is not part of it (see [`Container::metadata`]).
pub fn listing(path: &Path) -> Result<Listing, Error> {
    let container = Container::open(path)?;
    if container.model_type == ModelType::Ckpt {
        return Err(Error::NoListing {
            path: path.to_path_buf(),
        });
    }
    let mut file = std::fs::File::open(path).map_err(io(path))?;
    file.seek(SeekFrom::Start(container.model_offset))
        .map_err(io(path))?;
    let mut model = std::io::BufReader::new(file).take(container.model_len);
    Ok(structural::read_safetensors_listing(
        &mut model,
        container.model_len,
        path,
    )?)
}

/// Copies `src` to its end into `dst`, returning the byte count and sha256. Read errors name
/// `src_path`, write errors `dst_path`.
fn copy_hashing<R: Read, W: Write>(
    src: &mut R,
    dst: &mut W,
    src_path: &Path,
    dst_path: &Path,
) -> Result<(u64, [u8; 32]), Error> {
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(src_path)(e)),
        };
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n]).map_err(io(dst_path))?;
        total += n as u64;
    }
    Ok((total, hasher.finalize().into()))
}

/// The file an output path names: itself, or a symlink's target; special files are refused,
/// since the container is built in a temporary file and renamed into place.
fn output_target(out: &Path) -> Result<PathBuf, Error> {
    crate::files::output_path(out).map_err(|e| Error::Invalid {
        path: out.to_path_buf(),
        reason: format!("cannot write here: {e}"),
    })
}

fn temp_beside(target: &Path, out: &Path) -> Result<crate::files::TempFile, Error> {
    crate::files::TempFile::beside(target, ".zimage-dfsn-").map_err(io(out))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| crate::files::FileError::io(path)(e).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_must_fit_in_order() {
        let be = ByteOrder::Big;
        assert!(check_offsets((0x100, 0x200100, be), 0x200100).is_ok());
        assert!(check_offsets((0x2E, 0x2E, be), 0x2E).is_ok());
        assert!(check_offsets((0x10, 0x200100, be), 0x300000)
            .unwrap_err()
            .contains("`metadata offset`"));
        assert!(check_offsets((0x300, 0x200, be), 0x300000)
            .unwrap_err()
            .contains("comes before"));
        assert!(check_offsets((0x100, 0x200100, be), 0x200000)
            .unwrap_err()
            .contains("past the end"));
    }

    #[test]
    fn metadata_padding_is_trimmed() {
        assert_eq!(
            parse_metadata(b"{\"a\":1}\0\0\0").unwrap(),
            serde_json::json!({"a": 1})
        );
        assert_eq!(
            parse_metadata(b"  {\"a\":1}   \n").unwrap(),
            serde_json::json!({"a": 1})
        );
        assert_eq!(parse_metadata(b"\0\0\0").unwrap(), serde_json::json!({}));
        assert!(parse_metadata(b"[1]\0").unwrap_err().contains("array"));
        assert!(parse_metadata(b"{\"a\":\0}")
            .unwrap_err()
            .contains("not JSON"));
        assert!(parse_metadata(b"\xff\xfe").unwrap_err().contains("UTF-8"));
    }
}
