//! Attention's backward pass on CPU, FlashAttention-2 style: the softmax is recomputed
//! blockwise from the per-row log-sum-exp of the forward pass, never as a `T×T` matrix.
//!
//! With `P_{t,s} = e^(σ q_t · k_s − LSE_t)` on the visible keys (0 elsewhere),
//! `D_t = ȳ_t · y_t` and `S̄_{t,s} = P_{t,s}(ȳ_t · v_s − D_t)`:
//! `v̄_s = Σ_t P_{t,s} ȳ_t, k̄_s = σ Σ_t S̄_{t,s} q_t,
//!  q̄_t = σ Σ_s S̄_{t,s} k_s .`
//! One pass runs in parallel over (batch, head, key block) and accumulates `k̄, v̄` of
//! its keys over the query blocks that see them; a second pass runs over (batch, head, query
//! block) for `q̄`. Each recomputes the blocks of `P` it needs, so memory stays
//! `O(B_q B_k)` per task and a window `w` keeps the cost at `O(T w)`.

use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::attention::Attention;
use mixer_core::{Form, Real, Requires, Result, Tensors, grad_name};
use mixer_registry::{BackwardEntry, every_config, register};
use ndarray::{Array2, Array3, Array4, ArrayD, ArrayView2, s};
use rayon::prelude::*;

use super::flash::{BLOCK_K, BLOCK_Q, forward};
use super::heads_major;

/// The recomputed blocks of one (query block, key block) pair: `P` and `S̄` (`nq × nk`).
#[allow(clippy::too_many_arguments)]
fn tile<F: Real>(
    a: &Attention,
    scale: F,
    qb: ArrayView2<'_, F>,
    kb: ArrayView2<'_, F>,
    vb: ArrayView2<'_, F>,
    gb: ArrayView2<'_, F>,
    lse: &[F],
    dd: &[F],
    i0: usize,
    j0: usize,
) -> (Array2<F>, Array2<F>) {
    let mut p = qb.dot(&kb.t());
    let dp = gb.dot(&vb.t());
    let mut ds = Array2::<F>::zeros(p.raw_dim());
    let nk = kb.nrows();
    for r in 0..qb.nrows() {
        let t = i0 + r;
        let lo = a.first_key(t);
        for c in 0..nk {
            let s = j0 + c;
            if s >= lo && s <= t {
                let e = (p[[r, c]] * scale - lse[r]).exp();
                p[[r, c]] = e;
                ds[[r, c]] = e * (dp[[r, c]] - dd[r]);
            } else {
                p[[r, c]] = F::zero();
            }
        }
    }
    (p, ds)
}

