//! The device-tensor contract of this backend's families, and the host-array forms built on
//! it.
//!
//! Each family implements [`DeviceFamily`] once for `f32` and `f64`: its forms take
//! [`DeviceTensors`] and return a device tensor without waiting for the stream, and its
//! decoder ([`DeviceDecoder`]) keeps its state on the device and takes each token's inputs
//! as device tensors. [`Hosted`] turns that into the registry's [`Family`]: a host-array form
//! uploads the inputs, runs the device form and reads the result (the only wait), so the two
//! paths agree bit for bit by construction. [`crate::run_device`] is the entry point for
//! callers whose tensors live on the device.
//!
//! Precision: a form receives the call's [`Precision`]. In the `bf16` mode the activations
//! arrive as bf16 tensors; [`input`] converts them to the form's `f32` on the device, and
//! [`finish`] stores `y` as bf16. A form with tensor-core kernels (attention) uses them instead.

use std::borrow::Cow;

use mixer_core::mixer::{Decoder, Mixer};
use mixer_core::precision::{ACTIVATIONS, round_bf16};
use mixer_core::{Dims, Error, Form, Precision, Requires, Result, Tensors};
use mixer_registry::{
    BackwardFn, DecoderFn, Family, FormFn, PreciseBackwardFn, PreciseFn, PreciseStateFn, StateBackwardFn,
    StateDecoderFn, StateFn,
};
use ndarray::ArrayD;

use crate::kernels;
use crate::pool;
use crate::runtime::{err, gpu, grid1, launch};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceScalar, DeviceTensor, DeviceTensors, bf16};

/// A device form: inputs on the device, output on the device, nothing waited for.
pub type DeviceFormFn<M> = fn(&M, &DeviceTensors, Precision) -> Result<AnyDeviceTensor>;

/// The `fast` form run for a backward ([`crate::run_device_saving`]): `y` and what the backward
/// may read instead of running the forward again (`mixer_core::grad::SAVED_STATISTICS`; `None`
/// where nothing is saved in this configuration), nothing waited for. `y` has the bits of the
/// plain `fast` form's.
pub type DeviceSavingFn<M> =
    fn(&M, &DeviceTensors, Precision) -> Result<(AnyDeviceTensor, Option<AnyDeviceTensor>)>;

/// A device form run from a recurrent state (docs/math.md §7): the inputs, the initial state
/// (`None`: zeros) as device tensors named as the mixer's state; returns `y` and the final
/// state, nothing waited for.
pub type DeviceStateFn<M> =
    fn(&M, &DeviceTensors, Option<&DeviceTensors>, Precision) -> Result<(AnyDeviceTensor, DeviceTensors)>;

/// A device backward (vector–Jacobian products, docs/gradients.md): the forward's inputs and
/// the output's cotangent `dy` (the shape of `y`; bf16 in the `bf16` mode) as device tensors;
/// returns `d_<input>` for every given input that `req` asks for (the shape of that input, `F`
/// storage), nothing waited for. The same inputs give the same bits, run after run.
pub type DeviceBackwardFn<M> =
    fn(&M, &DeviceTensors, &AnyDeviceTensor, &Requires, Precision) -> Result<DeviceTensors>;

/// A device backward from a recurrent state ([`DeviceStateFn`]'s; docs/math.md §7): the
/// inputs, the initial state (`None`: zeros), the output's cotangent `dy` and the final state's
/// cotangent (`None`: zero), the states named as the mixer's state; returns `d_<input>` for every
/// given input that `req` asks for and, with an initial state, its gradient (keyed as the state's
/// tensors; empty without one), nothing waited for.
pub type DeviceStateBackwardFn<M> = fn(
    &M,
    &DeviceTensors,
    Option<&DeviceTensors>,
    &AnyDeviceTensor,
    Option<&DeviceTensors>,
    &Requires,
    Precision,
) -> Result<(DeviceTensors, DeviceTensors)>;

/// The `fast` form from a state and its backward on host arrays, by the family's state
/// *extension* (docs/math.md §7): the state is a prefix of the inputs (attention's KV cache, the
/// Toeplitz mixer's input history, the GLR's past outputs), so the run from a state is the
/// device `fast` form (and its backward) on the inputs extended by that prefix, as on the CPU.
/// For a family with no device form from a state ([`DeviceFamily::fast_from_state`]), or (the
/// backward alone) none of its backward.
pub struct Extension<M, F> {
    /// `y` and the final state ([`StateFn`]).
    pub run: StateFn<M, F>,
    /// The gradients and the initial state's gradient ([`StateBackwardFn`]).
    pub backward: StateBackwardFn<M, F>,
}

