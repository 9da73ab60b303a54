//! The fast (streaming) form of attention: flash-style tiling with an online softmax, the
//! two products of every tile done as matrix products (faer).
//!
//! For a block of queries `[i₀, i₁)` the key blocks `[j₀, j₁)` that intersect the visible
//! range `[max(0, i₀ + 1 − w), i₁)` are visited in order (tiles wholly outside the causal
//! triangle or the window are never touched). Per tile:
//! `Uᵀ = K_j (sign(σ)·Q_i)ᵀ` (one matmul: the keys `u = sign(σ)·q·k` of
//! [`Logits`](mixer_core::mixers::attention::Logits), unscaled), then per query `t` (one
//! contiguous column of `Uᵀ`): keys outside `[first(t), t]` are set to `−∞` — only on tiles
//! that straddle the diagonal or the window's edge — and the running maximum key `m`,
//! denominator `ℓ` and output `o` are updated:
//! `m' = max(m, maxₛ u_s)`, `ℓ' = e^{|σ|(m − m')} ℓ + Σₛ e^{|σ|(u_s − m')}`,
//! `o' = e^{|σ|(m − m')} o + Σₛ e^{|σ|(u_s − m')} vₛ` — differences before products, so a
//! huge `σ` or huge scores never overflow an intermediate; the exponentials by the vectorised
//! [`VecMath::exp_scaled_sum`], the sum over `s` as one matmul `Oᵀ += V_jᵀ Pᵀ`. At the end
//! `y_t = o / ℓ`.
//!
//! Exact fallback: a query block where some `q·k` overflowed in `F` (an `f32` dot product
//! beyond 3.4e38), or a scale `σ` that is 0 or not representable in `F`, is computed by
//! [`exact_block`] instead: keys formed again in `f64` where needed and weights in `f64`
//! (slower, and only ever taken on such inputs).
//!
//! Memory per task is `O(B_q·B_k + B_q·D_v)`; tasks (batch × head × query block) run in
//! parallel with rayon, each product sequential inside its task.

use faer::linalg::matmul::matmul;
use faer::prelude::{Reborrow, ReborrowMut};
use faer::{Accum, Mat, MatRef, Par};
use mixer_core::mixers::attention::{Attention, Logits};
use mixer_core::{Result, Tensors};
use ndarray::{Array2, Array3, Array4, ArrayD, s};
use rayon::prelude::*;

use super::{heads_major, key};
use crate::vmath::VecMath;

/// Query block size.
pub const BLOCK_Q: usize = 128;
/// Key block size.
pub const BLOCK_K: usize = 128;

/// `y [B,T,H,Dv]` by streaming over key blocks.
pub fn flash<F: VecMath>(a: &Attention, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let (q, k, v) = (heads_major(inputs, "q")?, heads_major(inputs, "k")?, heads_major(inputs, "v")?);
    let (bn, hn, tn, _) = q.dim();
    let dv = v.dim().3;
    let (tasks, outs) = blocks(a, &q, &k, &v)?;
    let mut y = Array4::<F>::zeros((bn, tn, hn, dv));
    for (&(b, h, i0), (ot, _)) in tasks.iter().zip(&outs) {
        for r in 0..ot.ncols() {
            let mut row = y.slice_mut(s![b, i0 + r, h, ..]);
            for (d, x) in row.iter_mut().enumerate() {
                *x = ot[(d, r)];
            }
        }
    }
    Ok(y.into_dyn())
}

/// The streaming forward on heads-major `q, k [B,H,T,Dk]`, `v [B,H,T,Dv]`: the output
/// `[B,H,T,Dv]` and the per-row log-sum-exp `LSE_t = log Σ_s e^{σ q_t·k_s}` of the scaled,
/// masked scores (which the backward pass uses to recompute the softmax blockwise).
pub(crate) fn forward<F: VecMath>(
    a: &Attention,
    q: &Array4<F>,
    k: &Array4<F>,
    v: &Array4<F>,
) -> Result<(Array4<F>, Array3<F>)> {
    let (bn, hn, tn, _) = q.dim();
    let dv = v.dim().3;
    let (tasks, outs) = blocks(a, q, k, v)?;
    let mut y = Array4::<F>::zeros((bn, hn, tn, dv));
    let mut lse = Array3::<F>::zeros((bn, hn, tn));
    for (&(b, h, i0), (ot, lb)) in tasks.iter().zip(&outs) {
        for r in 0..ot.ncols() {
            for d in 0..dv {
                y[[b, h, i0 + r, d]] = ot[(d, r)];
            }
            lse[[b, h, i0 + r]] = lb[r];
        }
    }
    Ok((y, lse))
}

