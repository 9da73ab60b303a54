//! The contract a backend's device forms and timer implement ([`DeviceForms`], [`DeviceTimer`]):
//! what [`FamilyEntry`](crate::FamilyEntry) and [`BackendEntry`](crate::BackendEntry) store, with
//! the backend's tensor types erased to `dyn Any`. The dispatch over it is the parent module's.

use std::any::Any;

use mixer_core::mixer::Mixer;
use mixer_core::{AnyTensors, DType, Dims, Error, Form, Precision, Requires, Result, Tensor};
use serde::Serialize;

/// A backend's forms of one family on its own device tensors, with the tensor types erased.
///
/// `inputs` is the backend's map of named device tensors; `run` returns the backend's output
/// tensor and `decoder` its device decoder (a `Box<dyn …>` of the backend's decoder trait),
/// each boxed as `dyn Any`. Shapes, dtypes and value constraints are the backend's to check
/// (it can read its tensors); availability is the registry's.
pub trait DeviceForms: Send + Sync {
    /// Whether `form` (`parallel` or `fast`; `recurrent` for the decoder) has a device form.
    fn implements(&self, form: Form) -> bool;
    /// Runs `form` on device tensors; returns without waiting for the device. With `checks`
    /// false, the device-side value checks of the inputs and of `y` are left out (shapes and
    /// dtypes are still checked): for timing loops over inputs a checked call has validated.
    fn run(
        &self,
        m: &dyn Mixer,
        form: Form,
        inputs: &dyn Any,
        precision: Precision,
        checks: bool,
    ) -> Result<Box<dyn Any>>;
    /// The `fast` form's backward on device tensors: `inputs` as for `run`, `dy` the backend's
    /// tensor of the output's cotangent; returns the backend's map of the gradients `d_<input>`
    /// (every given input `requires` asks for), without waiting for the device. Called only where
    /// the registry found the backward available; a backend without one keeps this default,
    /// which says so. `checks` as in [`DeviceForms::run`] (for the inputs and `dy`).
    fn backward(
        &self,
        m: &dyn Mixer,
        _inputs: &dyn Any,
        _dy: &dyn Any,
        _requires: &Requires,
        _precision: Precision,
        _checks: bool,
    ) -> Result<Box<dyn Any>> {
        Err(absent(m, "have no backward"))
    }
    /// Whether [`DeviceForms::run_saving`] saves anything for the backward (else the registry
    /// runs the plain `fast` form and saves nothing).
    fn implements_saving(&self) -> bool {
        false
    }
    /// The `fast` form on device tensors, also returning what its backward may read instead of
    /// running the forward again (`mixer_core::grad::SAVED_STATISTICS`): the backend's pair
    /// `(y, Option<saved tensor>)`, without waiting for the device. Called only where
    /// [`DeviceForms::implements_saving`] holds and the `fast` form is available; `checks` as in
    /// [`DeviceForms::run`].
    fn run_saving(
        &self,
        m: &dyn Mixer,
        _inputs: &dyn Any,
        _precision: Precision,
        _checks: bool,
    ) -> Result<Box<dyn Any>> {
        Err(absent(m, "save nothing for the backward"))
    }
    /// Whether the `fast` form runs from a state on device tensors ([`DeviceForms::run_state`],
    /// and [`DeviceForms::backward_state`] where the family has the backward from a state).
    fn implements_state(&self) -> bool {
        false
    }
    /// Whether [`DeviceForms::backward_state`] runs too (where the family has the backward from
    /// a state on host arrays): the forward's answer unless the backend says otherwise.
    fn implements_state_backward(&self) -> bool {
        self.implements_state()
    }
    /// The `fast` form from the state `initial` (the backend's map of the state's tensors, named
    /// and shaped as the mixer's state; `None`: zeros) on device tensors: the backend's pair
    /// `(y, final state)`, without waiting for the device. Called only where the registry found
    /// it available; `checks` as in [`DeviceForms::run`] (for the inputs and the state).
    fn run_state(
        &self,
        m: &dyn Mixer,
        _inputs: &dyn Any,
        _initial: Option<&dyn Any>,
        _precision: Precision,
        _checks: bool,
    ) -> Result<Box<dyn Any>> {
        Err(no_device_state(m))
    }
    /// The backward of [`DeviceForms::run_state`]: from the cotangents `dy` (the backend's tensor,
    /// the shape of `y`) and `d_final` (a map like the state; `None`: zero), the backend's pair
    /// `(d_<input> for every given input requires asks for, the initial state's gradient)`, the
    /// second empty without `initial`; without waiting for the device.
    #[allow(clippy::too_many_arguments)]
    fn backward_state(
        &self,
        m: &dyn Mixer,
        _inputs: &dyn Any,
        _initial: Option<&dyn Any>,
        _dy: &dyn Any,
        _d_final: Option<&dyn Any>,
        _requires: &Requires,
        _precision: Precision,
        _checks: bool,
    ) -> Result<Box<dyn Any>> {
        Err(no_device_state(m))
    }
    /// A decoder whose state stays on the device, from the static inputs (host arrays) and the
    /// bound sizes.
    fn decoder(&self, m: &dyn Mixer, statics: &AnyTensors, dims: &Dims) -> Result<Box<dyn Any>>;
    /// The launch plan `run` would use for `form` at these sizes, element type and mode
    /// (which kernels, tiles, shared memory), as JSON: what `mixers plan` prints and tuning
    /// harnesses read instead of re-deriving it. `None` where the family reports no plan.
    fn plan(
        &self,
        _m: &dyn Mixer,
        _form: Form,
        _dims: &Dims,
        _dtype: DType,
        _precision: Precision,
    ) -> Result<Option<serde_json::Value>> {
        Ok(None)
    }
}

