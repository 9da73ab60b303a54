//! The generalized linear recurrence (docs/math.md §1.2 "The `glr` mixer") and its named aliases.
//!
//! Per batch row and channel,
//! `y_t = Σ_{s ≤ t} α_{t,s} x_s + Σ_{s < t} β_{t,s} y_s`, where the only non-zero
//! off-diagonal coefficients sit at the pattern's dependency positions `d_k(t)` (docs/math.md §1.1):
//! - `on = "b"`: `y_t = α_t x_t + Σ_{k: f(k) ≤ t} β_{t,k} y_{d_k(t)}`;
//! - `on = "a"`: `y_t = α_{t,0} x_t + Σ_{k: f(k) ≤ t} α_{t,k+1} x_{d_k(t)}`;
//! - `on = "both"`: both sums.
//!
//! Slots with `f(k) > t` are ignored: their coefficient values never matter.
//!
//! Aliases (all with `pattern = "linear"`, translation-invariant):
//! `diagonal-ssm` (`order = 1`), `kth-order` (config `{"order": k}`, default `k = 2`),
//! `dense-recurrence` (untruncated). Each alias also accepts `on`.

use std::any::Any;
use std::sync::Arc;

use ndarray::{Array2, ArrayD};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::grad::{MatGrad, grad_name};
use crate::materialize::Materialization;
use crate::mixer::{Mixer, complete_dims};
pub use crate::pattern::Slots;
use crate::pattern::{OffsetFn, Pattern};
use crate::spec::{Bound, Dim, Dims, Gen, InputDecl, InputSpec};
use crate::tensor::{Tensors, get};

pub mod state;

/// Which side the pattern sits on (docs/math.md §1.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum On {
    /// Recurrence on past outputs: `alpha [B,T,C]`, `beta [B,T,K,C]`.
    #[default]
    B,
    /// Sparse direct influence of past inputs: `alpha [B,T,K+1,C]`.
    A,
    /// Both: `alpha [B,T,K+1,C]`, `beta [B,T,K,C]`.
    Both,
}

impl On {
    /// Whether the output recurrence (`β` on past outputs) is present.
    pub fn has_b(self) -> bool {
        matches!(self, On::B | On::Both)
    }
    /// Whether past inputs are read directly (`α` has `K + 1` slots).
    pub fn has_a(self) -> bool {
        matches!(self, On::A | On::Both)
    }
}

/// Configuration of `glr` (docs/math.md §1.2). `{}` gives `pow2`, translation-invariant, untruncated, on `b`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GlrConfig {
    /// A registered offset pattern name (`pow2`, `sq1`, `linear`, or a plugin's).
    pub pattern: String,
    /// Cache-efficient lattice positions instead of translation-invariant ones.
    pub cache_efficient: bool,
    /// Truncation to the first `order` slots (`None` = untruncated; `0` is rejected).
    pub order: Option<usize>,
    /// Where the pattern sits.
    pub on: On,
}

impl Default for GlrConfig {
    fn default() -> Self {
        GlrConfig { pattern: "pow2".into(), cache_efficient: false, order: None, on: On::B }
    }
}

/// Config of `diagonal-ssm` and `dense-recurrence`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct AliasConfig {
    on: On,
}

/// Config of `kth-order`; `order` defaults to 2.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct KthConfig {
    order: usize,
    on: On,
}

impl Default for KthConfig {
    fn default() -> Self {
        KthConfig { order: 2, on: On::B }
    }
}

/// Default order of the `kth-order` alias.
pub const KTH_ORDER_DEFAULT: usize = 2;

/// The names under which the GLR is registered.
pub const GLR_NAMES: [&str; 4] = ["glr", "diagonal-ssm", "kth-order", "dense-recurrence"];

/// A configured generalized linear recurrence.
#[derive(Clone, Debug)]
pub struct Glr {
    name: String,
    config: GlrConfig,
    pattern: Pattern,
}

fn parse<T: for<'de> Deserialize<'de>>(name: &str, cfg: &serde_json::Value, expected: &str) -> Result<T> {
    let cfg = if cfg.is_null() { serde_json::json!({}) } else { cfg.clone() };
    serde_json::from_value(cfg).map_err(|e| Error::config(name, format!("{e}; expected {expected}")))
}

