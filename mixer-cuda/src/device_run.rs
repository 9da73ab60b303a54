//! Running a mixer on device tensors: [`run_device`] for whole sequences and
//! [`decoder_device`] for token-by-token decoding, for callers whose activations stay on the
//! GPU. Both are asynchronous: they enqueue work on the backend's stream ([`stream`]) and
//! return; reading a result ([`crate::DeviceTensor::to_host`]) waits.
//!
//! The registry decides availability, exactly as for host arrays. Shapes are checked on the
//! host before anything is enqueued; the value constraints of the inputs (finite, `g ≤ 0`,
//! `β ∈ [0, 1]`, …) and the finiteness of `y` are checked by kernels on the stream and
//! reported when the result is read ([`crate::tensor::Deferred`]).

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use mixer_core::grad::{SAVED_OUTPUT, SAVED_STATISTICS, is_saved_output, takes_saved_output};
use mixer_core::mixer::{Mixer, downcast};
use mixer_core::spec::{Constraint, InputSpec};
use mixer_core::{AnyTensors, DType, Dims, Error, Form, Precision, Requires, Result, Tensors};
use mixer_registry::{Backend, DeviceForms};

use crate::forms::{DeviceDecoder, DeviceFamily};
use crate::kernels;
use crate::runtime::{err, gpu, grid1, launch};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, Deferred, DeviceScalar, DeviceTensor, DeviceTensors, bf16};

/// The calling thread's stream (the backend's own outside [`crate::runtime::on_stream`]): order
/// a caller's own kernels and copies with ours by enqueuing them on it (or by waiting on events
/// recorded on it).
pub fn stream() -> Result<Arc<CudaStream>> {
    Ok(gpu()?.stream())
}

/// A family's device forms ([`DeviceFamily`] for `f32` and `f64`) as the registry's
/// [`DeviceForms`]: what a family's `FamilyEntry` names in its `device` field, next to
/// [`crate::forms::Hosted`] for host arrays. The registry decides availability and builds
/// the errors; this checks the device tensors (shapes, dtypes, deferred value checks) and
/// runs the form.
pub struct Device<T>(pub T);

impl<T: DeviceFamily<f32> + DeviceFamily<f64>> DeviceForms for Device<T> {
    fn implements(&self, form: Form) -> bool {
        match form {
            Form::Parallel => <T as DeviceFamily<f32>>::parallel().is_some(),
            Form::Fast => <T as DeviceFamily<f32>>::fast().is_some(),
            Form::Recurrent => <T as DeviceFamily<f32>>::decoder().is_some(),
            Form::Materialized => false,
        }
    }

    fn run(
        &self,
        m: &dyn Mixer,
        form: Form,
        inputs: &dyn Any,
        precision: Precision,
        checks: bool,
    ) -> Result<Box<dyn Any>> {
        let inputs = tensors(inputs, "inputs")?;
        let (y, ()) = checked(m, inputs, precision, checks, form, |double| {
            Ok((run_erased::<T>(m, form, inputs, precision, double)?, ()))
        })?;
        Ok(Box::new(y))
    }

    fn implements_saving(&self) -> bool {
        <T as DeviceFamily<f32>>::fast_saving().is_some()
    }

    fn run_saving(
        &self,
        m: &dyn Mixer,
        inputs: &dyn Any,
        precision: Precision,
        checks: bool,
    ) -> Result<Box<dyn Any>> {
        let inputs = tensors(inputs, "inputs")?;
        let out = checked(m, inputs, precision, checks, Form::Fast, |double| {
            if double {
                typed_saving::<f64, T>(m, inputs, precision)
            } else {
                typed_saving::<f32, T>(m, inputs, precision)
            }
        })?;
        Ok(Box::new(out))
    }

