//! The fast form of the GLR: the sparse recurrence (docs/math.md §1.2), `O(T · K)` per channel.
//!
//! For every batch row and block of channels, tokens run in order and token `t` reads its
//! `K(t+1)` active slots: `y_t = α_t x_t + Σ_k β_{t,k} y_{d_k(t)}` (`on = "b"`),
//! `y_t = α_{t,0} x_t + Σ_k α_{t,k+1} x_{d_k(t)}` (`on = "a"`), or both sums. The
//! state is a `[T, w]` buffer of the block's outputs (row-major), so every inner loop runs
//! over `w` contiguous channels, as do the rows of `x`, `alpha [B,T,K+1,C]` and
//! `beta [B,T,K,C]`. Blocks (batch × channel block) run in parallel with rayon.

use std::borrow::Cow;
use std::ops::Range;

use mixer_core::mixer::Mixer;
use mixer_core::mixers::glr::state as glr_state;
use mixer_core::mixers::glr::{Glr, Slots};
use mixer_core::parallel::min_len;
use mixer_core::tensor::{contiguous, get};
use mixer_core::{Error, Real, Result, Tensors};
use ndarray::{Array3, ArrayD, Axis, Slice};
use rayon::prelude::*;

/// Channel block width: enough blocks to keep every thread busy (4 per thread), at least 16
/// channels (a few SIMD vectors) per block when there are that many.
pub(crate) fn block_width(batch: usize, channels: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let per_batch = (4 * threads).div_ceil(batch.max(1)).max(1);
    channels.div_ceil(per_batch).max(16).min(channels.max(1))
}

/// Contiguous row-major inputs of one call and their sizes.
pub(crate) struct Views<'a, F> {
    pub(crate) x: &'a [F],
    pub(crate) alpha: &'a [F],
    pub(crate) beta: &'a [F],
    pub(crate) t_len: usize,
    pub(crate) c_len: usize,
    /// The slot axis of `beta` (`alpha` has `K + 1`): at least `K(T)`, the slots read.
    pub(crate) k_len: usize,
    pub(crate) has_a: bool,
    pub(crate) has_b: bool,
}

/// What a run from a state reads before its first token (docs/math.md §7.1): the run's tokens are
/// at the absolute positions `a …`, and a position `d < a` is read from row `row_of(d)` of the
/// state's kept outputs `y` (pattern on `B`) or inputs `x` (on `A`), `[R, C]` row-major for one
/// batch row.
pub(crate) struct Prefix<'a, F> {
    pub(crate) a: usize,
    /// `(position, row)`, sorted by position: the kept positions and their rows.
    pub(crate) rows: Vec<(usize, usize)>,
    /// The state's rows `R`.
    pub(crate) n_rows: usize,
    pub(crate) y: &'a [F],
    pub(crate) x: &'a [F],
}

impl<'a, F> Prefix<'a, F> {
    /// No prefix: a run from position 0.
    pub(crate) fn none() -> Self {
        Prefix { a: 0, rows: Vec::new(), n_rows: 0, y: &[], x: &[] }
    }

    /// The prefix of batch row `b` at position `a` of a state whose `K` slots keep the positions
    /// [`glr_state::kept`] lists, its streams `[B, R, C]` row-major (empty where not kept).
    pub(crate) fn of_row(
        g: &Glr,
        k: usize,
        a: usize,
        b: usize,
        (y, x): (&'a [F], &'a [F]),
        cn: usize,
    ) -> Self {
        let n_rows = glr_state::rows(g, k);
        let (y, x) = (batch_row(y, b, n_rows * cn), batch_row(x, b, n_rows * cn));
        Prefix { a, rows: glr_state::kept_rows(g, k, a), n_rows, y, x }
    }

    /// The state's row that keeps position `d < a`, or `None` where it keeps none (every
    /// position a later token reads is kept: never, for a valid state).
    pub(crate) fn index(&self, d: usize) -> Option<usize> {
        self.rows.binary_search_by_key(&d, |e| e.0).ok().map(|i| self.rows[i].1)
    }

