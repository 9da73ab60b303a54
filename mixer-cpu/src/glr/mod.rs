//! CPU forms of the generalized linear recurrence (MATH.md §1.2): `glr` and its aliases.
//!
//! - `fast`: the sparse recurrence, $O(T \cdot K)$ per channel ([`fast`]);
//! - `recurrent`: a token-by-token decoder that keeps the lattice positions $P_t$
//!   (cache-efficient) or the last $f(K-1)$ tokens (translation-invariant) ([`decode`]);
//! - `materialized`: the generic oracle on [`Glr`]'s `(A, B)`.

pub mod backward;
pub mod decode;
pub mod fast;

use mixer_core::mixer::{Decoder, Mixer, downcast};
use mixer_core::mixers::glr::Glr;
use mixer_core::{Dims, Error, Form, Real, Result, Tensors};
use mixer_registry::{KernelEntry, register};
use ndarray::ArrayD;

fn run<F: Real>(m: &dyn Mixer, form: Form, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let g = downcast::<Glr>(m, "cpu")?;
    match form {
        Form::Fast => fast::fast(g, inputs),
        other => Err(Error::FormUnavailable {
            mixer: m.name().to_string(),
            form: other.name().to_string(),
            backend: "cpu".into(),
            available: "materialized, fast, recurrent".into(),
        }),
    }
}

fn dec<F: Real>(m: &dyn Mixer, _statics: &Tensors<F>, dims: &Dims) -> Result<Box<dyn Decoder<F>>> {
    let g = downcast::<Glr>(m, "cpu")?;
    Ok(Box::new(decode::GlrDecoder::<F>::new(g, dims)?))
}

#[register]
static GLR_CPU: KernelEntry = KernelEntry {
    kernel: "glr",
    backend: "cpu",
    forms: &[Form::Fast],
    run_f64: run::<f64>,
    run_f32: run::<f32>,
    decoder_f64: Some(dec::<f64>),
    decoder_f32: Some(dec::<f32>),
};