/// The error of an entry point that a backend's device forms do not implement: these forms
/// `what`.
fn absent(m: &dyn Mixer, what: &str) -> Error {
    Error::Backend {
        backend: "device".into(),
        family: Some(m.family().into()),
        message: format!("internal: these device forms {what}"),
    }
}

/// The error of a state entry point that a backend's device forms do not implement.
fn no_device_state(m: &dyn Mixer) -> Error {
    absent(m, "do not run from a state")
}

/// Event-timed runs of one form on device-resident inputs, in seconds.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceTiming {
    /// Median kernel time of one run.
    pub median: f64,
    /// Fastest run.
    pub min: f64,
    /// Slowest run.
    pub max: f64,
    /// Timed runs.
    pub reps: usize,
    /// Host→device copy of all inputs (once).
    pub upload_s: f64,
    /// Device→host copy of `y` (once, wall clock, the device idle before).
    pub download_s: f64,
}

/// A backend's timer of its device forms (device events around the launches, inputs resident
/// on the device), for `mixers bench`. Registered in the backend's
/// [`BackendEntry`](crate::BackendEntry); a backend without one is timed on the host clock.
pub trait DeviceTimer: Send + Sync {
    /// Times `form` (`parallel` or `fast`) of `m` on device-resident copies of `inputs`: one
    /// checked warm-up run, then up to `reps` timed runs within `budget_s` seconds.
    fn time_form(
        &self,
        m: &dyn Mixer,
        form: Form,
        inputs: &AnyTensors,
        precision: Precision,
        reps: usize,
        budget_s: f64,
    ) -> Result<DeviceTiming>;
    /// Times the `fast` backward of `m` (every input's gradient, [`backward_device`]) on
    /// device-resident copies of `inputs` and `dy`, uploaded once: one warm-up run, then up to
    /// `reps` timed runs within `budget_s` seconds; the timing's `download_s` is that of all
    /// the gradients.
    fn time_backward(
        &self,
        m: &dyn Mixer,
        inputs: &AnyTensors,
        dy: &Tensor,
        precision: Precision,
        reps: usize,
        budget_s: f64,
    ) -> Result<DeviceTiming>;
    /// Times decoding every token of `inputs` with the device decoder; also returns the final
    /// cache size in scalars.
    fn time_decode(
        &self,
        m: &dyn Mixer,
        inputs: &AnyTensors,
        dims: &Dims,
        reps: usize,
        budget_s: f64,
    ) -> Result<(DeviceTiming, usize)>;
    /// The device's name and the driver's version, for reports.
    fn device_info(&self) -> Result<(String, Option<String>)>;
}

impl std::fmt::Debug for dyn DeviceTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceTimer")
    }
}
