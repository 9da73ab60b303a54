//! The backend contract: what a backend implements for one mixer family.
//!
//! A backend implements [`Family<F>`] once per family (e.g. `GlrCpu` for the `glr` family on
//! `cpu`), for every scalar type `F` it supports, and registers it with one
//! [`FamilyEntry`](crate::FamilyEntry). Every method has a default meaning "not implemented on
//! this backend", so a backend writes only the forms it has. The registry, not the backend,
//! decides what runs (`crate::run`): it asks the mixer ([`Mixer::form_unsupported`]), then
//! the family implementation ([`Family::unsupported`] and whether the form's method returns a
//! function), and builds every "not available" error and every list of available forms from
//! those answers. The registry also downcasts the mixer to [`Family::Mixer`] once, so a form
//! receives its concrete configuration.
//!
//! `materialized` is never a backend's business (the registry runs the `f64` oracle), and
//! `recurrent` is the decoder run over the whole sequence.
//!
//! Gradients follow the same contract: [`Family::backward`] gives a backend's backward pass
//! (vector–Jacobian product) of a form, [`Family::backward_unsupported`] its per-configuration
//! restrictions, and `crate::backward` dispatches, validates and builds the errors; the
//! `materialized` backward (the reference) is generic and needs nothing from a backend.
//!
//! Extending the contract (e.g. another operation per form) means adding a method with a
//! `None` default here and a branch in the registry's dispatch: no backend has to change.

use std::fmt;
use std::ops::Range;

use mixer_core::mixer::{Decoder, Mixer, downcast};

use crate::device::contract::DeviceForms;
use mixer_core::{AnyTensors, Dims, Form, Precision, Real, Requires, Result, Tensor, Tensors};
use ndarray::ArrayD;

/// A form of the family: output from the validated inputs.
pub type FormFn<M, F> = fn(&M, &Tensors<F>) -> Result<ArrayD<F>>;
/// A form of the family that honours a [`Precision`] mode other than `exact` (tensor cores,
/// bf16 storage), from the validated `f32` inputs. The output has the inputs' scalar type; in
/// the `bf16` mode its values are bf16 numbers.
pub type PreciseFn<M, F> = fn(&M, &Tensors<F>, Precision) -> Result<ArrayD<F>>;
/// A decoder of the family from the static inputs (those without a sequence axis) and the
/// bound sizes.
pub type DecoderFn<M, F> = fn(&M, &Tensors<F>, &Dims) -> Result<Box<dyn Decoder<F>>>;

/// A backward form of the family: the gradients `d_<input>` (at least every wanted, given
/// input's) from the validated inputs, the output cotangent `dy` (shape of `y`, checked) and
/// the wanted set.
pub type BackwardFn<M, F> = fn(&M, &Tensors<F>, &ArrayD<F>, &Requires) -> Result<Tensors<F>>;

/// A backward form with its own handling of the `tf32` and `bf16` modes, from the validated
/// `f32` inputs and cotangent (as given: the `bf16` mode's rounding of the activations and `dy`
/// is the implementation's): the gradients `d_<input>` as for [`BackwardFn`].
pub type PreciseBackwardFn<M, F> =
    fn(&M, &Tensors<F>, &ArrayD<F>, &Requires, Precision) -> Result<Tensors<F>>;

/// A form run from a recurrent state ([`mixer_core::state`]): `y` and the final state, from
/// the validated inputs and the validated initial state (`None`: zeros).
pub type StateFn<M, F> = fn(&M, &Tensors<F>, Option<&Tensors<F>>) -> Result<(ArrayD<F>, Tensors<F>)>;
/// A [`StateFn`] with its own handling of the `tf32` and `bf16` modes, from the validated `f32`
/// inputs as given (the `bf16` mode's rounding of the activations is the implementation's).
pub type PreciseStateFn<M, F> =
    fn(&M, &Tensors<F>, Option<&Tensors<F>>, Precision) -> Result<(ArrayD<F>, Tensors<F>)>;
