//! The `parallel` form, direct: `y_{t,e} = Σ_i Σ_{s ≤ t} w[i,h(e),t−s] x[s, e+i−(K_w−1)] + bias[h(e),t]`,
//! one thread per output element, `O(T)` work each.

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Precision, Result};

use super::common::{FAMILY, prepare};
use crate::fft::FftReal;
use crate::forms::finish;
use crate::kernels;
use crate::pool;
use crate::runtime::{check_elems, gpu, grid1, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// Runs the direct (parallel) form on device tensors.
pub fn run<F: FftReal>(tz: &Toeplitz, x: &DeviceTensors, p: Precision) -> Result<AnyDeviceTensor> {
    let d = prepare::<F>(tz, x)?;
    let (b, t, c) = (d.b, d.t, d.c);
    if b * t * c == 0 {
        return finish(DeviceTensor::<F>::zeros(&[b, t, c])?, p);
    }
    check_elems(FAMILY, b * t * c)?;
    let g = gpu()?;
    let f = g.kernel(FAMILY, &kernels::TOEPLITZ, &[], &format!("toeplitz_direct_{}", F::SUFFIX))?;
    let zero = pool::zeros::<F>(FAMILY, 1)?;
    let (bias, has_bias) = match &d.bias {
        Some(v) => (v.view(), 1i32),
        None => (zero.slice(0..1), 0i32),
    };
    let mut y = pool::take::<F>(FAMILY, b * t * c)?;
    let [bi, ti, ci, hi, kwi, lw, lb] = d.dims;
    let (xv, wv) = (d.x.view(), d.w.view());
    launch!(g, FAMILY, f, grid1(b * t * c, 128);
        &xv, &wv, &bias, &has_bias, &mut *y, &bi, &ti, &ci, &hi, &kwi, &lw, &lb)?;
    finish(DeviceTensor::from_pooled(y, &[b, t, c])?, p)
}
