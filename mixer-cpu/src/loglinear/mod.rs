//! The log-linear attention family on CPU (MATH.md §2): `linear-attention`, `mamba2`,
//! `gated-deltanet` and their lifts, all under the kernel key `"loglinear"`.
//!
//! - `parallel` ([`parallel`]): the quadratic masked form, for any level mask;
//! - `fast` ([`chunked`]): the chunked O(T log T) algorithm of §2.6 (Fenwick mask only;
//!   other masks give [`Error::FormUnavailable`]);
//! - `recurrent` ([`decoder`]): O(log T) states per head (§2.5; Fenwick mask only).
//!
//! Work is spread over (batch, head) with rayon; each head's matmuls and triangular solves
//! use faer sequentially.

pub mod backward;
mod backward_gdn;
pub mod chunked;
pub mod common;
pub mod decoder;
pub mod parallel;

use faer::Mat;
use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Error, Form, Real, Result, Tensors};
use mixer_registry::{KernelEntry, register};
use ndarray::ArrayD;
use rayon::prelude::*;

/// The error for a form this mixer's mask does not admit on CPU.
pub(crate) fn unavailable(m: &LogLinear, form: Form) -> Error {
    let mask = m.lift.map_or("none", |l| l.mask.name);
    Error::FormUnavailable {
        mixer: format!("{} (mask `{mask}`)", m.name),
        form: form.name().into(),
        backend: "cpu".into(),
        available: if m.has_fenwick_structure() {
            "materialized, parallel, fast, recurrent".into()
        } else {
            "materialized, parallel (the chunked and recurrent forms need the Fenwick mask)".into()
        },
    }
}

/// Runs the `parallel` or `fast` form.
pub fn run<F: Real>(m: &dyn Mixer, form: Form, x: &Tensors<F>) -> Result<ArrayD<F>> {
    let m: &LogLinear = downcast(m, "cpu")?;
    let f: fn(&LogLinear, &common::Head<'_, F>) -> Result<Mat<F>> = match form {
        Form::Parallel => parallel::run_head::<F>,
        Form::Fast if m.has_fenwick_structure() => chunked::run_head::<F>,
        f => return Err(unavailable(m, f)),
    };
    let x = common::standard(x);
    let lam = match m.lift {
        Some(_) => Some(m.lambda_weights(mixer_core::tensor::get(&x, "lambda")?, x.get("lambda_param"))?),
        None => None,
    };
    let (sizes, heads) = common::heads(m, &x, lam.as_ref())?;
    let ys: Vec<Mat<F>> = heads.par_iter().map(|hd| f(m, hd)).collect::<Result<_>>()?;
    Ok(common::assemble(sizes, &heads, ys))
}

#[register]
static LOGLINEAR_CPU: KernelEntry = KernelEntry {
    kernel: "loglinear",
    backend: "cpu",
    forms: &[Form::Parallel, Form::Fast],
    run_f64: run::<f64>,
    run_f32: run::<f32>,
    decoder_f64: Some(decoder::build::<f64>),
    decoder_f32: Some(decoder::build::<f32>),
};
