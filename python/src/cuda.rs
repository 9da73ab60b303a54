//! The zero-copy CUDA path: PyTorch's CUDA tensors run on the CUDA backend in place.
//!
//! The Python layer passes each contiguous input as `(name, data_ptr, shape, dtype)`, the handle of
//! `torch.cuda.current_stream()` and an allocator (`nbytes → (tensor, data_ptr)`, `torch.empty` of
//! that many bytes on the tensors' device). Here the inputs become device tensors over the caller's
//! memory ([`mixers::cuda::DeviceTensor::borrowed`]), the run is enqueued on the caller's stream
//! ([`mixers::cuda::on_stream`]) with every buffer it needs (scratch and outputs) taken from the
//! caller's allocator ([`mixers::cuda::pool::with_allocator`]), and each output goes back as
//! `(tensor, byte offset, shape, dtype)`: the PyTorch tensor that owns its memory, which the Python
//! layer views as the output. Nothing is copied and nothing waits for the device; the GIL is
//! released while the work is enqueued and taken again only inside the allocator.
//!
//! Value constraints (finite inputs, `g ≤ 0`, `β ∈ [0, 1]`, …) are not checked here: on the
//! device their outcome can only be read back by waiting for the stream. Shapes, sizes and dtypes
//! are checked on the host as for every device call.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use mixer_core::mixer::Mixer;
use mixer_core::{Error, Form, Precision, Requires};
use mixers::cuda::device_call::{self, Call};
use mixers::cuda::device_state::Cotangents;
use mixers::cuda::pool::ExternalAlloc;
use mixers::cuda::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::{OrPy, build};

/// One CUDA tensor as the Python layer passes it: name, `data_ptr()`, shape, dtype (`"f32"`,
/// `"f64"` or `"bf16"`).
type Raw = (String, u64, Vec<usize>, String);

/// One output as it goes back: the PyTorch tensor owning its memory, the byte offset into it,
/// the shape and the dtype.
type Out = (Py<PyAny>, usize, Vec<usize>, &'static str);

/// The device the CUDA backend runs on in this process, binding it to device `index` (the first
/// CUDA tensor's) unless the backend has started or `MIXERS_CUDA_DEVICE` chooses it: the ordinal,
/// or `-1` where the backend cannot start (the host path then reports why).
#[pyfunction]
pub fn cuda_bind_device(index: usize) -> i64 {
    use mixers::cuda::runtime::{DEVICE_VAR, gpu, select_device};
    if std::env::var_os(DEVICE_VAR).is_none() {
        // An error only says that the backend started on another device, which `gpu()` tells.
        let _ = select_device(index);
    }
    gpu().map_or(-1, |g| g.ordinal as i64)
}

/// A device tensor over the caller's memory, of the dtype named.
fn borrowed(name: &str, ptr: u64, shape: &[usize], dtype: &str) -> mixer_core::Result<AnyDeviceTensor> {
    let unit = || Box::new(()) as Box<dyn Any + Send + Sync>;
    // SAFETY: the Python layer passes the `data_ptr()` of a contiguous CUDA tensor of this shape
    // and dtype on the backend's device, and keeps the tensor alive for the call; the work is enqueued on
    // the caller's current stream, which orders it before any later reuse of that memory.
    unsafe {
        Ok(match dtype {
            "f32" => AnyDeviceTensor::F32(DeviceTensor::<f32>::borrowed(ptr, shape, unit())?),
            "f64" => AnyDeviceTensor::F64(DeviceTensor::<f64>::borrowed(ptr, shape, unit())?),
            "bf16" => AnyDeviceTensor::Bf16(DeviceTensor::<bf16>::borrowed(ptr, shape, unit())?),
            other => {
                return Err(Error::Value {
                    name: name.to_string(),
                    constraint: "a float32, float64 or bfloat16 CUDA tensor".into(),
                    found: format!("dtype {other}"),
                });
            }
        })
    }
}

/// A PyTorch tensor that owns device memory the library uses: released under the GIL when the
/// library drops it (at once, not at Python's next convenience, so that PyTorch can hand the
/// memory to the next allocation on the stream, and its statistics see it freed).
struct Owner(Option<Py<PyAny>>);

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            Python::attach(|_| drop(t));
        }
    }
}

/// The caller's allocator as the backend's: each request calls `alloc(nbytes)` under the GIL,
/// which returns `(tensor, data_ptr)`; the tensor is the memory's owner.
fn allocator(alloc: Py<PyAny>) -> Arc<ExternalAlloc> {
    Arc::new(move |bytes: usize| {
        Python::attach(|py| -> PyResult<(u64, Box<dyn Any + Send + Sync>)> {
            let r = alloc.call1(py, (bytes,))?;
            let (owner, ptr): (Py<PyAny>, u64) = r.bind(py).extract()?;
            Ok((ptr, Box::new(Owner(Some(owner)))))
        })
        .map_err(|e| Error::Backend {
            backend: "cuda".into(),
            family: None,
            message: format!("allocating {bytes} bytes through PyTorch: {e}"),
        })
    })
}

