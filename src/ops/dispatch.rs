//! The only way from the typed operations into the dynamic path (registry lookup, validation,
//! backend dispatch): [`forward`] for whole sequences and [`Stepper`] for token-by-token
//! decoding.
//!
//! Copies: each input view is copied once, into row-major order, into the owned
//! named-tensor map the registry's kernels take ([`Tensors`]); the output is moved out, not
//! copied.

use std::collections::BTreeMap;

use mixer_core::mixer::{Decoder, Mixer, check_decoder_capacity};
use mixer_core::{Dims, Error, Form, Result, Tensors};
use mixer_registry::Backend;
use ndarray::{Array, ArrayD, ArrayViewD, Dimension};

use super::options::Options;
use super::scalar::Scalar;

/// A named input, as a view of the caller's array.
pub(crate) type Named<'a, F> = (&'static str, ArrayViewD<'a, F>);

/// The one copy: views (any strides) into the owned, row-major map the kernels take.
fn owned<F: Clone>(inputs: Vec<Named<'_, F>>) -> Tensors<F> {
    inputs.into_iter().map(|(n, a)| (n.to_string(), a.as_standard_layout().into_owned())).collect()
}

/// Reshapes the dynamic output into the operation's rank (no copy).
fn into_rank<F, D: Dimension>(a: ArrayD<F>) -> Result<Array<F, D>> {
    let shape = a.shape().to_vec();
    a.into_dimensionality::<D>().map_err(|_| Error::Backend {
        backend: "ops".into(),
        family: None,
        message: format!(
            "the output has shape {}, expected rank {}",
            mixer_core::error::fmt_shape(&shape),
            D::NDIM.map_or("any".to_string(), |n| n.to_string())
        ),
    })
}

/// The backend of `opts`.
fn backend_for(opts: &Options) -> Result<Backend> {
    opts.resolve_backend()
}

/// Builds a registered mixer from its name and JSON config (the registry's constructor, so a
/// typed call configures exactly the mixer the dynamic path would).
pub(crate) fn build(name: &str, config: &serde_json::Value) -> Result<Box<dyn Mixer>> {
    mixer_registry::mixer(name, config)
}

/// Runs `opts.form` of `m` on `opts`' backend over whole sequences.
pub(crate) fn forward<F: Scalar, D: Dimension>(
    m: &dyn Mixer,
    opts: &Options,
    inputs: Vec<Named<'_, F>>,
) -> Result<Array<F, D>> {
    let backend = backend_for(opts)?;
    if let Some(cu) = &opts.cu_seqlens {
        let (y, _) = mixer_registry::packed::run_packed(
            m,
            &backend,
            opts.form,
            &owned(inputs),
            cu,
            None,
            false,
            opts.precision,
        )?;
        return into_rank(y);
    }
    into_rank(mixer_registry::run::run_typed_with(m, &backend, opts.form, &owned(inputs), opts.precision)?)
}

/// Runs `opts.form` of `m` from the state `initial` (the mixer's single state tensor `state`;
/// `None`: zeros) and returns `y` and the final state; with `opts.cu_seqlens`, one state row
/// per sequence in and out.
pub(crate) fn forward_state<F: Scalar, D: Dimension, S: Dimension>(
    m: &dyn Mixer,
    opts: &Options,
    inputs: Vec<Named<'_, F>>,
    state: &'static str,
    initial: Option<ArrayViewD<'_, F>>,
) -> Result<(Array<F, D>, Array<F, S>)> {
    let init = initial.map(|s| owned(vec![(state, s)]));
    let (y, fin) = forward_states(m, opts, inputs, init)?;
    let fin = fin.into_iter().find(|(k, _)| k == state).map(|(_, v)| v).ok_or_else(|| Error::Backend {
        backend: "any".into(),
        family: Some(m.family().into()),
        message: format!("internal: the run returned no state `{state}`"),
    })?;
    Ok((y, into_rank(fin)?))
}

/// [`forward_state`] for a state of several tensors (all of them in and out).
pub(crate) fn forward_states<F: Scalar, D: Dimension>(
    m: &dyn Mixer,
    opts: &Options,
    inputs: Vec<Named<'_, F>>,
    initial: Option<Tensors<F>>,
) -> Result<(Array<F, D>, Tensors<F>)> {
    let backend = backend_for(opts)?;
    let x = owned(inputs);
    let (y, fin) = match &opts.cu_seqlens {
        Some(cu) => {
            let (y, f) = mixer_registry::packed::run_packed(
                m,
                &backend,
                opts.form,
                &x,
                cu,
                initial.as_ref(),
                true,
                opts.precision,
            )?;
            (y, f.unwrap_or_default())
        }
        None => {
            mixer_registry::state::run_state(m, &backend, opts.form, &x, initial.as_ref(), opts.precision)?
        }
    };
    Ok((into_rank(y)?, fin))
}

