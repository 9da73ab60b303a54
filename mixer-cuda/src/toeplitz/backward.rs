//! The backward pass of the Toeplitz mixer's `fast` form on CUDA (docs/gradients.md), for
//! `y[t, e] = Σ_i Σ_{s ≤ t} w[i, h(e), t − s] x[s, src(e, i)] + bias[h(e), t]`
//! (`src(e, i) = e + i − (K_w − 1)` within the head, docs/math.md §3):
//!
//! - `d_x[s, c] = Σ_i Σ_{t ≥ s} w[i, h(c), t − s] dy[t, src_adj(c, i)]`
//!   (`src_adj(c, i) = c + (K_w − 1 − i)`): a correlation, computed as the forward's spectral
//!   product in its adjoint form, `d̂x[c] = Σ_i conj(ŵ[i, h(c)]) · d̂y[src_adj(c, i)]`, with the
//!   forward's cached kernel spectra ([`super::spectra`]), its packing, plans and unpacking;
//! - `d_w[i, h, Δ] = Σ_b Σ_{e ∈ h} Σ_t dy[b, t, e] x[b, t − Δ, src(e, i)]` for `Δ < T`, zero for
//!   `T ≤ Δ < T_w` (the taps the forward never reads): the inverse transform of
//!   `Σ_b Σ_e conj(x̂[b, src(e, i)]) · d̂y[b, e]`, one thread per (tap row, head, bin) summing in a
//!   fixed order;
//! - `d_bias[h, t] = Σ_b Σ_{e ∈ h} dy[b, t, e]` for `t < T`, zero beyond.
//!
//! Transforms of the forward's size `p ≥ 2T − 1` (`fast::transform_size`; no wrap-around:
//! every lag and shift below `T` is linear). Extra memory: the spectra of `dy` (and of `x` for `d_w`), `B·C·(p/2+1)`
//! complex values each. Deterministic: no atomics. The `tf32` and `bf16` modes run the same
//! `f32` transforms (bf16 activations and `dy` converted on the device).

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Precision, Requires, Result, grad_name};

