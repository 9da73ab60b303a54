//! The FFT form: $y = \mathcal{F}^{-1}\big(\sum_i \hat w_{i,h(e)} \cdot \hat x_{e+i-(K_w-1)}\big)[0..T) / p + \text{bias}$,
//! with zero-padded transforms of a fast size $p \ge 2T - 1$ (no circular wrap-around).

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Result, Tensors};
use ndarray::{ArrayD, IxDyn};

use super::{KERNEL, SRC};
use crate::fft::{FftReal, fast_size, irfft, rfft};
use crate::runtime::{check_elems, gpu, grid1, int, launch, source};

/// Runs the FFT form on the GPU.
pub fn run<F: FftReal>(tz: &Toeplitz, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let p = tz.prepare(inputs)?;
    let (b, t, c, h, kw) = (p.batch, p.seq, p.channels, p.heads, p.kernel_width);
    if b * t * c == 0 {
        return Ok(ArrayD::zeros(IxDyn(&[b, t, c])));
    }
    // p ≥ 2T − 1 (no wrap-around); at least 8 to keep cuFFT away from degenerate sizes.
    let n = fast_size((2 * t - 1).max(8));
    let nf = n / 2 + 1;
    check_elems(KERNEL, b * c * n)?;
    check_elems(KERNEL, kw * h * n)?;
    let g = gpu()?;
    let src = source(SRC);
    let f = |name: &str| g.function(KERNEL, &src, &[], &format!("{name}_{}", F::SUFFIX));
    let (bi, ti, ci, hi, kwi, ni, nfi) = (
        int(KERNEL, "B", b)?,
        int(KERNEL, "T", t)?,
        int(KERNEL, "C", c)?,
        int(KERNEL, "H", h)?,
        int(KERNEL, "Kw", kw)?,
        int(KERNEL, "p", n)?,
        int(KERNEL, "p/2+1", nf)?,
    );
    let x = g.upload(KERNEL, crate::runtime::input(inputs, KERNEL, "x")?)?;
    let mut xp = g.zeros::<F>(KERNEL, b * c * n)?;
    launch!(g, KERNEL, f("toeplitz_pack_x")?, grid1(b * c * n, 256); &x, &mut xp, &bi, &ti, &ci, &ni)?;
    let w = g.upload_slice(KERNEL, &p.taps)?;
    let rows = kw * h;
    let ri = int(KERNEL, "Kw·H", rows)?;
    let mut wp = g.zeros::<F>(KERNEL, rows * n)?;
    launch!(g, KERNEL, f("toeplitz_pack_w")?, grid1(rows * n, 256); &w, &mut wp, &ri, &ti, &ni)?;
    let xh = rfft::<F>(KERNEL, &xp, n, b * c)?;
    let wh = rfft::<F>(KERNEL, &wp, n, rows)?;
    drop((xp, wp));
    let mut yh = g.zeros::<F::C>(KERNEL, b * c * nf)?;
    launch!(g, KERNEL, f("toeplitz_mul")?, grid1(b * c * nf, 256); &xh, &wh, &mut yh, &bi, &ci, &hi, &kwi, &nfi)?;
    drop((xh, wh));
    let yr = irfft::<F>(KERNEL, yh, n, b * c)?;
    let (bias, has_bias) = match &p.bias {
        Some(v) => (g.upload_slice(KERNEL, v)?, 1i32),
        None => (g.zeros::<F>(KERNEL, 1)?, 0i32),
    };
    let mut y = g.zeros::<F>(KERNEL, b * t * c)?;
    launch!(g, KERNEL, f("toeplitz_unpack")?, grid1(b * t * c, 256);
        &yr, &bias, &has_bias, &mut y, &bi, &ti, &ci, &hi, &ni)?;
    g.sync(KERNEL)?;
    g.download(KERNEL, &y, &[b, t, c])
}