    fn backward(
        &self,
        m: &dyn Mixer,
        inputs: &dyn Any,
        dy: &dyn Any,
        requires: &Requires,
        precision: Precision,
        checks: bool,
    ) -> Result<Box<dyn Any>> {
        let inputs = tensors(inputs, "inputs")?;
        let dy = dy.downcast_ref::<AnyDeviceTensor>().ok_or_else(|| {
            err("tensor", "internal: the dy of a cuda device backward is not a mixer_cuda::AnyDeviceTensor")
        })?;
        // The shapes, bounds and dtypes on the host, as for `run`; `dy` has the shape of y (of
        // the mixed input) and the activations' dtype.
        let spec = m.spec();
        // The forward's output, when given (`SAVED_OUTPUT`): the shape of y, dy's dtype (or f32
        // in the bf16 mode, where the backward computes in f32).
        let saved = inputs.get(SAVED_OUTPUT).filter(|_| takes_saved_output(m));
        // What a saving forward left for this backward (`SAVED_STATISTICS`), where the family
        // saves anything (else it is an unknown input, refused below); the family checks its size.
        let stats = inputs.get(SAVED_STATISTICS).filter(|_| self.implements_saving());
        if let Some(s) = stats {
            check_saved_statistics(s, saved.is_some())?;
        }
        let skip: Vec<&str> =
            [saved.map(|_| SAVED_OUTPUT), stats.map(|_| SAVED_STATISTICS)].into_iter().flatten().collect();
        let double = check_on_host_except(m, inputs, precision, &skip)?;
        let given: Vec<String> = inputs.keys().cloned().collect();
        mixer_registry::backward::check_requires(m, &given, requires)?;
        check_dy(m, inputs, dy, precision, double)?;
        if let Some(y) = saved {
            check_saved_output(m, inputs, y, dy)?;
        }
        // The value checks of the inputs and of dy, on the device, reported with every gradient
        // (none when `checks` is false).
        let wanted = checks;
        let mut checks = if wanted { input_checks(&spec, inputs)? } else { Vec::new() };
        if wanted {
            checks.push(finite_check("dy", dy)?);
            if let Some(y) = saved {
                checks.push(finite_check(SAVED_OUTPUT, y)?);
            }
        }
        let grads = if double {
            typed_backward::<f64, T>(m, inputs, dy, requires, precision)
        } else {
            typed_backward::<f32, T>(m, inputs, dy, requires, precision)
        }?;
        let out: DeviceTensors = grads
            .into_iter()
            .filter(|(k, _)| {
                k.strip_prefix("d_").is_some_and(|n| requires.wants(n) && inputs.contains_key(n))
            })
            .map(|(k, v)| (k, v.with_checks(checks.iter().cloned())))
            .collect();
        let saved_name = |n: &str| is_saved_output(m, n) || (n == SAVED_STATISTICS && stats.is_some());
        for name in inputs.keys().filter(|n| requires.wants(n) && !saved_name(n)) {
            let g = out.get(&format!("d_{name}")).ok_or_else(|| {
                err(
                    m.family(),
                    format!("the fast backward of `{}` returned no gradient for `{name}`", m.name()),
                )
            })?;
            if g.shape() != inputs[name].shape() {
                return Err(err(
                    m.family(),
                    format!(
                        "internal: the fast backward returned d_{name} of shape {:?}, expected {:?}",
                        g.shape(),
                        inputs[name].shape()
                    ),
                ));
            }
        }
        Ok(Box::new(out))
    }

    fn implements_state(&self) -> bool {
        <T as DeviceFamily<f32>>::fast_from_state().is_some()
    }

    fn implements_state_backward(&self) -> bool {
        <T as DeviceFamily<f32>>::fast_backward_from_state().is_some()
    }

    fn run_state(
        &self,
        m: &dyn Mixer,
        inputs: &dyn Any,
        initial: Option<&dyn Any>,
        precision: Precision,
        checks: bool,
    ) -> Result<Box<dyn Any>> {
        let (inputs, initial) =
            (tensors(inputs, "inputs")?, initial.map(|s| tensors(s, "initial state")).transpose()?);
        crate::device_state::run::<T>(m, inputs, initial, precision, checks)
            .map(|r| Box::new(r) as Box<dyn Any>)
    }

