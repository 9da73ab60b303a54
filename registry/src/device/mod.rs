//! Device tensors through the same contract as host arrays.
//!
//! A backend whose tensors can live on an accelerator registers its device-tensor forms in
//! the same [`FamilyEntry`](crate::FamilyEntry) as its host forms (the `device` field), and
//! its event timer in its [`BackendEntry`](crate::BackendEntry) (the `timer` field). The
//! registry knows nothing of a backend's tensor types: inputs, outputs and decoders cross this
//! contract as `dyn Any`, and each backend's typed entry points (e.g. `mixer_cuda::run_device`)
//! downcast to their own types. What the registry does is what it does for host arrays: it
//! decides whether a form is available ([`device_available`]: the mixer's restriction, the
//! family's host implementation and restriction, then the device forms), builds every "not
//! available" error, and dispatches ([`run_device`], [`decoder_device`]). Nothing above the
//! backend crates names a backend.
//!
//! Runs from a state ([`run_device_from_state`], [`backward_device_from_state`]) are available
//! where the host contract has them ([`crate::state`]) and the device forms implement them.
//!
//! `materialized` never runs on device tensors (it is the host `f64` oracle), and the
//! recurrent form runs through [`decoder_device`], one token at a time. Gradients on device
//! tensors ([`backward_device`]) are the `fast` form's backward, available where the family's
//! host implementation has it for the configuration ([`crate::backward::backward_forms`]).

use std::any::Any;

use mixer_core::mixer::Mixer;
use mixer_core::{AnyTensors, DType, Dims, Error, Form, Precision, Requires, Result};

use crate::backend::Backend;
use crate::run::why_not as host_why_not;

pub(crate) mod contract;
pub use contract::{DeviceForms, DeviceTimer, DeviceTiming};

/// The backend's name as errors about its device tensors give it.
fn device_name(backend: &Backend) -> String {
    format!("{} (device tensors)", backend.name())
}

/// Why `backend` cannot run `form` of `m` on device tensors, or `None` when it can.
fn why_not(m: &dyn Mixer, backend: &Backend, form: Form) -> Option<String> {
    if form == Form::Materialized {
        return Some("the materialized form is the host f64 oracle: run it on host arrays".into());
    }
    if let Some(why) = host_why_not(m, backend, form) {
        return Some(why);
    }
    let forms = backend.family(m.family()).and_then(|e| e.device);
    match forms {
        None => Some(format!(
            "backend `{}` has no device-tensor forms for the `{}` family (only host arrays)",
            backend.name(),
            m.family()
        )),
        Some(d) if !d.implements(form) => Some(format!(
            "backend `{}` has no {form} form on device tensors for the `{}` family",
            backend.name(),
            m.family()
        )),
        Some(_) => None,
    }
}

/// The forms of `m` that `backend` runs on device tensors (`recurrent` through
/// [`decoder_device`]), in report order.
pub fn device_forms(m: &dyn Mixer, backend: &Backend) -> Vec<Form> {
    Form::ALL.into_iter().filter(|&f| why_not(m, backend, f).is_none()).collect()
}

/// `Ok` when `backend` can run `form` of `m` on device tensors; otherwise the error that
/// says why and lists the forms that are available there.
pub fn device_available(m: &dyn Mixer, backend: &Backend, form: Form) -> Result<()> {
    match why_not(m, backend, form) {
        None => Ok(()),
        Some(why) => Err(unavailable(m, backend, form, &why)),
    }
}

