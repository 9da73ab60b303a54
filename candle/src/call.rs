//! The one path from candle tensors to a [`MixerOp`]: check the devices and dtypes, bind the
//! shapes to the mixer's specification (so that bad shapes fail here, with the library's
//! message), pack the inputs, apply the op, unpack `y` and the final state.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use mixer_core::mixer::Mixer;
use mixer_registry::Backend;
use mixers::ops::Options;

use crate::error::{Error, device_name, lib};
use crate::op::{MixerOp, Run, op_name};
use crate::packing::Packing;

/// Named tensors: `(name, tensor)` with the names of docs/math.md (`q`, `k`, `v`, `g`, `beta`,
/// `lambda`, `x`, `alpha`, `w`, `bias`; a state's tensors by the mixer's state names, `S` for the
/// base log-linear mixers).
pub type Named<'a> = [(&'a str, &'a Tensor)];

/// The dtype the library computes in for tensors of dtype `d`: `F32` and `F64` as given, `BF16`
/// and `F16` in `F32` (converted on the way in, `y` and the state converted back).
fn compute_dtype(name: &str, d: DType) -> Result<DType, Error> {
    match d {
        DType::F32 | DType::F64 => Ok(d),
        DType::BF16 | DType::F16 => Ok(DType::F32),
        got => Err(Error::Dtype { name: name.into(), expected: "F32, F64, BF16 or F16".into(), got }),
    }
}

/// Checks that every tensor is on the first tensor's device (the CPU, or a CUDA device with the
/// feature `cuda`) and of its dtype; returns that dtype and whether the tensors are on CUDA.
fn check_tensors(all: &[(&str, &Tensor)]) -> Result<(DType, bool), Error> {
    let Some((first, t0)) = all.first() else {
        return Ok((DType::F32, false));
    };
    let dtype = t0.dtype();
    compute_dtype(first, dtype)?;
    let device = t0.device();
    let supported = match device {
        Device::Cpu => true,
        Device::Cuda(_) => cfg!(feature = "cuda"),
        Device::Metal(_) => false,
    };
    for (name, t) in all {
        if !supported || !t.device().same_device(device) {
            let expected = if supported {
                format!("{} (as `{first}`)", device_name(device))
            } else {
                "the CPU or a CUDA device (with this crate's feature `cuda`); move it with `to_device`".into()
            };
            return Err(Error::Device { name: name.to_string(), expected, got: device_name(t.device()) });
        }
        if t.dtype() != dtype {
            return Err(Error::Dtype {
                name: name.to_string(),
                expected: format!("{dtype:?} (as `{first}`)"),
                got: t.dtype(),
            });
        }
    }
    Ok((dtype, matches!(device, Device::Cuda(_))))
}

