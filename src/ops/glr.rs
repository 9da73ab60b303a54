//! The generalized linear recurrence (MATH §1.2), typed.
//!
//! Which side the offset pattern sits on (`on = b | a | both`) follows from the
//! coefficients given: [`GlrCoeffs::B`], [`GlrCoeffs::A`] or [`GlrCoeffs::Both`].

use mixer_core::{Error, Mixer, Result};
use ndarray::{Array2, Array3, ArrayView, ArrayView2, ArrayView3, Dimension, Ix2, Ix3};

use super::dispatch::{Named, Stepper, build, forward, forward_states};
use super::options::{Options, PatternRef};
use super::scalar::Scalar;
use super::states::{RowState, glr_stream};

/// The offset pattern of a GLR (MATH §1.1): a registered `f(k)`, translation-invariant
/// positions `d_k(t) = t − f(k)` or the cache-efficient lattice, optionally truncated to the
/// first `order` slots.
///
/// `K = K(T) = #{k : f(k) ≤ T − 1}` (after truncation) is the number of slots the
/// coefficient tensors carry.
#[derive(Clone, Debug)]
pub struct GlrPattern {
    /// The offset pattern, by name or by value.
    pub pattern: PatternRef,
    /// Cache-efficient lattice positions (needs `f(0) = 1`).
    pub cache_efficient: bool,
    /// Truncation to the first `order` slots (`None`: untruncated).
    pub order: Option<usize>,
}

impl GlrPattern {
    /// The pattern `pattern`, translation-invariant and untruncated.
    pub fn new(pattern: impl Into<PatternRef>) -> Self {
        GlrPattern { pattern: pattern.into(), cache_efficient: false, order: None }
    }
    /// Uses the cache-efficient lattice.
    pub fn cache_efficient(mut self, yes: bool) -> Self {
        self.cache_efficient = yes;
        self
    }
    /// Truncates to the first `order` slots (`linear` with order 1 is a diagonal SSM).
    pub fn order(mut self, order: usize) -> Self {
        self.order = Some(order);
        self
    }
}

/// The coefficients of a GLR; the variant chooses `on`. `D` is the rank of `alpha` with
/// `on = b`: [`Ix3`] over a whole sequence ([`GlrCoeffs`], shapes with the sequence axis `T`
/// as written below), [`Ix2`] for one token ([`GlrTokenCoeffs`], the same shapes without `T`).
#[derive(Clone, Debug)]
pub enum GlrCoeffsOf<'a, F, D: Dimension> {
    /// `on = b`, recurrence on past outputs: `alpha [B, T, C]`, `beta [B, T, K, C]`;
    /// `y_t = α_t x_t + Σ_{k: f(k) ≤ t} β_{t,k} y_{d_k(t)}`.
    B {
        /// `[B, T, C]`.
        alpha: ArrayView<'a, F, D>,
        /// `[B, T, K, C]`.
        beta: ArrayView<'a, F, D::Larger>,
    },
    /// `on = a`, sparse attention-like: `alpha [B, T, K+1, C]`;
    /// `y_t = α_{t,0} x_t + Σ_k α_{t,k+1} x_{d_k(t)}`.
    A {
        /// `[B, T, K+1, C]`.
        alpha: ArrayView<'a, F, D::Larger>,
    },
    /// `on = both`: `alpha [B, T, K+1, C]`, `beta [B, T, K, C]`, both sums.
    Both {
        /// `[B, T, K+1, C]`.
        alpha: ArrayView<'a, F, D::Larger>,
        /// `[B, T, K, C]`.
        beta: ArrayView<'a, F, D::Larger>,
    },
}

/// The coefficients of a GLR over a whole sequence: `alpha [B, T, C]` or `[B, T, K+1, C]`,
/// `beta [B, T, K, C]`.
pub type GlrCoeffs<'a, F> = GlrCoeffsOf<'a, F, Ix3>;

/// The coefficients of one token (sequence axis removed): `alpha [B, C]` or `[B, K+1, C]`,
/// `beta [B, K, C]`; the variant must match the one the decoder started with.
pub type GlrTokenCoeffs<'a, F> = GlrCoeffsOf<'a, F, Ix2>;

/// The `glr` mixer for `pattern` with `on` = `"b"`, `"a"` or `"both"`.
pub(crate) fn mixer(pattern: &GlrPattern, on: &str, opts: &Options) -> Result<Box<dyn Mixer>> {
    opts.only("glr", &[])?;
    let cfg = serde_json::json!({
        "pattern": pattern.pattern.resolve("glr")?,
        "cache_efficient": pattern.cache_efficient,
        "order": pattern.order,
        "on": on,
    });
    build("glr", &cfg)
}

