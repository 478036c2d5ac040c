//! Component digests: `crc32c:0x…` (what crate 1.0.0 writes) and `sha256:…` (named by the v1.0
//! spec, first written by later releases), both over the bytes as stored on disk.

use crate::formats::hex;
use sha2::{Digest as _, Sha256};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digest {
    Crc32c(u32),
    Sha256([u8; 32]),
}

/// What a manifest's `digest` text turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    Known(Digest),
    /// An algorithm the v1.0 spec does not name: the data is read unverified.
    Unknown(String),
}

impl Digest {
    /// Parses `crc32c:0x805104B9` (hex in either case, `0x` optional) or `sha256:<64 hex>`.
    /// A known algorithm with a malformed value is an error: the manifest promises a check that
    /// cannot be made.
    pub fn parse(text: &str) -> Result<Parsed, String> {
        let Some((algo, value)) = text.split_once(':') else {
            return Err(format!("digest `{text}` is not `algorithm:value`"));
        };
        match algo {
            "crc32c" => {
                let hex = value
                    .strip_prefix("0x")
                    .or_else(|| value.strip_prefix("0X"))
                    .unwrap_or(value);
                if hex.is_empty() || hex.len() > 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "digest `{text}` is not `crc32c:0x` and up to 8 hex digits"
                    ));
                }
                let v =
                    u32::from_str_radix(hex, 16).map_err(|e| format!("digest `{text}`: {e}"))?;
                Ok(Parsed::Known(Digest::Crc32c(v)))
            }
            "sha256" => {
                if value.len() != 64 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "digest `{text}` is not `sha256:` and 64 hex digits"
                    ));
                }
                let mut out = [0u8; 32];
                for (i, byte) in out.iter_mut().enumerate() {
                    *byte = u8::from_str_radix(&value[2 * i..2 * i + 2], 16)
                        .map_err(|e| format!("digest `{text}`: {e}"))?;
                }
                Ok(Parsed::Known(Digest::Sha256(out)))
            }
            _ => Ok(Parsed::Unknown(algo.to_string())),
        }
    }

    /// The manifest spelling our writer uses (crate 1.0.0's for crc32c).
    pub fn text(&self) -> String {
        match self {
            Digest::Crc32c(v) => format!("crc32c:0x{v:08X}"),
            Digest::Sha256(bytes) => format!("sha256:{}", hex(bytes)),
        }
    }
}

/// Hashes stored bytes as they stream past, for one algorithm (or none).
pub enum Hasher {
    None,
    Crc32c(u32),
    Sha256(Box<Sha256>),
}

impl Hasher {
    pub fn like(digest: Option<&Digest>) -> Hasher {
        match digest {
            None => Hasher::None,
            Some(Digest::Crc32c(_)) => Hasher::Crc32c(0),
            Some(Digest::Sha256(_)) => Hasher::Sha256(Box::default()),
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::None => {}
            Hasher::Crc32c(crc) => *crc = crc32c::crc32c_append(*crc, bytes),
            Hasher::Sha256(h) => h.update(bytes),
        }
    }

    pub fn finish(self) -> Option<Digest> {
        match self {
            Hasher::None => None,
            Hasher::Crc32c(crc) => Some(Digest::Crc32c(crc)),
            Hasher::Sha256(h) => Some(Digest::Sha256(h.finalize().into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_writers_write_and_what_the_reference_reader_accepts() {
        assert_eq!(
            Digest::parse("crc32c:0x805104B9"),
            Ok(Parsed::Known(Digest::Crc32c(0x805104B9)))
        );
        assert_eq!(
            Digest::parse("crc32c:0x805104b9"),
            Ok(Parsed::Known(Digest::Crc32c(0x805104B9)))
        );
        assert_eq!(
            Digest::parse("crc32c:805104b9"),
            Ok(Parsed::Known(Digest::Crc32c(0x805104B9)))
        );
        assert!(Digest::parse("crc32c:0xZZ").is_err());
        assert!(Digest::parse("crc32c:0x123456789").is_err());
        assert!(Digest::parse("sha256:00").is_err());
        assert!(Digest::parse("nocolon").is_err());
        assert_eq!(
            Digest::parse("blake3:abcd"),
            Ok(Parsed::Unknown("blake3".into()))
        );
        let sha = format!("sha256:{}", "AB".repeat(32));
        assert_eq!(
            Digest::parse(&sha),
            Ok(Parsed::Known(Digest::Sha256([0xab; 32])))
        );
        assert_eq!(Digest::Sha256([0xab; 32]).text(), sha.to_lowercase());
        assert_eq!(Digest::Crc32c(0xb9).text(), "crc32c:0x000000B9");
    }

    #[test]
    fn streamed_crc_equals_one_shot() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut h = Hasher::like(Some(&Digest::Crc32c(0)));
        for chunk in data.chunks(77) {
            h.update(chunk);
        }
        assert_eq!(h.finish(), Some(Digest::Crc32c(crc32c::crc32c(&data))));
    }
}