/// Runs the configured mixer `m` on `inputs` with `opts`: `y`, and with `with_state` (or an
/// `initial` state) the final state's tensors by name. Every output is differentiable with
/// respect to every input and the initial state.
pub(crate) fn apply(
    m: Box<dyn Mixer>,
    inputs: &Named<'_>,
    initial: Option<&Named<'_>>,
    with_state: bool,
    opts: &Options,
) -> candle_core::Result<(Tensor, Vec<(String, Tensor)>)> {
    let with_state = with_state || initial.is_some();
    let all: Vec<(&str, &Tensor)> = inputs.iter().chain(initial.unwrap_or(&[])).copied().collect();
    let (dtype, on_cuda) = check_tensors(&all)?;
    let compute = compute_dtype("", dtype)?;

    let shapes: BTreeMap<String, Vec<usize>> =
        inputs.iter().map(|(n, t)| (n.to_string(), t.dims().to_vec())).collect();
    let spec = m.spec();
    let mut dims = lib(spec.bind(&shapes))?;
    let y_shape = shapes[spec.mixed].clone();
    let mut output = vec![("y".to_string(), y_shape)];
    if with_state {
        if let (Some(cu), Some(b)) = (&opts.cu_seqlens, dims.get_mut("B")) {
            *b = cu.len().saturating_sub(1);
        }
        // The sizes a given state binds (attention's cache capacity) as the library reads them.
        let given: Option<mixer_core::state::StateShapes> =
            initial.map(|l| l.iter().map(|(n, t)| (n.to_string(), t.dims().to_vec())).collect());
        output.extend(lib(mixer_registry::state::shapes(m.as_ref(), &dims, given.as_ref()))?);
    }
    let backend = match opts.backend {
        Some(b) => b,
        None => lib(Backend::by_name(if on_cuda { "cuda" } else { "cpu" }))?,
    };
    let named = |list: &Named<'_>| {
        Packing::new(list.iter().map(|(n, t)| (n.to_string(), t.dims().to_vec())).collect())
    };
    let op = MixerOp {
        name: op_name(format!("mixers::{}{}", m.name(), if with_state { "+state" } else { "" })),
        run: Run { backend, form: opts.form, precision: opts.precision, cu_seqlens: opts.cu_seqlens.clone() },
        inputs: named(inputs),
        initial: initial.map(named),
        output: Packing::new(output),
        with_state,
        mixer: Arc::from(m),
    };
    let cast = all.iter().map(|(_, t)| t.to_dtype(compute)).collect::<candle_core::Result<Vec<_>>>()?;
    let output = op.output.clone();
    // Nothing to differentiate on the CPU: no packed argument, no graph (`MixerOp::forward_detached`).
    let parts = if !on_cuda && !cast.iter().any(Tensor::track_op) {
        op.forward_detached(&cast)?
    } else {
        let packed = Packing::pack_tensors(&cast.iter().collect::<Vec<_>>())?;
        output.unpack_tensor(&packed.apply_op1(op)?)?
    };
    let mut parts = parts.into_iter().map(|t| t.to_dtype(dtype));
    let y = parts.next().ok_or_else(|| Error::Packing {
        op: "apply".into(),
        expected: "y".into(),
        got: "nothing".into(),
    })??;
    let states = output.parts()[1..]
        .iter()
        .map(|(n, _)| n.clone())
        .zip(parts)
        .map(|(n, t)| Ok((n, t?)))
        .collect::<candle_core::Result<_>>()?;
    Ok((y, states))
}

/// Runs the registered mixer `name` (builtin or a linked plugin's) configured by the JSON
/// `config` on named `inputs`: the dynamic path, which reaches every mixer (the GLR with any
/// pattern, the Toeplitz mixer, plugins). Returns `y`, differentiable in every input. Options:
/// `form`, `backend` (default `cpu`), `precision`, `cu_seqlens` of `opts` (the per-family
/// settings are in `config`).
///
/// ```
/// use candle_core::{DType, Device, Tensor};
/// use mixers_candle::{Options, run};
/// // One head, one tap per lag, all ones: a running sum along T.
/// let x = Tensor::arange(0f64, 4., &Device::Cpu)?.reshape((1, 4, 1))?.repeat((1, 1, 2))?;
/// let w = Tensor::ones((1, 4), DType::F64, &Device::Cpu)?;
/// let cfg = serde_json::json!({"heads": 1, "kernel_width": 1});
/// let y = run("toeplitz", &cfg, &[("x", &x), ("w", &w)], &Options::default())?;
/// let sums: Vec<f64> = y.narrow(2, 0, 1)?.flatten_all()?.to_vec1()?;
/// assert!(sums.iter().zip([0.0, 1.0, 3.0, 6.0]).all(|(a, b)| (a - b).abs() < 1e-12));
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn run(
    name: &str,
    config: &serde_json::Value,
    inputs: &Named<'_>,
    opts: &Options,
) -> candle_core::Result<Tensor> {
    let m = lib(mixer_registry::mixer(name, config))?;
    apply(m, inputs, None, false, opts).map(|(y, _)| y)
}

/// [`run`] from the state `initial` (`None`: zeros), returning `y` and the final state's
/// tensors by name (docs/math.md §7.1). Gradients flow into the inputs and the initial state.
pub fn run_state(
    name: &str,
    config: &serde_json::Value,
    inputs: &Named<'_>,
    initial: Option<&Named<'_>>,
    opts: &Options,
) -> candle_core::Result<(Tensor, Vec<(String, Tensor)>)> {
    let m = lib(mixer_registry::mixer(name, config))?;
    apply(m, inputs, initial, true, opts)
}
