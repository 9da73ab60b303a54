//! The log-linear family on CUDA (docs/math.md §2): `linear-attention`, `mamba2`,
//! `gated-deltanet` and their lifts `loglinear-*`.
//!
//! - `parallel` ([`parallel`]): the generic quadratic form, any level mask;
//! - `fast` ([`chunked`]): the chunked form of docs/math.md §2.6 (Fenwick mask): for linear
//!   attention and Mamba-2 (and their lifts) parallel over chunks with a tree of chunk states
//!   ([`chunk_tree`]); for gated DeltaNet the WY/UT form, one block per (batch, head) walking its
//!   chunks;
//! - `recurrent` ([`decoder`]): O(log T) device-resident level states per head (§2.5), one
//!   kernel launch per token, a warp per (batch·head, state row).
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

pub mod chunk_tree;
pub mod chunked;
pub mod decoder;
pub mod delta;
pub mod lambda;
pub mod parallel;

use mixer_core::mixers::loglinear::LogLinear;
use mixer_registry::{FamilyEntry, register};

use crate::device_run::Device;
use crate::forms::{DeviceDecoderFn, DeviceFamily, DeviceFormFn, Hosted};
use crate::runtime::GpuReal;

/// Family name in errors.
pub(crate) const FAMILY: &str = "loglinear";

/// The log-linear family on CUDA.
pub struct LogLinearCuda;

impl<F: GpuReal> DeviceFamily<F> for LogLinearCuda {
    type Mixer = LogLinear;
    fn parallel() -> Option<DeviceFormFn<LogLinear>> {
        Some(parallel::run::<F>)
    }
    fn fast() -> Option<DeviceFormFn<LogLinear>> {
        Some(chunked::run::<F>)
    }
    fn decoder() -> Option<DeviceDecoderFn<LogLinear, F>> {
        Some(|m, statics, dims| {
            Ok(Box::new(
                decoder::LogLinearDecoder::<F>::new(m, dims)?
                    .with_lambda_param(statics.get("lambda_param"))?,
            ))
        })
    }
}

#[register]
static LOGLINEAR_CUDA: FamilyEntry = FamilyEntry {
    family: FAMILY,
    backend: "cuda",
    f64: &Hosted(LogLinearCuda),
    f32: &Hosted(LogLinearCuda),
    device: Some(&Device(LogLinearCuda)),
};
