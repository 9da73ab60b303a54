//! The log-linear family on CUDA (MATH.md §2): `linear-attention`, `mamba2`,
//! `gated-deltanet` and their lifts `loglinear-*`, in one generic quadratic (`parallel`) form.
//!
//! The level mask's registered CUDA device function (`MaskEntry::cuda`,
//! `__device__ int mixers_level(long long t, long long s)`) and the λ scheme's
//! (`LambdaEntry::cuda`, `__device__ double mixers_lambda(double raw, double param)`) are
//! spliced into the generic kernel `kernels/loglinear.cu` and compiled by NVRTC (one module
//! per (mask, scheme) pair, cached), so a plugin mask or scheme needs no kernel of its own.
//! The chunked (`fast`) and recurrent forms are not ported to CUDA.

pub mod quadratic;

use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Form, Result, Tensors};
use mixer_registry::{KernelEntry, register};
use ndarray::ArrayD;

use crate::runtime::{GpuReal, err};

/// Kernel family name in errors.
pub(crate) const KERNEL: &str = "loglinear";
/// The generic kernel (`kernels/loglinear.cu`), without the mask and λ functions.
pub const SRC: &str = include_str!("../../kernels/loglinear.cu");

fn run<F: GpuReal>(m: &dyn Mixer, form: Form, x: &Tensors<F>) -> Result<ArrayD<F>> {
    let ll = downcast::<LogLinear>(m, "cuda")?;
    match form {
        Form::Parallel => quadratic::run(ll, x),
        f => Err(err(KERNEL, format!("form `{f}` is not computed by this kernel entry"))),
    }
}

#[register]
static LOGLINEAR_CUDA: KernelEntry = KernelEntry {
    kernel: "loglinear",
    backend: "cuda",
    forms: &[Form::Parallel],
    run_f64: run::<f64>,
    run_f32: run::<f32>,
    decoder_f64: None,
    decoder_f32: None,
};
