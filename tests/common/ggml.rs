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