    fn backward_state(
        &self,
        m: &dyn Mixer,
        inputs: &dyn Any,
        initial: Option<&dyn Any>,
        dy: &dyn Any,
        d_final: Option<&dyn Any>,
        requires: &Requires,
        precision: Precision,
        checks: bool,
    ) -> Result<Box<dyn Any>> {
        let (inputs, initial) =
            (tensors(inputs, "inputs")?, initial.map(|s| tensors(s, "initial state")).transpose()?);
        let d_final = d_final.map(|s| tensors(s, "final state's cotangent")).transpose()?;
        let dy = dy.downcast_ref::<AnyDeviceTensor>().ok_or_else(|| {
            err("tensor", "internal: the dy of a cuda device backward is not a mixer_cuda::AnyDeviceTensor")
        })?;
        let args = crate::device_state::Cotangents { dy, d_final, requires };
        crate::device_state::backward::<T>(m, inputs, initial, args, precision, checks)
            .map(|r| Box::new(r) as Box<dyn Any>)
    }

    fn decoder(&self, m: &dyn Mixer, statics: &AnyTensors, dims: &Dims) -> Result<Box<dyn Any>> {
        let d = match statics {
            AnyTensors::F64(s) => typed_decoder::<f64, T>(m, s, dims),
            AnyTensors::F32(s) => typed_decoder::<f32, T>(m, s, dims),
        }?;
        Ok(Box::new(d))
    }

    fn plan(
        &self,
        m: &dyn Mixer,
        form: Form,
        dims: &Dims,
        dtype: DType,
        precision: Precision,
    ) -> Result<Option<serde_json::Value>> {
        let plan = match dtype {
            DType::F64 => <T as DeviceFamily<f64>>::plan(downcast(m, "cuda")?, form, dims, precision),
            DType::F32 => <T as DeviceFamily<f32>>::plan(downcast(m, "cuda")?, form, dims, precision),
        };
        plan.transpose()
    }
}

/// A map of device tensors handed through the registry as `dyn Any` (`what` names it in the
/// error).
fn tensors<'a>(x: &'a dyn Any, what: &str) -> Result<&'a DeviceTensors> {
    x.downcast_ref::<DeviceTensors>().ok_or_else(|| {
        err("tensor", format!("internal: the {what} of a cuda device call are not mixer_cuda::DeviceTensors"))
    })
}

fn typed_run<F: GpuReal, T: DeviceFamily<F>>(
    m: &dyn Mixer,
    form: Form,
    x: &DeviceTensors,
    p: Precision,
) -> Result<AnyDeviceTensor> {
    let mm = downcast::<T::Mixer>(m, "cuda")?;
    let f = match form {
        Form::Parallel => T::parallel(),
        Form::Fast => T::fast(),
        _ => None,
    };
    let f = f.ok_or_else(|| err(m.family(), format!("internal: no {form} device form")))?;
    f(mm, x, p)
}

fn typed_backward<F: GpuReal, T: DeviceFamily<F>>(
    m: &dyn Mixer,
    x: &DeviceTensors,
    dy: &AnyDeviceTensor,
    req: &Requires,
    p: Precision,
) -> Result<DeviceTensors> {
    let mm = downcast::<T::Mixer>(m, "cuda")?;
    let f = T::backward().ok_or_else(|| err(m.family(), "internal: no fast backward on device tensors"))?;
    f(mm, x, dy, req, p)
}

fn typed_saving<F: GpuReal, T: DeviceFamily<F>>(
    m: &dyn Mixer,
    x: &DeviceTensors,
    p: Precision,
) -> Result<(AnyDeviceTensor, Option<AnyDeviceTensor>)> {
    let mm = downcast::<T::Mixer>(m, "cuda")?;
    let f =
        T::fast_saving().ok_or_else(|| err(m.family(), "internal: no saving fast form on device tensors"))?;
    f(mm, x, p)
}

