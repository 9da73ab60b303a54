//! [`MixerOp`]: one configured mixer as a candle [`CustomOp1`] over a packed buffer.
//!
//! The op's argument is the flat buffer of the mixer's inputs `x_1 … x_n` (and, for a run from
//! a state, the initial state `S_0` after them) packed by [`Packing`]; its result is the flat
//! buffer of `y` (and, for a run that returns its state, the final state `S_T` after it).
//!
//! - `cpu_fwd` unpacks the inputs (one copy into the library's owned arrays) and runs
//!   [`mixer_registry::call::forward`], the entry point of the typed API, the command line and
//!   the Python package: the plain form, a run from a state, or a packed batch (`cu_seqlens`).
//! - `bwd` is the vector–Jacobian product: from the result's cotangent `[ȳ | S̄_T]` it runs
//!   [`mixer_registry::call::backward`] (the library's backward of the forward's form where the
//!   backend has it, else `fast`, else `materialized`; exact arithmetic) and returns the
//!   argument's cotangent `[x̄_1 … x̄_n | S̄_0]`, packed as the argument was. A part of the result
//!   that the loss does not use arrives as zeros (candle's `narrow` backward), which is its
//!   cotangent. It is itself a candle op of (argument, cotangent), [`Grad`], so that it runs
//!   where the tensors are.
//! - With the feature `cuda`, `cuda_fwd` and [`Grad`]'s `cuda_fwd` run the CUDA backend on the
//!   buffers where they lie (`crate::cuda`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor, WithDType};
use mixer_core::mixer::Mixer;
use mixer_core::{Form, Precision, Requires, Tensors};
use mixer_registry::call::Target;
use mixer_registry::{Backend, Scalar, call};
use ndarray::{ArrayD, IxDyn};

use crate::error::{Error, lib};
use crate::packing::{Packing, into_flat};

/// Where and how a call runs: the options of [`mixers::ops::Options`] that the op keeps.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub backend: Backend,
    pub form: Form,
    pub precision: Precision,
    pub cu_seqlens: Option<Vec<usize>>,
}

/// One configured mixer over packed buffers (see the module documentation).
pub(crate) struct MixerOp {
    /// `mixers::<mixer>` (with `+state` for a run with a state), for candle's messages.
    pub name: &'static str,
    pub mixer: Arc<dyn Mixer>,
    pub run: Run,
    /// The inputs, by their docs/math.md names.
    pub inputs: Packing,
    /// The initial state's tensors after the inputs, for a run from a state.
    pub initial: Option<Packing>,
    /// `y`, then the final state's tensors for a run that returns its state.
    pub output: Packing,
    /// Whether the result holds the final state.
    pub with_state: bool,
}

/// `name` as a `&'static str`: each distinct op name is leaked once (candle's op names are
/// static; a program uses a handful).
pub(crate) fn op_name(name: String) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.get(name.as_str()) {
        return n;
    }
    let n: &'static str = Box::leak(name.into_boxed_str());
    names.insert(n);
    n
}

impl MixerOp {
    /// The inputs and the initial state in the flat argument `flat`.
    fn unpack_args<F: Clone>(&self, flat: &[F]) -> Result<(Tensors<F>, Option<Tensors<F>>), Error> {
        let n = self.inputs.len().min(flat.len());
        let inputs = self.inputs.unpack(self.name, &flat[..n])?;
        let initial = match &self.initial {
            Some(p) => Some(p.unpack(self.name, &flat[n..])?),
            None if flat.len() > n => {
                return Err(Error::Packing {
                    op: self.name.into(),
                    expected: format!("{} elements", self.inputs.len()),
                    got: format!("{}", flat.len()),
                });
            }
            None => None,
        };
        Ok((inputs, initial))
    }

    /// The forward on the inputs and the initial state: `y` and the final state's tensors, by
    /// name.
    fn run<F: Scalar>(
        &self,
        inputs: &Tensors<F>,
        initial: Option<&Tensors<F>>,
    ) -> candle_core::Result<Tensors<F>> {
        let r = &self.run;
        let at = Target::new(self.mixer.as_ref(), &r.backend, r.form).packed(r.cu_seqlens.as_deref());
        let (y, fin) = lib(call::forward(at, inputs, initial, self.with_state, r.precision))?;
        let mut out = fin.unwrap_or_default();
        out.insert("y".into(), y);
        Ok(out)
    }