/// The tasks (batch row, head, first query of the block) and, per task, `Oᵀ [Dv, nq]` and the
/// rows' log-sum-exp.
#[allow(clippy::type_complexity)]
fn blocks<F: VecMath>(
    a: &Attention,
    q: &Array4<F>,
    k: &Array4<F>,
    v: &Array4<F>,
) -> Result<(Vec<(usize, usize, usize)>, Vec<(Mat<F>, Vec<F>)>)> {
    let (bn, hn, tn, dk) = q.dim();
    let dv = v.dim().3;
    let sigma = a.scale(dk);
    let abs = F::of(sigma.abs());
    let fast = sigma != 0.0 && abs.is_finite() && abs > F::zero();
    // The keys u = sign(σ)·q·k: the sign goes into the queries (exact).
    let qs_owned;
    let qsigned = if sigma < 0.0 {
        qs_owned = q.mapv(|x| -x);
        &qs_owned
    } else {
        q
    };
    let (qs, ks, vs) = (slice_of(qsigned), slice_of(k), slice_of(v));
    let tasks: Vec<(usize, usize, usize)> = (0..bn)
        .flat_map(|b| (0..hn).flat_map(move |h| (0..tn).step_by(BLOCK_Q).map(move |i0| (b, h, i0))))
        .collect();
    let head = |b: usize, h: usize, d: usize| (b * hn + h) * tn * d;
    let lg = a.logits(dk);
    let outs = tasks
        .par_iter()
        .map(|&(b, h, i0)| {
            let i1 = (i0 + BLOCK_Q).min(tn);
            if fast {
                let qb = MatRef::from_row_major_slice(
                    &qs[head(b, h, dk) + i0 * dk..][..(i1 - i0) * dk],
                    i1 - i0,
                    dk,
                );
                let (kh, vh) = (&ks[head(b, h, dk)..][..tn * dk], &vs[head(b, h, dv)..][..tn * dv]);
                if let Some(out) = query_block(a, qb, i0, kh, vh, dk, dv, abs) {
                    return Ok(out);
                }
            }
            exact_block(a, &lg, (q, k, v), (b, h, i0, i1))
        })
        .collect::<Result<_>>()?;
    Ok((tasks, outs))
}

/// The contiguous data of a standard-layout array.
fn slice_of<F: VecMath>(a: &Array4<F>) -> &[F] {
    a.as_slice().expect("heads_major returns a standard-layout array")
}

/// Column `j` of a column-major `Mat` as a slice.
fn col_slice<F: VecMath>(m: &mut Mat<F>, j: usize) -> &mut [F] {
    m.as_mut().col_mut(j).try_as_col_major_mut().expect("a column of a Mat is contiguous").as_slice_mut()
}

