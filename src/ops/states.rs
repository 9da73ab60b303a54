//! Runs of attention, the Toeplitz mixer and the GLR from a recurrent state, typed
//! (docs/math.md §7.1): [`attention_state`] with a [`KvCache`], [`toeplitz_state`] and
//! [`glr_state`] with a [`RowState`], and `from_state` / `state` on their decoders.

use mixer_core::state::POSITION;
use mixer_core::{Error, Real, Result, Tensors};
use ndarray::{Array, Array3, Array4, ArrayD, ArrayView2, ArrayView3, ArrayView4, Dimension};

use super::dispatch::forward_states;
use super::options::Options;
use super::scalar::Scalar;
use super::{GlrCoeffs, GlrPattern};

/// A per-row count (a position or a cached length) as a `[B]` tensor of the state's type.
fn counts<F: Real>(n: &[usize]) -> ArrayD<F> {
    mixer_core::state::position_tensor(n)
}

/// Takes the tensor `name` of a state, as rank `D`.
fn take<F: Clone, D: Dimension>(t: &mut Tensors<F>, name: &str) -> Result<Array<F, D>> {
    t.remove(name)
        .ok_or_else(|| Error::Decoder(format!("internal: the state has no tensor `{name}`")))?
        .into_dimensionality()
        .map_err(|e| Error::shape(name, format!("rank {}", D::NDIM.unwrap_or(0)), e.to_string()))
}

/// A per-row count tensor back as integers.
fn take_counts<F: Real>(t: &mut Tensors<F>, name: &str) -> Result<Vec<usize>> {
    Ok(take::<F, ndarray::Ix1>(t, name)?.iter().map(|&p| p.f64() as usize).collect())
}

/// Attention's recurrent state, a KV cache of capacity `N` (docs/math.md §7.1): row `b` holds
/// its `length[b]` most recent keys and values at rows `0 … length[b] − 1`, oldest first, and
/// zeros after. With a window `w` the capacity is `w − 1`; without one it is the caller's (a
/// run without a cache returns one of capacity `T`; pass a cache of zeros with length 0 and a
/// larger capacity to keep prefilling into it).
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache<F> {
    /// `k [B, N, H, Dk]`.
    pub k: Array4<F>,
    /// `v [B, N, H, Dv]`.
    pub v: Array4<F>,
    /// The cached tokens per batch row.
    pub length: Vec<usize>,
}

impl<F: Scalar> KvCache<F> {
    /// An empty cache of capacity `n` for `B` rows and `H` heads.
    pub fn empty(b: usize, n: usize, h: usize, dk: usize, dv: usize) -> Self {
        KvCache { k: Array4::zeros((b, n, h, dk)), v: Array4::zeros((b, n, h, dv)), length: vec![0; b] }
    }

    pub(crate) fn to_tensors(&self) -> Tensors<F> {
        [
            ("k".to_string(), self.k.clone().into_dyn()),
            ("length".to_string(), counts(&self.length)),
            ("v".to_string(), self.v.clone().into_dyn()),
        ]
        .into_iter()
        .collect()
    }

    pub(crate) fn from_tensors(mut t: Tensors<F>) -> Result<Self> {
        Ok(KvCache { k: take(&mut t, "k")?, v: take(&mut t, "v")?, length: take_counts(&mut t, "length")? })
    }
}

/// The state of a mixer whose state is rows of past values at a position (docs/math.md
/// §7.1): the Toeplitz mixer's inputs `x [B, Tw, C]` (row `s` the input at position `s`), the
/// GLR's kept outputs or inputs `[B, R, C]` (the window of the last `f(K − 1)` positions, or on
/// the lattice one row per slot), and the position per batch row.
#[derive(Clone, Debug, PartialEq)]
pub struct RowState<F> {
    /// The rows `[B, R, C]`.
    pub rows: Array3<F>,
    /// Per batch row, the tokens consumed before the state.
    pub position: Vec<usize>,
}

impl<F: Scalar> RowState<F> {
    pub(crate) fn to_tensors(&self, name: &str) -> Tensors<F> {
        [(name.to_string(), self.rows.clone().into_dyn()), (POSITION.to_string(), counts(&self.position))]
            .into_iter()
            .collect()
    }

