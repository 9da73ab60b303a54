//! The parallel (quadratic) form of the log-linear family.
//!
//! - linear attention and Mamba-2 (and their lifts, for any level mask):
//!   `Y = (σ QKᵀ ⊙ M^S ⊙ M^H) V` with `M^S_{t,s} = e^(G_t − G_s)` and
//!   `M^H_{t,s} = λ_t^(ℓ(t,s))`, computed in row tiles so memory is `O(tile · T)`.
//! - gated DeltaNet, by its triangular-solve form: with `P = σ QKᵀ ⊙ M^S`
//!   (lower, diagonal included) and the unit-lower
//!   `L = I + strict(diag(β)(KKᵀ ⊙ M^S))`, the pseudo-values
//!   `U = L⁻¹diag(β) V` give `Y = PU`, i.e. `A = P L⁻¹diag(β)`.
//!   The lift needs `A` itself, `A^(lift) = M^H ⊙ A`: `X = L^(−ᵀ) Pᵀ` comes from
//!   unit-upper triangular solves `Lᵀ X = Pᵀ`, one per block of rows `[a, b)` of `P`
//!   against the leading `b×b` block of `Lᵀ` (those rows of `P` vanish beyond column `b`),
//!   about `T³/3` flops; then `A_{t,s} = β_s X_{s,t}`.

use faer::linalg::matmul::matmul;
use faer::linalg::triangular_solve::{
    solve_unit_lower_triangular_in_place, solve_unit_upper_triangular_in_place,
};
use faer::{Accum, Mat, Par};
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Real, Result};

use super::common::{Head, decay_matrix_tiled, decay_tile};

/// Rows per tile of the masked product.
const TILE: usize = 128;

/// Multiplies `p[i, s]` (row `t = r0 + i`) by `λ_t^(ℓ(t,s))` for `s ≤ t`, column by
/// column (faer matrices are column-major).
fn apply_levels<F: Real>(m: &LogLinear, hd: &Head<'_, F>, p: &mut Mat<F>, r0: usize) -> Result<()> {
    let (Some(lam), Some(lift)) = (&hd.lam, m.lift) else { return Ok(()) };
    let n_levels = lam.ncols();
    let rows = p.nrows();
    for s in 0..p.ncols() {
        let col = col_mut(p, s);
        for i in s.saturating_sub(r0)..rows {
            let t = r0 + i;
            let l = (lift.mask.level)(t, s);
            if l >= n_levels {
                return Err(m.level_error(t, s, l, n_levels));
            }
            col[i] *= lam[(t, l)];
        }
    }
    Ok(())
}

/// Column `j` of an owned matrix as a slice (owned faer matrices are column-major).
pub(crate) fn col_mut<F: Real>(m: &mut Mat<F>, j: usize) -> &mut [F] {
    m.col_mut(j).try_as_col_major_mut().expect("owned faer matrices have unit row stride").as_slice_mut()
}

/// The parallel form for one (batch, head): `T×Dv`.
pub fn run_head<F: Real>(m: &LogLinear, hd: &Head<'_, F>) -> Result<Mat<F>> {
    match m.base {
        Base::LinearAttention | Base::Mamba2 => masked_attention(m, hd),
        Base::GatedDeltaNet => delta_rule(m, hd),
    }
}

fn masked_attention<F: Real>(m: &LogLinear, hd: &Head<'_, F>) -> Result<Mat<F>> {
    let t_len = hd.q.nrows();
    let dv = hd.v.ncols();
    let scale = F::of(m.scale);
    let mut y = Mat::<F>::zeros(t_len, dv);
    let mut r0 = 0;
    while r0 < t_len {
        let r1 = (r0 + TILE).min(t_len);
        let rows = r1 - r0;
        let mut p = Mat::<F>::zeros(rows, r1);
        matmul(
            p.as_mut(),
            Accum::Replace,
            hd.q.subrows(r0, rows),
            hd.k.subrows(0, r1).transpose(),
            scale,
            Par::Seq,
        );
        if m.base == Base::Mamba2 {
            let d = decay_tile::<F>(&hd.g, r0, r1);
            for s in 0..r1 {
                let dc =
                    d.col(s).try_as_col_major().expect("owned faer matrices have unit row stride").as_slice();
                let pc = col_mut(&mut p, s);
                pc.iter_mut().zip(dc).for_each(|(x, &f)| *x *= f);
            }
        } else {
            for s in r0 + 1..r1 {
                col_mut(&mut p, s)[..s - r0].iter_mut().for_each(|x| *x = F::zero());
            }
        }
        apply_levels(m, hd, &mut p, r0)?;
        matmul(y.subrows_mut(r0, rows), Accum::Replace, p.as_ref(), hd.v.subrows(0, r1), F::one(), Par::Seq);
        r0 = r1;
    }
    Ok(y)
}