/// The backward of a [`StateFn`]: from the inputs, the initial state, the cotangent `dy` of
/// `y` and that of the final state (`None`: zero), the gradients `d_<input>` and the
/// gradient of the initial state (keyed as the state's tensors; empty without one).
pub type StateBackwardFn<M, F> = fn(
    &M,
    &Tensors<F>,
    Option<&Tensors<F>>,
    &ArrayD<F>,
    Option<&Tensors<F>>,
    &Requires,
) -> Result<(Tensors<F>, Tensors<F>)>;
/// A decoder that starts from a state (`None`: zeros), from the static inputs and the bound
/// sizes; its [`Decoder::state`] is the state after the tokens it consumed.
pub type StateDecoderFn<M, F> =
    fn(&M, &Tensors<F>, &Dims, Option<&Tensors<F>>) -> Result<Box<dyn Decoder<F>>>;

/// A packed batch run natively (docs/math.md §7.2): from the validated inputs (`B = 1`), the
/// checked row ranges of the sequences (`cu_seqlens`), the checked initial states (one row per
/// sequence; `None`: zeros) and whether the final states are wanted, `y` (zero past the last
/// range) and, with an initial state or `want_final`, the final states (one row per sequence).
/// Sequence `i` must get exactly what the form ([`Family::stateful`]'s with a state) computes
/// on it alone, bit for bit.
pub type PackedFn<M, F> = fn(
    &M,
    &Tensors<F>,
    &[Range<usize>],
    Option<&Tensors<F>>,
    bool,
) -> Result<(ArrayD<F>, Option<Tensors<F>>)>;
/// The backward of a [`PackedFn`]: from the inputs, the ranges, the initial states, `dy` and
/// the final states' cotangent (`None`: zero), the gradients `d_<input>` (per-token inputs' zero
/// past the last range, static inputs' summed over the sequences in order) and the initial
/// states' gradient (empty without initial states). Each sequence's gradients must be exactly
/// those of its backward alone.
pub type PackedBackwardFn<M, F> = fn(
    &M,
    &Tensors<F>,
    &[Range<usize>],
    Option<&Tensors<F>>,
    &ArrayD<F>,
    Option<&Tensors<F>>,
    &Requires,
) -> Result<(Tensors<F>, Tensors<F>)>;

