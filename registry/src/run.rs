//! Running a form of a mixer on a backend: validation, the one place that decides whether a
//! backend can run a form, dispatch, and the generic forms (`materialized` through the
//! oracle, `recurrent` through the decoder).

use std::borrow::Cow;

use mixer_core::mixer::{Decoder, Mixer, run_decoder};
use mixer_core::precision::{ACTIVATIONS, round_bf16};
use mixer_core::tensor::cast_tensors;
use mixer_core::{AnyTensors, DType, Dims, Error, Form, Precision, Result, Tensor, Tensors, oracle};
use ndarray::ArrayD;

use crate::backend::Backend;
use crate::family::{DynFamily, Scalar};

/// Why `backend` cannot run `form` of `m`, or `None` when it can. In order: the mixer's own
/// restriction ([`Mixer::form_unsupported`]), a missing family implementation, a form the
/// implementation lacks, and the implementation's restriction for this configuration.
/// `materialized` (the oracle) only depends on the mixer.
pub(crate) fn why_not(m: &dyn Mixer, backend: &Backend, form: Form) -> Option<String> {
    if let Some(why) = m.form_unsupported(form) {
        return Some(why);
    }
    if form == Form::Materialized {
        return None;
    }
    let Some(entry) = backend.family(m.family()) else {
        return Some(format!(
            "backend `{}` implements no form of the `{}` family",
            backend.name(),
            m.family()
        ));
    };
    if !entry.f64.implements(form) {
        return Some(format!(
            "backend `{}` has no {form} form for the `{}` family",
            backend.name(),
            m.family()
        ));
    }
    match entry.f64.unsupported(m, backend.name(), form) {
        Ok(why) => why,
        Err(e) => Some(e.to_string()),
    }
}

/// The forms of `m` that `backend` can run, in report order.
pub fn forms(m: &dyn Mixer, backend: &Backend) -> Vec<Form> {
    Form::ALL.into_iter().filter(|&f| why_not(m, backend, f).is_none()).collect()
}

/// `Ok` when `backend` can run `form` of `m`; otherwise the error that says why and lists the
/// forms that are available there.
pub fn available(m: &dyn Mixer, backend: &Backend, form: Form) -> Result<()> {
    match why_not(m, backend, form) {
        None => Ok(()),
        Some(why) => Err(Error::FormUnavailable {
            mixer: m.name().to_string(),
            form: form.name().into(),
            backend: backend.name().into(),
            available: format!(
                "{} ({why})",
                forms(m, backend).iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
            ),
        }),
    }
}

/// The implementation of `m`'s family on `backend` for `F`, once [`available`] said yes.
fn implementation<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
) -> Result<&'static dyn DynFamily<F>> {
    available(m, backend, form)?;
    family_of(m, backend)
}

/// The implementation of `m`'s family on `backend` for `F`, once an availability check said
/// yes (an internal error when the entry is gone).
pub(crate) fn family_of<F: Scalar>(m: &dyn Mixer, backend: &Backend) -> Result<&'static dyn DynFamily<F>> {
    backend.family(m.family()).map(F::implementation).ok_or_else(|| Error::Backend {
        backend: backend.name().into(),
        family: Some(m.family().into()),
        message: "internal: the family entry disappeared".into(),
    })
}

/// The error for an implementation that declared a form and then did not run it.
fn not_run(m: &dyn Mixer, backend: &Backend, form: Form) -> Error {
    Error::Backend {
        backend: backend.name().into(),
        family: Some(m.family().into()),
        message: format!("the {form} form is declared for f64 but not for this scalar type"),
    }
}

/// The oracle: materialize in `f64` and solve.
pub fn oracle(m: &dyn Mixer, inputs: &Tensors<f64>) -> Result<ArrayD<f64>> {
    let shapes = inputs.iter().map(|(k, v)| (k.clone(), v.shape().to_vec())).collect();
    mixer_core::memory::guard(m, Form::Materialized, &m.spec().bind(&shapes)?, mixer_core::DType::F64)?;
    let mat = m.materialize(inputs)?;
    let x = mixer_core::tensor::get(inputs, m.spec().mixed)?;
    oracle::solve(&mat, x)
}

