//! Packed variable-length batches (`cu_seqlens`, [`mixer_core::state`]; docs/math.md §7.2), for
//! every mixer, form and backend, forward and backward.
//!
//! A packed batch is run sequence by sequence (in parallel on a backend whose calls may run
//! on several threads at once, [`crate::BackendEntry::concurrent`]): sequence `i` is cut out of the buffer
//! ([`mixer_core::state::segment`]: its tokens, and the axes whose size is a function of its
//! length), run by the form as a sequence of its own (from row `i` of the initial state when
//! one is given), and its output written back at its rows. So a packed batch equals the
//! sequences run one by one, bit for bit, on every backend; rows past the last offset get
//! zeros. Gradients: per-token inputs' gradients are written back at each sequence's rows (zero
//! past the last offset and in slots a shorter sequence does not have), and the gradients of
//! static inputs (Toeplitz taps, `lambda_param`) are summed over the sequences. An empty
//! sequence passes its initial state through unchanged (and its cotangent back).

use std::collections::BTreeMap;
use std::ops::Range;

use mixer_core::mixer::Mixer;
use mixer_core::state::{
    StateShapes, check_cu_seqlens, check_state, scatter, segment, segment_from_state, shapes_of, stack_rows,
    state_row, zeros,
};
use mixer_core::tensor::get;
use mixer_core::{Error, Form, Precision, Requires, Result, Tensors, grad_name};
use ndarray::ArrayD;

use crate::backend::Backend;
use crate::family::Scalar;
use crate::state::{backward_state, run_state, validate};

/// The sequences' row ranges, after validating the inputs and the offsets; with `stateful`, also
/// one sequence's state shapes (axis 0 of every state tensor is the batch), after checking each
/// given state (`(name, state)`, one row per sequence) against them.
fn layout<F: Scalar>(
    m: &dyn Mixer,
    inputs: &Tensors<F>,
    cu_seqlens: &[usize],
    stateful: bool,
    given: &[(&str, Option<&Tensors<F>>)],
) -> Result<(Vec<Range<usize>>, Option<StateShapes>)> {
    let mut dims = validate(m, inputs)?;
    let x = get(inputs, m.spec().mixed)?;
    let ranges = check_cu_seqlens(cu_seqlens, x.shape()[0], x.shape()[1])?;
    if !stateful {
        return Ok((ranges, None));
    }
    dims.insert("B", 1);
    let first = given.iter().find_map(|(_, s)| s.map(|s| state_row(s, 0)));
    let one = crate::state::shapes(m, &dims, first.as_ref().map(shapes_of).as_ref())?;
    let rows: StateShapes = one
        .iter()
        .map(|(k, s)| (k.clone(), std::iter::once(ranges.len()).chain(s.iter().skip(1).copied()).collect()))
        .collect();
    for (name, s) in given {
        if let Some(s) = s {
            check_state(name, &rows, s)?;
        }
    }
    Ok((ranges, Some(one)))
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
    let (ranges, one) = layout(m, inputs, cu_seqlens, stateful, &[("initial_state", initial)])?;
    let results = each_sequence(backend, &ranges, |i, r| {
        // Without an initial state every sequence starts from the zero state of the buffer's
        // sizes, so that the final states share their shapes (a KV cache's capacity).
        let row = initial.map(|s| state_row(s, i)).or_else(|| one.as_ref().map(|w| zeros(w)));
        if r.is_empty() {
            return Ok((None, row));
        }
        if stateful {
            let seg = segment_from_state(m, inputs, r.clone())?;
            let (yi, fi) = run_state(m, backend, form, &seg, row.as_ref(), precision)?;
            return Ok((Some(yi), Some(fi)));
        }
        let seg = segment(m, inputs, r.clone())?;
        let t = crate::run::run_with(m, backend, form, &F::tag(seg), precision)?;
        let yi = F::untag(t).ok_or_else(|| internal(backend, "the output came back in another dtype"))?;
        Ok((Some(yi), None))
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
        ranges.par_iter().enumerate().map(|(i, r)| f(i, r)).collect()
    } else {
        ranges.iter().enumerate().map(|(i, r)| f(i, r)).collect()
    }
}

pub(crate) fn internal(backend: &Backend, message: &str) -> Error {
    Error::Backend { backend: backend.name().into(), family: None, message: format!("internal: {message}") }
}

/// The backward of [`run_packed`]: gradients `d_<input>` (shape of the inputs) and, with an
/// initial state, its gradient (one row per sequence). `d_final` (one row per sequence) is the
/// final states' cotangent; with neither `initial` nor `d_final`, every sequence runs the
/// plain backward.
#[allow(clippy::too_many_arguments)]
pub fn backward_packed<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &Tensors<F>,
    cu_seqlens: &[usize],
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
    requires: &Requires,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let stateful = initial.is_some() || d_final.is_some();
    let given = [("initial_state", initial), ("d_final_state", d_final)];
    let (ranges, one) = layout(m, inputs, cu_seqlens, stateful, &given)?;
    let x = get(inputs, m.spec().mixed)?;
    if dy.shape() != x.shape() {
        return Err(Error::shape(
            "dy",
            mixer_core::error::fmt_shape(x.shape()),
            mixer_core::error::fmt_shape(dy.shape()),
        ));
    }
    let per_token = m.spec().per_token();
    let mut grads: Tensors<F> = inputs
        .iter()
        .filter(|(k, _)| requires.wants(k))
        .map(|(k, v)| (grad_name(k), ArrayD::zeros(v.raw_dim())))
        .collect();
    let results = each_sequence(backend, &ranges, |i, r| {
        let row = initial.map(|s| state_row(s, i)).or_else(|| one.as_ref().map(|w| zeros(w)));
        let d_row = d_final.map(|s| state_row(s, i));
        if r.is_empty() {
            return Ok((None, one.as_ref().map(|w| d_row.unwrap_or_else(|| zeros(w)))));
        }
        let seg =
            if stateful { segment_from_state(m, inputs, r.clone())? } else { segment(m, inputs, r.clone())? };
        let dyi = dy.slice_axis(ndarray::Axis(1), ndarray::Slice::from(r.clone())).to_owned();
        if stateful {
            let (g, ds) =
                backward_state(m, backend, form, &seg, row.as_ref(), &dyi, d_row.as_ref(), requires)?;
            return Ok((Some(g), Some(ds)));
        }
        let g = crate::backward::backward(m, backend.name(), form, &F::tag(seg), &F::tag_one(dyi), requires)?;
        Ok((Some(untag_all(backend, g)?), None))
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

/// Gradients tagged by dtype back as `F` (an internal error if one came back in another dtype).
pub(crate) fn untag_all<F: Scalar>(
    backend: &Backend,
    g: BTreeMap<String, mixer_core::Tensor>,
) -> Result<Tensors<F>> {
    g.into_iter()
        .map(|(k, v)| {
            F::untag(v)
                .map(|a| (k, a))
                .ok_or_else(|| internal(backend, "a gradient came back in another dtype"))
        })
        .collect()
}
