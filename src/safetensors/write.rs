//! Writing the headers our store writes.

use super::*;
use std::collections::BTreeMap;

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