/// The error for `form` of `m` not running on `backend`'s device tensors, with the reason and
/// the device forms that are available there.
fn unavailable(m: &dyn Mixer, backend: &Backend, form: Form, why: &str) -> Error {
    Error::FormUnavailable {
        mixer: m.name().to_string(),
        form: form.name().into(),
        backend: device_name(backend),
        available: format!(
            "{} ({why})",
            device_forms(m, backend).iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The device forms of `m`'s family on `backend`, once [`device_available`] said yes.
fn forms_of(m: &dyn Mixer, backend: &Backend, form: Form) -> Result<&'static dyn DeviceForms> {
    device_available(m, backend, form)?;
    backend
        .family(m.family())
        .and_then(|e| e.device)
        .ok_or_else(|| internal(m, backend, "the family entry disappeared"))
}

fn internal(m: &dyn Mixer, backend: &Backend, what: &str) -> Error {
    Error::Backend {
        backend: backend.name().into(),
        family: Some(m.family().into()),
        message: format!("internal: {what}"),
    }
}

/// The boxed result of a device form as the backend's type `T`.
fn unbox<T: Any>(m: &dyn Mixer, backend: &Backend, b: Box<dyn Any>) -> Result<T> {
    b.downcast::<T>().map(|t| *t).map_err(|_| {
        internal(
            m,
            backend,
            &format!("a device form returned another type than {}", std::any::type_name::<T>()),
        )
    })
}

/// Runs `form` (`parallel` or `fast`) of `m` on `backend`'s device tensors `inputs` (the
/// backend's own input map), in a precision mode, without waiting for the device. `T` is the
/// backend's output tensor type; `checks` as in [`DeviceForms::run`].
pub fn run_device<T: Any>(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &dyn Any,
    precision: Precision,
    checks: bool,
) -> Result<T> {
    if form == Form::Recurrent {
        return Err(unavailable(
            m,
            backend,
            form,
            "the recurrent form runs token by token through a device decoder",
        ));
    }
    let y = forms_of(m, backend, form)?.run(m, form, inputs, precision, checks)?;
    unbox(m, backend, y)
}

/// Whether `backend`'s device forms of `m`'s family save something for the backward
/// ([`run_device_saving`]); a static property of the registration (the backend is not probed:
/// [`Backend::registered`] will do), false where the backend has no device forms of the family.
pub fn device_saves(m: &dyn Mixer, backend: &Backend) -> bool {
    backend.family(m.family()).and_then(|e| e.device).is_some_and(|f| f.implements_saving())
}

/// The `fast` form of `m` on `backend`'s device tensors with what its backward may read instead
/// of running the forward again (`mixer_core::grad::SAVED_STATISTICS`, the backend's tensor `S`):
/// `(y, Some(saved))` where the family saves something in this configuration, else `(y, None)`
/// from the plain `fast` form. Without waiting for the device; `checks` as in
/// [`DeviceForms::run`].
pub fn run_device_saving<T: Any, S: Any>(
    m: &dyn Mixer,
    backend: &Backend,
    inputs: &dyn Any,
    precision: Precision,
    checks: bool,
) -> Result<(T, Option<S>)> {
    let forms = forms_of(m, backend, Form::Fast)?;
    if !forms.implements_saving() {
        return Ok((unbox(m, backend, forms.run(m, Form::Fast, inputs, precision, checks)?)?, None));
    }
    unbox(m, backend, forms.run_saving(m, inputs, precision, checks)?)
}

/// Why `backend` has no `fast` backward on device tensors for `m`, or `None`: the mixer's
/// restriction of the form, then the family's host backward and its restriction (the device
/// backward is built on the same contract), then the device forms.
fn backward_why_not(m: &dyn Mixer, backend: &Backend) -> Result<Option<String>> {
    let form = Form::Fast;
    if let Some(why) = host_why_not(m, backend, form) {
        return Ok(Some(why));
    }
    let Some(entry) = backend.family(m.family()) else {
        return Ok(Some(format!("backend `{}` has no `{}` family", backend.name(), m.family())));
    };
    if !entry.f64.implements_backward(form) {
        return Ok(Some(format!(
            "backend `{}` has no fast backward for the `{}` family",
            backend.name(),
            m.family()
        )));
    }
    if let Some(why) = entry.f64.backward_unsupported(m, backend.name(), form)? {
        return Ok(Some(why));
    }
    Ok(match entry.device {
        None => Some(format!(
            "backend `{}` has no device-tensor forms for the `{}` family (only host arrays)",
            backend.name(),
            m.family()
        )),
        Some(_) => None,
    })
}

/// The gradients of `m`'s `fast` form on `backend`'s device tensors: `inputs` the backend's
/// input map, `dy` its tensor of the output's cotangent (the shape of `y`), `requires` the
/// inputs whose gradients are wanted, in a precision mode; `T` is the backend's map of gradient
/// tensors (`d_<input>`). Returns without waiting for the device. The registry decides
/// availability and builds the error, as for [`crate::backward::backward`]; the backend checks
/// the tensors (their values unless `checks` is false, as in [`DeviceForms::run`]).
pub fn backward_device<T: Any>(
    m: &dyn Mixer,
    backend: &Backend,
    inputs: &dyn Any,
    dy: &dyn Any,
    requires: &Requires,
    precision: Precision,
    checks: bool,
) -> Result<T> {
    if let Some(why) = backward_why_not(m, backend)? {
        let list = crate::backward::backward_forms(m, backend.name())
            .into_iter()
            .filter(|&f| f == Form::Fast)
            .map(|f| f.name())
            .collect::<Vec<_>>();
        return Err(Error::FormUnavailable {
            mixer: m.name().to_string(),
            form: "fast (backward)".into(),
            backend: device_name(backend),
            available: format!(
                "{} ({why})",
                if list.is_empty() { "no backward form".to_string() } else { list.join(", ") }
            ),
        });
    }
    let d = backend
        .family(m.family())
        .and_then(|e| e.device)
        .ok_or_else(|| internal(m, backend, "the family entry disappeared"))?;
    let g = d.backward(m, inputs, dy, requires, precision, checks)?;
    unbox(m, backend, g)
}

/// Why `backend` cannot run `m`'s `fast` form from a state on device tensors (`backward`: its
/// backward from a state), or `None`: the host contract's reason first (the mixer has no state,
/// the family no `fast` form from a state or no backward of it, a restriction of the
/// configuration), then the device forms'.
fn state_why_not(m: &dyn Mixer, backend: &Backend, backward: bool) -> Option<String> {
    let host = if backward {
        crate::state::backward_available(m, backend, Form::Fast)
    } else {
        crate::state::available(m, backend, Form::Fast)
    };
    if let Err(e) = host {
        return Some(e.to_string());
    }
    match backend.family(m.family()).and_then(|e| e.device) {
        Some(d) if d.implements_state() && (!backward || d.implements_state_backward()) => None,
        Some(_) => Some(format!(
            "backend `{}` runs the `{}` family's {} from a state on host arrays only",
            backend.name(),
            m.family(),
            if backward { "backward" } else { "fast form" }
        )),
        None => Some(format!(
            "backend `{}` has no device-tensor forms for the `{}` family (only host arrays)",
            backend.name(),
            m.family()
        )),
    }
}

/// The device forms of `m`'s family on `backend` for a run from a state (`backward`: its
/// backward), once [`state_why_not`] said yes; otherwise the error that says why.
fn state_forms_of(m: &dyn Mixer, backend: &Backend, backward: bool) -> Result<&'static dyn DeviceForms> {
    if let Some(why) = state_why_not(m, backend, backward) {
        return Err(Error::FormUnavailable {
            mixer: m.name().to_string(),
            form: if backward { "fast (backward from a state)" } else { "fast (from a state)" }.into(),
            backend: device_name(backend),
            available: format!("none ({why})"),
        });
    }
    backend
        .family(m.family())
        .and_then(|e| e.device)
        .ok_or_else(|| internal(m, backend, "the family entry disappeared"))
}

/// Runs `m`'s `fast` form from the state `initial` (`None`: zeros) on `backend`'s device tensors
/// (`inputs` and `initial` the backend's maps of named tensors), without waiting for the device:
/// `T` is the backend's pair `(y, final state)`. The registry decides availability, as
/// [`crate::state::run_state`] does for host arrays; the backend checks the tensors and the
/// state's names and shapes (their values unless `checks` is false).
pub fn run_device_from_state<T: Any>(
    m: &dyn Mixer,
    backend: &Backend,
    inputs: &dyn Any,
    initial: Option<&dyn Any>,
    precision: Precision,
    checks: bool,
) -> Result<T> {
    let out = state_forms_of(m, backend, false)?.run_state(m, inputs, initial, precision, checks)?;
    unbox(m, backend, out)
}

/// The backward of [`run_device_from_state`]: from `dy` (the backend's tensor, the shape of `y`)
/// and `d_final` (`None`: zero), `T` is the backend's pair `(gradients d_<input> of the inputs
/// requires asks for, the initial state's gradient)`, the second empty without `initial`.
/// Returns without waiting for the device; availability as [`crate::state::backward_state`].
#[allow(clippy::too_many_arguments)]
pub fn backward_device_from_state<T: Any>(
    m: &dyn Mixer,
    backend: &Backend,
    inputs: &dyn Any,
    initial: Option<&dyn Any>,
    dy: &dyn Any,
    d_final: Option<&dyn Any>,
    requires: &Requires,
    precision: Precision,
    checks: bool,
) -> Result<T> {
    let d = state_forms_of(m, backend, true)?;
    let out = d.backward_state(m, inputs, initial, dy, d_final, requires, precision, checks)?;
    unbox(m, backend, out)
}

/// The launch plan of `form` of `m` on `backend`'s device tensors at the sizes `dims`, for
/// inputs of `dtype` in `precision` ([`DeviceForms::plan`]); `None` where the family reports
/// none.
pub fn device_plan(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    dims: &Dims,
    dtype: DType,
    precision: Precision,
) -> Result<Option<serde_json::Value>> {
    forms_of(m, backend, form)?.plan(m, form, dims, dtype, precision)
}

/// A decoder of `m` on `backend` whose state stays on the device; `T` is the backend's
/// decoder type (e.g. `Box<dyn mixer_cuda::DeviceDecoder>`). `statics` are the inputs without
/// a sequence axis, as host arrays; `dims` the bound sizes.
pub fn decoder_device<T: Any>(
    m: &dyn Mixer,
    backend: &Backend,
    statics: &AnyTensors,
    dims: &Dims,
) -> Result<T> {
    let d = forms_of(m, backend, Form::Recurrent)?.decoder(m, statics, dims)?;
    unbox(m, backend, d)
}

#[cfg(test)]
mod tests {
    //! The contract with a fake device backend: the registry finds its device forms through
    //! its `FamilyEntry`, decides availability and builds the errors, and hands the backend's
    //! own types through unchanged.
    use std::any::Any;

    use mixer_core::mixers::loglinear::LogLinear;
    use mixer_core::{AnyTensors, Dims, Form, Precision, Requires, Result, Tensors};
    use ndarray::ArrayD;

    use super::{DeviceForms, backward_device, decoder_device, device_forms, run_device};
    use crate::{Availability, Backend, BackendEntry, BackwardFn, Family, FamilyEntry, FormFn, register};

    /// A host form that is never run here (the device tests only ask whether it exists).
    fn host_fast<F: mixer_core::Real>(_: &LogLinear, _: &Tensors<F>) -> Result<ArrayD<F>> {
        unreachable!("the device tests never run a host form")
    }

    /// A host backward that is never run here (the device tests only ask whether it exists).
    fn host_backward<F: mixer_core::Real>(
        _: &LogLinear,
        _: &Tensors<F>,
        _: &ArrayD<F>,
        _: &Requires,
    ) -> Result<Tensors<F>> {
        unreachable!("the device tests never run a host backward")
    }

    struct HostFast;
    impl<F: mixer_core::Real> Family<F> for HostFast {
        type Mixer = LogLinear;
        fn fast(&self) -> Option<FormFn<LogLinear, F>> {
            Some(host_fast::<F>)
        }
        fn backward(&self, form: Form) -> Option<BackwardFn<LogLinear, F>> {
            (form == Form::Fast).then_some(host_backward::<F>)
        }
        fn backward_unsupported(&self, m: &LogLinear, _: Form) -> Option<String> {
            m.lift.is_some().then(|| "no lifted backward here".to_string())
        }
    }

    /// A host family with a forward and no backward.
    struct HostForwardOnly;
    impl<F: mixer_core::Real> Family<F> for HostForwardOnly {
        type Mixer = LogLinear;
        fn fast(&self) -> Option<FormFn<LogLinear, F>> {
            Some(host_fast::<F>)
        }
    }

    /// The fake backend's tensors: a list of names; its output: their count and the mode.
    struct FakeInputs(Vec<&'static str>);

    struct FakeDevice;
    impl DeviceForms for FakeDevice {
        fn implements(&self, form: Form) -> bool {
            form == Form::Fast
        }
        fn run(
            &self,
            _: &dyn Mixer,
            _: Form,
            x: &dyn Any,
            p: Precision,
            checks: bool,
        ) -> Result<Box<dyn Any>> {
            let x = x.downcast_ref::<FakeInputs>().expect("the fake backend's own inputs");
            Ok(Box::new(format!("{} inputs, {p}, checks {checks}", x.0.len())))
        }
        fn backward(
            &self,
            _: &dyn Mixer,
            x: &dyn Any,
            dy: &dyn Any,
            req: &Requires,
            p: Precision,
            checks: bool,
        ) -> Result<Box<dyn Any>> {
            let x = x.downcast_ref::<FakeInputs>().expect("the fake backend's own inputs");
            let dy = dy.downcast_ref::<&str>().expect("the fake backend's own dy");
            Ok(Box::new(format!("backward of {} inputs, dy {dy}, {req:?}, {p}, checks {checks}", x.0.len())))
        }
        fn decoder(&self, _: &dyn Mixer, _: &AnyTensors, _: &Dims) -> Result<Box<dyn Any>> {
            unreachable!("not implemented, so never called")
        }
    }
    use mixer_core::mixer::Mixer;

    fn unavailable() -> Availability {
        Availability::Unavailable("a test backend".into())
    }

    #[register]
    static FAKE: BackendEntry = BackendEntry {
        name: "test-device",
        doc: "fake device",
        priority: -100,
        probe: unavailable,
        timer: None,
        concurrent: false,
    };
    #[register]
    static FAKE_HOST_ONLY: BackendEntry = BackendEntry {
        name: "test-host-only",
        doc: "fake host",
        priority: -100,
        probe: unavailable,
        timer: None,
        concurrent: false,
    };
    #[register]
    static FAKE_LOGLINEAR: FamilyEntry = FamilyEntry {
        family: "loglinear",
        backend: "test-device",
        f64: &HostFast,
        f32: &HostFast,
        device: Some(&FakeDevice),
    };
    #[register]
    static FAKE_NO_BACKWARD: BackendEntry = BackendEntry {
        name: "test-device-no-backward",
        doc: "fake device without a backward",
        priority: -100,
        probe: unavailable,
        timer: None,
        concurrent: false,
    };
    #[register]
    static FAKE_NO_BACKWARD_LOGLINEAR: FamilyEntry = FamilyEntry {
        family: "loglinear",
        backend: "test-device-no-backward",
        f64: &HostForwardOnly,
        f32: &HostForwardOnly,
        device: Some(&FakeDevice),
    };
    #[register]
    static HOST_ONLY_LOGLINEAR: FamilyEntry = FamilyEntry {
        family: "loglinear",
        backend: "test-host-only",
        f64: &HostFast,
        f32: &HostFast,
        device: None,
    };

    fn mamba2() -> Box<dyn Mixer> {
        crate::mixer("mamba2", &serde_json::json!({})).unwrap()
    }

    #[test]
    fn the_registry_dispatches_to_the_device_forms_of_the_family_entry() {
        let (m, b) = (mamba2(), Backend::registered("test-device").unwrap());
        let y: String =
            run_device(m.as_ref(), &b, Form::Fast, &FakeInputs(vec!["q", "k"]), Precision::Tf32, false)
                .unwrap();
        assert_eq!(y, "2 inputs, tf32, checks false");
        assert_eq!(device_forms(m.as_ref(), &b), vec![Form::Fast]);
    }

    #[test]
    fn unavailable_device_forms_are_errors_built_by_the_registry() {
        let (m, b) = (mamba2(), Backend::registered("test-device").unwrap());
        let x = FakeInputs(vec![]);
        let msg = |form| {
            run_device::<String>(m.as_ref(), &b, form, &x, Precision::Exact, true).unwrap_err().to_string()
        };
        let parallel = msg(Form::Parallel);
        assert!(parallel.contains("test-device (device tensors)"), "{parallel}");
        assert!(parallel.contains("has no parallel form for the `loglinear` family"), "{parallel}");
        assert!(parallel.contains("available: fast") || parallel.contains("fast ("), "{parallel}");
        assert!(msg(Form::Materialized).contains("host f64 oracle"));
        assert!(msg(Form::Recurrent).contains("through a device decoder"));
        let dec =
            decoder_device::<String>(m.as_ref(), &b, &AnyTensors::F32(Default::default()), &Dims::new())
                .unwrap_err()
                .to_string();
        assert!(dec.contains("no recurrent form"), "{dec}");
        // The backend's output is not the type the caller asked for: an internal error, no panic.
        let wrong = run_device::<u8>(m.as_ref(), &b, Form::Fast, &x, Precision::Exact, true).unwrap_err();
        assert!(wrong.to_string().contains("another type than u8"), "{wrong}");
    }

    #[test]
    fn the_device_backward_is_dispatched_where_the_family_has_a_fast_backward() {
        let (m, b) = (mamba2(), Backend::registered("test-device").unwrap());
        let g: String = backward_device(
            m.as_ref(),
            &b,
            &FakeInputs(vec!["q", "k", "v"]),
            &"dy",
            &Requires::All,
            Precision::Bf16,
            false,
        )
        .unwrap();
        assert_eq!(g, "backward of 3 inputs, dy dy, All, bf16, checks false");
        // The family's restriction of the configuration: refused with its reason.
        let lifted = crate::mixer("loglinear-mamba2", &serde_json::json!({})).unwrap();
        let x = FakeInputs(vec![]);
        let e =
            backward_device::<String>(lifted.as_ref(), &b, &x, &"dy", &Requires::All, Precision::Exact, true)
                .unwrap_err()
                .to_string();
        assert!(e.contains("fast (backward)") && e.contains("no lifted backward here"), "{e}");
        assert!(e.contains("test-device (device tensors)"), "{e}");
        // No host backward: no device backward.
        let nb = Backend::registered("test-device-no-backward").unwrap();
        let e = backward_device::<String>(m.as_ref(), &nb, &x, &"dy", &Requires::All, Precision::Exact, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no fast backward for the `loglinear` family"), "{e}");
        // No device forms at all.
        let host = Backend::registered("test-host-only").unwrap();
        let e =
            backward_device::<String>(m.as_ref(), &host, &x, &"dy", &Requires::All, Precision::Exact, true)
                .unwrap_err()
                .to_string();
        assert!(e.contains("no device-tensor forms"), "{e}");
    }

    #[test]
    fn a_family_without_device_forms_says_so() {
        let (m, b) = (mamba2(), Backend::registered("test-host-only").unwrap());
        let e = run_device::<String>(m.as_ref(), &b, Form::Fast, &FakeInputs(vec![]), Precision::Exact, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no device-tensor forms for the `loglinear` family"), "{e}");
        assert!(device_forms(m.as_ref(), &b).is_empty());
    }
}
