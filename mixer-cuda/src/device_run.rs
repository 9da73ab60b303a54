//! Running a mixer on device tensors: [`run_device`] for whole sequences and
//! [`decoder_device`] for token-by-token decoding, for callers whose activations stay on the
//! GPU. Both are asynchronous: they enqueue work on the backend's stream ([`stream`]) and
//! return; reading a result ([`crate::DeviceTensor::to_host`]) waits.
//!
//! The registry decides availability, exactly as for host arrays. Shapes are checked on the
//! host before anything is enqueued; the value constraints of the inputs (finite, `g ≤ 0`,
//! `β ∈ [0, 1]`, …) and the finiteness of `y` are checked by kernels on the stream and
//! reported when the result is read ([`crate::tensor::Deferred`]).

use std::sync::Arc;

use cudarc::driver::CudaStream;
use mixer_core::mixer::{Mixer, downcast};
use mixer_core::spec::Constraint;
use mixer_core::{Dims, Error, Form, Precision, Result, Tensors};
use mixer_registry::Backend;

use crate::forms::{DeviceDecoder, DeviceFamily};
use crate::kernels;
use crate::runtime::{GpuReal, gpu, grid1, launch};
use crate::tensor::{AnyDeviceTensor, Deferred, DeviceScalar, DeviceTensor, DeviceTensors, bf16};

/// The backend's stream: order a caller's own kernels and copies with ours by enqueuing them
/// on it (or by waiting on events recorded on it).
pub fn stream() -> Result<Arc<CudaStream>> {
    Ok(gpu()?.stream.clone())
}

/// One family's device forms with the mixer type erased.
pub struct DeviceEntry {
    /// The family key.
    pub family: &'static str,
    run: fn(&dyn Mixer, Form, &DeviceTensors, Precision, bool) -> Result<AnyDeviceTensor>,
    decoder: fn(&dyn Mixer, &mixer_core::AnyTensors, &Dims) -> Result<Box<dyn DeviceDecoder>>,
}

impl std::fmt::Debug for DeviceEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceEntry({})", self.family)
    }
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
    let f = f.ok_or_else(|| no_device_form(m, form))?;
    f(mm, x, p)
}

fn typed_decoder<F: GpuReal, T: DeviceFamily<F>>(
    m: &dyn Mixer,
    statics: &Tensors<F>,
    dims: &Dims,
) -> Result<Box<dyn DeviceDecoder>> {
    let mm = downcast::<T::Mixer>(m, "cuda")?;
    let make = T::decoder().ok_or_else(|| no_device_form(m, Form::Recurrent))?;
    make(mm, statics, dims)
}

fn no_device_form(m: &dyn Mixer, form: Form) -> Error {
    Error::FormUnavailable {
        mixer: m.name().to_string(),
        form: form.name().into(),
        backend: "cuda (device tensors)".into(),
        available: "parallel and fast run on device tensors; recurrent through decoder_device".into(),
    }
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

fn decoder_erased<T: DeviceFamily<f32> + DeviceFamily<f64>>(
    m: &dyn Mixer,
    statics: &mixer_core::AnyTensors,
    dims: &Dims,
) -> Result<Box<dyn DeviceDecoder>> {
    match statics {
        mixer_core::AnyTensors::F64(s) => typed_decoder::<f64, T>(m, s, dims),
        mixer_core::AnyTensors::F32(s) => typed_decoder::<f32, T>(m, s, dims),
    }
}

/// The entry of a family whose device forms are `T` (for both `f32` and `f64`).
pub const fn device_entry<T: DeviceFamily<f32> + DeviceFamily<f64>>(family: &'static str) -> DeviceEntry {
    DeviceEntry { family, run: run_erased::<T>, decoder: decoder_erased::<T> }
}

/// The device forms of every builtin family on this backend.
pub static DEVICE_FAMILIES: &[&DeviceEntry] =
    &[&crate::attention::DEVICE, &crate::glr::DEVICE, &crate::loglinear::DEVICE, &crate::toeplitz::DEVICE];

fn entry(m: &dyn Mixer) -> Result<&'static DeviceEntry> {
    DEVICE_FAMILIES.iter().copied().find(|e| e.family == m.family()).ok_or_else(|| Error::Backend {
        backend: "cuda".into(),
        family: Some(m.family().into()),
        message: "this family has no device-tensor forms on cuda (only host arrays, through the registry)"
            .into(),
    })
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

fn check_any(
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

/// The element types a call accepts: all `f64` (exact), all `f32` (exact or tf32), or bf16
/// activations with `f32` for the rest (bf16). Returns whether the call computes in `f64`.
fn check_dtypes(x: &DeviceTensors, p: Precision) -> Result<bool> {
    let activation = |k: &str| mixer_core::precision::ACTIVATIONS.contains(&k);
    let want = |k: &str, double: bool| match p {
        Precision::Bf16 if activation(k) => "bf16",
        _ if double => "f64",
        _ => "f32",
    };
    let double = p == Precision::Exact && x.values().any(|t| t.dtype() == "f64");
    for (k, t) in x {
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
/// when it is read.
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
    let backend = Backend::by_name("cuda")?;
    mixer_registry::run::available(m, &backend, form)?;
    let spec = m.spec();
    let shapes = inputs.iter().map(|(k, v)| (k.clone(), v.shape().to_vec())).collect();
    let dims = spec.bind(&shapes)?;
    spec.check_bounds(&dims, &m.bounds(&dims))?;
    let double = check_dtypes(inputs, precision)?;
    let e = entry(m)?;
    if !checks {
        return (e.run)(m, form, inputs, precision, double);
    }
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
    let y = (e.run)(m, form, inputs, precision, double)?;
    let (name, form_name) = (m.name().to_string(), form.name());
    checks.push(check_any(&y, 0, move |i| {
        Error::Numerical(format!(
            "`{name}` {form_name} form on cuda: y has a non-finite value at flat index {i} although every \
             input is finite; the result overflows its dtype"
        ))
    })?);
    Ok(match y {
        AnyDeviceTensor::F32(t) => AnyDeviceTensor::F32(t.with_checks(checks)),
        AnyDeviceTensor::F64(t) => AnyDeviceTensor::F64(t.with_checks(checks)),
        AnyDeviceTensor::Bf16(t) => AnyDeviceTensor::Bf16(t.with_checks(checks)),
    })
}

/// A decoder of `m` whose state stays on the device: its `step` takes one token's inputs as
/// device tensors and returns `y_t` on the device, without waiting. `statics` are the inputs
/// without a sequence axis (kernels, biases, λ parameters) as host arrays; `dims` the sizes
/// (`B`, `T`, …), as for the registry's decoder.
pub fn decoder_device(
    m: &dyn Mixer,
    statics: &mixer_core::AnyTensors,
    dims: &Dims,
) -> Result<Box<dyn DeviceDecoder>> {
    let backend = Backend::by_name("cuda")?;
    mixer_registry::run::available(m, &backend, Form::Recurrent)?;
    (entry(m)?.decoder)(m, statics, dims)
}
