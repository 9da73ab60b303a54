//! The log-linear family on CUDA (docs/math.md §2): `linear-attention`, `mamba2`,
//! `gated-deltanet` and their lifts `loglinear-*`. Laid out by form and, for the chunked form, by
//! step, as flash-linear-attention names them and as the CPU twin is; each kernel file shares its
//! stem with the file that launches it (`kernels/loglinear_<stem>.cu`):
//!
//! - [`common`]: the shared bottom — the family's name, base codes, chunk length, the shapes,
//!   storage and device a launch plan is made for, one launch of a plan, the chunked form's
//!   inputs and views, the size limits (`loglinear_common.cuh` on the kernel side);
//! - `parallel` ([`parallel`]): the generic quadratic form, any level mask (its source also maps
//!   λ: [`lambda`]);
//! - `fast` ([`fast`]): the chunked form of docs/math.md §2.6 (Fenwick mask), the dispatcher and
//!   its launch plan ([`plan`]): for linear attention and Mamba-2 (and their lifts) the chunk
//!   states with their tree or scan ([`ssd`]); for gated DeltaNet the WY/UT step ([`wy`]) and the
//!   sequential state pass ([`state_pass`], one rule for its variant); then the outputs
//!   ([`output`]); where the pass's states do not fit in shared memory, one block per head
//!   ([`sequential`]);
//! - the `fast` backward ([`backward`]): linear attention and Mamba-2 by transposed runs of the
//!   `fast` form on reversed sequences (`loglinear_backward.cu`), gated DeltaNet by reverse mode
//!   through the WY/UT chunk form ([`backward_chunked`], `loglinear_backward_chunked.cu`); from a
//!   state too ([`backward::run_from`], exact mode); the scalar-decay lifts' by the lifted forward
//!   of `(dy, v, k)` and a reverse sweep over chunks ([`backward_lift`],
//!   `loglinear_backward_lift.cu`); the lifted gated DeltaNet's by its own passes over the level
//!   states and chunk-parallel gradients ([`backward_lift_delta`], `loglinear_backward_lift_delta.cu`);
//! - the lifts' `fast` form from a state and its backward ([`lift_state`],
//!   `loglinear_lift_state.cu`): the run cut into aligned segments, each the lift from zero on
//!   its own tokens plus one base-mixer run from a state over a row per level state;
//! - `recurrent` ([`decoder`]): O(log T) device-resident level states per head (§2.5), one
//!   kernel launch per token, a warp per (batch·head, state row).
//!
//! Every file imports from [`common`] and from the steps below it only: `fast` → `ssd`, `wy`,
//! `state_pass`, `output`, `sequential`, `lambda` → `common`; `ssd` → `output`; `decoder` →
//! `lambda` → `parallel`; `backward` → `fast`, `backward_lift`, `backward_lift_delta`,
//! `backward_chunked`; `backward_lift` → `fast`, `ssd`, `state_pass`; `backward_lift_delta` →
//! `backward_lift`, `fast`, `state_pass`, `wy`; `backward_chunked` → `wy`; `lift_state` → `fast`,
//! `backward`, `backward_lift`; only the backward files and `lift_state` import `fast`, and nothing
//! imports this module.
//!
//! The `fast` and `recurrent` forms exist only with Fenwick structure (base mixers, or the
//! Fenwick mask); the registry refuses the rest through `Mixer::form_unsupported`, on every
//! backend alike.
//!
//! The level mask's registered CUDA device function (`MaskEntry::cuda`,
//! `__device__ int mixers_level(long long t, long long s)`) and the λ scheme's
//! (`LambdaEntry::cuda`, `__device__ double mixers_lambda(double raw, double param)`) are
//! spliced into the generic kernel `kernels/loglinear_parallel.cu` and compiled by NVRTC (one
//! module per (mask, scheme) pair, cached), so a plugin mask or scheme needs no kernel of its own.

pub mod backward;
pub mod backward_chunked;
pub mod backward_lift;
pub mod backward_lift_delta;
pub mod common;
pub mod decoder;
pub mod fast;
pub mod lambda;
pub mod lift_state;
pub mod output;
pub mod packed;
pub mod parallel;
pub mod sequential;
pub mod ssd;
pub mod state_pass;
pub mod wy;

pub use common::{Device, Elem, Launch, Shape, Step, Storage};
pub use fast::{Path, Plan, plan};
pub use state_pass::StatePass;

use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Dims, Form, Precision, Result};

