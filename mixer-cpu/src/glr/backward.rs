//! The GLR's backward pass on CPU: the reverse sparse recurrence, `O(T · K)` per channel.
//!
//! With `ȳ` the output cotangent, the total cotangent of `y_t` gathers the reads of
//! `y_t` by later tokens through the *transposed* pattern:
//! `g_t = ȳ_t + Σ_{t' > t, k: d_k(t') = t} β_{t',k} g_{t'} .`
//! Tokens run from `T−1` down to 0; when token `t` is reached its `g_t` is complete, and it
//! scatters `β_{t,k} g_t` to `g_{d_k(t)}` (so the transposed pattern is never built, and
//! cache-efficient lattices work unchanged). Then
//! `ᾱ_t = g_t x_t` (or `ᾱ_{t,0}`), `ᾱ_{t,k+1} = g_t x_{d_k(t)}`,
//! `β̄_{t,k} = g_t y_{d_k(t)}`, `x̄_t += α_t g_t`,
//! `x̄_{d_k(t)} += α_{t,k+1} g_t`. The outputs `y` are recomputed by the
//! forward recurrence first (one `[T, w]` buffer per channel block). Inactive slots get 0.

use mixer_core::mixer::Mixer;
use mixer_core::mixers::glr::{Glr, Slots};
use mixer_core::tensor::get;
use mixer_core::{Error, Real, Requires, Result, Tensors, grad_name};
use ndarray::{Array3, Array4, ArrayD, ArrayViewMut, ArrayViewMut1, ArrayViewMut2, ArrayViewMut3, Axis};
use rayon::prelude::*;
use std::ops::Range;

use super::fast::{Seqs, Views, block, block_width, gather, rows, seq_views, slot_axis, views};

/// One channel block's gradients, written in place: views of `dx [T, w]`,
/// `dalpha [T, A, w]` and `dbeta [T, K, w]` (the block's channels of one sequence; the last
/// axis is contiguous).
struct BlockOut<'a, F> {
    c0: usize,
    dx: ArrayViewMut2<'a, F>,
    dalpha: ArrayViewMut3<'a, F>,
    dbeta: ArrayViewMut3<'a, F>,
}

/// `v` cut along its last (channel) axis into blocks of `w` (the last one may be shorter).
fn chunks<F, D: ndarray::Dimension>(mut v: ArrayViewMut<'_, F, D>, w: usize) -> Vec<ArrayViewMut<'_, F, D>> {
    let axis = Axis(v.ndim() - 1);
    let mut out = Vec::new();
    while v.len_of(axis) > w {
        let (head, rest) = v.split_at(axis, w);
        out.push(head);
        v = rest;
    }
    out.push(v);
    out
}

/// An empty view, left where a batch row's views were taken out.
fn empty<'a, F, D: ndarray::Dimension>() -> ArrayViewMut<'a, F, D> {
    ArrayViewMut::from_shape(D::zeros(D::NDIM.unwrap_or(0)), &mut []).expect("an empty view")
}

/// A contiguous row of a view whose last axis has stride 1.
fn row<'a, F>(v: ArrayViewMut1<'a, F>) -> &'a mut [F] {
    v.into_slice().expect("the channel axis is the arrays' last, contiguous axis")
}

fn block_vjp<F: Real>(v: &Views<'_, F>, slots: &Slots, gy: &[F], out: BlockOut<'_, F>) {
    let (tn, cn) = (v.t_len, v.c_len);
    let BlockOut { c0, mut dx, mut dalpha, mut dbeta } = out;
    let w = dx.ncols();
    let ka = dalpha.shape()[1];
    let y = if v.has_b { block(v, slots, c0, w) } else { Vec::new() };
    let mut g = vec![F::zero(); tn * w];
    for t in 0..tn {
        let r = t * cn + c0;
        g[t * w..(t + 1) * w].copy_from_slice(&gy[r..r + w]);
    }
    // x̄ is scattered to earlier rows: kept in a local [T, w] buffer, copied out at the end;
    // ᾱ and β̄ are written row by row in place (each (t, k) once).
    let mut dxl = vec![F::zero(); tn * w];
    let mut da_rows = dalpha.outer_iter_mut().rev();
    let mut db_rows = dbeta.outer_iter_mut().rev();
    for t in (0..tn).rev() {
        let n = slots.active(t);
        let (before, rest) = g.split_at_mut(t * w);
        let gt = &rest[..w];
        let r = t * cn + c0;
        let xt = &v.x[r..r + w];
        let (Some(mut dat), Some(mut dbt)) = (da_rows.next(), db_rows.next()) else { break };
        let mut da_slots = dat.outer_iter_mut().map(row);
        let mut db_slots = dbt.outer_iter_mut().map(row);
        // α on x_t.
        let a0 = if v.has_a { &v.alpha[t * ka * cn + c0..][..w] } else { &v.alpha[r..r + w] };
        let Some(da0) = da_slots.next() else { break };
        for j in 0..w {
            da0[j] = gt[j] * xt[j];
            dxl[t * w + j] += a0[j] * gt[j];
        }
        for k in 0..n {
            let d = slots.pos(t, k);
            if v.has_a {
                let ak = &v.alpha[(t * ka + k + 1) * cn + c0..][..w];
                let xd = &v.x[d * cn + c0..][..w];
                let Some(dak) = da_slots.next() else { break };
                let dxd = &mut dxl[d * w..(d + 1) * w];
                for j in 0..w {
                    dak[j] = gt[j] * xd[j];
                    dxd[j] += ak[j] * gt[j];
                }
            }
            if v.has_b {
                let bk = &v.beta[(t * v.k_len + k) * cn + c0..][..w];
                let yd = &y[d * w..(d + 1) * w];
                let Some(dbk) = db_slots.next() else { break };
                let gd = &mut before[d * w..(d + 1) * w];
                for j in 0..w {
                    dbk[j] = gt[j] * yd[j];
                    gd[j] += bk[j] * gt[j];
                }
            }
        }
    }
    for (t, dxt) in dx.outer_iter_mut().enumerate() {
        row(dxt).copy_from_slice(&dxl[t * w..(t + 1) * w]);
    }
}