/// The `fast` backward (see the module documentation).
pub fn vjp<F: crate::vmath::VecMath>(
    m: &dyn Mixer,
    form: Form,
    inputs: &Tensors<F>,
    dy: &ArrayD<F>,
    req: &Requires,
) -> Result<Tensors<F>> {
    crate::fast_backward_only(m, form)?;
    let a = downcast::<Attention>(m, "cpu")?;
    let (q, k, v) = (heads_major(inputs, "q")?, heads_major(inputs, "k")?, heads_major(inputs, "v")?);
    let g = heads_major(&std::iter::once(("dy".to_string(), dy.clone())).collect(), "dy")?;
    let (bn, hn, tn, dk) = q.dim();
    let dv = v.dim().3;
    let scale = F::of(a.scale(dk));
    let (y, lse) = forward(a, &q, &k, &v)?;
    let dd: Array3<F> = Array3::from_shape_fn((bn, hn, tn), |(b, h, t)| {
        (0..dv).map(|c| g[[b, h, t, c]] * y[[b, h, t, c]]).fold(F::zero(), |x, z| x + z)
    });
    let row_vec = |arr: &Array3<F>, b: usize, h: usize, i0: usize, i1: usize| -> Vec<F> {
        arr.slice(s![b, h, i0..i1]).iter().copied().collect()
    };
    // Keys: k̄ and v̄ per (b, h, key block), over the query blocks that see it.
    let kv_tasks: Vec<(usize, usize, usize)> = (0..bn)
        .flat_map(|b| (0..hn).flat_map(move |h| (0..tn).step_by(BLOCK_K).map(move |j0| (b, h, j0))))
        .collect();
    let want_kv = req.wants("k") || req.wants("v");
    let kv: Vec<(Array2<F>, Array2<F>)> = if want_kv {
        kv_tasks
            .par_iter()
            .map(|&(b, h, j0)| {
                let j1 = (j0 + BLOCK_K).min(tn);
                let (kb, vb) = (k.slice(s![b, h, j0..j1, ..]), v.slice(s![b, h, j0..j1, ..]));
                let mut dkb = Array2::<F>::zeros((j1 - j0, dk));
                let mut dvb = Array2::<F>::zeros((j1 - j0, dv));
                // Last query that sees key j1 − 1: t − s < w.
                let t_end = a.window().map_or(tn, |w| (j1 - 1 + w).min(tn));
                let mut i0 = (j0 / BLOCK_Q) * BLOCK_Q;
                while i0 < t_end {
                    let i1 = (i0 + BLOCK_Q).min(tn);
                    let (qb, gb) = (q.slice(s![b, h, i0..i1, ..]), g.slice(s![b, h, i0..i1, ..]));
                    let (p, ds) = tile(
                        a,
                        scale,
                        qb,
                        kb,
                        vb,
                        gb,
                        &row_vec(&lse, b, h, i0, i1),
                        &row_vec(&dd, b, h, i0, i1),
                        i0,
                        j0,
                    );
                    dvb += &p.t().dot(&gb);
                    dkb.scaled_add(scale, &ds.t().dot(&qb));
                    i0 = i1;
                }
                (dkb, dvb)
            })
            .collect()
    } else {
        Vec::new()
    };
    // Queries: q̄ per (b, h, query block).
    let q_tasks: Vec<(usize, usize, usize)> = (0..bn)
        .flat_map(|b| (0..hn).flat_map(move |h| (0..tn).step_by(BLOCK_Q).map(move |i0| (b, h, i0))))
        .collect();
    let dqs: Vec<Array2<F>> = if req.wants("q") {
        q_tasks
            .par_iter()
            .map(|&(b, h, i0)| {
                let i1 = (i0 + BLOCK_Q).min(tn);
                let (qb, gb) = (q.slice(s![b, h, i0..i1, ..]), g.slice(s![b, h, i0..i1, ..]));
                let (lr, dr) = (row_vec(&lse, b, h, i0, i1), row_vec(&dd, b, h, i0, i1));
                let mut dqb = Array2::<F>::zeros((i1 - i0, dk));
                let mut j0 = a.first_key(i0);
                while j0 < i1 {
                    let j1 = (j0 + BLOCK_K).min(i1);
                    let (kb, vb) = (k.slice(s![b, h, j0..j1, ..]), v.slice(s![b, h, j0..j1, ..]));
                    let (_, ds) = tile(a, scale, qb, kb, vb, gb, &lr, &dr, i0, j0);
                    dqb.scaled_add(scale, &ds.dot(&kb));
                    j0 = j1;
                }
                dqb
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut dq = Array4::<F>::zeros((bn, tn, hn, dk));
    let mut dkk = Array4::<F>::zeros((bn, tn, hn, dk));
    let mut dvv = Array4::<F>::zeros((bn, tn, hn, dv));
    for (&(b, h, i0), blk) in q_tasks.iter().zip(&dqs) {
        dq.slice_mut(s![b, i0..i0 + blk.nrows(), h, ..]).assign(blk);
    }
    for (&(b, h, j0), (dkb, dvb)) in kv_tasks.iter().zip(&kv) {
        dkk.slice_mut(s![b, j0..j0 + dkb.nrows(), h, ..]).assign(dkb);
        dvv.slice_mut(s![b, j0..j0 + dvb.nrows(), h, ..]).assign(dvb);
    }
    let mut out = Tensors::new();
    out.insert(grad_name("q"), dq.into_dyn());
    out.insert(grad_name("k"), dkk.into_dyn());
    out.insert(grad_name("v"), dvv.into_dyn());
    Ok(out)
}

#[register]
static ATTENTION_CPU_BACKWARD: BackwardEntry = BackwardEntry {
    kernel: "attention",
    backend: "cpu",
    forms: &[Form::Fast],
    unsupported: every_config,
    vjp_f64: vjp::<f64>,
    vjp_f32: vjp::<f32>,
};
