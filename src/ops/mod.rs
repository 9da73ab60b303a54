//! Typed operations: one function per builtin mixer, taking `ndarray` views and returning an
//! owned array, and one typed decoder per mixer for token-by-token use.
//!
//! | function | inputs | output | decoder |
//! |---|---|---|---|
//! | [`attention`] | `q, k [B,T,H,Dk]`, `v [B,T,H,Dv]` | `[B,T,H,Dv]` | [`AttentionDecoder`] |
//! | [`linear_attention`] | `q, k, v` | `[B,T,H,Dv]` | [`LinearAttentionDecoder`] |
//! | [`mamba2`] | `q, k, v`, `g [B,T,H]` | `[B,T,H,Dv]` | [`Mamba2Decoder`] |
//! | [`gated_deltanet`] | `q, k, v, g`, `beta [B,T,H]` | `[B,T,H,Dv]` | [`GatedDeltaNetDecoder`] |
//! | [`linear_attention_state`], [`mamba2_state`], [`gated_deltanet_state`] | as above, `initial_state [B,H,Dv,Dk]`? | `(y, S_T)` | |
//! | [`loglinear_attention`] | `q, k, v`, `lambda [B,T,H,L]` | `[B,T,H,Dv]` | [`LogLinearAttentionDecoder`] |
//! | [`loglinear_mamba2`] | `q, k, v, g, lambda` | `[B,T,H,Dv]` | [`LogLinearMamba2Decoder`] |
//! | [`loglinear_gated_deltanet`] | `q, k, v, g, beta, lambda` | `[B,T,H,Dv]` | [`LogLinearGatedDeltaNetDecoder`] |
//! | [`loglinear_attention_state`], [`loglinear_mamba2_state`], [`loglinear_gated_deltanet_state`] | as above, `initial_state: Option<&LevelState>` | `(y, LevelState)` | |
//! | [`glr`] | `x [B,T,C]`, [`GlrCoeffs`] | `[B,T,C]` | [`GlrDecoder`] |
//! | [`toeplitz`] | `x [B,T,C]`, `w [Kw,H,Tw]`, `bias [H,Tw]`? | `[B,T,C]` | [`ToeplitzDecoder`] |
//! | [`attention_state`] | as [`attention`], `initial_state: Option<&KvCache>` | `(y, KvCache)` | |
//! | [`toeplitz_state`], [`glr_state`] | as above, `initial_state: Option<&RowState>` | `(y, RowState)` | |
//!
//! Every function is generic over the element type ([`Scalar`]: `f32`, `f64`) and takes an
//! [`Options`]: the form (default fast), the backend (default [`Backend::auto()`](crate::registry::Backend::auto)),
//! the precision, and the per-family settings (chunk, scale, window, level mask, λ scheme;
//! masks, λ schemes and offset patterns by name or by value, plugins' included). Shapes,
//! value constraints (`g ≤ 0`, `beta ∈ [0, 1]`, …) and sizes (`K = K(T)`, `L ≥ L(T)`) are
//! checked on every call, with errors naming the input, what was expected and what was given.
//!
//! The typed layer is a thin front of the dynamic path (registry lookup by name and JSON
//! config, [`registry::run::run`](crate::registry::run::run)), which stays the interface of
//! the command line and of plugin mixers: a typed call computes bit for bit what the dynamic
//! call with the same mixer, config, form and backend computes.
//!
//! ```
//! use mixers::ndarray::{Array3, Array4, Axis};
//! use mixers::ops::{self, Mamba2Decoder, Options};
//!
//! let (b, t, h, dk, dv) = (2, 37, 3, 4, 5);
//! let q = Array4::<f32>::from_shape_fn((b, t, h, dk), |(i, j, k, l)| ((i + 2 * j + 3 * k + l) as f32).sin());
//! let v = Array4::<f32>::from_shape_fn((b, t, h, dv), |(i, j, k, l)| ((i + j + k * l) as f32).cos());
//! let g = Array3::<f32>::from_elem((b, t, h), -0.1);
//! let opts = Options::default().chunk(16);
//! let y = ops::mamba2(q.view(), q.view(), v.view(), g.view(), &opts)?; // fast (chunked) form
//!
//! // Token by token, the decoder gives the same outputs.
//! let mut dec = Mamba2Decoder::new(t, &opts)?;
//! for s in 0..t {
//!     let (qs, vs, gs) = (q.index_axis(Axis(1), s), v.index_axis(Axis(1), s), g.index_axis(Axis(1), s));
//!     let ys = dec.step(qs, qs, vs, gs)?;
//!     assert!(ys.iter().zip(y.index_axis(Axis(1), s)).all(|(a, b)| (a - b).abs() < 1e-4 * (1.0 + b.abs())));
//! }
//! # Ok::<(), mixers::prelude::Error>(())
//! ```
//!
//! # The log-linear family
//!
//! [`linear_attention`], [`mamba2`], [`gated_deltanet`] and the lifts [`loglinear_attention`],
//! [`loglinear_mamba2`], [`loglinear_gated_deltanet`] share their shapes: `q, k [B, T, H, Dk]`,
//! `v [B, T, H, Dv]`, log-decay `g [B, T, H]` (`≤ 0`), delta-rule strength `beta [B, T, H]`
//! (in `[0, 1]`), level weights `lambda [B, T, H, L]` with `L ≥ L(T) = bitlen(T−1) + 1` for the
//! Fenwick mask; output `y [B, T, H, Dv]`. Options: `scale` (σ, default 1), `chunk` (the fast
//! form's chunk, a power of two, default 64), and for the lifts `mask` (default `"fenwick"`)
//! and `lambda` (λ scheme, default `"identity"`: `lambda ≥ 0` used as given). Forms:
//! materialized, parallel, fast (chunked, O(T log T)), recurrent (O(log T) states per head);
//! the fast and recurrent forms need the Fenwick mask.
//!
//! # Copies and device tensors
//!
//! **Copies.** Each input view is copied once into the owned named-tensor map that the
//! backends' kernels take; the output is returned without a copy. (A borrowed input path
//! through the registry would remove that copy; it does not exist yet.)
//!
//! **Device tensors.** These typed functions take and return host arrays. A model whose
//! activations live on the GPU calls the CUDA backend's device-tensor entry points instead
//! (`mixer_cuda::run_device`, `mixer_cuda::decoder_device`, `mixer_cuda::DeviceTensor`), which
//! run the same kernels without host copies or waits; the host path here is a thin wrapper on
//! them and gives the same bits.
//!
//! **States and packed batches.** The `*_state` functions of the log-linear mixers start from a
//! state and return the final one (docs/math.md §7.1): `S [B, H, Dv, Dk]` for the base mixers, a
//! [`LevelState`] (Fenwick level states and the position) for the lifts; their decoders start
//! from one (`from_state`) and export theirs (`state`). [`Options::cu_seqlens`] packs
//! several sequences into one batch row, for every typed function: each sequence restarts,
//! rows past the last offset get zeros.
//!
//! **Precision.** [`Options::precision`] selects `exact` (default), `tf32` or `bf16` per call
//! (f32 inputs for the latter two); see [`Precision`].

