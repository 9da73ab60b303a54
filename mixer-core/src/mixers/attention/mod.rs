//! Softmax attention (docs/math.md §1.3 "Attention"): `attention` and `local-attention`.
//!
//! Per batch row and head, `A_{t,s} = softmax_{s ≤ t, t − s < w}(σ q_t · k_s)`,
//! `B = 0`, mixed input `v`: `y_t = Σ_s A_{t,s} v_s`. The scale `σ` defaults to
//! `1/√(D_k)`; the window `w` is unbounded for `attention` (unless configured) and required
//! for `local-attention` (default [`LOCAL_WINDOW_DEFAULT`] = 64).

use std::any::Any;
use std::sync::Arc;

use ndarray::{Array2, ArrayD};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::grad::{MatGrad, grad_name};
use crate::materialize::Materialization;
use crate::mixer::Mixer;
use crate::spec::{Dim, Dims, InputDecl, InputSpec};
use crate::tensor::{Tensors, get};

pub mod state;

/// Default window of `local-attention`.
pub const LOCAL_WINDOW_DEFAULT: usize = 64;

/// The names under which attention is registered.
pub const ATTENTION_NAMES: [&str; 2] = ["attention", "local-attention"];

/// Config of `attention`: `{"window": null | w ≥ 1, "scale": null | σ}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttentionConfig {
    /// Window `w`: token `t` sees `s ∈ (t − w, t]`; `None` = every `s ≤ t`.
    pub window: Option<usize>,
    /// Score scale `σ`; `None` = `1/√(D_k)`.
    pub scale: Option<f64>,
}

/// Config of `local-attention`: `{"window": w ≥ 1 (default 64), "scale": null | σ}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LocalConfig {
    window: usize,
    scale: Option<f64>,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig { window: LOCAL_WINDOW_DEFAULT, scale: None }
    }
}

/// Softmax weights that cannot overflow (MATH §1.3). A logit `z_s = σ q · k_s` is
/// kept as the key `u_s = sign(σ) (q · k_s)`, with the dot product
/// formed in `f64`, and the weight is
/// `e^(z_s − max_r z_r) = e^(|σ| (u_s − max_r u_r))`: the exponent is `≤ 0` for every
/// finite `σ` and finite keys, so neither a huge scale (`1e308`) nor huge `f32` queries
/// and keys (`q·k ≈ 1e38`, finite in `f64`) produce ∞ − ∞ = NaN. Terms that underflow are
/// exactly the ones whose weight is below the type's resolution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Logits {
    abs: f64,
    sign: f64,
}

impl Logits {
    /// For the score scale `σ` (finite).
    pub fn new(scale: f64) -> Self {
        Logits { abs: scale.abs(), sign: if scale < 0.0 { -1.0 } else { 1.0 } }
    }

    /// The key `u = sign(σ) d` of a dot product `d = q_t · k_s`, or an
    /// error when `d` is not finite even in `f64` (`f64` inputs near `1e154` and above).
    pub fn key(&self, dot: f64, t: usize, s: usize) -> Result<f64> {
        if dot.is_finite() {
            return Ok(self.sign * dot);
        }
        Err(Error::Numerical(format!(
            "attention: the dot product q_{t}·k_{s} = {dot} overflows f64; inputs this large have \
             no finite logits (scale q and k down, or fold the factor into `scale`)"
        )))
    }

    /// The unnormalized weight `e^(|σ|(u − m))` of key `u` under the running maximum key
    /// `m ≥ u` (`m = −∞` before any key: weight 0, or 1 when `σ = 0`).
    #[inline]
    pub fn weight(&self, key: f64, max_key: f64) -> f64 {
        if self.abs == 0.0 || key == max_key { 1.0 } else { (self.abs * (key - max_key)).exp() }
    }

    /// `|σ|`, the factor of the weights' exponent: `weight(u, m) = e^{|σ|(u − m)}`.
    pub fn weight_scale(&self) -> f64 {
        self.abs
    }
}

/// `q · k` accumulated in `f64` (finite for any finite `f32` operands).
pub fn dot_f64<F: crate::Real>(q: impl IntoIterator<Item = F>, k: impl IntoIterator<Item = F>) -> f64 {
    q.into_iter().zip(k).map(|(a, b)| a.f64() * b.f64()).sum()
}

/// A configured softmax attention.
#[derive(Clone, Debug)]
pub struct Attention {
    name: String,
    config: AttentionConfig,
}

