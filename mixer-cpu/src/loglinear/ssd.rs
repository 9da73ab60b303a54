//! The chunked form of the scalar-decay members of the family (linear attention, Mamba-2 and
//! their log-linear lifts): the state-space-duality ("SSD") algorithm of docs/math.md §2.6,
//! where a chunk transition is a scalar, so level states are only ever scaled.
//!
//! For chunk `i` (positions `i_0 … i_0+n−1`, chunk-local log-decay sums
//! `γ_r = Σ_{r' ≤ r} g_{i_0+r'}`, masked decay `Γ_{r,s} = e^(γ_r − γ_s)` for `s ≤ r`, zero
//! above the diagonal) and the level states `H^(e) ∈ ℝ^(D_k × D_v)` present at its start
//! (the base mixers: one state of everything before the chunk):
//! - `Y_c = ((σ Q_c K_cᵀ ⊙ Γ) ⊙ M^H) V_c` (intra-chunk part; `M^H` the λ weights of the
//!   pairs' levels, all ones for the base mixers);
//! - `Y_c += Σ_e diag(λ^(c+e)) σ diag(e^γ) Q_c H^(e)` (the read; weight 1 for the base);
//! - every state `H^(e) ← e^(γ_{n−1}) H^(e)`, and the chunk's own state
//!   `(diag(e^(γ_{n−1} − γ)) K_c)ᵀ V_c` enters level 0 (added to the single state of the base
//!   mixers).
//!
//! The lifts merge levels `0..=ctz(i)` into level `ctz(i)+1` before chunk `i ≥ 1` (the
//! chunk-granular Fenwick recurrence, as in [`super::chunked`]).
//!
//! Each line is one matrix product of chunk size (faer, sequential: the heads run in
//! parallel); the read of all live levels is one product per run of consecutive live levels,
//! `[diag(w_a) Q_c | … | diag(w_b) Q_c] [H^(a); …; H^(b)]`. All work buffers and the states
//! are allocated once per head and reused by every chunk; `y` is written row-major (returned
//! as `yᵀ`, `Dv×T`), so that the assembly into `[B, T, H, Dv]` copies whole rows. The
//! exponentials are vectorised ([`decay_into`], [`exps_into`]). The states carry their decay
//! as a pending scalar that the reads fold into their row weights ([`LevelStates`]): a state
//! is rescaled only when that scalar falls below `e^(−16)`, and then entries that decayed
//! below the smallest normal number are flushed to zero and a level left all zero is dropped.

use faer::{Accum, Mat, MatRef};
use mixer_core::Result;
use mixer_core::mixers::loglinear::LogLinear;

use super::chunked::{decay_into, exps_into, mm, read_col, scale_by_levels};
use super::common::Head;
use super::levels::LevelStates;
use crate::vmath::VecMath;

/// Whether a mixer takes this path: a scalar decay or none (not gated DeltaNet).
pub fn applies(m: &LogLinear) -> bool {
    !m.base.has_beta()
}