/// The `fast` backward (see the module documentation).
pub fn vjp<F: Real>(g: &Glr, inputs: &Tensors<F>, dy: &ArrayD<F>, _req: &Requires) -> Result<Tensors<F>> {
    let xs = get(inputs, "x")?.shape().to_vec();
    run(g, inputs, dy, &rows(xs.first().copied().unwrap_or(0), xs.get(1).copied().unwrap_or(0)))
}

/// The backward of [`super::fast::fast_packed`] (`B = 1`, sequence `i` at the rows
/// `ranges[i]`), natively: one job list over (sequence, channel block), each reading its
/// sequence in place, so each sequence's gradients are exactly those of its backward alone;
/// zero past the last range and in the slots a shorter sequence does not have. Plain runs only.
#[allow(clippy::too_many_arguments)]
pub fn vjp_packed<F: Real>(
    g: &Glr,
    inputs: &Tensors<F>,
    ranges: &[Range<usize>],
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
    _req: &Requires,
) -> Result<(Tensors<F>, Tensors<F>)> {
    if initial.is_some() || d_final.is_some() {
        return Err(Error::config(g.name(), "internal: the native packed backward takes no state"));
    }
    let seqs: Vec<_> = ranges.iter().map(|r| (0, r.clone())).collect();
    Ok((run(g, inputs, dy, &seqs)?, Tensors::new()))
}

/// [`vjp`] and [`vjp_packed`]: the backward of every sequence of `seqs`, zeros elsewhere.
fn run<F: Real>(g: &Glr, inputs: &Tensors<F>, dy: &ArrayD<F>, seqs: &Seqs) -> Result<Tensors<F>> {
    let xs = get(inputs, "x")?.shape().to_vec();
    let slots = g.slots(xs.get(1).copied().unwrap_or(0));
    let (x, alpha, beta) = gather(g, inputs, &slots)?;
    let v = views(g, &x, &alpha, &beta, &xs, slot_axis(g, inputs, &slots)?);
    if dy.shape() != xs.as_slice() {
        return Err(Error::shape(
            "dy",
            mixer_core::error::fmt_shape(&xs),
            mixer_core::error::fmt_shape(dy.shape()),
        ));
    }
    let gy = dy.as_standard_layout();
    let gy = gy.as_slice().expect("a standard-layout array is one slice");
    let (bn, tn, cn, kn) = (xs[0], xs[1], xs[2], v.k_len);
    let ka = if v.has_a { kn + 1 } else { 1 };
    let w = block_width(seqs.len(), cn).max(1);
    let mut dx = Array3::<F>::zeros((bn, tn, cn));
    let mut da = Array4::<F>::zeros((bn, tn, ka, cn));
    let mut db = Array4::<F>::zeros((bn, tn, if v.has_b { kn } else { 0 }, cn));
    // One task per (sequence, block of w channels), each writing its own rows and channels:
    // every batch row's views are cut at its sequences' ends, in order.
    let mut left: Vec<_> = dx
        .outer_iter_mut()
        .zip(da.outer_iter_mut())
        .zip(db.outer_iter_mut())
        .map(|((x, a), b)| (0, x, a, b))
        .collect();
    let mut tasks = Vec::new();
    for (i, (b, r)) in seqs.iter().enumerate() {
        let (at, x, a, bt) = std::mem::replace(&mut left[*b], (0, empty(), empty(), empty()));
        let (skip, n) = (r.start - at, r.len());
        let (x, x_rest) = x.split_at(Axis(0), skip).1.split_at(Axis(0), n);
        let (a, a_rest) = a.split_at(Axis(0), skip).1.split_at(Axis(0), n);
        let (bt, b_rest) = bt.split_at(Axis(0), skip).1.split_at(Axis(0), n);
        left[*b] = (r.end, x_rest, a_rest, b_rest);
        let parts = chunks(x, w).into_iter().zip(chunks(a, w)).zip(chunks(bt, w));
        for (j, ((dx, dalpha), dbeta)) in parts.enumerate() {
            tasks.push((i, BlockOut { c0: j * w, dx, dalpha, dbeta }));
        }
    }
    let parts: Vec<(Views<'_, F>, Slots)> =
        seqs.iter().map(|s| (seq_views(&v, s), g.slots(s.1.len()))).collect();
    tasks.into_par_iter().for_each(|(i, out)| {
        let (b, r) = &seqs[i];
        let g0 = (b * tn + r.start) * cn;
        block_vjp(&parts[i].0, &parts[i].1, &gy[g0..g0 + r.len() * cn], out)
    });
    let mut out = Tensors::new();
    out.insert(grad_name("x"), dx.into_dyn());
    let da = if v.has_a { da.into_dyn() } else { da.remove_axis(Axis(2)).into_dyn() };
    out.insert(grad_name("alpha"), da);
    if v.has_b {
        out.insert(grad_name("beta"), db.into_dyn());
    }
    Ok(out)
}
