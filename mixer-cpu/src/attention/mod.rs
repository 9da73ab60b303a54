//! CPU forms of softmax attention (MATH.md §1.3): `attention` and `local-attention`.
//!
//! - `parallel`: the masked-softmax matrix per head, $Y = \mathrm{softmax}(\sigma QK^\top + M)V$
//!   ([`parallel`], $O(T^2)$ memory per head);
//! - `fast`: streaming over key blocks with an online softmax, flash-style ([`flash`]):
//!   $O(T)$ memory, never a $T \times T$ matrix; with a window $w$ only the key blocks that
//!   intersect $(t - w, t]$ are visited, so local attention costs $O(T \cdot w)$;
//! - `recurrent`: a KV-cache decoder ([`decode`]) holding $\min(t, w)$ keys and values.

pub mod backward;
pub mod decode;
pub mod flash;
pub mod parallel;

use mixer_core::mixer::{Decoder, Mixer, downcast};
use mixer_core::mixers::attention::Attention;
use mixer_core::tensor::get;
use mixer_core::{Dims, Error, Form, Real, Result, Tensors};
use mixer_registry::{KernelEntry, register};
use ndarray::{Array4, ArrayD};

/// `a [B,T,H,D]` as a contiguous `[B,H,T,D]` array (one head's rows contiguous).
pub(crate) fn heads_major<F: Real>(inputs: &Tensors<F>, name: &str) -> Result<Array4<F>> {
    let a = get(inputs, name)?;
    if a.ndim() != 4 {
        return Err(Error::shape(name, "[B, T, H, D]", mixer_core::error::fmt_shape(a.shape())));
    }
    let v = a.view().permuted_axes(ndarray::IxDyn(&[0, 2, 1, 3]));
    let s = v.shape().to_vec();
    let data: Vec<F> = v.iter().copied().collect();
    Array4::from_shape_vec((s[0], s[1], s[2], s[3]), data).map_err(|e| Error::Numerical(e.to_string()))
}

fn run<F: Real>(m: &dyn Mixer, form: Form, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let a = downcast::<Attention>(m, "cpu")?;
    match form {
        Form::Parallel => parallel::parallel(a, inputs),
        Form::Fast => flash::flash(a, inputs),
        other => Err(Error::FormUnavailable {
            mixer: m.name().to_string(),
            form: other.name().to_string(),
            backend: "cpu".into(),
            available: "materialized, parallel, fast, recurrent".into(),
        }),
    }
}

fn dec<F: Real>(m: &dyn Mixer, _statics: &Tensors<F>, dims: &Dims) -> Result<Box<dyn Decoder<F>>> {
    let a = downcast::<Attention>(m, "cpu")?;
    Ok(Box::new(decode::AttentionDecoder::<F>::new(a, dims)?))
}

#[register]
static ATTENTION_CPU: KernelEntry = KernelEntry {
    kernel: "attention",
    backend: "cpu",
    forms: &[Form::Parallel, Form::Fast],
    run_f64: run::<f64>,
    run_f32: run::<f32>,
    decoder_f64: Some(dec::<f64>),
    decoder_f32: Some(dec::<f32>),
};