    /// The forward on a flat argument: the flat result (`y` alone handed over without a copy).
    pub(crate) fn forward<F: Scalar + WithDType>(&self, flat: &[F]) -> candle_core::Result<Vec<F>> {
        let (inputs, initial) = self.unpack_args(flat)?;
        let out = self.run(&inputs, initial.as_ref())?;
        Ok(self.output.pack(self.name, out)?)
    }

    /// The forward outside candle's graph, for CPU tensors none of which needs a gradient:
    /// `parts` are the inputs then the initial state's tensors (in the compute dtype), each
    /// read once into the library's arrays, with no packed argument; the result's tensors
    /// (`y`, then the final state's) take the library's output arrays without a copy.
    pub(crate) fn forward_detached(&self, parts: &[Tensor]) -> candle_core::Result<Vec<Tensor>> {
        match parts.first().map(Tensor::dtype) {
            Some(DType::F64) => self.forward_detached_as::<f64>(parts),
            _ => self.forward_detached_as::<f32>(parts),
        }
    }

    fn forward_detached_as<F: Scalar + WithDType>(
        &self,
        parts: &[Tensor],
    ) -> candle_core::Result<Vec<Tensor>> {
        let names = self.inputs.parts().iter().chain(self.initial.as_ref().map_or(&[][..], |p| p.parts()));
        let mut arrays = names
            .zip(parts)
            .map(|((n, _), t)| {
                let a = ArrayD::from_shape_vec(IxDyn(t.dims()), t.flatten_all()?.to_vec1::<F>()?).map_err(
                    |e| Error::Packing {
                        op: self.name.into(),
                        expected: format!("`{n}`"),
                        got: e.to_string(),
                    },
                )?;
                Ok((n.clone(), a))
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let initial = arrays.split_off(self.inputs.parts().len());
        let initial: Option<Tensors<F>> = self.initial.is_some().then(|| initial.into_iter().collect());
        let out = self.run(&arrays.into_iter().collect(), initial.as_ref())?;
        let arrays = self.output.take(self.name, out)?;
        arrays
            .into_iter()
            .zip(self.output.parts())
            .map(|(a, (_, s))| Tensor::from_vec(into_flat(a), s.as_slice(), &candle_core::Device::Cpu))
            .collect()
    }

    /// Whether the backward is given the forward's `y` (from the op's result): where the mixer's
    /// backward reads it (the GLR's), for a plain exact call (no state, no packed batch; the
    /// backward is exact, so a `y` of another mode would not be the one it recomputes).
    fn keeps_output(&self) -> bool {
        let r = &self.run;
        self.mixer.backward_reads_output()
            && r.precision == Precision::Exact
            && r.cu_seqlens.is_none()
            && self.initial.is_none()
            && !self.with_state
    }

    /// The backward on a flat argument and the flat cotangent of the result: the flat
    /// cotangent of the argument; `out`, the flat result, gives the backward the forward's `y`
    /// (`mixer_core::grad::SAVED_OUTPUT`).
    pub(crate) fn backward<F: Scalar + WithDType>(
        &self,
        flat: &[F],
        d_out: &[F],
        out: Option<&[F]>,
    ) -> candle_core::Result<Vec<F>> {
        let (mut inputs, initial) = self.unpack_args(flat)?;
        if let Some(out) = out {
            let y = self.output.unpack(self.name, out)?.remove("y").ok_or_else(|| Error::Packing {
                op: self.name.into(),
                expected: "a part `y`".into(),
                got: "none".into(),
            })?;
            inputs.insert(mixer_core::grad::SAVED_OUTPUT.into(), y);
        }
        let mut d_out = self.output.unpack(self.name, d_out)?;
        let dy = d_out.remove("y").ok_or_else(|| Error::Packing {
            op: self.name.into(),
            expected: "a part `y`".into(),
            got: "none".into(),
        })?;
        let d_final = self.with_state.then_some(d_out);
        let r = &self.run;
        let m = self.mixer.as_ref();
        let form = lib(call::grad_form(m, r.backend.name(), None, r.form))?;
        let at = Target::new(m, &r.backend, form).packed(r.cu_seqlens.as_deref());
        let (grads, d_initial) = lib(call::backward(
            at,
            &inputs,
            initial.as_ref(),
            &dy,
            d_final.as_ref(),
            &Requires::All,
            Precision::Exact,
        ))?;
        let grads: Tensors<F> = grads
            .into_iter()
            .map(|(k, v)| (k.strip_prefix("d_").map(str::to_string).unwrap_or(k), v))
            .collect();
        let mut out = Vec::with_capacity(flat.len());
        self.inputs.pack_into(self.name, &grads, &mut out)?;
        if let Some(p) = &self.initial {
            p.pack_into(self.name, &d_initial, &mut out)?;
        }
        Ok(out)
    }
}

/// The contiguous elements of a CPU buffer as `F`.
fn cpu_elems<'a, F: WithDType>(op: &str, s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [F]> {
    let (start, end) = l.contiguous_offsets().ok_or_else(|| Error::Packing {
        op: op.into(),
        expected: "a contiguous buffer".into(),
        got: format!("strides {:?}", l.stride()),
    })?;
    Ok(&s.as_slice::<F>()?[start..end])
}

/// The error for a buffer of another dtype than `F32` or `F64`.
fn dtype_error(op: &str, got: DType) -> candle_core::Error {
    Error::Dtype { name: op.into(), expected: "F32 or F64".into(), got }.into()
}

impl CustomOp1 for MixerOp {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let out = match storage.dtype() {
            DType::F32 => f32::to_cpu_storage_owned(self.forward(cpu_elems(self.name, storage, layout)?)?),
            DType::F64 => f64::to_cpu_storage_owned(self.forward(cpu_elems(self.name, storage, layout)?)?),
            other => return Err(dtype_error(self.name, other)),
        };
        Ok((out, Shape::from(self.output.len())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        match storage.dtype() {
            DType::F32 => self.cuda_forward::<f32>(storage, layout),
            DType::F64 => self.cuda_forward::<f64>(storage, layout),
            other => Err(dtype_error(self.name, other)),
        }
    }

    fn bwd(&self, arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let grad_res = grad_res.contiguous()?;
        if arg.device().is_cpu() && self.keeps_output() {
            return arg.apply_op3_no_bwd(&res.contiguous()?, &grad_res, &GradGivenOutput(self)).map(Some);
        }
        arg.apply_op2_no_bwd(&grad_res, &Grad(self)).map(Some)
    }
}

/// [`Grad`] given the op's result too, on the CPU, for a backward that reads the forward's `y`
/// ([`MixerOp::keeps_output`]): (argument, result, cotangent of the result).
struct GradGivenOutput<'a>(&'a MixerOp);

impl CustomOp3 for GradGivenOutput<'_> {
    fn name(&self) -> &'static str {
        self.0.name
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        r: &CpuStorage,
        lr: &Layout,
        d: &CpuStorage,
        ld: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        cpu_backward(self.0, (s, l), (d, ld), Some((r, lr)))
    }
}