impl Glr {
    /// Builds from a resolved offset function. Errors from [`Pattern::new`]: `order = 0`,
    /// `cache_efficient` with `f(0) ≠ 1`, non-increasing `f`.
    pub fn new(name: &str, config: GlrConfig, offset: OffsetFn) -> Result<Self> {
        let pattern = Pattern::new(&config.pattern, offset, config.order, config.cache_efficient)
            .map_err(|e| Error::config(name, e.to_string()))?;
        Ok(Glr { name: name.to_string(), config, pattern })
    }

    /// Builds `name` (one of [`GLR_NAMES`]) from its JSON config; `resolve` maps a pattern name
    /// to its offset function (the registry's lookup, with its "did you mean" error).
    pub fn from_json(
        name: &str,
        cfg: &serde_json::Value,
        resolve: impl Fn(&str) -> Result<OffsetFn>,
    ) -> Result<Self> {
        let config = match name {
            "glr" => parse::<GlrConfig>(
                name,
                cfg,
                r#"{"pattern": "<registered name>", "cache_efficient": bool, "order": null | k ≥ 1, "on": "b" | "a" | "both"}"#,
            )?,
            "diagonal-ssm" | "dense-recurrence" => {
                let a = parse::<AliasConfig>(name, cfg, r#"{"on": "b" | "a" | "both"}"#)?;
                let order = (name == "diagonal-ssm").then_some(1);
                GlrConfig { pattern: "linear".into(), cache_efficient: false, order, on: a.on }
            }
            "kth-order" => {
                let a = parse::<KthConfig>(
                    name,
                    cfg,
                    r#"{"order": k ≥ 1 (default 2), "on": "b" | "a" | "both"}"#,
                )?;
                GlrConfig { pattern: "linear".into(), cache_efficient: false, order: Some(a.order), on: a.on }
            }
            other => {
                return Err(Error::config(
                    other,
                    format!("not a GLR mixer name; expected one of {}", GLR_NAMES.join(", ")),
                ));
            }
        };
        let f = resolve(&config.pattern).map_err(|e| Error::config(name, e.to_string()))?;
        Glr::new(name, config, f)
    }

    /// The configuration (in `glr` terms, also for aliases).
    pub fn glr_config(&self) -> &GlrConfig {
        &self.config
    }

    /// The resolved pattern.
    pub fn pattern(&self) -> &Pattern {
        &self.pattern
    }

    /// Where the pattern sits.
    pub fn on(&self) -> On {
        self.config.on
    }

    /// Dependency slots for length `t_len` (offsets and strides computed once).
    pub fn slots(&self, t_len: usize) -> Slots {
        Slots::new(&self.pattern, t_len)
    }
}

impl Mixer for Glr {
    fn name(&self) -> &str {
        &self.name
    }
    /// Positions tokens after the `consumed`-th (and before `T`) read, × streams × B × C:
    /// cache-efficient, `|P_n|` (MATH §1.1); translation-invariant, the window
    /// `min(n, f(K−1))`; none once all `T` tokens are consumed.
    fn decoder_cache(&self, dims: &Dims, consumed: usize) -> Option<usize> {
        let (t_len, b, c) = (*dims.get("T")?, *dims.get("B")?, *dims.get("C")?);
        if consumed >= t_len {
            return Some(0);
        }
        let slots = self.slots(t_len);
        let positions = if slots.cache_efficient() {
            slots.distinct_positions(consumed)
        } else {
            consumed.min(slots.offsets().last().copied().unwrap_or(0))
        };
        let streams = if self.config.on == On::Both { 2 } else { 1 };
        Some(positions * streams * b * c)
    }
    /// The slot axes: `K(len)` slots of `beta`, `K(len) + 1` of `alpha` when `on` includes
    /// `a` (axis 2 of both).
    fn length_axes(&self, len: usize) -> Vec<(&'static str, usize, usize)> {
        let k = self.pattern.slots(len);
        let mut v = vec![("beta", 2, k)];
        if self.config.on.has_a() {
            v.push(("alpha", 2, k + 1));
        }
        v
    }
    fn family(&self) -> &'static str {
        "glr"
    }
    /// `d_beta` reads `y` at the taps' positions (with `on = b` or `both`).
    fn backward_reads_output(&self) -> bool {
        self.config.on.has_b()
    }
    fn config(&self) -> serde_json::Value {
        let on = serde_json::to_value(self.config.on).unwrap_or_default();
        match self.name.as_str() {
            "diagonal-ssm" | "dense-recurrence" => serde_json::json!({ "on": on }),
            "kth-order" => serde_json::json!({ "order": self.config.order, "on": on }),
            _ => serde_json::to_value(&self.config).unwrap_or_default(),
        }
    }
    fn spec(&self) -> InputSpec {
        use Dim::Sym;
        let btc = vec![Sym("B"), Sym("T"), Sym("C")];
        let mut inputs = vec![InputDecl::new("x", btc.clone())];
        if self.config.on.has_a() {
            inputs.push(InputDecl::new("alpha", vec![Sym("B"), Sym("T"), Sym("K1"), Sym("C")]));
        } else {
            inputs.push(InputDecl::new("alpha", btc));
        }
        if self.config.on.has_b() {
            inputs.push(
                InputDecl::new("beta", vec![Sym("B"), Sym("T"), Sym("K"), Sym("C")]).sample(Gen::Stable(2)),
            );
        }
        InputSpec { inputs, mixed: "x" }
    }
    fn bounds(&self, dims: &Dims) -> Vec<(&'static str, Bound, &'static str)> {
        let Some(&t) = dims.get("T") else { return Vec::new() };
        let k = self.pattern.slots(t);
        let mut v = Vec::new();
        if self.config.on.has_b() {
            v.push((
                "K",
                Bound::AtLeast(k),
                "K(T) = #{k : f(k) ≤ T−1} slots of the pattern (more are never read by a run from \
                 position 0; a run from a state at position a needs K(a + T))",
            ));
        }
        if self.config.on.has_a() {
            v.push(("K1", Bound::AtLeast(k + 1), "K(T) + 1: the diagonal then one slot per offset"));
        }
        v
    }
    fn materialize(&self, inputs: &Tensors<f64>) -> Result<Materialization> {
        let x = get(inputs, "x")?;
        let (bn, t_len, cn) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let alpha = get(inputs, "alpha")?;
        let beta = if self.config.on.has_b() { Some(get(inputs, "beta")?) } else { None };
        let slots = self.slots(t_len);
        let deps: Vec<Vec<(usize, usize)>> = (0..t_len).map(|t| slots.deps(t).collect()).collect();
        let mut m = Materialization::new(t_len);
        for b in 0..bn {
            for c in 0..cn {
                let mut a = Array2::<f64>::zeros((t_len, t_len));
                let mut bm = beta.map(|_| Array2::<f64>::zeros((t_len, t_len)));
                for t in 0..t_len {
                    if self.config.on.has_a() {
                        a[[t, t]] = alpha[[b, t, 0, c]];
                        for &(k, d) in &deps[t] {
                            a[[t, d]] += alpha[[b, t, k + 1, c]];
                        }
                    } else {
                        a[[t, t]] = alpha[[b, t, c]];
                    }
                    if let (Some(bm), Some(beta)) = (bm.as_mut(), beta) {
                        for &(k, d) in &deps[t] {
                            bm[[t, d]] += beta[[b, t, k, c]];
                        }
                    }
                }
                m.push(b, c..c + 1, Arc::new(a), bm.map(Arc::new));
            }
        }
        Ok(m)
    }
    materialized_vjp!(Self::entry_vjp);
    /// Draws from the spec (β stable: `Σ_k |β_{t,k}| ≤ 0.95`), then overwrites every slot
    /// with `f(k) > t` (in `beta`, and slots `k + 1` of `alpha` when `on` includes `a`) with
    /// `± 10⁶`, so that any form that reads an inactive slot fails the comparison. Where the slot
    /// axis leaves room for a state's prefix ([`state::room`]), only the slots
    /// inactive from every start in that room (`f(k) > t + room`).
    fn random_inputs(&self, dims: &Dims, seed: u64) -> Result<Tensors<f64>> {
        let dims = complete_dims(self, dims);
        let mut inp = self.spec().random(&dims, seed, false)?;
        let t_len = dims.get("T").copied().unwrap_or(0);
        // Valid for runs from a state at every position up to the room the slot axis leaves.
        let room = state::slot_count(&dims).map_or(0, |k| state::room(self, t_len, k));
        let slots = Slots::new(&self.pattern, t_len + room);
        let garbage = |arr: &mut ArrayD<f64>, shift: usize| {
            let sh = arr.shape().to_vec();
            if sh.len() != 4 {
                return;
            }
            for b in 0..sh[0] {
                for t in 0..sh[1] {
                    let first = slots.active(t + room) + shift;
                    for k in first..sh[2] {
                        for c in 0..sh[3] {
                            arr[[b, t, k, c]] = if (t + k + c) % 2 == 0 { 1e6 } else { -1e6 };
                        }
                    }
                }
            }
        };
        if self.config.on.has_b()
            && let Some(b) = inp.get_mut("beta")
        {
            garbage(b, 0);
        }
        if self.config.on.has_a()
            && let Some(a) = inp.get_mut("alpha")
        {
            garbage(a, 1);
        }
        Ok(inp)
    }
    /// The past outputs (`on = "b"`) or inputs (`on = "a"`) later tokens read, and the
    /// position ([`super::glr_state`]).
    fn state_shapes(&self, dims: &Dims) -> std::result::Result<crate::state::StateShapes, String> {
        state::shapes(self, dims)
    }
    /// `K = K(2T)` slots: room for a state at a position up to about `T`.
    fn state_check_dims(&self, dims: &Dims) -> Dims {
        let mut d = dims.clone();
        if let Some(&t) = dims.get("T") {
            let k = self.pattern.slots(2 * t);
            if self.config.on.has_b() {
                d.insert("K", k);
            }
            if self.config.on.has_a() {
                d.insert("K1", k + 1);
            }
        }
        d
    }
    fn random_state(&self, dims: &Dims, seed: u64) -> Result<Tensors<f64>> {
        let shapes = self.state_shapes(dims).map_err(|why| crate::state::no_state(&self.name, &why))?;
        state::random_state(self, dims, crate::state::random(&shapes, seed))
    }
    state_oracle!(extension state);
    fn working_memory(&self, form: crate::Form, dims: &crate::Dims, elem: f64) -> f64 {
        crate::memory::glr(form, dims, elem, self.on().has_b())
    }
    fn overflow_hint(&self) -> Option<String> {
        self.on().has_b().then(|| {
            "the recurrence grows geometrically where Σ_k |beta[t,k]| > 1 (a divergent GLR)".to_string()
        })
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Glr {
    /// Entry gradients to coefficients, per batch row and channel, for active slots `k`:
    /// `ᾱ_t = Ā_{t,t}` (or `ᾱ_{t,0}`), `ᾱ_{t,k+1} = Ā_{t,d_k(t)}`,
    /// `β̄_{t,k} = B̄_{t,d_k(t)}`; inactive slots get 0 (their values never matter).
    fn entry_vjp(&self, inputs: &Tensors<f64>, grad: &MatGrad) -> Result<Tensors<f64>> {
        let x = get(inputs, "x")?;
        let (bn, t_len, cn) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let alpha = get(inputs, "alpha")?;
        let mut da = ArrayD::<f64>::zeros(alpha.raw_dim());
        let mut db = if self.config.on.has_b() {
            Some(ArrayD::<f64>::zeros(get(inputs, "beta")?.raw_dim()))
        } else {
            None
        };
        if grad.blocks.len() != bn * cn {
            return Err(Error::Numerical(format!(
                "glr backward: {} entry-gradient blocks for B·C = {}",
                grad.blocks.len(),
                bn * cn
            )));
        }
        let slots = self.slots(t_len);
        let deps: Vec<Vec<(usize, usize)>> = (0..t_len).map(|t| slots.deps(t).collect()).collect();
        for b in 0..bn {
            for c in 0..cn {
                let bg = &grad.blocks[b * cn + c];
                let ga = &bg.terms[0];
                for (t, dt) in deps.iter().enumerate() {
                    if self.config.on.has_a() {
                        da[[b, t, 0, c]] = ga[[t, t]];
                        for &(k, d) in dt {
                            da[[b, t, k + 1, c]] = ga[[t, d]];
                        }
                    } else {
                        da[[b, t, c]] = ga[[t, t]];
                    }
                    if let (Some(db), Some(gb)) = (db.as_mut(), bg.b.as_ref()) {
                        for &(k, d) in dt {
                            db[[b, t, k, c]] = gb[[t, d]];
                        }
                    }
                }
            }
        }
        let mut out = Tensors::new();
        out.insert(grad_name("alpha"), da);
        if let Some(db) = db {
            out.insert(grad_name("beta"), db);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::{linear, pow2, sq1};

    fn resolve(n: &str) -> Result<OffsetFn> {
        match n {
            "pow2" => Ok(pow2),
            "sq1" => Ok(sq1),
            "linear" => Ok(linear),
            _ => {
                Err(Error::Unknown { kind: "pattern", name: n.into(), suggestions: vec![], known: "".into() })
            }
        }
    }

    #[test]
    fn slots_match_pattern_dep() {
        for f in [pow2 as OffsetFn, sq1, linear] {
            for ce in [false, true] {
                for order in [None, Some(2)] {
                    let p = Pattern::new("p", f, order, ce).unwrap();
                    let s = Slots::new(&p, 300);
                    for t in 0..300 {
                        let n = s.active(t);
                        assert_eq!(n, p.deps(t).len().min(s.len()));
                        for k in 0..n {
                            assert_eq!(Some(s.pos(t, k)), p.dep(t, k), "t={t} k={k}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn aliases_and_errors() {
        let g = Glr::from_json("kth-order", &serde_json::json!({}), resolve).unwrap();
        assert_eq!(g.pattern().order(), Some(KTH_ORDER_DEFAULT));
        assert_eq!(g.config(), serde_json::json!({"order": 2, "on": "b"}));
        let g = Glr::from_json("diagonal-ssm", &serde_json::json!({"on": "both"}), resolve).unwrap();
        assert_eq!(g.pattern().order(), Some(1));
        assert_eq!(g.on(), On::Both);
        let g = Glr::from_json("glr", &serde_json::Value::Null, resolve).unwrap();
        assert_eq!(g.glr_config(), &GlrConfig::default());
        let e = Glr::from_json("glr", &serde_json::json!({"order": 0}), resolve).unwrap_err().to_string();
        assert!(e.contains("order must be at least 1"), "{e}");
        let e = Glr::from_json("glr", &serde_json::json!({"pattren": "x"}), resolve).unwrap_err().to_string();
        assert!(e.contains("unknown field `pattren`"), "{e}");
        let e = Glr::from_json("kth-order", &serde_json::json!({"order": 0}), resolve).unwrap_err();
        assert!(e.to_string().contains("got 0"), "{e}");
        let e = Glr::from_json("glr", &serde_json::json!({"on": "c"}), resolve).unwrap_err().to_string();
        assert!(e.contains("unknown variant `c`"), "{e}");
    }

    #[test]
    fn garbage_only_in_inactive_slots() {
        let g = Glr::from_json("glr", &serde_json::json!({"on": "both"}), resolve).unwrap();
        let dims: Dims = [("B", 1), ("T", 9), ("C", 2)].into_iter().collect();
        let inp = g.random_inputs(&dims, 3).unwrap();
        let beta = &inp["beta"];
        assert_eq!(beta.shape(), [1, 9, 4, 2]);
        assert_eq!(inp["alpha"].shape(), [1, 9, 5, 2]);
        for t in 0..9 {
            for k in 0..4 {
                let inactive = pow2(k) > t as u64;
                assert_eq!(beta[[0, t, k, 0]].abs() == 1e6, inactive, "t={t} k={k}");
                assert_eq!(inp["alpha"][[0, t, k + 1, 1]].abs() == 1e6, inactive);
            }
            let s: f64 = (0..4).filter(|&k| pow2(k) <= t as u64).map(|k| beta[[0, t, k, 0]].abs()).sum();
            assert!(s <= 0.95 + 1e-12);
        }
    }
}