/// One backend's implementation of one mixer family for scalar type `F`.
pub trait Family<F: Real>: Send + Sync + 'static {
    /// The family's concrete mixer type (the registry downcasts to it).
    type Mixer: Mixer;
    /// The family's own quadratic form, if this backend has it.
    fn parallel(&self) -> Option<FormFn<Self::Mixer, F>> {
        None
    }
    /// The sub-quadratic form, if this backend has it.
    fn fast(&self) -> Option<FormFn<Self::Mixer, F>> {
        None
    }
    /// The `parallel` or `fast` form with its own handling of the `tf32` and `bf16` modes,
    /// if this backend has one for `form`. Without it the registry runs the exact form
    /// (`tf32`) or converts at the boundary (`bf16`: activations and `y` rounded to bf16).
    fn precise(&self, _form: Form) -> Option<PreciseFn<Self::Mixer, F>> {
        None
    }
    /// The token-by-token decoder (the `recurrent` form), if this backend has it.
    fn decoder(&self) -> Option<DecoderFn<Self::Mixer, F>> {
        None
    }
    /// Why this backend cannot run `form` for this configuration although it implements the
    /// form for others (e.g. a decoder variant it has not ported), or `None`. Restrictions that
    /// hold on every backend belong to [`Mixer::form_unsupported`] instead.
    fn unsupported(&self, _m: &Self::Mixer, _form: Form) -> Option<String> {
        None
    }
    /// The backward pass of `form` (`parallel` or `fast`), if this backend has one.
    fn backward(&self, _form: Form) -> Option<BackwardFn<Self::Mixer, F>> {
        None
    }
    /// Why this backend cannot differentiate `form` for this configuration although it has
    /// that backward form for others, or `None`.
    fn backward_unsupported(&self, _m: &Self::Mixer, _form: Form) -> Option<String> {
        None
    }
    /// The backward of `form` with its own handling of the `tf32` and `bf16` modes, if this
    /// backend has one ([`Family::precise`]'s counterpart). Without it the registry runs the
    /// exact backward (`tf32`) or converts at the boundary (`bf16`: activations and `dy` rounded
    /// to bf16, `f32` gradients).
    fn precise_backward(&self, _form: Form) -> Option<PreciseBackwardFn<Self::Mixer, F>> {
        None
    }
    /// `parallel` or `fast` run from a recurrent state, if this backend has it.
    fn stateful(&self, _form: Form) -> Option<StateFn<Self::Mixer, F>> {
        None
    }
    /// Why this backend cannot run `form` of this configuration from a state although it runs
    /// that form from a state for others, or `None`.
    fn state_unsupported(&self, _m: &Self::Mixer, _form: Form) -> Option<String> {
        None
    }
    /// [`Family::stateful`]'s form with its own handling of the `tf32` and `bf16` modes, if this
    /// backend has one. Without it the registry runs the exact form (`tf32`) or converts at the
    /// boundary (`bf16`: the activations and `y` rounded to bf16).
    fn precise_stateful(&self, _form: Form) -> Option<PreciseStateFn<Self::Mixer, F>> {
        None
    }
    /// The backward of [`Family::stateful`]'s form, if this backend has it.
    fn stateful_backward(&self, _form: Form) -> Option<StateBackwardFn<Self::Mixer, F>> {
        None
    }
    /// The decoder started from a state (the `recurrent` form from a state), if this backend
    /// has it.
    fn decoder_from_state(&self) -> Option<StateDecoderFn<Self::Mixer, F>> {
        None
    }
    /// `form` over a packed batch in one call (one job list over the sequences), if this
    /// backend has it; without it `crate::packed` runs the sequences one by one through the
    /// plain and stateful forms. Used in the `exact` mode, where [`Family::run`]'s and
    /// [`Family::stateful`]'s forms (and their restrictions) say the form runs.
    fn packed(&self, _form: Form) -> Option<PackedFn<Self::Mixer, F>> {
        None
    }
    /// The backward of [`Family::packed`]'s form, if this backend has it; used where
    /// [`Family::backward`] (or [`Family::stateful_backward`] with a state) says the backward
    /// runs.
    fn packed_backward(&self, _form: Form) -> Option<PackedBackwardFn<Self::Mixer, F>> {
        None
    }
    /// Whether [`Family::packed`] and [`Family::packed_backward`] also run packed batches with
    /// states (initial states given, or the final states asked for or given a cotangent);
    /// `false`: those batches run sequence by sequence.
    fn packed_with_states(&self, _form: Form) -> bool {
        true
    }
}