    /// Row `d < a` of `stream` (`[R, C]`), channels `c0..c0 + w`, or `None` where the state does
    /// not keep `d`.
    pub(crate) fn row(&self, stream: &'a [F], d: usize, cn: usize, c0: usize, w: usize) -> Option<&'a [F]> {
        stream.get(self.index(d)? * cn + c0..)?.get(..w)
    }
}

/// Batch row `b` (`n` elements) of a row-major `[B, …]` buffer, or the empty buffer itself.
pub(crate) fn batch_row<F>(s: &[F], b: usize, n: usize) -> &[F] {
    if s.is_empty() { s } else { &s[b * n..(b + 1) * n] }
}

/// The error for a read of a position before a run from a state that the state does not keep.
pub(crate) fn not_kept(a: usize, d: usize) -> Error {
    Error::Numerical(format!(
        "glr from a state at position {a}: position {d} is read but the state does not keep it"
    ))
}

/// `y[t, 0..w]` of the sequence `v` (one batch row), channels `c0..c0+w`, as a `[T, w]`
/// row-major buffer, its tokens at the absolute positions `pre.a …` (0 without a state), reading
/// the positions before `pre.a` from `pre` (`slots` sized for `pre.a + T`); an error names a read
/// position the state does not keep.
pub(crate) fn block_after<F: Real>(
    v: &Views<'_, F>,
    slots: &Slots,
    c0: usize,
    w: usize,
    pre: &Prefix<'_, F>,
) -> Result<Vec<F>> {
    let (tn, cn, kn, a) = (v.t_len, v.c_len, v.k_len, pre.a);
    let k1 = kn + 1;
    let mut buf = vec![F::zero(); tn * w];
    let zeros = vec![F::zero(); w];
    let mut missing = None;
    let offsets = slots.offsets();
    let mut n = offsets.partition_point(|&f| f < a);
    for r in 0..tn {
        let t = a + r;
        while n < offsets.len() && offsets[n] <= t {
            n += 1;
        }
        let (done, rest) = buf.split_at_mut(r * w);
        let cur = &mut rest[..w];
        let row = r * cn + c0;
        let xt = &v.x[row..row + w];
        if v.has_a {
            let base = r * k1;
            let a0 = &v.alpha[base * cn + c0..][..w];
            for ((y, &al), &x) in cur.iter_mut().zip(a0).zip(xt) {
                *y = al * x;
            }
            for k in 0..n {
                let d = slots.pos(t, k);
                let ak = &v.alpha[(base + k + 1) * cn + c0..][..w];
                let xd = if d >= a {
                    &v.x[(d - a) * cn + c0..][..w]
                } else {
                    pre.row(pre.x, d, cn, c0, w).unwrap_or_else(|| {
                        missing = Some(d);
                        &zeros
                    })
                };
                for ((y, &al), &x) in cur.iter_mut().zip(ak).zip(xd) {
                    *y += al * x;
                }
            }
        } else {
            let at = &v.alpha[row..row + w];
            for ((y, &al), &x) in cur.iter_mut().zip(at).zip(xt) {
                *y = al * x;
            }
        }
        if v.has_b {
            let base = r * kn;
            for k in 0..n {
                let d = slots.pos(t, k);
                let bk = &v.beta[(base + k) * cn + c0..][..w];
                let yd = if d >= a {
                    &done[(d - a) * w..(d - a + 1) * w]
                } else {
                    pre.row(pre.y, d, cn, c0, w).unwrap_or_else(|| {
                        missing = Some(d);
                        &zeros
                    })
                };
                for ((y, &bb), &p) in cur.iter_mut().zip(bk).zip(yd) {
                    *y += bb * p;
                }
            }
        }
    }
    match missing {
        None => Ok(buf),
        Some(d) => Err(not_kept(a, d)),
    }
}

/// The contiguous `x`, `alpha` and `beta` (empty without `b`), shapes checked.
pub(crate) type Gathered<'a, F> = (Cow<'a, [F]>, Cow<'a, [F]>, Cow<'a, [F]>);