/// A token-by-token decoder of a configured mixer, for at most `max_len` tokens. The backend's
/// decoder is opened at the first step, when the token shapes give the sizes.
pub(crate) struct Stepper<F: Scalar> {
    mixer: Box<dyn Mixer>,
    backend: Backend,
    statics: Tensors<F>,
    max_len: usize,
    dec: Option<Box<dyn Decoder<F>>>,
    /// The state to start from (`None`: the plain decoder).
    initial: Option<Tensors<F>>,
    /// Tokens stepped so far (a backend's decoder started from a state may count its position
    /// from the state's).
    taken: usize,
}

impl<F: Scalar> Stepper<F> {
    /// Checks that `m` decodes on the chosen backend and that the static inputs are valid.
    pub(crate) fn new(
        mixer: Box<dyn Mixer>,
        opts: &Options,
        statics: Vec<Named<'_, F>>,
        max_len: usize,
    ) -> Result<Self> {
        let backend = backend_for(opts)?;
        let forms = mixer_registry::run::forms(mixer.as_ref(), &backend);
        if !forms.contains(&Form::Recurrent) {
            let why = mixer.form_unsupported(Form::Recurrent).map(|w| format!(" ({w})")).unwrap_or_default();
            return Err(Error::FormUnavailable {
                mixer: mixer.name().to_string(),
                form: Form::Recurrent.name().into(),
                backend: backend.name().into(),
                available: format!("{}{why}", forms.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")),
            });
        }
        let statics = owned(statics);
        mixer.spec().check_values(&statics)?;
        Ok(Stepper { mixer, backend, statics, max_len, dec: None, initial: None, taken: 0 })
    }

    /// The sizes, from the static inputs and the first token with the sequence axis
    /// (`T = max_len`) put back, checked like a whole-sequence call.
    fn bind(&self, token: &Tensors<F>) -> Result<Dims> {
        let mut shapes: BTreeMap<String, Vec<usize>> =
            self.statics.iter().map(|(k, a)| (k.clone(), a.shape().to_vec())).collect();
        for (k, a) in token {
            let mut s = a.shape().to_vec();
            s.insert(1.min(s.len()), self.max_len);
            shapes.insert(k.clone(), s);
        }
        let spec = self.mixer.spec();
        let dims = spec.bind(&shapes).and_then(|d| spec.check_bounds(&d, &self.mixer.bounds(&d)).map(|()| d));
        dims.map_err(|e| {
            Error::Decoder(format!(
                "first token of `{}`: {e} (shapes shown with the sequence axis T = max_len = {} put back)",
                self.mixer.name(),
                self.max_len
            ))
        })
    }

    /// Consumes one token's inputs (sequence axis removed) and returns that token's output.
    pub(crate) fn step<D: Dimension>(&mut self, token: Vec<Named<'_, F>>) -> Result<Array<F, D>> {
        check_decoder_capacity(self.position(), self.max_len)?;
        let token = owned(token);
        self.mixer.spec().check_values(&token)?;
        let dec = match &mut self.dec {
            Some(d) => d,
            None => {
                let dims = self.bind(&token)?;
                let d = match &self.initial {
                    Some(s) => mixer_registry::state::decoder_from_state(
                        self.mixer.as_ref(),
                        &self.backend,
                        &self.statics,
                        &dims,
                        Some(s),
                    )?,
                    None => F::open_decoder(self.mixer.as_ref(), self.backend, &self.statics, &dims)?,
                };
                self.dec.insert(d)
            }
        };
        let y = into_rank(dec.step(&token)?)?;
        self.taken += 1;
        Ok(y)
    }

    /// Starts the decoder from the state `name` = `initial` (checked at the first step, when
    /// the sizes are known).
    pub(crate) fn start_from(&mut self, name: &str, initial: ArrayViewD<'_, F>) {
        self.start_from_states(
            [(name.to_string(), initial.as_standard_layout().into_owned())].into_iter().collect(),
        );
    }

    /// Starts the decoder from a state of several tensors.
    pub(crate) fn start_from_states(&mut self, initial: Tensors<F>) {
        self.initial = Some(initial);
    }

    /// The state `name` after the tokens consumed so far (the initial state before the first
    /// step; an error before the first step of a decoder without one).
    pub(crate) fn state<S: Dimension>(&self, name: &str) -> Result<Array<F, S>> {
        let a = self
            .states()?
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
            .ok_or_else(|| Error::Decoder(format!("the decoder's state has no tensor `{name}`")))?;
        into_rank(a)
    }

    /// Every tensor of the state after the tokens consumed so far (as [`Stepper::state`]).
    pub(crate) fn states(&self) -> Result<Tensors<F>> {
        match (&self.dec, &self.initial) {
            (Some(d), _) => d.state(),
            (None, Some(s)) => Ok(s.clone()),
            (None, None) => Err(Error::Decoder(
                "the decoder has consumed no token yet, so its state's sizes are unknown".into(),
            )),
        }
    }

    /// Tokens consumed so far.
    pub(crate) fn position(&self) -> usize {
        self.taken
    }

    /// Scalars held in the decoder's cache or state now.
    pub(crate) fn cache_elems(&self) -> usize {
        self.dec.as_ref().map_or(0, |d| d.cache_elems())
    }

    /// The most tokens this decoder takes.
    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }
}
