//! `mixers._mixers`: the Rust side of the Python package `mixers`.
//!
//! Every function takes a registered mixer's name and JSON config, named numpy arrays
//! (`float32` or `float64`, all of one call in the same dtype, any strides) and the options of
//! one call, and runs the registry ([`mixer_registry::call`]): the plain form, a run from a
//! state, or a packed batch (`cu_seqlens`), forward or backward, on a backend chosen by name.
//! Each input is copied once into an owned row-major array; the computation runs with the GIL
//! released; outputs are moved into new numpy arrays without a copy. Errors of the library
//! become Python exceptions with the library's message: `ValueError` for bad input (shapes,
//! names, values, configs, dtypes), `NotImplementedError` for a form, state or backward that a
//! mixer or backend does not have, `RuntimeError` otherwise (backend failures, a backend not
//! available on this machine, memory limits, numerical failures).
//!
//! [`cuda`] is the zero-copy path of PyTorch's CUDA tensors (device pointers, the caller's stream
//! and allocator).

use std::collections::BTreeMap;

use mixer_core::{AnyTensors, Error, Form, Precision, Requires, Tensor, Tensors};
use mixer_registry::call::Target;
use mixer_registry::{Backend, Scalar};
use ndarray::ArrayD;
use numpy::{IntoPyArray, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod cuda;

// Registration is link-time: the builtin backends (through `mixers`) and the example plugin
// are linked only because this crate names them.
use mixers as _;
#[cfg(feature = "example-plugin")]
use mixers_plugin_fibonacci as _;

/// The Python exception for a library error: its message, in the class that says what went
/// wrong.
pub(crate) fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Shape { .. }
        | Error::MissingInput { .. }
        | Error::UnexpectedInput { .. }
        | Error::Value { .. }
        | Error::Unknown { .. }
        | Error::NotRegistered { .. }
        | Error::Duplicate { .. }
        | Error::Config { .. }
        | Error::Pattern { .. }
        | Error::MissingSize { .. }
        | Error::Io(_) => PyValueError::new_err(msg),
        // Also a mixer without a state asked for one (`mixer_core::state::no_state`).
        Error::FormUnavailable { .. } => PyNotImplementedError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// Result of library code, as a Python result.
pub(crate) trait OrPy<T> {
    fn or_py(self) -> PyResult<T>;
}

impl<T> OrPy<T> for mixer_core::Result<T> {
    fn or_py(self) -> PyResult<T> {
        self.map_err(py_err)
    }
}

/// One numpy array as a library tensor (one copy into an owned row-major array); `what` names
/// it in the error for another dtype.
fn tensor_of(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    if let Ok(a) = obj.cast::<PyArrayDyn<f64>>() {
        return Ok(Tensor::F64(a.readonly().as_array().as_standard_layout().into_owned()));
    }
    if let Ok(a) = obj.cast::<PyArrayDyn<f32>>() {
        return Ok(Tensor::F32(a.readonly().as_array().as_standard_layout().into_owned()));
    }
    let found = match obj.cast::<numpy::PyUntypedArray>() {
        Ok(a) => format!("a numpy array of dtype {}", a.dtype()),
        Err(_) => format!("a {}", obj.get_type().name()?),
    };
    Err(PyValueError::new_err(format!("{what}: expected a float32 or float64 numpy array, got {found}")))
}

/// Named numpy arrays (a dict) as library tensors of one dtype.
fn tensors_of(what: &str, dict: &Bound<'_, PyDict>) -> PyResult<AnyTensors> {
    let mut map = BTreeMap::new();
    for (k, v) in dict.iter() {
        let name: String = k.extract()?;
        let t = tensor_of(&format!("{what} `{name}`"), &v)?;
        map.insert(name, t);
    }
    AnyTensors::from_tensors(map).or_py()
}

/// Named arrays that must have the scalar type `F` of the inputs (a state, its cotangent).
fn typed<F: Scalar>(what: &str, dict: Option<&Bound<'_, PyDict>>) -> PyResult<Option<Tensors<F>>> {
    let Some(dict) = dict else { return Ok(None) };
    let mut out = Tensors::new();
    for (k, v) in dict.iter() {
        let name: String = k.extract()?;
        out.insert(name.clone(), one::<F>(&format!("{what} `{name}`"), &v)?);
    }
    Ok(Some(out))
}

/// One array that must have the scalar type `F` of the inputs.
fn one<F: Scalar>(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<ArrayD<F>> {
    let t = tensor_of(what, obj)?;
    let dtype = t.dtype();
    F::untag(t).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{what}: expected {} like the inputs, got {}",
            F::DTYPE.name(),
            dtype.name()
        ))
    })
}

