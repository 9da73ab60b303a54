//! The backend suite's checks of runs from a state and of packed batches ([`crate::state`],
//! [`crate::packed`]); see [`crate::suite`].
//!
//! - `state` (per form that runs from a state, `f64` and `f32`): from a random valid initial
//!   state ([`Mixer::random_state`]), `y` and the final state against the mixer's `f64`
//!   reference ([`Mixer::state_oracle`]); splitting the sequence at several points (inside a
//!   chunk, on chunk boundaries, on Fenwick level boundaries for a state with a position) and
//!   running the second part from the first part's final state gives the whole run's `y` and
//!   final state; and, where the form has a backward from a state, its input and initial-state
//!   gradients against the reference backward.
//! - `packed` (per form, `f64`): a packed batch with empty sequences, a single token, and the
//!   last offset short of the buffer equals the sequences run one by one bit for bit, with
//!   zeros past the last offset, and each sequence agrees with the oracle; the same for the
//!   backward where the form has one (static inputs' gradients the sums of the sequences', in
//!   order), for the final states where the mixer has a state, and for the backward from states
//!   (each sequence's row of the initial states' gradient; an empty sequence passes its row of
//!   the final states' cotangent through).

use mixer_core::mixer::Mixer;
use mixer_core::state::{StateVjp, segment, segment_from_state, state_row};
use mixer_core::tensor::{cast_tensors, tensors_to_f64};
use mixer_core::{DType, Dims, Form, Precision, Requires, Tensors, Tolerance};
use ndarray::{ArrayD, Axis, Slice};

use crate::backend::Backend;
use crate::family::Scalar;
use crate::packed::{backward_packed, run_packed};
use crate::state::{backward_forms, backward_state, forms, run_state, shapes};

fn compare(tol: Tolerance, what: &str, got: &ArrayD<f64>, want: &ArrayD<f64>) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("{what}: shape {:?}, expected {:?}", got.shape(), want.shape()));
    }
    let c = tol.compare(got.view(), want.view());
    if c.pass { Ok(()) } else { Err(format!("{what}: {c:?}")) }
}

fn compare_all(tol: Tolerance, what: &str, got: &Tensors<f64>, want: &Tensors<f64>) -> Result<(), String> {
    if got.keys().ne(want.keys()) {
        return Err(format!("{what}: tensors {:?}, expected {:?}", got.keys(), want.keys()));
    }
    got.iter().try_for_each(|(k, g)| compare(tol, &format!("{what} `{k}`"), g, &want[k]))
}

/// [`compare_all`] for gradients ([`Tolerance::compare_grad`]: an exactly-zero reference is
/// compared absolutely).
fn compare_grads(tol: Tolerance, what: &str, got: &Tensors<f64>, want: &Tensors<f64>) -> Result<(), String> {
    if got.keys().ne(want.keys()) {
        return Err(format!("{what}: tensors {:?}, expected {:?}", got.keys(), want.keys()));
    }
    got.iter().try_for_each(|(k, g)| {
        let c = tol.compare_grad(g.view(), want[k].view());
        if c.pass { Ok(()) } else { Err(format!("{what} `{k}`: {c:?}")) }
    })
}

/// A random valid initial state of `m` at `dims` ([`Mixer::random_state`]).
fn random_state(m: &dyn Mixer, dims: &Dims, seed: u64) -> Result<Tensors<f64>, String> {
    m.random_state(dims, seed).map_err(|e| e.to_string())
}

fn run_in<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    x: &Tensors<f64>,
    s: Option<&Tensors<f64>>,
) -> Result<(ArrayD<f64>, Tensors<f64>), String> {
    let xs = cast_tensors::<F>(x);
    let ss = s.map(cast_tensors::<F>);
    let (y, f) =
        run_state(m, backend, form, &xs, ss.as_ref(), Precision::Exact).map_err(|e| e.to_string())?;
    Ok((y.mapv(|v| v.f64()), tensors_to_f64(&f)))
}

