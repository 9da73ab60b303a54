//! Running a form of a mixer on a backend: validation, dispatch, and the generic forms
//! (`materialized` through the oracle, `recurrent` through the decoder).

use mixer_core::mixer::{Decoder, Mixer, run_decoder, validate};
use mixer_core::tensor::cast_tensors;
use mixer_core::{AnyTensors, Dims, Error, Form, Real, Result, Tensor, Tensors, oracle};
use ndarray::ArrayD;

use crate::entries::KernelEntry;
use crate::lookup::kernel;

/// The forms of `m` available on `backend` (the materialized oracle is always available).
pub fn forms(m: &dyn Mixer, backend: &str) -> Vec<Form> {
    let mut v = vec![Form::Materialized];
    if let Some(k) = kernel(m.kernel(), backend) {
        v.extend(k.forms.iter().copied());
        if k.decoder_f64.is_some() {
            v.push(Form::Recurrent);
        }
    }
    v.retain(|f| m.form_unsupported(*f).is_none());
    v.sort();
    v.dedup();
    v
}

fn unavailable(m: &dyn Mixer, form: Form, backend: &str) -> Error {
    if let Some(why) = m.form_unsupported(form) {
        return Error::FormUnavailable {
            mixer: m.name().to_string(),
            form: form.name().into(),
            backend: backend.into(),
            available: format!(
                "{} ({why})",
                forms(m, backend).iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
            ),
        };
    }
    Error::FormUnavailable {
        mixer: m.name().to_string(),
        form: form.name().into(),
        backend: backend.into(),
        available: forms(m, backend).iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
    }
}

/// The oracle: materialize in `f64` and solve.
pub fn oracle(m: &dyn Mixer, inputs: &Tensors<f64>) -> Result<ArrayD<f64>> {
    let shapes = inputs.iter().map(|(k, v)| (k.clone(), v.shape().to_vec())).collect();
    mixer_core::memory::guard(m, Form::Materialized, &m.spec().bind(&shapes)?, mixer_core::DType::F64)?;
    let mat = m.materialize(inputs)?;
    let x = mixer_core::tensor::get(inputs, m.spec().mixed)?;
    oracle::solve(&mat, x)
}

trait Pick: Real {
    fn run_fn(k: &KernelEntry) -> crate::entries::RunFn<Self>;
    fn dec_fn(k: &KernelEntry) -> Option<crate::entries::DecoderFn<Self>>;
}
impl Pick for f64 {
    fn run_fn(k: &KernelEntry) -> crate::entries::RunFn<f64> {
        k.run_f64
    }
    fn dec_fn(k: &KernelEntry) -> Option<crate::entries::DecoderFn<f64>> {
        k.decoder_f64
    }
}
impl Pick for f32 {
    fn run_fn(k: &KernelEntry) -> crate::entries::RunFn<f32> {
        k.run_f32
    }
    fn dec_fn(k: &KernelEntry) -> Option<crate::entries::DecoderFn<f32>> {
        k.decoder_f32
    }
}

/// Builds a decoder of `m` on `backend` from the full inputs' static part and sizes.
#[allow(private_bounds)]
pub fn decoder<F: Real + Pick>(
    m: &dyn Mixer,
    backend: &str,
    inputs: &Tensors<F>,
    dims: &Dims,
) -> Result<Box<dyn Decoder<F>>> {
    let k = kernel(m.kernel(), backend).ok_or_else(|| unavailable(m, Form::Recurrent, backend))?;
    let make = F::dec_fn(k).ok_or_else(|| unavailable(m, Form::Recurrent, backend))?;
    mixer_core::memory::guard(m, Form::Recurrent, dims, F::DTYPE)?;
    let per_token = m.spec().per_token();
    let statics: Tensors<F> =
        inputs.iter().filter(|(k, _)| !per_token.contains(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    make(m, &statics, dims)
}

#[allow(private_bounds)]
fn run_typed<F: Real + Pick>(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &Tensors<F>,
    dims: &Dims,
) -> Result<ArrayD<F>> {
    match form {
        Form::Materialized => {
            let x64: Tensors<f64> = inputs.iter().map(|(k, v)| (k.clone(), v.mapv(|x| x.f64()))).collect();
            Ok(oracle(m, &x64)?.mapv(F::of))
        }
        Form::Recurrent => {
            let mut dec = decoder::<F>(m, backend, inputs, dims)?;
            run_decoder(dec.as_mut(), &m.spec(), inputs, |_, _| {})
        }
        f => {
            let k = kernel(m.kernel(), backend).ok_or_else(|| unavailable(m, f, backend))?;
            if !k.forms.contains(&f) {
                return Err(unavailable(m, f, backend));
            }
            (F::run_fn(k))(m, f, inputs)
        }
    }
}

/// Runs one form of `m` on `backend`, after checking shapes and value constraints.
/// The output `y` has the dtype of the inputs and the shape of the mixed input.
pub fn run(m: &dyn Mixer, backend: &str, form: Form, inputs: &AnyTensors) -> Result<Tensor> {
    let dims = validate(m, inputs)?;
    mixer_core::memory::guard(m, form, &dims, inputs.dtype())?;
    let y = match inputs {
        AnyTensors::F64(t) => run_typed::<f64>(m, backend, form, t, &dims).map(Tensor::F64),
        AnyTensors::F32(t) => run_typed::<f32>(m, backend, form, t, &dims).map(Tensor::F32),
    }?;
    mixer_core::mixer::check_output(m, form, backend, &y)?;
    Ok(y)
}

/// Runs in a given scalar type from `f64` inputs (cast first); returns `f64`.
pub fn run_as(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &Tensors<f64>,
    dtype: mixer_core::DType,
) -> Result<ArrayD<f64>> {
    let any = match dtype {
        mixer_core::DType::F64 => AnyTensors::F64(inputs.clone()),
        mixer_core::DType::F32 => AnyTensors::F32(cast_tensors::<f32>(inputs)),
    };
    run(m, backend, form, &any).map(|t| t.to_f64())
}