/// The op's CPU backward on the storages of the argument and of the result's cotangent (and of
/// the result, for a backward given the forward's `y`): the argument's cotangent.
fn cpu_backward(
    op: &MixerOp,
    (s, l): (&CpuStorage, &Layout),
    (d, ld): (&CpuStorage, &Layout),
    result: Option<(&CpuStorage, &Layout)>,
) -> candle_core::Result<(CpuStorage, Shape)> {
    fn typed<F: Scalar + WithDType>(
        op: &MixerOp,
        (s, l): (&CpuStorage, &Layout),
        (d, ld): (&CpuStorage, &Layout),
        result: Option<(&CpuStorage, &Layout)>,
    ) -> candle_core::Result<CpuStorage> {
        let out = result.map(|(r, lr)| cpu_elems::<F>(op.name, r, lr)).transpose()?;
        Ok(F::to_cpu_storage_owned(op.backward(
            cpu_elems(op.name, s, l)?,
            cpu_elems(op.name, d, ld)?,
            out,
        )?))
    }
    let out = match s.dtype() {
        DType::F32 => typed::<f32>(op, (s, l), (d, ld), result)?,
        DType::F64 => typed::<f64>(op, (s, l), (d, ld), result)?,
        other => return Err(dtype_error(op.name, other)),
    };
    Ok((out, l.shape().clone()))
}

/// The backward of a [`MixerOp`] as a candle op of (argument, cotangent of the result): the
/// argument's cotangent, by the library's CPU backward on the CPU and by the CUDA backend's on
/// CUDA (`crate::cuda`).
struct Grad<'a>(&'a MixerOp);

impl CustomOp2 for Grad<'_> {
    fn name(&self) -> &'static str {
        self.0.name
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        d: &CpuStorage,
        ld: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        cpu_backward(self.0, (s, l), (d, ld), None)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
        d: &candle_core::CudaStorage,
        ld: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        match s.dtype() {
            DType::F32 => self.0.cuda_backward::<f32>(s, l, d, ld),
            DType::F64 => self.0.cuda_backward::<f64>(s, l, d, ld),
            other => Err(dtype_error(self.0.name, other)),
        }
    }
}
