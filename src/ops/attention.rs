//! Softmax attention (MATH §1.3), typed.

use mixer_core::Result;
use ndarray::{ArrayView3, ArrayView4};

use super::dispatch::{Stepper, build};
use super::options::Options;

/// The registered mixer and JSON config for `opts` (options: `scale`, `window`).
pub(super) fn mixer(opts: &Options) -> Result<Box<dyn mixer_core::Mixer>> {
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