fn typed_decoder<F: GpuReal, T: DeviceFamily<F>>(
    m: &dyn Mixer,
    statics: &Tensors<F>,
    dims: &Dims,
) -> Result<Box<dyn DeviceDecoder>> {
    let mm = downcast::<T::Mixer>(m, "cuda")?;
    let make = T::decoder().ok_or_else(|| err(m.family(), "internal: no device decoder"))?;
    Ok(make(mm, statics, dims)?)
}

/// A forward of `form` on device tensors (`run(double)`, `double`: whether the call computes in
/// `f64`) after the host's checks of the shapes, bounds and dtypes; unless `checks` is false, with
/// the device-side value checks of the inputs and the finiteness check of `y` attached to `y`.
fn checked<R>(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    precision: Precision,
    checks: bool,
    form: Form,
    run: impl FnOnce(bool) -> Result<(AnyDeviceTensor, R)>,
) -> Result<(AnyDeviceTensor, R)> {
    let double = check_on_host(m, inputs, precision)?;
    if !checks {
        return run(double);
    }
    let mut wanted = input_checks(&m.spec(), inputs)?;
    let (y, rest) = run(double)?;
    wanted.push(output_check(&y, format!("`{}` {form} form on cuda", m.name()), "every input is")?);
    Ok((y.with_checks(wanted), rest))
}

fn run_erased<T: DeviceFamily<f32> + DeviceFamily<f64>>(
    m: &dyn Mixer,
    form: Form,
    x: &DeviceTensors,
    p: Precision,
    double: bool,
) -> Result<AnyDeviceTensor> {
    if double { typed_run::<f64, T>(m, form, x, p) } else { typed_run::<f32, T>(m, form, x, p) }
}

fn constraint_code(c: Constraint) -> i32 {
    match c {
        Constraint::Finite => 0,
        Constraint::NonPositive => 1,
        Constraint::UnitInterval => 2,
        Constraint::NonNegative => 3,
    }
}

/// Enqueues the check of one tensor's values; the flag holds `n − i` for the first violation.
fn check_values<T: DeviceScalar>(
    t: &DeviceTensor<T>,
    suffix: &str,
    code: i32,
    explain: impl Fn(usize) -> Error + Send + Sync + 'static,
) -> Result<Arc<Deferred>> {
    let n = t.len();
    let d = Deferred::new("tensor", move |v| explain(n - v as usize))?;
    if n > 0 {
        let g = gpu()?;
        let f = g.kernel("tensor", &kernels::TENSOR, &[], &format!("check_values_{suffix}"))?;
        let (tv, ni) = (t.view(), n as i64);
        launch!(g, "tensor", f, grid1(n.min(1 << 20), 256); &tv, &ni, &code, d.flag())?;
    }
    Ok(Arc::new(d))
}

/// The device-side checks of the given inputs' value constraints (one kernel each, enqueued
/// now and read with the result): an input breaking its constraint is reported with the flat
/// index of a violation.
pub(crate) fn input_checks(spec: &InputSpec, inputs: &DeviceTensors) -> Result<Vec<Arc<Deferred>>> {
    let mut checks = Vec::new();
    for d in &spec.inputs {
        let Some(t) = inputs.get(d.name) else { continue };
        let (name, c) = (d.name.to_string(), d.constraint);
        checks.push(check_any(t, constraint_code(c), move |i| Error::Value {
            name: name.clone(),
            constraint: c.describe().to_string(),
            found: format!("a violation at flat index {i} (checked on the device)"),
        })?);
    }
    Ok(checks)
}

/// The device-side check that `t` (named `name` in the error) is finite.
pub(crate) fn finite_check(name: &str, t: &AnyDeviceTensor) -> Result<Arc<Deferred>> {
    let name = name.to_string();
    check_any(t, 0, move |i| Error::Value {
        name: name.clone(),
        constraint: "values must be finite".into(),
        found: format!("a violation at flat index {i} (checked on the device)"),
    })
}