/// The split points of a sequence of `t_len` tokens checked by the `state` check: 1, 8, 16, 17,
/// `T/2`, `T − 1`, and, for a state that carries a position `a` (the lifts), the Fenwick level
/// boundaries `2^j − a` and `2^j − a + 1` (where the run's absolute position crosses a power of
/// two, so that a part starts on and just after the top level's merge).
fn splits(t_len: usize, position: Option<usize>) -> Vec<usize> {
    let mut v: Vec<usize> = vec![1, 8, 16, 17, t_len / 2, t_len.saturating_sub(1)];
    if let Some(a) = position {
        for j in 0..usize::BITS - 1 {
            let p = 1usize << j;
            if p > a + t_len {
                break;
            }
            if let Some(s) = p.checked_sub(a) {
                v.extend([s, s + 1]);
            }
        }
    }
    v.retain(|&a| a >= 1 && a < t_len);
    v.sort();
    v.dedup();
    v
}

/// The `state` check of one form in one dtype.
pub(crate) fn state_check(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &Tensors<f64>,
    dims: &Dims,
    dtype: DType,
    seed: u64,
) -> Result<(), String> {
    let s0 = random_state(m, dims, seed)?;
    let tol = Tolerance::for_dtype(dtype.name());
    let run = |x: &Tensors<f64>, s: Option<&Tensors<f64>>| match dtype {
        DType::F64 => run_in::<f64>(m, backend, form, x, s),
        DType::F32 => run_in::<f32>(m, backend, form, x, s),
    };
    let (want_y, want_f) = m.state_oracle(inputs, Some(&s0)).map_err(|e| format!("reference: {e}"))?;
    let (y, fin) = run(inputs, Some(&s0))?;
    compare(tol, "y from a state", &y, &want_y)?;
    compare_all(tol, "final state", &fin, &want_f)?;
    let t_len = inputs[m.spec().mixed].shape()[1];
    let position = s0.get("position").and_then(|p| p.first()).map(|&p| p as usize);
    for a in splits(t_len, position) {
        let (ya, sa) = run(&segment_from_state(m, inputs, 0..a).map_err(|e| e.to_string())?, Some(&s0))?;
        let (yb, sb) = run(&segment_from_state(m, inputs, a..t_len).map_err(|e| e.to_string())?, Some(&sa))?;
        let joined = ndarray::concatenate(Axis(1), &[ya.view(), yb.view()]).map_err(|e| e.to_string())?;
        compare(tol, &format!("y split at {a}"), &joined, &y)?;
        compare_all(tol, &format!("final state split at {a}"), &sb, &fin)?;
    }
    if form == Form::Materialized || !backward_forms(m, backend).contains(&form) {
        return Ok(());
    }
    let dy = want_y.mapv(|v| (3.1 * v + 0.3).sin());
    let df: Tensors<f64> = want_f.iter().map(|(k, v)| (k.clone(), v.mapv(|x| (1.7 * x).cos()))).collect();
    let (want_g, want_ds) = m
        .state_oracle_vjp(inputs, Some(&s0), &dy, Some(&df), &Requires::All)
        .map_err(|e| format!("reference backward: {e}"))?;
    let (g, ds) = match dtype {
        DType::F64 => backward_state(m, backend, form, inputs, Some(&s0), &dy, Some(&df), &Requires::All),
        DType::F32 => backward_state(
            m,
            backend,
            form,
            &cast_tensors::<f32>(inputs),
            Some(&cast_tensors::<f32>(&s0)),
            &dy.mapv(|x| x as f32),
            Some(&cast_tensors::<f32>(&df)),
            &Requires::All,
        )
        .map(|(g, s)| (tensors_to_f64(&g), tensors_to_f64(&s))),
    }
    .map_err(|e| format!("backward: {e}"))?;
    compare_grads(tol, "gradients from a state", &g, &want_g)?;
    compare_grads(tol, "initial state's gradient", &ds, &want_ds)
}

/// The lengths of the packed check's sequences for a buffer of `t_len` rows: an empty one
/// first, a single token, an empty one inside, the rest but two rows (the last offset short
/// of the buffer).
fn packed_offsets(t_len: usize) -> Vec<usize> {
    let body = t_len.saturating_sub(2);
    let one = body.min(1);
    let third = (body - one) / 3;
    vec![0, 0, one, one + third, one + third, body]
}

