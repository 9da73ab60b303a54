//! The log-linear attention family on CPU (docs/math.md §2): `linear-attention`, `mamba2`,
//! `gated-deltanet` and their lifts, all under the kernel key `"loglinear"`.
//!
//! - `parallel` ([`parallel`]): the quadratic masked form, for any level mask;
//! - `fast` ([`fast`]): the chunked O(T log T) algorithm of §2.6 (Fenwick mask only;
//!   the registry refuses other masks through `Mixer::form_unsupported`); linear attention,
//!   Mamba-2 and their lifts (scalar transitions) take the specialisation [`ssd`], gated
//!   DeltaNet and its lift the general [`chunked`] form;
//! - `recurrent` ([`decoder`]): O(log T) states per head (§2.5; Fenwick mask only).
//!
//! A lift under another mask runs `parallel` from a state: its state is a cache of its past
//! tokens, run through the extended sequence ([`parallel_from`]). Every other member (the lifts
//! with the Fenwick mask) runs `fast` and `recurrent` from a state
//! and returns its final state, forward and backward (docs/math.md §7.1: [`fast::fast_from`],
//! [`backward::vjp_from`], [`decoder::build_from`]; the lifts' parts in `lift_state`), and runs
//! `fast` over a packed batch natively, forward and backward (§7.2: [`fast::fast_packed`],
//! [`backward::vjp_packed`]; the sequences' rows as heads of their own, [`common::Layout`]).
//!
//! Work is spread over (sequence, head) with rayon; each head's matmuls and triangular solves
//! use faer sequentially.

pub mod backward;
mod backward_chunked;
pub mod chunked;
pub mod common;
pub mod decoder;
pub mod fast;
mod levels;
mod lift_state;
pub mod parallel;
pub mod ssd;

use crate::vmath::VecMath;
use mixer_core::Form;
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::mixers::loglinear::state as loglinear_state;
use mixer_core::{Result, Tensors};
use mixer_registry::{
    BackwardFn, DecoderFn, Family, FamilyEntry, FormFn, PackedBackwardFn, PackedFn, StateBackwardFn,
    StateDecoderFn, StateFn, register,
};
use ndarray::ArrayD;

/// The `parallel` form: the quadratic masked form, any level mask.
pub fn parallel<F: VecMath>(m: &LogLinear, x: &Tensors<F>) -> Result<ArrayD<F>> {
    common::run_heads(m, x, parallel::run_head::<F>, false, None)
}

/// The `parallel` form from a state, for a lift under a mask other than Fenwick: its cache of
/// past tokens, through the extended sequence (docs/math.md §7.1, `mixer_core::mixers::cache`).
fn parallel_from<F: VecMath>(
    m: &LogLinear,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let cache = loglinear_state::cache(m).ok_or_else(|| {
        mixer_core::Error::Io(format!(
            "`{}` keeps no cache of past tokens (internal: the registry asked)",
            m.name
        ))
    })?;
    cache.run(x, initial, |e| parallel(m, e))
}

/// The log-linear family on CPU.
struct LogLinearCpu;

impl<F: VecMath> Family<F> for LogLinearCpu {
    type Mixer = LogLinear;
    fn parallel(&self) -> Option<FormFn<LogLinear, F>> {
        Some(parallel)
    }
    fn fast(&self) -> Option<FormFn<LogLinear, F>> {
        Some(fast::fast)
    }
    fn decoder(&self) -> Option<DecoderFn<LogLinear, F>> {
        Some(decoder::build)
    }
    fn backward(&self, form: Form) -> Option<BackwardFn<LogLinear, F>> {
        (form == Form::Fast).then_some(backward::vjp)
    }
    fn stateful(&self, form: Form) -> Option<StateFn<LogLinear, F>> {
        match form {
            Form::Fast => Some(fast::fast_from),
            Form::Parallel => Some(parallel_from),
            _ => None,
        }
    }
    fn state_unsupported(&self, m: &LogLinear, form: Form) -> Option<String> {
        (form == Form::Parallel && loglinear_state::cache(m).is_none()).then(|| {
            "the parallel form runs from a state only for the lifts under a mask other than Fenwick (a \
             cache of their past tokens); the base mixers and the Fenwick lifts run from a state by \
             the fast and recurrent forms"
                .into()
        })
    }
    fn stateful_backward(&self, form: Form) -> Option<StateBackwardFn<LogLinear, F>> {
        (form == Form::Fast).then_some(backward::vjp_from)
    }
    fn decoder_from_state(&self) -> Option<StateDecoderFn<LogLinear, F>> {
        Some(decoder::build_from)
    }
    fn packed(&self, form: Form) -> Option<PackedFn<LogLinear, F>> {
        (form == Form::Fast).then_some(fast::fast_packed)
    }
    fn packed_backward(&self, form: Form) -> Option<PackedBackwardFn<LogLinear, F>> {
        (form == Form::Fast).then_some(backward::vjp_packed)
    }
}

#[register]
static LOGLINEAR_CPU: FamilyEntry =
    FamilyEntry { family: "loglinear", backend: "cpu", f64: &LogLinearCpu, f32: &LogLinearCpu, device: None };
