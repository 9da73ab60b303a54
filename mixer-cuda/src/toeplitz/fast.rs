//! The FFT form: `y = F⁻¹(Σ_i ŵ_{i,h(e)} · x̂_{e+i−(K_w−1)})[0..T) / p + bias`,
//! with zero-padded transforms of a fast size `p ≥ 2T − 1` (no circular wrap-around).

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Result, Tensors};
use ndarray::{ArrayD, IxDyn};

use super::FAMILY;
use crate::fft::{FftReal, irfft, rfft};
use crate::kernels;
use crate::runtime::{check_elems, gpu, grid1, int, launch};
use mixer_core::mixers::toeplitz::fast_size;
use mixer_core::tensor::get;

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
    check_elems(FAMILY, b * c * n)?;
    check_elems(FAMILY, kw * h * n)?;
    let g = gpu()?;
    let src = kernels::TOEPLITZ.full();
    let f = |name: &str| g.function(FAMILY, &src, &[], &format!("{name}_{}", F::SUFFIX));
    let (bi, ti, ci, hi, kwi, ni, nfi) = (
        int(FAMILY, "B", b)?,
        int(FAMILY, "T", t)?,
        int(FAMILY, "C", c)?,
        int(FAMILY, "H", h)?,
        int(FAMILY, "Kw", kw)?,
        int(FAMILY, "p", n)?,
        int(FAMILY, "p/2+1", nf)?,
    );
    let x = g.upload(FAMILY, get(inputs, "x")?)?;
    let mut xp = g.zeros::<F>(FAMILY, b * c * n)?;
    launch!(g, FAMILY, f("toeplitz_pack_x")?, grid1(b * c * n, 256); &x, &mut xp, &bi, &ti, &ci, &ni)?;
    let w = g.upload_slice(FAMILY, &p.taps)?;
    let rows = kw * h;
    let ri = int(FAMILY, "Kw·H", rows)?;
    let mut wp = g.zeros::<F>(FAMILY, rows * n)?;
    launch!(g, FAMILY, f("toeplitz_pack_w")?, grid1(rows * n, 256); &w, &mut wp, &ri, &ti, &ni)?;
    let xh = rfft::<F>(FAMILY, &xp, n, b * c)?;
    let wh = rfft::<F>(FAMILY, &wp, n, rows)?;
    drop((xp, wp));
    let mut yh = g.zeros::<F::C>(FAMILY, b * c * nf)?;
    launch!(g, FAMILY, f("toeplitz_mul")?, grid1(b * c * nf, 256); &xh, &wh, &mut yh, &bi, &ci, &hi, &kwi, &nfi)?;
    drop((xh, wh));
    let yr = irfft::<F>(FAMILY, yh, n, b * c)?;
    let (bias, has_bias) = match &p.bias {
        Some(v) => (g.upload_slice(FAMILY, v)?, 1i32),
        None => (g.zeros::<F>(FAMILY, 1)?, 0i32),
    };
    let mut y = g.zeros::<F>(FAMILY, b * t * c)?;
    launch!(g, FAMILY, f("toeplitz_unpack")?, grid1(b * t * c, 256);
        &yr, &bias, &has_bias, &mut y, &bi, &ti, &ci, &hi, &ni)?;
    g.sync(FAMILY)?;
    g.download(FAMILY, &y, &[b, t, c])
}