mod attention;
mod dispatch;
mod glr;
mod loglinear;
mod options;
mod scalar;
mod states;
mod toeplitz;

pub use attention::{AttentionDecoder, attention, attention_state};
pub use glr::{GlrCoeffs, GlrCoeffsOf, GlrDecoder, GlrPattern, GlrTokenCoeffs, glr, glr_state};
pub use loglinear::{
    GatedDeltaNetDecoder, LevelState, LinearAttentionDecoder, LogLinearAttentionDecoder,
    LogLinearGatedDeltaNetDecoder, LogLinearMamba2Decoder, Mamba2Decoder, gated_deltanet,
    gated_deltanet_state, linear_attention, linear_attention_state, loglinear_attention,
    loglinear_attention_state, loglinear_gated_deltanet, loglinear_gated_deltanet_state, loglinear_mamba2,
    loglinear_mamba2_state, mamba2, mamba2_state,
};
pub use options::{LambdaRef, MaskRef, Options, PatternRef, Precision, Registered, RegistryEntry};
pub use scalar::Scalar;
pub use states::{KvCache, RowState};
pub use toeplitz::{ToeplitzDecoder, toeplitz, toeplitz_state};

/// The configured mixer that the typed function of the builtin mixer `name` runs with `opts`,
/// with the same option checks: `attention` and the log-linear family (`linear-attention`,
/// `mamba2`, `gated-deltanet` and their `loglinear-*` lifts). For crates that front the
/// library with other tensor types (`mixers-candle`): they run exactly the mixer of the typed
/// call, through the registry.
///
/// ```
/// use mixers::ops::{Options, configured};
/// let m = configured("mamba2", &Options::default().chunk(16))?;
/// assert_eq!(m.config()["chunk"], 16);
/// let e = configured("mamba3", &Options::default()).unwrap_err().to_string();
/// assert!(e.starts_with("unknown typed mixer `mamba3`"), "{e}");
/// # Ok::<(), mixers::prelude::Error>(())
/// ```
pub fn configured(name: &str, opts: &Options) -> mixer_core::Result<Box<dyn mixer_core::Mixer>> {
    match name {
        "attention" => attention::mixer(opts),
        "linear-attention" | "mamba2" | "gated-deltanet" => loglinear::mixer(name, false, opts),
        "loglinear-attention" | "loglinear-mamba2" | "loglinear-gated-deltanet" => {
            loglinear::mixer(name, true, opts)
        }
        _ => Err(mixer_core::Error::Unknown {
            kind: "typed mixer",
            name: name.to_string(),
            suggestions: Vec::new(),
            known: "attention, linear-attention, mamba2, gated-deltanet and their loglinear-* lifts".into(),
        }),
    }
}

