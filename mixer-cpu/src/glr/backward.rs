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
//! `x̄_{d_k(t)} += α_{t,k+1} g_t`. The outputs `y` are the forward's when the call is given them
//! (`mixer_core::grad::SAVED_OUTPUT`), else recomputed by the forward recurrence first (one
//! `[T, w]` buffer per channel block). Inactive slots get 0.

use mixer_core::grad::{SAVED_OUTPUT, saved_output};
use mixer_core::mixer::Mixer;
use mixer_core::mixers::glr::state as glr_state;
use mixer_core::mixers::glr::{Glr, Slots};
use mixer_core::parallel::min_len;
use mixer_core::tensor::get;
use mixer_core::{Error, Real, Requires, Result, Tensors, grad_name};
use ndarray::{Array3, Array4, ArrayD, ArrayViewMut, ArrayViewMut1, ArrayViewMut2, ArrayViewMut3, Axis};
use rayon::prelude::*;
use std::ops::Range;

use super::fast::{
    Prefix, Seqs, Views, batch_row, block_after, block_width, gather, not_kept, rows, seq_views, slot_axis,
    state_stream, views,
};

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

/// The final state's cotangent of one batch row of a run from a state: `(position, row)` of the
/// positions the final state keeps, and its streams' cotangents `[R, C]` (empty where not kept
/// or not given).
pub(crate) struct Finals<'a, F> {
    ends: Vec<(usize, usize)>,
    dy: &'a [F],
    dx: &'a [F],
}

impl<F> Finals<'_, F> {
    fn none() -> Self {
        Finals { ends: Vec::new(), dy: &[], dx: &[] }
    }
}

/// `acc += src`, element by element.
fn add_to<F: Real>(acc: &mut [F], src: &[F]) {
    acc.iter_mut().zip(src).for_each(|(a, &s)| *a += s);
}