/// A decoder whose state lives on the device.
pub trait DeviceDecoder: Send {
    /// Enqueues the next position: `token` holds the per-token inputs (sequence axis removed)
    /// as device tensors; the output tensor is ready once the stream reaches it.
    fn step(&mut self, token: &DeviceTensors) -> Result<AnyDeviceTensor>;
    /// Number of scalars held in the cache/state right now.
    fn cache_elems(&self) -> usize;
    /// Number of tokens consumed so far.
    fn position(&self) -> usize;
}

/// A device decoder whose state can be read back (docs/math.md §7.1): what a run of the tokens
/// it consumed returns as its final state.
pub trait StatefulDeviceDecoder<F>: DeviceDecoder {
    /// The state after the tokens consumed, on the host (waits for the stream).
    fn state(&self) -> Result<Tensors<F>>;
}

/// A device decoder from the static inputs (host arrays: kernels, biases, λ parameters) and
/// the bound sizes.
pub type DeviceDecoderFn<M, F> = fn(&M, &Tensors<F>, &Dims) -> Result<Box<dyn StatefulDeviceDecoder<F>>>;

/// One family's forms on device tensors, for element type `F` (`f32` or `f64`).
pub trait DeviceFamily<F: GpuReal>: Send + Sync + 'static {
    /// The family's mixer type.
    type Mixer: Mixer;
    /// The `parallel` form, if any.
    fn parallel() -> Option<DeviceFormFn<Self::Mixer>> {
        None
    }
    /// The `fast` form, if any.
    fn fast() -> Option<DeviceFormFn<Self::Mixer>> {
        None
    }
    /// The decoder, if any.
    fn decoder() -> Option<DeviceDecoderFn<Self::Mixer, F>> {
        None
    }
    /// The decoder started from a state on host arrays (the `recurrent` form from a state), if
    /// any: its state on the device, driven with host arrays ([`hosted_decoder`]).
    fn decoder_from_state() -> Option<StateDecoderFn<Self::Mixer, F>> {
        None
    }
    /// A configuration this backend cannot run in `form` although the family has the form.
    fn unsupported(_m: &Self::Mixer, _form: Form) -> Option<String> {
        None
    }
    /// The backward of the `fast` form, if any.
    fn backward() -> Option<DeviceBackwardFn<Self::Mixer>> {
        None
    }
    /// A configuration whose `fast` backward this backend cannot run although the family has
    /// one (the reason), or `None`.
    fn backward_unsupported(_m: &Self::Mixer) -> Option<String> {
        None
    }
    /// The `fast` form that also saves what its backward reads ([`DeviceSavingFn`]), if the
    /// family saves anything; its backward then accepts `mixer_core::grad::SAVED_STATISTICS`.
    fn fast_saving() -> Option<DeviceSavingFn<Self::Mixer>> {
        None
    }
    /// The `fast` form run from a state, if any.
    fn fast_from_state() -> Option<DeviceStateFn<Self::Mixer>> {
        None
    }
    /// A configuration whose `form` cannot run from a state here although the family has that
    /// (the forward from a state and its backward alike).
    fn state_unsupported(_m: &Self::Mixer, _form: Form) -> Option<String> {
        None
    }
    /// The checks of a state on host arrays that the device form from a state does not make
    /// itself (it reads only what it needs, on the device): a cache's rows past its length, or a
    /// history's rows from its position on, must be zero. `x` are the run's inputs. Default: none.
    fn check_host_state(_m: &Self::Mixer, _x: &Tensors<F>, _s: &Tensors<F>) -> Result<()> {
        Ok(())
    }
    /// The backward of the `fast` form from a state ([`DeviceFamily::fast_from_state`]'s), if any.
    fn fast_backward_from_state() -> Option<DeviceStateBackwardFn<Self::Mixer>> {
        None
    }
    /// The `fast` form from a state on host arrays by the state's extension ([`Extension`]), for
    /// a family without [`DeviceFamily::fast_from_state`] (its backward: without
    /// [`DeviceFamily::fast_backward_from_state`]).
    fn extension() -> Option<Extension<Self::Mixer, F>> {
        None
    }
    /// The launch plan of `form` at the sizes `dims` in mode `p`, as JSON
    /// (`mixer_registry::DeviceForms::plan`), for a family that reports one.
    fn plan(_m: &Self::Mixer, _form: Form, _dims: &Dims, _p: Precision) -> Option<Result<serde_json::Value>> {
        None
    }
}

