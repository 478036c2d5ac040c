//! ggml blocks written the way llama.cpp lays them out, for GGUF fixtures made in the tests.

/// `values` (rows of 256-multiples) as Q4_K blocks, the way llama.cpp lays them out (144 bytes
/// per 256: f16 d and dmin, twelve bytes of 6-bit sub-block scales and mins, 128 of nibbles),
/// and the values those blocks hold, `d·sc·q − dmin·m`. A plain min/max fit per 32 values: what
/// matters here is the layout, not the quantizer's error.
pub fn q4_k(values: &[f32]) -> (Vec<u8>, Vec<f32>) {
    use half::f16;
    let (mut bytes, mut held) = (Vec::new(), Vec::new());
    for block in values.chunks_exact(256) {
        let subs: Vec<(f32, f32)> = (block.chunks_exact(32))
            .map(|s| {
                let lo = s.iter().copied().fold(0.0f32, f32::min);
                let hi = s.iter().copied().fold(f32::MIN, f32::max);
                ((hi - lo) / 15.0, -lo)
            })
            .collect();
        let d = f16::from_f32(subs.iter().map(|s| s.0).fold(0.0, f32::max) / 63.0);
        let dmin = f16::from_f32(subs.iter().map(|s| s.1).fold(0.0, f32::max) / 63.0);
        let six = |v: f32, unit: f16| match unit.to_f32() {
            u if u > 0.0 => (v / u).round().clamp(0.0, 63.0) as u8,
            _ => 0,
        };
        let sc: Vec<u8> = subs.iter().map(|s| six(s.0, d)).collect();
        let m: Vec<u8> = subs.iter().map(|s| six(s.1, dmin)).collect();
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = sc[j] | (sc[j + 4] >> 4) << 6;
            scales[j + 4] = m[j] | (m[j + 4] >> 4) << 6;
            scales[j + 8] = (sc[j + 4] & 15) | (m[j + 4] & 15) << 4;
        }
        let mut q = [0u8; 256];
        for (j, s) in block.chunks_exact(32).enumerate() {
            let (step, offset) = (
                d.to_f32() * f32::from(sc[j]),
                dmin.to_f32() * f32::from(m[j]),
            );
            for (i, &v) in s.iter().enumerate() {
                let code = match step > 0.0 {
                    true => ((v + offset) / step).round().clamp(0.0, 15.0) as u8,
                    false => 0,
                };
                q[32 * j + i] = code;
                held.push(step * f32::from(code) - offset);
            }
        }
        bytes.extend(d.to_le_bytes());
        bytes.extend(dmin.to_le_bytes());
        bytes.extend(scales);
        for c in 0..4 {
            bytes.extend((0..32).map(|l| q[64 * c + l] | q[64 * c + 32 + l] << 4));
        }
    }
    (bytes, held)
}

/// A tensor as a test writes it into a GGUF file: name, type, shape, data.
pub type Written = (String, GgmlType, Vec<u64>, Vec<u8>);

use zimage::formats::gguf::{self, GgmlType, WriteTensor};

/// An exported GGUF file's tensors twice: every f32 matrix whose rows fill whole 256-value
/// blocks as Q4_K, then the same with the values those blocks hold in f32; the rest as
/// exported in both.
pub fn q4_k_and_widened(exported: &[u8], file: &gguf::Gguf) -> (Vec<Written>, Vec<Written>) {
    let (mut quantized, mut widened) = (Vec::new(), Vec::new());
    for t in &file.tensors {
        let bytes = &exported[t.offset as usize..(t.offset + t.nbytes) as usize];
        let entry = |ty, data| (t.name.clone(), ty, t.shape.clone(), data);
        if t.ggml_type == GgmlType::F32 && t.shape.len() == 2 && t.shape[1] % 256 == 0 {
            let v: Vec<f32> = (bytes.chunks_exact(4))
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let (blocks, held) = q4_k(&v);
            quantized.push(entry(GgmlType::Q4_K, blocks));
            widened.push(entry(
                GgmlType::F32,
                held.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ));
        } else {
            quantized.push(entry(t.ggml_type, bytes.to_vec()));
            widened.push(entry(t.ggml_type, bytes.to_vec()));
        }
    }
    (quantized, widened)
}

/// `tensors` written with `file`'s metadata as a GGUF file at `path`.
pub fn write_like(file: &gguf::Gguf, path: &std::path::Path, tensors: &[Written]) {
    write_with(&file.metadata, path, tensors)
}

/// `tensors` written with `metadata` as a GGUF file at `path`.
pub fn write_with(metadata: &[(String, gguf::Value)], path: &std::path::Path, tensors: &[Written]) {
    let tensors: Vec<WriteTensor> = (tensors.iter())
        .map(|(name, ty, shape, data)| WriteTensor {
            name: name.clone(),
            ggml_type: *ty,
            shape: shape.clone(),
            data,
        })
        .collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf::write(&mut f, metadata, &tensors).unwrap();
}