    pub(crate) fn from_tensors(mut t: Tensors<F>, name: &str) -> Result<Self> {
        Ok(RowState { rows: take(&mut t, name)?, position: take_counts(&mut t, POSITION)? })
    }
}

/// [`attention`](super::attention) from the KV cache `initial_state` (`None`: an empty one),
/// returning `(y, final cache)`: prefill that continues a cache, then more prefill or decoding
/// ([`AttentionDecoder::from_state`]). With [`Options::cu_seqlens`], one cache row per
/// sequence in and out. Forms: `parallel`, `fast`, `recurrent`, `materialized`.
///
/// ```
/// use mixers::ndarray::{Array4, Axis, Slice};
/// use mixers::ops::{self, KvCache, Options};
/// let q = Array4::<f64>::from_shape_fn((1, 9, 2, 3), |(_, t, h, d)| ((t + h + d) as f64).sin());
/// let v = Array4::<f64>::from_shape_fn((1, 9, 2, 4), |(_, t, h, d)| ((t * h + d) as f64).cos());
/// let opts = Options::default();
/// let y = ops::attention(q.view(), q.view(), v.view(), &opts)?;
/// // Prefill 6 tokens into a cache of capacity 9, then the last 3 from it.
/// let cut = |a: &Array4<f64>, r| a.slice_axis(Axis(1), Slice::from(r)).to_owned();
/// let cache = KvCache::empty(1, 9, 2, 3, 4);
/// let (_, c6) = ops::attention_state(cut(&q, 0..6).view(), cut(&q, 0..6).view(), cut(&v, 0..6).view(), Some(&cache), &opts)?;
/// let (y3, c9) = ops::attention_state(cut(&q, 6..9).view(), cut(&q, 6..9).view(), cut(&v, 6..9).view(), Some(&c6), &opts)?;
/// assert!(y3.iter().zip(cut(&y, 6..9).iter()).all(|(a, b)| (a - b).abs() < 1e-12));
/// assert_eq!(c9.length, vec![9]);
/// # Ok::<(), mixers::prelude::Error>(())
/// ```
pub fn attention_state<F: Scalar>(
    q: ArrayView4<'_, F>,
    k: ArrayView4<'_, F>,
    v: ArrayView4<'_, F>,
    initial_state: Option<&KvCache<F>>,
    opts: &Options,
) -> Result<(Array4<F>, KvCache<F>)> {
    let m = super::attention::mixer(opts)?;
    let inputs = vec![("q", q.into_dyn()), ("k", k.into_dyn()), ("v", v.into_dyn())];
    let (y, fin) = forward_states(m.as_ref(), opts, inputs, initial_state.map(KvCache::to_tensors))?;
    Ok((y, KvCache::from_tensors(fin)?))
}

/// [`toeplitz`](super::toeplitz) from the state `initial_state` (`rows = x [B, Tw, C]`, the
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
    let (m, mut inputs) = super::toeplitz::mixer_and_statics(w, bias, opts)?;
    inputs.push(("x", x.into_dyn()));
    let init = initial_state.map(|s| s.to_tensors("x"));
    let (y, fin) = forward_states(m.as_ref(), opts, inputs, init)?;
    Ok((y, RowState::from_tensors(fin, "x")?))
}

/// [`glr`](super::glr) from the state `initial_state` (`None`: position 0), returning
/// `(y, final state)`. The state's rows are the past outputs (`on = b`, [`GlrCoeffs::B`]) or
/// inputs (`on = a`, [`GlrCoeffs::A`]) later tokens read; `on = both` has no state yet. A run
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
    let m = super::glr::mixer(pattern, on, opts)?;
    let name = glr_stream(on)?;
    inputs.push(("x", x.into_dyn()));
    let (y, fin) = forward_states(m.as_ref(), opts, inputs, initial_state.map(|s| s.to_tensors(name)))?;
    Ok((y, RowState::from_tensors(fin, name)?))
}

/// The GLR state's tensor name for `on`.
pub(crate) fn glr_stream(on: &str) -> Result<&'static str> {
    match on {
        "b" => Ok("y"),
        "a" => Ok("x"),
        _ => Err(mixer_core::state::no_state(
            "glr",
            "a GLR with its pattern on both A and B (`on = \"both\"`) has no state yet",
        )),
    }
}