/// A [`DeviceFamily`] as the registry's [`Family`] (host arrays in and out).
pub struct Hosted<T>(pub T);

impl<F: GpuReal, T: DeviceFamily<F>> Family<F> for Hosted<T> {
    type Mixer = T::Mixer;
    fn parallel(&self) -> Option<FormFn<T::Mixer, F>> {
        T::parallel().map(|_| host_parallel::<F, T> as FormFn<T::Mixer, F>)
    }
    fn fast(&self) -> Option<FormFn<T::Mixer, F>> {
        T::fast().map(|_| host_fast::<F, T> as FormFn<T::Mixer, F>)
    }
    fn precise(&self, form: Form) -> Option<PreciseFn<T::Mixer, F>> {
        match form {
            Form::Parallel => T::parallel().map(|_| host_parallel_with::<F, T> as PreciseFn<T::Mixer, F>),
            Form::Fast => T::fast().map(|_| host_fast_with::<F, T> as PreciseFn<T::Mixer, F>),
            _ => None,
        }
    }
    fn decoder(&self) -> Option<DecoderFn<T::Mixer, F>> {
        T::decoder().map(|_| host_decoder::<F, T> as DecoderFn<T::Mixer, F>)
    }
    fn decoder_from_state(&self) -> Option<StateDecoderFn<T::Mixer, F>> {
        T::decoder_from_state()
    }
    fn unsupported(&self, m: &T::Mixer, form: Form) -> Option<String> {
        T::unsupported(m, form)
    }
    fn stateful(&self, form: Form) -> Option<StateFn<T::Mixer, F>> {
        if form != Form::Fast {
            return None;
        }
        match T::fast_from_state() {
            Some(_) => Some(host_fast_from_state::<F, T> as StateFn<T::Mixer, F>),
            None => T::extension().map(|e| e.run),
        }
    }
    fn precise_stateful(&self, form: Form) -> Option<PreciseStateFn<T::Mixer, F>> {
        (form == Form::Fast)
            .then(T::fast_from_state)
            .flatten()
            .map(|_| host_fast_from_state_with::<F, T> as PreciseStateFn<T::Mixer, F>)
    }
    fn state_unsupported(&self, m: &T::Mixer, form: Form) -> Option<String> {
        T::state_unsupported(m, form)
    }
    fn stateful_backward(&self, form: Form) -> Option<StateBackwardFn<T::Mixer, F>> {
        if form != Form::Fast {
            return None;
        }
        match T::fast_backward_from_state() {
            Some(_) => Some(host_backward_from_state::<F, T> as StateBackwardFn<T::Mixer, F>),
            None => T::extension().map(|e| e.backward),
        }
    }
    fn backward(&self, form: Form) -> Option<BackwardFn<T::Mixer, F>> {
        (form == Form::Fast)
            .then(T::backward)
            .flatten()
            .map(|_| host_backward::<F, T> as BackwardFn<T::Mixer, F>)
    }
    fn backward_unsupported(&self, m: &T::Mixer, form: Form) -> Option<String> {
        if form == Form::Fast { T::backward_unsupported(m) } else { None }
    }
    fn precise_backward(&self, form: Form) -> Option<PreciseBackwardFn<T::Mixer, F>> {
        (form == Form::Fast)
            .then(T::backward)
            .flatten()
            .map(|_| host_backward_with::<F, T> as PreciseBackwardFn<T::Mixer, F>)
    }
}

/// The `fast` backward on host arrays (exact mode): [`host_backward_with`].
pub(crate) fn host_backward<F: GpuReal, T: DeviceFamily<F>>(
    m: &T::Mixer,
    x: &Tensors<F>,
    dy: &ArrayD<F>,
    req: &Requires,
) -> Result<Tensors<F>> {
    host_backward_with::<F, T>(m, x, dy, req, Precision::Exact)
}