/// One channel block's backward of a run whose tokens sit at the absolute positions `pre.a …`
/// (0 without a state), reading the positions before them from `pre` (docs/math.md §7.1): the
/// cotangents of a read before `pre.a` go to the state's row that keeps it, and the final state's
/// cotangent `fin` adds to the outputs (`y`) or inputs (`x`) it copies. Returns the state's rows'
/// cotangents `[R, w]` for `y` and for `x`.
#[allow(clippy::too_many_arguments)]
fn block_vjp<F: Real>(
    v: &Views<'_, F>,
    slots: &Slots,
    gy: &[F],
    ys: Option<&[F]>,
    out: BlockOut<'_, F>,
    pre: &Prefix<'_, F>,
    fin: &Finals<'_, F>,
) -> Result<(Vec<F>, Vec<F>)> {
    let (tn, cn, a) = (v.t_len, v.c_len, pre.a);
    let BlockOut { c0, mut dx, mut dalpha, mut dbeta } = out;
    let w = dx.ncols();
    let ka = dalpha.shape()[1];
    let y = match (v.has_b, ys) {
        (false, _) => Vec::new(),
        (true, Some(ys)) => block_rows(ys, tn, cn, c0, w),
        (true, None) => block_after(v, slots, c0, w, pre)?,
    };
    let mut g = block_rows(gy, tn, cn, c0, w);
    // x̄ is scattered to earlier rows: kept in a local [T, w] buffer, copied out at the end;
    // ᾱ and β̄ are written row by row in place (each (t, k) once).
    let mut dxl = vec![F::zero(); tn * w];
    let (mut dsy, mut dsx) = (vec![F::zero(); pre.n_rows * w], vec![F::zero(); pre.n_rows * w]);
    let at = |d: usize| pre.index(d).ok_or_else(|| not_kept(a, d));
    for &(p, j) in &fin.ends {
        let at_row = j * cn + c0..j * cn + c0 + w;
        let (sy, sx) = (fin.dy.get(at_row.clone()), fin.dx.get(at_row));
        if let Some(src) = sy {
            let dst = if p >= a { &mut g[(p - a) * w..][..w] } else { &mut dsy[at(p)? * w..][..w] };
            add_to(dst, src);
        }
        if let Some(src) = sx {
            let dst = if p >= a { &mut dxl[(p - a) * w..][..w] } else { &mut dsx[at(p)? * w..][..w] };
            add_to(dst, src);
        }
    }
    let mut da_rows = dalpha.outer_iter_mut().rev();
    let mut db_rows = dbeta.outer_iter_mut().rev();
    for r in (0..tn).rev() {
        let t = a + r;
        let n = slots.active(t);
        let (before, rest) = g.split_at_mut(r * w);
        let gt = &rest[..w];
        let row_x = r * cn + c0;
        let xt = &v.x[row_x..row_x + w];
        let (Some(mut dat), Some(mut dbt)) = (da_rows.next(), db_rows.next()) else { break };
        let mut da_slots = dat.outer_iter_mut().map(row);
        let mut db_slots = dbt.outer_iter_mut().map(row);
        // α on x_t.
        let a0 = if v.has_a { &v.alpha[r * ka * cn + c0..][..w] } else { &v.alpha[row_x..row_x + w] };
        let Some(da0) = da_slots.next() else { break };
        for j in 0..w {
            da0[j] = gt[j] * xt[j];
            dxl[r * w + j] += a0[j] * gt[j];
        }
        for k in 0..n {
            let d = slots.pos(t, k);
            if v.has_a {
                let ak = &v.alpha[(r * ka + k + 1) * cn + c0..][..w];
                let (xd, dxd) = if d >= a {
                    (&v.x[(d - a) * cn + c0..][..w], &mut dxl[(d - a) * w..(d - a + 1) * w])
                } else {
                    let i = at(d)?;
                    (&pre.x[i * cn + c0..][..w], &mut dsx[i * w..(i + 1) * w])
                };
                let Some(dak) = da_slots.next() else { break };
                for j in 0..w {
                    dak[j] = gt[j] * xd[j];
                    dxd[j] += ak[j] * gt[j];
                }
            }
            if v.has_b {
                let bk = &v.beta[(r * v.k_len + k) * cn + c0..][..w];
                let (yd, gd) = if d >= a {
                    (&y[(d - a) * w..(d - a + 1) * w], &mut before[(d - a) * w..(d - a + 1) * w])
                } else {
                    let i = at(d)?;
                    (&pre.y[i * cn + c0..][..w], &mut dsy[i * w..(i + 1) * w])
                };
                let Some(dbk) = db_slots.next() else { break };
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
    Ok((dsy, dsx))
}

/// Channels `c0 .. c0 + w` of the `[T, C]` rows `src` as a `[T, w]` row-major buffer.
fn block_rows<F: Copy>(src: &[F], tn: usize, cn: usize, c0: usize, w: usize) -> Vec<F> {
    (0..tn).flat_map(|t| src[t * cn + c0..][..w].iter().copied()).collect()
}

/// The `fast` backward (see the module documentation); with the forward's output among the
/// inputs (`mixer_core::grad::SAVED_OUTPUT`) it reads that instead of recomputing it.
pub fn vjp<F: Real>(g: &Glr, inputs: &Tensors<F>, dy: &ArrayD<F>, _req: &Requires) -> Result<Tensors<F>> {
    let xs = get(inputs, "x")?.shape().to_vec();
    let seqs = rows(xs.first().copied().unwrap_or(0), xs.get(1).copied().unwrap_or(0));
    let saved = saved_output(g, inputs);
    if let Some(y) = saved
        && y.shape() != xs.as_slice()
    {
        return Err(Error::shape(
            SAVED_OUTPUT,
            mixer_core::error::fmt_shape(&xs),
            mixer_core::error::fmt_shape(y.shape()),
        ));
    }
    Ok(run(g, inputs, dy, saved, &seqs, None)?.0)
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
    Ok((run(g, inputs, dy, None, &seqs, None)?.0, Tensors::new()))
}

/// The state of each sequence of a backward from a state: its prefix, the final state's
/// cotangent, and the slots of the absolute positions the sequences reach.
struct SeqStates<'a, F> {
    pre: Vec<Prefix<'a, F>>,
    fin: Vec<Finals<'a, F>>,
    slots: Slots,
}

/// The cotangents of one task's state rows: `(sequence, first channel, (y rows, x rows))`.
type StateRows<F> = Vec<(usize, usize, (Vec<F>, Vec<F>))>;

/// [`vjp`], [`vjp_packed`] and [`vjp_from`]: the backward of every sequence of `seqs` (from its
/// state where `from` gives one), zeros elsewhere; with the state rows' cotangents per task. `y`:
/// the forward's output (`[B, T, C]`, checked by the caller), read instead of recomputed.
fn run<F: Real>(
    g: &Glr,
    inputs: &Tensors<F>,
    dy: &ArrayD<F>,
    y: Option<&ArrayD<F>>,
    seqs: &Seqs,
    from: Option<&SeqStates<'_, F>>,
) -> Result<(Tensors<F>, StateRows<F>)> {
    let xs = get(inputs, "x")?.shape().to_vec();
    let slots = match from {
        Some(f) => f.slots.clone(),
        None => g.slots(xs.get(1).copied().unwrap_or(0)),
    };
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
    let ys = y.map(|y| y.as_standard_layout());
    let ys = ys.as_ref().map(|y| y.as_slice().expect("a standard-layout array is one slice"));
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
    let parts: Vec<(Views<'_, F>, Slots)> = seqs
        .iter()
        .map(|s| (seq_views(&v, s), if from.is_some() { slots.clone() } else { g.slots(s.1.len()) }))
        .collect();
    let state_rows = tasks
        .into_par_iter()
        .with_min_len(min_len())
        .map(|(i, out)| {
            let (b, r) = &seqs[i];
            let g0 = (b * tn + r.start) * cn;
            let c0 = out.c0;
            let (none_p, none_f) = (Prefix::none(), Finals::none());
            let (pre, fin) = from.map_or((&none_p, &none_f), |f| (&f.pre[i], &f.fin[i]));
            let rows = g0..g0 + r.len() * cn;
            let ys = ys.map(|y| &y[rows.clone()]);
            block_vjp(&parts[i].0, &parts[i].1, &gy[rows], ys, out, pre, fin).map(|d| (i, c0, d))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = Tensors::new();
    out.insert(grad_name("x"), dx.into_dyn());
    let da = if v.has_a { da.into_dyn() } else { da.remove_axis(Axis(2)).into_dyn() };
    out.insert(grad_name("alpha"), da);
    if v.has_b {
        out.insert(grad_name("beta"), db.into_dyn());
    }
    Ok((out, state_rows))
}

/// The backward of [`super::fast::fast_from`] (docs/math.md §7.1; `initial` `None`: position 0):
/// the reverse sparse recurrence over the run's tokens alone, the cotangents of the reads before a
/// row's position going to the state's rows that keep them, and the final state's cotangent
/// `d_final` to what it copies (outputs of the run, its inputs, or the state's rows): `O(T · K)`
/// per channel whatever the position. Returns the gradients `requires` asks for and, with
/// `initial`, the state's gradient (zero in `position` and in the rows that keep nothing).
pub fn vjp_from<F: Real>(
    g: &Glr,
    inputs: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
    requires: &Requires,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let super::fast::FromState { xs, k, rn, pos } = super::fast::from_state(g, inputs, initial)?;
    let (bn, tn, cn) = (xs[0], xs[1], xs[2]);
    let streams = glr_state::streams(g);
    let shape = [bn, rn, cn];
    let (sy, sx) = (state_stream(g, initial, "y", &shape)?, state_stream(g, initial, "x", &shape)?);
    let (fy, fx) = (state_stream(g, d_final, "y", &shape)?, state_stream(g, d_final, "x", &shape)?);
    let from = SeqStates {
        pre: pos.iter().enumerate().map(|(b, &a)| Prefix::of_row(g, k, a, b, (&sy, &sx), cn)).collect(),
        fin: pos
            .iter()
            .enumerate()
            .map(|(b, &a)| Finals {
                ends: glr_state::kept_rows(g, k, a + tn),
                dy: batch_row(&fy, b, rn * cn),
                dx: batch_row(&fx, b, rn * cn),
            })
            .collect(),
        slots: g.slots(pos.iter().copied().max().unwrap_or(0) + tn),
    };
    let (mut grads, rows_of) = run(g, inputs, dy, None, &rows(bn, tn), Some(&from))?;
    grads.retain(|n, _| n.strip_prefix("d_").is_some_and(|n| requires.wants(n)));
    let mut state = Tensors::new();
    if initial.is_some() {
        for &name in streams {
            let mut d = Array3::<F>::zeros((bn, rn, cn));
            for (b, c0, (dsy, dsx)) in &rows_of {
                let src = if name == "y" { dsy } else { dsx };
                let w = src.len() / rn.max(1);
                for j in 0..rn {
                    for c in 0..w {
                        d[[*b, j, c0 + c]] = src[j * w + c];
                    }
                }
            }
            state.insert(name.to_string(), d.into_dyn());
        }
        state.insert(mixer_core::state::POSITION.to_string(), ArrayD::zeros(ndarray::IxDyn(&[bn])));
    }
    Ok((grads, state))
}