/// Runs `f` on the caller's stream with the caller's allocator, the GIL released.
fn enqueue<R: Send>(
    py: Python<'_>,
    stream: u64,
    alloc: Py<PyAny>,
    f: impl FnOnce() -> mixer_core::Result<R> + Send,
) -> PyResult<R> {
    let alloc = allocator(alloc);
    py.detach(|| {
        // SAFETY: `stream` is `torch.cuda.current_stream().cuda_stream` of the backend's device, alive for the
        // call (PyTorch owns it).
        let s = unsafe { mixers::cuda::borrowed_stream(stream) }?;
        mixers::cuda::on_stream(s, || mixers::cuda::pool::with_allocator(alloc, f))
    })
    .or_py()
}

/// The inputs as device tensors over the caller's memory.
fn device_inputs(inputs: &[Raw]) -> mixer_core::Result<DeviceTensors> {
    inputs.iter().map(|(n, p, s, d)| Ok((n.clone(), borrowed(n, *p, s, d)?))).collect()
}

/// An output as `(owner tensor, byte offset, shape, dtype)`.
fn out(py: Python<'_>, what: &str, t: &AnyDeviceTensor) -> PyResult<Out> {
    let (owner, dtype) = match t {
        AnyDeviceTensor::F32(x) => (x.external_owner(), "f32"),
        AnyDeviceTensor::F64(x) => (x.external_owner(), "f64"),
        AnyDeviceTensor::Bf16(x) => (x.external_owner(), "bf16"),
    };
    let (owner, offset) = owner
        .and_then(|(o, off)| {
            o.downcast_ref::<Owner>().and_then(|o| o.0.as_ref()).map(|o| (o.clone_ref(py), off))
        })
        .ok_or_else(|| {
            PyValueError::new_err(format!("internal: {what} was not allocated through PyTorch's allocator"))
        })?;
    Ok((owner, offset, t.shape().to_vec(), dtype))
}

/// The name of `m`'s state at the sizes of the device inputs `x`, for a mixer whose state is one
/// tensor (the PyTorch op's contract: linear attention, Mamba-2, gated DeltaNet); the library's
/// error otherwise (`NotImplementedError` in Python).
fn state_name(m: &dyn Mixer, x: &DeviceTensors) -> mixer_core::Result<String> {
    let shapes = x.iter().map(|(k, v)| (k.clone(), v.shape().to_vec())).collect();
    let dims = m.spec().bind(&shapes)?;
    let layout = mixer_registry::state::shapes(m, &dims, None)?;
    match layout.as_slice() {
        [(name, _)] => Ok(name.clone()),
        _ => Err(Error::FormUnavailable {
            mixer: m.name().into(),
            form: "fast (from a state, zero-copy)".into(),
            backend: "cuda".into(),
            available: format!("none (a state of {} tensors; the PyTorch op takes one)", layout.len()),
        }),
    }
}

/// A state passed as one tensor, as the map named after `m`'s state.
fn state_map(m: &dyn Mixer, x: &DeviceTensors, raw: &Raw) -> mixer_core::Result<DeviceTensors> {
    let name = state_name(m, x)?;
    Ok(std::iter::once((name, borrowed(&raw.0, raw.1, &raw.2, &raw.3)?)).collect())
}

/// The single tensor of a state map.
fn single(what: &str, s: &DeviceTensors) -> PyResult<AnyDeviceTensor> {
    match s.values().collect::<Vec<_>>().as_slice() {
        [t] => Ok((*t).clone()),
        other => {
            Err(PyValueError::new_err(format!("internal: {what} has {} tensors, expected one", other.len())))
        }
    }
}