/// The `fast` backward on host arrays in mode `p`: uploads the inputs and `dy` (the activations
/// and `dy` rounded to bf16 and uploaded as bf16 in the `bf16` mode, as the device backward takes
/// them), runs the device backward in `p`, reads the gradients back as `F`.
fn host_backward_with<F: GpuReal, T: DeviceFamily<F>>(
    m: &T::Mixer,
    x: &Tensors<F>,
    dy: &ArrayD<F>,
    req: &Requires,
    p: Precision,
) -> Result<Tensors<F>> {
    let f = T::backward().ok_or_else(|| err(m.family(), "internal: no fast backward"))?;
    let dev = upload_inputs(x, p)?;
    let d = upload_one(dy, p == Precision::Bf16)?;
    let g = f(m, &dev, &d, req, p)?;
    g.iter().map(|(k, v)| Ok((k.clone(), download_as::<F>(v)?))).collect()
}

/// The `fast` form from a state on host arrays (exact mode): [`host_fast_from_state_with`].
fn host_fast_from_state<F: GpuReal, T: DeviceFamily<F>>(
    m: &T::Mixer,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    host_fast_from_state_with::<F, T>(m, x, initial, Precision::Exact)
}

/// The `fast` form from a state on host arrays in mode `p`: uploads the inputs as the mode stores
/// them (the activations rounded to bf16 and uploaded as bf16 in the `bf16` mode) and the state,
/// runs the device form in `p`, reads `y` and the final state back as `F`.
fn host_fast_from_state_with<F: GpuReal, T: DeviceFamily<F>>(
    m: &T::Mixer,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    p: Precision,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let f = T::fast_from_state().ok_or_else(|| err(m.family(), "internal: no fast form from a state"))?;
    if let Some(s) = initial {
        T::check_host_state(m, x, s)?;
    }
    let dev = upload_inputs(x, p)?;
    let s0 = initial.map(|s| upload_inputs(s, Precision::Exact)).transpose()?;
    let (y, fin) = f(m, &dev, s0.as_ref(), p)?;
    let fin = fin.iter().map(|(k, v)| Ok((k.clone(), download_as::<F>(v)?))).collect::<Result<_>>()?;
    Ok((download_as::<F>(&y)?, fin))
}

/// The `fast` backward from a state on host arrays: uploads the inputs, the initial state, `dy`
/// and the final state's cotangent, runs the device backward (exact mode), reads the gradients
/// and the initial state's gradient back.
fn host_backward_from_state<F: GpuReal, T: DeviceFamily<F>>(
    m: &T::Mixer,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
    req: &Requires,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let f = T::fast_backward_from_state()
        .ok_or_else(|| err(m.family(), "internal: no fast backward from a state"))?;
    if let Some(s) = initial {
        T::check_host_state(m, x, s)?;
    }
    let dev = upload_inputs(x, Precision::Exact)?;
    let s0 = initial.map(|s| upload_inputs(s, Precision::Exact)).transpose()?;
    let df = d_final.map(|s| upload_inputs(s, Precision::Exact)).transpose()?;
    let d = upload_one(dy, false)?;
    let (g, ds) = f(m, &dev, s0.as_ref(), &d, df.as_ref(), req, Precision::Exact)?;
    let down = |t: &DeviceTensors| -> Result<Tensors<F>> {
        t.iter().map(|(k, v)| Ok((k.clone(), download_as::<F>(v)?))).collect()
    };
    Ok((down(&g)?, down(&ds)?))
}

fn host_parallel<F: GpuReal, T: DeviceFamily<F>>(m: &T::Mixer, x: &Tensors<F>) -> Result<ArrayD<F>> {
    host_parallel_with::<F, T>(m, x, Precision::Exact)
}

/// The `fast` form on host arrays (exact mode): uploads, runs the device form, reads `y` back.
pub(crate) fn host_fast<F: GpuReal, T: DeviceFamily<F>>(m: &T::Mixer, x: &Tensors<F>) -> Result<ArrayD<F>> {
    host_fast_with::<F, T>(m, x, Precision::Exact)
}

fn host_parallel_with<F: GpuReal, T: DeviceFamily<F>>(
    m: &T::Mixer,
    x: &Tensors<F>,
    p: Precision,
) -> Result<ArrayD<F>> {
    let f = T::parallel().ok_or_else(|| err(m.family(), "internal: no parallel form"))?;
    on_device(m, f, x, p)
}

fn host_fast_with<F: GpuReal, T: DeviceFamily<F>>(
    m: &T::Mixer,
    x: &Tensors<F>,
    p: Precision,
) -> Result<ArrayD<F>> {
    let f = T::fast().ok_or_else(|| err(m.family(), "internal: no fast form"))?;
    on_device(m, f, x, p)
}

