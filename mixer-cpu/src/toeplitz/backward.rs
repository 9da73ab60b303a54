//! The Toeplitz mixer's backward pass on CPU (MATH.md §3), by FFT correlation with the
//! cached plans and kernel spectra of the forward pass ([`super::fft`]).
//!
//! With `ȳ` the output cotangent and `rev` the reversal of a length-`T` column,
//! `x̄[s, c] = Σ_i Σ_{j ≥ 0} w[i,h,j] ȳ[s + j, c + δ_i]
//!  = Σ_i (w_{i,h} * rev ȳ_{c+δ_i})[T−1−s],`
//! `w̄[i,h,j] = Σ_b Σ_e Σ_s x[s, e−δ_i] ȳ[s+j, e]
//!  = (Σ_{b,e} x_{e−δ_i} * rev ȳ_e)[T−1−j],`
//! (sums over the output channels `e` of head `h` for which shift `i` is valid), and
//! `overline(bias)[h,t] = Σ_b Σ_{e ∈ h} ȳ[t,e]`. Each convolution is one
//! product of spectra of size `p ≥ 2T−1`, so the pass costs a constant number of FFTs per
//! column, like the forward. Taps and bias entries beyond `T` get gradient 0.

use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::tensor::get;
use mixer_core::{Error, Form, Requires, Result, Tensors, grad_name};
use mixer_registry::{BackwardEntry, every_config, register};
use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;
use realfft::num_complex::Complex;

use mixer_core::mixers::toeplitz::fast_size;

use super::columns::{Columns, columns, from_columns};
use super::fast::{Buffers, FftReal, column_spectra, plans, tap_spectra};

/// The `fast` backward (see the module documentation).
pub fn vjp<F: FftReal>(
    m: &dyn Mixer,
    form: Form,
    inputs: &Tensors<F>,
    dy: &ArrayD<F>,
    req: &Requires,
) -> Result<Tensors<F>> {
    crate::fast_backward_only(m, form)?;
    let tm = downcast::<Toeplitz>(m, "cpu")?;
    let p = tm.prepare(inputs)?;
    let (t, c, d, nb) = (p.seq, p.channels, p.head_dim, p.batch);
    let w = get(inputs, "w")?;
    let mut out = Tensors::new();
    let mut dw = ArrayD::<F>::zeros(w.raw_dim());
    let mut dx = ArrayD::<F>::zeros(IxDyn(&[nb, t, c]));
    if let Some(b) = inputs.get("bias")
        && req.wants("bias")
    {
        let mut db = ArrayD::<F>::zeros(b.raw_dim());
        for ((_, ti, e), &g) in dy
            .view()
            .into_dimensionality::<ndarray::Ix3>()
            .map_err(|e| Error::Numerical(e.to_string()))?
            .indexed_iter()
        {
            db[[e / d, ti]] += g;
        }
        out.insert(grad_name("bias"), db);
    }
    if t == 0 || c == 0 || nb == 0 {
        out.insert(grad_name("x"), dx);
        out.insert(grad_name("w"), dw);
        return Ok(out);
    }
    let pl = plans::<F>(fast_size(2 * t - 1));
    // Spectra of the reversed cotangent columns, one per (b, e).
    let mut gcols = columns(dy);
    gcols.data.chunks_mut(t).for_each(|col| col.reverse());
    let g_hat = column_spectra(&gcols, &pl)?;
    if req.wants("x") {
        let w_hat = tap_spectra(&p.taps, p.kernel_width * p.heads, t, &pl)?;
        let cols: Vec<Vec<F>> = (0..nb * c)
            .into_par_iter()
            .map_init(
                || Buffers::new(&pl),
                |buf, idx| {
                    let (b, ci) = (idx / c, idx % c);
                    let h = ci / d;
                    buf.spec.iter_mut().for_each(|z| *z = Complex::default());
                    for i in 0..p.kernel_width {
                        let dl = p.kernel_width - 1 - i;
                        // Output channel e = ci + δᵢ must stay in the head.
                        if ci % d + dl >= d {
                            continue;
                        }
                        let wk = &w_hat[i * p.heads + h];
                        let gk = &g_hat[b * c + ci + dl];
                        for ((acc, a), bb) in buf.spec.iter_mut().zip(wk).zip(gk) {
                            *acc += a * bb;
                        }
                    }
                    buf.inverse(&pl)?;
                    Ok((0..t).map(|s| buf.real[t - 1 - s]).collect())
                },
            )
            .collect::<Result<_>>()?;
        dx = from_columns(&Columns { data: cols.concat(), len: t }, nb, c);
    }
    if req.wants("w") {
        let x_hat = column_spectra(&columns(get(inputs, "x")?), &pl)?;
        let scale = F::one() / F::of(pl.len() as f64);
        let rows: Vec<Vec<F>> = (0..p.kernel_width * p.heads)
            .into_par_iter()
            .map_init(
                || Buffers::new(&pl),
                |buf, r| {
                    let (i, h) = (r / p.heads, r % p.heads);
                    let dl = p.kernel_width - 1 - i;
                    buf.spec.iter_mut().for_each(|z| *z = Complex::default());
                    for b in 0..nb {
                        for e in h * d + dl.min(d)..(h + 1) * d {
                            let (xk, gk) = (&x_hat[b * c + e - dl], &g_hat[b * c + e]);
                            for ((acc, a), bb) in buf.spec.iter_mut().zip(xk).zip(gk) {
                                *acc += a * bb;
                            }
                        }
                    }
                    buf.inverse(&pl)?;
                    Ok((0..t).map(|j| buf.real[t - 1 - j] * scale).collect())
                },
            )
            .collect::<Result<_>>()?;
        for (r, row) in rows.iter().enumerate() {
            let (i, h) = (r / p.heads, r % p.heads);
            for (j, &v) in row.iter().enumerate() {
                if w.ndim() == 2 {
                    dw[[h, j]] = v;
                } else {
                    dw[[i, h, j]] = v;
                }
            }
        }
    }
    out.insert(grad_name("x"), dx);
    out.insert(grad_name("w"), dw);
    Ok(out)
}

#[register]
static TOEPLITZ_CPU_BACKWARD: BackwardEntry = BackwardEntry {
    kernel: mixer_core::mixers::toeplitz::FAMILY,
    backend: "cpu",
    forms: &[Form::Fast],
    unsupported: every_config,
    vjp_f64: vjp::<f64>,
    vjp_f32: vjp::<f32>,
};
