//! Packed variable-length batches (`cu_seqlens`, [`mixer_core::state`]; docs/math.md §7.2), for
//! every mixer, form and backend, forward and backward.
//!
//! A family that runs a form over a packed batch natively ([`crate::Family::packed`] and
//! [`crate::Family::packed_backward`], e.g. the CPU log-linear family's `fast` form: one job
//! list over (sequence, head); with states too unless [`crate::Family::packed_with_states`]
//! says otherwise) gets the whole batch in one call, in the `exact` mode, after the
//! same checks as the sequences would get one by one; it must give each sequence exactly what
//! the form gives it alone. Every other family, form and mode runs sequence by sequence (in
//! parallel on a backend whose calls may run on several threads at once,
//! [`crate::BackendEntry::concurrent`]): sequence `i` is cut out of the buffer
//! ([`mixer_core::state::segment`]: its tokens, and the axes whose size is a function of its
//! length), run by the form as a sequence of its own (from row `i` of the initial state when
//! one is given), and its output written back at its rows. So a packed batch equals the
//! sequences run one by one, bit for bit, on every backend; rows past the last offset get
//! zeros. Gradients: per-token inputs' gradients are written back at each sequence's rows (zero
//! past the last offset and in slots a shorter sequence does not have), and the gradients of
//! static inputs (Toeplitz taps, `lambda_param`) are summed over the sequences. An empty
//! sequence passes its initial state through unchanged (and its cotangent back).

use std::ops::Range;

use mixer_core::mixer::Mixer;
use mixer_core::parallel::min_len;
use mixer_core::state::{
    StateShapes, StateVjp, check_cu_seqlens, check_state, scatter, segment, segment_from_state, shapes_of,
    stack_rows, state_row, zeros,
};
use mixer_core::tensor::get;
use mixer_core::{Dims, Error, Form, Precision, Result, Tensors, grad_name};
use ndarray::{ArrayD, Axis};

use crate::backend::Backend;
use crate::family::{DynFamily, Scalar};
use crate::state::{backward_state, run_state};

/// A packed call's validated layout.
struct Layout {
    /// The sequences' row ranges.
    ranges: Vec<Range<usize>>,
    /// The sizes of the whole buffer.
    dims: Dims,
    /// With states: one sequence's state shapes (axis 0, the batch, of size 1) and the stacked
    /// shapes (one row per sequence).
    states: Option<(StateShapes, StateShapes)>,
}

/// The layout, after validating the inputs and the offsets; with `stateful`, also the state
/// shapes, after checking each given state (`(name, state)`, one row per sequence) against
/// them.
fn layout<F: Scalar>(
    m: &dyn Mixer,
    inputs: &Tensors<F>,
    cu_seqlens: &[usize],
    stateful: bool,
    given: &[(&str, Option<&Tensors<F>>)],
) -> Result<Layout> {
    let dims = mixer_core::mixer::validate_typed(m, inputs)?;
    let x = get(inputs, m.spec().mixed)?;
    let ranges = check_cu_seqlens(cu_seqlens, x.shape()[0], x.shape()[1])?;
    if !stateful {
        return Ok(Layout { ranges, dims, states: None });
    }
    let mut one_dims = dims.clone();
    one_dims.insert("B", 1);
    let first = given.iter().find_map(|(_, s)| s.map(|s| state_row(s, 0)));
    let one = crate::state::shapes(m, &one_dims, first.as_ref().map(shapes_of).as_ref())?;
    let rows: StateShapes = one
        .iter()
        .map(|(k, s)| (k.clone(), std::iter::once(ranges.len()).chain(s.iter().skip(1).copied()).collect()))
        .collect();
    for (name, s) in given {
        if let Some(s) = s {
            check_state(name, &rows, s)?;
        }
    }
    Ok(Layout { ranges, dims, states: Some((one, rows)) })
}

/// What an empty sequence `i` returns for states given one row per sequence (the initial
/// states forward, the final states' cotangent backward): its row unchanged, or zeros.
fn passed<F: Scalar>(given: Option<&Tensors<F>>, i: usize, one: &StateShapes) -> Tensors<F> {
    given.map(|s| state_row(s, i)).unwrap_or_else(|| zeros(one))
}

/// The implementation of `m`'s family on `backend` for `F` when it runs the packed batch
/// natively (`has`: [`DynFamily::implements_packed`] or its backward) in this mode: the `exact`
/// mode, or a mode the family handles at the boundary for `form` (no form of its own for it, so
/// that a sequence alone would run the exact form: on the rounded activations in `bf16`). `None`:
/// the sequences run one by one.
fn native<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    precision: Precision,
    has: impl Fn(&dyn DynFamily<F>) -> bool,
) -> Option<&'static dyn DynFamily<F>> {
    let imp = F::implementation(backend.family(m.family())?);
    let mode = precision == Precision::Exact || !imp.implements_precise(form);
    (mode && has(imp)).then_some(imp)
}

