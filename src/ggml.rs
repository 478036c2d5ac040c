//! ggml's tensor types (the element encodings of GGUF files) and what each becomes in the store.
//!
//! A quantized ggml tensor is a sequence of blocks along its innermost axis (a row, in torch
//! order), each holding a fixed number of values. Five block types are affine per 32 values,
//! `w = d·q + m` with `d`, `m` in f16 and small unsigned `q`, so they map exactly onto MLX's
//! affine quantization with group 32 (`scale = d`, `bias = m`): Q4_0 is `d·(q − 8)`, so its
//! bias is `−8d`; Q8_0's signed `q` becomes `q + 128` with bias `−128d`. Q4_K and Q5_K have
//! 32-value sub-blocks with scale `d·sc` and min `dmin·m` (6-bit `sc`, `m`), so they map the same
//! way. Q2_K, Q3_K and Q6_K scale 16-value sub-blocks, which no 32-value group reproduces: they
//! are re-quantized.
//!
//! The symmetric types (Q4_0, Q5_0, Q8_0: `d·(q − 2^(bits−1))`) keep their f16 `d` as it is and
//! no bias, in zimage's symmetric mode, which computes `scale·(q − 2^(bits−1))` in f32: one
//! exact product, as ggml computes it, at the file's own size (4.5 bits a weight for Q4_0).
//! The others keep scales and biases in f32: `d·q` has at most 21 significant bits, so every
//! product and the sum of MLX's `scale·q + bias` round exactly as the reference dequantizer's
//! f32 arithmetic does (`d·q + m` rounds once in both). In f16 or bf16 MLX's own arithmetic
//! would round the products.

/// ggml's type ids, as GGUF tensor infos carry them.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// `(type, id, values per block, bytes per block)` for every type ggml defines.
const TYPES: [(GgmlType, u32, u64, u64); 32] = [
    (GgmlType::F32, 0, 1, 4),
    (GgmlType::F16, 1, 1, 2),
    (GgmlType::Q4_0, 2, 32, 18),
    (GgmlType::Q4_1, 3, 32, 20),
    (GgmlType::Q5_0, 6, 32, 22),
    (GgmlType::Q5_1, 7, 32, 24),
    (GgmlType::Q8_0, 8, 32, 34),
    (GgmlType::Q8_1, 9, 32, 36),
    (GgmlType::Q2_K, 10, 256, 84),
    (GgmlType::Q3_K, 11, 256, 110),
    (GgmlType::Q4_K, 12, 256, 144),
    (GgmlType::Q5_K, 13, 256, 176),
    (GgmlType::Q6_K, 14, 256, 210),
    (GgmlType::Q8_K, 15, 256, 292),
    (GgmlType::IQ2_XXS, 16, 256, 66),
    (GgmlType::IQ2_XS, 17, 256, 74),
    (GgmlType::IQ3_XXS, 18, 256, 98),
    (GgmlType::IQ1_S, 19, 256, 50),
    (GgmlType::IQ4_NL, 20, 32, 18),
    (GgmlType::IQ3_S, 21, 256, 110),
    (GgmlType::IQ2_S, 22, 256, 82),
    (GgmlType::IQ4_XS, 23, 256, 136),
    (GgmlType::I8, 24, 1, 1),
    (GgmlType::I16, 25, 1, 2),
    (GgmlType::I32, 26, 1, 4),
    (GgmlType::I64, 27, 1, 8),
    (GgmlType::F64, 28, 1, 8),
    (GgmlType::IQ1_M, 29, 256, 56),
    (GgmlType::BF16, 30, 1, 2),
    (GgmlType::TQ1_0, 34, 256, 54),
    (GgmlType::TQ2_0, 35, 256, 66),
    (GgmlType::MXFP4, 39, 32, 17),
];

/// Values per K-quant super-block.
const QK_K: usize = 256;