/// The slot axis `K` of the inputs (`beta`'s, or `alpha`'s less one with the pattern on `A`),
/// checked to hold at least the `K(T)` slots read.
pub(crate) fn slot_axis<F>(g: &Glr, inputs: &Tensors<F>, slots: &Slots) -> Result<usize> {
    let (name, a) =
        if g.on().has_b() { ("beta", get(inputs, "beta")?) } else { ("alpha", get(inputs, "alpha")?) };
    let k = match a.shape() {
        [_, _, k, _] if g.on().has_b() => *k,
        [_, _, k1, _] if g.on().has_a() => k1.saturating_sub(1),
        _ if !g.on().has_a() && !g.on().has_b() => 0,
        s => return Err(Error::shape(name, "[B, T, K, C]", mixer_core::error::fmt_shape(s))),
    };
    if k < slots.len() {
        return Err(Error::shape(
            name,
            format!("a slot axis of at least K(T) = {}", slots.len()),
            format!("K = {k}"),
        ));
    }
    Ok(k)
}

/// Gathers the inputs of `g` contiguously, with their shapes checked against `K ≥ K(T)`.
pub(crate) fn gather<'a, F: Real>(g: &Glr, inputs: &'a Tensors<F>, slots: &Slots) -> Result<Gathered<'a, F>> {
    let xs = get(inputs, "x")?.shape().to_vec();
    if xs.len() != 3 {
        return Err(Error::shape("x", "[B, T, C]", mixer_core::error::fmt_shape(&xs)));
    }
    let (bn, tn, cn) = (xs[0], xs[1], xs[2]);
    let kn = slot_axis(g, inputs, slots)?;
    let on = g.on();
    let x = contiguous(inputs, "x", &xs)?;
    let alpha = if on.has_a() {
        contiguous(inputs, "alpha", &[bn, tn, kn + 1, cn])?
    } else {
        contiguous(inputs, "alpha", &xs)?
    };
    let beta =
        if on.has_b() { contiguous(inputs, "beta", &[bn, tn, kn, cn])? } else { Cow::Owned(Vec::new()) };
    Ok((x, alpha, beta))
}

/// The [`Views`] of gathered inputs of shape `xs = [B, T, C]` with `k` slots.
pub(crate) fn views<'a, F>(
    g: &Glr,
    x: &'a [F],
    alpha: &'a [F],
    beta: &'a [F],
    xs: &[usize],
    k: usize,
) -> Views<'a, F> {
    Views {
        x,
        alpha,
        beta,
        t_len: xs[1],
        c_len: xs[2],
        k_len: k,
        has_a: g.on().has_a(),
        has_b: g.on().has_b(),
    }
}

/// The sequences of a call in its `[B, T, …]` buffer: sequence `i` is the tokens `ranges[i].1`
/// of batch row `ranges[i].0` — every batch row whole for a plain call, the `cu_seqlens`
/// ranges of row 0 for a packed one.
pub(crate) type Seqs = [(usize, Range<usize>)];

/// The batch rows of a plain call as sequences.
pub(crate) fn rows(bn: usize, tn: usize) -> Vec<(usize, Range<usize>)> {
    (0..bn).map(|b| (b, 0..tn)).collect()
}

/// The [`Views`] of sequence `(b, r)` read in place in the gathered buffer `v` (whose `K` is the
/// buffer's), with the slots of a sequence of `r.len()` tokens: the rows of `x`, `alpha` and
/// `beta` of one sequence are contiguous, so the sequence runs exactly as it would alone.
pub(crate) fn seq_views<'a, F>(v: &Views<'a, F>, (b, r): &(usize, Range<usize>)) -> Views<'a, F> {
    let (cn, kn) = (v.c_len, v.k_len);
    let rows = |a: &'a [F], per_t: usize| {
        if a.is_empty() { a } else { &a[(b * v.t_len + r.start) * per_t..(b * v.t_len + r.end) * per_t] }
    };
    let ka = if v.has_a { kn + 1 } else { 1 };
    Views {
        x: rows(v.x, cn),
        alpha: rows(v.alpha, ka * cn),
        beta: rows(v.beta, kn * cn),
        t_len: r.len(),
        c_len: cn,
        k_len: kn,
        has_a: v.has_a,
        has_b: v.has_b,
    }
}

