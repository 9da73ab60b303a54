//! The parallel (quadratic) form of the log-linear family.
//!
//! - linear attention and Mamba-2 (and their lifts, for any level mask):
//!   $Y = (\sigma QK^\top \odot M^S \odot M^H) V$ with $M^S_{t,s} = e^{G_t - G_s}$ and
//!   $M^H_{t,s} = \lambda_t^{(\ell(t,s))}$, computed in row tiles so memory is `O(tile · T)`.
//! - gated DeltaNet, by its triangular-solve form: with $P = \sigma QK^\top \odot M^S$
//!   (lower, diagonal included) and the unit-lower
//!   $L = I + \operatorname{strict}(\operatorname{diag}(\beta)(KK^\top \odot M^S))$, the pseudo-values
//!   $U = L^{-1}\operatorname{diag}(\beta) V$ give $Y = PU$, i.e. $A = P L^{-1}\operatorname{diag}(\beta)$.
//!   The lift needs $A$ itself, $A^{\text{lift}} = M^H \odot A$: it is obtained from
//!   $L^\top A^\top = (P\operatorname{diag}(\beta)^{-1})^\top$-style upper-triangular solves, one per
//!   block of rows of $P$ against the leading block of $L^\top$ (rows of $P$ above `b` vanish
//!   beyond column `b`), which costs $\approx T^3/3$ flops.

use faer::linalg::matmul::matmul;
use faer::linalg::triangular_solve::{
    solve_unit_lower_triangular_in_place, solve_unit_upper_triangular_in_place,
};
use faer::{Accum, Mat, Par};
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Real, Result};

use super::common::{Head, decay_tile};

/// Rows per tile of the masked product.
const TILE: usize = 128;

/// Multiplies `p[i, s]` (row `t = r0 + i`) by $\lambda_t^{(\ell(t,s))}$ for `s ≤ t`.
fn apply_levels<F: Real>(m: &LogLinear, hd: &Head<F>, p: &mut Mat<F>, r0: usize) -> Result<()> {
    let Some(lam) = &hd.lam else { return Ok(()) };
    let n_levels = lam.ncols();
    for i in 0..p.nrows() {
        let t = r0 + i;
        for s in 0..=t {
            let l = m.level_checked(t, s, n_levels)?;
            p[(i, s)] *= lam[(t, l)];
        }
    }
    Ok(())
}

/// The parallel form for one (batch, head): `T×Dv`.
pub fn run_head<F: Real>(m: &LogLinear, hd: &Head<F>) -> Result<Mat<F>> {
    match m.base {
        Base::LinearAttention | Base::Mamba2 => masked_attention(m, hd),
        Base::GatedDeltaNet => delta_rule(m, hd),
    }
}

fn masked_attention<F: Real>(m: &LogLinear, hd: &Head<F>) -> Result<Mat<F>> {
    let t_len = hd.q.nrows();
    let dv = hd.v.ncols();
    let scale = F::of(m.scale);
    let mut y = Mat::<F>::zeros(t_len, dv);
    let mut r0 = 0;
    while r0 < t_len {
        let r1 = (r0 + TILE).min(t_len);
        let mut p = Mat::<F>::zeros(r1 - r0, r1);
        matmul(
            p.as_mut(),
            Accum::Replace,
            hd.q.subrows(r0, r1 - r0),
            hd.k.subrows(0, r1).transpose(),
            scale,
            Par::Seq,
        );
        if m.base == Base::Mamba2 {
            let d = decay_tile::<F>(&hd.g, r0, r1);
            for i in 0..r1 - r0 {
                for s in 0..=r0 + i {
                    p[(i, s)] *= d[(i, s)];
                }
            }
        }
        for i in 0..r1 - r0 {
            for s in r0 + i + 1..r1 {
                p[(i, s)] = F::zero();
            }
        }
        apply_levels(m, hd, &mut p, r0)?;
        matmul(
            y.subrows_mut(r0, r1 - r0),
            Accum::Replace,
            p.as_ref(),
            hd.v.subrows(0, r1),
            F::one(),
            Par::Seq,
        );
        r0 = r1;
    }
    Ok(y)
}

fn delta_rule<F: Real>(m: &LogLinear, hd: &Head<F>) -> Result<Mat<F>> {
    let t_len = hd.q.nrows();
    let dv = hd.v.ncols();
    let ms = decay_tile::<F>(&hd.g, 0, t_len);
    // L = I + strict(diag(β)(KKᵀ ⊙ Mˢ)); the unit solves never read the diagonal.
    let mut l = Mat::<F>::zeros(t_len, t_len);
    matmul(l.as_mut(), Accum::Replace, hd.k.as_ref(), hd.k.transpose(), F::one(), Par::Seq);
    for t in 0..t_len {
        for s in 0..t {
            l[(t, s)] *= hd.beta[t] * ms[(t, s)];
        }
        for s in t..t_len {
            l[(t, s)] = F::zero();
        }
    }
    // P = σ QKᵀ ⊙ Mˢ, lower with diagonal.
    let mut p = Mat::<F>::zeros(t_len, t_len);
    matmul(p.as_mut(), Accum::Replace, hd.q.as_ref(), hd.k.transpose(), F::of(m.scale), Par::Seq);
    for t in 0..t_len {
        for s in 0..=t {
            p[(t, s)] *= ms[(t, s)];
        }
        for s in t + 1..t_len {
            p[(t, s)] = F::zero();
        }
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
    // A[t, s] = β_s · (L⁻ᵀPᵀ)[s, t] · λ_t^{(ℓ(t,s))}.
    let mut amat =
        Mat::<F>::from_fn(t_len, t_len, |t, s| if s <= t { at[(s, t)] * hd.beta[s] } else { F::zero() });
    drop(at);
    apply_levels(m, hd, &mut amat, 0)?;
    matmul(y.as_mut(), Accum::Replace, amat.as_ref(), hd.v.as_ref(), F::one(), Par::Seq);
    Ok(y)
}