/// [`Family`] with the mixer type erased: what a [`FamilyEntry`](crate::FamilyEntry) stores.
/// Implemented for every `Family`; not meant to be implemented by hand.
pub trait DynFamily<F: Real>: Send + Sync {
    /// Whether the form has an implementation (`materialized` never has one here).
    fn implements(&self, form: Form) -> bool;
    /// [`Family::unsupported`] for a mixer of this family (an error if it is not one).
    fn unsupported(&self, m: &dyn Mixer, backend: &str, form: Form) -> Result<Option<String>>;
    /// Runs `parallel` or `fast`; `None` when the form is not implemented.
    fn run(&self, m: &dyn Mixer, backend: &str, form: Form, x: &Tensors<F>) -> Option<Result<ArrayD<F>>>;
    /// Runs [`Family::precise`]'s form; `None` when there is none.
    fn run_precise(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        precision: Precision,
    ) -> Option<Result<ArrayD<F>>>;
    /// Builds the decoder; `None` when there is none.
    fn decoder(
        &self,
        m: &dyn Mixer,
        backend: &str,
        statics: &Tensors<F>,
        dims: &Dims,
    ) -> Option<Result<Box<dyn Decoder<F>>>>;
    /// Whether the form has a backward pass here.
    fn implements_backward(&self, form: Form) -> bool;
    /// [`Family::backward_unsupported`] for a mixer of this family (an error if it is not one).
    fn backward_unsupported(&self, m: &dyn Mixer, backend: &str, form: Form) -> Result<Option<String>>;
    /// Runs [`Family::backward`]'s pass of `form`; `None` when there is none.
    fn run_backward(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        dy: &ArrayD<F>,
        requires: &Requires,
    ) -> Option<Result<Tensors<F>>>;
    /// Whether `form` runs from a state here (`recurrent`: a decoder from a state).
    fn implements_state(&self, form: Form) -> bool;
    /// [`Family::state_unsupported`] for a mixer of this family (an error if it is not one).
    fn state_unsupported(&self, m: &dyn Mixer, backend: &str, form: Form) -> Result<Option<String>>;
    /// Runs [`Family::precise_backward`]'s pass of `form`; `None` when there is none.
    #[allow(clippy::too_many_arguments)]
    fn run_precise_backward(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        dy: &ArrayD<F>,
        requires: &Requires,
        precision: Precision,
    ) -> Option<Result<Tensors<F>>>;
    /// Whether `form`'s run from a state has a backward pass here.
    fn implements_state_backward(&self, form: Form) -> bool;
    /// Runs [`Family::stateful`]'s form; `None` when there is none.
    fn run_state(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        initial: Option<&Tensors<F>>,
    ) -> Option<Result<(ArrayD<F>, Tensors<F>)>>;
    /// Runs [`Family::precise_stateful`]'s form; `None` when there is none.
    fn run_precise_state(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        initial: Option<&Tensors<F>>,
        precision: Precision,
    ) -> Option<Result<(ArrayD<F>, Tensors<F>)>>;
    /// Runs [`Family::stateful_backward`]'s pass; `None` when there is none.
    #[allow(clippy::too_many_arguments)]
    fn run_state_backward(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        initial: Option<&Tensors<F>>,
        dy: &ArrayD<F>,
        d_final: Option<&Tensors<F>>,
        requires: &Requires,
    ) -> Option<Result<(Tensors<F>, Tensors<F>)>>;
    /// Builds [`Family::decoder_from_state`]'s decoder; `None` when there is none.
    fn decoder_from_state(
        &self,
        m: &dyn Mixer,
        backend: &str,
        statics: &Tensors<F>,
        dims: &Dims,
        initial: Option<&Tensors<F>>,
    ) -> Option<Result<Box<dyn Decoder<F>>>>;
    /// Whether `form` runs over a packed batch natively here ([`Family::packed`]).
    fn implements_packed(&self, form: Form) -> bool;
    /// Whether `form` has its own handling of the `tf32` and `bf16` modes here, plain
    /// ([`Family::precise`]) or from a state ([`Family::precise_stateful`]).
    fn implements_precise(&self, form: Form) -> bool;
    /// Whether `form`'s native packed run has a backward here ([`Family::packed_backward`]).
    fn implements_packed_backward(&self, form: Form) -> bool;
    /// Whether `form`'s native packed run takes states ([`Family::packed_with_states`]).
    fn implements_packed_states(&self, form: Form) -> bool;
    /// Runs [`Family::packed`]'s form; `None` when there is none.
    #[allow(clippy::too_many_arguments)]
    fn run_packed(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        ranges: &[Range<usize>],
        initial: Option<&Tensors<F>>,
        want_final: bool,
    ) -> Option<Result<(ArrayD<F>, Option<Tensors<F>>)>>;
    /// Runs [`Family::packed_backward`]'s pass; `None` when there is none.
    #[allow(clippy::too_many_arguments)]
    fn run_packed_backward(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        ranges: &[Range<usize>],
        initial: Option<&Tensors<F>>,
        dy: &ArrayD<F>,
        d_final: Option<&Tensors<F>>,
        requires: &Requires,
    ) -> Option<Result<(Tensors<F>, Tensors<F>)>>;
}

