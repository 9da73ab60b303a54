//! Attention's backward pass on CPU, FlashAttention-2 style: the softmax is recomputed
//! blockwise from the per-row log-sum-exp of the forward pass, never as a `T×T` matrix.
//!
//! With `P_{t,s} = e^(σ q_t · k_s − LSE_t)` on the visible keys (0 elsewhere),
//! `D_t = ȳ_t · y_t` and `S̄_{t,s} = P_{t,s}(ȳ_t · v_s − D_t)`:
//! `v̄_s = Σ_t P_{t,s} ȳ_t, k̄_s = σ Σ_t S̄_{t,s} q_t,
//!  q̄_t = σ Σ_s S̄_{t,s} k_s .`
//! One pass runs in parallel over (batch, head, key block): each task walks the query blocks
//! that see its keys, recomputes the tile of `P` (the exponentials vectorised, as in the
//! forward) and `S̄` once, and accumulates `k̄, v̄` of its keys and `q̄` of the queries;
//! `q̄` is summed over the key blocks of a (batch, head) through per-worker `T × D_k`
//! accumulators (rayon `fold`/`reduce`). Memory stays `O(B_q B_k)` per task plus those
//! accumulators, and a window `w` keeps the cost at `O(T w)`.

use mixer_core::mixers::attention::Attention;
use mixer_core::parallel::min_len;
use mixer_core::{Requires, Result, Tensors, grad_name};
use ndarray::{Array2, Array3, Array4, ArrayD, ArrayView2, s};
use rayon::prelude::*;

use super::fast::{BLOCK_K, BLOCK_Q, forward};
use super::heads_major;
use crate::vmath::VecMath;

/// What every tile of one call shares.
struct Ctx<'a, F> {
    a: &'a Attention,
    /// `σ`.
    scale: F,
    /// `|σ|`.
    abs: F,
}

/// The recomputed blocks of one (query block, key block) pair: `P` and `S̄` (`nq × nk`).
/// `lse` and `dd` hold `LSE_t` and `D_t` of the block's queries.
#[allow(clippy::too_many_arguments)]
fn tile<F: VecMath>(
    cx: &Ctx<'_, F>,
    qb: ArrayView2<'_, F>,
    kb: ArrayView2<'_, F>,
    vb: ArrayView2<'_, F>,
    gb: ArrayView2<'_, F>,
    lse: &[F],
    dd: &[F],
    (i0, j0): (usize, usize),
) -> (Array2<F>, Array2<F>) {
    let mut p = qb.dot(&kb.t());
    let dp = gb.dot(&vb.t());
    let mut ds = Array2::<F>::zeros(p.raw_dim());
    let nk = kb.nrows();
    for r in 0..qb.nrows() {
        let t = i0 + r;
        let (lo, hi) = (cx.a.first_key(t).max(j0) - j0, ((t + 1).min(j0 + nk)).saturating_sub(j0));
        let mut prow = p.row_mut(r);
        let row = prow.as_slice_mut().expect("rows of a fresh matrix product are contiguous");
        if lo >= hi {
            row.fill(F::zero());
            continue;
        }
        // e^(σ u − LSE) = e^(|σ| (sign(σ) u − LSE/|σ|)), vectorised when LSE/|σ| is finite.
        let m = lse[r] / cx.abs;
        if cx.abs > F::zero() && m.is_finite() {
            row[..lo].fill(F::neg_infinity());
            row[hi..].fill(F::neg_infinity());
            if cx.scale < F::zero() {
                row[lo..hi].iter_mut().for_each(|x| *x = -*x);
            }
            F::exp_scaled_sum(row, m, cx.abs);
        } else {
            for (c, x) in row.iter_mut().enumerate() {
                *x = if c >= lo && c < hi { (*x * cx.scale - lse[r]).exp() } else { F::zero() };
            }
        }
        let dpr = dp.row(r);
        let mut dsr = ds.row_mut(r);
        for c in lo..hi {
            dsr[c] = row[c] * (dpr[c] - dd[r]);
        }
    }
    (p, ds)
}

/// One key block: its first position, `k̄` and `v̄` of its keys.
type KeyGrads<F> = (usize, Array2<F>, Array2<F>);

/// The `fast` backward (see the module documentation).
pub fn vjp<F: VecMath>(
    a: &Attention,
    inputs: &Tensors<F>,
    dy: &ArrayD<F>,
    req: &Requires,
) -> Result<Tensors<F>> {
    vjp_from(a, inputs, dy, req, 0)
}

/// Groups of key blocks whose `q̄` sums are added in a fixed order (see [`vjp_from`]).
const DQ_GROUPS: usize = 8;

