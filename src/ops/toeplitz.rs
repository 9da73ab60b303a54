//! The Toeplitz mixer (MATH §3), typed. The number of heads `H` and the kernel width `Kw`
//! are read from the kernel's shape `w [Kw, H, Tw]`.

use mixer_core::{Mixer, Result};
use ndarray::{Array2, Array3, ArrayView2, ArrayView3, Axis};

use super::dispatch::{Named, Stepper, build, forward, forward_states};
use super::options::Options;
use super::scalar::Scalar;
use super::states::RowState;

/// The mixer for the kernel `w [Kw, H, Tw]` and its static inputs as the dynamic path names
/// them (`w` is `[H, Tw]` when `Kw = 1`).
pub(crate) fn mixer_and_statics<'a, F>(
    w: ArrayView3<'a, F>,
    bias: Option<ArrayView2<'a, F>>,
    opts: &Options,
) -> Result<(Box<dyn Mixer>, Vec<Named<'a, F>>)> {
    opts.only("toeplitz", &[])?;
    let (kw, heads, _) = w.dim();
    let m = build("toeplitz", &serde_json::json!({ "heads": heads, "kernel_width": kw }))?;
    let w = if kw == 1 { w.index_axis_move(Axis(0), 0).into_dyn() } else { w.into_dyn() };
    let mut statics = vec![("w", w)];
    if let Some(b) = bias {
        statics.push(("bias", b.into_dyn()));
    }
    Ok((m, statics))
}

/// Toeplitz mixer: `y_{t,e} = Σ_{i < K_w} Σ_{s ≤ t} w_{i,h(e),t−s} x_{s, e−(K_w−1−i)} + bias_{h(e),t}`,
/// a per-head causal convolution along the sequence (channel `e` belongs to head
/// `h(e) = ⌊e H / C⌋`; shifted channels outside the head contribute 0).
///
/// Shapes: `x [B, T, C]` (`C` divisible by `H`), `w [Kw, H, Tw]` and optional
/// `bias [H, Tw]` with `Tw ≥ T` (taps beyond `T` are ignored) → `y [B, T, C]`. No
/// per-family options. Forms: materialized, parallel, fast (real FFT), recurrent (online FFT).
///
/// ```
/// use mixers::ndarray::{Array3, Axis};
/// use mixers::ops::{self, Options};
/// // One head, taps (1, 1, 1, …): a running sum.
/// let x = Array3::<f64>::from_shape_fn((1, 4, 2), |(_, t, _)| t as f64);
/// let w = Array3::<f64>::ones((1, 1, 4));
/// let y = ops::toeplitz(x.view(), w.view(), None, &Options::default())?;
/// let want = [0.0, 1.0, 3.0, 6.0];
/// assert!(y.index_axis(Axis(2), 1).iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12));
/// # Ok::<(), mixers::prelude::Error>(())
/// ```
pub fn toeplitz<F: Scalar>(
    x: ArrayView3<'_, F>,
    w: ArrayView3<'_, F>,
    bias: Option<ArrayView2<'_, F>>,
    opts: &Options,
) -> Result<Array3<F>> {
    let (m, mut inputs) = mixer_and_statics(w, bias, opts)?;
    inputs.push(("x", x.into_dyn()));
    forward(m.as_ref(), opts, inputs)
}

/// Token-by-token [`toeplitz`] with the online (relaxed) FFT convolution: token `t` after
/// O(log² t) amortised work.
///
/// [`step`](Self::step) takes `x_t [B, C]` and returns `y_t [B, C]`.
///
/// ```
/// use mixers::ndarray::{Array2, Array3};
/// use mixers::ops::{Options, ToeplitzDecoder};
/// let w = Array3::<f64>::ones((1, 1, 8));
/// let mut dec = ToeplitzDecoder::new(w.view(), None, 8, &Options::default())?;
/// let mut last = Array2::zeros((1, 1));
/// for _ in 0..8 {
///     last = dec.step(Array2::ones((1, 1)).view())?;
/// }
/// assert!((last[[0, 0]] - 8.0).abs() < 1e-9);
/// # Ok::<(), mixers::prelude::Error>(())
/// ```
pub struct ToeplitzDecoder<F: Scalar>(Stepper<F>);

impl<F: Scalar> ToeplitzDecoder<F> {
    /// A decoder for at most `max_len ≤ Tw` tokens with kernel `w [Kw, H, Tw]` and optional
    /// `bias [H, Tw]`.
    pub fn new(
        w: ArrayView3<'_, F>,
        bias: Option<ArrayView2<'_, F>>,
        max_len: usize,
        opts: &Options,
    ) -> Result<Self> {
        let (m, statics) = mixer_and_statics(w, bias, opts)?;
        Ok(ToeplitzDecoder(Stepper::new(m, opts, statics, max_len)?))
    }
    /// Consumes one token `x_t [B, C]`; returns `y_t [B, C]`.
    pub fn step(&mut self, x: ArrayView2<'_, F>) -> Result<Array2<F>> {
        self.0.step(vec![("x", x.into_dyn())])
    }
    super::decoder_accessors!();
}

impl<F: Scalar> ToeplitzDecoder<F> {
    /// A decoder started from `initial_state` (see [`toeplitz_state`](super::toeplitz_state)) for at most `max_len`
    /// more tokens.
    pub fn from_state(
        w: ArrayView3<'_, F>,
        bias: Option<ArrayView2<'_, F>>,
        max_len: usize,
        initial_state: &super::states::RowState<F>,
        opts: &Options,
    ) -> Result<Self> {
        let mut d = Self::new(w, bias, max_len, opts)?;
        d.0.start_from_states(initial_state.to_tensors(super::states::TOEPLITZ)?);
        Ok(d)
    }
    /// The state after the tokens consumed so far.
    pub fn state(&self) -> Result<super::states::RowState<F>> {
        super::states::RowState::from_tensors(self.0.states()?, super::states::TOEPLITZ)
    }
}

/// [`toeplitz`] from the state `initial_state` (`rows = x [B, Tw, C]`, the
/// inputs consumed, and their count; `None`: position 0), returning `(y, final state)`. A run
/// of `T` tokens from position `a` reads the taps up to lag `a + T − 1`, so it needs
/// `a + T ≤ Tw`. Forms: `parallel`, `fast`, `recurrent`, `materialized`.
pub fn toeplitz_state<F: Scalar>(
    x: ArrayView3<'_, F>,
    w: ArrayView3<'_, F>,
    bias: Option<ArrayView2<'_, F>>,
    initial_state: Option<&RowState<F>>,
    opts: &Options,
) -> Result<(Array3<F>, RowState<F>)> {
    let (m, mut inputs) = mixer_and_statics(w, bias, opts)?;
    inputs.push(("x", x.into_dyn()));
    let init = initial_state.map(|s| s.to_tensors(super::states::TOEPLITZ)).transpose()?;
    let (y, fin) = forward_states(m.as_ref(), opts, inputs, init)?;
    Ok((y, RowState::from_tensors(fin, super::states::TOEPLITZ)?))
}