/// The number of values in the tensors of `maps` (`None`: none) and in `arrays`: what a call
/// reads, the measure of [`mixer_core::parallel::sized`].
pub(crate) fn values<F: Real>(maps: &[Option<&Tensors<F>>], arrays: &[&ArrayD<F>]) -> usize {
    maps.iter().flatten().flat_map(|t| t.values()).chain(arrays.iter().copied()).map(ArrayD::len).sum()
}

/// Runs `f`, a backend's form, as [`mixer_core::parallel::sized`] for a call that reads the
/// tensors of `maps` and `arrays` ([`values`]): small calls keep the CPU backend's parallel
/// loops on the calling thread.
fn sized<F: Real, R>(maps: &[Option<&Tensors<F>>], arrays: &[&ArrayD<F>], f: impl FnOnce() -> R) -> R {
    mixer_core::parallel::sized(values(maps, arrays), f)
}

impl<F: Real, T: Family<F>> DynFamily<F> for T {
    fn implements(&self, form: Form) -> bool {
        match form {
            Form::Materialized => false,
            Form::Parallel => self.parallel().is_some(),
            Form::Fast => self.fast().is_some(),
            Form::Recurrent => self.decoder().is_some(),
        }
    }
    fn unsupported(&self, m: &dyn Mixer, backend: &str, form: Form) -> Result<Option<String>> {
        Ok(Family::unsupported(self, downcast::<T::Mixer>(m, backend)?, form))
    }
    fn run(&self, m: &dyn Mixer, backend: &str, form: Form, x: &Tensors<F>) -> Option<Result<ArrayD<F>>> {
        let f = match form {
            Form::Parallel => self.parallel()?,
            Form::Fast => self.fast()?,
            Form::Materialized | Form::Recurrent => return None,
        };
        Some(sized(&[Some(x)], &[], || downcast::<T::Mixer>(m, backend).and_then(|m| f(m, x))))
    }
    fn run_precise(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        precision: Precision,
    ) -> Option<Result<ArrayD<F>>> {
        let f = self.precise(form)?;
        Some(sized(&[Some(x)], &[], || downcast::<T::Mixer>(m, backend).and_then(|m| f(m, x, precision))))
    }
    fn decoder(
        &self,
        m: &dyn Mixer,
        backend: &str,
        statics: &Tensors<F>,
        dims: &Dims,
    ) -> Option<Result<Box<dyn Decoder<F>>>> {
        let make = Family::decoder(self)?;
        Some(downcast::<T::Mixer>(m, backend).and_then(|m| make(m, statics, dims)))
    }
    fn implements_backward(&self, form: Form) -> bool {
        self.backward(form).is_some()
    }
    fn backward_unsupported(&self, m: &dyn Mixer, backend: &str, form: Form) -> Result<Option<String>> {
        Ok(Family::backward_unsupported(self, downcast::<T::Mixer>(m, backend)?, form))
    }
    fn run_backward(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        dy: &ArrayD<F>,
        requires: &Requires,
    ) -> Option<Result<Tensors<F>>> {
        let f = self.backward(form)?;
        Some(sized(&[Some(x)], &[dy], || {
            downcast::<T::Mixer>(m, backend).and_then(|m| f(m, x, dy, requires))
        }))
    }
    fn run_precise_backward(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        dy: &ArrayD<F>,
        requires: &Requires,
        precision: Precision,
    ) -> Option<Result<Tensors<F>>> {
        let f = self.precise_backward(form)?;
        Some(sized(&[Some(x)], &[dy], || {
            downcast::<T::Mixer>(m, backend).and_then(|m| f(m, x, dy, requires, precision))
        }))
    }
    fn implements_state(&self, form: Form) -> bool {
        match form {
            Form::Materialized => false,
            Form::Recurrent => Family::decoder_from_state(self).is_some(),
            f => self.stateful(f).is_some(),
        }
    }
    fn implements_state_backward(&self, form: Form) -> bool {
        self.stateful_backward(form).is_some()
    }
    fn state_unsupported(&self, m: &dyn Mixer, backend: &str, form: Form) -> Result<Option<String>> {
        Ok(Family::state_unsupported(self, downcast::<T::Mixer>(m, backend)?, form))
    }
    fn run_state(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        initial: Option<&Tensors<F>>,
    ) -> Option<Result<(ArrayD<F>, Tensors<F>)>> {
        let f = self.stateful(form)?;
        Some(sized(&[Some(x), initial], &[], || {
            downcast::<T::Mixer>(m, backend).and_then(|m| f(m, x, initial))
        }))
    }
    fn run_precise_state(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        initial: Option<&Tensors<F>>,
        precision: Precision,
    ) -> Option<Result<(ArrayD<F>, Tensors<F>)>> {
        let f = self.precise_stateful(form)?;
        Some(sized(&[Some(x), initial], &[], || {
            downcast::<T::Mixer>(m, backend).and_then(|m| f(m, x, initial, precision))
        }))
    }
    fn run_state_backward(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        initial: Option<&Tensors<F>>,
        dy: &ArrayD<F>,
        d_final: Option<&Tensors<F>>,
        requires: &Requires,
    ) -> Option<Result<(Tensors<F>, Tensors<F>)>> {
        let f = self.stateful_backward(form)?;
        Some(sized(&[Some(x), initial, d_final], &[dy], || {
            downcast::<T::Mixer>(m, backend).and_then(|m| f(m, x, initial, dy, d_final, requires))
        }))
    }
    fn decoder_from_state(
        &self,
        m: &dyn Mixer,
        backend: &str,
        statics: &Tensors<F>,
        dims: &Dims,
        initial: Option<&Tensors<F>>,
    ) -> Option<Result<Box<dyn Decoder<F>>>> {
        let make = Family::decoder_from_state(self)?;
        Some(downcast::<T::Mixer>(m, backend).and_then(|m| make(m, statics, dims, initial)))
    }
    fn implements_packed(&self, form: Form) -> bool {
        self.packed(form).is_some()
    }
    fn implements_precise(&self, form: Form) -> bool {
        self.precise(form).is_some() || self.precise_stateful(form).is_some()
    }
    fn implements_packed_backward(&self, form: Form) -> bool {
        self.packed_backward(form).is_some()
    }
    fn implements_packed_states(&self, form: Form) -> bool {
        self.packed_with_states(form)
    }
    fn run_packed(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        ranges: &[Range<usize>],
        initial: Option<&Tensors<F>>,
        want_final: bool,
    ) -> Option<Result<(ArrayD<F>, Option<Tensors<F>>)>> {
        let f = self.packed(form)?;
        Some(sized(&[Some(x), initial], &[], || {
            downcast::<T::Mixer>(m, backend).and_then(|m| f(m, x, ranges, initial, want_final))
        }))
    }
    fn run_packed_backward(
        &self,
        m: &dyn Mixer,
        backend: &str,
        form: Form,
        x: &Tensors<F>,
        ranges: &[Range<usize>],
        initial: Option<&Tensors<F>>,
        dy: &ArrayD<F>,
        d_final: Option<&Tensors<F>>,
        requires: &Requires,
    ) -> Option<Result<(Tensors<F>, Tensors<F>)>> {
        let f = self.packed_backward(form)?;
        Some(sized(&[Some(x), initial, d_final], &[dy], || {
            downcast::<T::Mixer>(m, backend).and_then(|m| f(m, x, ranges, initial, dy, d_final, requires))
        }))
    }
}

