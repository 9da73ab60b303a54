//! The lifts' `fast` form from a state and its backward on CUDA (docs/math.md §7.1, "The lifts'
//! fast form from a state on CUDA"): the state is the decoder's merged-ahead Fenwick level states
//! `S [B, H, L, Dv, Dk]` at the position `a` (`position [B]`).
//!
//! The run `[a, a + T)` is cut into *segments* `[c, e)` ([`segments`]): from `c = a`, each takes
//! `min(2^ctz(c), a + T − c)` tokens (any number from `c = 0`), the last part cut further at its
//! large Fenwick buckets, so at most about `2 bitlen(T)`; `c` is a multiple of `2^j ≥ e − c`
//! (`j = ctz c`). Within a segment the Fenwick level of two of
//! its tokens is that of their offsets from `c`, and every level state held at `c` (slot `i`, bit
//! `i` of `c`, so `i ≥ j`) is read by every token of the segment at its own level `i + 1`. So a
//! segment is
//! - the lift's `fast` form from zero on its own tokens (their pairs), plus
//! - one run of the base mixer from a state over `R` batch rows per batch row: a *held* row per
//!   live slot `i` (the slot as the initial state, `q_t` scaled by `λ_t^(i+1)`, `v = 0`: the slot
//!   carried to each token by the base mixer's transitions and read at its level) and an *own*
//!   row per slot `d` that the segment's tokens fill at `e` (token `s` fills slot
//!   `bitlen(e ⊕ s) − 1`; zero state, `q = 0`, `v` kept on those tokens only: its final state is
//!   their contribution to slot `d`).
//!
//! The level states at `e` are the rows' final states merged: held slot `i` goes to slot
//! `max(i + 1, bitlen(e ⊕ c)) − 1`, the own rows to their slots. The row tensors are built and read
//! by `kernels/loglinear_lift_state.cu`. The backward runs the segments in reverse: the adjoint of
//! the merge, the base mixer's backward from a state over the rows (its initial-state gradients
//! are the held slots' cotangents at `c`), the lift's backward from zero on the segment, and the
//! rows' gradients gathered back (`q̄` weighted by `λ`, `λ̄` of the held reads `q · q̄_row`); the
//! level states at every segment start come from a forward pass over the base rows alone.
//!
//! Cost: the lift's kernels once over the run, the base mixer's over `Σ_segments R · (e − c)`
//! rows — `R = popcount(c) + popcount` of the segment's own slots, so a few times the lift's at
//! positions with many set bits — and one launch sequence per segment. Batch rows at
//! different positions run one at a time. λ is mapped by the scheme once, and the segments run the
//! lift with the identity scheme on the mapped weights.

use mixer_core::fenwick::bitlen;
use mixer_core::mixers::loglinear::lift_state::{POSITION, level_positions};
use mixer_core::mixers::loglinear::{LambdaScheme, Lift, LogLinear, STATE};
use mixer_core::{Error, Precision, Requires, Result, grad_name};

use super::backward_lift::{LiftLambda, lambda_backward, lift_lambda};
use super::common::FAMILY;
use super::{backward, fast};
use crate::forms::{cotangent, finish, input, input_opt};
use crate::kernels;
use crate::pitched::copy_rows;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, grid1, int, launch};
use crate::state_rows::{copy_as, counts, gathered};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, GpuReal};

/// One segment `[c, e)` of a run (absolute positions) with its rows: `held` the slots live at
/// `c` (the set bits of `c`), `own` the slots its tokens fill at `e`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The first position.
    pub c: usize,
    /// One past the last position.
    pub e: usize,
    /// The level-state slots live at `c` (bit `i`: slot `i`).
    pub held: u64,
    /// The slots the segment's tokens fill at `e`.
    pub own: u64,
}

impl Segment {
    /// Rows of the base run per batch row.
    fn rows(&self) -> usize {
        (self.held.count_ones() + self.own.count_ones()) as usize
    }
    /// `bitlen(e ⊕ c)`: held slot `i` goes to slot `max(i + 1, ub) − 1` at `e`.
    fn ub(&self) -> usize {
        bitlen(self.e ^ self.c)
    }
    fn len(&self) -> usize {
        self.e - self.c
    }
}

/// Tokens from which the last segment's leading bucket runs as a segment of its own ([`segments`]).
const PEEL: usize = 64;