use super::common::{FAMILY, prepare};
use super::fast::{mul_grid, tiles, transform_sizes};
use crate::fft::{FftReal, irfft, rfft};
use crate::forms::cotangent;
use crate::kernels;
use crate::pool;
use crate::runtime::{gpu, grid1, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// The `fast` backward on device tensors: `d_x`, `d_w` and `d_bias` (where `bias` is given),
/// those `req` asks for, each of its input's shape, nothing waited for.
pub fn run<F: FftReal>(
    tz: &Toeplitz,
    x: &DeviceTensors,
    dy: &AnyDeviceTensor,
    req: &Requires,
    _p: Precision,
) -> Result<DeviceTensors> {
    let d = prepare::<F>(tz, x)?;
    let (b, t, c) = (d.b, d.t, d.c);
    let gy = cotangent::<F>(dy, &[b, t, c])?;
    let (h, kw) = (tz.cfg.heads, tz.cfg.kernel_width);
    let (want_x, want_w) = (req.wants("x"), req.wants("w"));
    let want_b = d.bias.is_some() && req.wants("bias");
    let w_shape = d.w.shape().to_vec();
    let b_shape = d.bias.as_ref().map(|v| v.shape().to_vec());
    let mut out = DeviceTensors::new();
    let mut put = |name: &str, g: DeviceTensor<F>| {
        out.insert(grad_name(name), F::wrap(g));
    };
    if b * t * c == 0 {
        // No output: every gradient is zero.
        if want_x {
            put("x", DeviceTensor::zeros(&[b, t, c])?);
        }
        if want_w {
            put("w", DeviceTensor::zeros(&w_shape)?);
        }
        if let (true, Some(s)) = (want_b, &b_shape) {
            put("bias", DeviceTensor::zeros(s)?);
        }
        return Ok(out);
    }
    let (n, nf) = transform_sizes(t, b, c, kw, h)?;
    let g = gpu()?;
    let f = |name: &str| g.kernel(FAMILY, &kernels::TOEPLITZ, &[], &format!("{name}_{}", F::SUFFIX));
    let fb =
        |name: &str| g.kernel(FAMILY, &kernels::TOEPLITZ_BACKWARD, &[], &format!("{name}_{}", F::SUFFIX));
    let [bi, ti, ci, hi, kwi, lw, lb] = d.dims;
    let (ni, nfi) = (int(FAMILY, "p", n)?, int(FAMILY, "p/2+1", nf)?);
    let (sb, st) = ((t * c) as i64, c as i64);
    // dy as zero-padded rows [B·C, p].
    let mut gp = pool::take::<F>(FAMILY, b * c * n)?;
    let gv = gy.view();
    launch!(g, FAMILY, f("toeplitz_pack_x")?, tiles(n, c, b)?; &gv, &mut *gp, &bi, &ti, &ci, &ni, &sb, &st)?;
    if let (true, Some(s)) = (want_b, &b_shape) {
        let mut db = pool::take::<F>(FAMILY, h * lb as usize)?;
        launch!(g, FAMILY, fb("toeplitz_bias_grad")?, grid1(h * lb as usize, 256);
            &*gp, &mut *db, &bi, &ti, &ci, &hi, &ni, &lb)?;
        put("bias", DeviceTensor::from_pooled(db, s)?);
    }
    if !(want_x || want_w) {
        return Ok(out);
    }
    let gh = rfft::<F>(FAMILY, &gp, n, b * c)?;
    drop(gp);
    if want_x {
        let wh = super::spectra::spectra::<F>(&d.w, kw * h, t, n)?;
        let mut dxh = pool::take::<F::C>(FAMILY, b * c * nf)?;
        launch!(g, FAMILY, f("toeplitz_mul")?, mul_grid(b * c, nf);
            &*gh, &**wh, &mut *dxh, &bi, &ci, &hi, &kwi, &nfi, &1i32)?;
        drop(wh);
        let dxr = irfft::<F>(FAMILY, dxh, n, b * c)?;
        let zero = pool::zeros::<F>(FAMILY, 1)?;
        let no_bias = zero.slice(0..1);
        let mut dx = pool::take::<F>(FAMILY, b * t * c)?;
        launch!(g, FAMILY, f("toeplitz_unpack")?, tiles(t, c, b)?;
            &*dxr, &no_bias, &0i32, &mut *dx, &bi, &ti, &ci, &hi, &ni, &lb)?;
        put("x", DeviceTensor::from_pooled(dx, &[b, t, c])?);
    }
    if want_w {
        let mut xp = pool::take::<F>(FAMILY, b * c * n)?;
        let xv = d.x.view();
        launch!(g, FAMILY, f("toeplitz_pack_x")?, tiles(n, c, b)?; &xv, &mut *xp, &bi, &ti, &ci, &ni, &sb, &st)?;
        let xh = rfft::<F>(FAMILY, &xp, n, b * c)?;
        drop(xp);
        let rows = kw * h;
        let mut dwh = pool::take::<F::C>(FAMILY, rows * nf)?;
        launch!(g, FAMILY, fb("toeplitz_dw_spec")?, grid1(rows * nf, 256);
            &*xh, &*gh, &mut *dwh, &bi, &ci, &hi, &kwi, &nfi)?;
        drop(xh);
        let wr = irfft::<F>(FAMILY, dwh, n, rows)?;
        let mut dw = pool::take::<F>(FAMILY, rows * lw as usize)?;
        let ri = int(FAMILY, "Kw·H", rows)?;
        launch!(g, FAMILY, fb("toeplitz_unpack_w")?, grid1(rows * lw as usize, 256);
            &*wr, &mut *dw, &ri, &ti, &lw, &ni)?;
        put("w", DeviceTensor::from_pooled(dw, &w_shape)?);
    }
    Ok(out)
}