/// A backend's implementation of one mixer family (e.g. `glr` on `cpu`), registered with
/// `#[register]`:
///
/// ```ignore
/// struct GlrCpu;
/// impl<F: Real> Family<F> for GlrCpu {
///     type Mixer = Glr;
///     fn fast(&self) -> Option<FormFn<Glr, F>> { Some(fast::fast) }
///     fn backward(&self, form: Form) -> Option<BackwardFn<Glr, F>> {
///         (form == Form::Fast).then_some(backward::vjp)
///     }
/// }
/// #[register]
/// static GLR_CPU: FamilyEntry =
///     FamilyEntry { family: "glr", backend: "cpu", f64: &GlrCpu, f32: &GlrCpu, device: None };
/// ```
pub struct FamilyEntry {
    /// The family key ([`Mixer::family`]).
    pub family: &'static str,
    /// The backend name.
    pub backend: &'static str,
    /// The `f64` implementation.
    pub f64: &'static dyn DynFamily<f64>,
    /// The `f32` implementation.
    pub f32: &'static dyn DynFamily<f32>,
    /// The forms on the backend's own device tensors, for a backend whose tensors can live on
    /// an accelerator (`None` for host-only backends): see [`crate::device`].
    pub device: Option<&'static dyn DeviceForms>,
}