impl GgmlType {
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().find(|t| t.1 == id).map(|t| t.0)
    }

    fn row(self) -> &'static (GgmlType, u32, u64, u64) {
        TYPES
            .iter()
            .find(|t| t.0 == self)
            .expect("every type is listed")
    }

    pub fn id(self) -> u32 {
        self.row().1
    }

    /// Values per block (1 for plain types).
    pub fn block_len(self) -> u64 {
        self.row().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        self.row().3
    }

    /// ggml's own spelling (`Q4_K`, `BF16`).
    pub fn name(self) -> String {
        format!("{self:?}")
    }

    /// Bytes of `numel` values, `None` when they do not fill whole blocks or overflow.
    pub fn nbytes(self, numel: u64) -> Option<u64> {
        if !numel.is_multiple_of(self.block_len()) {
            return None;
        }
        (numel / self.block_len()).checked_mul(self.block_bytes())
    }

    /// The safetensors dtype of a plain (one value per block) type.
    pub fn plain_dtype(self) -> Option<crate::dtype::Dtype> {
        use crate::dtype::Dtype;
        Some(match self {
            GgmlType::F32 => Dtype::F32,
            GgmlType::F16 => Dtype::F16,
            GgmlType::BF16 => Dtype::BF16,
            GgmlType::F64 => Dtype::F64,
            GgmlType::I8 => Dtype::I8,
            GgmlType::I16 => Dtype::I16,
            GgmlType::I32 => Dtype::I32,
            GgmlType::I64 => Dtype::I64,
            _ => return None,
        })
    }

    /// What an import does with this type, `None` for types it refuses.
    pub fn import_path(self) -> Option<ImportPath> {
        Some(match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ImportPath::Plain,
            GgmlType::Q4_0 => ImportPath::Symmetric { bits: 4 },
            GgmlType::Q5_0 => ImportPath::Symmetric { bits: 5 },
            GgmlType::Q8_0 => ImportPath::Symmetric { bits: 8 },
            GgmlType::Q4_1 | GgmlType::Q4_K => ImportPath::Exact { bits: 4 },
            GgmlType::Q5_1 | GgmlType::Q5_K => ImportPath::Exact { bits: 5 },
            GgmlType::Q2_K | GgmlType::Q3_K => ImportPath::Requantize { bits: 4 },
            GgmlType::Q6_K => ImportPath::Requantize { bits: 8 },
            _ => return None,
        })
    }
}

impl ImportPath {
    /// Whether the values are the file's own, bit for bit.
    pub fn exact(self) -> bool {
        !matches!(self, ImportPath::Requantize { .. })
    }

