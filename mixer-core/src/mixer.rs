//! The mixer and decoder contracts every family implements.

use std::any::Any;
use std::fmt::Debug;

use ndarray::{ArrayD, Axis, Dimension, IxDyn};

use crate::error::{Error, Result, fmt_shape};
use crate::grad::{MatGrad, Requires};
use crate::materialize::Materialization;
use crate::real::Real;
use crate::spec::{Bound, Dims, InputSpec};
use crate::tensor::{AnyTensors, Tensor, Tensors, token_slice};

/// A configured mixer: what it takes, and its materialization. Backends implement its forms
/// (see `mixer-registry`'s kernel entries); this trait is backend-free.
pub trait Mixer: Send + Sync + Debug + Any {
    /// The registered name (e.g. `kth-order`).
    fn name(&self) -> &str;
    /// The family: the key under which backends register its forms (e.g. `glr` for all its
    /// aliases; the same as its registry entry's `family`).
    fn family(&self) -> &'static str;
    /// The normalized configuration, as JSON.
    fn config(&self) -> serde_json::Value;
    /// Inputs, symbolic shapes and constraints.
    fn spec(&self) -> InputSpec;
    /// Requirements on derived sizes for bound base sizes (e.g. `K = K(T)`, `L ≥ L(T)`).
    fn bounds(&self, _dims: &Dims) -> Vec<(&'static str, Bound, &'static str)> {
        Vec::new()
    }
    /// The materialization `(A, B)` for these inputs (`f64`, validated).
    fn materialize(&self, inputs: &Tensors<f64>) -> Result<Materialization>;
    /// Valid random inputs of the given sizes. The default draws from the spec; families
    /// override it to plant garbage where it must be ignored, normalise keys, etc.
    fn random_inputs(&self, dims: &Dims, seed: u64) -> Result<Tensors<f64>> {
        let dims = complete_dims(self, dims);
        self.spec().random(&dims, seed, false)
    }
    /// Whether the `fast` backward reads the forward's output when the backward's inputs carry
    /// it ([`crate::grad::SAVED_OUTPUT`]) instead of recomputing it: a caller that keeps `y`
    /// anyway (an autograd node) passes it where this holds. Every backend's `fast` backward
    /// of such a mixer reads it; elsewhere it is accepted and ignored. Default: no.
    fn backward_reads_output(&self) -> bool {
        false
    }
    /// Why this configuration has no such form on any backend (e.g. the chunked form of a
    /// log-linear mixer needs the Fenwick mask), or `None` when the form may exist.
    fn form_unsupported(&self, _form: crate::Form) -> Option<String> {
        None
    }
    /// The number of scalars a correct decoder holds after consuming `consumed` tokens
    /// (`1 ≤ consumed ≤ T`) for the sizes `dims` (bound by [`validate`]), by the family's cache
    /// formula (e.g. `min(t, w) B H (D_k + D_v)` for a KV cache), or `None` when the decoder
    /// of this configuration has no closed form. The shared backend suite checks every
    /// backend's [`Decoder::cache_elems`] against it at every step.
    fn decoder_cache(&self, _dims: &Dims, _consumed: usize) -> Option<usize> {
        None
    }
    /// The inputs of the first `len` tokens of a sequence (`len ≤ T`): every per-token input
    /// cut along the sequence axis, static inputs kept. Families whose derived sizes depend on
    /// `T` exactly (e.g. the GLR's `K(T)` slot axes) cut those too, so that the result is a
    /// valid input of length `len`: the decoder's first `len` outputs must equal any form run
    /// on it.
    fn prefix(&self, inputs: &Tensors<f64>, len: usize) -> Result<Tensors<f64>> {
        crate::state::cut(inputs, &self.spec().per_token(), &self.length_axes(len), 0..len)
    }
    /// The axes besides the sequence axis whose size is a function of `T` exactly, as
    /// `(input, axis, size at length len)` (e.g. the GLR's `K(T)` slots): [`Mixer::prefix`]
    /// and the segments of a packed batch ([`crate::state::segment`]) cut them. Default: none.
    fn length_axes(&self, _len: usize) -> Vec<(&'static str, usize, usize)> {
        Vec::new()
    }
    /// The names and shapes of this mixer's recurrent state for the bound sizes `dims`
    /// ([`crate::state`]), or why it has none.
    fn state_shapes(&self, _dims: &Dims) -> std::result::Result<crate::state::StateShapes, String> {
        Err("this mixer has no recurrent-state API yet".into())
    }
    /// Sizes of the state that the inputs do not bind, from the given state's shapes (`None`:
    /// no state given): e.g. the capacity `N` of full attention's KV cache, read from the given
    /// cache or `T` without one. The registry adds them to the bound sizes before
    /// [`Mixer::state_shapes`], so a state's shapes may depend on them. Default: none.
    fn state_sizes(&self, _dims: &Dims, _given: Option<&crate::state::StateShapes>) -> Dims {
        Dims::new()
    }
    /// The sizes at which the checks of runs from a state draw their inputs, from the sizes of
    /// the plain checks: room for a state's prefix before the run where the inputs bound it
    /// (the Toeplitz mixer's `Tw`, the GLR's slots). Default: unchanged.
    fn state_check_dims(&self, dims: &Dims) -> Dims {
        dims.clone()
    }
    /// A random valid initial state for the sizes `dims`, drawn from `seed` (entries in
    /// `[−1, 1)`), for the checks of runs from a state. Default: every entry random
    /// ([`crate::state::random`]); mixers whose states have structure (the lifts' position
    /// and empty levels) override it.
    fn random_state(&self, dims: &Dims, seed: u64) -> Result<Tensors<f64>> {
        let shapes = self.state_shapes(dims).map_err(|why| crate::state::no_state(self.name(), &why))?;
        Ok(crate::state::random(&shapes, seed))
    }
    /// The `f64` reference of a run from a state: the output `y` and the final state, from
    /// the inputs and the initial state (`None`: zeros), both validated. Mixers with a state
    /// give it through their materialization (one oracle for every form and backend).
    fn state_oracle(
        &self,
        _inputs: &Tensors<f64>,
        _initial: Option<&Tensors<f64>>,
    ) -> Result<(ArrayD<f64>, Tensors<f64>)> {
        Err(crate::state::no_state(self.name(), "no reference for runs from a state"))
    }
    /// The `f64` reference backward of [`Mixer::state_oracle`]: from the cotangents of `y`
    /// and of the final state (`None`: zero), the gradients `d_<input>` (those in `requires`)
    /// and the gradient of the initial state (named as the state's tensors).
    fn state_oracle_vjp(
        &self,
        _inputs: &Tensors<f64>,
        _initial: Option<&Tensors<f64>>,
        _dy: &ArrayD<f64>,
        _d_final: Option<&Tensors<f64>>,
        _requires: &Requires,
    ) -> Result<(Tensors<f64>, Tensors<f64>)> {
        Err(crate::state::no_state(self.name(), "no reference backward for runs from a state"))
    }
    /// Estimated peak working memory, in bytes, of running `form` at these sizes with
    /// scalars of `elem` bytes (what the call allocates: output, copies, dense matrices; not
    /// its inputs). Checked against the budget before every run ([`crate::memory::guard`]).
    /// The default is [`crate::memory::default_estimate`]; families give their own formula.
    fn working_memory(&self, form: crate::Form, dims: &Dims, elem: f64) -> f64 {
        crate::memory::default_estimate(&self.spec(), form, dims, elem)
    }
    /// A hint appended to the error when an output overflows to ±∞ or NaN although every
    /// input is finite (e.g. a divergent recurrence), or `None`.
    fn overflow_hint(&self) -> Option<String> {
        None
    }
    /// Whether [`Mixer::materialized_vjp`] is implemented, i.e. the materialized backward
    /// (the reference gradient) exists for this mixer.
    fn has_materialized_vjp(&self) -> bool {
        false
    }
    /// Maps the gradients of the materialization's entries ([`crate::grad::vjp`]: `Ā`,
    /// `B̄`, `D̄`) back to the gradients `d_<input>` of every input except the mixed
    /// one (whose gradient the generic VJP computes). Inputs outside `requires` may be
    /// skipped. The default says that the mixer has no materialized backward.
    fn materialized_vjp(
        &self,
        _inputs: &Tensors<f64>,
        _mat: &Materialization,
        _grad: &MatGrad,
        _requires: &Requires,
    ) -> Result<Tensors<f64>> {
        Err(Error::FormUnavailable {
            mixer: self.name().to_string(),
            form: "materialized (backward)".into(),
            backend: "any".into(),
            available: "none: the mixer does not map entry gradients to its inputs \
                        (implement `Mixer::materialized_vjp` and `has_materialized_vjp`)"
                .into(),
        })
    }
    /// Upcast for backends that downcast to the concrete configuration.
    fn as_any(&self) -> &dyn Any;
}

