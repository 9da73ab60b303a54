//! The fast (streaming) form of attention: flash-style tiling with an online softmax.
//!
//! For a block of queries $[i_0, i_1)$ the key blocks $[j_0, j_1)$ that intersect the visible
//! range $[\max(0, i_0 + 1 - w), i_1)$ are visited in order; per query row the running maximum
//! $m$, denominator $\ell$ and accumulator $o$ are updated as
//! $m' = \max(m, \max_s S_{t,s})$, $\ell' = e^{m - m'}\ell + \sum_s e^{S_{t,s} - m'}$,
//! $o' = e^{m - m'} o + \sum_s e^{S_{t,s} - m'} v_s$, masked entries skipped (never
//! exponentiated), and $y_t = o / \ell$ at the end. Memory is $O(B_q B_k + B_q D_v)$ per task
//! (never $T \times T$); tasks (batch × head × query block) run in parallel with rayon.

use mixer_core::mixers::attention::Attention;
use mixer_core::{Real, Result, Tensors};
use ndarray::{Array2, Array3, Array4, ArrayD, s};
use rayon::prelude::*;

use super::heads_major;

/// Query block size.
pub const BLOCK_Q: usize = 64;
/// Key block size.
pub const BLOCK_K: usize = 64;

/// `y [B,T,H,Dv]` by streaming over key blocks.
pub fn flash<F: Real>(a: &Attention, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let (q, k, v) = (heads_major(inputs, "q")?, heads_major(inputs, "k")?, heads_major(inputs, "v")?);
    let (y, _) = forward(a, &q, &k, &v);
    Ok(y.permuted_axes([0, 2, 1, 3]).as_standard_layout().to_owned().into_dyn())
}

/// The streaming forward on heads-major `q, k [B,H,T,Dk]`, `v [B,H,T,Dv]`: the output
/// `[B,H,T,Dv]` and the per-row log-sum-exp $\mathrm{LSE}_t = m_t + \ln \ell_t$ of the scaled,
/// masked scores (which the backward pass uses to recompute the softmax blockwise).
pub(crate) fn forward<F: Real>(
    a: &Attention,
    q: &Array4<F>,
    k: &Array4<F>,
    v: &Array4<F>,
) -> (Array4<F>, Array3<F>) {
    let (bn, hn, tn, dk) = q.dim();
    let dv = v.dim().3;
    let scale = F::of(a.scale(dk));
    let tasks: Vec<(usize, usize, usize)> = (0..bn)
        .flat_map(|b| (0..hn).flat_map(move |h| (0..tn).step_by(BLOCK_Q).map(move |i0| (b, h, i0))))
        .collect();
    let outs: Vec<(Array2<F>, Vec<F>)> = tasks
        .par_iter()
        .map(|&(b, h, i0)| {
            let i1 = (i0 + BLOCK_Q).min(tn);
            let nq = i1 - i0;
            let qb = q.slice(s![b, h, i0..i1, ..]);
            let mut m = vec![F::neg_infinity(); nq];
            let mut l = vec![F::zero(); nq];
            let mut o = Array2::<F>::zeros((nq, dv));
            let lo = a.first_key(i0);
            let mut j0 = lo;
            while j0 < i1 {
                let j1 = (j0 + BLOCK_K).min(i1);
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
                    let mx = (slo..shi).map(|s| row[s - j0] * scale).fold(m[r], F::max);
                    let corr = (m[r] - mx).exp();
                    let mut sum = F::zero();
                    for c in 0..j1 - j0 {
                        let s = j0 + c;
                        row[c] = if s >= slo && s < shi {
                            let e = (row[c] * scale - mx).exp();
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
            for r in 0..nq {
                let inv = F::one() / l[r];
                o.row_mut(r).mapv_inplace(|x| x * inv);
            }
            let lse = (0..nq).map(|r| m[r] + l[r].ln()).collect();
            (o, lse)
        })
        .collect();
    let mut y = Array4::<F>::zeros((bn, hn, tn, dv));
    let mut lse = Array3::<F>::zeros((bn, hn, tn));
    for (&(b, h, i0), (ob, lb)) in tasks.iter().zip(&outs) {
        y.slice_mut(s![b, h, i0..i0 + ob.nrows(), ..]).assign(ob);
        for (r, &x) in lb.iter().enumerate() {
            lse[[b, h, i0 + r]] = x;
        }
    }
    (y, lse)
}
