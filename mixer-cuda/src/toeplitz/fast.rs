//! The FFT form: `y = F⁻¹(Σ_i ŵ_{i,h(e)} · x̂_{e+i−(K_w−1)})[0..T) / p + bias`,
//! with zero-padded transforms of a fast size `p ≥ 2T − 1` (no circular wrap-around).
//! `x` goes to rows of `p` and `y` comes back through tiled shared-memory transposes
//! (coalesced on both sides); the kernel spectra `ŵ` are cached per kernel tensor
//! ([`super::spectra`]). With one tap per channel (`K_w = 1`) and an even number of channels
//! per head, channels `2j` and `2j + 1` share their head's kernel and travel as one complex
//! signal `x_{2j} + i·x_{2j+1}` through complex FFTs of length `p` (no real-transform pre- and
//! post-processing passes, half the rows).

use cudarc::driver::LaunchConfig;
use mixer_core::mixers::toeplitz::{Toeplitz, fast_size};
use mixer_core::{Precision, Result};

use super::common::{FAMILY, prepare};
use crate::fft::{FftReal, cfft, irfft, rfft};
use crate::forms::finish;
use crate::kernels;
use crate::pool;
use crate::runtime::{check_elems, err, gpu, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// The transform size `p` of a length-`T` call, forward and backward alike (the cached kernel
/// spectra are of this size): `p ≥ 2T − 1` (no wrap-around), at least 8 to keep cuFFT away
/// from degenerate sizes.
pub(crate) fn transform_size(t: usize) -> usize {
    fast_size((2 * t - 1).max(8))
}

/// The transform sizes `(p, p/2 + 1)` of a length-`T` call on `B × C` signals and `KW × H`
/// kernels, after checking that the padded signals and spectra fit the kernels' indexing.
pub(crate) fn transform_sizes(t: usize, b: usize, c: usize, kw: usize, h: usize) -> Result<(usize, usize)> {
    let n = transform_size(t);
    check_elems(FAMILY, b * c * n)?;
    check_elems(FAMILY, kw * h * n)?;
    Ok((n, n / 2 + 1))
}

/// The launch of the tiled transposes: 32 × 32 tiles over (`rows`, `c`), one grid layer per
/// batch entry, blocks of 32 × 8 threads.
pub(crate) fn tiles(rows: usize, c: usize, b: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (
            int(FAMILY, "tiles along T", rows.div_ceil(32))? as u32,
            int(FAMILY, "tiles along C", c.div_ceil(32))? as u32,
            u32::try_from(b)
                .ok()
                .filter(|&b| b <= 65535)
                .ok_or_else(|| err(FAMILY, format!("B = {b} exceeds 65535")))?,
        ),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    })
}

/// The launch of `toeplitz_mul` over `rows` spectra of `nf` bins: 256 threads of four bins each
/// per block along x, one spectrum per block row along y (the kernel strides rows by the grid's
/// height, at most 65535).
pub(crate) fn mul_grid(rows: usize, nf: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (nf.div_ceil(1024).max(1) as u32, rows.clamp(1, 65535) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Runs the FFT form on device tensors.
pub fn run<F: FftReal>(tz: &Toeplitz, x: &DeviceTensors, p: Precision) -> Result<AnyDeviceTensor> {
    let d = prepare::<F>(tz, x)?;
    let (b, t, c) = (d.b, d.t, d.c);
    if b * t * c == 0 {
        return finish(DeviceTensor::<F>::zeros(&[b, t, c])?, p);
    }
    let (h, kw) = (tz.cfg.heads, tz.cfg.kernel_width);
    let (n, nf) = transform_sizes(t, b, c, kw, h)?;
    let g = gpu()?;
    let f = |name: &str| g.kernel(FAMILY, &kernels::TOEPLITZ, &[], &format!("{name}_{}", F::SUFFIX));
    let [bi, ti, ci, hi, kwi, _, lb] = d.dims;
    let (ni, nfi) = (int(FAMILY, "p", n)?, int(FAMILY, "p/2+1", nf)?);
    let xv = d.x.view();
    let zero = pool::zeros::<F>(FAMILY, 1)?;
    let (bias, has_bias) = match &d.bias {
        Some(v) => (v.view(), 1i32),
        None => (zero.slice(0..1), 0i32),
    };
    let mut y = pool::take::<F>(FAMILY, b * t * c)?;
    let pairs = kw == 1 && (c / h) % 2 == 0 && d.x.identity().1 % 2 == 0;
    if pairs {
        // x as [B, T, C/2] complex pairs (8- or 16-byte aligned: an even element offset).
        let cp = c / 2;
        let cpi = int(FAMILY, "C/2", cp)?;
        let mut z = pool::take::<F::C>(FAMILY, b * cp * n)?;
        let (sb, st) = ((t * cp) as i64, cp as i64);
        launch!(g, FAMILY, f("toeplitz_pack_pairs")?, tiles(n, cp, b)?; &xv, &mut *z, &bi, &ti, &cpi, &ni, &sb, &st)?;
        let wh = super::spectra::spectra::<F>(&d.w, h, t, n)?;
        let mut zh = cfft::<F>(FAMILY, z, n, b * cp, false)?;
        launch!(g, FAMILY, f("toeplitz_mul_pairs")?, mul_grid(b * cp, n); &mut *zh, &**wh, &bi, &ci, &hi, &ni)?;
        drop(wh);
        let zr = cfft::<F>(FAMILY, zh, n, b * cp, true)?;
        launch!(g, FAMILY, f("toeplitz_unpack_pairs")?, tiles(t, cp, b)?;
            &*zr, &bias, &has_bias, &mut *y, &bi, &ti, &ci, &hi, &ni, &lb)?;
        return finish(DeviceTensor::from_pooled(y, &[b, t, c])?, p);
    }
    let mut xp = pool::take::<F>(FAMILY, b * c * n)?;
    let (sb, st) = ((t * c) as i64, c as i64);
    launch!(g, FAMILY, f("toeplitz_pack_x")?, tiles(n, c, b)?; &xv, &mut *xp, &bi, &ti, &ci, &ni, &sb, &st)?;
    let wh = super::spectra::spectra::<F>(&d.w, kw * h, t, n)?;
    let xh = rfft::<F>(FAMILY, &xp, n, b * c)?;
    drop(xp);
    let mut yh = pool::take::<F::C>(FAMILY, b * c * nf)?;
    launch!(g, FAMILY, f("toeplitz_mul")?, mul_grid(b * c, nf); &*xh, &**wh, &mut *yh, &bi, &ci, &hi, &kwi, &nfi, &0i32)?;
    drop((xh, wh));
    let yr = irfft::<F>(FAMILY, yh, n, b * c)?;
    launch!(g, FAMILY, f("toeplitz_unpack")?, tiles(t, c, b)?;
        &*yr, &bias, &has_bias, &mut *y, &bi, &ti, &ci, &hi, &ni, &lb)?;
    finish(DeviceTensor::from_pooled(y, &[b, t, c])?, p)
}