/// `Oᵀ [Dv, nq]` for the queries `qb` (sign-adjusted, rows `i₀..i₀+nq`) of one head whose
/// keys and values are the row-major `k [T, Dk]`, `v [T, Dv]`; `abs` is `|σ|`. `None` when
/// a key is not finite in `F` (the caller then takes the exact path). Also returns the
/// rows' log-sum-exp `|σ|·m + ln ℓ`.
#[allow(clippy::too_many_arguments)]
fn query_block<F: VecMath>(
    a: &Attention,
    qb: MatRef<'_, F>,
    i0: usize,
    k: &[F],
    v: &[F],
    dk: usize,
    dv: usize,
    abs: F,
) -> Option<(Mat<F>, Vec<F>)> {
    let nq = qb.nrows();
    let i1 = i0 + nq;
    let mut m = vec![F::neg_infinity(); nq];
    let mut l = vec![F::zero(); nq];
    let mut ot = Mat::<F>::zeros(dv, nq);
    let mut st = Mat::<F>::zeros(BLOCK_K, nq);
    let mut j0 = a.first_key(i0) / BLOCK_K * BLOCK_K;
    while j0 < i1 {
        let j1 = (j0 + BLOCK_K).min(i1);
        let nk = j1 - j0;
        let kb = MatRef::from_row_major_slice(&k[j0 * dk..j1 * dk], nk, dk);
        let vb = MatRef::from_row_major_slice(&v[j0 * dv..j1 * dv], nk, dv);
        let mut sv = st.as_mut().submatrix_mut(0, 0, nk, nq);
        matmul(sv.rb_mut(), Accum::Replace, kb, qb.transpose(), F::one(), Par::Seq);
        for r in 0..nq {
            let t = i0 + r;
            let (lo, hi) = (a.first_key(t).max(j0), (t + 1).min(j1));
            let col = sv.rb_mut().col_mut(r).try_as_col_major_mut().expect("a column of a Mat is contiguous");
            let col = col.as_slice_mut();
            if lo >= hi {
                col.fill(F::zero());
                continue;
            }
            let mut mx = m[r];
            for &u in &col[lo - j0..hi - j0] {
                if !u.is_finite() {
                    return None;
                }
                mx = mx.max(u);
            }
            col[..lo - j0].fill(F::neg_infinity());
            col[hi - j0..].fill(F::neg_infinity());
            let corr = if m[r] == F::neg_infinity() { F::zero() } else { (abs * (m[r] - mx)).exp() };
            let sum = F::exp_scaled_sum(col, mx, abs);
            l[r] = l[r] * corr + sum;
            m[r] = mx;
            if corr != F::one() {
                col_slice(&mut ot, r).iter_mut().for_each(|x| *x *= corr);
            }
        }
        matmul(ot.as_mut(), Accum::Add, vb.transpose(), sv.rb(), F::one(), Par::Seq);
        j0 = j1;
    }
    for r in 0..nq {
        let inv = F::one() / l[r];
        col_slice(&mut ot, r).iter_mut().for_each(|x| *x *= inv);
    }
    let lse = (0..nq).map(|r| abs * m[r] + l[r].ln()).collect();
    Some((ot, lse))
}

/// The exact path for the query rows `[i₀, i₁)` of batch row `b`, head `h` (inputs `[B,H,T,D]`,
/// unscaled): keys through [`Logits`] (formed again in `f64` where `F` overflowed) and
/// weights in `f64`. Returns `Oᵀ [Dv, nq]` and the rows' log-sum-exp, like the fast path.
fn exact_block<F: VecMath>(
    a: &Attention,
    lg: &Logits,
    (q, k, v): (&Array4<F>, &Array4<F>, &Array4<F>),
    (b, h, i0, i1): (usize, usize, usize, usize),
) -> Result<(Mat<F>, Vec<F>)> {
    const BK: usize = 64;
    let nq = i1 - i0;
    let dv = v.dim().3;
    let qb = q.slice(s![b, h, i0..i1, ..]);
    // Running maximum key (f64), denominator and accumulator per row.
    let mut m = vec![f64::NEG_INFINITY; nq];
    let mut l = vec![F::zero(); nq];
    let mut o = Array2::<F>::zeros((nq, dv));
    let mut keys = [0.0f64; BK];
    let mut j0 = a.first_key(i0);
    while j0 < i1 {
        let j1 = (j0 + BK).min(i1);
        let kb = k.slice(s![b, h, j0..j1, ..]);
        let vb = v.slice(s![b, h, j0..j1, ..]);
        let mut p = qb.dot(&kb.t());
        for r in 0..nq {
            let t = i0 + r;
            let (slo, shi) = (a.first_key(t).max(j0), (t + 1).min(j1));
            let mut row = p.row_mut(r);
            if slo >= shi {
                row.fill(F::zero());
                continue;
            }
            let mut mx = m[r];
            for s in slo..shi {
                let u = key(lg, row[s - j0], qb.row(r), kb.row(s - j0), t, s)?;
                keys[s - j0] = u;
                mx = mx.max(u);
            }
            let corr = F::of(lg.weight(m[r], mx));
            let mut sum = F::zero();
            for c in 0..j1 - j0 {
                let s = j0 + c;
                row[c] = if s >= slo && s < shi {
                    let e = F::of(lg.weight(keys[c], mx));
                    sum += e;
                    e
                } else {
                    F::zero()
                };
            }
            l[r] = l[r] * corr + sum;
            m[r] = mx;
            o.row_mut(r).mapv_inplace(|x| x * corr);
        }
        o += &p.dot(&vb);
        j0 = j1;
    }
    let mut ot = Mat::<F>::zeros(dv, nq);
    for r in 0..nq {
        let inv = F::one() / l[r];
        for d in 0..dv {
            ot[(d, r)] = o[[r, d]] * inv;
        }
    }
    let abs = a.scale(q.dim().3).abs();
    let lse = (0..nq).map(|r| F::of(abs * m[r] + l[r].f64().ln())).collect();
    Ok((ot, lse))
}
