//! Runs from a recurrent state on device tensors (docs/math.md §7): [`run_device_from_state`]
//! and [`backward_device_from_state`], for the families with a device form from a state
//! ([`DeviceFamily::fast_from_state`]: linear attention, Mamba-2 and gated DeltaNet). The state
//! and its gradient stay on the device; nothing waits for the stream.
//!
//! The registry decides availability (`mixer_registry::run_device_from_state`), as for host
//! arrays. This checks, on the host, what a plain device run checks (shapes, bounds, the mode's
//! dtypes) plus the state's names and shapes against the mixer's state (`Mixer::state_shapes`)
//! and its dtype: f64 with f64 inputs in the exact mode, else f32 (the bf16 mode keeps the state
//! in f32). The forward runs in the mode asked; the backward computes in the exact mode whatever
//! the mode (bf16 inputs and `dy` converted to f32; docs/math.md §7.1). Values (the inputs'
//! constraints, a finite state, `dy` and `d_final`, a finite `y`) are checked on the device and
//! reported when a result is read, unless `checks` is false.

use std::any::Any;
use std::sync::Arc;

use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::mixers::loglinear::state::STATE;
use mixer_core::state::{StateShapes, check_shapes};
use mixer_core::{Error, Precision, Requires, Result};
use mixer_registry::Backend;

use crate::device_run::{check_dy, check_on_host, finite_check, input_checks, output_check};
use crate::forms::DeviceFamily;
use crate::runtime::err;
use crate::tensor::{AnyDeviceTensor, Deferred, DeviceTensors, GpuReal};

/// The cotangents of a backward from a state: `dy` (the shape of `y`), `d_final` (the final
/// state's, named and shaped as the state; `None`: zero), and the inputs whose gradients are
/// wanted.
pub struct Cotangents<'a> {
    /// The output's cotangent.
    pub dy: &'a AnyDeviceTensor,
    /// The final state's cotangent, or `None` (zero).
    pub d_final: Option<&'a DeviceTensors>,
    /// The inputs whose gradients are wanted.
    pub requires: &'a Requires,
}

/// `y` and the final state of `m`'s `fast` form from the state `initial` (`None`: zeros) on
/// device tensors, in the mode `precision` (the state `f64` with `f64` inputs, else `f32`).
/// Returns at once; the results carry the deferred value checks. The registry decides
/// availability.
pub fn run_device_from_state(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    initial: Option<&DeviceTensors>,
    precision: Precision,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    run_device_from_state_with(m, inputs, initial, precision, true)
}

/// [`run_device_from_state`] with the device-side value checks left out when `checks` is false
/// (as `run_device_with`).
pub fn run_device_from_state_with(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    initial: Option<&DeviceTensors>,
    precision: Precision,
    checks: bool,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    let cuda = Backend::by_name("cuda")?;
    mixer_registry::run_device_from_state(m, &cuda, inputs, initial.map(|s| s as &dyn Any), precision, checks)
}

/// The backward of [`run_device_from_state`]: the gradients `d_<input>` of every given input
/// `requires` asks for and, with `initial`, the initial state's gradient (keyed as the state's
/// tensors; empty without it), from `dy` and `d_final` (`None`: zero). Returns at once.
pub fn backward_device_from_state(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    initial: Option<&DeviceTensors>,
    dy: &AnyDeviceTensor,
    d_final: Option<&DeviceTensors>,
    requires: &Requires,
    precision: Precision,
) -> Result<(DeviceTensors, DeviceTensors)> {
    let c = Cotangents { dy, d_final, requires };
    backward_device_from_state_with(m, inputs, initial, c, precision, true)
}

/// [`backward_device_from_state`] with the cotangents as one argument and the device-side value
/// checks left out when `checks` is false.
pub fn backward_device_from_state_with(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    initial: Option<&DeviceTensors>,
    c: Cotangents<'_>,
    precision: Precision,
    checks: bool,
) -> Result<(DeviceTensors, DeviceTensors)> {
    let cuda = Backend::by_name("cuda")?;
    mixer_registry::backward_device_from_state(
        m,
        &cuda,
        inputs,
        initial.map(|s| s as &dyn Any),
        c.dy as &dyn Any,
        c.d_final.map(|s| s as &dyn Any),
        c.requires,
        precision,
        checks,
    )
}