/// The segments of a run of `t` tokens from position `a` (module documentation): from `c`, the
/// whole block of `2^ctz(c)` tokens (all that is left from `c = 0`); where fewer are left than a
/// block, that last part fills one slot per set bit of its length at its end, and its largest
/// bucket, from [`PEEL`] tokens on, is cut off as a segment of its own (one own row over it rather
/// than one over the whole part), until the part is one bucket or its buckets are small.
pub fn segments(a: usize, t: usize) -> Vec<Segment> {
    let end = a + t;
    let mut out = Vec::new();
    let mut c = a;
    while c < end {
        let rest = end - c;
        let block = if c == 0 { usize::MAX } else { 1usize << c.trailing_zeros() };
        let mut n = rest.min(block);
        if n < block {
            let top = 1usize << (bitlen(n) - 1);
            if top >= PEEL {
                n = top;
            }
        }
        let e = c + n;
        // A whole block of 2^ctz(c) tokens carries into one slot at e; a shorter last segment's
        // tokens fill the slots of the set bits of its length.
        let own = if c & n != 0 { 1u64 << (bitlen(e ^ c) - 1) } else { n as u64 };
        out.push(Segment { c, e, held: c as u64, own });
        c = e;
    }
    out
}

/// The inputs of a run, as `F`: `q`, `k`, `v`, `g` and `beta` where the base mixer takes them,
/// and the mapped λ weights (`w`, `[B, T, H, L]`).
struct Inputs<F: GpuReal> {
    q: DeviceTensor<F>,
    k: DeviceTensor<F>,
    v: DeviceTensor<F>,
    g: Option<DeviceTensor<F>>,
    beta: Option<DeviceTensor<F>>,
    w: DeviceTensor<F>,
}

impl<F: GpuReal> Inputs<F> {
    /// Batch rows `r` of every input (views).
    fn rows(&self, r: std::ops::Range<usize>) -> Result<Self> {
        let opt = |t: &Option<DeviceTensor<F>>| t.as_ref().map(|t| t.batch(r.clone())).transpose();
        Ok(Inputs {
            q: self.q.batch(r.clone())?,
            k: self.k.batch(r.clone())?,
            v: self.v.batch(r.clone())?,
            g: opt(&self.g)?,
            beta: opt(&self.beta)?,
            w: self.w.batch(r)?,
        })
    }
    /// `[B, T, H, Dk, Dv, L]`.
    fn dims(&self) -> [usize; 6] {
        let (q, v) = (self.q.shape(), self.v.shape());
        [q[0], q[1], q[2], q[3], v[3], self.w.shape()[3]]
    }
}

/// `q`, `k`, `v`, `g`, `beta` of `x` as `F`, their shapes checked (the kernels here index them
/// before the forms that check them), and λ ([`lift_lambda`]).
fn inputs<'a, F: GpuReal>(ll: &LogLinear, x: &'a DeviceTensors) -> Result<(Inputs<F>, LiftLambda<'a, F>)> {
    let q = input::<F>(x, "q")?.into_owned();
    let s = q.shape().to_vec();
    if s.len() != 4 {
        return Err(Error::shape("q", "[B, T, H, Dk]", format!("{s:?}")));
    }
    let (b, t, h) = (s[0], s[1], s[2]);
    let k = input::<F>(x, "k")?.into_owned();
    if k.shape() != s.as_slice() {
        return Err(Error::shape("k", format!("{s:?} (the shape of q)"), format!("{:?}", k.shape())));
    }
    let v = input::<F>(x, "v")?.into_owned();
    if v.shape().len() != 4 || v.shape()[..3] != [b, t, h] {
        return Err(Error::shape("v", format!("[{b}, {t}, {h}, Dv]"), format!("{:?}", v.shape())));
    }
    let gate = |name: &str, used: bool| -> Result<Option<DeviceTensor<F>>> {
        let Some(a) = input_opt::<F>(x, name)?.filter(|_| used) else {
            return if used {
                Err(Error::MissingInput {
                    name: name.into(),
                    expected: format!("[{b}, {t}, {h}]"),
                    given: x.keys().cloned().collect::<Vec<_>>().join(", "),
                })
            } else {
                Ok(None)
            };
        };
        if a.shape() != [b, t, h] {
            return Err(Error::shape(name, format!("[{b}, {t}, {h}]"), format!("{:?}", a.shape())));
        }
        Ok(Some(a.into_owned()))
    };
    let (g, beta) = (gate("g", ll.base.has_decay())?, gate("beta", ll.base.has_beta())?);
    let lam = lift_lambda::<F>(ll, x, [b, t, h])?;
    Ok((Inputs { q, k, v, g, beta, w: lam.weights.clone() }, lam))
}