/// `position`, `cache_elems` and `max_len` of a typed decoder wrapping a `Stepper`.
macro_rules! decoder_accessors {
    () => {
        /// Tokens consumed so far.
        pub fn position(&self) -> usize {
            self.0.position()
        }
        /// Scalars held in the decoder's cache or state now (0 before the first token).
        pub fn cache_elems(&self) -> usize {
            self.0.cache_elems()
        }
        /// The most tokens this decoder takes.
        pub fn max_len(&self) -> usize {
            self.0.max_len()
        }
    };
}
use decoder_accessors;

/// A typed operation over whole sequences: `pub fn $name` taking one view per input (each
/// passed on under its parameter's name, in order) and `opts`, and running `opts.form` of the
/// mixer `$mixer` (built from `opts`) on them; returns `y [B, T, H, Dv]`. Written once for the
/// attention and log-linear functions, which differ only in their inputs and mixer.
macro_rules! typed_op {
    (
        $(#[$doc:meta])*
        pub fn $name:ident($($input:ident: $view:ident),+ $(,)?);
        mixer_for($opts:ident) = $mixer:expr;
    ) => {
        $(#[$doc])*
        pub fn $name<F: $crate::ops::Scalar>(
            $($input: $view<'_, F>,)+
            $opts: &$crate::ops::Options,
        ) -> ::mixer_core::Result<::ndarray::Array4<F>> {
            let m = $mixer?;
            let inputs = vec![$((stringify!($input), $input.into_dyn())),+];
            $crate::ops::dispatch::forward(m.as_ref(), $opts, inputs)
        }
    };
}
use typed_op;

/// A typed decoder of whole-token views, wrapping a `Stepper`: the struct (with `$doc`),
/// `new(max_len, opts)` returning `Self($new?)`, `step` taking one view per token input (each
/// passed on under its parameter's name, in order) and returning `y_t [B, H, Dv]`, and the
/// [`decoder_accessors`]. Written once for the attention and log-linear decoders, whose
/// `step`s differ only in their inputs.
macro_rules! typed_decoder {
    (
        $(#[$doc:meta])*
        pub struct $name:ident;
        $(#[$new_doc:meta])*
        new($max_len:ident, $opts:ident) = $new:expr;
        $(#[$step_doc:meta])*
        step($($input:ident: $view:ident),+ $(,)?);
    ) => {
        $(#[$doc])*
        pub struct $name<F: $crate::ops::Scalar>($crate::ops::dispatch::Stepper<F>);

        impl<F: $crate::ops::Scalar> $name<F> {
            $(#[$new_doc])*
            pub fn new($max_len: usize, $opts: &$crate::ops::Options) -> ::mixer_core::Result<Self> {
                Ok(Self($new?))
            }
            $(#[$step_doc])*
            pub fn step(&mut self, $($input: $view<'_, F>),+) -> ::mixer_core::Result<::ndarray::Array3<F>> {
                self.0.step(vec![$((stringify!($input), $input.into_dyn())),+])
            }
            $crate::ops::decoder_accessors!();
        }
    };
}
use typed_decoder;

/// The README's "Using it as a dependency" block, which is `examples/prenorm_block.rs`
/// verbatim (a test in `tests/ops.rs` keeps them equal), run as a doc-test of this crate.
#[cfg(doctest)]
#[doc = concat!("```rust\n", include_str!("../../examples/prenorm_block.rs"), "```")]
pub struct ReadmeDependencyExample;