/// The fast form: `y [B,T,C]` from `x [B,T,C]`, `alpha`, `beta` (shapes per docs/math.md §1.2, with
/// `K ≥ K(T)`); inactive slots (`f(k) > t`) are never read.
pub fn fast<F: Real>(g: &Glr, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let xs = get(inputs, "x")?.shape().to_vec();
    run(g, inputs, &rows(xs.first().copied().unwrap_or(0), xs.get(1).copied().unwrap_or(0)), None)
}

/// The fast form over a packed batch (`B = 1`, sequence `i` at the rows `ranges[i]`, checked by
/// the registry), natively: one job list over (sequence, channel block), every sequence read in
/// place in the buffer (no copy of `alpha` and `beta`, whose slot axes dominate the inputs), so
/// each gets exactly the bits of its run alone; rows past the last range get zeros. Plain runs
/// only: with states the registry runs the sequences one by one ([`super`]).
pub fn fast_packed<F: Real>(
    g: &Glr,
    inputs: &Tensors<F>,
    ranges: &[Range<usize>],
    initial: Option<&Tensors<F>>,
    want_final: bool,
) -> Result<(ArrayD<F>, Option<Tensors<F>>)> {
    if initial.is_some() || want_final {
        return Err(Error::config(g.name(), "internal: the native packed fast form takes no state"));
    }
    let seqs: Vec<_> = ranges.iter().map(|r| (0, r.clone())).collect();
    Ok((run(g, inputs, &seqs, None)?, None))
}