/// The level states and positions of a run of `t` tokens from `s0` (`None`: zero, position 0),
/// for inputs of sizes `[B, T, H, Dk, Dv, L]`. Only the positions are read back (and checked);
/// the slots stay on the device.
fn initial<F: GpuReal>(
    s0: Option<&DeviceTensors>,
    [b, t, h, dk, dv, nl]: [usize; 6],
) -> Result<(DeviceTensor<F>, Vec<usize>)> {
    let shape = [b, h, nl, dv, dk];
    let Some(s) = s0 else { return Ok((DeviceTensor::<F>::zeros(&shape)?, vec![0; b])) };
    let slots = input::<F>(s, STATE)?.into_owned();
    if slots.shape() != shape {
        return Err(Error::shape(
            format!("state.{STATE}"),
            format!("[B, H, L, Dv, Dk] = {shape:?} (L the level axis of lambda)"),
            format!("{:?}", slots.shape()),
        ));
    }
    let pos = input::<F>(s, POSITION)?.to_host()?;
    Ok((slots, level_positions(&pos, nl, &vec![t; b])?))
}

/// The mixers a segment runs: the lift with the identity scheme (on mapped weights) and the base.
struct Mixers {
    lift: LogLinear,
    base: LogLinear,
}

impl Mixers {
    fn of(ll: &LogLinear) -> Result<Self> {
        let lift = ll.lift.ok_or_else(|| err(FAMILY, "internal: a level state without a lift"))?;
        let id = Lift { mask: lift.mask, lambda: LambdaScheme::identity() };
        Ok(Mixers {
            lift: LogLinear { lift: Some(id), ..ll.clone() },
            base: LogLinear { name: ll.base.name().into(), lift: None, ..ll.clone() },
        })
    }
}

/// A function of `kernels/loglinear_lift_state.cu` for `F`.
fn function<F: GpuReal>(name: &str) -> Result<cudarc::driver::CudaFunction> {
    gpu()?.kernel(FAMILY, &kernels::LOGLINEAR_LIFT_STATE, &[], &format!("{name}_{}", F::SUFFIX))
}

/// What a segment's kernels are told: the run's sizes and the segment.
struct Args {
    nb: i32,
    tn: i64,
    r0: i64,
    n: i32,
    h: i32,
    nl: i32,
    held: u64,
    own: u64,
    c: i64,
    e: i64,
}

impl Args {
    fn of([b, t, h, _, _, nl]: [usize; 6], a: usize, s: &Segment) -> Result<Self> {
        Ok(Args {
            nb: int(FAMILY, "B", b)?,
            tn: t as i64,
            r0: (s.c - a) as i64,
            n: int(FAMILY, "segment length", s.len())?,
            h: int(FAMILY, "H", h)?,
            nl: int(FAMILY, "L", nl)?,
            held: s.held,
            own: s.own,
            c: s.c as i64,
            e: s.e as i64,
        })
    }
}

/// How [`spread`] fills the rows (the `kind` of `lls_spread`).
#[derive(Clone, Copy)]
enum Spread {
    /// Every row a copy (`k`, `g`, `β`).
    Copy = 0,
    /// Held rows `λ_t^(i+1) · q`, own rows 0.
    Query = 1,
    /// Own rows the values of their slot's tokens, held rows 0.
    Value = 2,
    /// Held rows a copy, own rows 0 (`ȳ`).
    Held = 3,
}

