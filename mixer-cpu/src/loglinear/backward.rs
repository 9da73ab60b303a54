//! The log-linear family's fast backward on CPU (Fenwick mask): the registered entry point.
//! It splits the inputs per (sequence, head) (batch rows, or the sequences of a packed batch:
//! [`common::Layout`]), runs reverse mode through the chunked form on each
//! (`backward_chunked`: `O(T)` for the base mixers, `O(T log T)` for the lifts, no
//! `T×T` matrix), and maps the λ weights' gradient back through the λ scheme.

use std::ops::Range;

use crate::vmath::VecMath;
use faer::Mat;
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::parallel::min_len;
use mixer_core::tensor::get;
use mixer_core::{Error, Requires, Result, Tensors, grad_name};
use ndarray::{Array4, ArrayD, Axis, IxDyn, Slice};
use rayon::prelude::*;

use mixer_core::mixers::loglinear::lift_state::{POSITION, project, store_slots};
use mixer_core::mixers::loglinear::state::STATE;

use super::backward_chunked::{HeadGrads, head_vjp_from};
use super::common::{Head, Layout};
use super::{common, lift_state};

/// The `fast` backward (see the module documentation).
pub fn vjp<F: VecMath>(
    ll: &LogLinear,
    inputs: &Tensors<F>,
    dy: &ArrayD<F>,
    req: &Requires,
) -> Result<Tensors<F>> {
    vjp_from(ll, inputs, None, dy, None, req).map(|(g, _)| g)
}

/// The `fast` backward of a run from the initial state `initial` (`None`: zero; docs/math.md
/// §7.1) with `d_final` the final state's cotangent (`None`: zero): the gradients of the inputs
/// and of the initial state (empty without one). Base mixers: `S [B, H, Dv, Dk]`, the chunked
/// reverse sweep from `H̄_T`; lifts: `S [B, H, L, Dv, Dk]` and a zero `position` gradient, by
/// [`lift_state::head_vjp`].
pub fn vjp_from<F: VecMath>(
    ll: &LogLinear,
    inputs: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
    _req: &Requires,
) -> Result<(Tensors<F>, Tensors<F>)> {
    run(ll, inputs, None, initial, dy, d_final)
}

/// The backward of [`super::fast::fast_packed`] (`B = 1`, sequence `i` at the rows `ranges[i]`,
/// checked), natively: one job list over (sequence, head), each job the backward of the
/// sequence's rows alone. With `initial` or `d_final` (one row per sequence) every sequence
/// runs the backward from its state, and the initial states' gradient comes back one row per
/// sequence (empty without `initial`). The gradients of per-token inputs are zero past the last
/// range; that of `lambda_param` is summed over the sequences in order, each sequence's own sum
/// first, as the sequences' backward one by one would sum it.
#[allow(clippy::too_many_arguments)]
pub fn vjp_packed<F: VecMath>(
    ll: &LogLinear,
    inputs: &Tensors<F>,
    ranges: &[Range<usize>],
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
    _req: &Requires,
) -> Result<(Tensors<F>, Tensors<F>)> {
    run(ll, inputs, Some(ranges), initial, dy, d_final)
}

