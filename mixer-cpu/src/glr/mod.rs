//! CPU forms of the generalized linear recurrence (docs/math.md §1.2): `glr` and its aliases.
//!
//! - `fast`: the sparse recurrence, `O(T · K)` per channel ([`fast`]);
//! - `recurrent`: a token-by-token decoder that keeps the lattice positions `P_t`
//!   (cache-efficient) or the last `f(K−1)` tokens (translation-invariant) ([`decoder`]);
//! - `materialized`: the generic oracle on [`Glr`]'s `(A, B)`.
//!
//! `fast` (and its backward) and `recurrent` run from a state and return the final state
//! (docs/math.md §7.1): the fast form over the run's tokens alone, reading the positions before
//! them from the state ([`fast::fast_from`], its backward [`backward::vjp_from`]), the decoder
//! with the state's values as its cache ([`decoder_from_state`]).

pub mod backward;
pub mod decoder;
pub mod fast;

use mixer_core::mixer::Decoder;
use mixer_core::mixers::glr::Glr;
use mixer_core::mixers::glr::state as glr_state;
use mixer_core::{Dims, DimsExt, Form, Real, Result, Tensors};
use mixer_registry::{
    BackwardFn, DecoderFn, Family, FamilyEntry, FormFn, PackedBackwardFn, PackedFn, StateBackwardFn,
    StateDecoderFn, StateFn, register,
};

/// The decoder started from a state (docs/math.md §7.1; `None`: position 0). Rows at different
/// positions get one decoder each ([`mixer_core::state::decoder_by_rows`]).
pub fn decoder_from_state<F: Real>(
    g: &Glr,
    _statics: &Tensors<F>,
    dims: &Dims,
    initial: Option<&Tensors<F>>,
) -> Result<Box<dyn Decoder<F>>> {
    let Some(s) = initial else { return Ok(Box::new(decoder::GlrDecoder::<F>::from_state(g, dims, None)?)) };
    let k = glr_state::slot_count(dims).unwrap_or(0);
    let pos = glr_state::positions(g, s, dims.size("T")?, k)?;
    let a = pos.first().copied().unwrap_or(0);
    if let Some(d) = mixer_core::state::by_rows_if_uneven(&pos, s, dims, |one, row| {
        decoder_from_state(g, _statics, one, Some(row))
    }) {
        return d;
    }
    Ok(mixer_core::state::resumed(Box::new(decoder::GlrDecoder::<F>::from_state(g, dims, Some((s, a)))?), a))
}

/// The GLR on CPU.
struct GlrCpu;

impl<F: Real> Family<F> for GlrCpu {
    type Mixer = Glr;
    fn fast(&self) -> Option<FormFn<Glr, F>> {
        Some(fast::fast)
    }
    fn decoder(&self) -> Option<DecoderFn<Glr, F>> {
        Some(|g, _statics, dims| Ok(Box::new(decoder::GlrDecoder::<F>::new(g, dims)?)))
    }
    fn backward(&self, form: Form) -> Option<BackwardFn<Glr, F>> {
        (form == Form::Fast).then_some(backward::vjp)
    }
    /// `fast` from a state: the sparse recurrence over the run's tokens, reading the positions
    /// before them from the state's values ([`fast::fast_from`]).
    fn stateful(&self, form: Form) -> Option<StateFn<Glr, F>> {
        (form == Form::Fast).then_some(fast::fast_from)
    }
    /// Its backward: the reverse sparse recurrence over the run's tokens, the reads before them
    /// differentiated into the state's rows ([`backward::vjp_from`]).
    fn stateful_backward(&self, form: Form) -> Option<StateBackwardFn<Glr, F>> {
        (form == Form::Fast).then_some(backward::vjp_from)
    }
    fn decoder_from_state(&self) -> Option<StateDecoderFn<Glr, F>> {
        Some(decoder_from_state)
    }
    /// `fast` over a packed batch, each sequence read in place ([`fast::fast_packed`]); from
    /// states the sequences run one by one (on the extension of each).
    fn packed(&self, form: Form) -> Option<PackedFn<Glr, F>> {
        (form == Form::Fast).then_some(fast::fast_packed)
    }
    fn packed_backward(&self, form: Form) -> Option<PackedBackwardFn<Glr, F>> {
        (form == Form::Fast).then_some(backward::vjp_packed)
    }
    fn packed_with_states(&self, _form: Form) -> bool {
        false
    }
}

#[register]
static GLR_CPU: FamilyEntry =
    FamilyEntry { family: "glr", backend: "cpu", f64: &GlrCpu, f32: &GlrCpu, device: None };