/// The segment's rows `[B·R, n, H, w]` of the run's tensor `x [B, T, H, w]`.
fn spread<F: GpuReal>(
    x: &DeviceTensor<F>,
    w: &DeviceTensor<F>,
    a: &Args,
    rows: usize,
    kind: Spread,
) -> Result<DeviceTensor<F>> {
    let s = x.shape();
    let width = s.get(3).copied().unwrap_or(1);
    let shape = [s[0] * rows, a.n as usize, s[2], width];
    let total: usize = shape.iter().product();
    let mut out = pool::take::<F>(FAMILY, total)?;
    if total > 0 {
        let (wi, k) = (int(FAMILY, "row width", width)?, kind as i32);
        let (xv, wv) = (x.view(), w.view());
        launch!(gpu()?, FAMILY, function::<F>("lls_spread")?, grid1(total.min(1 << 20), 256);
            &xv, &wv, &mut *out, &a.nb, &a.tn, &a.r0, &a.n, &a.h, &wi, &a.nl, &a.held, &a.own, &a.c, &a.e, &k)?;
    }
    DeviceTensor::from_pooled(out, &shape)
}

/// How [`gather`] sums the rows (the `kind` of `lls_gather`).
#[derive(Clone, Copy)]
enum Gather {
    /// Every row.
    All = 0,
    /// Held rows weighted by `λ_t^(i+1)`.
    Query = 1,
    /// The own row of the token's slot.
    Value = 2,
}

/// `dst` rows `r0 … r0 + n − 1` (`[B, T, H, w]`) = `init [B, n, H, w]` + the rows' sum.
fn gather<F: GpuReal>(
    rows_in: &DeviceTensor<F>,
    init: &DeviceTensor<F>,
    w: &DeviceTensor<F>,
    dst: &mut Pooled<F>,
    a: &Args,
    kind: Gather,
) -> Result<()> {
    let s = init.shape();
    let width = s.get(3).copied().unwrap_or(1);
    let total: usize = init.len();
    if total > 0 {
        let (wi, k) = (int(FAMILY, "row width", width)?, kind as i32);
        let (rv, iv, wv) = (rows_in.view(), init.view(), w.view());
        launch!(gpu()?, FAMILY, function::<F>("lls_gather")?, grid1(total.min(1 << 20), 256);
            &rv, &iv, &wv, &mut **dst, &a.nb, &a.tn, &a.r0, &a.n, &a.h, &wi, &a.nl, &a.held, &a.own, &a.c, &a.e, &k)?;
    }
    Ok(())
}

/// A level-state kernel over `[B, H, ·, Dv·Dk]` (`lls_load`, `lls_merge`, their adjoints), writing
/// a new tensor of `shape`; `ub` is passed to the merges.
fn states<F: GpuReal>(
    name: &str,
    src: &DeviceTensor<F>,
    shape: &[usize],
    a: &Args,
    ws: usize,
    ub: Option<usize>,
) -> Result<DeviceTensor<F>> {
    let total: usize = shape.iter().product();
    let mut out = pool::take::<F>(FAMILY, total)?;
    if total > 0 {
        let (sv, wsi) = (src.view(), ws as i64);
        let f = function::<F>(name)?;
        let cfg = grid1(total.min(1 << 20), 256);
        match ub {
            Some(ub) => {
                let ub = int(FAMILY, "level", ub)?;
                launch!(gpu()?, FAMILY, f, cfg; &sv, &mut *out, &a.nb, &a.h, &a.nl, &wsi, &a.held, &a.own, &ub)?
            }
            None => {
                launch!(gpu()?, FAMILY, f, cfg; &sv, &mut *out, &a.nb, &a.h, &a.nl, &wsi, &a.held, &a.own)?
            }
        }
    }
    DeviceTensor::from_pooled(out, shape)
}

/// The segment's rows of the base run: `x` (`q`, `k`, `v`, `g`, `beta` as [`Spread`] says) and the
/// initial states (`lls_load` of the level states at `c`).
fn base_rows<F: GpuReal>(
    inp: &Inputs<F>,
    slots: &DeviceTensor<F>,
    a: &Args,
    seg: &Segment,
) -> Result<(DeviceTensors, DeviceTensor<F>)> {
    let [b, _, h, dk, dv, _] = inp.dims();
    let rows = seg.rows();
    let mut x = DeviceTensors::new();
    x.insert("q".into(), F::wrap(spread(&inp.q, &inp.w, a, rows, Spread::Query)?));
    x.insert("k".into(), F::wrap(spread(&inp.k, &inp.w, a, rows, Spread::Copy)?));
    x.insert("v".into(), F::wrap(spread(&inp.v, &inp.w, a, rows, Spread::Value)?));
    for (name, t) in [("g", &inp.g), ("beta", &inp.beta)] {
        if let Some(t) = t {
            let r = spread(t, &inp.w, a, rows, Spread::Copy)?;
            x.insert(name.into(), F::wrap(r.reshape(&[b * rows, seg.len(), h])?));
        }
    }
    let s0 = states::<F>("lls_load", slots, &[b * rows, h, dv, dk], a, dv * dk, None)?;
    Ok((x, s0))
}