    /// What the store holds, e.g. `q4_0 (symmetric int4, group 32, exact)`.
    pub fn describe(self, ty: GgmlType) -> String {
        match self {
            ImportPath::Plain => format!("{ty} as it is"),
            ImportPath::Symmetric { bits } => format!(
                "{} (symmetric int{bits}, group {GROUP}, exact)",
                ty.name().to_ascii_lowercase()
            ),
            ImportPath::Exact { bits } => format!("int{bits}, group {GROUP} (exact)"),
            ImportPath::Requantize { bits } => format!("int{bits}, group {GROUP} (re-quantized)"),
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Group size of every MLX quantization a ggml type maps to.
pub const GROUP: usize = 32;

/// How a ggml type reaches the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportPath {
    /// Bytes as they are (F32, F16, BF16).
    Plain,
    /// zimage's symmetric mode, group 32: the packed values and f16 scales as they are.
    Symmetric { bits: u32 },
    /// MLX affine quantization, group 32, f32 scales and biases: the same values bit for bit.
    Exact { bits: u32 },
    /// Dequantized, then quantized by MLX (affine, group 32): the nearest MLX mode.
    Requantize { bits: u32 },
}

/// Rows of a weight in MLX's affine quantization: `value = scale·q + bias` per group of 32
/// along a row, `q` packed little-endian `bits` at a time.
#[derive(Debug, Clone, PartialEq)]
pub struct Affine {
    pub bits: u32,
    /// `rows × cols·bits/8` bytes (whole u32 words per row).
    pub packed: Vec<u8>,
    /// `rows × cols/32`.
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Calls `emit(scale, bias, q)` for each 32-value group of one block, in order.
fn block_groups(ty: GgmlType, b: &[u8], emit: &mut dyn FnMut(f32, f32, &[u8; GROUP])) {
    let mut q = [0u8; GROUP];
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let d = f16_at(b, 0);
            let (m, qs) = match ty {
                GgmlType::Q4_0 => (-8.0 * d, &b[2..18]),
                _ => (f16_at(b, 2), &b[4..20]),
            };
            for j in 0..16 {
                q[j] = qs[j] & 0x0F;
                q[j + 16] = qs[j] >> 4;
            }
            emit(d, m, &q);
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let d = f16_at(b, 0);
            let (m, rest) = match ty {
                GgmlType::Q5_0 => (-16.0 * d, &b[2..22]),
                _ => (f16_at(b, 2), &b[4..24]),
            };
            let qh = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
            let qs = &rest[4..20];
            for j in 0..16 {
                q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
            }
            emit(d, m, &q);
        }
        GgmlType::Q8_0 => {
            let d = f16_at(b, 0);
            for j in 0..32 {
                q[j] = (b[2 + j] as i8 as i16 + 128) as u8;
            }
            emit(d, -128.0 * d, &q);
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let d = f16_at(b, 0);
            let dmin = f16_at(b, 2);
            let scales = &b[4..16];
            let (qh, qs) = match ty {
                GgmlType::Q4_K => (None, &b[16..144]),
                _ => (Some(&b[16..48]), &b[48..176]),
            };
            for sub in 0..8 {
                let (sc, m) = k_scale_min(scales, sub);
                // Sub-blocks come in pairs over 32 bytes: low nibbles, then high nibbles.
                let bytes = &qs[(sub / 2) * 32..(sub / 2) * 32 + 32];
                let shift = (sub % 2) * 4;
                for j in 0..32 {
                    let mut v = (bytes[j] >> shift) & 0x0F;
                    if let Some(qh) = qh {
                        v |= ((qh[j] >> sub) & 1) << 4;
                    }
                    q[j] = v;
                }
                emit(d * sc as f32, -(dmin * m as f32), &q);
            }
        }
        _ => unreachable!("{ty} has no 32-value affine groups"),
    }
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block's 12 scale bytes.
fn k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Whole rows of an exactly mapped type (`bytes` holds `rows` rows of `cols` values) as MLX
/// affine groups of 32. `None` for a type without an exact mapping.
pub fn to_affine(ty: GgmlType, bytes: &[u8], cols: usize) -> Option<Affine> {
    let (ImportPath::Exact { bits } | ImportPath::Symmetric { bits }) = ty.import_path()? else {
        return None;
    };
    let block_bytes = ty.block_bytes() as usize;
    let groups = bytes.len() / block_bytes * (ty.block_len() as usize / GROUP);
    let mut out = Affine {
        bits,
        packed: Vec::with_capacity(groups * GROUP * bits as usize / 8),
        scales: Vec::with_capacity(groups),
        biases: Vec::with_capacity(groups),
    };
    debug_assert!(cols.is_multiple_of(ty.block_len() as usize));
    for block in bytes.chunks_exact(block_bytes) {
        block_groups(ty, block, &mut |s, b, q| {
            out.scales.push(s);
            out.biases.push(b);
            pack_group(q, bits, &mut out.packed);
        });
    }
    Some(out)
}

/// Appends 32 values of `bits` bits as a little-endian bit stream (MLX's packing for every
/// width: value i at bit `i·bits`; a group is a whole number of u32 words).
fn pack_group(q: &[u8; GROUP], bits: u32, out: &mut Vec<u8>) {
    let mut acc = 0u64;
    let mut filled = 0;
    for &v in q {
        acc |= u64::from(v) << filled;
        filled += bits;
        while filled >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            filled -= 8;
        }
    }
}

/// The `n` values of a little-endian bit stream of `bits`-bit values (MLX's packing), as bytes.
pub fn unpack(packed: &[u8], bits: u32, n: usize) -> Vec<u8> {
    let mask = (1u32 << bits) - 1;
    (0..n)
        .map(|i| {
            let at = i * bits as usize;
            let (byte, shift) = (at / 8, at % 8);
            let lo = u32::from(packed[byte]);
            let hi = packed.get(byte + 1).map_or(0, |b| u32::from(*b) << 8);
            (((lo | hi) >> shift) & mask) as u8
        })
        .collect()
}

/// One 32-value group of a block type: its scale `d`, its min `m` (Q4_1, Q5_1; ignored by the
/// symmetric types) and its unsigned values (a symmetric type's offset by 2^(bits−1), as
/// [`to_affine`] gives them).
pub struct Group<'a> {
    pub d: half::f16,
    pub m: half::f16,
    pub q: &'a [u8],
}

