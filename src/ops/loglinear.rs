//! The log-linear attention family (MATH §2), typed: linear attention, Mamba-2, gated
//! DeltaNet and their `loglinear_*` lifts. Shared shapes, options and forms are documented
//! on the `ops` module ("The log-linear family").

use mixer_core::mixers::loglinear::lift_state::POSITION;
use mixer_core::mixers::loglinear::state::STATE;
use mixer_core::{Error, Mixer, Result, Tensors};
use ndarray::{Array4, Array5, ArrayD, ArrayView2, ArrayView3, ArrayView4, IxDyn};

use super::dispatch::{Named, Stepper, build, forward_state, forward_states};
use super::options::Options;
use super::scalar::Scalar;

/// The registered member `name` configured from `opts`.
pub(super) fn mixer(name: &str, lifted: bool, opts: &Options) -> Result<Box<dyn Mixer>> {
    let allowed: &[&str] = if lifted { &["chunk", "scale", "mask", "lambda"] } else { &["chunk", "scale"] };
    opts.only(name, allowed)?;
    let mut cfg = serde_json::json!({});
    if let Some(c) = opts.chunk {
        cfg["chunk"] = c.into();
    }
    if let Some(s) = opts.scale {
        cfg["scale"] = s.into();
    }
    if let Some(m) = &opts.mask {
        cfg["mask"] = m.resolve(name)?.into();
    }
    if let Some(l) = &opts.lambda {
        cfg["lambda_scheme"] = l.resolve(name)?.into();
    }
    build(name, &cfg)
}