/// The segment's own tokens for the lift's run from zero (λ the mapped weights).
fn lift_rows<F: GpuReal>(inp: &Inputs<F>, seg: &Segment, r0: usize) -> Result<DeviceTensors> {
    let n = seg.len();
    let mut x = DeviceTensors::new();
    for (name, t) in [
        ("q", Some(&inp.q)),
        ("k", Some(&inp.k)),
        ("v", Some(&inp.v)),
        ("g", inp.g.as_ref()),
        ("beta", inp.beta.as_ref()),
        ("lambda", Some(&inp.w)),
    ] {
        if let Some(t) = t {
            x.insert(name.into(), F::wrap(gathered(t, &vec![r0; t.shape()[0]], n)?));
        }
    }
    Ok(x)
}

/// The base run's final states merged into the level states at the segment's end.
fn merged<F: GpuReal>(
    fin: &DeviceTensor<F>,
    inp: &Inputs<F>,
    a: &Args,
    seg: &Segment,
) -> Result<DeviceTensor<F>> {
    let [b, _, h, dk, dv, nl] = inp.dims();
    states::<F>("lls_merge", fin, &[b, h, nl, dv, dk], a, dv * dk, Some(seg.ub()))
}

/// `y` (as `F`, `[B, T, H, Dv]`) and the level states after the run, for batch rows that all start
/// at position `a` with the level states `slots`.
fn forward_rows<F: GpuReal>(
    m: &Mixers,
    inp: &Inputs<F>,
    mut slots: DeviceTensor<F>,
    a: usize,
    p: Precision,
) -> Result<(DeviceTensor<F>, DeviceTensor<F>)> {
    let dims @ [b, t, h, _, dv, _] = inp.dims();
    let mut y = pool::take::<F>(FAMILY, b * t * h * dv)?;
    for seg in segments(a, t) {
        let args = Args::of(dims, a, &seg)?;
        let n = seg.len();
        let (own, _) = fast::run_from::<F>(&m.lift, &lift_rows(inp, &seg, seg.c - a)?, p, None, false)?;
        let own = cotangent::<F>(&own, &[b, n, h, dv])?;
        let (x, s0) = base_rows(inp, &slots, &args, &seg)?;
        let (yr, fin) = fast::run_from::<F>(&m.base, &x, p, Some(&s0), true)?;
        let yr = cotangent::<F>(&yr, &[b * seg.rows(), n, h, dv])?;
        gather(&yr, &own, &inp.w, &mut y, &args, Gather::All)?;
        let fin = fin.ok_or_else(|| err(FAMILY, "internal: no final state"))?;
        slots = merged(&fin, inp, &args, &seg)?;
    }
    Ok((DeviceTensor::from_pooled(y, &[b, t, h, dv])?, slots))
}

/// Batch rows grouped by position: one group when all are equal, else one row each.
fn groups(pos: &[usize]) -> Vec<(std::ops::Range<usize>, usize)> {
    match pos.first() {
        Some(&a) if pos.iter().all(|&p| p == a) => vec![(0..pos.len(), a)],
        None => vec![(0..0, 0)],
        _ => pos.iter().enumerate().map(|(b, &a)| (b..b + 1, a)).collect(),
    }
}

/// The tensors of `parts` (`[B_i, …]`) joined along axis 0.
fn stacked<F: GpuReal>(parts: Vec<DeviceTensor<F>>) -> Result<DeviceTensor<F>> {
    if parts.len() == 1 {
        return parts.into_iter().next().ok_or_else(|| err(FAMILY, "internal: nothing to stack"));
    }
    let mut shape = parts.first().map(|p| p.shape().to_vec()).unwrap_or_default();
    shape[0] = parts.iter().map(|p| p.shape()[0]).sum();
    let total: usize = shape.iter().product();
    let mut out = pool::take::<F>(FAMILY, total)?;
    let mut at = 0;
    for p in &parts {
        copy_as(&p.view(), &mut out.slice_mut(at..at + p.len()))?;
        at += p.len();
    }
    DeviceTensor::from_pooled(out, &shape)
}

