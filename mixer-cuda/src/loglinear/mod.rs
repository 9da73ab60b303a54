//! The log-linear family on CUDA (docs/math.md §2): `linear-attention`, `mamba2`,
//! `gated-deltanet` and their lifts `loglinear-*`.
//!
//! - `parallel` ([`quadratic`]): the generic quadratic form, any level mask;
//! - `fast` ([`chunked`]): the chunked form of docs/math.md §2.6 (Fenwick mask; WY/UT form for gated
//!   DeltaNet), one block per (batch, head) walking its chunks;
//! - `recurrent` ([`decoder`]): O(log T) device-resident level states per head (§2.5), one
//!   kernel launch per token.
//!
//! The `fast` and `recurrent` forms exist only with Fenwick structure (base mixers, or the
//! Fenwick mask); the registry refuses the rest through `Mixer::form_unsupported`, on every
//! backend alike.
//!
//! The level mask's registered CUDA device function (`MaskEntry::cuda`,
//! `__device__ int mixers_level(long long t, long long s)`) and the λ scheme's
//! (`LambdaEntry::cuda`, `__device__ double mixers_lambda(double raw, double param)`) are
//! spliced into the generic kernel `kernels/loglinear.cu` and compiled by NVRTC (one module
//! per (mask, scheme) pair, cached), so a plugin mask or scheme needs no kernel of its own.

pub mod chunked;
pub mod decoder;
pub mod parallel;

use mixer_core::mixers::loglinear::LogLinear;
use mixer_registry::{DecoderFn, Family, FamilyEntry, FormFn, register};

use crate::runtime::GpuReal;

/// Family name in errors.
pub(crate) const FAMILY: &str = "loglinear";

/// The log-linear family on CUDA.
struct LogLinearCuda;

impl<F: GpuReal> Family<F> for LogLinearCuda {
    type Mixer = LogLinear;
    fn parallel(&self) -> Option<FormFn<LogLinear, F>> {
        Some(parallel::run)
    }
    fn fast(&self) -> Option<FormFn<LogLinear, F>> {
        Some(chunked::run)
    }
    fn decoder(&self) -> Option<DecoderFn<LogLinear, F>> {
        Some(|m, statics, dims| {
            Ok(Box::new(
                decoder::LogLinearDecoder::<F>::new(m, dims)?
                    .with_lambda_param(statics.get("lambda_param").cloned()),
            ))
        })
    }
}

#[register]
static LOGLINEAR_CUDA: FamilyEntry =
    FamilyEntry { family: FAMILY, backend: "cuda", f64: &LogLinearCuda, f32: &LogLinearCuda };
