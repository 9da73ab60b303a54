//! The log-linear family on CUDA (MATH.md §2): `linear-attention`, `mamba2`,
//! `gated-deltanet` and their lifts `loglinear-*`.
//!
//! - `parallel` ([`quadratic`]): the generic quadratic form, any level mask;
//! - `fast` ([`chunked`]): the chunked form of MATH §2.6 (Fenwick mask; WY/UT form for gated
//!   DeltaNet), one block per (batch, head) walking its chunks;
//! - `recurrent` ([`decoder`]): O(log T) device-resident level states per head (§2.5), one
//!   kernel launch per token.
//!
//! The `fast` and `recurrent` forms exist only with Fenwick structure (base mixers, or the
//! Fenwick mask); `Mixer::form_unsupported` filters the rest before dispatch, and they are
//! refused here as well.
//!
//! The level mask's registered CUDA device function (`MaskEntry::cuda`,
//! `__device__ int mixers_level(long long t, long long s)`) and the λ scheme's
//! (`LambdaEntry::cuda`, `__device__ double mixers_lambda(double raw, double param)`) are
//! spliced into the generic kernel `kernels/loglinear.cu` and compiled by NVRTC (one module
//! per (mask, scheme) pair, cached), so a plugin mask or scheme needs no kernel of its own.
//! The chunked (`fast`) and recurrent forms are not ported to CUDA.

pub mod chunked;
pub mod decoder;
pub mod quadratic;

use mixer_core::mixer::{Decoder, Mixer, downcast};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Dims, Form, Result, Tensors};
use mixer_registry::{KernelEntry, register};
use ndarray::ArrayD;

use crate::runtime::{GpuReal, err};

/// Kernel family name in errors.
pub(crate) const KERNEL: &str = "loglinear";
/// The generic kernel (`kernels/loglinear.cu`), without the mask and λ functions.
pub const SRC: &str = include_str!("../../kernels/loglinear.cu");
/// The Fenwick-structure kernels (`kernels/loglinear_fenwick.cu`): chunked form, decoder step.
pub const FENWICK_SRC: &str = include_str!("../../kernels/loglinear_fenwick.cu");

fn needs_fenwick(ll: &LogLinear, form: Form) -> Result<()> {
    if ll.has_fenwick_structure() {
        return Ok(());
    }
    Err(mixer_core::Error::FormUnavailable {
        mixer: format!("{} (mask `{}`)", ll.name, ll.lift.map_or("none", |l| l.mask.name)),
        form: form.name().into(),
        backend: "cuda".into(),
        available: "materialized, parallel (the chunked and recurrent forms need the Fenwick mask)".into(),
    })
}

fn run<F: GpuReal>(m: &dyn Mixer, form: Form, x: &Tensors<F>) -> Result<ArrayD<F>> {
    let ll = downcast::<LogLinear>(m, "cuda")?;
    match form {
        Form::Parallel => quadratic::run(ll, x),
        Form::Fast => {
            needs_fenwick(ll, Form::Fast)?;
            chunked::run(ll, x)
        }
        f => Err(err(KERNEL, format!("form `{f}` is not computed by this kernel entry"))),
    }
}

fn dec<F: GpuReal>(m: &dyn Mixer, statics: &Tensors<F>, dims: &Dims) -> Result<Box<dyn Decoder<F>>> {
    let ll = downcast::<LogLinear>(m, "cuda")?;
    needs_fenwick(ll, Form::Recurrent)?;
    Ok(Box::new(
        decoder::LogLinearGpuDecoder::<F>::new(ll, dims)?
            .with_lambda_param(statics.get("lambda_param").cloned()),
    ))
}

#[register]
static LOGLINEAR_CUDA: KernelEntry = KernelEntry {
    kernel: "loglinear",
    backend: "cuda",
    forms: &[Form::Parallel, Form::Fast],
    run_f64: run::<f64>,
    run_f32: run::<f32>,
    decoder_f64: Some(dec::<f64>),
    decoder_f32: Some(dec::<f32>),
};
