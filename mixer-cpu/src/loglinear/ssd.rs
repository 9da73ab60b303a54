//! The chunked form of the scalar-decay base mixers (linear attention, Mamba-2) without a
//! lift: the state-space-duality ("SSD") algorithm of docs/math.md §2.6 with one state.
//!
//! For chunk `i` (positions `i_0 … i_0+n−1`, chunk-local log-decay sums
//! `γ_r = Σ_{r' ≤ r} g_{i_0+r'}`, masked decay `Γ_{r,s} = e^(γ_r − γ_s)` for `s ≤ r`, zero
//! above the diagonal) and the state `H ∈ ℝ^(D_k × D_v)` of everything before the chunk:
//! - `Y_c = (σ Q_c K_cᵀ ⊙ Γ) V_c + σ diag(e^γ) Q_c H` (intra-chunk part, then the read);
//! - `H ← e^(γ_{n−1}) H + (diag(e^(γ_{n−1} − γ)) K_c)ᵀ V_c`.
//!
//! Each line is one or two matrix products of chunk size (faer, sequential: the heads run in
//! parallel). All work buffers are allocated once per head and reused by every chunk; `y` is
//! written row-major (returned as `yᵀ`, `Dv×T`), so that the assembly into `[B, T, H, Dv]`
//! copies whole rows. The exponentials are vectorised ([`decay_into`], [`exps_into`]). As in
//! the general chunked form ([`super::chunked`]), state entries that decay below the smallest
//! normal number are flushed to zero ([`flush_subnormals`]).

use faer::{Accum, Mat, MatRef};
use mixer_core::Result;
use mixer_core::mixers::loglinear::LogLinear;

use super::chunked::{decay_into, exps_into, flush_subnormals, mm};
use super::common::Head;
use crate::vmath::VecMath;

/// Whether a mixer takes this path: a base mixer with a scalar decay or none.
pub fn applies(m: &LogLinear) -> bool {
    m.lift.is_none() && !m.base.has_beta()
}

/// The chunked form for one (batch, head) of linear attention or Mamba-2: `yᵀ` (`Dv×T`).
pub fn run_head<F: VecMath>(m: &LogLinear, hd: &Head<'_, F>) -> Result<Mat<F>> {
    let t_len = hd.q.nrows();
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let c = m.chunk.min(t_len.max(1));
    let decay = m.base.has_decay();
    let scale = F::of(m.scale);
    let mut yt = Mat::<F>::zeros(dv, t_len);
    // Work buffers: P = σ QKᵀ ⊙ Γ and Γ (C×C), the scaled rows of Q or K (C×Dk, row-major),
    // the row factors and γ.
    let mut p = Mat::<F>::zeros(c, c);
    let mut gamma = Mat::<F>::zeros(c, c);
    let mut rows = vec![F::zero(); c * dk];
    let mut fac = vec![F::one(); c];
    let mut gam = vec![0.0f64; c];
    let mut h = Mat::<F>::zeros(dk, dv);
    let mut have_state = false;
    let mut i0 = 0;
    while i0 < t_len {
        let n = c.min(t_len - i0);
        let (qc, kc, vc) = (hd.q.subrows(i0, n), hd.k.subrows(i0, n), hd.v.subrows(i0, n));
        let gam = &mut gam[..n];
        let mut acc = 0.0f64;
        for (x, &g) in gam.iter_mut().zip(&hd.g[i0..i0 + n]) {
            acc += g;
            *x = acc;
        }
        let last = acc;
        let mut yc = yt.as_mut().transpose_mut().subrows_mut(i0, n);

        // Intra-chunk part: Y_c = (σ QKᵀ ⊙ Γ) V_c.
        let mut pc = p.as_mut().submatrix_mut(0, 0, n, n);
        mm(pc.as_mut(), Accum::Replace, qc, kc.transpose(), scale);
        if decay {
            decay_into(gamma.as_mut().submatrix_mut(0, 0, n, n), gam);
        }
        for s in 0..n {
            let col = pc.as_mut().col_mut(s).try_as_col_major_mut().expect("unit row stride").as_slice_mut();
            col[..s].iter_mut().for_each(|x| *x = F::zero());
            if decay {
                let gcol = gamma.col(s).try_as_col_major().expect("unit row stride").as_slice();
                col[s..].iter_mut().zip(&gcol[s..n]).for_each(|(x, &gm)| *x *= gm);
            }
        }
        mm(yc.as_mut(), Accum::Replace, pc.as_ref(), vc, F::one());

        // Read of the state of everything before the chunk: Y_c += σ diag(e^γ) Q_c H.
        if have_state {
            if decay {
                exps_into(&mut fac[..n], gam, 0.0, false);
            }
            let qs = scale_rows(&mut rows, qc, &fac[..n], scale);
            mm(yc, Accum::Add, qs, h.as_ref(), F::one());
        }

        // State update: H ← e^(γ_{n−1}) H + (diag(e^(γ_{n−1} − γ)) K_c)ᵀ V_c.
        if have_state && decay {
            h *= faer::Scale(F::of(last.exp()));
            have_state = flush_subnormals(h.as_mut());
        }
        let acc = if have_state { Accum::Add } else { Accum::Replace };
        if decay {
            exps_into(&mut fac[..n], gam, last, true);
            let ks = scale_rows(&mut rows, kc, &fac[..n], F::one());
            mm(h.as_mut(), acc, ks.transpose(), vc, F::one());
            fac.iter_mut().for_each(|x| *x = F::one());
        } else {
            mm(h.as_mut(), acc, kc.transpose(), vc, F::one());
        }
        have_state = true;
        i0 += n;
    }
    Ok(yt)
}

/// `diag(α f) src` into the row-major buffer `buf` (`f` one factor per row of `src`); returns
/// the result as a view.
fn scale_rows<'a, F: VecMath>(buf: &'a mut [F], src: MatRef<'_, F>, f: &[F], alpha: F) -> MatRef<'a, F> {
    let (n, d) = (src.nrows(), src.ncols());
    let buf = &mut buf[..n * d];
    for (r, dst) in buf.chunks_exact_mut(d.max(1)).take(n).enumerate() {
        let a = alpha * f[r];
        match src.row(r).try_as_row_major() {
            Some(s) => dst.iter_mut().zip(s.as_slice()).for_each(|(x, &v)| *x = a * v),
            None => dst.iter_mut().zip(src.row(r).iter()).for_each(|(x, &v)| *x = a * v),
        }
    }
    MatRef::from_row_major_slice(buf, n, d)
}