impl fmt::Debug for FamilyEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let forms: Vec<&str> =
            Form::ALL.iter().filter(|&&x| self.f64.implements(x)).map(|x| x.name()).collect();
        f.debug_struct("FamilyEntry")
            .field("family", &self.family)
            .field("backend", &self.backend)
            .field("forms", &forms)
            .field("device", &self.device.is_some())
            .finish()
    }
}

/// Picks the implementation of a [`FamilyEntry`] for a scalar type, and tags typed tensors
/// for the registry's dtype-tagged entry points.
pub trait Scalar: Real {
    /// The entry's implementation for `Self`.
    fn implementation(e: &FamilyEntry) -> &'static dyn DynFamily<Self>;
    /// Named tensors of this type, tagged.
    fn tag(t: Tensors<Self>) -> AnyTensors;
    /// One array of this type, tagged.
    fn tag_one(a: ArrayD<Self>) -> Tensor;
    /// A tagged tensor back as this type (`None` when it has another dtype).
    fn untag(t: Tensor) -> Option<ArrayD<Self>>;
    /// Named tensors of this type as `f32` ones (`None` unless `Self` is `f32`).
    fn as_f32(t: &Tensors<Self>) -> Option<&Tensors<f32>>;
}

/// [`Scalar`] for `$t`, whose entry field and tag variant are `$field` and `$tag` (the other
/// tag being `$other`).
macro_rules! scalar {
    ($t:ty, $field:ident, $tag:ident, $other:ident) => {
        impl Scalar for $t {
            fn implementation(e: &FamilyEntry) -> &'static dyn DynFamily<$t> {
                e.$field
            }
            fn tag(t: Tensors<$t>) -> AnyTensors {
                AnyTensors::$tag(t)
            }
            fn tag_one(a: ArrayD<$t>) -> Tensor {
                Tensor::$tag(a)
            }
            fn untag(t: Tensor) -> Option<ArrayD<$t>> {
                match t {
                    Tensor::$tag(a) => Some(a),
                    Tensor::$other(_) => None,
                }
            }
            fn as_f32(t: &Tensors<$t>) -> Option<&Tensors<f32>> {
                (t as &dyn std::any::Any).downcast_ref()
            }
        }
    };
}

scalar!(f64, f64, F64, F32);
scalar!(f32, f32, F32, F64);
