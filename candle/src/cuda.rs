//! The ops on candle's CUDA tensors (feature `cuda`): [`MixerOp`]'s `cuda_fwd` and the CUDA
//! side of its backward run the library's CUDA backend on the packed buffer where it lies, on
//! candle's stream, through `mixer_cuda::device_call` (the entry the Python package's zero-copy
//! path takes too).
//!
//! - The backend is bound to the tensors' device (one device per process); it enqueues its
//!   kernels on candle's stream, so they are ordered with candle's own work, and takes its
//!   scratch memory from its pool for that stream. Nothing waits for the device.
//! - Each part of the flat argument is read in place when it starts on a 16-byte boundary (the
//!   kernels' vector loads), else copied once into an aligned buffer. `y` and the final state
//!   are copied into the flat result candle owns (one copy of the output).
//! - In the `bf16` mode the activations (`x`, `q`, `k`, `v`) are rounded to bf16 on the device
//!   first and `y` is widened back to `f32` after, the values the CPU path's rounding gives.
//! - What the device forms do not have (a run from a state of the lifts, the GLR or the
//!   Toeplitz mixer, a backward the backend lacks, an op whose backend is not `cuda`) runs on
//!   the host on a copy of the buffers, as the CPU path does, and comes back to the device.
//! - As in the Python package's zero-copy path, the value constraints of the inputs (finite
//!   values, `g ≤ 0`, `β ∈ [0, 1]`, …) are not checked on the device: reading their outcome
//!   would wait for the stream. Shapes, sizes and dtypes are checked on the host.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, result as driver};
use candle_core::cuda_backend::{CudaDType, CudaDevice};
use candle_core::{CudaStorage, DType, Layout, Shape, WithDType};
use mixer_core::precision::ACTIVATIONS;
use mixer_core::{Form, Precision, Requires};
use mixer_cuda::device_call::{self, Call};
use mixer_cuda::device_state::Cotangents;
use mixer_cuda::forms::{bf16_to_f32, f32_to_bf16};
use mixer_cuda::tensor::DeviceScalar;
use mixer_cuda::{AnyDeviceTensor, DeviceTensor, DeviceTensors};
use mixer_registry::Scalar;

use crate::error::{Error, lib};
use crate::op::MixerOp;
use crate::packing::{Packing, part};

/// An element type of the packed buffers on CUDA: `f32` or `f64`.
pub(crate) trait Elem: Scalar + WithDType + CudaDType + DeviceScalar {}
impl Elem for f32 {}
impl Elem for f64 {}

/// Binds the library's CUDA backend to the device of `dev` and returns candle's stream of it
/// as the backend's stream.
fn bind(name: &str, dev: &CudaDevice) -> candle_core::Result<Arc<CudaStream>> {
    use mixer_cuda::runtime::{DEVICE_VAR, gpu, select_device};
    let stream = dev.cuda_stream();
    let ordinal = stream.context().ordinal();
    if std::env::var_os(DEVICE_VAR).is_none() {
        // An error only says that the backend started on another device, which `gpu()` tells.
        let _ = select_device(ordinal);
    }
    let g = lib(gpu())?;
    if g.ordinal != ordinal {
        return Err(Error::Device {
            name: name.into(),
            expected: format!(
                "CUDA device {} (the library's CUDA backend runs on one device per process)",
                g.ordinal
            ),
            got: format!("CUDA device {ordinal}"),
        }
        .into());
    }
    // SAFETY: candle's stream of the backend's device, alive while `dev` is (the caller holds it
    // for the call).
    lib(unsafe { mixer_cuda::borrowed_stream(stream.cu_stream() as u64) })
}

/// Copies `n` elements of `F` from device address `src` to `dst` on `stream`.
fn copy<F>(dst: u64, src: u64, n: usize, stream: &CudaStream) -> candle_core::Result<()> {
    if n == 0 {
        return Ok(());
    }
    // SAFETY: both ranges hold `n` elements of `F` on the stream's device, alive until the copy
    // has run (the caller's buffers are owned by tensors the stream's later work depends on).
    unsafe { driver::memcpy_dtod_async(dst, src, n * std::mem::size_of::<F>(), stream.cu_stream()) }
        .map_err(|e| candle_core::Error::Cuda(Box::new(e)))
}

/// The device address of element `start` of `s` on `stream`.
fn address<F, S: DevicePtr<F>>(s: &S, start: usize, stream: &CudaStream) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p + (start * std::mem::size_of::<F>()) as u64
}

