//! Typed ops: one function per builtin mixer that [`mixers::ops::configured`] builds, with the shapes,
//! options and defaults of the typed API of the same name in [`mixers::ops`] (docs/math.md),
//! on candle tensors, with autograd. Each runs [`mixers::ops::configured`]'s mixer through the
//! registry, as the typed API does, so its `y` equals the typed API's bit for bit.
//!
//! Shapes: `q, k [B, T, H, Dk]`, `v [B, T, H, Dv]`, `g, beta [B, T, H]` (`g ≤ 0`,
//! `beta ∈ [0, 1]`), `lambda [B, T, H, L]` (`L ≥ bitlen(T − 1) + 1` for the Fenwick mask) →
//! `y [B, T, H, Dv]`. States (docs/math.md §7.1): `S [B, H, Dv, Dk]` (with
//! [`Options::cu_seqlens`](mixers::ops::Options::cu_seqlens), one row per sequence).

use candle_core::Tensor;
use mixer_core::mixers::loglinear::state::STATE;
use mixers::ops::Options;

use crate::call::apply;
use crate::error::lib;

/// For each entry `$name = $mixer (inputs…);`, `pub fn $name(inputs…, opts) -> y`: the typed op
/// of the builtin mixer `$mixer`.
macro_rules! typed {
    ($($(#[$doc:meta])* $name:ident = $mixer:literal ($($input:ident),+);)+) => {$(
        $(#[$doc])*
        pub fn $name($($input: &Tensor,)+ opts: &Options) -> candle_core::Result<Tensor> {
            let m = lib(mixers::ops::configured($mixer, opts))?;
            apply(m, &[$((stringify!($input), $input)),+], None, false, opts).map(|(y, _)| y)
        }
    )+};
}

/// For each entry `$name = $mixer (inputs…);`, `pub fn $name(inputs…, initial_state, opts) ->
/// (y, S_T)`: the run of `$mixer` from a state.
macro_rules! typed_state {
    ($($(#[$doc:meta])* $name:ident = $mixer:literal ($($input:ident),+);)+) => {$(
        $(#[$doc])*
        pub fn $name(
            $($input: &Tensor,)+
            initial_state: Option<&Tensor>,
            opts: &Options,
        ) -> candle_core::Result<(Tensor, Tensor)> {
            let m = lib(mixers::ops::configured($mixer, opts))?;
            let initial = initial_state.map(|s| [(STATE, s)]);
            let (y, mut states) = apply(m, &[$((stringify!($input), $input)),+], initial.as_ref().map(|s| &s[..]), true, opts)?;
            let s = states.pop().map(|(_, s)| s).ok_or_else(|| crate::Error::Packing {
                op: $mixer.into(),
                expected: format!("a state `{STATE}`"),
                got: "none".into(),
            })?;
            Ok((y, s))
        }
    )+};
}

typed! {
    /// Causal softmax attention: `y_t = Σ_{s ≤ t, t−s < w} softmax_s(σ q_t · k_s) v_s`
    /// (options `scale`, default `1/√Dk`, and `window`).
    attention = "attention" (q, k, v);
    /// Linear attention: `y_t = σ Σ_{s ≤ t} (q_t · k_s) v_s` (options `scale`, default 1, and
    /// `chunk`).
    linear_attention = "linear-attention" (q, k, v);
    /// Mamba-2 (SSD): `y_t = σ Σ_{s ≤ t} (q_t · k_s) e^(G_t − G_s) v_s`, `G_t = Σ_{r ≤ t} g_r`.
    mamba2 = "mamba2" (q, k, v, g);
    /// Gated DeltaNet: `S_t = e^(g_t) S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ`, `y_t = σ S_t q_t`.
    gated_deltanet = "gated-deltanet" (q, k, v, g, beta);
    /// Log-linear attention: `y_t = σ Σ_{s ≤ t} λ_t^(ℓ(t,s)) (q_t · k_s) v_s` (options `mask`,
    /// default Fenwick, and `lambda`, the λ scheme, default identity).
    loglinear_attention = "loglinear-attention" (q, k, v, lambda);
    /// Log-linear Mamba-2: `y_t = σ Σ_{s ≤ t} λ_t^(ℓ(t,s)) (q_t · k_s) e^(G_t − G_s) v_s`.
    loglinear_mamba2 = "loglinear-mamba2" (q, k, v, g, lambda);
    /// Log-linear gated DeltaNet: gated DeltaNet's transitions, each Fenwick level's state
    /// read with the weight `λ_t^(ℓ)`.
    loglinear_gated_deltanet = "loglinear-gated-deltanet" (q, k, v, g, beta, lambda);
}
typed_state! {
    /// [`linear_attention`] from the state `S_0 [B, H, Dv, Dk]` (`None`: zeros), returning
    /// `(y, S_T)`: `S_t = S_{t−1} + v_t k_tᵀ`, `y_t = σ S_t q_t`.
    linear_attention_state = "linear-attention" (q, k, v);
    /// [`mamba2`] from a state, returning `(y, S_T)`: `S_t = e^(g_t) S_{t−1} + v_t k_tᵀ`.
    mamba2_state = "mamba2" (q, k, v, g);
    /// [`gated_deltanet`] from a state, returning `(y, S_T)`.
    gated_deltanet_state = "gated-deltanet" (q, k, v, g, beta);
}
