//! The model hashes Stable Diffusion tools and Civitai show, computed in one pass over a file.
//!
//! - A1111's legacy hash (Civitai `AutoV1`): sha256 of bytes `0x100000..0x110000`, first 8 hex.
//!   A file shorter than that hashes the bytes it has (under 1 MiB: sha256 of nothing,
//!   `e3b0c442`); Civitai shows nothing for files under 2 MiB.
//! - AutoV2: the first 10 hex of the file's sha256, A1111's `Model hash:` since v1.0.
//! - addnet hash (Civitai `AutoV3`, A1111's LoRA hash) of a safetensors file: sha256 of
//!   everything after the header. Civitai's scanner skips the header only when it is under
//!   16 MiB and hashes from byte 8 otherwise, so both values are reported when they differ.
//! - BLAKE3 of the whole file, and CRC32 in the byte order Civitai prints it (little-endian).
//!
//! A1111 and kohya print lowercase hex, Civitai uppercase; each field says which.
//!
//! The file is read once. Each chunk goes to every hasher's thread, so a large file costs one
//! read and about one sha256 of wall time even though up to three sha256 runs over it.

use crate::formats::{hex, FileKind};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

/// Where A1111's legacy hash starts reading.
const LEGACY_START: u64 = 0x100000;
/// Where it stops.
const LEGACY_END: u64 = 0x110000;
/// Civitai shows no `AutoV1` for files shorter than this.
const CIVITAI_AUTOV1_MIN_LEN: u64 = 0x200000;
/// A safetensors header this long or longer makes Civitai's scanner hash from byte 8.
const CIVITAI_AUTOV3_MAX_HEADER: u64 = 16 << 20;
/// The largest safetensors header whose metadata is read (the safetensors limit).
const MAX_HEADER: u64 = 100_000_000;
const CHUNK: usize = 4 << 20;
/// Chunks in flight per hasher: bounds memory to a few chunks whatever the file size.
const QUEUE: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{}`: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// Every hash of one file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModelHashes {
    pub size: u64,
    /// Full sha256, lowercase (A1111's `sha256`, Civitai's `SHA256` in upper case).
    pub sha256: String,
    /// `sha256[..10]`, lowercase: A1111's `Model hash:` (≥ v1.0).
    pub autov2: String,
    /// A1111's legacy 8-hex hash, lowercase: `Model hash:` in images made before 2023.
    pub legacy: String,
    /// Civitai's `AutoV1`: the legacy hash in upper case, `None` under 2 MiB.
    pub civitai_autov1: Option<String>,
    /// Civitai's `AutoV2`: `SHA256[..10]`.
    pub civitai_autov2: String,
    /// BLAKE3 of the whole file, uppercase as Civitai shows it.
    pub blake3: String,
    /// CRC-32 (ISO-HDLC) with its bytes in little-endian order, uppercase: Civitai's `CRC32`.
    pub crc32: String,
    /// Present when the file is safetensors.
    pub safetensors: Option<SafetensorsHashes>,
}

/// The hashes that only safetensors files have.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SafetensorsHashes {
    /// `N`, the header length.
    pub header_len: u64,
    /// kohya's and A1111's addnet hash: sha256 of the file after the header, lowercase.
    pub addnet: String,
    /// What Civitai's scanner computes as `AutoV3` (64 hex, uppercase): the addnet hash, or the
    /// sha256 from byte 8 on when the header is 16 MiB or more.
    pub civitai_autov3_full: String,
    /// `AutoV3` as Civitai's site stores and shows it: the first 12 of the above.
    pub civitai_autov3: String,
    /// `sshs_model_hash` from `__metadata__`, as written by the trainer (may be wrong).
    pub sshs_model_hash: Option<String>,
    /// `sshs_legacy_hash` from `__metadata__`.
    pub sshs_legacy_hash: Option<String>,
    /// A1111's LoRA hash: `sshs_model_hash` when present (A1111 trusts it even when it is
    /// wrong), else the addnet hash; the infotext shows its first 12.
    pub a1111_lora_hash: String,
}

impl ModelHashes {
    /// Label and value of each hash, in the order a person reads them.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let mut rows = vec![
            ("Size", self.size.to_string()),
            ("SHA256", self.sha256.clone()),
            ("AutoV2 (A1111 model hash)", self.autov2.clone()),
            ("A1111 legacy hash", self.legacy.clone()),
            (
                "Civitai AutoV1",
                self.civitai_autov1
                    .clone()
                    .unwrap_or_else(|| "none (under 2 MiB)".into()),
            ),
            ("Civitai AutoV2", self.civitai_autov2.clone()),
            ("BLAKE3", self.blake3.clone()),
            ("CRC32 (Civitai)", self.crc32.clone()),
        ];
        if let Some(st) = &self.safetensors {
            rows.push(("addnet hash", st.addnet.clone()));
            rows.push(("Civitai AutoV3", st.civitai_autov3.clone()));
            if !st.civitai_autov3_full.eq_ignore_ascii_case(&st.addnet) {
                rows.push(("Civitai AutoV3 (full)", st.civitai_autov3_full.clone()));
            }
            rows.push((
                "A1111 LoRA hash",
                st.a1111_lora_hash
                    .get(..12)
                    .unwrap_or(&st.a1111_lora_hash)
                    .to_string(),
            ));
            if let Some(h) = &st.sshs_model_hash {
                let note = if h.eq_ignore_ascii_case(&st.addnet) {
                    ""
                } else {
                    " (differs from the addnet hash)"
                };
                rows.push(("sshs_model_hash", format!("{h}{note}")));
            }
            if let Some(h) = &st.sshs_legacy_hash {
                rows.push(("sshs_legacy_hash", h.clone()));
            }
        }
        rows
    }
}

/// Hashes `path` in one pass.
pub fn hash_file(path: &Path) -> Result<ModelHashes, Error> {
    let size = std::fs::metadata(path)
        .map_err(|source| Error::Io {
            path: path.to_path_buf(),
            cause: source,
        })?
        .len();
    hash_region(path, 0, size)
}

/// Hashes the `size` bytes of `path` from `start` as if they were a file of their own: the
/// model inside a container, say.
pub fn hash_region(path: &Path, start: u64, size: u64) -> Result<ModelHashes, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        cause: source,
    };
    let open = || -> std::io::Result<std::io::Take<std::fs::File>> {
        let mut file = std::fs::File::open(path)?;
        file.seek(SeekFrom::Start(start))?;
        Ok(file.take(size))
    };
    let st = safetensors_header(&mut open().map_err(io)?, size).map_err(io)?;
    let mut file = open().map_err(io)?;

    // Each sha256 range is one thread; BLAKE3, CRC32 and the legacy range are cheap beside it
    // and share one.
    let mut ranges = vec![(0, u64::MAX)];
    if let Some((n, _)) = &st {
        ranges.push((8 + n, u64::MAX));
        if *n >= CIVITAI_AUTOV3_MAX_HEADER {
            ranges.push((8, u64::MAX));
        }
    }
    let (digests, (blake3, crc, legacy)) = std::thread::scope(|s| -> std::io::Result<_> {
        let mut senders = Vec::new();
        let mut sha_threads = Vec::new();
        for &(start, end) in &ranges {
            let (tx, rx) = sync_channel::<Chunk>(QUEUE);
            senders.push(tx);
            sha_threads.push(s.spawn(move || sha256_range(rx, start, end)));
        }
        let (tx, rx) = sync_channel::<Chunk>(QUEUE);
        senders.push(tx);
        let small = s.spawn(move || small_hashes(rx));

        let mut offset = 0u64;
        loop {
            let mut buf = vec![0u8; CHUNK];
            let n = read_full(&mut file, &mut buf)?;
            if n == 0 {
                break;
            }
            buf.truncate(n);
            let chunk = Arc::new(buf);
            for tx in &senders {
                // A hasher only stops early by panicking, which the join below reports.
                let _ = tx.send((offset, Arc::clone(&chunk)));
            }
            offset += n as u64;
        }
        drop(senders);
        let digests: Vec<[u8; 32]> = sha_threads
            .into_iter()
            .map(|t| t.join().expect("hasher thread"))
            .collect();
        Ok((digests, small.join().expect("hasher thread")))
    })
    .map_err(io)?;

    let sha256 = hex(&digests[0]);
    let legacy8 = legacy[..8].to_string();
    let safetensors = st.map(|(n, meta)| {
        let addnet = hex(&digests[1]);
        let full = digests
            .get(2)
            .map(|d| hex(d))
            .unwrap_or_else(|| addnet.clone())
            .to_ascii_uppercase();
        let get = |k: &str| {
            meta.as_ref()
                .and_then(|m| m.get(k))
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        let sshs_model_hash = get("sshs_model_hash");
        SafetensorsHashes {
            header_len: n,
            a1111_lora_hash: sshs_model_hash
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| addnet.clone()),
            addnet,
            civitai_autov3: full[..12].to_string(),
            civitai_autov3_full: full,
            sshs_model_hash,
            sshs_legacy_hash: get("sshs_legacy_hash"),
        }
    });
    Ok(ModelHashes {
        size,
        autov2: sha256[..10].to_string(),
        civitai_autov2: sha256[..10].to_ascii_uppercase(),
        civitai_autov1: (size >= CIVITAI_AUTOV1_MIN_LEN).then(|| legacy8.to_ascii_uppercase()),
        legacy: legacy8,
        sha256,
        blake3: blake3.to_ascii_uppercase(),
        crc32: crc
            .to_le_bytes()
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect(),
        safetensors,
    })
}

type Chunk = (u64, Arc<Vec<u8>>);

/// The part of `chunk` (starting at file offset `offset`) that falls in `start..end`.
fn clip(offset: u64, chunk: &[u8], start: u64, end: u64) -> &[u8] {
    let lo = start.max(offset);
    let hi = end.min(offset + chunk.len() as u64);
    if lo >= hi {
        return &[];
    }
    &chunk[(lo - offset) as usize..(hi - offset) as usize]
}

fn sha256_range(rx: Receiver<Chunk>, start: u64, end: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    for (offset, chunk) in rx {
        h.update(clip(offset, &chunk, start, end));
    }
    h.finalize().into()
}

/// BLAKE3 hex, CRC-32 and the legacy hash hex.
fn small_hashes(rx: Receiver<Chunk>) -> (String, u32, String) {
    let mut b3 = blake3::Hasher::new();
    let mut crc = crc32fast::Hasher::new();
    let mut legacy = Sha256::new();
    for (offset, chunk) in rx {
        b3.update(&chunk);
        crc.update(&chunk);
        legacy.update(clip(offset, &chunk, LEGACY_START, LEGACY_END));
    }
    let legacy: [u8; 32] = legacy.finalize().into();
    (
        b3.finalize().to_hex().to_string(),
        crc.finalize(),
        hex(&legacy),
    )
}

/// A safetensors header's `__metadata__` object.
type HeaderMetadata = serde_json::Map<String, serde_json::Value>;

/// `N` and the `__metadata__` object of a safetensors file; `None` for other files. Metadata
/// that does not parse is left out: the hashes do not depend on it.
fn safetensors_header(
    file: &mut impl Read,
    size: u64,
) -> std::io::Result<Option<(u64, Option<HeaderMetadata>)>> {
    let mut head = Vec::with_capacity(16);
    file.by_ref().take(16).read_to_end(&mut head)?;
    if FileKind::sniff(&head, size) != FileKind::Safetensors {
        return Ok(None);
    }
    let n = u64::from_le_bytes(head[..8].try_into().expect("sniff saw 8 bytes"));
    if n > MAX_HEADER {
        return Ok(Some((n, None)));
    }
    let mut json = head[8..].to_vec();
    file.by_ref()
        .take(n.saturating_sub(json.len() as u64))
        .read_to_end(&mut json)?;
    json.truncate(n as usize);
    let meta = serde_json::from_slice::<serde_json::Value>(&json)
        .ok()
        .and_then(|v| v.get("__metadata__").and_then(|m| m.as_object()).cloned());
    Ok(Some((n, meta)))
}

fn read_full(file: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_takes_the_overlap() {
        assert_eq!(clip(10, b"abcdef", 12, 14), b"cd");
        assert_eq!(clip(10, b"abcdef", 0, u64::MAX), b"abcdef");
        assert_eq!(clip(10, b"abcdef", 16, 20), b"");
        assert_eq!(clip(10, b"abcdef", 0, 10), b"");
    }
}