/// Named arrays as a dict of numpy arrays (moved, not copied).
fn dict_of<'py, F: Scalar + numpy::Element>(py: Python<'py>, t: Tensors<F>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in t {
        d.set_item(k, v.into_pyarray(py))?;
    }
    Ok(d)
}

/// A mixer from its name and JSON config (`None` or empty: `{}`).
pub(crate) fn build(name: &str, config: Option<&str>) -> PyResult<Box<dyn mixer_core::Mixer>> {
    let cfg = match config.map(str::trim).filter(|c| !c.is_empty()) {
        Some(c) => serde_json::from_str(c)
            .map_err(|e| PyValueError::new_err(format!("config of `{name}`: invalid JSON ({e}): {c}")))?,
        None => serde_json::json!({}),
    };
    mixer_registry::mixer(name, &cfg).or_py()
}

/// The options of one call, parsed.
struct Call {
    mixer: Box<dyn mixer_core::Mixer>,
    backend: Backend,
    form: Form,
    cu_seqlens: Option<Vec<usize>>,
}

impl Call {
    fn new(
        name: &str,
        config: Option<&str>,
        form: &str,
        backend: &str,
        cu_seqlens: Option<Vec<usize>>,
    ) -> PyResult<Self> {
        Ok(Call {
            mixer: build(name, config)?,
            backend: Backend::by_name(backend).or_py()?,
            form: form.parse().or_py()?,
            cu_seqlens,
        })
    }

    /// The registry's view of the call.
    fn target(&self) -> Target<'_> {
        Target::new(self.mixer.as_ref(), &self.backend, self.form).packed(self.cu_seqlens.as_deref())
    }
}

/// Runs `form` of mixer `name` (JSON `config`) on `backend` over the named arrays `inputs`
/// (docs/math.md names: `q`, `k`, `v`, `g`, `x`, …). With `cu_seqlens` the single batch row holds
/// packed sequences; with `initial` (the state's named arrays) or `want_final`, the run starts
/// from that state (zeros without one) and returns the final state. `precision` is `exact`,
/// `tf32` or `bf16` (the last two take float32 inputs). Returns `(y, final_state or None)`.
#[pyfunction]
#[pyo3(signature = (name, inputs, config=None, form="fast", backend="cpu", precision="exact", cu_seqlens=None, initial=None, want_final=false))]
#[allow(clippy::too_many_arguments)]
fn forward<'py>(
    py: Python<'py>,
    name: &str,
    inputs: &Bound<'py, PyDict>,
    config: Option<&str>,
    form: &str,
    backend: &str,
    precision: &str,
    cu_seqlens: Option<Vec<usize>>,
    initial: Option<&Bound<'py, PyDict>>,
    want_final: bool,
) -> PyResult<(Bound<'py, PyAny>, Option<Bound<'py, PyDict>>)> {
    let call = Call::new(name, config, form, backend, cu_seqlens)?;
    let precision = Precision::parse(precision).or_py()?;
    match tensors_of("input", inputs)? {
        AnyTensors::F32(x) => forward_typed(py, &call, x, initial, want_final, precision),
        AnyTensors::F64(x) => forward_typed(py, &call, x, initial, want_final, precision),
    }
}

fn forward_typed<'py, F: Scalar + numpy::Element>(
    py: Python<'py>,
    call: &Call,
    x: Tensors<F>,
    initial: Option<&Bound<'py, PyDict>>,
    want_final: bool,
    precision: Precision,
) -> PyResult<(Bound<'py, PyAny>, Option<Bound<'py, PyDict>>)> {
    let initial = typed::<F>("initial state", initial)?;
    let (y, fin) = py
        .detach(|| mixer_registry::call::forward(call.target(), &x, initial.as_ref(), want_final, precision))
        .or_py()?;
    let fin = fin.map(|f| dict_of(py, f)).transpose()?;
    Ok((y.into_pyarray(py).into_any(), fin))
}

/// The backward of [`forward`] with the same `inputs`, `cu_seqlens` and `initial`: from the
/// cotangent `dy` of `y` and `d_final` of the final state (`None`: zero), returns
/// `(grads, d_initial)`: `d_<input>` for every input in `requires` (default: all) and the
/// initial state's gradient (empty without an initial state). `form` is the backward form
/// (default: `forward_form` when the backend has a backward of that form, else `fast`, else
/// `materialized`).
#[pyfunction]
#[pyo3(signature = (name, inputs, dy, config=None, form=None, forward_form="fast", backend="cpu", cu_seqlens=None, initial=None, d_final=None, requires=None))]
#[allow(clippy::too_many_arguments)]
fn backward<'py>(
    py: Python<'py>,
    name: &str,
    inputs: &Bound<'py, PyDict>,
    dy: &Bound<'py, PyAny>,
    config: Option<&str>,
    form: Option<&str>,
    forward_form: &str,
    backend: &str,
    cu_seqlens: Option<Vec<usize>>,
    initial: Option<&Bound<'py, PyDict>>,
    d_final: Option<&Bound<'py, PyDict>>,
    requires: Option<Vec<String>>,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyDict>)> {
    let mut call = Call::new(name, config, forward_form, backend, cu_seqlens)?;
    let asked = form.map(str::parse).transpose().or_py()?;
    call.form = mixer_registry::call::grad_form(call.mixer.as_ref(), call.backend.name(), asked, call.form)
        .or_py()?;
    let requires = match requires {
        Some(r) => Requires::only(r),
        None => Requires::All,
    };
    match tensors_of("input", inputs)? {
        AnyTensors::F32(x) => backward_typed(py, &call, x, dy, initial, d_final, &requires),
        AnyTensors::F64(x) => backward_typed(py, &call, x, dy, initial, d_final, &requires),
    }
}

