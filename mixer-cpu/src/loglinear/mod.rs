//! The log-linear attention family on CPU (docs/math.md §2): `linear-attention`, `mamba2`,
//! `gated-deltanet` and their lifts, all under the kernel key `"loglinear"`.
//!
//! - `parallel` ([`parallel`]): the quadratic masked form, for any level mask;
//! - `fast` ([`chunked`]): the chunked O(T log T) algorithm of §2.6 (Fenwick mask only;
//!   the registry refuses other masks through `Mixer::form_unsupported`); linear attention,
//!   Mamba-2 and their lifts (scalar transitions) take the specialisation [`ssd`], gated
//!   DeltaNet and its lift the general [`chunked`] form;
//! - `recurrent` ([`decoder`]): O(log T) states per head (§2.5; Fenwick mask only).
//!
//! Work is spread over (batch, head) with rayon; each head's matmuls and triangular solves
//! use faer sequentially.

pub mod backward;
mod backward_chunked;
pub mod chunked;
pub mod common;
pub mod decoder;
mod levels;
pub mod parallel;
pub mod ssd;

use crate::vmath::VecMath;
use faer::Mat;
use mixer_core::Form;
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Result, Tensors};
use mixer_registry::{BackwardFn, DecoderFn, Family, FamilyEntry, FormFn, register};
use ndarray::ArrayD;
use rayon::prelude::*;

/// A form on one head: `y` of the head as a `T×Dv` matrix, or as its transpose
/// `Dv×T` (row-major `y`) for the forms that write rows.
type HeadFn<F> = fn(&LogLinear, &common::Head<'_, F>) -> Result<Mat<F>>;

/// Runs a per-head form over every (batch, head) in parallel; `transposed`: the form returns
/// `yᵀ` (`Dv×T`).
fn run_heads<F: VecMath>(m: &LogLinear, x: &Tensors<F>, f: HeadFn<F>, transposed: bool) -> Result<ArrayD<F>> {
    let x = common::standard(x);
    let lam = match m.lift {
        Some(_) => Some(m.lambda_weights_ref(mixer_core::tensor::get(&x, "lambda")?, x.get("lambda_param"))?),
        None => None,
    };
    let (sizes, heads) = common::heads(m, &x, lam.as_deref())?;
    let ys: Vec<Mat<F>> = heads.par_iter().map(|hd| f(m, hd)).collect::<Result<_>>()?;
    let views: Vec<_> = ys.iter().map(|y| if transposed { y.transpose() } else { y.as_ref() }).collect();
    Ok(common::assemble(sizes, &heads, &views))
}

/// The `parallel` form: the quadratic masked form, any level mask.
pub fn parallel<F: VecMath>(m: &LogLinear, x: &Tensors<F>) -> Result<ArrayD<F>> {
    run_heads(m, x, parallel::run_head::<F>, false)
}

/// The `fast` form: the chunked algorithm (Fenwick structure; the registry refuses other masks
/// through [`Mixer::form_unsupported`](mixer_core::Mixer::form_unsupported)).
pub fn fast<F: VecMath>(m: &LogLinear, x: &Tensors<F>) -> Result<ArrayD<F>> {
    if ssd::applies(m) {
        return run_heads(m, x, |m, hd| flushed(|| ssd::run_head(m, hd)), true);
    }
    run_heads(m, x, |m, hd| flushed(|| chunked::run_head(m, hd)), false)
}

/// Runs one head's chunked form with subnormal results flushed to zero
/// ([`crate::flush::FlushToZero`]): its decaying level states would otherwise pass through
/// the subnormal range in every product.
fn flushed<T>(f: impl FnOnce() -> T) -> T {
    let _ftz = crate::flush::FlushToZero::new();
    f()
}

/// The log-linear family on CPU.
struct LogLinearCpu;

impl<F: VecMath> Family<F> for LogLinearCpu {
    type Mixer = LogLinear;
    fn parallel(&self) -> Option<FormFn<LogLinear, F>> {
        Some(parallel)
    }
    fn fast(&self) -> Option<FormFn<LogLinear, F>> {
        Some(fast)
    }
    fn decoder(&self) -> Option<DecoderFn<LogLinear, F>> {
        Some(decoder::build)
    }
    fn backward(&self, form: Form) -> Option<BackwardFn<LogLinear, F>> {
        (form == Form::Fast).then_some(backward::vjp)
    }
}

#[register]
static LOGLINEAR_CPU: FamilyEntry =
    FamilyEntry { family: "loglinear", backend: "cpu", f64: &LogLinearCpu, f32: &LogLinearCpu, device: None };