/// The parts of the flat buffer at device address `base` as device tensors: read in place
/// where aligned, else copied into an aligned buffer; the activations rounded to bf16 in the
/// `bf16` mode.
fn parts<F: Elem>(
    p: &Packing,
    base: u64,
    precision: Precision,
    stream: &CudaStream,
) -> candle_core::Result<DeviceTensors> {
    let mut out = DeviceTensors::new();
    for (name, shape, range) in p.ranges() {
        let at = base + (range.start * std::mem::size_of::<F>()) as u64;
        let t: DeviceTensor<F> = if at.is_multiple_of(16) {
            // SAFETY: `range` lies inside the caller's buffer, alive for the call, and the work
            // is enqueued on the stream that orders every later use of it.
            lib(unsafe { DeviceTensor::borrowed(at, shape, Box::new(())) })?
        } else {
            let t = lib(DeviceTensor::<F>::zeros(shape))?;
            copy::<F>(address(&t.view(), 0, stream), at, range.len(), stream)?;
            t
        };
        let t = match (precision, F::wrap(t)) {
            (Precision::Bf16, AnyDeviceTensor::F32(t)) if ACTIVATIONS.contains(&name) => {
                AnyDeviceTensor::Bf16(lib(f32_to_bf16(&t))?)
            }
            (_, t) => t,
        };
        out.insert(name.to_string(), t);
    }
    Ok(out)
}

/// `f64` tensors take the exact mode: the `tf32` and `bf16` modes compute in `f32`.
fn check_mode<F: Elem>(op: &str, precision: Precision) -> candle_core::Result<()> {
    if <F as WithDType>::DTYPE == DType::F64 && precision != Precision::Exact {
        return Err(Error::Dtype {
            name: op.into(),
            expected: format!(
                "F32 tensors (the {precision} mode computes in f32; F64 runs in the exact mode)"
            ),
            got: DType::F64,
        }
        .into());
    }
    Ok(())
}

/// A device tensor's elements as `F` (bf16 widened to `f32`).
fn as_elem<F: Elem>(t: &AnyDeviceTensor, what: &str) -> candle_core::Result<DeviceTensor<F>> {
    let t = match t {
        AnyDeviceTensor::Bf16(b) => AnyDeviceTensor::F32(lib(bf16_to_f32(b))?),
        other => other.clone(),
    };
    F::unwrap(&t).cloned().ok_or_else(|| {
        Error::Packing {
            op: what.into(),
            expected: format!("an {} device tensor", F::ELEM),
            got: format!("a {} one", t.dtype()),
        }
        .into()
    })
}

/// The flat result of `p`'s parts taken from `tensors` (each converted to `F`), in a buffer
/// candle owns.
fn assemble<F: Elem>(
    op: &str,
    p: &Packing,
    tensors: &DeviceTensors,
    dev: &CudaDevice,
    stream: &CudaStream,
) -> candle_core::Result<CudaSlice<F>> {
    let out = dev.alloc_zeros::<F>(p.len())?;
    let base = address(&out, 0, stream);
    for (name, shape, range) in p.ranges() {
        let t = part(op, tensors, name, shape, AnyDeviceTensor::shape)?;
        let t = as_elem::<F>(t, op)?;
        let dst = base + (range.start * std::mem::size_of::<F>()) as u64;
        copy::<F>(dst, address(&t.view(), 0, stream), range.len(), stream)?;
    }
    Ok(out)
}

/// The flat buffer of `s` (of layout `l`) as `F`, or the error for another dtype.
fn flat<'a, F: Elem>(
    op: &str,
    s: &'a CudaStorage,
    l: &Layout,
) -> candle_core::Result<(&'a CudaSlice<F>, usize)> {
    let (start, _) = l.contiguous_offsets().ok_or_else(|| Error::Packing {
        op: op.into(),
        expected: "a contiguous buffer".into(),
        got: format!("strides {:?}", l.stride()),
    })?;
    Ok((s.as_cuda_slice::<F>()?, start))
}

/// A library result on the device: `None` where the device forms lack what was asked
/// (`FormUnavailable`: the host path then runs it).
fn or_unavailable<T>(r: mixer_core::Result<T>) -> candle_core::Result<Option<T>> {
    match r {
        Ok(t) => Ok(Some(t)),
        Err(mixer_core::Error::FormUnavailable { .. }) => Ok(None),
        Err(e) => Err(Error::Mixers(e).into()),
    }
}

/// Runs `host` on the host copies of `args` (each a buffer and its start) and puts its result
/// on `dev`: the path for what the device forms lack.
fn on_host<F: Elem>(
    dev: &CudaDevice,
    args: &[(&CudaSlice<F>, usize, usize)],
    host: impl FnOnce(&[Vec<F>]) -> candle_core::Result<Vec<F>>,
) -> candle_core::Result<CudaSlice<F>> {
    let copies = args
        .iter()
        .map(|(s, start, len)| dev.clone_dtoh(&s.slice(*start..*start + *len)))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let out = host(&copies)?;
    dev.clone_htod(out.as_slice())
}

impl MixerOp {
    /// Elements of the flat argument: the inputs, then the initial state.
    fn arg_len(&self) -> usize {
        self.inputs.len() + self.initial.as_ref().map_or(0, Packing::len)
    }