/// The `parallel` or `fast` form of mixer `name` (JSON `config`) on CUDA tensors, enqueued on
/// the stream `stream` with every buffer from `alloc` (see the module's documentation); returns
/// `y` and, with `want_final`, the final state, each as `(owner tensor, byte offset, shape,
/// dtype)`. With `initial` (the state as one tensor, `Raw` like the inputs) or `want_final` the
/// `fast` form runs from the state (zeros without one), in the mode asked
/// (`mixers::cuda::run_device_from_state`). With `cu_seqlens` (the offsets of a packed batch,
/// `B = 1`) the `fast` form runs sequence by sequence on views of the buffer, each from its row of
/// `initial` (`mixers::cuda::run_device_packed`). With `saving` (and neither a state nor
/// `want_final`) the forward runs for a backward, and the third output is what the CUDA backend
/// saves for that backward (attention on tensor cores: each row's softmax statistics;
/// `mixers::cuda::device_call::forward_saving`), `None` where nothing is saved: give it to
/// [`cuda_backward`] as the input `y_stats` with `y`, and the backward skips the forward.
#[pyfunction]
#[pyo3(signature = (name, inputs, stream, alloc, config=None, form="fast", precision="exact", initial=None, want_final=false, cu_seqlens=None, saving=false))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_forward(
    py: Python<'_>,
    name: &str,
    inputs: Vec<Raw>,
    stream: u64,
    alloc: Py<PyAny>,
    config: Option<&str>,
    form: &str,
    precision: &str,
    initial: Option<Raw>,
    want_final: bool,
    cu_seqlens: Option<Vec<usize>>,
    saving: bool,
) -> PyResult<(Out, Option<Out>, Option<Out>)> {
    let m = build(name, config)?;
    let form: Form = form.parse().or_py()?;
    let precision = Precision::parse(precision).or_py()?;
    let saving = saving && initial.is_none() && !want_final;
    let (y, fin, saved) = enqueue(py, stream, alloc, || {
        let x = device_inputs(&inputs)?;
        let s0 = initial.as_ref().map(|r| state_map(m.as_ref(), &x, r)).transpose()?;
        let call =
            Call { form, precision, initial: s0.as_ref(), cu_seqlens: cu_seqlens.as_deref(), checks: false };
        if saving {
            let (y, saved) = device_call::forward_saving(m.as_ref(), &x, &call)?;
            return Ok((y, None, saved));
        }
        let (y, fin) = device_call::forward(m.as_ref(), &x, &call, want_final)?;
        Ok((y, fin, None))
    })?;
    let fin = fin.map(|f| out(py, "final_state", &single("the final state", &f)?)).transpose()?;
    let saved = saved.map(|s| out(py, mixer_core::grad::SAVED_STATISTICS, &s)).transpose()?;
    Ok((out(py, "y", &y)?, fin, saved))
}

/// The `fast` backward of mixer `name` on CUDA tensors for the cotangent `dy` (shape of `y`;
/// bf16 in the `bf16` mode), enqueued like [`cuda_forward`]; returns `{"d_<input>": output}`
/// for every input in `requires` (default: all). With `initial` or `d_final` (the final state's
/// cotangent; each one tensor) it is the backward from the state (computed in the exact mode on
/// the values as the mode stores them), and with `initial` the result also holds
/// `"d_initial_state"`. With `cu_seqlens`, the backward of a packed batch
/// (`mixers::cuda::backward_device_packed`).
#[pyfunction]
#[pyo3(signature = (name, inputs, dy, stream, alloc, config=None, precision="exact", requires=None, initial=None, d_final=None, cu_seqlens=None))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_backward(
    py: Python<'_>,
    name: &str,
    inputs: Vec<Raw>,
    dy: Raw,
    stream: u64,
    alloc: Py<PyAny>,
    config: Option<&str>,
    precision: &str,
    requires: Option<Vec<String>>,
    initial: Option<Raw>,
    d_final: Option<Raw>,
    cu_seqlens: Option<Vec<usize>>,
) -> PyResult<BTreeMap<String, Out>> {
    let m = build(name, config)?;
    let precision = Precision::parse(precision).or_py()?;
    let requires = requires.map_or(Requires::All, Requires::only);
    let (grads, d_init) = enqueue(py, stream, alloc, || {
        let x = device_inputs(&inputs)?;
        let d = borrowed(&dy.0, dy.1, &dy.2, &dy.3)?;
        let s0 = initial.as_ref().map(|r| state_map(m.as_ref(), &x, r)).transpose()?;
        let df = d_final.as_ref().map(|r| state_map(m.as_ref(), &x, r)).transpose()?;
        let call = Call {
            form: Form::Fast,
            precision,
            initial: s0.as_ref(),
            cu_seqlens: cu_seqlens.as_deref(),
            checks: false,
        };
        let c = Cotangents { dy: &d, d_final: df.as_ref(), requires: &requires };
        device_call::backward(m.as_ref(), &x, &call, c)
    })?;
    let mut res: BTreeMap<String, Out> =
        grads.iter().map(|(k, v)| Ok((k.clone(), out(py, k, v)?))).collect::<PyResult<_>>()?;
    if initial.is_some() {
        res.insert(
            "d_initial_state".into(),
            out(py, "d_initial_state", &single("the initial state's gradient", &d_init)?)?,
        );
    }
    Ok(res)
}