fn delta_rule<F: Real>(m: &LogLinear, hd: &Head<'_, F>) -> Result<Mat<F>> {
    let t_len = hd.q.nrows();
    let dv = hd.v.ncols();
    let ms = decay_matrix_tiled::<F>(&hd.g, TILE);
    // L = I + strict(diag(β)(KKᵀ ⊙ Mˢ)); the unit solves never read the diagonal.
    let mut l = Mat::<F>::zeros(t_len, t_len);
    matmul(l.as_mut(), Accum::Replace, hd.k, hd.k.transpose(), F::one(), Par::Seq);
    for s in 0..t_len {
        let msc = ms.col(s).try_as_col_major().expect("owned faer matrices have unit row stride").as_slice();
        let col = col_mut(&mut l, s);
        col[..=s].iter_mut().for_each(|x| *x = F::zero());
        for t in s + 1..t_len {
            col[t] *= hd.beta[t] * msc[t];
        }
    }
    // P = σ QKᵀ ⊙ Mˢ, lower with diagonal.
    let mut p = Mat::<F>::zeros(t_len, t_len);
    matmul(p.as_mut(), Accum::Replace, hd.q, hd.k.transpose(), F::of(m.scale), Par::Seq);
    for s in 0..t_len {
        let msc = ms.col(s).try_as_col_major().expect("owned faer matrices have unit row stride").as_slice();
        let col = col_mut(&mut p, s);
        col[..s].iter_mut().for_each(|x| *x = F::zero());
        col[s..].iter_mut().zip(&msc[s..]).for_each(|(x, &f)| *x *= f);
    }
    drop(ms);
    let mut y = Mat::<F>::zeros(t_len, dv);
    if hd.lam.is_none() {
        let mut u = Mat::from_fn(t_len, dv, |t, d| hd.beta[t] * hd.v[(t, d)]);
        solve_unit_lower_triangular_in_place(l.as_ref(), u.as_mut(), Par::Seq);
        matmul(y.as_mut(), Accum::Replace, p.as_ref(), u.as_ref(), F::one(), Par::Seq);
        return Ok(y);
    }
    // Aᵀ = L⁻ᵀ Pᵀ, solved by blocks of rows [a, b) of P: those rows vanish beyond column b,
    // so only the leading b×b block of Lᵀ is involved.
    let mut at = p.transpose().to_owned();
    drop(p);
    let lt = l.transpose();
    let mut a = 0;
    while a < t_len {
        let b = (a + TILE).min(t_len);
        solve_unit_upper_triangular_in_place(
            lt.submatrix(0, 0, b, b),
            at.submatrix_mut(0, a, b, b - a),
            Par::Seq,
        );
        a = b;
    }
    // Column t of X = L⁻ᵀPᵀ is row t of P L⁻¹: A[t, s] = β_s · X[s, t] · λ_t^{(ℓ(t,s))}, s ≤ t.
    let (Some(lam), Some(lift)) = (&hd.lam, m.lift) else {
        return Err(mixer_core::Error::config(&m.name, "the lifted delta rule needs λ"));
    };
    let n_levels = lam.ncols();
    for t in 0..t_len {
        let col = col_mut(&mut at, t);
        for s in 0..=t {
            let l = (lift.mask.level)(t, s);
            if l >= n_levels {
                return Err(m.level_error(t, s, l, n_levels));
            }
            col[s] *= hd.beta[s] * lam[(t, l)];
        }
        col[t + 1..].iter_mut().for_each(|x| *x = F::zero());
    }
    matmul(y.as_mut(), Accum::Replace, at.transpose(), hd.v, F::one(), Par::Seq);
    Ok(y)
}
