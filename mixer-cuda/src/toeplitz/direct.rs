//! The direct form: `y_{t,e} = Σ_i Σ_{s ≤ t} w[i,h(e),t−s] x[s, e+i−(K_w−1)] + bias[h(e),t]`,
//! one thread per output element, `O(T)` work each.

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Result, Tensors};
use ndarray::{ArrayD, IxDyn};

use super::FAMILY;
use crate::kernels;
use crate::runtime::{GpuReal, check_elems, gpu, grid1, int, launch};
use mixer_core::tensor::get;

/// Runs the direct (parallel) form on the GPU.
pub fn run<F: GpuReal>(tz: &Toeplitz, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let p = tz.prepare(inputs)?;
    let (b, t, c, h, kw) = (p.batch, p.seq, p.channels, p.heads, p.kernel_width);
    if b * t * c == 0 {
        return Ok(ArrayD::zeros(IxDyn(&[b, t, c])));
    }
    check_elems(FAMILY, b * t * c)?;
    let g = gpu()?;
    let f = g.function(FAMILY, &kernels::TOEPLITZ.full(), &[], &format!("toeplitz_direct_{}", F::SUFFIX))?;
    let x = g.upload(FAMILY, get(inputs, "x")?)?;
    let w = g.upload_slice(FAMILY, &p.taps)?;
    let (bias, has_bias) = match &p.bias {
        Some(v) => (g.upload_slice(FAMILY, v)?, 1i32),
        None => (g.zeros::<F>(FAMILY, 1)?, 0i32),
    };
    let mut y = g.zeros::<F>(FAMILY, b * t * c)?;
    let (bi, ti, ci, hi, kwi) = (
        int(FAMILY, "B", b)?,
        int(FAMILY, "T", t)?,
        int(FAMILY, "C", c)?,
        int(FAMILY, "H", h)?,
        int(FAMILY, "Kw", kw)?,
    );
    launch!(g, FAMILY, f, grid1(b * t * c, 128); &x, &w, &bias, &has_bias, &mut y, &bi, &ti, &ci, &hi, &kwi)?;
    g.sync(FAMILY)?;
    g.download(FAMILY, &y, &[b, t, c])
}