/// Sets the rows of the empty sequences of stacked states `out` (one row per sequence) to what
/// they pass through ([`passed`]), then checks `out` against the stacked shapes (`what` names
/// it in the error).
fn pass_empty<F: Scalar>(
    backend: &Backend,
    ranges: &[Range<usize>],
    given: Option<&Tensors<F>>,
    (one, rows): &(StateShapes, StateShapes),
    what: &str,
    out: &mut Tensors<F>,
) -> Result<()> {
    check_state(what, rows, out)?;
    for (i, _) in ranges.iter().enumerate().filter(|(_, r)| r.is_empty()) {
        let row = passed(given, i, one);
        for (k, v) in out.iter_mut() {
            let r = row.get(k).ok_or_else(|| internal(backend, &format!("no state tensor `{k}`")))?;
            v.index_axis_mut(Axis(0), i).assign(&r.index_axis(Axis(0), 0));
        }
    }
    Ok(())
}

/// Runs `form` of `m` over a packed batch (`B = 1`, sequence `i` at rows
/// `cu_seqlens[i] .. cu_seqlens[i + 1]`). With `initial` (one row per sequence) or
/// `want_final`, every sequence runs from its state and the final states come back one row per
/// sequence; otherwise the plain form runs and no state is returned.
#[allow(clippy::too_many_arguments)]
pub fn run_packed<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &Tensors<F>,
    cu_seqlens: &[usize],
    initial: Option<&Tensors<F>>,
    want_final: bool,
    precision: Precision,
) -> Result<(ArrayD<F>, Option<Tensors<F>>)> {
    let stateful = initial.is_some() || want_final;
    let lay = layout(m, inputs, cu_seqlens, stateful, &[("initial_state", initial)])?;
    let ranges = &lay.ranges;
    if let Some(imp) = native::<F>(m, backend, form, precision, |i| {
        i.implements_packed(form) && (!stateful || i.implements_packed_states(form))
    }) {
        if stateful {
            crate::state::available(m, backend, form)?;
        } else {
            crate::run::available(m, backend, form)?;
        }
        crate::run::check_precision(precision, F::DTYPE)?;
        mixer_core::memory::guard(m, form, &lay.dims, F::DTYPE)?;
        // A mode handled at the boundary, as a sequence alone gets it: `tf32` runs the exact form,
        // `bf16` the exact form on the rounded activations, with `y` rounded.
        let x = crate::run::stored(inputs, precision);
        let (mut y, fin) = imp
            .run_packed(m, backend.name(), form, &x, ranges, initial, want_final)
            .unwrap_or_else(|| Err(internal(backend, "the native packed form is gone")))?;
        if precision == Precision::Bf16 {
            y.mapv_inplace(crate::run::bf16_value);
        }
        let y = if stateful {
            crate::state::finite_output(m, form, backend, &y)?;
            y
        } else {
            mixer_core::mixer::check_output_typed(m, form, backend.name(), &y)?;
            y
        };
        let fin = match (&lay.states, fin) {
            (Some(shapes), Some(mut fin)) => {
                pass_empty(backend, ranges, initial, shapes, "final_state", &mut fin)?;
                Some(fin)
            }
            (Some(_), None) => {
                return Err(internal(backend, "the native packed form returned no final states"));
            }
            (None, _) => None,
        };
        return Ok((y, fin));
    }
    let one = lay.states.as_ref().map(|(one, _)| one);
    let results = each_sequence(backend, ranges, |i, r| {
        if r.is_empty() {
            return Ok((None, one.map(|w| passed(initial, i, w))));
        }
        // Without an initial state every sequence starts from the zero state of the buffer's
        // sizes, so that the final states share their shapes (a KV cache's capacity).
        let row = initial.map(|s| state_row(s, i)).or_else(|| one.map(|w| zeros(w)));
        if stateful {
            let seg = segment_from_state(m, inputs, r.clone())?;
            let (yi, fi) = run_state(m, backend, form, &seg, row.as_ref(), precision)?;
            return Ok((Some(yi), Some(fi)));
        }
        let seg = segment(m, inputs, r.clone())?;
        Ok((Some(crate::run::run_typed_with(m, backend, form, &seg, precision)?), None))
    })?;
    let mut y = ArrayD::<F>::zeros(get(inputs, m.spec().mixed)?.raw_dim());
    let mut finals = Vec::with_capacity(ranges.len());
    for (r, (yi, fi)) in ranges.iter().zip(results) {
        if let Some(yi) = yi {
            scatter(&mut y, &yi, r.clone(), true)?;
        }
        finals.extend(fi);
    }
    let fin = if stateful { Some(stack_rows(&finals)?) } else { None };
    Ok((y, fin))
}

