//! One call of a mixer with every option that changes which registry entry point runs it:
//! a packed batch (`cu_seqlens`, [`crate::packed`]), a run from a state or with its final state
//! ([`crate::state`]), or the plain form ([`crate::run`], [`crate::backward`]). The command
//! line (`mixers run`) and the Python package both go through here, so the choice is made in
//! one place.

use mixer_core::mixer::Mixer;
use mixer_core::{Error, Form, Precision, Requires, Result, Tensors};
use ndarray::ArrayD;

use crate::backend::Backend;
use crate::family::{Scalar, values};

/// What a call runs: the form `form` of the mixer `mixer` on `backend`, over the packed batch
/// `cu_seqlens` when given (else one sequence per batch row).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    /// The mixer.
    pub mixer: &'a dyn Mixer,
    /// The backend it runs on.
    pub backend: &'a Backend,
    /// The form (for [`backward`], the backward's form).
    pub form: Form,
    /// The packed batch's offsets ([`crate::packed`]), or `None`.
    pub cu_seqlens: Option<&'a [usize]>,
}

impl<'a> Target<'a> {
    /// `form` of `mixer` on `backend`, one sequence per batch row.
    pub fn new(mixer: &'a dyn Mixer, backend: &'a Backend, form: Form) -> Self {
        Target { mixer, backend, form, cu_seqlens: None }
    }

    /// The same call over the packed batch `cu_seqlens` (`None`: unpacked).
    pub fn packed(self, cu_seqlens: Option<&'a [usize]>) -> Self {
        Target { cu_seqlens, ..self }
    }
}

/// Runs `at`: over its packed batch when it has one, from the state `initial` (`None`: zeros)
/// and returning the final state when `initial` is given or `want_final` is set, else the plain
/// form. Returns `y` and the final state (`None` unless a state was asked for).
pub fn forward<F: Scalar>(
    at: Target<'_>,
    inputs: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    want_final: bool,
    precision: Precision,
) -> Result<(ArrayD<F>, Option<Tensors<F>>)> {
    let Target { mixer: m, backend, form, cu_seqlens } = at;
    let stateful = initial.is_some() || want_final;
    // The checks and the run of a small call stay on this thread (`mixer_core::parallel`).
    mixer_core::parallel::sized(values(&[Some(inputs), initial], &[]), || match (cu_seqlens, stateful) {
        (Some(cu), _) => {
            crate::packed::run_packed(m, backend, form, inputs, cu, initial, want_final, precision)
        }
        (None, true) => {
            let (y, f) = crate::state::run_state(m, backend, form, inputs, initial, precision)?;
            Ok((y, Some(f)))
        }
        (None, false) => Ok((crate::run::run_typed_with(m, backend, form, inputs, precision)?, None)),
    })
}

/// The backward of [`forward`] (the same target but for the backward's form, and the same
/// `initial`): from the cotangent `dy` of `y` and `d_final` of the final state (`None`: zero),
/// the gradients `d_<input>` of the inputs in `requires` and the gradient of the initial state
/// (empty without an initial state).
pub fn backward<F: Scalar>(
    at: Target<'_>,
    inputs: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
    requires: &Requires,
    precision: Precision,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let Target { mixer: m, backend, form, cu_seqlens } = at;
    let from_state = initial.is_some() || d_final.is_some();
    if (cu_seqlens.is_some() || from_state) && mixer_core::grad::saved_output(m, inputs).is_some() {
        return Err(Error::Io(format!(
            "the forward's output (`{}`) is taken by a backward without cu_seqlens and states only; \
             leave it out there",
            mixer_core::grad::SAVED_OUTPUT
        )));
    }
    if precision != Precision::Exact && (cu_seqlens.is_some() || from_state) {
        return Err(Error::Io(format!(
            "a backward in the {precision} mode takes neither cu_seqlens nor states (their backward runs \
             the exact arithmetic only); use the exact mode"
        )));
    }
    let read = values(&[Some(inputs), initial, d_final], &[dy]);
    mixer_core::parallel::sized(read, || match (cu_seqlens, from_state) {
        (Some(cu), _) => {
            let args = mixer_core::state::StateVjp { x: inputs, initial, dy, d_final, requires };
            crate::packed::backward_packed(m, backend, form, cu, args)
        }
        (None, true) => {
            crate::state::backward_state(m, backend, form, inputs, initial, dy, d_final, requires)
        }
        (None, false) => {
            let grads = crate::backward::backward_typed_with(
                m,
                backend.name(),
                form,
                inputs,
                dy,
                requires,
                precision,
            )?;
            Ok((grads, Tensors::new()))
        }
    })
}

/// The backward form for a forward run in `forward`: `asked` when given, else `forward` when
/// `backend` has a backward of that form, else the best available (`fast`, then
/// `materialized`); an error when `m` has no backward there.
pub fn grad_form(m: &dyn Mixer, backend: &str, asked: Option<Form>, forward: Form) -> Result<Form> {
    if let Some(f) = asked {
        return Ok(f);
    }
    let avail = crate::backward::backward_forms(m, backend);
    if avail.contains(&forward) {
        return Ok(forward);
    }
    [Form::Fast, Form::Materialized].into_iter().find(|f| avail.contains(f)).ok_or_else(|| {
        Error::FormUnavailable {
            mixer: m.name().into(),
            form: "any (backward)".into(),
            backend: backend.into(),
            available: "no backward form".into(),
        }
    })
}