/// Builds a decoder of `m` on `backend` from the full inputs' static part and sizes.
pub fn decoder<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    inputs: &Tensors<F>,
    dims: &Dims,
) -> Result<Box<dyn Decoder<F>>> {
    let imp = implementation::<F>(m, backend, Form::Recurrent)?;
    mixer_core::memory::guard(m, Form::Recurrent, dims, F::DTYPE)?;
    let per_token = m.spec().per_token();
    let statics: Tensors<F> =
        inputs.iter().filter(|(k, _)| !per_token.contains(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    imp.decoder(m, backend.name(), &statics, dims)
        .unwrap_or_else(|| Err(not_run(m, backend, Form::Recurrent)))
}

fn run_typed<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &Tensors<F>,
    dims: &Dims,
) -> Result<ArrayD<F>> {
    match form {
        Form::Materialized => {
            available(m, backend, form)?;
            let x64 = mixer_core::tensor::tensors_to_f64(inputs);
            Ok(oracle(m, &x64)?.mapv(F::of))
        }
        Form::Recurrent => {
            let mut dec = decoder::<F>(m, backend, inputs, dims)?;
            run_decoder(dec.as_mut(), &m.spec(), inputs, |_, _| {})
        }
        f => implementation::<F>(m, backend, f)?
            .run(m, backend.name(), f, inputs)
            .unwrap_or_else(|| Err(not_run(m, backend, f))),
    }
}

/// Runs one form of `m` on `backend`, after checking shapes and value constraints.
/// The output `y` has the dtype of the inputs and the shape of the mixed input.
pub fn run(m: &dyn Mixer, backend: &Backend, form: Form, inputs: &AnyTensors) -> Result<Tensor> {
    run_with(m, backend, form, inputs, Precision::Exact)
}

/// Runs in a given scalar type from `f64` inputs (cast first); returns `f64`.
pub fn run_as(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &Tensors<f64>,
    dtype: DType,
) -> Result<ArrayD<f64>> {
    let any = match dtype {
        DType::F64 => AnyTensors::F64(inputs.clone()),
        DType::F32 => AnyTensors::F32(cast_tensors::<f32>(inputs)),
    };
    run(m, backend, form, &any).map(|t| t.to_f64())
}

/// Runs one form of `m` on `backend` in a [`Precision`] mode (see [`mixer_core::precision`]):
/// `exact` is [`run`]; `tf32` and `bf16` take `f32` inputs. A backend form with its own
/// handling of the mode ([`crate::Family::precise`]) gets it; otherwise `tf32` runs the exact
/// form (the mode permits tensor cores, it does not require them) and `bf16` converts at the
/// boundary: the activations are rounded to bf16, the form runs in `f32`, and `y` is rounded
/// to bf16.
pub fn run_with(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &AnyTensors,
    precision: Precision,
) -> Result<Tensor> {
    match inputs {
        AnyTensors::F64(t) => run_typed_with(m, backend, form, t, precision).map(Tensor::F64),
        AnyTensors::F32(t) => run_typed_with(m, backend, form, t, precision).map(Tensor::F32),
    }
}

/// [`run_with`] on inputs of one known scalar type, read where they are (no tagged copy).
pub fn run_typed_with<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &Tensors<F>,
    precision: Precision,
) -> Result<ArrayD<F>> {
    check_precision(precision, F::DTYPE)?;
    let dims = mixer_core::mixer::validate_typed(m, inputs)?;
    mixer_core::memory::guard(m, form, &dims, F::DTYPE)?;
    let y = match F::as_f32(inputs) {
        Some(x) if precision != Precision::Exact => {
            let y = run_reduced(m, backend, form, x, &dims, precision)?;
            F::untag(Tensor::F32(y)).ok_or_else(|| Error::Backend {
                backend: backend.name().into(),
                family: Some(m.family().into()),
                message: "internal: an f32 output did not come back as f32".into(),
            })?
        }
        _ => run_typed::<F>(m, backend, form, inputs, &dims)?,
    };
    mixer_core::mixer::check_output_typed(m, form, backend.name(), &y)?;
    Ok(y)
}

/// An error unless `precision` is `exact` or the inputs are `f32` (the `tf32` and `bf16` modes
/// take `f32` inputs).
pub(crate) fn check_precision(precision: Precision, dtype: DType) -> Result<()> {
    if precision != Precision::Exact && dtype != DType::F32 {
        return Err(Error::Value {
            name: "precision".into(),
            constraint: format!("the {precision} mode takes f32 inputs"),
            found: format!("{} inputs", dtype.name()),
        });
    }
    Ok(())
}

/// `f32` inputs in the `tf32` or `bf16` mode: the backend's own handling of the mode when it
/// has one, else the exact form (`tf32`) or the conversion at the boundary (`bf16`).
fn run_reduced(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    x: &Tensors<f32>,
    dims: &Dims,
    precision: Precision,
) -> Result<ArrayD<f32>> {
    let precise = match form {
        Form::Parallel | Form::Fast => {
            implementation::<f32>(m, backend, form)?.run_precise(m, backend.name(), form, x, precision)
        }
        Form::Materialized | Form::Recurrent => None,
    };
    match precise {
        Some(y) => y,
        None if precision == Precision::Bf16 => {
            Ok(run_typed::<f32>(m, backend, form, &bf16_activations(x), dims)?.mapv(round_bf16))
        }
        None => run_typed::<f32>(m, backend, form, x, dims),
    }
}

/// The inputs with their activations ([`ACTIVATIONS`]) rounded to bf16: what a `bf16` call
/// stores.
pub fn bf16_activations<F: mixer_core::Real>(x: &Tensors<F>) -> Tensors<F> {
    x.iter()
        .map(|(k, v)| {
            let v = if ACTIVATIONS.contains(&k.as_str()) { v.mapv(bf16_value) } else { v.clone() };
            (k.clone(), v)
        })
        .collect()
}

/// The inputs as a call in `precision` stores them where the mode is handled at the boundary:
/// [`bf16_activations`] in `bf16`, as given otherwise.
pub(crate) fn stored<F: mixer_core::Real>(x: &Tensors<F>, precision: Precision) -> Cow<'_, Tensors<F>> {
    if precision == Precision::Bf16 { Cow::Owned(bf16_activations(x)) } else { Cow::Borrowed(x) }
}

/// `x` rounded to the nearest bf16 number (through `f32`, ties to even).
pub fn bf16_value<F: mixer_core::Real>(x: F) -> F {
    F::of(f64::from(round_bf16(x.f64() as f32)))
}
