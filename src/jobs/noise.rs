//! Initial latents from a file (`--noise`) instead of the seed.

use super::error::Error;
use crate::{files, safetensors};
use std::path::Path;

/// The most bytes a noise file may hold beyond its values: the length prefix and a header
/// naming one tensor (with room for metadata).
const HEADER_LIMIT: u64 = 64 << 10;

/// Reads one f32 tensor `noise` of shape [1, C, h, w]. The file is refused by its size before
/// it is read, so a device or a huge file costs nothing.
pub fn read(path: &Path, expected: [i32; 3]) -> Result<Vec<f32>, Error> {
    let bad = |m: String| Error::Request(format!("--noise: {m}"));
    let shown = path.display();
    let values: u64 = expected.iter().map(|&d| d as u64).product();
    let limit = values * 4 + 8 + HEADER_LIMIT;
    let bytes = files::read_bounded(path, limit, "noise file for this size")
        .map_err(|e| bad(e.to_string()))?;
    let header =
        safetensors::parse(&bytes).map_err(|e| Error::Request(e.in_file(path).to_string()))?;
    let t = header
        .tensor("noise")
        .ok_or_else(|| bad(format!("`{shown}` has no tensor `noise`")))?;
    if t.dtype != safetensors::Dtype::F32 {
        return Err(bad(format!(
            "`{shown}`: tensor `noise` is {}, expected F32",
            t.dtype
        )));
    }
    let want: Vec<u64> = std::iter::once(1)
        .chain(expected.iter().map(|&d| d as u64))
        .collect();
    if t.shape != want {
        return Err(bad(format!(
            "`{shown}`: tensor `noise` has shape {:?}, expected {want:?}",
            t.shape
        )));
    }
    let data = header
        .data_start()
        .checked_add(t.data_offsets.0)
        .zip(header.data_start().checked_add(t.data_offsets.1))
        .and_then(|(start, end)| bytes.get(start as usize..end as usize))
        .ok_or_else(|| bad(format!("`{shown}`: tensor `noise` lies outside the file")))?;
    Ok(data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