/// Uploads host inputs (the activations as bf16 in the `bf16` mode), runs the device form,
/// reads `y` back as `F`.
fn on_device<F: GpuReal, M>(m: &M, f: DeviceFormFn<M>, x: &Tensors<F>, p: Precision) -> Result<ArrayD<F>> {
    let dev = upload_inputs(x, p)?;
    download_as::<F>(&f(m, &dev, p)?)
}

/// Host inputs as device tensors: every input as `F`, except the activations in the `bf16`
/// mode, which are rounded to bf16 on the host and uploaded as bf16.
pub fn upload_inputs<F: GpuReal>(x: &Tensors<F>, p: Precision) -> Result<DeviceTensors> {
    x.iter()
        .map(|(k, v)| {
            Ok((k.clone(), upload_one(v, p == Precision::Bf16 && ACTIVATIONS.contains(&k.as_str()))?))
        })
        .collect()
}

/// One host array as a device tensor: as `F`, or rounded to bf16 on the host and uploaded as
/// bf16 when `as_bf16`.
pub fn upload_one<F: GpuReal>(v: &ArrayD<F>, as_bf16: bool) -> Result<AnyDeviceTensor> {
    if as_bf16 {
        let b = v.mapv(|e| bf16::from_bits((round_bf16(e.f64() as f32).to_bits() >> 16) as u16));
        Ok(AnyDeviceTensor::Bf16(DeviceTensor::upload(&b)?))
    } else {
        Ok(F::wrap(DeviceTensor::upload(v)?))
    }
}

/// Reads a device tensor back as `F` (bf16 values are exact in `f32` and `f64`).
pub fn download_as<F: GpuReal>(y: &AnyDeviceTensor) -> Result<ArrayD<F>> {
    match y {
        AnyDeviceTensor::Bf16(t) => Ok(t.to_host()?.mapv(|b| F::of(f64::from(b.to_f32())))),
        other => F::unwrap(other)
            .ok_or_else(|| {
                err("tensor", format!("internal: a {} result where {} was expected", other.dtype(), F::ELEM))
            })?
            .to_host(),
    }
}

fn host_decoder<F: GpuReal, T: DeviceFamily<F>>(
    m: &T::Mixer,
    statics: &Tensors<F>,
    dims: &Dims,
) -> Result<Box<dyn Decoder<F>>> {
    let make = T::decoder().ok_or_else(|| err(m.family(), "internal: no decoder"))?;
    Ok(hosted_decoder(make(m, statics, dims)?))
}

/// A device decoder driven with host arrays (uploads the token, steps, reads `y`; its state read
/// back on the host): the registry's decoder on this backend, from zeros or from a state
/// ([`DeviceFamily::decoder_from_state`]).
pub fn hosted_decoder<F: GpuReal>(inner: Box<dyn StatefulDeviceDecoder<F>>) -> Box<dyn Decoder<F>> {
    Box::new(HostDecoder { inner })
}

/// The decoder of [`hosted_decoder`].
struct HostDecoder<F> {
    inner: Box<dyn StatefulDeviceDecoder<F>>,
}

impl<F: GpuReal> Decoder<F> for HostDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let dev = upload_inputs(token, Precision::Exact)?;
        download_as::<F>(&self.inner.step(&dev)?)
    }
    fn cache_elems(&self) -> usize {
        self.inner.cache_elems()
    }
    fn position(&self) -> usize {
        self.inner.position()
    }
    fn state(&self) -> Result<Tensors<F>> {
        self.inner.state()
    }
}

/// Input `name` as an `F` tensor: borrowed when it is stored as `F`, converted on the device
/// when it is a bf16 activation and `F` is `f32`.
pub fn input<'a, F: GpuReal>(x: &'a DeviceTensors, name: &str) -> Result<Cow<'a, DeviceTensor<F>>> {
    let t = x.get(name).ok_or_else(|| Error::MissingInput {
        name: name.to_string(),
        expected: "a device tensor of that name".into(),
        given: x.keys().cloned().collect::<Vec<_>>().join(", "),
    })?;
    match t {
        AnyDeviceTensor::Bf16(b) if F::ELEM == "f32" => {
            let y = bf16_to_f32(b)?;
            // `F` is `f32` here: the tensor is re-typed through its wrapper.
            Ok(Cow::Owned(
                F::unwrap(&AnyDeviceTensor::F32(y)).cloned().ok_or_else(|| err("tensor", "internal: f32"))?,
            ))
        }
        other => other.typed::<F>(name).map(Cow::Borrowed),
    }
}