fn backward_typed<'py, F: Scalar + numpy::Element>(
    py: Python<'py>,
    call: &Call,
    x: Tensors<F>,
    dy: &Bound<'py, PyAny>,
    initial: Option<&Bound<'py, PyDict>>,
    d_final: Option<&Bound<'py, PyDict>>,
    requires: &Requires,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyDict>)> {
    let dy = one::<F>("dy", dy)?;
    let initial = typed::<F>("initial state", initial)?;
    let d_final = typed::<F>("final state's cotangent", d_final)?;
    let (grads, d_init) = py
        .detach(|| {
            let at = call.target();
            mixer_registry::call::backward(
                at,
                &x,
                initial.as_ref(),
                &dy,
                d_final.as_ref(),
                requires,
                Precision::Exact,
            )
        })
        .or_py()?;
    Ok((dict_of(py, grads)?, dict_of(py, d_init)?))
}

/// The inputs of mixer `name` (JSON `config`) as JSON: `{"mixed": name, "inputs": [{"name",
/// "shape" (size symbols or numbers), "optional", "per_token"}, …], "family", "doc"}`.
#[pyfunction]
#[pyo3(signature = (name, config=None))]
fn spec(name: &str, config: Option<&str>) -> PyResult<String> {
    let m = build(name, config)?;
    let entry = mixer_registry::mixer_entry(name).or_py()?;
    Ok(spec_value(m.as_ref(), entry).to_string())
}

fn spec_value(m: &dyn mixer_core::Mixer, entry: &mixer_registry::MixerEntry) -> serde_json::Value {
    let spec = m.spec();
    let inputs: Vec<serde_json::Value> = spec
        .inputs
        .iter()
        .map(|d| {
            let shape: Vec<serde_json::Value> = d
                .shape
                .iter()
                .map(|s| match s {
                    mixer_core::spec::Dim::Sym(s) => serde_json::json!(s),
                    mixer_core::spec::Dim::Fixed(n) => serde_json::json!(n),
                })
                .collect();
            serde_json::json!({"name": d.name, "shape": shape, "optional": d.optional, "per_token": d.per_token})
        })
        .collect();
    serde_json::json!({
        "name": entry.name,
        "family": entry.family,
        "doc": entry.doc,
        "mixed": spec.mixed,
        "inputs": inputs,
        "backward_reads_output": m.backward_reads_output(),
        "cuda_saves_for_backward": mixers::cuda::device_saves(m),
    })
}

/// The shapes of mixer `name`'s state (one batch row per batch row of the inputs) for inputs
/// of the given shapes (`{input name: shape}`), when a run starts from a state of the shapes
/// `given` (`None`: from zero; an attention cache's capacity is the given one's): `{state tensor
/// name: shape}`; a `NotImplementedError` for a mixer without a state.
#[pyfunction]
#[pyo3(signature = (name, shapes, config=None, given=None))]
fn state_shapes(
    name: &str,
    shapes: BTreeMap<String, Vec<usize>>,
    config: Option<&str>,
    given: Option<BTreeMap<String, Vec<usize>>>,
) -> PyResult<BTreeMap<String, Vec<usize>>> {
    let m = build(name, config)?;
    let dims = m.spec().bind(&shapes).or_py()?;
    let given: Option<mixer_core::state::StateShapes> = given.map(|g| g.into_iter().collect());
    let s = mixer_registry::state::shapes(m.as_ref(), &dims, given.as_ref()).or_py()?;
    Ok(s.into_iter().collect())
}