use crate::forms::{
    DeviceBackwardFn, DeviceDecoderFn, DeviceFamily, DeviceFormFn, DeviceStateBackwardFn, DeviceStateFn,
};
use crate::tensor::GpuReal;
use mixer_core::mixers::loglinear::state::STATE;
use mixer_registry::StateDecoderFn;

use common::FAMILY;

/// The log-linear family on CUDA.
pub struct LogLinearCuda;

impl<F: GpuReal> DeviceFamily<F> for LogLinearCuda {
    type Mixer = LogLinear;
    /// The fast form's launch plan ([`fast::plan`]) on this process's device, with the
    /// activations stored as the mode stores them (bf16 rows taken as 16-byte aligned, as
    /// contiguous inputs are).
    fn plan(m: &LogLinear, form: Form, dims: &Dims, p: Precision) -> Option<Result<serde_json::Value>> {
        if form != Form::Fast {
            return None;
        }
        let storage = if p == Precision::Bf16 {
            Storage::Bf16 { aligned: true }
        } else {
            Storage::Real(Elem::of::<F>())
        };
        let shape = ["B", "T", "H", "Dk", "Dv"].map(|k| dims.get(k).copied().unwrap_or(0));
        Some(fast::plan(m, shape, p, storage, common::Device::current()).and_then(|plan| {
            serde_json::to_value(plan).map_err(|e| crate::runtime::err(FAMILY, format!("plan as JSON: {e}")))
        }))
    }
    fn parallel() -> Option<DeviceFormFn<LogLinear>> {
        Some(parallel::run::<F>)
    }
    fn fast() -> Option<DeviceFormFn<LogLinear>> {
        Some(fast::run::<F>)
    }
    fn backward() -> Option<DeviceBackwardFn<LogLinear>> {
        Some(backward::run::<F>)
    }
    fn backward_unsupported(m: &LogLinear) -> Option<String> {
        backward::unsupported(m)
    }
    /// The base mixers' by [`fast::run_from`]; the lifts' by [`lift_state::run_from`].
    fn fast_from_state() -> Option<DeviceStateFn<LogLinear>> {
        Some(|m, x, s0, p| {
            if m.lift.is_some() {
                return lift_state::run_from::<F>(m, x, p, s0);
            }
            let s0 = s0.map(|s| crate::forms::input::<F>(s, STATE)).transpose()?;
            let (y, fin) = fast::run_from::<F>(m, x, p, s0.as_deref(), true)?;
            let fin = fin.ok_or_else(|| crate::runtime::err(FAMILY, "internal: no final state"))?;
            Ok((y, [(STATE.to_string(), F::wrap(fin))].into_iter().collect()))
        })
    }
    /// The state of a lift on host arrays: its positions and empty slots, as the CPU checks them
    /// ([`lift_state::run_from`] reads only the positions back).
    fn check_host_state(m: &LogLinear, x: &mixer_core::Tensors<F>, s: &mixer_core::Tensors<F>) -> Result<()> {
        if m.lift.is_none() || !m.has_fenwick_structure() {
            return Ok(());
        }
        let t_len = x.get("q").map_or(0, |q| q.shape()[1]);
        mixer_core::mixers::loglinear::lift_state::positions(s, t_len).map(drop)
    }
    /// The base mixers' by [`backward::run_from`], the lifts' by [`lift_state::backward_from`]
    /// (exact mode whatever the mode asked).
    fn fast_backward_from_state() -> Option<DeviceStateBackwardFn<LogLinear>> {
        Some(|m, x, s0, dy, d_final, req, p| {
            if m.lift.is_some() {
                return lift_state::backward_from::<F>(m, x, s0, dy, d_final, req);
            }
            let s0 = s0.map(|s| crate::forms::input::<F>(s, STATE)).transpose()?;
            let df = d_final.map(|s| crate::forms::input::<F>(s, STATE)).transpose()?;
            let (g, ds) = backward::run_from::<F>(m, x, s0.as_deref(), dy, df.as_deref(), req, p)?;
            Ok((g, ds.map(|d| (STATE.to_string(), F::wrap(d))).into_iter().collect()))
        })
    }
    fn decoder() -> Option<DeviceDecoderFn<LogLinear, F>> {
        Some(|m, statics, dims| {
            Ok(Box::new(
                decoder::LogLinearDecoder::<F>::new(m, dims)?
                    .with_lambda_param(statics.get("lambda_param"))?,
            ))
        })
    }
    fn decoder_from_state() -> Option<StateDecoderFn<LogLinear, F>> {
        Some(decoder::from_state::<F>)
    }
}

cuda_family!(LOGLINEAR_CUDA, FAMILY, LogLinearCuda);