/// The `packed` check of one form (`f64`).
pub(crate) fn packed_check(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    dims: &Dims,
    seed: u64,
    with_backward: bool,
) -> Result<(), String> {
    let mut d1 = dims.clone();
    d1.insert("B", 1);
    let x = m.random_inputs(&d1, seed).map_err(|e| format!("random inputs: {e}"))?;
    let t_len = x[m.spec().mixed].shape()[1];
    let cu = packed_offsets(t_len);
    let n = cu.len() - 1;
    let stateful = shapes(m, &d1, None).is_ok() && forms(m, backend).contains(&form);
    let s0 = if stateful {
        let rows: Vec<Tensors<f64>> =
            (0..n).map(|i| random_state(m, &d1, seed + i as u64)).collect::<Result<_, _>>()?;
        Some(mixer_core::state::stack_rows(&rows).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let (y, fin) = run_packed(m, backend, form, &x, &cu, s0.as_ref(), stateful, Precision::Exact)
        .map_err(|e| format!("packed: {e}"))?;
    let tol = Tolerance::for_dtype("f64");
    for (i, w) in cu.windows(2).enumerate() {
        let r = w[0]..w[1];
        let got = y.slice_axis(Axis(1), Slice::from(r.clone())).to_owned();
        let seg = if stateful { segment_from_state(m, &x, r.clone()) } else { segment(m, &x, r.clone()) }
            .map_err(|e| e.to_string())?;
        let row = s0.as_ref().map(|s| state_row(s, i));
        if !r.is_empty() {
            let alone = match &row {
                Some(s) => run_state(m, backend, form, &seg, Some(s), Precision::Exact).map(|(y, _)| y),
                None => crate::run::run_as(m, backend, form, &seg, DType::F64),
            }
            .map_err(|e| format!("sequence {i} alone: {e}"))?;
            if got != alone {
                return Err(format!("sequence {i} (rows {r:?}) differs from its run alone"));
            }
            let want = match &row {
                Some(s) => m.state_oracle(&seg, Some(s)).map(|(y, _)| y),
                None => crate::run::oracle(m, &seg),
            }
            .map_err(|e| format!("oracle of sequence {i}: {e}"))?;
            compare(tol, &format!("sequence {i} against the oracle"), &got, &want)?;
        }
        if let (Some(fin), Some(s)) = (&fin, &row) {
            let want = if r.is_empty() {
                s.clone()
            } else {
                run_state(m, backend, form, &seg, Some(s), Precision::Exact).map_err(|e| e.to_string())?.1
            };
            if state_row(fin, i) != want {
                return Err(format!("final state of sequence {i} differs from its run alone"));
            }
        }
    }
    let last = *cu.last().unwrap_or(&0);
    if y.slice_axis(Axis(1), Slice::from(last..)).iter().any(|&v| v != 0.0) {
        return Err("rows past the last offset are not zero".into());
    }
    if stateful {
        // The plain packed run is an entry point of its own (a family may run it natively and
        // leave states to the registry): each sequence as its plain run alone.
        let (y, _) = run_packed(m, backend, form, &x, &cu, None, false, Precision::Exact)
            .map_err(|e| format!("packed without states: {e}"))?;
        for (i, w) in cu.windows(2).enumerate().filter(|(_, w)| w[0] < w[1]) {
            let r = w[0]..w[1];
            let seg = segment(m, &x, r.clone()).map_err(|e| e.to_string())?;
            let alone = crate::run::run_as(m, backend, form, &seg, DType::F64)
                .map_err(|e| format!("sequence {i} alone: {e}"))?;
            if y.slice_axis(Axis(1), Slice::from(r.clone())).to_owned() != alone {
                return Err(format!(
                    "sequence {i} (rows {r:?}) of the batch without states differs from its run alone"
                ));
            }
        }
        if y.slice_axis(Axis(1), Slice::from(last..)).iter().any(|&v| v != 0.0) {
            return Err("rows past the last offset are not zero (without states)".into());
        }
    }
    if !with_backward {
        return Ok(());
    }
    let dy = y.mapv(|v| (2.3 * v + 0.1).cos());
    let plain = StateVjp { x: &x, initial: None, dy: &dy, d_final: None, requires: &Requires::All };
    let (g, _) =
        backward_packed(m, backend, form, &cu, plain).map_err(|e| format!("packed backward: {e}"))?;
    packed_grads(m, &x, &cu, &dy, &g, false, |seg, dyi, _| {
        crate::backward::backward_as(m, backend.name(), form, seg, dyi, DType::F64, &Requires::All)
            .map(|g| (g, Tensors::new()))
    })?;
    let Some(s0) = s0.filter(|_| crate::state::backward_forms(m, backend).contains(&form)) else {
        return Ok(());
    };
    // From states, with a cotangent of the final states: each sequence's gradients and its row
    // of the initial states' gradient are those of its backward alone; an empty sequence passes
    // its row of the cotangent through.
    let df: Tensors<f64> = fin
        .as_ref()
        .ok_or("no final states")?
        .iter()
        .map(|(k, v)| (k.clone(), v.mapv(|x| (1.3 * x + 0.2).sin())))
        .collect();
    let (g, ds) =
        backward_packed(m, backend, form, &cu, StateVjp { initial: Some(&s0), d_final: Some(&df), ..plain })
            .map_err(|e| format!("packed backward from states: {e}"))?;
    let d_rows = packed_grads(m, &x, &cu, &dy, &g, true, |seg, dyi, i| {
        backward_state(
            m,
            backend,
            form,
            seg,
            Some(&state_row(&s0, i)),
            dyi,
            Some(&state_row(&df, i)),
            &Requires::All,
        )
    })?;
    for (i, w) in cu.windows(2).enumerate() {
        let want = if w[0] == w[1] { state_row(&df, i) } else { d_rows[i].clone() };
        if state_row(&ds, i) != want {
            return Err(format!("initial state's gradient of sequence {i} differs from its backward alone"));
        }
    }
    Ok(())
}

/// Checks the gradients `g` of a packed backward (cotangent `dy`) against
/// `alone(segment, dy of the segment, i)`
/// (the gradients and the initial state's gradient of sequence `i` run alone), bit for bit:
/// per-token inputs' at each sequence's rows and zero past the last offset, static inputs' the
/// sum over the non-empty sequences in order. Returns the initial state's gradient of every
/// sequence alone (empty for an empty sequence). `stateful`: the sequences run from states, so
/// their segments keep the slot axes whole (`segment_from_state`), as the packed run's do.
#[allow(clippy::too_many_arguments)]
fn packed_grads(
    m: &dyn Mixer,
    x: &Tensors<f64>,
    cu: &[usize],
    dy: &ArrayD<f64>,
    g: &Tensors<f64>,
    stateful: bool,
    alone: impl Fn(&Tensors<f64>, &ArrayD<f64>, usize) -> mixer_core::Result<(Tensors<f64>, Tensors<f64>)>,
) -> Result<Vec<Tensors<f64>>, String> {
    let per_token = m.spec().per_token();
    let is_token = |k: &str| per_token.iter().any(|p| p == k.strip_prefix("d_").unwrap_or(k));
    let mut statics: Tensors<f64> = g
        .iter()
        .filter(|(k, _)| !is_token(k))
        .map(|(k, v)| (k.clone(), ArrayD::zeros(v.raw_dim())))
        .collect();
    let mut d_rows = Vec::with_capacity(cu.len().saturating_sub(1));
    for (i, w) in cu.windows(2).enumerate() {
        let r = w[0]..w[1];
        if r.is_empty() {
            d_rows.push(Tensors::new());
            continue;
        }
        let seg = if stateful { segment_from_state(m, x, r.clone()) } else { segment(m, x, r.clone()) }
            .map_err(|e| e.to_string())?;
        let dyi = dy.slice_axis(Axis(1), Slice::from(r.clone())).to_owned();
        let (alone, ds) = alone(&seg, &dyi, i).map_err(|e| format!("backward of sequence {i} alone: {e}"))?;
        for (k, a) in &alone {
            if let Some(acc) = statics.get_mut(k) {
                *acc += a;
                continue;
            }
            let mut part = g[k].slice_axis(Axis(1), Slice::from(r.clone())).to_owned();
            for (axis, &len) in a.shape().iter().enumerate().skip(2) {
                part = part.slice_axis(Axis(axis), Slice::from(0..len)).to_owned();
            }
            if part != *a {
                return Err(format!("`{k}` of sequence {i} differs from its backward alone"));
            }
        }
        d_rows.push(ds);
    }
    for (k, sum) in &statics {
        if g[k] != *sum {
            return Err(format!("`{k}` is not the sum of the sequences' gradients alone"));
        }
    }
    let last = *cu.last().unwrap_or(&0);
    for (k, a) in g.iter().filter(|(k, _)| is_token(k)) {
        if a.slice_axis(Axis(1), Slice::from(last..)).iter().any(|&v| v != 0.0) {
            return Err(format!("`{k}` past the last offset is not zero"));
        }
    }
    Ok(d_rows)
}
