//! CPU forms of the generalized linear recurrence (docs/math.md §1.2): `glr` and its aliases.
//!
//! - `fast`: the sparse recurrence, `O(T · K)` per channel ([`fast`]);
//! - `recurrent`: a token-by-token decoder that keeps the lattice positions `P_t`
//!   (cache-efficient) or the last `f(K−1)` tokens (translation-invariant) ([`decoder`]);
//! - `materialized`: the generic oracle on [`Glr`]'s `(A, B)`.

pub mod backward;
pub mod decoder;
pub mod fast;

use mixer_core::Form;
use mixer_core::Real;
use mixer_core::mixers::glr::Glr;
use mixer_registry::{BackwardFn, DecoderFn, Family, FamilyEntry, FormFn, register};

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
}

#[register]
static GLR_CPU: FamilyEntry =
    FamilyEntry { family: "glr", backend: "cpu", f64: &GlrCpu, f32: &GlrCpu, device: None };
