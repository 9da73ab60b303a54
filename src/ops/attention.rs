//! Softmax attention (MATH §1.3), typed.

use mixer_core::Result;
use ndarray::{Array4, ArrayView3, ArrayView4};

use super::dispatch::{Stepper, build, forward_states};
use super::options::Options;
use super::scalar::Scalar;
use super::states::KvCache;

/// The registered mixer and JSON config for `opts` (options: `scale`, `window`).
pub(crate) fn mixer(opts: &Options) -> Result<Box<dyn mixer_core::Mixer>> {
    opts.only("attention", &["scale", "window"])?;
    build("attention", &serde_json::json!({ "window": opts.window, "scale": opts.scale }))
}

super::typed_op! {
    /// Causal softmax attention: `y_t = Σ_{s ≤ t, t−s < w} softmax_s(σ q_t · k_s) v_s`.
    ///
    /// Shapes: `q, k [B, T, H, Dk]`, `v [B, T, H, Dv]` → `y [B, T, H, Dv]`. Options: `scale`
    /// (σ, default `1/√(D_k)`), `window` (`w`, default unbounded). Forms: materialized,
    /// parallel, fast (streaming online softmax), recurrent (KV cache).
    ///
    /// ```
    /// use mixers::ndarray::Array4;
    /// use mixers::ops::{self, Options};
    /// let q = Array4::<f32>::from_shape_fn((1, 5, 2, 3), |(_, t, h, d)| (t + h + d) as f32 * 0.1);
    /// let v = Array4::<f32>::ones((1, 5, 2, 4));
    /// let y = ops::attention(q.view(), q.view(), v.view(), &Options::default().window(3))?;
    /// assert_eq!(y.dim(), (1, 5, 2, 4));
    /// assert!(y.iter().all(|&x| (x - 1.0).abs() < 1e-6)); // softmax weights sum to one
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub fn attention(q: ArrayView4, k: ArrayView4, v: ArrayView4);
    mixer_for(opts) = mixer(opts);
}

super::typed_decoder! {
    /// Token-by-token [`attention`] with a KV cache of `min(w, T)` tokens.
    ///
    /// Each [`step`](AttentionDecoder::step) takes `q_t, k_t [B, H, Dk]`, `v_t [B, H, Dv]` and
    /// returns `y_t [B, H, Dv]`, equal to row `t` of [`attention`] on the whole sequence.
    ///
    /// ```
    /// use mixers::ndarray::Array3;
    /// use mixers::ops::{AttentionDecoder, Options};
    /// let mut dec = AttentionDecoder::<f64>::new(4, &Options::default())?;
    /// let qk = Array3::<f64>::zeros((1, 2, 3));
    /// let y0 = dec.step(qk.view(), qk.view(), Array3::from_elem((1, 2, 5), 2.0).view())?;
    /// assert_eq!(y0, Array3::from_elem((1, 2, 5), 2.0));
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub struct AttentionDecoder;
    /// A decoder for at most `max_len` tokens (options as for [`attention`]; the form is
    /// ignored).
    new(max_len, opts) = Stepper::new(mixer(opts)?, opts, Vec::new(), max_len);
    /// Consumes token `t`: `q_t, k_t [B, H, Dk]`, `v_t [B, H, Dv]`; returns `y_t [B, H, Dv]`.
    step(q: ArrayView3, k: ArrayView3, v: ArrayView3);
}

impl<F: Scalar> AttentionDecoder<F> {
    /// A decoder for at most `max_len` more tokens after the cache `initial_state` (e.g. the
    /// final cache of an [`attention_state`](super::attention_state) prefill); `max_len` plus the cached length must fit
    /// the cache's capacity without a window.
    pub fn from_state(max_len: usize, initial_state: &KvCache<F>, opts: &Options) -> Result<Self> {
        let mut d = Self::new(max_len, opts)?;
        d.0.start_from_states(initial_state.to_tensors());
        Ok(d)
    }
    /// The KV cache after the tokens consumed so far.
    pub fn state(&self) -> Result<KvCache<F>> {
        KvCache::from_tensors(self.0.states()?)
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
    let m = mixer(opts)?;
    let inputs = vec![("q", q.into_dyn()), ("k", k.into_dyn()), ("v", v.into_dyn())];
    let (y, fin) = forward_states(m.as_ref(), opts, inputs, initial_state.map(KvCache::to_tensors))?;
    Ok((y, KvCache::from_tensors(fin)?))
}