/// Fills in derived sizes (`K`, `L`, …) from their bounds.
pub fn complete_dims<M: Mixer + ?Sized>(m: &M, dims: &Dims) -> Dims {
    let mut d = dims.clone();
    for (sym, b, _) in m.bounds(dims) {
        d.entry(sym).or_insert(match b {
            Bound::Exact(n) | Bound::AtLeast(n) => n,
        });
    }
    d
}

/// Sizes that satisfy every bound of `m`: derived sizes filled in as by [`complete_dims`],
/// and given sizes that violate a bound replaced by the bound (e.g. channels rounded up to
/// a multiple of a Toeplitz mixer's `heads`). For drawing inputs sized from a config.
pub fn fit_dims<M: Mixer + ?Sized>(m: &M, dims: &Dims) -> Dims {
    let mut d = complete_dims(m, dims);
    for (sym, b, _) in m.bounds(&d) {
        let have = d.get(sym).copied();
        match (b, have) {
            (Bound::Exact(n), Some(h)) if h != n => {
                d.insert(sym, n);
            }
            (Bound::AtLeast(n), Some(h)) if h < n => {
                d.insert(sym, n);
            }
            _ => {}
        }
    }
    d
}

/// Checks shapes, derived sizes and value constraints; returns the bound sizes.
pub fn validate(m: &dyn Mixer, inputs: &AnyTensors) -> Result<Dims> {
    match inputs {
        AnyTensors::F32(t) => validate_typed(m, t),
        AnyTensors::F64(t) => validate_typed(m, t),
    }
}

