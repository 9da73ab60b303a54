//! Gradients: running a backward form of a mixer on a backend, with validation.
//!
//! Every mixer is linear in its mixed input once its coefficients are fixed, but a backward
//! pass differentiates with respect to *every* input tensor: for an output cotangent `dy`
//! (the shape of `y`) it returns the vector–Jacobian products
//! `ū = (∂ y / ∂ u)ᵀ dy` for each input `u`, named `d_<u>` (`d_x`,
//! `d_q`, `d_g`, `d_lambda`, `d_lambda_param`, `d_w`, …) with the shape and dtype of `u`.
//!
//! Forms: `materialized` is the reference on every backend (the generic VJP of
//! `Y = (I−B)⁻¹ A X` mapped to the inputs by [`Mixer::materialized_vjp`], in `f64`); a
//! backend adds its own forms through its [`Family`](crate::Family) implementation
//! ([`Family::backward`](crate::Family::backward)), exactly as it adds forward forms.

use std::borrow::Cow;
use std::collections::BTreeMap;

use mixer_core::grad::{SAVED_OUTPUT, grad_name, is_saved_output, materialized_backward, saved_output};
use mixer_core::mixer::Mixer;
use mixer_core::tensor::{cast_tensors, fmt_shape_of};
use mixer_core::{AnyTensors, DType, Error, Form, Precision, Requires, Result, Tensor, Tensors};
use ndarray::ArrayD;

use crate::family::Scalar;
use crate::lookup::family;
use crate::run::{bf16_value, check_precision, stored};

/// The backward forms of `m` on `backend`: `materialized` when the mixer maps entry
/// gradients to its inputs, and the backend's backward forms that this configuration
/// admits.
pub fn backward_forms(m: &dyn Mixer, backend: &str) -> Vec<Form> {
    let mut v = Vec::new();
    if m.has_materialized_vjp() {
        v.push(Form::Materialized);
    }
    if let Some(e) = family(m.family(), backend) {
        v.extend(Form::ALL.iter().copied().filter(|&f| {
            e.f64.implements_backward(f)
                && m.form_unsupported(f).is_none()
                && matches!(e.f64.backward_unsupported(m, backend, f), Ok(None))
        }));
    }
    v.sort();
    v.dedup();
    v
}

fn unavailable(m: &dyn Mixer, form: Form, backend: &str) -> Error {
    let list = backward_forms(m, backend).iter().map(|f| f.name()).collect::<Vec<_>>().join(", ");
    Error::FormUnavailable {
        mixer: m.name().to_string(),
        form: format!("{} (backward)", form.name()),
        backend: backend.into(),
        available: if list.is_empty() { "no backward form".into() } else { list },
    }
}

/// Checks `requires` against the spec and the given inputs (by name): every required input is
/// one of the mixer's and is given. Backends call it for their device tensors.
pub fn check_requires(m: &dyn Mixer, given: &[String], requires: &Requires) -> Result<()> {
    let Requires::Only(set) = requires else { return Ok(()) };
    let spec = m.spec();
    for name in set {
        if !spec.inputs.iter().any(|d| d.name == name) {
            return Err(Error::UnexpectedInput { name: name.clone(), expected: spec.describe() });
        }
        if !given.contains(name) {
            return Err(Error::MissingInput {
                name: name.clone(),
                expected: "the input whose gradient is required".into(),
                given: given.join(", "),
            });
        }
    }
    Ok(())
}

/// The inputs and `dy` a backward without its own handling of `precision` runs on: as given,
/// or in the `bf16` mode with the activations and `dy` rounded to bf16 (what the call stores).
fn at_boundary<'a, F: Scalar>(
    inputs: &'a Tensors<F>,
    dy: &'a ArrayD<F>,
    precision: Precision,
) -> (Cow<'a, Tensors<F>>, Cow<'a, ArrayD<F>>) {
    let dy = if precision == Precision::Bf16 { Cow::Owned(dy.mapv(bf16_value)) } else { Cow::Borrowed(dy) };
    (stored(inputs, precision), dy)
}

/// An error unless `dy` has the shape of `y` (that of the mixed input) and finite values.
pub(crate) fn check_dy<F: Scalar>(m: &dyn Mixer, inputs: &Tensors<F>, dy: &ArrayD<F>) -> Result<()> {
    let mixed = mixer_core::tensor::get(inputs, m.spec().mixed)?;
    if dy.shape() != mixed.shape() {
        return Err(Error::shape(
            "dy",
            format!("{} (the shape of y, i.e. of `{}`)", fmt_shape_of(mixed), m.spec().mixed),
            fmt_shape_of(dy),
        ));
    }
    mixer_core::spec::Constraint::Finite.check("dy", dy)
}

/// The implementation of `m`'s family on `backend` for `F` when it has the backward of `form`
/// (not `materialized`) for this configuration; otherwise the error that says why.
pub(crate) fn implementation<F: Scalar>(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
) -> Result<&'static dyn crate::DynFamily<F>> {
    let imp = family(m.family(), backend).map(F::implementation);
    let imp = imp.filter(|i| i.implements_backward(form)).ok_or_else(|| unavailable(m, form, backend))?;
    if m.form_unsupported(form).is_some() {
        return Err(unavailable(m, form, backend));
    }
    if let Some(why) = imp.backward_unsupported(m, backend, form)? {
        let mut err = unavailable(m, form, backend);
        if let Error::FormUnavailable { available, .. } = &mut err {
            *available = format!("{available} ({why})");
        }
        return Err(err);
    }
    Ok(imp)
}