/// Writes one block of `ty` (Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0) from its group: the inverse of
/// [`to_affine`] for these types, so a block read and written again is the same bytes.
pub fn encode_block(ty: GgmlType, g: &Group, out: &mut Vec<u8>) {
    let q = g.q;
    debug_assert_eq!(q.len(), GROUP);
    out.extend_from_slice(&g.d.to_le_bytes());
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        out.extend_from_slice(&g.m.to_le_bytes());
    }
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            out.extend((0..16).map(|j| (q[j] & 0x0F) | (q[j + 16] << 4)));
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let qh = (0..32).fold(0u32, |h, j| h | (u32::from(q[j] >> 4) & 1) << j);
            out.extend_from_slice(&qh.to_le_bytes());
            out.extend((0..16).map(|j| (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4)));
        }
        GgmlType::Q8_0 => out.extend(q.iter().map(|&v| (i16::from(v) - 128) as i8 as u8)),
        _ => unreachable!("{ty} is not written from 32-value groups"),
    }
}

/// `values` (whole rows of 32-value blocks) quantized to Q8_0 as ggml's reference quantizer
/// does: `d = max|x| / 127` per block, `q = round(x / d)`.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / GROUP * 34);
    let mut q = [0u8; GROUP];
    for block in values.chunks_exact(GROUP) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (q, &x) in q.iter_mut().zip(block) {
            *q = ((x * id).round() as i32 + 128) as u8;
        }
        let group = Group {
            d: half::f16::from_f32(d),
            m: half::f16::ZERO,
            q: &q,
        };
        encode_block(GgmlType::Q8_0, &group, &mut out);
    }
    out
}

/// The values of whole blocks of a quantized or plain float type as f32, as ggml's reference
/// dequantizer computes them. `None` for types it does not cover.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    let n = bytes.len() / ty.block_bytes() as usize * ty.block_len() as usize;
    let mut out = Vec::with_capacity(n);
    match ty {
        GgmlType::F32 => out.extend(
            (bytes.chunks_exact(4)).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))),
        ),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(|c| f16_at(c, 0))),
        GgmlType::BF16 => out.extend(
            (bytes.chunks_exact(2)).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        GgmlType::Q2_K => bytes.chunks_exact(84).for_each(|b| q2_k(b, &mut out)),
        GgmlType::Q3_K => bytes.chunks_exact(110).for_each(|b| q3_k(b, &mut out)),
        GgmlType::Q6_K => bytes.chunks_exact(210).for_each(|b| q6_k(b, &mut out)),
        _ => {
            if !matches!(
                ty.import_path()?,
                ImportPath::Exact { .. } | ImportPath::Symmetric { .. }
            ) {
                return None;
            }
            for block in bytes.chunks_exact(ty.block_bytes() as usize) {
                block_groups(ty, block, &mut |s, b, q| {
                    out.extend(q.iter().map(|&v| s * f32::from(v) + b));
                });
            }
        }
    }
    Some(out)
}

/// Q2_K: 16 sub-blocks of 16, 4-bit scale and min each; `q` 2 bits.
fn q2_k(b: &[u8], out: &mut Vec<f32>) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    let mut vals = [0f32; QK_K];
    for (i, v) in vals.iter_mut().enumerate() {
        // 128 values per 32 bytes: byte i % 32 of half i / 128, shifted by 2·((i / 32) % 4).
        let byte = qs[(i / 128) * 32 + i % 32];
        let q = (byte >> (2 * ((i / 32) % 4))) & 3;
        let sc = scales[i / 16];
        *v = d * f32::from(sc & 0x0F) * f32::from(q) - dmin * f32::from(sc >> 4);
    }
    out.extend_from_slice(&vals);
}