/// An optional input as `F` (see [`input`]).
pub fn input_opt<'a, F: GpuReal>(
    x: &'a DeviceTensors,
    name: &str,
) -> Result<Option<Cow<'a, DeviceTensor<F>>>> {
    if x.contains_key(name) { input::<F>(x, name).map(Some) } else { Ok(None) }
}

/// A bf16 tensor converted to `f32` on the device.
pub fn bf16_to_f32(b: &DeviceTensor<bf16>) -> Result<DeviceTensor<f32>> {
    convert(b, "bf16_to_f32")
}

/// An `f32` tensor rounded to bf16 on the device (nearest, ties to even).
pub fn f32_to_bf16(a: &DeviceTensor<f32>) -> Result<DeviceTensor<bf16>> {
    convert(a, "f32_to_bf16")
}

/// `a` converted element by element by the `kernels/tensor.cu` kernel `name`
/// (`(const A*, B*, long long n)`), keeping its shape and deferred checks.
fn convert<A: DeviceScalar, B: DeviceScalar>(a: &DeviceTensor<A>, name: &str) -> Result<DeviceTensor<B>> {
    let n = a.len();
    let mut out = pool::take::<B>("tensor", n)?;
    if n > 0 {
        let g = gpu()?;
        let f = g.kernel("tensor", &kernels::TENSOR, &[], name)?;
        let av = a.view();
        let ni = n as i64;
        launch!(g, "tensor", f, grid1(n.min(1 << 20), 256); &av, &mut *out, &ni)?;
    }
    Ok(DeviceTensor::from_pooled(out, a.shape())?.with_checks(a.checks().iter().cloned()))
}

/// The form's `F` output as the call's result: bf16 storage in the `bf16` mode (from `f32`).
pub fn finish<F: GpuReal>(y: DeviceTensor<F>, p: Precision) -> Result<AnyDeviceTensor> {
    match (p, F::wrap(y)) {
        (Precision::Bf16, AnyDeviceTensor::F32(y)) => Ok(AnyDeviceTensor::Bf16(f32_to_bf16(&y)?)),
        (_, y) => Ok(y),
    }
}

/// The cotangent `dy` of a backward as `F`, checked against the shape of `y` (a bf16 `dy` is
/// converted on the device, as [`input`] converts activations).
pub fn cotangent<F: GpuReal>(dy: &AnyDeviceTensor, y_shape: &[usize]) -> Result<DeviceTensor<F>> {
    if dy.shape() != y_shape {
        return Err(Error::shape(
            "dy",
            mixer_core::error::fmt_shape(y_shape),
            mixer_core::error::fmt_shape(dy.shape()),
        ));
    }
    let one: DeviceTensors = std::iter::once(("dy".to_string(), dy.clone())).collect();
    Ok(input::<F>(&one, "dy")?.into_owned())
}

#[cfg(test)]
mod tests {
    //! Host-side: the precision mode of a host-array backward reaches this backend's entry point
    //! (`Family::precise_backward`), for the `fast` backward of every family that has one.
    use mixer_core::{Form, Precision, Requires};
    use mixer_registry::family;

    #[test]
    fn the_host_backward_takes_the_precision_mode_where_the_device_backward_exists() {
        for name in ["attention", "loglinear", "toeplitz", "glr"] {
            let e = family(name, "cuda").unwrap_or_else(|| panic!("{name} is registered on cuda"));
            let has = e.f32.implements_backward(Form::Fast);
            let m = mixer_registry::mixer(
                if name == "loglinear" { "mamba2" } else { name },
                &serde_json::json!({}),
            )
            .unwrap();
            let (x, dy) = (Default::default(), ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[0])));
            for p in [Precision::Tf32, Precision::Bf16] {
                let fast =
                    e.f32.run_precise_backward(m.as_ref(), "cuda", Form::Fast, &x, &dy, &Requires::All, p);
                assert_eq!(fast.is_some(), has, "{name} {p}");
                let par = e.f32.run_precise_backward(
                    m.as_ref(),
                    "cuda",
                    Form::Parallel,
                    &x,
                    &dy,
                    &Requires::All,
                    p,
                );
                assert!(par.is_none(), "{name} {p}: no parallel backward on cuda");
            }
        }
        assert!(family("loglinear", "cuda").unwrap().f32.implements_backward(Form::Fast));
    }
}