impl Attention {
    /// Builds with a checked config: window `≥ 1` when given, finite scale.
    pub fn new(name: &str, config: AttentionConfig) -> Result<Self> {
        if config.window == Some(0) {
            return Err(Error::config(name, "window must be ≥ 1 (a token sees itself) or null, got 0"));
        }
        if let Some(s) = config.scale
            && !s.is_finite()
        {
            return Err(Error::config(name, format!("scale must be finite, got {s}")));
        }
        Ok(Attention { name: name.to_string(), config })
    }

    /// Builds `attention` or `local-attention` from JSON.
    pub fn from_json(name: &str, cfg: &serde_json::Value) -> Result<Self> {
        let cfg = if cfg.is_null() { serde_json::json!({}) } else { cfg.clone() };
        let config = match name {
            "attention" => serde_json::from_value::<AttentionConfig>(cfg).map_err(|e| {
                Error::config(name, format!(r#"{e}; expected {{"window": null | w ≥ 1, "scale": null | σ}}"#))
            })?,
            "local-attention" => {
                let c = serde_json::from_value::<LocalConfig>(cfg).map_err(|e| {
                    Error::config(
                        name,
                        format!(r#"{e}; expected {{"window": w ≥ 1 (default 64), "scale": null | σ}}"#),
                    )
                })?;
                AttentionConfig { window: Some(c.window), scale: c.scale }
            }
            other => {
                return Err(Error::config(
                    other,
                    format!("not an attention mixer name; expected one of {}", ATTENTION_NAMES.join(", ")),
                ));
            }
        };
        Attention::new(name, config)
    }

    /// The window (`None` = full causal).
    pub fn window(&self) -> Option<usize> {
        self.config.window
    }

    /// The score scale for head dimension `dk`: the configured one, else `1/√(D_k)`
    /// (`1` when `D_k = 0`, where every score is 0 anyway).
    pub fn scale(&self, dk: usize) -> f64 {
        self.config.scale.unwrap_or(if dk == 0 { 1.0 } else { 1.0 / (dk as f64).sqrt() })
    }

    /// The overflow-free softmax for head dimension `dk` ([`Logits`]).
    pub fn logits(&self, dk: usize) -> Logits {
        Logits::new(self.scale(dk))
    }

    /// First key position token `t` sees: `max(0, t + 1 − w)`.
    pub fn first_key(&self, t: usize) -> usize {
        match self.config.window {
            Some(w) => (t + 1).saturating_sub(w),
            None => 0,
        }
    }
}

impl Mixer for Attention {
    fn name(&self) -> &str {
        &self.name
    }
    /// The KV cache: `min(n, w)` positions (every position without a window) × B × H × (Dk + Dv).
    fn decoder_cache(&self, dims: &Dims, consumed: usize) -> Option<usize> {
        let (b, h, dk, dv) = (*dims.get("B")?, *dims.get("H")?, *dims.get("Dk")?, *dims.get("Dv")?);
        let kept = self.window().map_or(consumed, |w| consumed.min(w));
        Some(kept * b * h * (dk + dv))
    }
    fn family(&self) -> &'static str {
        "attention"
    }
    fn config(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).unwrap_or_default()
    }
    fn spec(&self) -> InputSpec {
        use Dim::Sym;
        InputSpec {
            inputs: vec![
                InputDecl::new("q", vec![Sym("B"), Sym("T"), Sym("H"), Sym("Dk")]),
                InputDecl::new("k", vec![Sym("B"), Sym("T"), Sym("H"), Sym("Dk")]),
                InputDecl::new("v", vec![Sym("B"), Sym("T"), Sym("H"), Sym("Dv")]),
            ],
            mixed: "v",
        }
    }
    fn materialize(&self, inputs: &Tensors<f64>) -> Result<Materialization> {
        let q = get(inputs, "q")?;
        let k = get(inputs, "k")?;
        let v = get(inputs, "v")?;
        let (bn, t_len, hn, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
        let dv = v.shape()[3];
        let lg = self.logits(dk);
        let mut m = Materialization::new(t_len);
        for b in 0..bn {
            for h in 0..hn {
                let mut a = Array2::<f64>::zeros((t_len, t_len));
                for t in 0..t_len {
                    let lo = self.first_key(t);
                    let keys: Vec<f64> = (lo..=t)
                        .map(|s| {
                            lg.key((0..dk).map(|d| q[[b, t, h, d]] * k[[b, s, h, d]]).sum::<f64>(), t, s)
                        })
                        .collect::<Result<_>>()?;
                    let mx = keys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let den: f64 = keys.iter().map(|&u| lg.weight(u, mx)).sum();
                    for (i, &u) in keys.iter().enumerate() {
                        a[[t, lo + i]] = lg.weight(u, mx) / den;
                    }
                }
                m.push(b, h * dv..(h + 1) * dv, Arc::new(a), None);
            }
        }
        Ok(m)
    }
    fn working_memory(&self, form: crate::Form, dims: &crate::Dims, elem: f64) -> f64 {
        crate::memory::attention(form, dims, elem, self.window())
    }
    materialized_vjp!(Self::entry_vjp, with_materialization);
    /// The KV cache `k [B, N, H, Dk]`, `v [B, N, H, Dv]`, `length [B]`
    /// ([`super::attention_state`]; `N = w − 1` with a window).
    fn state_shapes(&self, dims: &Dims) -> std::result::Result<crate::state::StateShapes, String> {
        state::shapes(self, dims)
    }
    /// Without a window, the cache's capacity `N`: the given cache's, else `T`.
    fn state_sizes(&self, dims: &Dims, given: Option<&crate::state::StateShapes>) -> Dims {
        state::sizes(self, dims, given)
    }
    fn random_state(&self, dims: &Dims, seed: u64) -> Result<Tensors<f64>> {
        state::random_state(self, dims, seed)
    }
    state_oracle!(extension state);
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Attention {
    /// Softmax backward per row: `S̄_{t,s} = A_{t,s}(Ā_{t,s} − Σ_{s'} A_{t,s'} Ā_{t,s'})`
    /// on the visible keys, then `q̄_t = σ Σ_s S̄_{t,s} k_s` and
    /// `k̄_s = σ Σ_t S̄_{t,s} q_t`.
    fn entry_vjp(
        &self,
        inputs: &Tensors<f64>,
        mat: &Materialization,
        grad: &MatGrad,
    ) -> Result<Tensors<f64>> {
        let q = get(inputs, "q")?;
        let k = get(inputs, "k")?;
        let (bn, t_len, hn, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
        if grad.blocks.len() != bn * hn || mat.blocks.len() != bn * hn {
            return Err(Error::Numerical(format!(
                "attention backward: {} blocks for B·H = {}",
                grad.blocks.len(),
                bn * hn
            )));
        }
        let scale = self.scale(dk);
        let mut dq = ArrayD::<f64>::zeros(q.raw_dim());
        let mut dkk = ArrayD::<f64>::zeros(k.raw_dim());
        for b in 0..bn {
            for h in 0..hn {
                let a = &mat.blocks[b * hn + h].terms[0].a;
                let ga = &grad.blocks[b * hn + h].terms[0];
                for t in 0..t_len {
                    let lo = self.first_key(t);
                    let dot: f64 = (lo..=t).map(|s| a[[t, s]] * ga[[t, s]]).sum();
                    for s in lo..=t {
                        let ds = scale * a[[t, s]] * (ga[[t, s]] - dot);
                        for d in 0..dk {
                            dq[[b, t, h, d]] += ds * k[[b, s, h, d]];
                            dkk[[b, s, h, d]] += ds * q[[b, t, h, d]];
                        }
                    }
                }
            }
        }
        let mut out = Tensors::new();
        out.insert(grad_name("q"), dq);
        out.insert(grad_name("k"), dkk);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs() {
        let a = Attention::from_json("local-attention", &serde_json::json!({})).unwrap();
        assert_eq!(a.window(), Some(LOCAL_WINDOW_DEFAULT));
        assert_eq!(a.first_key(100), 37);
        let a = Attention::from_json("attention", &serde_json::Value::Null).unwrap();
        assert_eq!(a.window(), None);
        assert_eq!(a.scale(4), 0.5);
        let e = Attention::from_json("local-attention", &serde_json::json!({"window": 0})).unwrap_err();
        assert!(e.to_string().contains("got 0"), "{e}");
        let e = Attention::from_json("attention", &serde_json::json!({"windw": 3})).unwrap_err();
        assert!(e.to_string().contains("unknown field `windw`"), "{e}");
        let e = Attention::from_json("local-attention", &serde_json::json!({"window": null})).unwrap_err();
        assert!(e.to_string().contains("window"), "{e}");
    }
}