/// `f(i, range)` for every sequence, in order: on several host threads where the backend
/// allows it ([`crate::BackendEntry::concurrent`]), else one after another.
fn each_sequence<T: Send>(
    backend: &Backend,
    ranges: &[Range<usize>],
    f: impl Fn(usize, &Range<usize>) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    use rayon::prelude::*;
    if backend.entry().concurrent {
        ranges.par_iter().with_min_len(min_len()).enumerate().map(|(i, r)| f(i, r)).collect()
    } else {
        ranges.iter().enumerate().map(|(i, r)| f(i, r)).collect()
    }
}

pub(crate) fn internal(backend: &Backend, message: &str) -> Error {
    Error::Backend { backend: backend.name().into(), family: None, message: format!("internal: {message}") }
}

/// The backward of [`run_packed`] over the packed batch `cu_seqlens`: gradients `d_<input>`
/// (shape of the inputs `args.x`) and, with an initial state, its gradient (one row per
/// sequence). `args.d_final` (one row per sequence) is the final states' cotangent; with neither
/// an initial state nor `d_final`, every sequence runs the plain backward.
pub fn backward_packed<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    cu_seqlens: &[usize],
    args: StateVjp<'_, F>,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let StateVjp { x: inputs, initial, dy, d_final, requires } = args;
    let stateful = initial.is_some() || d_final.is_some();
    let given = [("initial_state", initial), ("d_final_state", d_final)];
    let lay = layout(m, inputs, cu_seqlens, stateful, &given)?;
    let ranges = &lay.ranges;
    let x = get(inputs, m.spec().mixed)?;
    if dy.shape() != x.shape() {
        return Err(Error::shape(
            "dy",
            mixer_core::error::fmt_shape(x.shape()),
            mixer_core::error::fmt_shape(dy.shape()),
        ));
    }
    if let Some(imp) = native::<F>(m, backend, form, Precision::Exact, |i| {
        i.implements_packed_backward(form) && (!stateful || i.implements_packed_states(form))
    }) {
        crate::backward::check_dy(m, inputs, dy)?;
        crate::backward::check_requires(m, &inputs.keys().cloned().collect::<Vec<_>>(), requires)?;
        if stateful {
            crate::state::backward_available(m, backend, form)?;
        } else {
            crate::backward::implementation::<F>(m, backend.name(), form)?;
        }
        let (g, mut d_initial) = imp
            .run_packed_backward(m, backend.name(), form, inputs, ranges, initial, dy, d_final, requires)
            .unwrap_or_else(|| Err(internal(backend, "the native packed backward is gone")))?;
        let g = crate::backward::wanted(m, backend.name(), form, inputs, requires, g)?;
        match (&lay.states, initial) {
            (Some(shapes), Some(_)) => {
                pass_empty(backend, ranges, d_final, shapes, "d_initial_state", &mut d_initial)?
            }
            _ => d_initial = Tensors::new(),
        }
        return Ok((g, d_initial));
    }
    let one = lay.states.as_ref().map(|(one, _)| one);
    let per_token = m.spec().per_token();
    let mut grads: Tensors<F> = inputs
        .iter()
        .filter(|(k, _)| requires.wants(k))
        .map(|(k, v)| (grad_name(k), ArrayD::zeros(v.raw_dim())))
        .collect();
    let results = each_sequence(backend, ranges, |i, r| {
        if r.is_empty() {
            return Ok((None, one.map(|w| passed(d_final, i, w))));
        }
        let row = initial.map(|s| state_row(s, i)).or_else(|| one.map(|w| zeros(w)));
        let d_row = d_final.map(|s| state_row(s, i));
        let seg =
            if stateful { segment_from_state(m, inputs, r.clone())? } else { segment(m, inputs, r.clone())? };
        let dyi = dy.slice_axis(ndarray::Axis(1), ndarray::Slice::from(r.clone())).to_owned();
        if stateful {
            let (g, ds) =
                backward_state(m, backend, form, &seg, row.as_ref(), &dyi, d_row.as_ref(), requires)?;
            return Ok((Some(g), Some(ds)));
        }
        let g = crate::backward::backward_typed_with(
            m,
            backend.name(),
            form,
            &seg,
            &dyi,
            requires,
            Precision::Exact,
        )?;
        Ok((Some(g), None))
    })?;
    let mut d_states = Vec::with_capacity(ranges.len());
    for (r, (gi, ds)) in ranges.iter().zip(results) {
        d_states.extend(ds);
        let Some(gi) = gi else { continue };
        for (name, full) in grads.iter_mut() {
            let input = name.strip_prefix("d_").unwrap_or(name);
            let part = gi
                .get(name)
                .ok_or_else(|| internal(backend, &format!("no gradient `{name}` for a sequence")))?;
            scatter(full, part, r.clone(), per_token.iter().any(|p| p == input))?;
        }
    }
    let d_initial = if initial.is_some() { stack_rows(&d_states)? } else { Tensors::new() };
    Ok((grads, d_initial))
}
