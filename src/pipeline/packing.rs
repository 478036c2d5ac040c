//! The packed latent space the FLUX transformers share: the VAE's latents patchified 2×2 into token
//! channels, packed into one row a token, and the Euler step as their scheduler rounds it.

use crate::mlx::{self, Array, Dtype};

/// VAE latents `[C, 2h, 2w]` → token space `[4C, h, w]`, channel `c·4 + 2·dy + dx` holding
/// `[c, 2i + dy, 2j + dx]`.
pub fn patchify(z: &Array) -> mlx::Result<Array> {
    let s = z.shape();
    let (c, h, w) = (s[0], s[1] / 2, s[2] / 2);
    z.reshape(&[c, h, 2, w, 2])?
        .transpose(&[0, 2, 4, 1, 3])?
        .reshape(&[4 * c, h, w])
}

/// `[C, h, w]` → `[h·w, C]`, token `n = i·w + j`.
pub fn pack(x: &Array) -> mlx::Result<Array> {
    let s = x.shape();
    x.reshape(&[s[0], s[1] * s[2]])?.transpose(&[1, 0])
}

/// `x + dt·v` as the scheduler computes it: `dt·v` in v's dtype, the sum in f32, the result in
/// v's dtype (in f32 simply the Euler step).
pub fn euler_step(x: &Array, v: &Array, dt: f32) -> mlx::Result<Array> {
    (x.astype(Dtype::F32)? + (v * dt)?.astype(Dtype::F32)?)?.astype(v.dtype())
}