/// [`validate`] on tensors of one known scalar type (no tagged copy needed).
pub fn validate_typed<F: Real>(m: &dyn Mixer, inputs: &Tensors<F>) -> Result<Dims> {
    validate_except(m, inputs, None)
}

/// [`validate_typed`] for a backward's inputs, which may hold the forward's output
/// ([`crate::grad::SAVED_OUTPUT`]): the mixer's inputs as [`validate_typed`] checks them, and the
/// saved output with the mixed input's shape and finite values.
pub fn validate_backward_typed<F: Real>(m: &dyn Mixer, inputs: &Tensors<F>) -> Result<Dims> {
    let Some(y) = crate::grad::saved_output(m, inputs) else { return validate_typed(m, inputs) };
    let dims = validate_except(m, inputs, Some(crate::grad::SAVED_OUTPUT))?;
    let mixed = m.spec().mixed;
    let want = crate::tensor::get(inputs, mixed)?.shape();
    if y.shape() != want {
        return Err(Error::shape(
            crate::grad::SAVED_OUTPUT,
            format!("{} (the forward's output: the shape of `{mixed}`)", crate::error::fmt_shape(want)),
            crate::error::fmt_shape(y.shape()),
        ));
    }
    crate::spec::Constraint::Finite.check(crate::grad::SAVED_OUTPUT, y)?;
    Ok(dims)
}

/// [`validate_typed`] without the input named `skip`.
fn validate_except<F: Real>(m: &dyn Mixer, inputs: &Tensors<F>, skip: Option<&str>) -> Result<Dims> {
    let spec = m.spec();
    let shapes = inputs
        .iter()
        .filter(|(k, _)| Some(k.as_str()) != skip)
        .map(|(k, v)| (k.clone(), v.shape().to_vec()))
        .collect();
    let dims = spec.bind(&shapes)?;
    spec.check_bounds(&dims, &m.bounds(&dims))?;
    spec.check_values(inputs)?;
    Ok(dims)
}

