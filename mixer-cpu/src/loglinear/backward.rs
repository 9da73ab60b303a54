//! The log-linear family's fast backward on CPU (Fenwick mask): the registered entry point.
//! It splits the inputs per (batch, head), runs reverse mode through the chunked form on each
//! (`backward_chunked`: `O(T)` for the base mixers, `O(T log T)` for the lifts, no
//! `T×T` matrix), and maps the λ weights' gradient back through the λ scheme.

use crate::vmath::VecMath;
use faer::Mat;
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::tensor::get;
use mixer_core::{Error, Requires, Result, Tensors, grad_name};
use ndarray::{Array4, ArrayD, IxDyn};
use rayon::prelude::*;

use mixer_core::mixers::loglinear_lift_state::{Levels, POSITION, project, store};
use mixer_core::mixers::loglinear_state::STATE;

use super::backward_chunked::{HeadGrads, head_vjp_from};
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
    let (sz, heads) = common::heads(ll, &x, lam.as_ref())?;
    if dy.shape() != [sz.b, sz.t, sz.h, sz.dv] {
        return Err(Error::shape(
            "dy",
            format!("[{}, {}, {}, {}]", sz.b, sz.t, sz.h, sz.dv),
            mixer_core::error::fmt_shape(dy.shape()),
        ));
    }
    let nl = lam.as_ref().map_or(0, |l| l.shape()[3]);
    let mut d_state = Tensors::new();
    let per_head: Vec<HeadGrads<F>> = if lifted {
        let (pos, s0) = lift_state::initial(initial, sz.b, sz.t)?;
        let df = d_final.map(|d| get(d, STATE)).transpose()?;
        if let Some(d) = df
            && d.shape() != [sz.b, sz.h, nl, sz.dv, sz.dk]
        {
            return Err(Error::shape(
                "d_final_state.S",
                format!("[{}, {}, {nl}, {}, {}]", sz.b, sz.h, sz.dv, sz.dk),
                mixer_core::error::fmt_shape(d.shape()),
            ));
        }
        let per_head: Vec<(HeadGrads<F>, Levels<F>)> = heads
            .par_iter()
            .map(|hd| {
                let gy = Mat::<F>::from_fn(sz.t, sz.dv, |t, d| dy[[hd.b, t, hd.h, d]]);
                let levels = lift_state::levels_of(s0, hd.b, hd.h, nl, sz.dk, sz.dv);
                let d_levels = lift_state::levels_of(df, hd.b, hd.h, nl, sz.dk, sz.dv);
                lift_state::head_vjp(ll, hd, pos[hd.b], levels, gy.as_ref(), d_levels)
            })
            .collect::<Result<_>>()?;
        if s0.is_some() {
            let mut ds = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.h, nl, sz.dv, sz.dk]));
            for (hd, (_, d0)) in heads.iter().zip(&per_head) {
                let mut d0 = d0.clone();
                // Level 0 has no slot: the state has it empty.
                d0[0].iter_mut().for_each(|x| *x = F::zero());
                d0.truncate(nl + 1);
                store(&mut ds, hd.b, hd.h, &d0)?;
            }
            project(&mut ds, &pos);
            d_state.insert(STATE.to_string(), ds);
            d_state.insert(POSITION.to_string(), ArrayD::zeros(IxDyn(&[sz.b])));
        }
        per_head.into_iter().map(|(g, _)| g).collect()
    } else {
        let per_head: Vec<(HeadGrads<F>, Mat<F>)> = heads
            .par_iter()
            .map(|hd| {
                let gy = Mat::<F>::from_fn(sz.t, sz.dv, |t, d| dy[[hd.b, t, hd.h, d]]);
                let h0 = s0.map(|s| common::state_head(s, hd.b, hd.h));
                let dl = d_last.map(|s| common::state_head(s, hd.b, hd.h));
                head_vjp_from(ll, hd, gy.as_ref(), h0, dl)
            })
            .collect::<Result<_>>()?;
        if s0.is_some() {
            let mut ds = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.h, sz.dv, sz.dk]));
            for (hd, (_, d0)) in heads.iter().zip(&per_head) {
                common::put_state(&mut ds, hd.b, hd.h, d0.as_ref());
            }
            d_state.insert(STATE.to_string(), ds);
        }
        per_head.into_iter().map(|(g, _)| g).collect()
    };
    let grads: Vec<&HeadGrads<F>> = per_head.iter().collect();
    let mut dq = Array4::<F>::zeros((sz.b, sz.t, sz.h, sz.dk));
    let mut dk = Array4::<F>::zeros((sz.b, sz.t, sz.h, sz.dk));
    let mut dv = Array4::<F>::zeros((sz.b, sz.t, sz.h, sz.dv));
    let mut dg = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.t, sz.h]));
    let mut dbeta = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.t, sz.h]));
    let mut dlam = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.t, sz.h, nl]));
    for (hd, g) in heads.iter().zip(grads) {
        for t in 0..sz.t {
            dg[[hd.b, t, hd.h]] = F::of(g.dg[t]);
            if let Some(&x) = g.dbeta.get(t) {
                dbeta[[hd.b, t, hd.h]] = x;
            }
            for d in 0..sz.dk {
                dq[[hd.b, t, hd.h, d]] = g.dq[(t, d)];
                dk[[hd.b, t, hd.h, d]] = g.dk[(t, d)];
            }
            for d in 0..sz.dv {
                dv[[hd.b, t, hd.h, d]] = g.dv[(t, d)];
            }
            for l in 0..nl {
                dlam[[hd.b, t, hd.h, l]] = g.dlam[(t, l)];
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
        let (d_raw, d_param) = ll.lambda_vjp(raw, param, &dlam)?;
        out.insert(grad_name("lambda"), d_raw);
        if let Some(dp) = d_param {
            out.insert(grad_name("lambda_param"), dp);
        }
    }
    Ok((out, d_state))
}