/// [`vjp`] for a `dy` that is zero on the rows before `from_row` (a run from a KV cache of
/// `from_row` rows, on its extension, docs/math.md §7.1): the query blocks wholly before it are
/// left out, in the forward's recomputation too. Their rows add exact zeros to `k̄` and `v̄`, so
/// `k̄`, `v̄` and the rows of `q̄` from `from_row` on are [`vjp`]'s bit for bit; the earlier rows
/// of `q̄` are zero or computed.
pub fn vjp_from<F: VecMath>(
    a: &Attention,
    inputs: &Tensors<F>,
    dy: &ArrayD<F>,
    _req: &Requires,
    from_row: usize,
) -> Result<Tensors<F>> {
    // Whole backward query blocks from here on (the forward then computes every row of them).
    let from_row = from_row / BLOCK_Q * BLOCK_Q;
    let (q, k, v) = (heads_major(inputs, "q")?, heads_major(inputs, "k")?, heads_major(inputs, "v")?);
    let g = heads_major(&std::iter::once(("dy".to_string(), dy.clone())).collect(), "dy")?;
    let (bn, hn, tn, dk) = q.dim();
    let dv = v.dim().3;
    let sigma = a.scale(dk);
    let cx = Ctx { a, scale: F::of(sigma), abs: F::of(sigma.abs()) };
    let (y, lse) = forward(a, &q, &k, &v, from_row)?;
    let dd: Array3<F> = Array3::from_shape_fn((bn, hn, tn), |(b, h, t)| {
        (0..dv).map(|c| g[[b, h, t, c]] * y[[b, h, t, c]]).fold(F::zero(), |x, z| x + z)
    });
    // Per (b, h): the key blocks' k̄, v̄ and the summed q̄.
    let per_head: Vec<(Vec<KeyGrads<F>>, Array2<F>)> = (0..bn * hn)
        .into_par_iter()
        .with_min_len(min_len())
        .map(|bh| {
            let (b, h) = (bh / hn, bh % hn);
            let (lse, dd) = (lse.slice(s![b, h, ..]), dd.slice(s![b, h, ..]));
            // The key blocks in fixed groups (a function of the length only), each adding its
            // blocks' q̄ in order, then the groups' sums in order: the same bits on any number of
            // threads.
            let nkb = tn.div_ceil(BLOCK_K);
            let per = nkb.div_ceil(DQ_GROUPS).max(1);
            let groups: Vec<(Vec<KeyGrads<F>>, Array2<F>)> = (0..nkb.div_ceil(per))
                .into_par_iter()
                .with_min_len(min_len())
                .map(|gi| {
                    let (mut blocks, mut dq) = (Vec::new(), Array2::<F>::zeros((tn, dk)));
                    for jb in gi * per..((gi + 1) * per).min(nkb) {
                        let (j0, j1) = (jb * BLOCK_K, ((jb + 1) * BLOCK_K).min(tn));
                        let (kb, vb) = (k.slice(s![b, h, j0..j1, ..]), v.slice(s![b, h, j0..j1, ..]));
                        let mut dkb = Array2::<F>::zeros((j1 - j0, dk));
                        let mut dvb = Array2::<F>::zeros((j1 - j0, dv));
                        // Last query that sees key j1 − 1: t − s < w.
                        let t_end = a.window().map_or(tn, |w| (j1 - 1 + w).min(tn));
                        let mut i0 = (j0 / BLOCK_Q) * BLOCK_Q;
                        i0 = i0.max(from_row);
                        while i0 < t_end {
                            let i1 = (i0 + BLOCK_Q).min(tn);
                            let (qb, gb) = (q.slice(s![b, h, i0..i1, ..]), g.slice(s![b, h, i0..i1, ..]));
                            let rows = |x: &ndarray::ArrayView1<'_, F>| x.slice(s![i0..i1]).to_vec();
                            let (p, ds) = tile(&cx, qb, kb, vb, gb, &rows(&lse), &rows(&dd), (i0, j0));
                            dvb += &p.t().dot(&gb);
                            dkb.scaled_add(cx.scale, &ds.t().dot(&qb));
                            dq.slice_mut(s![i0..i1, ..]).scaled_add(cx.scale, &ds.dot(&kb));
                            i0 = i1;
                        }
                        blocks.push((j0, dkb, dvb));
                    }
                    (blocks, dq)
                })
                .collect();
            groups
                .into_iter()
                .reduce(|(mut ba, mut qa), (bb, qb)| {
                    ba.extend(bb);
                    qa += &qb;
                    (ba, qa)
                })
                .unwrap_or_else(|| (Vec::new(), Array2::<F>::zeros((tn, dk))))
        })
        .collect();
    let mut dq = Array4::<F>::zeros((bn, tn, hn, dk));
    let mut dkk = Array4::<F>::zeros((bn, tn, hn, dk));
    let mut dvv = Array4::<F>::zeros((bn, tn, hn, dv));
    for (bh, (blocks, dqh)) in per_head.iter().enumerate() {
        let (b, h) = (bh / hn, bh % hn);
        dq.slice_mut(s![b, .., h, ..]).assign(dqh);
        for (j0, dkb, dvb) in blocks {
            dkk.slice_mut(s![b, *j0..j0 + dkb.nrows(), h, ..]).assign(dkb);
            dvv.slice_mut(s![b, *j0..j0 + dvb.nrows(), h, ..]).assign(dvb);
        }
    }
    let mut out = Tensors::new();
    out.insert(grad_name("q"), dq.into_dyn());
    out.insert(grad_name("k"), dkk.into_dyn());
    out.insert(grad_name("v"), dvv.into_dyn());
    Ok(out)
}