/// Q3_K: 16 sub-blocks of 16, signed 6-bit scales; `q` 2 low bits plus a high-bit mask.
fn q3_k(b: &[u8], out: &mut Vec<f32>) {
    let (hmask, qs, s) = (&b[..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    let scale = |j: usize| -> f32 {
        let low = (s[j % 8] >> (4 * (j / 8))) & 0x0F;
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        f32::from(((low | (high << 4)) as i8) - 32)
    };
    for i in 0..QK_K {
        let low = (qs[(i / 128) * 32 + i % 32] >> (2 * ((i / 32) % 4))) & 3;
        let high_set = (hmask[i % 32] >> (i / 32)) & 1 == 1;
        let q = low as i8 - if high_set { 0 } else { 4 };
        out.push(d * scale(i / 16) * f32::from(q));
    }
}

/// Q6_K: 16 sub-blocks of 16, signed 8-bit scales; `q` 4 low bits plus 2 high bits, minus 32.
fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for i in 0..QK_K {
        let half = i / 128;
        let j = i % 128;
        let low = (ql[half * 64 + j % 64] >> (4 * (j / 64))) & 0x0F;
        let high = (qh[half * 32 + j % 32] >> (2 * (j / 32))) & 0x03;
        let q = (low | (high << 4)) as i8 - 32;
        out.push(d * f32::from(scales[i / 16] as i8) * f32::from(q));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_block_layouts() {
        assert_eq!(GgmlType::Q4_0.nbytes(64), Some(36));
        assert_eq!(GgmlType::Q4_K.nbytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.nbytes(32), None, "not whole blocks");
        assert_eq!(GgmlType::from_id(30), Some(GgmlType::BF16));
        assert_eq!(GgmlType::from_id(4), None, "Q4_2 was removed");
    }

    #[test]
    fn q4_0_is_d_times_q_minus_8() {
        let mut block = half::f16::from_f32(0.5).to_le_bytes().to_vec();
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let a = to_affine(GgmlType::Q4_0, &block, 32).expect("exact");
        assert_eq!((a.scales[0], a.biases[0]), (0.5, -4.0));
        let v = dequantize(GgmlType::Q4_0, &block).expect("covered");
        assert_eq!(v[0], -4.0);
        assert_eq!(v[16], 0.5 * 7.0);
        // MLX's packing: value 0 in the low nibble of byte 0, value 1 in its high nibble.
        assert_eq!(a.packed[0], 0x10);
    }

    #[test]
    fn blocks_written_from_their_groups_are_the_bytes_read() {
        // Arbitrary bytes are valid blocks of these types (d, m any f16 but NaN).
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        };
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
        ] {
            let mut block: Vec<u8> = (0..ty.block_bytes()).map(|_| next()).collect();
            block[0] = 0x00; // d = a small normal f16
            block[1] = 0x20;
            if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                block[3] = 0x21;
            }
            let a = to_affine(ty, &block, GROUP).expect("exact");
            let q = unpack(&a.packed, a.bits, GROUP);
            let group = Group {
                d: half::f16::from_f32(a.scales[0]),
                m: half::f16::from_f32(a.biases[0]),
                q: &q,
            };
            let mut again = Vec::new();
            encode_block(ty, &group, &mut again);
            assert_eq!(again, block, "{ty}");
        }
    }

    #[test]
    fn q8_0_quantizes_to_the_nearest_step() {
        let values: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.1).collect();
        let bytes = quantize_q8_0(&values);
        assert_eq!(bytes.len(), 34);
        let back = dequantize(GgmlType::Q8_0, &bytes).expect("covered");
        let d = 1.6f32 / 127.0;
        for (a, b) in back.iter().zip(&values) {
            assert!((a - b).abs() <= d / 2.0 + 1e-3 * d, "{a} vs {b}");
        }
        assert_eq!(quantize_q8_0(&[0.0; 32])[2..], [0u8; 32]);
    }

    #[test]
    fn packs_five_bits_as_a_bit_stream() {
        let mut q = [0u8; GROUP];
        q[0] = 31;
        q[1] = 1;
        let mut out = Vec::new();
        pack_group(&q, 5, &mut out);
        assert_eq!(out.len(), 20);
        assert_eq!(out[0], 0b0011_1111);
        assert_eq!(out[1], 0);
    }
}
