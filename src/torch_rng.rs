//! PyTorch's CPU random normal numbers, bit for bit:
//! `torch.Generator("cpu").manual_seed(seed)` then `torch.randn(shape, dtype=torch.float32)`,
//! which is how diffusers draws a pipeline's initial noise from a seed.
//!
//! The generator is MT19937 seeded with the low 32 bits of the seed. For a float tensor of at
//! least 16 elements torch fills every element with a uniform `(u32 & 0xFFFFFF) · 2⁻²⁴`, then
//! applies Box–Muller to each block of 16 (element `j` pairs with `j + 8`), and, when the size
//! is not a multiple of 16, redraws the last 16 uniforms and transforms them again. This is the
//! scalar kernel that torch runs on CPUs with AVX-512 (and without AVX2); on AVX2-only CPUs torch
//! uses polynomial approximations of log/sin/cos instead, which differ in the last bits.

/// The Mersenne Twister MT19937 (32-bit), as `std::mt19937` and torch's `at::mt19937`.
pub struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    pub fn new(seed: u64) -> Mt19937 {
        let mut state = [0u32; 624];
        state[0] = seed as u32;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: 624 }
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn twist(&mut self) {
        for i in 0..624 {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7fff_ffff);
            let mut next = self.state[(i + 397) % 624] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= 0x9908_b0df;
            }
            self.state[i] = next;
        }
        self.index = 0;
    }

    /// A float in [0, 1) from the top-quality 24 bits, as torch's `uniform_real_distribution<float>`.
    fn uniform_f32(&mut self) -> f32 {
        (self.next_u32() & 0x00ff_ffff) as f32 * (1.0 / (1u32 << 24) as f32)
    }
}

/// `torch.randn(numel)` from a generator seeded with `seed`. Needs at least 16 elements (every
/// latent tensor has that many); smaller draws use a different torch kernel.
pub fn randn(seed: u64, numel: usize) -> Result<Vec<f32>, String> {
    Generator::new(seed).randn(numel)
}

/// `torch.Generator("cpu").manual_seed(seed)`: successive [`Generator::randn`] calls continue
/// the stream as successive `torch.randn(..., generator=g)` calls do, which is how a pipeline
/// that draws twice (the VAE's latent sample, then the noise) stays seed-compatible.
pub struct Generator {
    rng: Mt19937,
}

impl Generator {
    pub fn new(seed: u64) -> Generator {
        Generator {
            rng: Mt19937::new(seed),
        }
    }

    /// The next `torch.randn(numel)` (f32, at least 16 elements).
    pub fn randn(&mut self, numel: usize) -> Result<Vec<f32>, String> {
        if numel < 16 {
            return Err(format!(
                "torch-compatible noise needs at least 16 elements, asked for {numel}"
            ));
        }
        let rng = &mut self.rng;
        let mut data: Vec<f32> = (0..numel).map(|_| rng.uniform_f32()).collect();
        for start in (0..=numel - 16).step_by(16) {
            box_muller_16(&mut data[start..start + 16]);
        }
        if !numel.is_multiple_of(16) {
            let tail = &mut data[numel - 16..];
            for v in tail.iter_mut() {
                *v = rng.uniform_f32();
            }
            box_muller_16(tail);
        }
        Ok(data)
    }
}

/// Standard normals from 16 uniforms, element `j` paired with `j + 8`, as torch's AVX2 kernel
/// computes them: f32 lanes, with the Cephes-style `log` and `sincos` approximations of
/// `avx_mathfun` (reimplemented here operation by operation, so the roundings match).
fn box_muller_16(d: &mut [f32]) {
    const TWO_PI: f32 = (2.0 * std::f64::consts::PI) as f32;
    for j in 0..8 {
        let u1 = 1.0f32 - d[j];
        let u2 = d[j + 8];
        let radius = (-2.0f32 * cephes_log(u1)).sqrt();
        let (sin, cos) = cephes_sincos(TWO_PI * u2);
        d[j] = radius * cos;
        d[j + 8] = radius * sin;
    }
}

/// `a·b + c` the way the compiled kernel evaluates it (fused).
#[inline]
fn madd(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// Natural log for positive normal floats: range reduction to [√½, √2) then a degree-8
/// polynomial, as Cephes' `logf`.
fn cephes_log(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32 - 0x7f) as f32 + 1.0;
    let mut m = f32::from_bits((bits & !0x7f80_0000) | 0x3f00_0000); // mantissa in [0.5, 1)
    let below = m < std::f32::consts::FRAC_1_SQRT_2;
    let tmp = if below { m } else { 0.0 };
    m -= 1.0;
    if below {
        e -= 1.0;
    }
    let x = m + tmp;
    let z = x * x;
    let mut y = 7.037_683_6e-2f32;
    // The polynomial's coefficients as published, digit for digit.
    #[allow(clippy::excessive_precision)]
    for p in [
        -1.151_461e-1f32,
        1.167_699_9e-1,
        -1.242_014_1e-1,
        1.424_932_3e-1,
        -1.666_805_8e-1,
        2.000_071_4e-1,
        -2.499_999_4e-1,
        3.333_333_1e-1,
    ] {
        y = madd(y, x, p);
    }
    y *= x;
    y *= z;
    y = madd(e, -2.121_944_4e-4, y);
    y = madd(z, -0.5, y);
    let x = x + y;
    madd(e, 0.693_359_4, x)
}

/// `(sin x, cos x)`: reduction by π/4 in three parts, then the Cephes sin and cos polynomials.
fn cephes_sincos(x: f32) -> (f32, f32) {
    let sign_sin = x.is_sign_negative();
    let mut x = x.abs();
    let mut j = (x * 1.273_239_5f32) as i32; // 4/π, truncated
    j = (j + 1) & !1;
    let y = j as f32;
    let swap_sin = j & 4 != 0;
    let poly_is_sin = j & 2 == 0;
    x = madd(y, -0.785_156_25, x);
    x = madd(y, -2.418_756_5e-4, x);
    x = madd(y, -3.774_895e-8, x);
    let sign_cos = (!(j - 2)) & 4 != 0;
    let z = x * x;
    let mut c = 2.443_315_7e-5f32;
    c = madd(c, z, -1.388_731_6e-3);
    c = madd(c, z, 4.166_664_6e-2);
    c *= z;
    c *= z;
    c = madd(z, -0.5, c);
    c += 1.0;
    let mut s = -1.951_529_6e-4f32;
    s = madd(s, z, 8.332_161e-3);
    s = madd(s, z, -1.666_665_5e-1);
    s *= z;
    s = madd(s, x, x);
    let (sin, cos) = if poly_is_sin { (s, c) } else { (c, s) };
    let sin = if sign_sin ^ swap_sin { -sin } else { sin };
    let cos = if sign_cos { -cos } else { cos };
    (sin, cos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_matches_the_standard_sequence() {
        // The C++ standard fixes the 10000th output of a default-seeded mt19937.
        let mut g = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10000 {
            last = g.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn a_second_draw_continues_the_stream_as_torch_does() {
        // g = torch.Generator("cpu").manual_seed(7); torch.randn(20, generator=g);
        // torch.randn(40, generator=g)[[0, 17, 39]]
        let mut g = Generator::new(7);
        let first = g.randn(20).unwrap();
        assert_eq!(first[0], -0.820_134_5);
        let second = g.randn(40).unwrap();
        assert_eq!(
            [second[0], second[17], second[39]],
            [0.957_102_2, -1.060_555, 0.986_226_26]
        );
    }
}
