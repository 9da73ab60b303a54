//! The Toeplitz mixer's backward pass on CPU (docs/math.md §3), by FFT correlation with the
//! cached plans and kernel spectra of the forward pass ([`super::fast`](mod@super::fast)).
//!
//! With `ȳ` the output cotangent and `rev` the reversal of a length-`T` column,
//! `x̄[s, c] = Σ_i Σ_{j ≥ 0} w[i,h,j] ȳ[s + j, c + δ_i]
//!  = Σ_i (w_{i,h} * rev ȳ_{c+δ_i})[T−1−s],`
//! `w̄[i,h,j] = Σ_b Σ_e Σ_s x[s, e−δ_i] ȳ[s+j, e]
//!  = (Σ_{b,e} x_{e−δ_i} * rev ȳ_e)[T−1−j],`
//! (sums over the output channels `e` of head `h` for which shift `i` is valid), and
//! `overline(bias)[h,t] = Σ_b Σ_{e ∈ h} ȳ[t,e]`. Each convolution is one
//! product of spectra of size `p ≥ 2T−1`, so the pass costs a constant number of FFTs per
//! column, like the forward: with one kernel per head (`Kw = 1`) one thread-local pass per
//! column transforms `rev ȳ` and `x`, inverts `ŵ ⊙ ĝ` for `x̄` and adds `x̂ ⊙ ĝ` to
//! its head's `w̄` spectrum (no spectra stored; the columns in 16 fixed groups whose sums are
//! added in order, so the bits do not depend on the threads); with `Kw > 1` the column spectra are kept,
//! since a column meets its `Kw` neighbours. Taps and bias entries beyond `T` get gradient 0.

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::parallel::min_len;
use mixer_core::tensor::get;
use mixer_core::{Error, Requires, Result, Tensors, grad_name};
use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;
use realfft::num_complex::Complex;

use super::columns::{Columns, columns, from_columns};
use super::fast::{Buffers, FftReal, column_spectra, fft_size, plans, tap_spectra};

/// Column groups of the `w̄` sum with one kernel per head: its partial sums are added in a fixed
/// order, so the result does not depend on the thread count or on the scheduling.
const REDUCE_GROUPS: usize = 16;

/// The `fast` backward (see the module documentation).
pub fn vjp<F: FftReal>(
    tm: &Toeplitz,
    inputs: &Tensors<F>,
    dy: &ArrayD<F>,
    req: &Requires,
) -> Result<Tensors<F>> {
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
    let pl = plans::<F>(fft_size(2 * t - 1));
    // The reversed cotangent columns, one per (b, e).
    let mut gcols = columns(dy);
    gcols.data.chunks_mut(t).for_each(|col| col.reverse());
    let xcols = columns(get(inputs, "x")?);
    let (want_x, want_w) = (req.wants("x"), req.wants("w"));
    let w_hat = if want_x { Some(tap_spectra(&p.taps, p.kernel_width * p.heads, t, &pl)?) } else { None };
    let mut dx_cols = vec![F::zero(); nb * c * t];
    // Σ_{b,e} x̂_{e−δ_i} ⊙ ĝ_e per (i, h), then one inverse per (i, h).
    let dw_spectra = if p.kernel_width == 1 {
        // One kernel per head: every column's cotangent and input spectra are formed, used
        // for x̄ and for the head's w̄ accumulator, and dropped, in one thread-local pass.
        let nspec = pl.len() / 2 + 1;
        let zeros = || vec![vec![Complex::<F>::default(); nspec]; p.heads];
        // Fixed groups of consecutive columns (a function of the shape only), each summed in
        // column order, then the groups in order: the same bits on any number of threads.
        let cols_per_group = (nb * c).div_ceil(REDUCE_GROUPS);
        let partial: Vec<Vec<Vec<Complex<F>>>> = dx_cols
            .par_chunks_mut(cols_per_group * t)
            .with_min_len(min_len())
            .enumerate()
            .map(|(gi, group)| -> Result<_> {
                let (mut buf, mut gs, mut acc) =
                    (Buffers::new(&pl), vec![Complex::<F>::default(); nspec], zeros());
                for (k, dxc) in group.chunks_mut(t).enumerate() {
                    let idx = gi * cols_per_group + k;
                    let h = (idx % c) / d;
                    buf.forward(&pl, gcols.col(idx))?;
                    gs.copy_from_slice(&buf.spec);
                    if want_w {
                        buf.forward(&pl, xcols.col(idx))?;
                        acc[h].iter_mut().zip(&buf.spec).zip(&gs).for_each(|((a, xv), gv)| *a += xv * gv);
                    }
                    if let Some(w_hat) = &w_hat {
                        buf.spec.iter_mut().zip(&w_hat[h]).zip(&gs).for_each(|((z, wv), gv)| *z = wv * gv);
                        buf.inverse(&pl)?;
                        dxc.iter_mut().enumerate().for_each(|(s, v)| *v = buf.real[t - 1 - s]);
                    }
                }
                Ok(acc)
            })
            .collect::<Result<_>>()?;
        partial.into_iter().fold(zeros(), |mut a, b| {
            a.iter_mut().zip(b).for_each(|(x, y)| x.iter_mut().zip(y).for_each(|(u, v)| *u += v));
            a
        })
    } else {
        let g_hat = column_spectra(&gcols, &pl)?;
        if let Some(w_hat) = &w_hat {
            dx_cols.par_chunks_mut(t).with_min_len(min_len()).enumerate().try_for_each_init(
                || Buffers::new(&pl),
                |buf, (idx, dxc)| -> Result<()> {
                    let (b, ci) = (idx / c, idx % c);
                    let h = ci / d;
                    buf.spec.iter_mut().for_each(|z| *z = Complex::default());
                    for i in 0..p.kernel_width {
                        let dl = p.kernel_width - 1 - i;
                        // Output channel e = ci + δᵢ must stay in the head.
                        if ci % d + dl >= d {
                            continue;
                        }
                        let (wk, gk) = (&w_hat[i * p.heads + h], &g_hat[b * c + ci + dl]);
                        buf.spec.iter_mut().zip(wk).zip(gk).for_each(|((acc, a), bb)| *acc += a * bb);
                    }
                    buf.inverse(&pl)?;
                    dxc.iter_mut().enumerate().for_each(|(s, v)| *v = buf.real[t - 1 - s]);
                    Ok(())
                },
            )?;
        }
        let x_hat = if want_w { column_spectra(&xcols, &pl)? } else { Vec::new() };
        let rows = if want_w { p.kernel_width * p.heads } else { 0 };
        (0..rows)
            .into_par_iter()
            .with_min_len(min_len())
            .map(|r| {
                let (i, h) = (r / p.heads, r % p.heads);
                let dl = p.kernel_width - 1 - i;
                let mut acc = vec![Complex::<F>::default(); pl.len() / 2 + 1];
                for b in 0..nb {
                    for e in h * d + dl.min(d)..(h + 1) * d {
                        let (xk, gk) = (&x_hat[b * c + e - dl], &g_hat[b * c + e]);
                        acc.iter_mut().zip(xk).zip(gk).for_each(|((a, x), g)| *a += x * g);
                    }
                }
                acc
            })
            .collect()
    };
    if want_x {
        dx = from_columns(&Columns { data: dx_cols, len: t }, nb, c);
    }
    if want_w {
        let scale = F::one() / F::of(pl.len() as f64);
        let rows: Vec<Vec<F>> = dw_spectra
            .into_par_iter()
            .with_min_len(min_len())
            .map_init(
                || Buffers::new(&pl),
                |buf, spec| {
                    buf.spec.copy_from_slice(&spec);
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