/// Which rows of a GLR's kept stream (its state's `y` or `x`, docs/math.md §7.1) hold a value at
/// `position`, for inputs of the given shapes: what a state at that position may have non-zero
/// (context parallelism's block-identity state, `mixers.context_parallel`).
#[pyfunction]
#[pyo3(signature = (name, shapes, position, config=None))]
fn glr_kept_rows(
    name: &str,
    shapes: BTreeMap<String, Vec<usize>>,
    position: usize,
    config: Option<&str>,
) -> PyResult<Vec<bool>> {
    use mixer_core::mixers::glr::{Glr, state};
    let m = build(name, config)?;
    let g = mixer_core::mixer::downcast::<Glr>(m.as_ref(), "glr_kept_rows").or_py()?;
    let dims = m.spec().bind(&shapes).or_py()?;
    let k = state::slot_count(&dims).unwrap_or(0);
    Ok(state::kept(g, k, position).iter().map(Option::is_some).collect())
}

/// Everything registered, as JSON: plugin crates, backends (with availability), patterns,
/// masks, λ schemes, and every mixer with its inputs (default config) and, per backend, the
/// forms it runs, its backward forms and the forms it runs from a state.
#[pyfunction]
fn registered() -> String {
    use mixer_registry::{Availability, LAMBDAS, MASKS, MIXERS, PATTERNS, backends_status};
    let names = |v: Vec<Form>| v.iter().map(|f| f.name()).collect::<Vec<_>>();
    let status = backends_status();
    let backends: Vec<serde_json::Value> = status
        .iter()
        .map(|(n, a)| match a {
            Availability::Available(d) => serde_json::json!({"name": n, "available": true, "detail": d}),
            Availability::Unavailable(r) => serde_json::json!({"name": n, "available": false, "detail": r}),
        })
        .collect();
    let mut mixers = Vec::new();
    let mut entries: Vec<_> = MIXERS.iter().collect();
    entries.sort_by_key(|e| (e.family, e.name));
    for e in entries {
        let mut v = match (e.build)(e.name, &serde_json::json!({})) {
            Ok(m) => {
                let mut v = spec_value(m.as_ref(), e);
                let mut per = serde_json::Map::new();
                for (b, _) in &status {
                    if let Ok(be) = Backend::registered(b) {
                        per.insert(
                            b.to_string(),
                            serde_json::json!({
                                "forms": names(mixer_registry::run::forms(m.as_ref(), &be)),
                                "backward": names(mixer_registry::backward::backward_forms(m.as_ref(), b)),
                                "state": names(mixer_registry::state::forms(m.as_ref(), &be)),
                            }),
                        );
                    }
                }
                v["backends"] = serde_json::Value::Object(per);
                v
            }
            Err(err) => {
                serde_json::json!({"name": e.name, "family": e.family, "doc": e.doc, "needs_config": err.to_string()})
            }
        };
        v["examples"] = serde_json::json!(e.examples);
        mixers.push(v);
    }
    let docs = |it: Vec<(&str, &str)>| {
        it.into_iter().map(|(n, d)| serde_json::json!({"name": n, "doc": d})).collect::<Vec<_>>()
    };
    serde_json::json!({
        "plugins": mixer_registry::plugin_crates(),
        "backends": backends,
        "patterns": docs(PATTERNS.iter().map(|e| (e.name, e.doc)).collect()),
        "masks": docs(MASKS.iter().map(|e| (e.name, e.doc)).collect()),
        "lambda_schemes": docs(LAMBDAS.iter().map(|e| (e.name, e.doc)).collect()),
        "mixers": mixers,
    })
    .to_string()
}

/// Valid random `float64` inputs of mixer `name` (JSON `config`), optional inputs included, as
/// the library's checks draw them (docs/math.md §4), for the sizes `B = batch`, `T = seq`,
/// `C = channels`, `H = heads`, `Dk = dk`, `Dv = dv` (a mixer uses those it needs; derived
/// sizes such as `K` and `L` follow from them).
#[pyfunction]
#[pyo3(signature = (name, config=None, batch=2, seq=8, channels=4, heads=2, dk=4, dv=3, seed=0))]
#[allow(clippy::too_many_arguments)]
fn random_inputs<'py>(
    py: Python<'py>,
    name: &str,
    config: Option<&str>,
    batch: usize,
    seq: usize,
    channels: usize,
    heads: usize,
    dk: usize,
    dv: usize,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let m = build(name, config)?;
    let sizes = mixer_registry::Sizes { batch, seq, channels, heads, dk, dv };
    let x = mixer_registry::grad_check::grad_inputs(m.as_ref(), &sizes, seed).or_py()?;
    dict_of(py, x)
}

/// The extension module.
#[pymodule]
fn _mixers(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    m.add_function(wrap_pyfunction!(spec, m)?)?;
    m.add_function(wrap_pyfunction!(state_shapes, m)?)?;
    m.add_function(wrap_pyfunction!(glr_kept_rows, m)?)?;
    m.add_function(wrap_pyfunction!(registered, m)?)?;
    m.add_function(wrap_pyfunction!(random_inputs, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_forward, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_backward, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_bind_device, m)?)?;
    Ok(())
}