/// The device-side check that the output `y` of `what` (e.g. "`mamba2` fast form on cuda") is
/// finite where its inputs are (`inputs`: "every input is", said in the error).
pub(crate) fn output_check(y: &AnyDeviceTensor, what: String, inputs: &'static str) -> Result<Arc<Deferred>> {
    check_any(y, 0, move |i| {
        Error::Numerical(format!(
            "{what}: y has a non-finite value at flat index {i} although {inputs} finite; the result \
             overflows its dtype"
        ))
    })
}

pub(crate) fn check_any(
    t: &AnyDeviceTensor,
    code: i32,
    explain: impl Fn(usize) -> Error + Send + Sync + 'static,
) -> Result<Arc<Deferred>> {
    match t {
        AnyDeviceTensor::F32(x) => check_values(x, "f32", code, explain),
        AnyDeviceTensor::F64(x) => check_values(x, "f64", code, explain),
        AnyDeviceTensor::Bf16(x) => check_values::<bf16>(x, "bf16", code, explain),
    }
}

/// The host-side checks of a backward's `dy`: the shape of `y` (of the mixed input) and the dtype
/// of `y` in the mode (`bf16` in the bf16 mode, else `f64` for a call in `f64`, else `f32`).
pub(crate) fn check_dy(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    dy: &AnyDeviceTensor,
    precision: Precision,
    double: bool,
) -> Result<()> {
    let spec = m.spec();
    let mixed = inputs.get(spec.mixed).map(|t| t.shape().to_vec()).unwrap_or_default();
    if dy.shape() != mixed.as_slice() {
        return Err(Error::shape(
            "dy",
            format!("{mixed:?} (the shape of y, i.e. of `{}`)", spec.mixed),
            format!("{:?}", dy.shape()),
        ));
    }
    let want = match precision {
        Precision::Bf16 => "bf16",
        _ if double => "f64",
        _ => "f32",
    };
    if dy.dtype() != want {
        return Err(Error::Value {
            name: "dy".into(),
            constraint: format!("a {want} device tensor (the dtype of y in the {precision} mode)"),
            found: format!("a {} device tensor", dy.dtype()),
        });
    }
    Ok(())
}

/// The host-side checks of a backward's saved output (`SAVED_OUTPUT`): the shape of `y` (of the
/// mixed input) and dy's dtype, or `f32` beside a bf16 `dy` (the bf16 mode computes in `f32`).
pub(crate) fn check_saved_output(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    y: &AnyDeviceTensor,
    dy: &AnyDeviceTensor,
) -> Result<()> {
    let spec = m.spec();
    let mixed = inputs.get(spec.mixed).map(|t| t.shape().to_vec()).unwrap_or_default();
    let dtype_ok = y.dtype() == dy.dtype() || (dy.dtype() == "bf16" && y.dtype() == "f32");
    if y.shape() == mixed.as_slice() && dtype_ok {
        return Ok(());
    }
    Err(Error::Value {
        name: SAVED_OUTPUT.into(),
        constraint: format!(
            "the forward's output: a {} device tensor of shape {} (that of `{}`)",
            if dy.dtype() == "bf16" { "bf16 or f32" } else { dy.dtype() },
            mixer_core::error::fmt_shape(&mixed),
            spec.mixed
        ),
        found: format!("a {} device tensor of shape {}", y.dtype(), mixer_core::error::fmt_shape(y.shape())),
    })
}

/// The host-side checks of device inputs, shared by the forward and the backward: the shapes
/// bind the spec's sizes, the sizes meet the mixer's bounds, the dtypes suit the mode. Returns
/// whether the call computes in `f64`.
pub(crate) fn check_on_host(m: &dyn Mixer, inputs: &DeviceTensors, precision: Precision) -> Result<bool> {
    check_on_host_except(m, inputs, precision, &[])
}