/// [`vjp_from`] and [`vjp_packed`]: the sequences are the batch rows, or the `packed` ranges.
fn run<F: VecMath>(
    ll: &LogLinear,
    inputs: &Tensors<F>,
    packed: Option<&[Range<usize>]>,
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let lifted = ll.lift.is_some();
    let s0 = if lifted { None } else { common::state_tensor(ll, initial)? };
    let d_last = if lifted { None } else { common::state_tensor(ll, d_final)? };
    if !ll.has_fenwick_structure() {
        return Err(Error::config(&ll.name, "the fast backward needs the Fenwick level mask"));
    }
    let x = common::standard(inputs);
    let raw = ll.lift.map(|_| get(&x, "lambda")).transpose()?;
    let param = x.get("lambda_param");
    let lam = raw.map(|r| ll.lambda_weights(r, param)).transpose()?;
    let (sz, layout, heads) = common::heads(ll, &x, lam.as_ref(), packed)?;
    if dy.shape() != [sz.b, sz.t, sz.h, sz.dv] {
        return Err(Error::shape(
            "dy",
            format!("[{}, {}, {}, {}]", sz.b, sz.t, sz.h, sz.dv),
            mixer_core::error::fmt_shape(dy.shape()),
        ));
    }
    // dy of one (sequence, head), `|r|×Dv`.
    let dy_of = |hd: &Head<'_, F>| {
        let (b, r) = layout.seq(hd.b);
        Mat::<F>::from_fn(r.len(), sz.dv, |t, d| dy[[b, r.start + t, hd.h, d]])
    };
    let nl = lam.as_ref().map_or(0, |l| l.shape()[3]);
    let ns = layout.len();
    let mut d_state = Tensors::new();
    let per_head: Vec<HeadGrads<F>> = if lifted {
        let (pos, s0) = lift_state::initial(initial, &layout)?;
        let df = d_final.map(|d| get(d, STATE)).transpose()?;
        if let Some(d) = df
            && d.shape() != [ns, sz.h, nl, sz.dv, sz.dk]
        {
            return Err(Error::shape(
                "d_final_state.S",
                format!("[{ns}, {}, {nl}, {}, {}]", sz.h, sz.dv, sz.dk),
                mixer_core::error::fmt_shape(d.shape()),
            ));
        }
        // With an initial state, each job writes its initial levels' adjoint straight into its
        // block of the state's gradient (level 0 has no slot: the state has it empty).
        let mut ds = ArrayD::<F>::zeros(IxDyn(&[if s0.is_some() { ns } else { 0 }, sz.h, nl, sz.dv, sz.dk]));
        let blocks: Vec<Option<&mut [F]>> = match s0 {
            Some(_) => common::head_blocks(&mut ds, &heads, sz.h)?.into_iter().map(Some).collect(),
            None => heads.iter().map(|_| None).collect(),
        };
        let per_head: Vec<HeadGrads<F>> = heads
            .par_iter()
            .with_min_len(min_len())
            .zip(blocks)
            .map(|(hd, dst)| {
                let levels = lift_state::levels_of(s0, hd.b, hd.h, nl, sz.dk, sz.dv);
                let d_levels = lift_state::levels_of(df, hd.b, hd.h, nl, sz.dk, sz.dv);
                let (g, mut d0) =
                    lift_state::head_vjp(ll, hd, pos[hd.b], levels, dy_of(hd).as_ref(), d_levels)?;
                if let Some(dst) = dst {
                    d0[0].iter_mut().for_each(|x| *x = F::zero());
                    d0.truncate(nl + 1);
                    store_slots(dst, &d0)?;
                }
                Ok(g)
            })
            .collect::<Result<_>>()?;
        if s0.is_some() {
            project(&mut ds, &pos);
            d_state.insert(STATE.to_string(), ds);
            d_state.insert(POSITION.to_string(), ArrayD::zeros(IxDyn(&[ns])));
        }
        per_head
    } else {
        let per_head: Vec<(HeadGrads<F>, Mat<F>)> = heads
            .par_iter()
            .with_min_len(min_len())
            .map(|hd| {
                let h0 = s0.map(|s| common::state_head(s, hd.b, hd.h));
                let dl = d_last.map(|s| common::state_head(s, hd.b, hd.h));
                head_vjp_from(ll, hd, dy_of(hd).as_ref(), h0, dl)
            })
            .collect::<Result<_>>()?;
        if s0.is_some() {
            let mut ds = ArrayD::<F>::zeros(IxDyn(&[ns, sz.h, sz.dv, sz.dk]));
            for (hd, (_, d0)) in heads.iter().zip(&per_head) {
                common::put_state(&mut ds, hd.b, hd.h, d0.as_ref());
            }
            d_state.insert(STATE.to_string(), ds);
        }
        per_head.into_iter().map(|(g, _)| g).collect()
    };
    let mut dq = Array4::<F>::zeros((sz.b, sz.t, sz.h, sz.dk));
    let mut dk = Array4::<F>::zeros((sz.b, sz.t, sz.h, sz.dk));
    let mut dv = Array4::<F>::zeros((sz.b, sz.t, sz.h, sz.dv));
    let mut dg = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.t, sz.h]));
    let mut dbeta = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.t, sz.h]));
    let mut dlam = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.t, sz.h, nl]));
    for (hd, g) in heads.iter().zip(&per_head) {
        let (b, r) = layout.seq(hd.b);
        for (i, t) in r.enumerate() {
            dg[[b, t, hd.h]] = F::of(g.dg[i]);
            if let Some(&x) = g.dbeta.get(i) {
                dbeta[[b, t, hd.h]] = x;
            }
            for d in 0..sz.dk {
                dq[[b, t, hd.h, d]] = g.dq[(i, d)];
                dk[[b, t, hd.h, d]] = g.dk[(i, d)];
            }
            for d in 0..sz.dv {
                dv[[b, t, hd.h, d]] = g.dv[(i, d)];
            }
            for l in 0..nl {
                dlam[[b, t, hd.h, l]] = g.dlam[(i, l)];
            }
        }
    }
    let mut out = Tensors::new();
    out.insert(grad_name("q"), dq.into_dyn());
    out.insert(grad_name("k"), dk.into_dyn());
    out.insert(grad_name("v"), dv.into_dyn());
    if ll.base.has_decay() {
        out.insert(grad_name("g"), dg);
    }
    if ll.base.has_beta() {
        out.insert(grad_name("beta"), dbeta);
    }
    if let Some(raw) = raw {
        let (d_raw, d_param) = match packed {
            None => ll.lambda_vjp(raw, param, &dlam)?,
            Some(_) => lambda_vjp_packed(ll, raw, param, &dlam, &layout)?,
        };
        out.insert(grad_name("lambda"), d_raw);
        if let Some(dp) = d_param {
            out.insert(grad_name("lambda_param"), dp);
        }
    }
    Ok((out, d_state))
}

/// The λ scheme's backward ([`LogLinear::lambda_vjp`]) sequence by sequence: `d_lambda` at each
/// sequence's rows (zero past the last), `d_lambda_param` the sum over the non-empty sequences,
/// in order, of each sequence's own sum.
fn lambda_vjp_packed<F: VecMath>(
    ll: &LogLinear,
    raw: &ArrayD<F>,
    param: Option<&ArrayD<F>>,
    dlam: &ArrayD<F>,
    layout: &Layout,
) -> Result<(ArrayD<F>, Option<ArrayD<F>>)> {
    let mut d_raw = ArrayD::<F>::zeros(raw.raw_dim());
    let mut d_param = param.map(|p| ArrayD::<F>::zeros(p.raw_dim()));
    for i in 0..layout.len() {
        let (_, r) = layout.seq(i);
        if r.is_empty() {
            continue;
        }
        let rows = |a: &ArrayD<F>| a.slice_axis(Axis(1), Slice::from(r.clone())).to_owned();
        let (dr, dp) = ll.lambda_vjp(&rows(raw), param, &rows(dlam))?;
        d_raw.slice_axis_mut(Axis(1), Slice::from(r.clone())).assign(&dr);
        if let (Some(acc), Some(dp)) = (d_param.as_mut(), dp) {
            *acc += &dp;
        }
    }
    Ok((d_raw, d_param))
}