/// Downcasts a mixer to its concrete type, with an error naming both.
pub fn downcast<'a, T: 'static>(m: &'a dyn Mixer, backend: &str) -> Result<&'a T> {
    m.as_any().downcast_ref::<T>().ok_or_else(|| Error::Backend {
        backend: backend.to_string(),
        family: Some(m.family().to_string()),
        message: format!("mixer `{}` is not a {}", m.name(), std::any::type_name::<T>()),
    })
}

/// A token-by-token decoder with a bounded cache or state.
pub trait Decoder<F: Real>: Send {
    /// Consumes the per-token inputs of the next position (sequence axis removed, e.g.
    /// `x [B, C]`) and returns that position's output (e.g. `[B, C]`).
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>>;
    /// Number of scalars held in the cache/state right now.
    fn cache_elems(&self) -> usize;
    /// Number of tokens consumed so far.
    fn position(&self) -> usize;
    /// The recurrent state after the tokens consumed so far ([`crate::state`]): what a run
    /// of those tokens returns as its final state. The default says the decoder cannot
    /// export its state.
    fn state(&self) -> Result<Tensors<F>> {
        Err(Error::Decoder("this decoder cannot export its state".into()))
    }
}

/// The error a decoder built for `t_len` tokens returns when asked for step `pos + 1`
/// beyond that; `Ok` while `pos < t_len`.
pub fn check_decoder_capacity(pos: usize, t_len: usize) -> Result<()> {
    if pos >= t_len {
        return Err(Error::Decoder(format!(
            "the decoder was built for T = {t_len} tokens; step {} is past its end",
            pos + 1
        )));
    }
    Ok(())
}

/// Runs a decoder over a whole sequence; returns `y` with the shape of the mixed input.
/// Calls `observe(t, cache_elems)` after every step.
pub fn run_decoder<F: Real>(
    dec: &mut dyn Decoder<F>,
    spec: &InputSpec,
    inputs: &Tensors<F>,
    mut observe: impl FnMut(usize, usize),
) -> Result<ArrayD<F>> {
    let mixed = crate::tensor::get(inputs, spec.mixed)?;
    let shape = mixed.shape().to_vec();
    let t_len = shape[1];
    let per_token = spec.per_token();
    let mut y = ArrayD::<F>::zeros(IxDyn(&shape));
    for t in 0..t_len {
        let tok = token_slice(inputs, &per_token, t);
        // A step reads its token and the cache: a small one runs on this thread.
        let values = tok.values().map(ArrayD::len).sum::<usize>() + dec.cache_elems();
        let yt = crate::parallel::sized(values, || dec.step(&tok))?;
        let mut dst = y.index_axis_mut(Axis(1), t);
        if yt.shape() != dst.shape() {
            return Err(Error::Decoder(format!(
                "step {t} returned {}, expected {}",
                fmt_shape(yt.shape()),
                fmt_shape(dst.shape())
            )));
        }
        dst.assign(&yt);
        observe(t, dec.cache_elems());
    }
    Ok(y)
}

/// Refuses an output with an entry that is ±∞ or NaN. Inputs passed [`validate`], so they
/// are finite: such an entry means the result overflowed the scalar type (or a form has a
/// bug), and it is reported with its index instead of being written silently.
pub fn check_output(m: &dyn Mixer, form: crate::Form, backend: &str, y: &Tensor) -> Result<()> {
    match y {
        Tensor::F32(a) => check_output_typed(m, form, backend, a),
        Tensor::F64(a) => check_output_typed(m, form, backend, a),
    }
}

/// [`check_output`] on an output of one known scalar type.
pub fn check_output_typed<F: Real>(
    m: &dyn Mixer,
    form: crate::Form,
    backend: &str,
    y: &ArrayD<F>,
) -> Result<()> {
    if crate::spec::Constraint::Finite.all(y) {
        return Ok(());
    }
    let Some((idx, x)) = y.indexed_iter().find(|(_, x)| !x.is_finite()) else { return Ok(()) };
    Err(Error::Numerical(format!(
        "`{}` {form} form on {backend}: y{} = {} although every input is finite; the result \
         overflows {}{}",
        m.name(),
        fmt_shape(&idx.as_array_view().to_vec()),
        x.f64(),
        F::DTYPE.name(),
        m.overflow_hint().map(|h| format!(" ({h})")).unwrap_or_default()
    )))
}
