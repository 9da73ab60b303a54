//! Running a form of a mixer from a recurrent state and returning its final state
//! ([`mixer_core::state`]; docs/math.md §7), forward and backward, with validation and the one
//! place that decides whether a backend can.
//!
//! Forms: `materialized` is the mixer's own `f64` reference ([`Mixer::state_oracle`], the
//! oracle of an extended sequence); `recurrent` is the backend's decoder started from the
//! state ([`Family::decoder_from_state`](crate::Family::decoder_from_state)) run over the
//! sequence, its state read at the end; `parallel` and `fast` are the backend's own
//! ([`Family::stateful`](crate::Family::stateful)). A backend that has none of these for
//! a family is refused with an error listing the forms that do run from a state; the plain
//! forms never receive a state, so none can ignore one silently.

use mixer_core::mixer::{Mixer, run_decoder, validate_typed};
use mixer_core::spec::Constraint;
use mixer_core::state::{StateShapes, check_state, no_state, shapes_of};
use mixer_core::tensor::{cast_tensors, tensors_to_f64};
use mixer_core::{Dims, Error, Form, Precision, Requires, Result, Tensors, grad_name};
use ndarray::ArrayD;

use crate::backend::Backend;
use crate::family::Scalar;
use crate::run::{bf16_value, check_precision, stored};

/// The state's shapes of `m` at `dims` when a run starts from a state of the shapes `given`
/// (`None`: no state given; [`Mixer::state_sizes`] reads the sizes the inputs do not bind from
/// it), or the error that `m` has no state.
pub fn shapes(m: &dyn Mixer, dims: &Dims, given: Option<&StateShapes>) -> Result<StateShapes> {
    let mut d = dims.clone();
    d.extend(m.state_sizes(dims, given));
    m.state_shapes(&d).map_err(|why| no_state(m.name(), &why))
}

/// Why `backend` cannot run `form` of `m` from a state, or `None` when it can.
fn why_not(m: &dyn Mixer, backend: &Backend, form: Form) -> Option<String> {
    if let Some(why) = crate::run::why_not(m, backend, form) {
        return Some(why);
    }
    if form == Form::Materialized {
        return None;
    }
    match backend.family(m.family()) {
        Some(e) if e.f64.implements_state(form) => match e.f64.state_unsupported(m, backend.name(), form) {
            Ok(why) => why,
            Err(e) => Some(e.to_string()),
        },
        _ => Some(format!(
            "backend `{}` has no {form} form from a state for the `{}` family",
            backend.name(),
            m.family()
        )),
    }
}

/// The forms of `m` that `backend` runs from a state.
pub fn forms(m: &dyn Mixer, backend: &Backend) -> Vec<Form> {
    Form::ALL.into_iter().filter(|&f| why_not(m, backend, f).is_none()).collect()
}

/// `Ok` when `backend` runs `form` of `m` from a state; otherwise the error that says why.
pub(crate) fn available(m: &dyn Mixer, backend: &Backend, form: Form) -> Result<()> {
    let Some(why) = why_not(m, backend, form) else { return Ok(()) };
    let list = forms(m, backend).iter().map(|f| f.name()).collect::<Vec<_>>().join(", ");
    Err(Error::FormUnavailable {
        mixer: m.name().to_string(),
        form: format!("{} (from a state)", form.name()),
        backend: backend.name().into(),
        available: format!("{} ({why})", if list.is_empty() { "none" } else { &list }),
    })
}

fn implementation<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
) -> Result<&'static dyn crate::DynFamily<F>> {
    available(m, backend, form)?;
    crate::run::family_of(m, backend)
}

fn not_run(m: &dyn Mixer, backend: &Backend, form: Form) -> Error {
    Error::Backend {
        backend: backend.name().into(),
        family: Some(m.family().into()),
        message: format!("the {form} form from a state is declared for f64 but not for this scalar type"),
    }
}