/// A backward's gradients `out` kept for the given inputs in `requires`, after checking that
/// each of those has its gradient, of its input's shape.
pub(crate) fn wanted<F: Scalar>(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &Tensors<F>,
    requires: &Requires,
    mut out: Tensors<F>,
) -> Result<Tensors<F>> {
    out.retain(|k, _| k.strip_prefix("d_").is_some_and(|n| requires.wants(n) && inputs.contains_key(n)));
    for name in inputs.keys().filter(|n| requires.wants(n) && !is_saved_output(m, n)) {
        let g = out.get(&grad_name(name)).ok_or_else(|| Error::Backend {
            backend: backend.into(),
            family: Some(m.family().into()),
            message: format!("the {form} backward of `{}` returned no gradient for `{name}`", m.name()),
        })?;
        if g.shape() != inputs[name].shape() {
            return Err(Error::Backend {
                backend: backend.into(),
                family: Some(m.family().into()),
                message: format!(
                    "the {form} backward returned d_{name} of shape {}, expected {}",
                    fmt_shape_of(g),
                    fmt_shape_of(&inputs[name])
                ),
            });
        }
    }
    Ok(out)
}

fn backward_typed<F: Scalar>(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &Tensors<F>,
    dy: &ArrayD<F>,
    requires: &Requires,
    precision: Precision,
) -> Result<Tensors<F>> {
    check_dy(m, inputs, dy)?;
    let out = match form {
        Form::Materialized => {
            if !m.has_materialized_vjp() {
                return Err(unavailable(m, form, backend));
            }
            // The oracle recomputes everything: the saved output is not passed on.
            let mut inputs = Cow::Borrowed(inputs);
            if saved_output(m, &inputs).is_some() {
                inputs.to_mut().remove(SAVED_OUTPUT);
            }
            let (x, d) = at_boundary(&inputs, dy, precision);
            let x64 = mixer_core::tensor::tensors_to_f64(&x);
            let g = materialized_backward(m, &x64, &d.mapv(|x| x.f64()), requires)?;
            cast_tensors::<F>(&g)
        }
        f => {
            let imp = implementation::<F>(m, backend, f)?;
            let precise = match precision {
                Precision::Exact => None,
                p => imp.run_precise_backward(m, backend, f, inputs, dy, requires, p),
            };
            match precise {
                Some(g) => g?,
                None => {
                    let (x, d) = at_boundary(inputs, dy, precision);
                    imp.run_backward(m, backend, f, &x, &d, requires)
                        .ok_or_else(|| unavailable(m, f, backend))??
                }
            }
        }
    };
    wanted(m, backend, form, inputs, requires, out)
}

/// The gradients `d_<input>` of `m`'s output against `dy` (shape and dtype of `y`), by one
/// backward form on `backend`, for every given input in `requires`. Inputs are validated as
/// for the forward pass. The exact arithmetic: [`backward_with`] in [`Precision::Exact`].
pub fn backward(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &AnyTensors,
    dy: &Tensor,
    requires: &Requires,
) -> Result<BTreeMap<String, Tensor>> {
    backward_with(m, backend, form, inputs, dy, requires, Precision::Exact)
}

/// [`backward`] in a [`Precision`] mode, as [`crate::run::run_with`] is the forward in one:
/// `exact` is [`backward`]; `tf32` and `bf16` take `f32` inputs and `dy`. A backend backward
/// with its own handling of the mode ([`crate::Family::precise_backward`]) gets it; otherwise
/// `tf32` runs the exact backward and `bf16` converts at the boundary: the activations and `dy`
/// are rounded to bf16 and the backward runs in `f32` (the gradients are `f32`, not rounded).
pub fn backward_with(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &AnyTensors,
    dy: &Tensor,
    requires: &Requires,
    precision: Precision,
) -> Result<BTreeMap<String, Tensor>> {
    match (inputs, dy) {
        (AnyTensors::F64(t), Tensor::F64(d)) => {
            tagged(backward_typed_with(m, backend, form, t, d, requires, precision))
        }
        (AnyTensors::F32(t), Tensor::F32(d)) => {
            tagged(backward_typed_with(m, backend, form, t, d, requires, precision))
        }
        _ => Err(Error::Io(format!(
            "dy is {} but the inputs are {}; expected one dtype",
            dy.dtype().name(),
            inputs.dtype().name()
        ))),
    }
}

/// [`backward_with`] on inputs and `dy` of one known scalar type, read where they are (no
/// tagged copy).
pub fn backward_typed_with<F: Scalar>(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &Tensors<F>,
    dy: &ArrayD<F>,
    requires: &Requires,
    precision: Precision,
) -> Result<Tensors<F>> {
    check_precision(precision, F::DTYPE)?;
    mixer_core::mixer::validate_backward_typed(m, inputs)?;
    let given: Vec<String> = inputs.keys().cloned().collect();
    check_requires(m, &given, requires)?;
    backward_typed(m, backend, form, inputs, dy, requires, precision)
}

/// Typed gradients as dtype-tagged tensors.
fn tagged<F: Scalar>(g: Result<Tensors<F>>) -> Result<BTreeMap<String, Tensor>> {
    Ok(g?.into_iter().map(|(k, v)| (k, F::tag_one(v))).collect())
}

/// [`backward`] in a given scalar type from `f64` inputs and cotangent (cast first); the
/// gradients come back as `f64`.
pub fn backward_as(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &Tensors<f64>,
    dy: &ArrayD<f64>,
    dtype: DType,
    requires: &Requires,
) -> Result<Tensors<f64>> {
    let (any, d) = match dtype {
        DType::F64 => (AnyTensors::F64(inputs.clone()), Tensor::F64(dy.clone())),
        DType::F32 => (AnyTensors::F32(cast_tensors::<f32>(inputs)), Tensor::F32(dy.mapv(|x| x as f32))),
    };
    Ok(backward(m, backend, form, &any, &d, requires)?.into_iter().map(|(k, v)| (k, v.to_f64())).collect())
}