impl<'a, F, D: Dimension> GlrCoeffsOf<'a, F, D> {
    /// `on` and the named inputs (`alpha`, and `beta` where given).
    pub(crate) fn split(self) -> (&'static str, Vec<Named<'a, F>>) {
        match self {
            Self::B { alpha, beta } => ("b", vec![("alpha", alpha.into_dyn()), ("beta", beta.into_dyn())]),
            Self::A { alpha } => ("a", vec![("alpha", alpha.into_dyn())]),
            Self::Both { alpha, beta } => {
                ("both", vec![("alpha", alpha.into_dyn()), ("beta", beta.into_dyn())])
            }
        }
    }
}

/// Generalized linear recurrence: `y_t = Σ_{s ≤ t} α_{t,s} x_s + Σ_{s < t} β_{t,s} y_s`
/// with the off-diagonal coefficients at the pattern's positions `d_k(t)` only.
///
/// Shapes: `x [B, T, C]` and the coefficients of [`GlrCoeffs`] (`K ≥ K(T)` slots; slots past
/// `K(T)` are never read) →
/// `y [B, T, C]`. Slots with `f(k) > t` are ignored. No per-family options (`chunk`,
/// `scale`, … are errors). Forms: materialized, fast (sparse recurrence), recurrent.
///
/// ```
/// use mixers::ndarray::{Array3, Array4};
/// use mixers::ops::{self, GlrCoeffs, GlrPattern, Options};
/// // A diagonal SSM y_t = x_t + ½ y_{t−1}: pattern linear, order 1 (K = 1).
/// let x = Array3::<f64>::ones((1, 3, 1));
/// let (alpha, beta) = (Array3::ones((1, 3, 1)), Array4::from_elem((1, 3, 1, 1), 0.5));
/// let coeffs = GlrCoeffs::B { alpha: alpha.view(), beta: beta.view() };
/// let y = ops::glr(x.view(), coeffs, &GlrPattern::new("linear").order(1), &Options::default())?;
/// assert_eq!(y.as_slice().unwrap(), &[1.0, 1.5, 1.75]);
/// # Ok::<(), mixers::prelude::Error>(())
/// ```
pub fn glr<F: Scalar>(
    x: ArrayView3<'_, F>,
    coeffs: GlrCoeffs<'_, F>,
    pattern: &GlrPattern,
    opts: &Options,
) -> Result<Array3<F>> {
    let (on, mut inputs) = coeffs.split();
    let m = mixer(pattern, on, opts)?;
    inputs.push(("x", x.into_dyn()));
    forward(m.as_ref(), opts, inputs)
}

/// Token-by-token [`glr`], with a cache of the past positions the pattern reads (at most
/// `f⁻¹(T)` on the cache-efficient lattice, the largest offset otherwise).
///
/// [`step`](Self::step) takes `x_t [B, C]` and the token's [`GlrTokenCoeffs`]
/// (`K = K(max_len)` slots) and returns `y_t [B, C]`.
///
/// ```
/// use mixers::ndarray::{Array2, Array3};
/// use mixers::ops::{GlrDecoder, GlrPattern, GlrTokenCoeffs, Options};
/// let mut dec = GlrDecoder::<f64>::new(GlrPattern::new("pow2").cache_efficient(true), 10, &Options::default())?;
/// // K(10) = 4 slots (offsets 1, 2, 4, 8); on = a: alpha [B, K+1, C].
/// let alpha = Array3::<f64>::ones((1, 5, 1));
/// for t in 0..10 {
///     let x = Array2::from_elem((1, 1), t as f64);
///     dec.step(x.view(), GlrTokenCoeffs::A { alpha: alpha.view() })?;
/// }
/// assert!(dec.cache_elems() <= 5); // ≤ log₂T + 1 positions
/// # Ok::<(), mixers::prelude::Error>(())
/// ```
pub struct GlrDecoder<F: Scalar> {
    pattern: GlrPattern,
    opts: Options,
    max_len: usize,
    /// `on` and the decoder, from the first step.
    started: Option<(&'static str, Stepper<F>)>,
    /// The state to start from ([`GlrDecoder::from_state`]).
    initial: Option<super::states::RowState<F>>,
}

impl<F: Scalar> GlrDecoder<F> {
    /// A decoder for at most `max_len` tokens; checks the pattern now (the side it sits on
    /// comes with the first token's coefficients).
    pub fn new(pattern: GlrPattern, max_len: usize, opts: &Options) -> Result<Self> {
        mixer(&pattern, "b", opts)?;
        Ok(GlrDecoder { pattern, opts: opts.clone(), max_len, started: None, initial: None })
    }

    /// A decoder started from `initial_state` (see [`glr_state`](super::glr_state)) for at most
    /// `max_len` more tokens.
    pub fn from_state(
        pattern: GlrPattern,
        max_len: usize,
        initial_state: &super::states::RowState<F>,
        opts: &Options,
    ) -> Result<Self> {
        let mut d = Self::new(pattern, max_len, opts)?;
        d.initial = Some(initial_state.clone());
        Ok(d)
    }