/// The host-side checks of what a saving forward left for the backward (`SAVED_STATISTICS`):
/// an `f32` device tensor, given with the forward's output `y` (the statistics alone say nothing
/// of `y`, which the backward reads too).
fn check_saved_statistics(s: &AnyDeviceTensor, with_y: bool) -> Result<()> {
    if s.dtype() != "f32" || !with_y {
        return Err(Error::Value {
            name: SAVED_STATISTICS.into(),
            constraint: format!(
                "what the saving forward returned beside `{SAVED_OUTPUT}` (an f32 device tensor), given with that `{SAVED_OUTPUT}`"
            ),
            found: format!("a {} device tensor{}", s.dtype(), if with_y { "" } else { " without `y`" }),
        });
    }
    Ok(())
}

/// [`check_on_host`] without the tensors named in `skip` (a backward's saved output and
/// statistics).
fn check_on_host_except(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    precision: Precision,
    skip: &[&str],
) -> Result<bool> {
    let spec = m.spec();
    let kept = |k: &String| !skip.contains(&k.as_str());
    let shapes =
        inputs.iter().filter(|(k, _)| kept(k)).map(|(k, v)| (k.clone(), v.shape().to_vec())).collect();
    let dims = spec.bind(&shapes)?;
    spec.check_bounds(&dims, &m.bounds(&dims))?;
    check_dtypes(inputs, precision, skip)
}

/// The element types a call accepts: all `f64` (exact), all `f32` (exact or tf32), or bf16
/// activations with `f32` for the rest (bf16). Returns whether the call computes in `f64`.
fn check_dtypes(x: &DeviceTensors, p: Precision, skip: &[&str]) -> Result<bool> {
    let activation = |k: &str| mixer_core::precision::ACTIVATIONS.contains(&k);
    let want = |k: &str, double: bool| match p {
        Precision::Bf16 if activation(k) => "bf16",
        _ if double => "f64",
        _ => "f32",
    };
    let double = p == Precision::Exact && x.values().any(|t| t.dtype() == "f64");
    for (k, t) in x.iter().filter(|(k, _)| !skip.contains(&k.as_str())) {
        let w = want(k, double);
        if t.dtype() != w {
            return Err(Error::Value {
                name: k.clone(),
                constraint: format!(
                    "a {w} device tensor (the {p} mode takes {})",
                    match p {
                        Precision::Exact => "f32 or f64 inputs, all of one type",
                        Precision::Tf32 => "f32 inputs",
                        Precision::Bf16 => "bf16 activations (x, q, k, v) and f32 for the rest",
                    }
                ),
                found: format!("a {} device tensor", t.dtype()),
            });
        }
    }
    Ok(double)
}

/// Runs the `parallel` or `fast` form of `m` on device tensors, in a precision mode. Returns
/// at once; the result's deferred checks report invalid input values or a non-finite output
/// when it is read. The registry decides availability and dispatches, as for host arrays
/// (`mixer_registry::run_device`).
pub fn run_device(
    m: &dyn Mixer,
    form: Form,
    inputs: &DeviceTensors,
    precision: Precision,
) -> Result<AnyDeviceTensor> {
    run_device_with(m, form, inputs, precision, true)
}

/// [`run_device`] with the device-side value checks of the inputs and of `y` left out when
/// `checks` is false (shapes and dtypes are still checked): for timing loops over inputs
/// that a checked call has already validated.
pub fn run_device_with(
    m: &dyn Mixer,
    form: Form,
    inputs: &DeviceTensors,
    precision: Precision,
    checks: bool,
) -> Result<AnyDeviceTensor> {
    mixer_registry::run_device(m, &Backend::by_name("cuda")?, form, inputs, precision, checks)
}