/// `y` and the final state (`S`, `position`) of a lift's `fast` form from the state `s0` (`None`:
/// zero at position 0) on device tensors in mode `p` (module documentation).
pub fn run_from<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    p: Precision,
    s0: Option<&DeviceTensors>,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    let m = Mixers::of(ll)?;
    let (inp, lam) = inputs::<F>(ll, x)?;
    let dims = inp.dims();
    let (slots, pos) = initial::<F>(s0, dims)?;
    let (mut ys, mut fins) = (Vec::new(), Vec::new());
    for (r, a) in groups(&pos) {
        let (y, fin) = forward_rows(&m, &inp.rows(r.clone())?, slots.batch(r)?, a, p)?;
        ys.push(y);
        fins.push(fin);
    }
    let y = finish(stacked(ys)?.with_checks(lam.weights.checks().to_vec()), p)?;
    let ends: Vec<usize> = pos.iter().map(|a| a + dims[1]).collect();
    let fin =
        [(STATE.to_string(), F::wrap(stacked(fins)?)), (POSITION.to_string(), F::wrap(counts::<F>(&ends)?))];
    Ok((y, fin.into_iter().collect()))
}

/// The gradients of one group of batch rows (all at position `a`): of `q`, `k`, `v`, `g`, `beta`,
/// the mapped λ weights (in [`Inputs`]' fields) and the initial level states.
fn backward_rows<F: GpuReal>(
    m: &Mixers,
    inp: &Inputs<F>,
    slots: DeviceTensor<F>,
    a: usize,
    dy: &DeviceTensor<F>,
    d_final: DeviceTensor<F>,
) -> Result<(Inputs<F>, DeviceTensor<F>)> {
    let dims @ [b, t, h, dk, dv, nl] = inp.dims();
    let segs = segments(a, t);
    // The level states at every segment's start: the base rows alone, forward.
    let mut starts = Vec::with_capacity(segs.len());
    let mut s = slots;
    for seg in &segs {
        let args = Args::of(dims, a, seg)?;
        let (x, s0) = base_rows(inp, &s, &args, seg)?;
        let (_, fin) = fast::run_from::<F>(&m.base, &x, Precision::Exact, Some(&s0), true)?;
        let fin = fin.ok_or_else(|| err(FAMILY, "internal: no final state"))?;
        let next = merged(&fin, inp, &args, seg)?;
        starts.push(std::mem::replace(&mut s, next));
    }
    let take = |w: usize| pool::take::<F>(FAMILY, b * t * h * w);
    let (mut dq, mut dk_, mut dv_, mut dw) = (take(dk)?, take(dk)?, take(dv)?, take(nl)?);
    let mut dg = inp.g.as_ref().map(|_| take(1)).transpose()?;
    let mut dbeta = inp.beta.as_ref().map(|_| take(1)).transpose()?;
    let mut ds = d_final;
    for (seg, start) in segs.iter().zip(starts).rev() {
        let args = Args::of(dims, a, seg)?;
        let (n, r0) = (seg.len(), seg.c - a);
        let rows = seg.rows();
        // The lift on the segment's own tokens, from zero.
        let dy_seg = F::wrap(gathered(dy, &vec![r0; dy.shape()[0]], n)?);
        let gl = backward::run::<F>(
            &m.lift,
            &lift_rows(inp, seg, r0)?,
            &dy_seg,
            &Requires::All,
            Precision::Exact,
        )?;
        let got = |g: &DeviceTensors, name: &str| -> Result<DeviceTensor<F>> {
            Ok(input::<F>(g, &grad_name(name))?.into_owned())
        };
        // The base rows, from the level states at c, with the merge's adjoint as their final
        // states' cotangents.
        let (x, s0) = base_rows(inp, &start, &args, seg)?;
        let dfin =
            states::<F>("lls_merge_adjoint", &ds, &[b * rows, h, dv, dk], &args, dv * dk, Some(seg.ub()))?;
        let dyr = F::wrap(spread(dy, &inp.w, &args, rows, Spread::Held)?);
        let (gr, ds0) = backward::run_from::<F>(
            &m.base,
            &x,
            Some(&s0),
            &dyr,
            Some(&dfin),
            &Requires::All,
            Precision::Exact,
        )?;
        let ds0 = ds0.ok_or_else(|| err(FAMILY, "internal: no initial state's gradient"))?;
        gather(&got(&gr, "q")?, &got(&gl, "q")?, &inp.w, &mut dq, &args, Gather::Query)?;
        gather(&got(&gr, "k")?, &got(&gl, "k")?, &inp.w, &mut dk_, &args, Gather::All)?;
        gather(&got(&gr, "v")?, &got(&gl, "v")?, &inp.w, &mut dv_, &args, Gather::Value)?;
        for (name, d) in [("g", &mut dg), ("beta", &mut dbeta)] {
            if let Some(d) = d {
                let r = got(&gr, name)?;
                let r = r.reshape(&[b * rows, n, h, 1])?;
                gather(&r, &got(&gl, name)?.reshape(&[b, n, h, 1])?, &inp.w, d, &args, Gather::All)?;
            }
        }
        // λ̄: the lift's on the segment's rows, then the held reads' q · q̄_row added.
        let dl = got(&gl, "lambda")?;
        let g = gpu()?;
        let run = n * h * nl;
        copy_rows(&dl.view(), run, &mut dw.slice_mut(r0 * h * nl..), t * h * nl, run, b)?;
        let nheld = seg.held.count_ones() as usize;
        if nheld * n * b * h > 0 {
            let dqr = got(&gr, "q")?;
            let (qv, gv, dki) = (inp.q.view(), dqr.view(), int(FAMILY, "Dk", dk)?);
            launch!(g, FAMILY, function::<F>("lls_dlambda")?, grid1((b * n * h * nheld).min(1 << 20), 256);
                &qv, &gv, &mut *dw, &args.nb, &args.tn, &args.r0, &args.n, &args.h, &dki, &args.nl, &args.held, &args.own)?;
        }
        ds = states::<F>("lls_load_adjoint", &ds0, &[b, h, nl, dv, dk], &args, dv * dk, None)?;
    }
    let put = |buf: Pooled<F>, w: usize| DeviceTensor::from_pooled(buf, &[b, t, h, w]);
    let grads = Inputs {
        q: put(dq, dk)?,
        k: put(dk_, dk)?,
        v: put(dv_, dv)?,
        g: dg.map(|d| DeviceTensor::from_pooled(d, &[b, t, h])).transpose()?,
        beta: dbeta.map(|d| DeviceTensor::from_pooled(d, &[b, t, h])).transpose()?,
        w: put(dw, nl)?,
    };
    Ok((grads, ds))
}