    /// The state after the tokens consumed so far (an error before the first step: the side
    /// the pattern sits on comes with the coefficients).
    pub fn state(&self) -> Result<super::states::RowState<F>> {
        let (on, stepper) = self
            .started
            .as_ref()
            .ok_or_else(|| Error::Decoder("the decoder has consumed no token yet".into()))?;
        super::states::RowState::from_tensors(stepper.states()?, super::states::glr_stream(on)?)
    }

    /// Consumes one token: `x_t [B, C]` and its coefficients; returns `y_t [B, C]`.
    pub fn step(&mut self, x: ArrayView2<'_, F>, coeffs: GlrTokenCoeffs<'_, F>) -> Result<Array2<F>> {
        let (on, mut token) = coeffs.split();
        token.push(("x", x.into_dyn()));
        let (started_on, stepper) = match &mut self.started {
            Some(s) => s,
            None => {
                let m = mixer(&self.pattern, on, &self.opts)?;
                let mut st = Stepper::new(m, &self.opts, Vec::new(), self.max_len)?;
                if let Some(s) = &self.initial {
                    st.start_from_states(s.to_tensors(super::states::glr_stream(on)?)?);
                }
                self.started.insert((on, st))
            }
        };
        if *started_on != on {
            return Err(Error::Decoder(format!(
                "token {}: coefficients for on = \"{on}\", but the decoder started with on = \"{started_on}\"",
                stepper.position()
            )));
        }
        stepper.step(token)
    }

    /// Tokens consumed so far.
    pub fn position(&self) -> usize {
        self.started.as_ref().map_or(0, |s| s.1.position())
    }

    /// Scalars held in the cache now.
    pub fn cache_elems(&self) -> usize {
        self.started.as_ref().map_or(0, |s| s.1.cache_elems())
    }

    /// The most tokens this decoder takes.
    pub fn max_len(&self) -> usize {
        self.max_len
    }
}

/// [`glr`] from the state `initial_state` (`None`: position 0), returning
/// `(y, final state)`. The state's rows are the past outputs (`on = b`, [`GlrCoeffs::B`]) or
/// inputs (`on = a`, [`GlrCoeffs::A`]) later tokens read; `on = both` ([`GlrCoeffs::Both`])
/// keeps both, the outputs in `rows` and the inputs in [`RowState::inputs`]. A run
/// of `T` tokens from position `a` reads `K(a + T)` slots, so the coefficients' slot axis must
/// hold at least that many (one sized for the whole sequence serves every part). Forms: `fast`,
/// `recurrent`, `materialized`.
///
/// ```
/// use mixers::ndarray::{Array3, Array4, Axis, Slice};
/// use mixers::ops::{self, GlrCoeffs, GlrPattern, Options};
/// // pow2 on the lattice, T = 12: K(12) = 4 slots serve both parts.
/// let x = Array3::<f64>::from_shape_fn((1, 12, 2), |(_, t, c)| ((t + c) as f64).sin());
/// let alpha = Array3::<f64>::ones((1, 12, 2));
/// let beta = Array4::<f64>::from_elem((1, 12, 4, 2), 0.2);
/// let p = GlrPattern::new("pow2").cache_efficient(true);
/// let opts = Options::default();
/// let y = ops::glr(x.view(), GlrCoeffs::B { alpha: alpha.view(), beta: beta.view() }, &p, &opts)?;
/// let cut3 = |a: &Array3<f64>, r| a.slice_axis(Axis(1), Slice::from(r)).to_owned();
/// let cut4 = |a: &Array4<f64>, r| a.slice_axis(Axis(1), Slice::from(r)).to_owned();
/// let (a0, b0) = (cut3(&alpha, 0..5), cut4(&beta, 0..5));
/// let (_, s) = ops::glr_state(cut3(&x, 0..5).view(), GlrCoeffs::B { alpha: a0.view(), beta: b0.view() }, &p, None, &opts)?;
/// let (a1, b1) = (cut3(&alpha, 5..12), cut4(&beta, 5..12));
/// let (y1, _) = ops::glr_state(cut3(&x, 5..12).view(), GlrCoeffs::B { alpha: a1.view(), beta: b1.view() }, &p, Some(&s), &opts)?;
/// assert!(y1.iter().zip(cut3(&y, 5..12).iter()).all(|(a, b)| (a - b).abs() < 1e-12));
/// assert_eq!(s.position, vec![5]);
/// # Ok::<(), mixers::prelude::Error>(())
/// ```
pub fn glr_state<F: Scalar>(
    x: ArrayView3<'_, F>,
    coeffs: GlrCoeffs<'_, F>,
    pattern: &GlrPattern,
    initial_state: Option<&RowState<F>>,
    opts: &Options,
) -> Result<(Array3<F>, RowState<F>)> {
    let (on, mut inputs) = coeffs.split();
    let m = mixer(pattern, on, opts)?;
    let stream = glr_stream(on)?;
    let init = initial_state.map(|s| s.to_tensors(stream)).transpose()?;
    inputs.push(("x", x.into_dyn()));
    let (y, fin) = forward_states(m.as_ref(), opts, inputs, init)?;
    Ok((y, RowState::from_tensors(fin, stream)?))
}
