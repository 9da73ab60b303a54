//! The fast (streaming) form of attention: flash-style tiling with an online softmax, the
//! two products of every tile done as matrix products (faer).
//!
//! For a block of queries `[i₀, i₁)` the key blocks `[j₀, j₁)` that intersect the visible
//! range `[max(0, i₀ + 1 − w), i₁)` are visited in order (tiles wholly outside the causal
//! triangle or the window are never touched). Per tile:
//! `Sᵀ = K_j (σ Q_i)ᵀ` (one matmul; `σ` is folded into the queries once, before any product,
//! so the scores never hold an unscaled `q·k`), then per query `t` (one contiguous column of
//! `Sᵀ`): keys outside `[first(t), t]` are set to `−∞` — only on tiles that straddle the
//! diagonal or the window's edge — and the running maximum `m`, denominator `ℓ` and output
//! `o` are updated:
//! `m' = max(m, maxₛ S_{t,s})`, `ℓ' = e^{m − m'} ℓ + Σₛ e^{S_{t,s} − m'}`,
//! `o' = e^{m − m'} o + Σₛ e^{S_{t,s} − m'} vₛ` — the exponentials by the vectorised
//! [`VecMath::exp_sub_sum`], the sum over `s` as one matmul `Oᵀ += V_jᵀ Pᵀ`. At the end
//! `y_t = o / ℓ`. Memory per task is `O(B_q·B_k + B_q·D_v)`; tasks (batch × head × query
//! block) run in parallel with rayon, each product sequential inside its task.

use faer::linalg::matmul::matmul;
use faer::prelude::{Reborrow, ReborrowMut};
use faer::{Accum, Mat, MatRef, Par};
use mixer_core::mixers::attention::Attention;
use mixer_core::{Result, Tensors};
use ndarray::{Array4, ArrayD, s};
use rayon::prelude::*;

use super::heads_major;
use crate::vmath::VecMath;

/// Query block size.
pub const BLOCK_Q: usize = 128;
/// Key block size.
pub const BLOCK_K: usize = 128;

/// `y [B,T,H,Dv]` by streaming over key blocks.
pub fn flash<F: VecMath>(a: &Attention, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let (mut q, k, v) = (heads_major(inputs, "q")?, heads_major(inputs, "k")?, heads_major(inputs, "v")?);
    let (bn, hn, tn, dk) = q.dim();
    let dv = v.dim().3;
    let scale = F::of(a.scale(dk));
    q.mapv_inplace(|x| x * scale);
    let (qs, ks, vs) = (slice_of(&q), slice_of(&k), slice_of(&v));
    let tasks: Vec<(usize, usize, usize)> = (0..bn)
        .flat_map(|b| (0..hn).flat_map(move |h| (0..tn).step_by(BLOCK_Q).map(move |i0| (b, h, i0))))
        .collect();
    let head = |b: usize, h: usize, d: usize| (b * hn + h) * tn * d;
    let outs: Vec<Mat<F>> = tasks
        .par_iter()
        .map(|&(b, h, i0)| {
            let i1 = (i0 + BLOCK_Q).min(tn);
            let qb =
                MatRef::from_row_major_slice(&qs[head(b, h, dk) + i0 * dk..][..(i1 - i0) * dk], i1 - i0, dk);
            query_block(a, qb, i0, &ks[head(b, h, dk)..][..tn * dk], &vs[head(b, h, dv)..][..tn * dv], dk, dv)
        })
        .collect();
    let mut y = Array4::<F>::zeros((bn, tn, hn, dv));
    for (&(b, h, i0), ot) in tasks.iter().zip(&outs) {
        for r in 0..ot.ncols() {
            let mut row = y.slice_mut(s![b, i0 + r, h, ..]);
            for (d, x) in row.iter_mut().enumerate() {
                *x = ot[(d, r)];
            }
        }
    }
    Ok(y.into_dyn())
}

/// The contiguous data of a standard-layout array.
fn slice_of<F: VecMath>(a: &Array4<F>) -> &[F] {
    a.as_slice().expect("heads_major returns a standard-layout array")
}

/// `Oᵀ [Dv, nq]` for the queries `qb` (pre-scaled, rows `i₀..i₀+nq`) of one head whose keys
/// and values are the row-major `k [T, Dk]`, `v [T, Dv]`.
fn query_block<F: VecMath>(
    a: &Attention,
    qb: MatRef<'_, F>,
    i0: usize,
    k: &[F],
    v: &[F],
    dk: usize,
    dv: usize,
) -> Mat<F> {
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
            col[..lo - j0].fill(F::neg_infinity());
            col[hi - j0..].fill(F::neg_infinity());
            let mx = col[lo - j0..hi - j0].iter().copied().fold(m[r], F::max);
            let corr = (m[r] - mx).exp();
            let sum = F::exp_sub_sum(col, mx);
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
    ot
}

/// Column `j` of a column-major `Mat` as a slice.
fn col_slice<F: VecMath>(m: &mut Mat<F>, j: usize) -> &mut [F] {
    m.as_mut().col_mut(j).try_as_col_major_mut().expect("a column of a Mat is contiguous").as_slice_mut()
}