/// The `fast` form of `m` on device tensors run for a backward: `y` (the bits of
/// [`run_device_with`]'s) and what the backward may read instead of running the forward again,
/// where the family saves anything in this configuration (attention on tensor cores: each row's
/// softmax statistics, docs/gradients.md), else `None`. Give both to [`backward_device`] as
/// `y` (`mixer_core::grad::SAVED_OUTPUT`) and `y_stats` (`SAVED_STATISTICS`), with the same
/// inputs and mode: the backward then skips its forward. Returns at once; `checks` as in
/// [`run_device_with`].
pub fn run_device_saving(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    precision: Precision,
    checks: bool,
) -> Result<(AnyDeviceTensor, Option<AnyDeviceTensor>)> {
    mixer_registry::run_device_saving(m, &Backend::by_name("cuda")?, inputs, precision, checks)
}

/// Whether [`run_device_saving`] saves anything for `m`'s backward (its family's CUDA forms
/// save something): a property of the registration, answered without probing the device.
pub fn device_saves(m: &dyn Mixer) -> bool {
    Backend::registered("cuda").is_ok_and(|b| mixer_registry::device_saves(m, &b))
}

/// The gradients of the `fast` form of `m` on device tensors: for the output cotangent `dy`
/// (the shape of `y`; bf16 in the `bf16` mode, else the inputs' dtype), the vector–Jacobian
/// products `d_<input>` of every given input `requires` asks for (the input's shape; `f32` in
/// the `bf16` and `tf32` modes, `f64` for `f64` inputs). Returns at once; the gradients carry
/// the deferred value checks of the inputs and of `dy`. The registry decides availability
/// (`mixer_registry::backward_device`), as for [`run_device`]; the same inputs give the same
/// bits.
pub fn backward_device(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    dy: &AnyDeviceTensor,
    requires: &Requires,
    precision: Precision,
) -> Result<DeviceTensors> {
    backward_device_with(m, inputs, dy, requires, precision, true)
}

/// [`backward_device`] with the device-side value checks of the inputs and of `dy` left out
/// when `checks` is false (shapes and dtypes are still checked), as [`run_device_with`].
pub fn backward_device_with(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    dy: &AnyDeviceTensor,
    requires: &Requires,
    precision: Precision,
    checks: bool,
) -> Result<DeviceTensors> {
    mixer_registry::backward_device(m, &Backend::by_name("cuda")?, inputs, dy, requires, precision, checks)
}

/// A decoder of `m` whose state stays on the device: its `step` takes one token's inputs as
/// device tensors and returns `y_t` on the device, without waiting. `statics` are the inputs
/// without a sequence axis (kernels, biases, λ parameters) as host arrays; `dims` the sizes
/// (`B`, `T`, …), as for the registry's decoder.
pub fn decoder_device(m: &dyn Mixer, statics: &AnyTensors, dims: &Dims) -> Result<Box<dyn DeviceDecoder>> {
    mixer_registry::decoder_device(m, &Backend::by_name("cuda")?, statics, dims)
}

#[cfg(test)]
mod tests {
    use mixer_core::Form;

    /// One registration per family: every CUDA family entry carries its device forms, and they
    /// are exactly the forms its host-array implementation offers (which are built on them).
    #[test]
    fn every_cuda_family_entry_has_the_same_forms_on_device_tensors() {
        let entries: Vec<_> = mixer_registry::FAMILIES.iter().filter(|e| e.backend == "cuda").collect();
        let families: Vec<_> = entries.iter().map(|e| e.family).collect();
        for f in ["attention", "glr", "loglinear", "toeplitz"] {
            assert!(families.contains(&f), "no cuda entry for {f}: {families:?}");
        }
        for e in entries {
            let d = e.device.unwrap_or_else(|| panic!("`{}` on cuda registers no device forms", e.family));
            for form in [Form::Parallel, Form::Fast, Form::Recurrent] {
                assert_eq!(d.implements(form), e.f64.implements(form), "`{}` {form}", e.family);
                assert_eq!(d.implements(form), e.f32.implements(form), "`{}` {form}", e.family);
            }
            assert!(!d.implements(Form::Materialized));
        }
    }
}