/// The chunked form for one (batch, head) of a scalar-decay base member from the initial state
/// `h0` (`H_0 = S_0ᵀ`, `D_k × D_v`; `None`: zero): `yᵀ` (`Dv×T`) and the final state `H_T`
/// (docs/math.md §7).
pub fn run_head_from<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    h0: Option<Mat<F>>,
) -> Result<(Mat<F>, Mat<F>)> {
    let t_len = hd.q.nrows();
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let c = m.chunk.min(t_len.max(1));
    let decay = m.base.has_decay();
    let scale = F::of(m.scale);
    let cbits = m.chunk_log2() as usize;
    let n_chunks = t_len.div_ceil(m.chunk);
    let n_levels = hd.lam.as_ref().map_or(1, |l| l.ncols());
    // Level states side by side (block e = level e); the base mixers keep one.
    let levels = if hd.lam.is_some() { mixer_core::fenwick::bitlen(n_chunks) + 1 } else { 1 };
    let mut states = LevelStates::<F>::new(levels, dk, dv);
    if let Some(h0) = &h0 {
        states.load0(h0.as_ref());
    }
    let mut yt = Mat::<F>::zeros(dv, t_len);
    // Work buffers: P = σ QKᵀ ⊙ Γ and Γ (C×C), the weighted queries of the read
    // (C × levels·Dk, row-major: block e of row r is w_{r,e} q_r), the scaled rows of K
    // (C×Dk, row-major), the row factors and γ.
    let mut p = Mat::<F>::zeros(c, c);
    let mut gamma = Mat::<F>::zeros(c, c);
    let ld = levels * dk;
    let mut qw = vec![F::zero(); c * ld];
    let mut rows = vec![F::zero(); c * dk];
    let mut fac = vec![F::one(); c];
    let mut gam = vec![0.0f64; c];
    for ci in 0..n_chunks {
        let i0 = ci * m.chunk;
        let n = c.min(t_len - i0);
        let (qc, kc, vc) = (hd.q.subrows(i0, n), hd.k.subrows(i0, n), hd.v.subrows(i0, n));
        let gam = &mut gam[..n];
        let mut acc = 0.0f64;
        for (x, &g) in gam.iter_mut().zip(&hd.g[i0..i0 + n]) {
            acc += g;
            *x = acc;
        }
        let last = acc;
        // Chunk-granular Fenwick merge (lifts only): levels 0..=ctz(i) go to ctz(i)+1.
        if levels > 1 && ci >= 1 {
            states.merge(ci.trailing_zeros() as usize);
        }
        let mut yc = yt.as_mut().transpose_mut().subrows_mut(i0, n);

        // Intra-chunk part: Y_c = ((σ QKᵀ ⊙ Γ) ⊙ M^H) V_c.
        let mut pc = p.as_mut().submatrix_mut(0, 0, n, n);
        mm(pc.as_mut(), Accum::Replace, qc, kc.transpose(), scale);
        if decay {
            decay_into(gamma.as_mut().submatrix_mut(0, 0, n, n), gam);
        }
        for s in 0..n {
            let col = pc.as_mut().col_mut(s).try_as_col_major_mut().expect("unit row stride").as_slice_mut();
            col[..s].iter_mut().for_each(|x| *x = F::zero());
            if decay && hd.lam.is_none() {
                let gcol = gamma.col(s).try_as_col_major().expect("unit row stride").as_slice();
                col[s..].iter_mut().zip(&gcol[s..n]).for_each(|(x, &gm)| *x *= gm);
            }
        }
        if let Some(lam) = &hd.lam {
            let g = decay.then(|| gamma.as_ref().submatrix(0, 0, n, n));
            scale_by_levels(m, pc.as_mut(), *lam, i0, n, i0, g)?;
        }
        mm(yc.as_mut(), Accum::Replace, pc.as_ref(), vc, F::one());

        // Read of every present state: Y_c += diag(λ^(c+e)) σ diag(e^γ) Q_c H^(e), one product
        // per run of consecutive live levels.
        let runs = states.live_runs();
        if !runs.is_empty() && dk > 0 {
            if decay {
                exps_into(&mut fac[..n], gam, 0.0, false);
            }
            // (level, λ column, σ e^(ℓ_e)) of every live level.
            let reads = runs
                .iter()
                .flat_map(|r| r.clone())
                .map(|e| {
                    let col = hd.lam.map(|_| read_col(cbits, e, n_levels, ci)).transpose()?;
                    Ok((e, col, scale * states.scale(e)))
                })
                .collect::<Result<Vec<_>>>()?;
            for (r, dst) in qw.chunks_exact_mut(ld).take(n).enumerate() {
                let lam_row = hd.lam.map(|l| l.row(i0 + r));
                for &(e, col, se) in &reads {
                    let w = se
                        * fac[r]
                        * match (col, lam_row) {
                            (Some(l), Some(row)) => row[l],
                            _ => F::one(),
                        };
                    let out = &mut dst[e * dk..(e + 1) * dk];
                    match qc.row(r).try_as_row_major() {
                        Some(q) => out.iter_mut().zip(q.as_slice()).for_each(|(x, &v)| *x = w * v),
                        None => out.iter_mut().zip(qc.row(r).iter()).for_each(|(x, &v)| *x = w * v),
                    }
                }
            }
            for run in runs {
                let (off, width) = (run.start * dk, run.len() * dk);
                let a = MatRef::from_row_major_slice_with_stride(
                    &qw[off..off + (n - 1) * ld + width],
                    n,
                    width,
                    ld,
                );
                mm(yc.as_mut(), Accum::Add, a, states.stored(run), F::one());
            }
        }

        // Transition of every state (a pending scale, see [`LevelStates`]), then the chunk's
        // own state at level 0.
        if decay {
            states.decay(last);
        }
        let (own, live) = states.level0_for_update();
        let acc = if live { Accum::Add } else { Accum::Replace };
        if decay {
            exps_into(&mut fac[..n], gam, last, true);
            let ks = scale_rows(&mut rows, kc, &fac[..n], F::one());
            mm(own, acc, ks.transpose(), vc, F::one());
            fac.iter_mut().for_each(|x| *x = F::one());
        } else {
            mm(own, acc, kc.transpose(), vc, F::one());
        }
    }
    Ok((yt, states.value0()))
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