/// An error unless `y` of a run from a state is finite.
pub(crate) fn finite_output<F: mixer_core::Real>(
    m: &dyn Mixer,
    form: Form,
    backend: &Backend,
    y: &ArrayD<F>,
) -> Result<()> {
    if Constraint::Finite.all(y) {
        return Ok(());
    }
    Err(Error::Numerical(format!(
        "`{}` {form} form from a state on {}: an output is ±∞ or NaN although every input and \
         the state are finite{}",
        m.name(),
        backend.name(),
        m.overflow_hint().map(|h| format!(" ({h})")).unwrap_or_default()
    )))
}

/// Builds a decoder of `m` on `backend` started from the state `initial` (`None`: zeros), from
/// the inputs' static part (per-token inputs are ignored) and the bound sizes `dims`; its
/// [`mixer_core::Decoder::state`] is the state after the tokens it consumed. So prefill
/// ([`run_state`]) followed by decoding works at any split.
pub fn decoder_from_state<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    inputs: &Tensors<F>,
    dims: &Dims,
    initial: Option<&Tensors<F>>,
) -> Result<Box<dyn mixer_core::Decoder<F>>> {
    let want = shapes(m, dims, initial.map(shapes_of).as_ref())?;
    if let Some(s) = initial {
        check_state("initial_state", &want, s)?;
    }
    let imp = implementation::<F>(m, backend, Form::Recurrent)?;
    mixer_core::memory::guard(m, Form::Recurrent, dims, F::DTYPE)?;
    let per_token = m.spec().per_token();
    let statics: Tensors<F> =
        inputs.iter().filter(|(k, _)| !per_token.contains(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    imp.decoder_from_state(m, backend.name(), &statics, dims, initial)
        .unwrap_or_else(|| Err(not_run(m, backend, Form::Recurrent)))
}

/// Runs `form` of `m` on `backend` from the initial state `initial` (`None`: zeros), after
/// checking the inputs and the state's names, shapes and values; returns `y` and the final
/// state. Precision modes as in [`crate::run::run_with`]: a backend form with its own handling of
/// the mode ([`crate::Family::precise_stateful`]: CUDA's log-linear base mixers) runs in it;
/// otherwise `bf16` rounds the activations and `y` at the boundary and `tf32` runs the exact form.
pub fn run_state<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    precision: Precision,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    check_precision(precision, F::DTYPE)?;
    let dims = validate_typed(m, inputs)?;
    let want = shapes(m, &dims, initial.map(shapes_of).as_ref())?;
    if let Some(s) = initial {
        check_state("initial_state", &want, s)?;
    }
    available(m, backend, form)?;
    mixer_core::memory::guard(m, form, &dims, F::DTYPE)?;
    // A backend form with its own handling of the mode gets the inputs as given.
    let precise = match (precision, form) {
        (Precision::Exact, _) | (_, Form::Materialized | Form::Recurrent) => None,
        (p, f) => {
            implementation::<F>(m, backend, f)?.run_precise_state(m, backend.name(), f, inputs, initial, p)
        }
    };
    let (y, fin) = match precise {
        Some(out) => out?,
        None => {
            let x = stored(inputs, precision);
            let (mut y, fin) = match form {
                Form::Materialized => {
                    let (y, fin) =
                        m.state_oracle(&tensors_to_f64(&x), initial.map(tensors_to_f64).as_ref())?;
                    (y.mapv(F::of), cast_tensors::<F>(&fin))
                }
                Form::Recurrent => {
                    let mut dec = decoder_from_state(m, backend, &x, &dims, initial)?;
                    let y = run_decoder(dec.as_mut(), &m.spec(), &x, |_, _| {})?;
                    (y, dec.state()?)
                }
                f => implementation::<F>(m, backend, f)?
                    .run_state(m, backend.name(), f, &x, initial)
                    .unwrap_or_else(|| Err(not_run(m, backend, f)))?,
            };
            if precision == Precision::Bf16 {
                y.mapv_inplace(bf16_value);
            }
            (y, fin)
        }
    };
    finite_output(m, form, backend, &y)?;
    check_state("final_state", &want, &fin)?;
    Ok((y, fin))
}

/// The backward forms of `m` from a state on `backend`: `materialized` (the mixer's reference)
/// when the mixer has a state, and the backend's own.
pub fn backward_forms(m: &dyn Mixer, backend: &Backend) -> Vec<Form> {
    Form::ALL
        .into_iter()
        .filter(|&f| {
            why_not(m, backend, f).is_none()
                && (f == Form::Materialized
                    || backend.family(m.family()).is_some_and(|e| e.f64.implements_state_backward(f)))
        })
        .collect()
}

/// `Ok` when `backend` has the backward of `form` of `m` from a state; otherwise the error that
/// lists the forms that have one and says why this one does not run (as [`available`] does).
pub(crate) fn backward_available(m: &dyn Mixer, backend: &Backend, form: Form) -> Result<()> {
    let have = backward_forms(m, backend);
    if have.contains(&form) {
        return Ok(());
    }
    let why = why_not(m, backend, form).unwrap_or_else(|| {
        format!(
            "backend `{}` has no {form} backward from a state for the `{}` family",
            backend.name(),
            m.family()
        )
    });
    let list = have.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ");
    Err(Error::FormUnavailable {
        mixer: m.name().to_string(),
        form: format!("{} (backward from a state)", form.name()),
        backend: backend.name().into(),
        available: format!("{} ({why})", if list.is_empty() { "none" } else { &list }),
    })
}

/// The backward of [`run_state`]: from the cotangents `dy` (shape of `y`) and `d_final`
/// (`None`: zero; else the final state's names and shapes), the gradients `d_<input>` of the
/// inputs in `requires` and the gradient of the initial state (keyed as the state's tensors;
/// empty when no initial state was given).
#[allow(clippy::too_many_arguments)]
pub fn backward_state<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
    requires: &Requires,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let dims = validate_typed(m, inputs)?;
    let want = shapes(m, &dims, initial.map(shapes_of).as_ref())?;
    if let Some(s) = initial {
        check_state("initial_state", &want, s)?;
    }
    if let Some(s) = d_final {
        check_state("d_final_state", &want, s)?;
    }
    let mixed = mixer_core::tensor::get(inputs, m.spec().mixed)?;
    if dy.shape() != mixed.shape() {
        return Err(Error::shape(
            "dy",
            mixer_core::error::fmt_shape(mixed.shape()),
            mixer_core::error::fmt_shape(dy.shape()),
        ));
    }
    backward_available(m, backend, form)?;
    let (mut grads, d_state) = match form {
        Form::Materialized => {
            let (g, s) = m.state_oracle_vjp(
                &tensors_to_f64(inputs),
                initial.map(tensors_to_f64).as_ref(),
                &dy.mapv(|x| x.f64()),
                d_final.map(tensors_to_f64).as_ref(),
                requires,
            )?;
            (cast_tensors::<F>(&g), cast_tensors::<F>(&s))
        }
        f => implementation::<F>(m, backend, f)?
            .run_state_backward(m, backend.name(), f, inputs, initial, dy, d_final, requires)
            .unwrap_or_else(|| Err(not_run(m, backend, f)))?,
    };
    grads.retain(|k, _| k.strip_prefix("d_").is_some_and(|n| requires.wants(n) && inputs.contains_key(n)));
    for name in inputs.keys().filter(|n| requires.wants(n)) {
        if !grads.contains_key(&grad_name(name)) {
            return Err(Error::Backend {
                backend: backend.name().into(),
                family: Some(m.family().into()),
                message: format!("the {form} backward from a state returned no gradient for `{name}`"),
            });
        }
    }
    if initial.is_some() {
        check_state("d_initial_state", &want, &d_state)?;
    }
    Ok((grads, d_state))
}