/// [`crate::device_run::Device`]'s `run_state`: the checks, the run, the deferred checks.
pub(crate) fn run<T: DeviceFamily<f32> + DeviceFamily<f64>>(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    initial: Option<&DeviceTensors>,
    precision: Precision,
    checks: bool,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    let double = check(m, inputs, &[("initial_state", initial)], precision)?;
    let mut deferred =
        if checks { value_checks(m, inputs, &[("initial_state", initial)])? } else { Vec::new() };
    let (y, fin) = if double {
        typed_run::<f64, T>(m, inputs, initial, precision)
    } else {
        typed_run::<f32, T>(m, inputs, initial, precision)
    }?;
    if checks {
        let what = format!("`{}` fast form from a state on cuda", m.name());
        deferred.push(output_check(&y, what, "every input and the state are")?);
    }
    let fin = fin.into_iter().map(|(k, v)| (k, v.with_checks(deferred.iter().cloned()))).collect();
    Ok((y.with_checks(deferred), fin))
}

/// [`crate::device_run::Device`]'s `backward_state`: the checks, the backward, the deferred
/// checks; the gradients of the inputs `requires` asks for.
pub(crate) fn backward<T: DeviceFamily<f32> + DeviceFamily<f64>>(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    initial: Option<&DeviceTensors>,
    c: Cotangents<'_>,
    precision: Precision,
    checks: bool,
) -> Result<(DeviceTensors, DeviceTensors)> {
    let states = [("initial_state", initial), ("d_final", c.d_final)];
    let double = check(m, inputs, &states, precision)?;
    let given: Vec<String> = inputs.keys().cloned().collect();
    mixer_registry::backward::check_requires(m, &given, c.requires)?;
    check_dy(m, inputs, c.dy, precision, double)?;
    let mut deferred = Vec::new();
    if checks {
        deferred = value_checks(m, inputs, &states)?;
        deferred.push(finite_check("dy", c.dy)?);
    }
    let (grads, ds) = if double {
        typed_backward::<f64, T>(m, inputs, initial, &c, precision)
    } else {
        typed_backward::<f32, T>(m, inputs, initial, &c, precision)
    }?;
    let wanted =
        |k: &str| k.strip_prefix("d_").is_some_and(|n| c.requires.wants(n) && inputs.contains_key(n));
    let grads = grads
        .into_iter()
        .filter(|(k, _)| wanted(k))
        .map(|(k, v)| (k, v.with_checks(deferred.iter().cloned())))
        .collect();
    let ds = ds.into_iter().map(|(k, v)| (k, v.with_checks(deferred.iter().cloned()))).collect();
    Ok((grads, ds))
}

/// A packed batch (`cu_seqlens`, `B = 1`; offsets checked) in one launch sequence where the family
/// has one (`crate::loglinear::packed`: linear attention and Mamba-2 with f32 arithmetic),
/// with the checks of a run: the inputs as for a plain run of the whole buffer, `initial` against
/// the mixer's state with a row per sequence, the deferred value checks. `None` where there is no
/// such path for these inputs (the caller runs the sequences one by one); the final states have a
/// row per sequence.
pub(crate) fn run_packed(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    cu_seqlens: &[usize],
    initial: Option<&DeviceTensors>,
    want_final: bool,
    precision: Precision,
    checks: bool,
) -> Result<Option<(AnyDeviceTensor, Option<DeviceTensors>)>> {
    let Some(ll) = m.as_any().downcast_ref::<LogLinear>() else {
        return Ok(None);
    };
    let states = [("initial_state", initial)];
    let rows = cu_seqlens.len().saturating_sub(1);
    if check_rows(m, inputs, &states, precision, Some(rows))? {
        return Ok(None);
    }
    let s0 = initial.map(|s| crate::forms::input::<f32>(s, STATE)).transpose()?;
    let stateful = initial.is_some() || want_final;
    let Some((y, fin)) =
        crate::loglinear::packed::run(ll, inputs, cu_seqlens, s0.as_deref(), stateful, precision)?
    else {
        return Ok(None);
    };
    let mut deferred = if checks { value_checks(m, inputs, &states)? } else { Vec::new() };
    if checks {
        let what = format!("`{}` fast form over a packed batch on cuda", m.name());
        deferred.push(output_check(&y, what, "every input and the state are")?);
    }
    let fin = fin.map(|f| {
        let f = AnyDeviceTensor::F32(f).with_checks(deferred.iter().cloned());
        [(STATE.to_string(), f)].into_iter().collect()
    });
    Ok(Some((y.with_checks(deferred), fin)))
}