/// [`fast`], [`fast_packed`] and [`fast_from`]: every sequence of `seqs` by the sparse
/// recurrence, zeros elsewhere; with `from`, sequence `i` runs from the prefix `from.1[i]` on the
/// slots `from.0` of the absolute positions.
fn run<F: Real>(
    g: &Glr,
    inputs: &Tensors<F>,
    seqs: &Seqs,
    from: Option<(&Slots, &[Prefix<'_, F>])>,
) -> Result<ArrayD<F>> {
    let xs = get(inputs, "x")?.shape().to_vec();
    if xs.len() != 3 {
        return Err(Error::shape("x", "[B, T, C]", mixer_core::error::fmt_shape(&xs)));
    }
    let (bn, tn, cn) = (xs[0], xs[1], xs[2]);
    let slots = from.map_or_else(|| g.slots(tn), |(s, _)| s.clone());
    let (x, alpha, beta) = gather(g, inputs, &slots)?;
    let views = views(g, &x, &alpha, &beta, &xs, slot_axis(g, inputs, &slots)?);
    let parts: Vec<(Views<'_, F>, Slots)> = seqs
        .iter()
        .map(|s| (seq_views(&views, s), if from.is_some() { slots.clone() } else { g.slots(s.1.len()) }))
        .collect();
    let w = block_width(seqs.len(), cn);
    let tasks: Vec<(usize, usize)> =
        (0..seqs.len()).flat_map(|i| (0..cn).step_by(w.max(1)).map(move |c0| (i, c0))).collect();
    let none = Prefix::none();
    let blocks: Vec<Vec<F>> = tasks
        .par_iter()
        .with_min_len(min_len())
        .map(|&(i, c0)| {
            let pre = from.map_or(&none, |(_, p)| &p[i]);
            block_after(&parts[i].0, &parts[i].1, c0, w.min(cn - c0), pre)
        })
        .collect::<Result<_>>()?;
    let mut y = Array3::<F>::zeros((bn, tn, cn));
    for (&(i, c0), buf) in tasks.iter().zip(&blocks) {
        let wb = w.min(cn - c0);
        let (b, r) = &seqs[i];
        let mut yb = y.index_axis_mut(Axis(0), *b);
        for (t, mut row) in yb.slice_axis_mut(Axis(0), Slice::from(r.clone())).outer_iter_mut().enumerate() {
            for j in 0..wb {
                row[c0 + j] = buf[t * wb + j];
            }
        }
    }
    Ok(y.into_dyn())
}

/// The sizes of a run from a state: `x`'s shape `[B, T, C]`, the slot axis `K`, the state's rows
/// `R`, and each batch row's position (checked; 0 without a state).
pub(crate) struct FromState {
    pub(crate) xs: Vec<usize>,
    pub(crate) k: usize,
    pub(crate) rn: usize,
    pub(crate) pos: Vec<usize>,
}

/// [`FromState`] of the inputs and the state `initial`.
pub(crate) fn from_state<F: Real>(
    g: &Glr,
    inputs: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<FromState> {
    let xs = get(inputs, "x")?.shape().to_vec();
    if xs.len() != 3 {
        return Err(Error::shape("x", "[B, T, C]", mixer_core::error::fmt_shape(&xs)));
    }
    let k = slot_axis(g, inputs, &g.slots(xs[1]))?;
    let pos = match initial {
        Some(s) => glr_state::positions(g, s, xs[1], k)?,
        None => vec![0; xs[0]],
    };
    Ok(FromState { rn: glr_state::rows(g, k), xs, k, pos })
}

/// Stream `name` (`y` or `x`) of a state or of its cotangent `t`, `shape = [B, R, C]` row-major,
/// or empty where the mixer keeps no such stream or `t` is `None`.
pub(crate) fn state_stream<'t, F: Real>(
    g: &Glr,
    t: Option<&'t Tensors<F>>,
    name: &str,
    shape: &[usize],
) -> Result<Cow<'t, [F]>> {
    match t {
        Some(s) if glr_state::streams(g).contains(&name) => contiguous(s, name, shape),
        _ => Ok(Cow::Owned(Vec::new())),
    }
}

/// The fast form from a state (docs/math.md §7.1; `None`: position 0) without the extension: per
/// batch row at position `a`, the sparse recurrence over the run's tokens at their absolute
/// positions `a …`, reading the positions before `a` from the state's kept values, so it costs
/// `O(T · K)` per channel whatever `a` (the extension's run costs `O((a + T) · K)`). Returns `y`
/// and the final state (the kept streams at the positions [`glr_state::kept`] lists after
/// `a + T`, and `position`).
pub fn fast_from<F: Real>(
    g: &Glr,
    inputs: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let FromState { xs, k, rn, pos } = from_state(g, inputs, initial)?;
    let (bn, tn, cn) = (xs[0], xs[1], xs[2]);
    let slots = g.slots(pos.iter().copied().max().unwrap_or(0) + tn);
    let (sy, sx) =
        (state_stream(g, initial, "y", &[bn, rn, cn])?, state_stream(g, initial, "x", &[bn, rn, cn])?);
    let prefixes: Vec<Prefix<'_, F>> =
        pos.iter().enumerate().map(|(b, &a)| Prefix::of_row(g, k, a, b, (&sy, &sx), cn)).collect();
    let y = run(g, inputs, &rows(bn, tn), Some((&slots, &prefixes)))?;
    // The final state: each kept position's value from the run (at or after `a`) or the state.
    let x = get(inputs, "x")?;
    let mut fin = Tensors::new();
    for &name in glr_state::streams(g) {
        let (run_stream, st) = if name == "y" { (&y, &sy) } else { (x, &sx) };
        let mut f = Array3::<F>::zeros((bn, rn, cn));
        for (b, pre) in prefixes.iter().enumerate() {
            for (p, j) in glr_state::kept_rows(g, k, pre.a + tn) {
                let mut dst = f.slice_mut(ndarray::s![b, j, ..]);
                if p >= pre.a {
                    dst.assign(&run_stream.slice(ndarray::s![b, p - pre.a, ..]));
                } else {
                    let row = pre.index(p).ok_or_else(|| not_kept(pre.a, p))?;
                    dst.assign(&ndarray::ArrayView1::from(&batch_row(st, b, rn * cn)[row * cn..][..cn]));
                }
            }
        }
        fin.insert(name.to_string(), f.into_dyn());
    }
    let end: Vec<usize> = pos.iter().map(|&a| a + tn).collect();
    fin.insert(mixer_core::state::POSITION.to_string(), mixer_core::state::position_tensor(&end));
    Ok((y.into_dyn(), fin))
}