/// The whole-sequence functions of the family's members, written by [`super::typed_op`]: each
/// entry `pub fn $name(…) = ($member, $lifted);` runs the member `$member` (a Fenwick lift when
/// `$lifted`) configured by [`mixer`] on the inputs listed.
macro_rules! family_ops {
    ($(
        $(#[$doc:meta])*
        pub fn $name:ident($($input:ident: $view:ident),+ $(,)?) = ($member:literal, $lifted:literal);
    )+) => {$(
        super::typed_op! {
            $(#[$doc])*
            pub fn $name($($input: $view),+);
            mixer_for(opts) = mixer($member, $lifted, opts);
        }
    )+};
}

family_ops! {
    /// Linear attention: `y_t = σ Σ_{s ≤ t} (q_t · k_s) v_s`.
    ///
    /// Shapes: `q, k [B, T, H, Dk]`, `v [B, T, H, Dv]` → `y [B, T, H, Dv]`. Options and forms:
    /// [the log-linear family](crate::ops#the-log-linear-family).
    ///
    /// ```
    /// use mixers::ndarray::Array4;
    /// use mixers::ops::{self, Options};
    /// let q = Array4::<f64>::ones((1, 3, 1, 2));
    /// let v = Array4::<f64>::ones((1, 3, 1, 1));
    /// let y = ops::linear_attention(q.view(), q.view(), v.view(), &Options::default())?;
    /// assert_eq!(y.as_slice().unwrap(), &[2.0, 4.0, 6.0]); // Σ_{s≤t} (q·k) = 2(t+1)
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub fn linear_attention(q: ArrayView4, k: ArrayView4, v: ArrayView4) = ("linear-attention", false);

    /// Mamba-2 (SSD form): `y_t = σ Σ_{s ≤ t} (q_t · k_s) e^(G_t − G_s) v_s` with
    /// `G_t = Σ_{r ≤ t} g_r`.
    ///
    /// Shapes: `q, k [B, T, H, Dk]`, `v [B, T, H, Dv]`, `g [B, T, H]` (`≤ 0`) → `y [B, T, H, Dv]`.
    /// In Mamba-2's terms q = C, k = B, v = Δ·x, g = Δ·A; the D·x skip is outside the mixer.
    /// Options and forms: [the log-linear family](crate::ops#the-log-linear-family).
    ///
    /// ```
    /// use mixers::ndarray::{Array3, Array4};
    /// use mixers::ops::{self, Options};
    /// let q = Array4::<f64>::ones((1, 2, 1, 1));
    /// let g = Array3::from_elem((1, 2, 1), -2f64.ln()); // each step halves the state
    /// let y = ops::mamba2(q.view(), q.view(), q.view(), g.view(), &Options::default())?;
    /// assert!((y[[0, 1, 0, 0]] - 1.5).abs() < 1e-12); // 1 + ½
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub fn mamba2(q: ArrayView4, k: ArrayView4, v: ArrayView4, g: ArrayView3) = ("mamba2", false);

    /// Gated DeltaNet: `S_t = e^(g_t) S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ`,
    /// `y_t = σ S_t q_t`.
    ///
    /// Shapes: `q, k [B, T, H, Dk]`, `v [B, T, H, Dv]`, `g, beta [B, T, H]` (`g ≤ 0`,
    /// `beta ∈ [0, 1]`) → `y [B, T, H, Dv]`. Keys are usually L2-normalised.
    /// Options and forms: [the log-linear family](crate::ops#the-log-linear-family).
    ///
    /// ```
    /// use mixers::ndarray::{Array3, Array4};
    /// use mixers::ops::{self, Options};
    /// let k = Array4::<f32>::ones((1, 4, 1, 1));
    /// let v = Array4::from_shape_fn((1, 4, 1, 1), |(_, t, _, _)| t as f32);
    /// let (g, beta) = (Array3::zeros((1, 4, 1)), Array3::ones((1, 4, 1)));
    /// // β = 1 with a unit key overwrites the memory: y_t = v_t.
    /// let y = ops::gated_deltanet(k.view(), k.view(), v.view(), g.view(), beta.view(), &Options::default())?;
    /// assert!(y.iter().zip(v.iter()).all(|(a, b)| (a - b).abs() < 1e-6));
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub fn gated_deltanet(q: ArrayView4, k: ArrayView4, v: ArrayView4, g: ArrayView3, beta: ArrayView3) = ("gated-deltanet", false);

    /// Log-linear attention: `y_t = σ Σ_{s ≤ t} λ_t^(ℓ(t,s)) (q_t · k_s) v_s`,
    /// with `ℓ` the level mask (Fenwick: `ℓ(t,s) = bitlen(t ⊕ s)`).
    ///
    /// Shapes: as [`linear_attention`] plus `lambda [B, T, H, L]`, `L ≥ L(T)`. With the
    /// default `identity` λ scheme, `lambda ≥ 0` is used as given; `Options::lambda` picks
    /// another scheme (`softplus`, `ones`, a plugin's).
    /// Options and forms: [the log-linear family](crate::ops#the-log-linear-family).
    ///
    /// ```
    /// use mixers::ndarray::Array4;
    /// use mixers::ops::{self, Options};
    /// let (q, v) = (Array4::<f64>::ones((1, 3, 1, 2)), Array4::<f64>::ones((1, 3, 1, 1)));
    /// let lam = Array4::<f64>::ones((1, 3, 1, 3)); // λ ≡ 1 gives linear attention
    /// let y = ops::loglinear_attention(q.view(), q.view(), v.view(), lam.view(), &Options::default())?;
    /// assert_eq!(y, ops::linear_attention(q.view(), q.view(), v.view(), &Options::default())?);
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub fn loglinear_attention(q: ArrayView4, k: ArrayView4, v: ArrayView4, lambda: ArrayView4) = ("loglinear-attention", true);

    /// Log-linear Mamba-2: `y_t = σ Σ_{s ≤ t} λ_t^(ℓ(t,s)) (q_t · k_s) e^(G_t − G_s) v_s`.
    ///
    /// Shapes: as [`mamba2`] plus `lambda [B, T, H, L]`, `L ≥ L(T)`.
    /// Options and forms: [the log-linear family](crate::ops#the-log-linear-family).
    ///
    /// ```
    /// use mixers::ndarray::{Array3, Array4};
    /// use mixers::ops::{self, Options};
    /// let q = Array4::<f64>::ones((1, 2, 1, 1));
    /// let g = Array3::<f64>::zeros((1, 2, 1));
    /// let mut lam = Array4::<f64>::ones((1, 2, 1, 2));
    /// lam[[0, 1, 0, 1]] = 0.0; // token 1 ignores level 1, which holds token 0
    /// let y = ops::loglinear_mamba2(q.view(), q.view(), q.view(), g.view(), lam.view(), &Options::default())?;
    /// assert_eq!(y.as_slice().unwrap(), &[1.0, 1.0]);
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub fn loglinear_mamba2(q: ArrayView4, k: ArrayView4, v: ArrayView4, g: ArrayView3, lambda: ArrayView4) = ("loglinear-mamba2", true);

    /// Log-linear gated DeltaNet: the gated delta rule acting on every level's state, inputs
    /// bucketed by level: `y_t = σ Σ_{s ≤ t} λ_t^(ℓ(t,s)) β_s (k_sᵀ Φ_{s+1..t} q_t) v_s`.
    ///
    /// Shapes: as [`gated_deltanet`] plus `lambda [B, T, H, L]`, `L ≥ L(T)`.
    /// Options and forms: [the log-linear family](crate::ops#the-log-linear-family).
    ///
    /// ```
    /// use mixers::ndarray::{Array3, Array4};
    /// use mixers::ops::{self, Options};
    /// let k = Array4::<f64>::ones((1, 5, 1, 1));
    /// let (g, beta) = (Array3::zeros((1, 5, 1)), Array3::from_elem((1, 5, 1), 0.5));
    /// let lam = Array4::<f64>::ones((1, 5, 1, 4));
    /// let opts = Options::default();
    /// let y = ops::loglinear_gated_deltanet(k.view(), k.view(), k.view(), g.view(), beta.view(), lam.view(), &opts)?;
    /// let base = ops::gated_deltanet(k.view(), k.view(), k.view(), g.view(), beta.view(), &opts)?;
    /// assert!(y.iter().zip(base.iter()).all(|(a, b)| (a - b).abs() < 1e-12)); // λ ≡ 1
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub fn loglinear_gated_deltanet(q: ArrayView4, k: ArrayView4, v: ArrayView4, g: ArrayView3, beta: ArrayView3, lambda: ArrayView4) = ("loglinear-gated-deltanet", true);
}

/// A decoder of a member of the family, for at most `max_len` tokens.
fn stepper<F: Scalar>(name: &str, lifted: bool, max_len: usize, opts: &Options) -> Result<Stepper<F>> {
    Stepper::new(mixer(name, lifted, opts)?, opts, Vec::new(), max_len)
}

/// The decoders of the family's members, written by [`super::typed_decoder`]: each entry
/// `pub struct $name for $op = ($member, $lifted); step(…);` is the decoder of the member
/// `$member` (a Fenwick lift when `$lifted`) built by [`stepper`], with the options of `$op`,
/// and whose `step` takes the token inputs listed.
macro_rules! family_decoders {
    ($(
        $(#[$doc:meta])*
        pub struct $name:ident for $op:ident = ($member:literal, $lifted:literal);
        step($($input:ident: $view:ident),+ $(,)?);
    )+) => {$(
        super::typed_decoder! {
            $(#[$doc])*
            pub struct $name;
            #[doc = concat!("A decoder for at most `max_len` tokens (options as for [`", stringify!($op), "`]).")]
            new(max_len, opts) = stepper($member, $lifted, max_len, opts);
            /// Consumes one token; returns `y_t [B, H, Dv]`.
            step($($input: $view),+);
        }
    )+};
}

family_decoders! {
    /// Token-by-token [`linear_attention`]: one `Dk × Dv` state per head.
    ///
    /// [`step`](Self::step) takes `q_t, k_t [B, H, Dk]`, `v_t [B, H, Dv]` and returns
    /// `y_t [B, H, Dv]`.
    ///
    /// ```
    /// use mixers::ndarray::Array3;
    /// use mixers::ops::{LinearAttentionDecoder, Options};
    /// let mut dec = LinearAttentionDecoder::<f64>::new(2, &Options::default())?;
    /// let x = Array3::<f64>::ones((1, 1, 1));
    /// dec.step(x.view(), x.view(), x.view())?;
    /// assert_eq!(dec.step(x.view(), x.view(), x.view())?[[0, 0, 0]], 2.0);
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub struct LinearAttentionDecoder for linear_attention = ("linear-attention", false);
    step(q: ArrayView3, k: ArrayView3, v: ArrayView3);

    /// Token-by-token [`mamba2`]: one decayed `Dk × Dv` state per head.
    ///
    /// [`step`](Self::step) takes `q_t, k_t [B, H, Dk]`, `v_t [B, H, Dv]`, `g_t [B, H]` and
    /// returns `y_t [B, H, Dv]`.
    ///
    /// ```
    /// use mixers::ndarray::{Array2, Array3};
    /// use mixers::ops::{Mamba2Decoder, Options};
    /// let mut dec = Mamba2Decoder::<f64>::new(2, &Options::default())?;
    /// let (x, g) = (Array3::<f64>::ones((1, 1, 1)), Array2::from_elem((1, 1), -2f64.ln()));
    /// dec.step(x.view(), x.view(), x.view(), g.view())?;
    /// assert!((dec.step(x.view(), x.view(), x.view(), g.view())?[[0, 0, 0]] - 1.5).abs() < 1e-12);
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub struct Mamba2Decoder for mamba2 = ("mamba2", false);
    step(q: ArrayView3, k: ArrayView3, v: ArrayView3, g: ArrayView2);

    /// Token-by-token [`gated_deltanet`]: one `Dk × Dv` state per head.
    ///
    /// [`step`](Self::step) takes `q_t, k_t [B, H, Dk]`, `v_t [B, H, Dv]`, `g_t, beta_t [B, H]`
    /// and returns `y_t [B, H, Dv]`.
    ///
    /// ```
    /// use mixers::ndarray::{Array2, Array3};
    /// use mixers::ops::{GatedDeltaNetDecoder, Options};
    /// let mut dec = GatedDeltaNetDecoder::<f32>::new(8, &Options::default())?;
    /// let (k, g, beta) = (Array3::<f32>::ones((1, 1, 1)), Array2::zeros((1, 1)), Array2::ones((1, 1)));
    /// let v = Array3::from_elem((1, 1, 3), 7.0);
    /// assert_eq!(dec.step(k.view(), k.view(), v.view(), g.view(), beta.view())?, v); // β = 1: y = v
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub struct GatedDeltaNetDecoder for gated_deltanet = ("gated-deltanet", false);
    step(q: ArrayView3, k: ArrayView3, v: ArrayView3, g: ArrayView2, beta: ArrayView2);

    /// Token-by-token [`loglinear_attention`]: O(log T) level states per head.
    ///
    /// [`step`](Self::step) takes `q_t, k_t [B, H, Dk]`, `v_t [B, H, Dv]`, `lambda_t [B, H, L]`
    /// (`L ≥ L(max_len)`) and returns `y_t [B, H, Dv]`.
    ///
    /// ```
    /// use mixers::ndarray::Array3;
    /// use mixers::ops::{LogLinearAttentionDecoder, Options};
    /// let mut dec = LogLinearAttentionDecoder::<f64>::new(100, &Options::default())?;
    /// let (x, lam) = (Array3::<f64>::ones((1, 1, 1)), Array3::<f64>::ones((1, 1, 8)));
    /// for _ in 0..100 {
    ///     dec.step(x.view(), x.view(), x.view(), lam.view())?;
    /// }
    /// assert!(dec.cache_elems() <= 8); // one 1×1 state per non-empty level
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub struct LogLinearAttentionDecoder for loglinear_attention = ("loglinear-attention", true);
    step(q: ArrayView3, k: ArrayView3, v: ArrayView3, lambda: ArrayView3);

    /// Token-by-token [`loglinear_mamba2`]: O(log T) level states per head.
    ///
    /// [`step`](Self::step) takes `q_t, k_t [B, H, Dk]`, `v_t [B, H, Dv]`, `g_t [B, H]`,
    /// `lambda_t [B, H, L]` and returns `y_t [B, H, Dv]`.
    ///
    /// ```
    /// use mixers::ndarray::{Array2, Array3};
    /// use mixers::ops::{LogLinearMamba2Decoder, Options};
    /// let mut dec = LogLinearMamba2Decoder::<f64>::new(2, &Options::default())?;
    /// let (x, g, lam) = (Array3::<f64>::ones((1, 1, 1)), Array2::zeros((1, 1)), Array3::ones((1, 1, 2)));
    /// dec.step(x.view(), x.view(), x.view(), g.view(), lam.view())?;
    /// assert_eq!(dec.step(x.view(), x.view(), x.view(), g.view(), lam.view())?[[0, 0, 0]], 2.0);
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub struct LogLinearMamba2Decoder for loglinear_mamba2 = ("loglinear-mamba2", true);
    step(q: ArrayView3, k: ArrayView3, v: ArrayView3, g: ArrayView2, lambda: ArrayView3);

    /// Token-by-token [`loglinear_gated_deltanet`]: O(log T) level states per head.
    ///
    /// [`step`](Self::step) takes `q_t, k_t [B, H, Dk]`, `v_t [B, H, Dv]`, `g_t, beta_t [B, H]`,
    /// `lambda_t [B, H, L]` and returns `y_t [B, H, Dv]`.
    ///
    /// ```
    /// use mixers::ndarray::{Array2, Array3};
    /// use mixers::ops::{LogLinearGatedDeltaNetDecoder, Options};
    /// let mut dec = LogLinearGatedDeltaNetDecoder::<f64>::new(3, &Options::default())?;
    /// let (k, g, beta) = (Array3::<f64>::ones((1, 1, 1)), Array2::zeros((1, 1)), Array2::ones((1, 1)));
    /// let lam = Array3::<f64>::ones((1, 1, 3));
    /// let y = dec.step(k.view(), k.view(), k.view(), g.view(), beta.view(), lam.view())?;
    /// assert_eq!(y[[0, 0, 0]], 1.0);
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub struct LogLinearGatedDeltaNetDecoder for loglinear_gated_deltanet = ("loglinear-gated-deltanet", true);
    step(q: ArrayView3, k: ArrayView3, v: ArrayView3, g: ArrayView2, beta: ArrayView2, lambda: ArrayView3);
}

/// The run of a member from a state: `(y, final state)`. `= $member;` is a base member, whose
/// state is `S [B, H, Dv, Dk]` ([`base_run`], see [`linear_attention_state`]); `= $member,
/// lifted;` a Fenwick lift, whose state is a [`LevelState`] ([`lift_run`], see
/// [`loglinear_attention_state`]).
macro_rules! state_op {
    ($(#[$doc:meta])* pub fn $name:ident($($input:ident: $view:ident),+ $(,)?) = $member:literal;) => {
        state_op!(@fn $(#[$doc])* $name($($input: $view),+) = $member, false:
            ArrayView4<'_, F> => Array4<F>; base_run);
    };
    ($(#[$doc:meta])* pub fn $name:ident($($input:ident: $view:ident),+ $(,)?) = $member:literal, lifted;) => {
        state_op!(@fn $(#[$doc])* $name($($input: $view),+) = $member, true:
            &LevelState<F> => LevelState<F>; lift_run);
    };
    (@fn $(#[$doc:meta])* $name:ident($($input:ident: $view:ident),+) = $member:literal, $lifted:literal:
        $init:ty => $fin:ty; $run:ident) => {
        $(#[$doc])*
        pub fn $name<F: Scalar>(
            $($input: $view<'_, F>,)+
            initial_state: Option<$init>,
            opts: &Options,
        ) -> Result<(Array4<F>, $fin)> {
            let m = mixer($member, $lifted, opts)?;
            $run(m.as_ref(), opts, vec![$((stringify!($input), $input.into_dyn())),+], initial_state)
        }
    };
}

/// A base member's run from the state `S [B, H, Dv, Dk]` (`None`: zeros): `(y, S_T)`.
fn base_run<F: Scalar>(
    m: &dyn Mixer,
    opts: &Options,
    inputs: Vec<Named<'_, F>>,
    initial: Option<ArrayView4<'_, F>>,
) -> Result<(Array4<F>, Array4<F>)> {
    forward_state(m, opts, inputs, STATE, initial.map(|s| s.into_dyn()))
}

/// A lift's run from its level state (`None`: zeros at position 0): `(y, final level state)`.
fn lift_run<F: Scalar>(
    m: &dyn Mixer,
    opts: &Options,
    inputs: Vec<Named<'_, F>>,
    initial: Option<&LevelState<F>>,
) -> Result<(Array4<F>, LevelState<F>)> {
    if let Some(ll) = m.as_any().downcast_ref::<mixer_core::mixers::loglinear::LogLinear>()
        && mixer_core::mixers::loglinear::state::cache(ll).is_some()
    {
        return Err(Error::Io(format!(
            "`{}` under the mask `{}` keeps a cache of its past tokens as its state, not Fenwick level \
             states (docs/math.md §7.1): run it from a state through `mixers::registry::call::forward` \
             (named tensors), not this typed function",
            m.name(),
            ll.lift.map_or("fenwick", |l| l.mask.name)
        )));
    }
    let init = initial.map(LevelState::to_tensors).transpose()?;
    let (y, fin) = forward_states(m, opts, inputs, init)?;
    Ok((y, LevelState::from_tensors(fin)?))
}

state_op! {
    /// [`linear_attention`] from the state `initial_state` (`S [B, H, Dv, Dk]`, the
    /// recurrence's `S_t`; `None`: zeros), returning `(y, S_T)` (docs/math.md §7): prefill
    /// followed by more prefill or by decoding ([`LinearAttentionDecoder`] is the
    /// token-by-token interface), truncated backpropagation through time. With
    /// [`Options::cu_seqlens`], one state row per sequence in and out. Forms: `fast`,
    /// `recurrent` and `materialized`.
    ///
    /// ```
    /// use mixers::ndarray::{Array4, Axis, Slice};
    /// use mixers::ops::{self, Options};
    /// let q = Array4::<f64>::from_shape_fn((1, 10, 2, 3), |(_, t, h, d)| ((t + h + d) as f64).sin());
    /// let v = Array4::<f64>::from_shape_fn((1, 10, 2, 4), |(_, t, h, d)| ((t * h + d) as f64).cos());
    /// let opts = Options::default().chunk(4);
    /// let (y, s) = ops::linear_attention_state(q.view(), q.view(), v.view(), None, &opts)?;
    /// // The same sequence in two parts, the second started from the first's final state.
    /// let cut = |a: &Array4<f64>, r| a.slice_axis(Axis(1), Slice::from(r)).to_owned();
    /// let (y0, s0) = ops::linear_attention_state(cut(&q, 0..7).view(), cut(&q, 0..7).view(), cut(&v, 0..7).view(), None, &opts)?;
    /// let (y1, s1) = ops::linear_attention_state(cut(&q, 7..10).view(), cut(&q, 7..10).view(), cut(&v, 7..10).view(), Some(s0.view()), &opts)?;
    /// assert!(y1.iter().zip(cut(&y, 7..10).iter()).all(|(a, b)| (a - b).abs() < 1e-12));
    /// assert!(s1.iter().zip(s.iter()).all(|(a, b)| (a - b).abs() < 1e-12));
    /// # let _ = y0;
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub fn linear_attention_state(q: ArrayView4, k: ArrayView4, v: ArrayView4) = "linear-attention";
}

state_op! {
    /// [`mamba2`] from a state: as [`linear_attention_state`].
    pub fn mamba2_state(q: ArrayView4, k: ArrayView4, v: ArrayView4, g: ArrayView3) = "mamba2";
}

state_op! {
    /// [`gated_deltanet`] from a state: as [`linear_attention_state`].
    pub fn gated_deltanet_state(q: ArrayView4, k: ArrayView4, v: ArrayView4, g: ArrayView3, beta: ArrayView3) = "gated-deltanet";
}

/// `from_state` and `state` of the base members' typed decoders: prefill with a `*_state`
/// function, then decode from its final state (docs/math.md §7).
macro_rules! decoder_state {
    ($($dec:ident = $member:literal),+ $(,)?) => {$(
        impl<F: Scalar> $dec<F> {
            /// A decoder for at most `max_len` more tokens, started from the state
            /// `S [B, H, Dv, Dk]` (e.g. the final state of a `*_state` prefill).
            pub fn from_state(max_len: usize, initial_state: ArrayView4<'_, F>, opts: &Options) -> Result<Self> {
                let mut s = stepper($member, false, max_len, opts)?;
                s.start_from(STATE, initial_state.into_dyn());
                Ok(Self(s))
            }
            /// The state `S [B, H, Dv, Dk]` after the tokens consumed so far.
            pub fn state(&self) -> Result<Array4<F>> {
                self.0.state(STATE)
            }
        }
    )+};
}

decoder_state!(
    LinearAttentionDecoder = "linear-attention",
    Mamba2Decoder = "mamba2",
    GatedDeltaNetDecoder = "gated-deltanet",
);

/// The recurrent state of a log-linear lift (docs/math.md §7.1): the decoder's Fenwick level
/// states after the merge for the next token, and that token's position.
#[derive(Clone, Debug, PartialEq)]
pub struct LevelState<F> {
    /// `S [B, H, L, Dv, Dk]`: slot `i` holds level `i + 1` of the next token, the decayed sum
    /// of the `β v kᵀ` of the bucket `{ s : bitlen(position ⊕ s) = i + 1 }` (zero when bit `i`
    /// of the position is clear). The slots sum to the base mixer's state.
    pub s: Array5<F>,
    /// Per batch row, the tokens consumed before the state (the next token's position).
    pub position: Vec<usize>,
}

impl<F: Scalar> LevelState<F> {
    fn to_tensors(&self) -> Result<Tensors<F>> {
        let n = self.position.len();
        let pos = self.position.iter().map(|&a| F::of(a as f64)).collect();
        let pos = ArrayD::from_shape_vec(IxDyn(&[n]), pos)
            .map_err(|e| Error::shape(POSITION, "[B]", e.to_string()))?;
        Ok([(STATE.to_string(), self.s.clone().into_dyn()), (POSITION.to_string(), pos)]
            .into_iter()
            .collect())
    }

    fn from_tensors(mut t: Tensors<F>) -> Result<Self> {
        let mut take = |name: &str| {
            t.remove(name)
                .ok_or_else(|| Error::Decoder(format!("internal: the state has no tensor `{name}`")))
        };
        let s = take(STATE)?
            .into_dimensionality()
            .map_err(|e| Error::shape(STATE, "[B, H, L, Dv, Dk]", e.to_string()))?;
        let position = take(POSITION)?.iter().map(|&p| p.f64() as usize).collect();
        Ok(LevelState { s, position })
    }
}

state_op! {
    /// [`loglinear_attention`] from the state `initial_state` (its Fenwick level states and
    /// position, [`LevelState`]; `None`: zeros at position 0), returning `(y, final state)`
    /// (docs/math.md §7.1). A run of `x[a:b]` from the state after `x[0:a]` gives rows `a..b`
    /// of the run of `x[0:b]`; `lambda`'s level axis must hold `L ≥ L(b)` levels (it sizes the
    /// state). With [`Options::cu_seqlens`], one state row per sequence in and out. Forms:
    /// `fast`, `recurrent` and `materialized` (the CPU backend).
    ///
    /// ```
    /// use mixers::ndarray::{Array4, Axis, Slice};
    /// use mixers::ops::{self, Options};
    /// let q = Array4::<f64>::from_shape_fn((1, 10, 2, 3), |(_, t, h, d)| ((t + h + d) as f64).sin());
    /// let v = Array4::<f64>::from_shape_fn((1, 10, 2, 4), |(_, t, h, d)| ((t * h + d) as f64).cos());
    /// let lam = Array4::<f64>::from_shape_fn((1, 10, 2, 5), |(_, t, _, l)| 1.0 / (1 + t + l) as f64);
    /// let opts = Options::default().chunk(4);
    /// let cut = |a: &Array4<f64>, r| a.slice_axis(Axis(1), Slice::from(r)).to_owned();
    /// let (y, s) = ops::loglinear_attention_state(q.view(), q.view(), v.view(), lam.view(), None, &opts)?;
    /// let (_, s0) = ops::loglinear_attention_state(cut(&q, 0..7).view(), cut(&q, 0..7).view(), cut(&v, 0..7).view(), cut(&lam, 0..7).view(), None, &opts)?;
    /// assert_eq!(s0.position, vec![7]);
    /// let (y1, s1) = ops::loglinear_attention_state(cut(&q, 7..10).view(), cut(&q, 7..10).view(), cut(&v, 7..10).view(), cut(&lam, 7..10).view(), Some(&s0), &opts)?;
    /// assert!(y1.iter().zip(cut(&y, 7..10).iter()).all(|(a, b)| (a - b).abs() < 1e-12));
    /// assert!(s1.s.iter().zip(s.s.iter()).all(|(a, b)| (a - b).abs() < 1e-12));
    /// # Ok::<(), mixers::prelude::Error>(())
    /// ```
    pub fn loglinear_attention_state(q: ArrayView4, k: ArrayView4, v: ArrayView4, lambda: ArrayView4) = "loglinear-attention", lifted;
}

state_op! {
    /// [`loglinear_mamba2`] from a state: as [`loglinear_attention_state`].
    pub fn loglinear_mamba2_state(q: ArrayView4, k: ArrayView4, v: ArrayView4, g: ArrayView3, lambda: ArrayView4) = "loglinear-mamba2", lifted;
}

state_op! {
    /// [`loglinear_gated_deltanet`] from a state: as [`loglinear_attention_state`].
    pub fn loglinear_gated_deltanet_state(q: ArrayView4, k: ArrayView4, v: ArrayView4, g: ArrayView3, beta: ArrayView3, lambda: ArrayView4) = "loglinear-gated-deltanet", lifted;
}

/// `from_state` and `state` of the lifts' typed decoders (docs/math.md §7.1).
macro_rules! lift_decoder_state {
    ($($dec:ident = $member:literal),+ $(,)?) => {$(
        impl<F: Scalar> $dec<F> {
            /// A decoder for at most `max_len` more tokens, started from `initial_state` (e.g.
            /// the final state of a `*_state` prefill); `lambda_t` needs
            /// `L ≥ L(position + max_len)` levels.
            pub fn from_state(max_len: usize, initial_state: &LevelState<F>, opts: &Options) -> Result<Self> {
                let mut s = stepper($member, true, max_len, opts)?;
                s.start_from_states(initial_state.to_tensors()?);
                Ok(Self(s))
            }
            /// The state after the tokens consumed so far.
            pub fn state(&self) -> Result<LevelState<F>> {
                LevelState::from_tensors(self.0.states()?)
            }
        }
    )+};
}

lift_decoder_state!(
    LogLinearAttentionDecoder = "loglinear-attention",
    LogLinearMamba2Decoder = "loglinear-mamba2",
    LogLinearGatedDeltaNetDecoder = "loglinear-gated-deltanet",
);