/// The host-side checks of a call from a state: the inputs as for a plain run in the mode, and
/// each given state (`(name in errors, tensors)`) against the mixer's state at these sizes: its
/// names, shapes and dtype (`f64` with `f64` inputs, else `f32`). Returns whether the call
/// computes in `f64`.
fn check(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    states: &[(&str, Option<&DeviceTensors>)],
    precision: Precision,
) -> Result<bool> {
    check_rows(m, inputs, states, precision, None)
}

/// [`check`], with the states' batch axis `rows` where given (a packed batch: one row per
/// sequence) instead of the inputs'.
fn check_rows(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    states: &[(&str, Option<&DeviceTensors>)],
    precision: Precision,
    rows: Option<usize>,
) -> Result<bool> {
    let double = check_on_host(m, inputs, precision)?;
    let shapes = inputs.iter().map(|(k, v)| (k.clone(), v.shape().to_vec())).collect();
    let mut dims = m.spec().bind(&shapes)?;
    if let Some(rows) = rows {
        dims.insert("B", rows);
    }
    let elem = if double { "f64" } else { "f32" };
    for &(what, state) in states {
        let Some(s) = state else { continue };
        let given: StateShapes = s.iter().map(|(k, v)| (k.clone(), v.shape().to_vec())).collect();
        let want = mixer_registry::state::shapes(m, &dims, Some(&given))?;
        check_shapes(what, &want, &given)?;
        if let Some((k, t)) = s.iter().find(|(_, t)| t.dtype() != elem) {
            return Err(Error::Value {
                name: format!("{what}.{k}"),
                constraint: format!("a {elem} device tensor (the state is f64 with f64 inputs, else f32)"),
                found: format!("a {} device tensor", t.dtype()),
            });
        }
    }
    Ok(double)
}

/// The device-side checks of the inputs' value constraints and of every given state's
/// finiteness.
fn value_checks(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    states: &[(&str, Option<&DeviceTensors>)],
) -> Result<Vec<Arc<Deferred>>> {
    let mut out = input_checks(&m.spec(), inputs)?;
    for &(what, state) in states {
        for (k, t) in state.into_iter().flatten() {
            out.push(finite_check(&format!("{what}.{k}"), t)?);
        }
    }
    Ok(out)
}

fn typed_run<F: GpuReal, T: DeviceFamily<F>>(
    m: &dyn Mixer,
    x: &DeviceTensors,
    s0: Option<&DeviceTensors>,
    p: Precision,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    let f = T::fast_from_state().ok_or_else(|| err(m.family(), "internal: no device form from a state"))?;
    f(downcast::<T::Mixer>(m, "cuda")?, x, s0, p)
}

fn typed_backward<F: GpuReal, T: DeviceFamily<F>>(
    m: &dyn Mixer,
    x: &DeviceTensors,
    s0: Option<&DeviceTensors>,
    c: &Cotangents<'_>,
    p: Precision,
) -> Result<(DeviceTensors, DeviceTensors)> {
    let f = T::fast_backward_from_state()
        .ok_or_else(|| err(m.family(), "internal: no device backward from a state"))?;
    f(downcast::<T::Mixer>(m, "cuda")?, x, s0, c.dy, c.d_final, c.requires, p)
}