    /// The argument's parts on the device: the inputs and the initial state.
    fn device_args<F: Elem>(
        &self,
        base: u64,
        stream: &CudaStream,
    ) -> candle_core::Result<(DeviceTensors, Option<DeviceTensors>)> {
        let p = self.run.precision;
        let inputs = parts::<F>(&self.inputs, base, p, stream)?;
        let initial = match &self.initial {
            Some(s) => {
                let at = base + (self.inputs.len() * std::mem::size_of::<F>()) as u64;
                Some(parts::<F>(s, at, Precision::Exact, stream)?)
            }
            None => None,
        };
        Ok((inputs, initial))
    }

    /// Runs `device` on the CUDA backend, bound to `dev` and on candle's stream, with the
    /// argument `(buf, start)`'s parts and the call's options (form `form`): its flat result, or
    /// `None` where the op's backend is not `cuda` or `device` returns `None` (the host path then
    /// runs the call).
    fn on_device<F: Elem>(
        &self,
        dev: &CudaDevice,
        form: Form,
        (buf, start): (&CudaSlice<F>, usize),
        device: impl FnOnce(&CudaStream, &DeviceTensors, &Call<'_>) -> candle_core::Result<Option<CudaSlice<F>>>,
    ) -> candle_core::Result<Option<CudaSlice<F>>> {
        if self.run.backend.name() != "cuda" {
            return Ok(None);
        }
        check_mode::<F>(self.name, self.run.precision)?;
        let stream = bind(self.name, dev)?;
        mixer_cuda::on_stream(stream.clone(), || {
            let (x, s0) = self.device_args::<F>(address(buf, start, &stream), &stream)?;
            let call = Call {
                form,
                precision: self.run.precision,
                initial: s0.as_ref(),
                cu_seqlens: self.run.cu_seqlens.as_deref(),
                checks: false,
            };
            device(&stream, &x, &call)
        })
    }

    /// `cuda_fwd` for elements `F`.
    pub(crate) fn cuda_forward<F: Elem>(
        &self,
        s: &CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let (buf, start) = flat::<F>(self.name, s, l)?;
        let dev = s.device();
        let out = self.on_device(dev, self.run.form, (buf, start), |stream, x, call| {
            let Some((y, fin)) =
                or_unavailable(device_call::forward(self.mixer.as_ref(), x, call, self.with_state))?
            else {
                return Ok(None);
            };
            let mut all = fin.unwrap_or_default();
            all.insert("y".into(), y);
            assemble::<F>(self.name, &self.output, &all, dev, stream).map(Some)
        })?;
        let out = match out {
            Some(out) => out,
            None => on_host::<F>(dev, &[(buf, start, self.arg_len())], |h| self.forward(&h[0]))?,
        };
        Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), Shape::from(self.output.len())))
    }

    /// The backward's `cuda_fwd` for elements `F`: the flat cotangent of the argument from the
    /// argument `(s, l)` and the flat cotangent of the result `(d, ld)`.
    pub(crate) fn cuda_backward<F: Elem>(
        &self,
        s: &CudaStorage,
        l: &Layout,
        d: &CudaStorage,
        ld: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let (buf, start) = flat::<F>(self.name, s, l)?;
        let (dbuf, dstart) = flat::<F>(self.name, d, ld)?;
        let dev = s.device();
        let out = self.on_device(dev, Form::Fast, (buf, start), |stream, x, call| {
            let mut douts =
                parts::<F>(&self.output, address(dbuf, dstart, stream), Precision::Exact, stream)?;
            let dy = douts.remove("y").ok_or_else(|| Error::Packing {
                op: self.name.into(),
                expected: "a part `y`".into(),
                got: "none".into(),
            })?;
            let dy = match (self.run.precision, dy) {
                (Precision::Bf16, AnyDeviceTensor::F32(t)) => AnyDeviceTensor::Bf16(lib(f32_to_bf16(&t))?),
                (_, t) => t,
            };
            let c =
                Cotangents { dy: &dy, d_final: self.with_state.then_some(&douts), requires: &Requires::All };
            let Some((grads, d_init)) =
                or_unavailable(device_call::backward(self.mixer.as_ref(), x, call, c))?
            else {
                return Ok(None);
            };
            let mut all: DeviceTensors = grads
                .into_iter()
                .map(|(k, v)| (k.strip_prefix("d_").map(str::to_string).unwrap_or(k), v))
                .collect();
            let mut p = self.inputs.parts().to_vec();
            if let Some(i) = &self.initial {
                p.extend(i.parts().iter().cloned());
                all.extend(d_init);
            }
            assemble::<F>(self.name, &Packing::new(p), &all, dev, stream).map(Some)
        })?;
        let n = self.arg_len();
        let out = match out {
            Some(out) => out,
            None => {
                let args = [(buf, start, n), (dbuf, dstart, self.output.len())];
                on_host::<F>(dev, &args, |h| self.backward(&h[0], &h[1], None))?
            }
        };
        Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), Shape::from(n)))
    }
}