/// The backward of [`run_from`]: `d_<input>` for every input `req` asks for and the initial state's
/// gradient (`S`, zero in the slots that are empty at the position, and `position`'s, zero), from
/// `dy` and the final state's cotangent `d_final` (`None`: zero). In the exact mode whatever `p`
/// asks (the base mixers' backward from a state runs in it).
pub fn backward_from<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    s0: Option<&DeviceTensors>,
    dy: &AnyDeviceTensor,
    d_final: Option<&DeviceTensors>,
    req: &Requires,
) -> Result<(DeviceTensors, DeviceTensors)> {
    let m = Mixers::of(ll)?;
    let (inp, lam) = inputs::<F>(ll, x)?;
    let dims @ [b, t, h, dk, dv, nl] = inp.dims();
    let (slots, pos) = initial::<F>(s0, dims)?;
    let dy = cotangent::<F>(dy, &[b, t, h, dv])?;
    let df = match d_final {
        Some(d) => {
            let s = input::<F>(d, STATE)?.into_owned();
            if s.shape() != [b, h, nl, dv, dk] {
                return Err(Error::shape(
                    format!("d_final.{STATE}"),
                    format!("{:?} (the final state's shape)", [b, h, nl, dv, dk]),
                    format!("{:?}", s.shape()),
                ));
            }
            s
        }
        None => DeviceTensor::<F>::zeros(&[b, h, nl, dv, dk])?,
    };
    let mut parts = Vec::new();
    for (r, a) in groups(&pos) {
        let rows = inp.rows(r.clone())?;
        parts.push(backward_rows(
            &m,
            &rows,
            slots.batch(r.clone())?,
            a,
            &dy.batch(r.clone())?,
            df.batch(r)?,
        )?);
    }
    let joined = |f: &dyn Fn(&Inputs<F>) -> Option<DeviceTensor<F>>| -> Result<Option<DeviceTensor<F>>> {
        let v: Option<Vec<_>> = parts.iter().map(|(g, _)| f(g)).collect();
        v.map(stacked).transpose()
    };
    let mut out = DeviceTensors::new();
    let one = |name: &str, t: Option<DeviceTensor<F>>, out: &mut DeviceTensors| {
        if let Some(t) = t.filter(|_| req.wants(name)) {
            out.insert(grad_name(name), F::wrap(t));
        }
    };
    one("q", joined(&|g| Some(g.q.clone()))?, &mut out);
    one("k", joined(&|g| Some(g.k.clone()))?, &mut out);
    one("v", joined(&|g| Some(g.v.clone()))?, &mut out);
    one("g", joined(&|g| g.g.clone())?, &mut out);
    one("beta", joined(&|g| g.beta.clone())?, &mut out);
    if req.wants("lambda") || (lam.param.is_some() && req.wants("lambda_param")) {
        let dw = joined(&|g| Some(g.w.clone()))?.ok_or_else(|| err(FAMILY, "internal: no λ gradient"))?;
        let (draw, dparam) = lambda_backward(ll, &lam, dw)?;
        one("lambda", Some(draw), &mut out);
        if lam.param.is_some() {
            let dparam = match dparam {
                Some(d) => d,
                None => DeviceTensor::<F>::zeros(&[h, nl])?,
            };
            one("lambda_param", Some(dparam), &mut out);
        }
    }
    let ds = stacked(parts.into_iter().map(|(_, s)| s).collect())?;
    let ds =
        [(STATE.to_string(), F::wrap(ds)), (POSITION.to_string(), F::wrap(DeviceTensor::<F>::zeros(&[b])?))];
    Ok((out, ds.into_iter().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mixer_core::fenwick::bucket;

    /// The segments tile the run; each starts at a multiple of a power of two no smaller than its
    /// length (so its tokens' levels are their offsets'); `held` is the position's bits; `own` is
    /// exactly the slots its tokens fill at its end, each slot a Fenwick bucket of the end.
    #[test]
    fn segments_tile_the_run_with_aligned_starts_and_the_end_buckets() {
        for a in [0usize, 1, 2, 3, 5, 6, 7, 8, 13, 64, 100, 1000, 4095, 4096, 6144, (1 << 20) - 1] {
            for t in [1usize, 2, 3, 7, 64, 65, 1000, 5000] {
                let segs = segments(a, t);
                assert!(segs.len() <= 2 * bitlen(t) + 1, "a = {a}, T = {t}: {} segments", segs.len());
                let mut c = a;
                for s in &segs {
                    assert_eq!(s.c, c, "a = {a}, T = {t}: the segments are contiguous");
                    assert!(s.e > s.c);
                    assert!(s.c == 0 || s.len() <= 1 << s.c.trailing_zeros(), "{s:?}: not aligned");
                    assert_eq!(s.held, s.c as u64);
                    let mut want = 0u64;
                    for tok in s.c..s.e {
                        let d = bitlen(s.e ^ tok) - 1;
                        want |= 1 << d;
                        assert!(bucket(s.e, d + 1).is_some_and(|r| r.contains(&tok)), "{s:?}: token {tok}");
                    }
                    assert_eq!(s.own, want, "{s:?}: the slots its tokens fill");
                    // Only a segment of fewer than 2·PEEL tokens fills several slots.
                    assert!(s.own.count_ones() == 1 || s.len() < 2 * PEEL, "{s:?}: several large buckets");
                    c = s.e;
                }
                assert_eq!(c, a + t);
            }
        }
    }

    /// Grouping: one group when every row starts at one position, else a row each.
    #[test]
    fn rows_at_one_position_run_together() {
        assert_eq!(groups(&[5, 5, 5]), vec![(0..3, 5)]);
        assert_eq!(groups(&[5, 6]), vec![(0..1, 5), (1..2, 6)]);
        assert_eq!(groups(&[]), vec![(0..0, 0)]);
    }
}
