//! The log-linear attention family (docs/math.md §2): the base mixers `linear-attention`,
//! `mamba2`, `gated-deltanet`, and their lifts by a level mask (`loglinear-*`).
//!
//! Per batch row and head, with `q_t, k_t ∈ ℝ^(D_k)`, `v_t ∈ ℝ^(D_v)`,
//! log-decays `g_t ≤ 0` and `G_t = Σ_{r ≤ t} g_r`, every member is causal and linear in
//! `v` with `B = 0`:
//! `y_t = Σ_{s ≤ t} A_{t,s} v_s .`
//! - `linear-attention`: `A_{t,s} = σ q_t · k_s`;
//! - `mamba2`: `A_{t,s} = σ (q_t · k_s) e^(G_t − G_s)`;
//! - `gated-deltanet`: state `S_t = e^(g_t) S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ`,
//!   `y_t = σ S_t q_t`, so `A_{t,s} = σ β_s k_sᵀ Φ_{s+1..t} q_t` with
//!   `Φ_{s+1..t} = Π_{r=s+1}^t e^(g_r)(I − β_r k_r k_rᵀ)` (left to right);
//!
//! where `σ` is the config `scale` (default 1). The lift by a level mask `ℓ(t,s)`
//! (default Fenwick, docs/math.md §2.2) weights every contribution by a per-token, per-level
//! `λ_t^(ℓ(t,s)) ≥ 0` (docs/math.md §2.3):
//! `A^(lift)_{t,s} = λ_t^(ℓ(t,s)) A_{t,s} .`
//! For gated DeltaNet the transition acts on every level's state; only the inputs are
//! bucketed, which is exactly this elementwise weighting of the base `A`.
//!
//! ## λ schemes (config `lambda_scheme`, docs/math.md §2.4)
//! The `lambda` input holds raw values; the weight actually used is
//! `λ_{t,h,ℓ} = map(raw_{t,h,ℓ}, p_{h,ℓ})` with the scheme's registered
//! map and its learnable per-(head, level) parameter `p`, given as the optional input
//! `lambda_param [H, L]` (absent: its initial value 1). With `identity` (default) the input
//! is used as given and must be `≥ 0`; with any other scheme (`softplus`, `ones`, a plugin's)
//! the raw input only has to be finite, and the mapped weights must come out finite and
//! `≥ 0` (checked at run time, with an error naming the scheme otherwise).
//!
//! ## Config
//! `scale` (finite, default 1), `chunk` (power of two, default 64: the chunk size of the
//! fast form, docs/math.md §2.6), and for the lifted mixers `mask` (a registered level mask, default
//! `"fenwick"`) and `lambda_scheme` (default `"identity"`).

use std::borrow::Cow;
use std::sync::Arc;

use ndarray::{Array2, ArrayD, ArrayView3, ArrayView4, Ix3, Ix4};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::materialize::Materialization;
use crate::mixer::Mixer;
use crate::real::Real;
use crate::spec::{Bound, Constraint, Dim, Dims, DimsExt, Gen, InputDecl, InputSpec};
use crate::tensor::{Tensors, get};

pub mod lift_state;
pub mod state;
mod vjp;

/// The name of the base mixers' state tensor `S` (and of the lifts' level states, [`lift_state`]).
pub const STATE: &str = "S";

/// The registered names of the family's six members: the three base mixers (docs/math.md
/// §2.1), then their Fenwick lifts `loglinear-*` (§2.3).
pub const MEMBERS: [&str; 6] = [
    "linear-attention",
    "mamba2",
    "gated-deltanet",
    "loglinear-attention",
    "loglinear-mamba2",
    "loglinear-gated-deltanet",
];

/// The base mixer of a member of the family (docs/math.md §2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Base {
    /// `A_{t,s} = q_t · k_s`.
    LinearAttention,
    /// `A_{t,s} = (q_t · k_s) e^(G_t − G_s)` (SSD form of Mamba-2).
    Mamba2,
    /// Gated delta rule, `A_{t,s} = β_s k_sᵀ Φ_{s+1..t} q_t`.
    GatedDeltaNet,
}

impl Base {
    /// The base mixer's registered name.
    pub fn name(self) -> &'static str {
        match self {
            Base::LinearAttention => "linear-attention",
            Base::Mamba2 => "mamba2",
            Base::GatedDeltaNet => "gated-deltanet",
        }
    }
    /// Whether the mixer takes the log-decay `g`.
    pub fn has_decay(self) -> bool {
        !matches!(self, Base::LinearAttention)
    }
    /// Whether the mixer takes the delta-rule strength `beta`.
    pub fn has_beta(self) -> bool {
        matches!(self, Base::GatedDeltaNet)
    }
}

/// A level mask resolved from the registry: `ℓ(t, s)` for `s ≤ t` and the number of
/// levels `L(T)` needed for length `T`.
#[derive(Clone, Copy, Debug)]
pub struct LevelMask {
    /// Registered name (`"fenwick"`, or a plugin's).
    pub name: &'static str,
    /// `ℓ(t, s)`, `s ≤ t`; must be `< levels(T)` for `t < T`.
    pub level: fn(usize, usize) -> usize,
    /// `L(T)`.
    pub levels: fn(usize) -> usize,
}

impl LevelMask {
    /// The Fenwick mask of docs/math.md §2.2.
    pub fn fenwick() -> Self {
        LevelMask { name: "fenwick", level: crate::fenwick::level, levels: crate::fenwick::num_levels }
    }
    /// Whether this is the Fenwick mask (the only one with a chunked and a recurrent form).
    pub fn is_fenwick(&self) -> bool {
        self.name == "fenwick"
    }
}

/// The partial derivatives `(∂λ/∂raw, ∂λ/∂param)`
/// of a λ scheme's map at `(raw, param)`.
pub type LambdaGradFn = fn(f64, f64) -> (f64, f64);

/// A λ scheme resolved from the registry: `λ = map(raw, p_{h,ℓ})` with
/// the per-(head, level) parameter `p` from the optional input `lambda_param [H, L]`
/// (default 1 everywhere).
#[derive(Clone, Copy, Debug)]
pub struct LambdaScheme {
    /// Registered name (`"identity"`, `"softplus"`, `"ones"`, or a plugin's).
    pub name: &'static str,
    /// `map(raw, param)`.
    pub map: fn(f64, f64) -> f64,
    /// Its partial derivatives, when registered (needed by every backward pass).
    pub grad: Option<LambdaGradFn>,
}

impl LambdaScheme {
    /// The identity scheme (λ = raw).
    pub fn identity() -> Self {
        fn id(raw: f64, _p: f64) -> f64 {
            raw
        }
        fn did(_raw: f64, _p: f64) -> (f64, f64) {
            (1.0, 0.0)
        }
        LambdaScheme { name: "identity", map: id, grad: Some(did) }
    }
    /// Whether the scheme is the identity (λ input used as given).
    pub fn is_identity(&self) -> bool {
        self.name == "identity"
    }
}

/// The lift of a base mixer (docs/math.md §2.3): its mask and λ scheme.
#[derive(Clone, Copy, Debug)]
pub struct Lift {
    /// Level mask.
    pub mask: LevelMask,
    /// λ scheme.
    pub lambda: LambdaScheme,
}

/// The JSON configuration (unknown fields are rejected).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogLinearConfig {
    /// Output scale σ (default 1).
    #[serde(default = "default_scale")]
    pub scale: f64,
    /// Chunk size of the fast form (power of two, default 64).
    #[serde(default = "default_chunk")]
    pub chunk: usize,
    /// Level mask (lifted mixers only; default `"fenwick"`).
    #[serde(default)]
    pub mask: Option<String>,
    /// λ scheme (lifted mixers only; default `"identity"`).
    #[serde(default)]
    pub lambda_scheme: Option<String>,
}

fn default_scale() -> f64 {
    1.0
}
fn default_chunk() -> usize {
    64
}

impl LogLinearConfig {
    /// Parses a JSON config (`{}` gives the defaults).
    pub fn parse(mixer: &str, cfg: &serde_json::Value) -> Result<Self> {
        let cfg = if cfg.is_null() { serde_json::json!({}) } else { cfg.clone() };
        serde_json::from_value(cfg).map_err(|e| Error::config(mixer, e.to_string()))
    }
}

/// A configured member of the family. Backends downcast `&dyn Mixer` to this.
#[derive(Clone, Debug)]
pub struct LogLinear {
    /// Registered name.
    pub name: String,
    /// Base mixer.
    pub base: Base,
    /// The lift (`None` for the base mixers).
    pub lift: Option<Lift>,
    /// Output scale σ.
    pub scale: f64,
    /// Chunk size `C = 2^c` of the fast form.
    pub chunk: usize,
}

/// Largest accepted chunk size.
pub const MAX_CHUNK: usize = 1 << 16;

impl LogLinear {
    /// A configured mixer; checks `scale` (finite) and `chunk` (a power of two in
    /// `[1, 65536]`).
    pub fn new(name: &str, base: Base, lift: Option<Lift>, scale: f64, chunk: usize) -> Result<Self> {
        if !scale.is_finite() {
            return Err(Error::config(name, format!("`scale` must be finite, got {scale}")));
        }
        if chunk == 0 || !chunk.is_power_of_two() || chunk > MAX_CHUNK {
            return Err(Error::config(
                name,
                format!("`chunk` must be a power of two in [1, {MAX_CHUNK}], got {chunk}"),
            ));
        }
        Ok(LogLinear { name: name.to_string(), base, lift, scale, chunk })
    }

    /// `c = log_2 C`.
    pub fn chunk_log2(&self) -> u32 {
        self.chunk.trailing_zeros()
    }

    /// Number of λ levels needed for length `t_len` (1 for the base mixers).
    pub fn levels(&self, t_len: usize) -> usize {
        self.lift.map_or(1, |l| (l.mask.levels)(t_len))
    }

    /// Whether the level mask is Fenwick (or there is none): the chunked and recurrent forms
    /// exist only then.
    pub fn has_fenwick_structure(&self) -> bool {
        self.lift.is_none_or(|l| l.mask.is_fenwick())
    }

    /// The weights `λ_{b,t,h,ℓ} = map(raw_{b,t,h,ℓ}, p_{h,ℓ})` of the λ
    /// scheme, for a raw `lambda [B,T,H,L]` (or one token's `[B,H,L]`) and the optional `lambda_param [H, L]` (`None` =
    /// 1 everywhere). The identity scheme returns the input unchanged; other schemes must
    /// produce finite, non-negative weights, or an error names the scheme.
    pub fn lambda_weights<F: Real>(&self, raw: &ArrayD<F>, param: Option<&ArrayD<F>>) -> Result<ArrayD<F>> {
        self.lambda_weights_ref(raw, param).map(Cow::into_owned)
    }

    /// [`LogLinear::lambda_weights`], borrowing the input for the identity scheme instead of
    /// copying it.
    pub fn lambda_weights_ref<'a, F: Real>(
        &self,
        raw: &'a ArrayD<F>,
        param: Option<&ArrayD<F>>,
    ) -> Result<Cow<'a, ArrayD<F>>> {
        let Some(lift) = self.lift else {
            return Err(Error::config(&self.name, "this mixer takes no `lambda`"));
        };
        if lift.lambda.is_identity() {
            return Ok(Cow::Borrowed(raw));
        }
        let param_at = self.lambda_param_reader(raw, param)?;
        let mut out = raw.clone();
        for (ix, x) in out.indexed_iter_mut() {
            let r = raw[&ix];
            let n = ndarray::Dimension::ndim(&ix);
            let p = param_at(ix[n - 2], ix[n - 1]);
            let w = (lift.lambda.map)(r.f64(), p);
            if !(w.is_finite() && w >= 0.0) {
                return Err(Error::Value {
                    name: "lambda".into(),
                    constraint: format!(
                        "λ scheme `{}` must map raw values to finite weights ≥ 0",
                        lift.lambda.name
                    ),
                    found: format!("map({r}, {p}) = {w}"),
                });
            }
            *x = F::of(w);
        }
        Ok(Cow::Owned(out))
    }

    /// The parameter `p_{h,ℓ}` as a function of `(h, ℓ)`, after checking that
    /// `lambda_param` is `[H, L]` for a `lambda [B,T,H,L]` (or a decoder's token `[B,H,L]`).
    fn lambda_param_reader<'a, F: Real>(
        &self,
        raw: &ArrayD<F>,
        param: Option<&'a ArrayD<F>>,
    ) -> Result<impl Fn(usize, usize) -> f64 + 'a> {
        lambda_shape(raw.shape(), param.map(|p| p.shape()))?;
        Ok(move |h: usize, l: usize| param.map_or(1.0, |p| p[[h, l]].f64()))
    }

    /// The backward of [`LogLinear::lambda_weights`]: from the gradient `d_weights` of the
    /// weights, the gradients of the raw `lambda` (`λ̄ · ∂_{raw}map`)
    /// and of `lambda_param` (`Σ_{b,t} λ̄ · ∂_p map`, when it
    /// was given). Errors when the scheme has no registered derivative.
    pub fn lambda_vjp<F: Real>(
        &self,
        raw: &ArrayD<F>,
        param: Option<&ArrayD<F>>,
        d_weights: &ArrayD<F>,
    ) -> Result<(ArrayD<F>, Option<ArrayD<F>>)> {
        let Some(lift) = self.lift else {
            return Err(Error::config(&self.name, "this mixer takes no `lambda`"));
        };
        if lift.lambda.is_identity() {
            return Ok((d_weights.clone(), None));
        }
        let Some(dmap) = lift.lambda.grad else {
            return Err(Error::config(
                &self.name,
                format!(
                    "λ scheme `{}` has no registered derivative, so no gradient flows through it \
                     (register a `LambdaGradEntry` for it)",
                    lift.lambda.name
                ),
            ));
        };
        let param_at = self.lambda_param_reader(raw, param)?;
        let mut d_raw = d_weights.clone();
        let mut d_param = param.map(|p| ArrayD::<F>::zeros(p.raw_dim()));
        for (ix, x) in d_raw.indexed_iter_mut() {
            let n = ndarray::Dimension::ndim(&ix);
            let (h, l) = (ix[n - 2], ix[n - 1]);
            let (dr, dp) = dmap(raw[&ix].f64(), param_at(h, l));
            let g = d_weights[&ix].f64();
            *x = F::of(g * dr);
            if let Some(d) = d_param.as_mut() {
                d[[h, l]] += F::of(g * dp);
            }
        }
        Ok((d_raw, d_param))
    }

    /// The level `ℓ(t,s)` of the mask, checked against the number of λ levels given.
    pub fn level_checked(&self, t: usize, s: usize, given: usize) -> Result<usize> {
        let lift = self.lift.ok_or_else(|| Error::config(&self.name, "no level mask"))?;
        let l = (lift.mask.level)(t, s);
        if l >= given {
            return Err(self.level_error(t, s, l, given));
        }
        Ok(l)
    }

    /// The error for a level `l = ℓ(t, s)` beyond the `given` λ levels.
    pub fn level_error(&self, t: usize, s: usize, l: usize, given: usize) -> Error {
        Error::Value {
            name: "lambda".into(),
            constraint: format!(
                "mask `{}` puts s = {s} at level {l} of t = {t}, so λ needs more than {l} levels",
                self.lift.map_or("none", |x| x.mask.name)
            ),
            found: format!("L = {given}"),
        }
    }
}

/// The sizes a decoder of the family works with (every backend's), from the bound dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderSizes {
    /// `B`.
    pub nb: usize,
    /// `H`.
    pub nh: usize,
    /// `Dk`.
    pub dk: usize,
    /// `Dv`.
    pub dv: usize,
    /// λ levels per token: `L` for the lifts, 1 for the base mixers.
    pub n_levels: usize,
    /// Tokens the decoder is built for (`T`).
    pub t_len: usize,
}

impl LogLinear {
    /// The sizes of a decoder of this member at `dims` (`B`, `H`, `Dk`, `Dv`, `T`, and `L`
    /// for the lifts).
    pub fn decoder_sizes(&self, dims: &Dims) -> Result<DecoderSizes> {
        let (nb, nh, dk, dv) = (dims.size("B")?, dims.size("H")?, dims.size("Dk")?, dims.size("Dv")?);
        let n_levels = if self.lift.is_some() { dims.size("L")? } else { 1 };
        Ok(DecoderSizes { nb, nh, dk, dv, n_levels, t_len: dims.size("T")? })
    }
}

/// The `f64` views of the coefficient inputs of one call (`g`, `beta` zero when absent).
pub(crate) struct Views<'a> {
    pub(crate) q: ArrayView4<'a, f64>,
    pub(crate) k: ArrayView4<'a, f64>,
    pub(crate) g: ArrayView3<'a, f64>,
    pub(crate) beta: ArrayView3<'a, f64>,
}

impl LogLinear {
    /// The base mixer's `T×T` matrix `A_{t,s}` (scale included, no λ) of batch row `b`,
    /// head `h` (MATH §2.1).
    pub(crate) fn base_matrix(&self, x: &Views<'_>, b: usize, h: usize) -> Array2<f64> {
        let (q, k, g, beta) = (&x.q, &x.k, &x.g, &x.beta);
        let (_, t_len, _, dk) = q.dim();
        let mut a = Array2::<f64>::zeros((t_len, t_len));
        let mut w = vec![0.0; dk];
        for t in 0..t_len {
            let qt = q.slice(ndarray::s![b, t, h, ..]);
            match self.base {
                Base::LinearAttention => {
                    for s in 0..=t {
                        a[[t, s]] = self.scale * qt.dot(&k.slice(ndarray::s![b, s, h, ..]));
                    }
                }
                Base::Mamba2 => {
                    // Σ_{r=s+1..t} g_r, accumulated from t downwards (no cancellation).
                    let mut cum = 0.0f64;
                    for s in (0..=t).rev() {
                        let qk = qt.dot(&k.slice(ndarray::s![b, s, h, ..]));
                        a[[t, s]] = self.scale * qk * cum.exp();
                        cum += g[[b, s, h]];
                    }
                }
                Base::GatedDeltaNet => {
                    // w = Φ_{s+1..t} q_t, built from s = t downwards.
                    for (d, wd) in w.iter_mut().enumerate() {
                        *wd = self.scale * qt[d];
                    }
                    for s in (0..=t).rev() {
                        let ks = k.slice(ndarray::s![b, s, h, ..]);
                        let kw: f64 = (0..dk).map(|d| ks[d] * w[d]).sum();
                        let bs = beta[[b, s, h]];
                        a[[t, s]] = bs * kw;
                        let decay = g[[b, s, h]].exp();
                        for d in 0..dk {
                            w[d] = decay * (w[d] - bs * ks[d] * kw);
                        }
                    }
                }
            }
        }
        a
    }
}

fn dims4(last: &'static str) -> Vec<Dim> {
    vec![Dim::Sym("B"), Dim::Sym("T"), Dim::Sym("H"), Dim::Sym(last)]
}

pub(crate) fn view3<'a>(x: &'a Tensors<f64>, name: &str) -> Result<ArrayView3<'a, f64>> {
    get(x, name)?.view().into_dimensionality::<Ix3>().map_err(|e| Error::shape(name, "rank 3", e.to_string()))
}

pub(crate) fn view4<'a>(x: &'a Tensors<f64>, name: &str) -> Result<ArrayView4<'a, f64>> {
    get(x, name)?.view().into_dimensionality::<Ix4>().map_err(|e| Error::shape(name, "rank 4", e.to_string()))
}

impl Mixer for LogLinear {
    fn name(&self) -> &str {
        &self.name
    }
    /// `D_k D_v` per state and (batch, head): one state for the base mixers; for the lifts the
    /// occupied Fenwick levels after token `t = n − 1`, `1 + popcount(t)`
    /// (MATH §2.5). A decoder may drop a state that decayed below the smallest normal number;
    /// test inputs do not decay that far.
    fn decoder_cache(&self, dims: &Dims, consumed: usize) -> Option<usize> {
        let (b, h, dk, dv) = (*dims.get("B")?, *dims.get("H")?, *dims.get("Dk")?, *dims.get("Dv")?);
        let t = consumed.checked_sub(1)?;
        let states = match self.lift {
            None => 1,
            Some(_) => crate::fenwick::occupied_levels(t).count_ones() as usize,
        };
        Some(states * b * h * dk * dv)
    }
    fn family(&self) -> &'static str {
        "loglinear"
    }
    fn config(&self) -> serde_json::Value {
        let mut c = serde_json::json!({ "scale": self.scale, "chunk": self.chunk });
        if let Some(l) = self.lift {
            c["mask"] = l.mask.name.into();
            c["lambda_scheme"] = l.lambda.name.into();
        }
        c
    }
    fn spec(&self) -> InputSpec {
        let gdn = self.base == Base::GatedDeltaNet;
        let bth = vec![Dim::Sym("B"), Dim::Sym("T"), Dim::Sym("H")];
        let mut inputs = vec![
            InputDecl::new("q", dims4("Dk")),
            InputDecl::new("k", dims4("Dk")).sample(if gdn { Gen::UnitNorm(3) } else { Gen::Normal(1.0) }),
            InputDecl::new("v", dims4("Dv")),
        ];
        if self.base.has_decay() {
            inputs.push(
                InputDecl::new("g", bth.clone())
                    .constraint(Constraint::NonPositive)
                    .sample(Gen::LogDecay(0.1)),
            );
        }
        if self.base.has_beta() {
            inputs.push(
                InputDecl::new("beta", bth)
                    .constraint(Constraint::UnitInterval)
                    .sample(Gen::Uniform(0.0, 1.0)),
            );
        }
        if let Some(l) = self.lift {
            let (c, g) = if l.lambda.is_identity() {
                (Constraint::NonNegative, Gen::Uniform(0.0, 1.5))
            } else {
                (Constraint::Finite, Gen::Normal(1.0))
            };
            inputs.push(InputDecl::new("lambda", dims4("L")).constraint(c).sample(g));
            if !l.lambda.is_identity() {
                inputs.push(
                    InputDecl::new("lambda_param", vec![Dim::Sym("H"), Dim::Sym("L")])
                        .fixed()
                        .optional()
                        .sample(Gen::Uniform(0.5, 1.5)),
                );
            }
        }
        InputSpec { inputs, mixed: "v" }
    }
    fn bounds(&self, dims: &Dims) -> Vec<(&'static str, Bound, &'static str)> {
        match (self.lift, dims.get("T")) {
            (Some(_), Some(&t)) => {
                vec![(
                    "L",
                    Bound::AtLeast(self.levels(t)),
                    "λ needs one value per level of the mask at length T",
                )]
            }
            _ => Vec::new(),
        }
    }
    fn materialize(&self, inputs: &Tensors<f64>) -> Result<Materialization> {
        let q = view4(inputs, "q")?;
        let k = view4(inputs, "k")?;
        let v = view4(inputs, "v")?;
        let (nb, t_len, nh, _) = q.dim();
        let dv = v.dim().3;
        if k.dim() != q.dim() {
            return Err(Error::shape("k", format!("{:?} (as q)", q.dim()), format!("{:?}", k.dim())));
        }
        let zeros = ndarray::Array3::<f64>::zeros((nb, t_len, nh));
        let g = if self.base.has_decay() { view3(inputs, "g")? } else { zeros.view() };
        let beta = if self.base.has_beta() { view3(inputs, "beta")? } else { zeros.view() };
        let lam = match self.lift {
            Some(_) => Some(self.lambda_weights(get(inputs, "lambda")?, inputs.get("lambda_param"))?),
            None => None,
        };
        let n_levels = lam.as_ref().map_or(1, |l| l.shape()[3]);
        let mut mat = Materialization::new(t_len);
        for b in 0..nb {
            for h in 0..nh {
                let mut a = self.base_matrix(&Views { q, k, g, beta }, b, h);
                if let Some(lam) = &lam {
                    for t in 0..t_len {
                        for s in 0..=t {
                            let l = self.level_checked(t, s, n_levels)?;
                            a[[t, s]] *= lam[[b, t, h, l]];
                        }
                    }
                }
                mat.push(b, h * dv..(h + 1) * dv, Arc::new(a), None);
            }
        }
        Ok(mat)
    }
    materialized_vjp!(vjp::materialized_vjp);
    fn state_shapes(&self, dims: &Dims) -> std::result::Result<crate::state::StateShapes, String> {
        state::shapes(self, dims)
    }
    fn state_sizes(&self, dims: &Dims, given: Option<&crate::state::StateShapes>) -> Dims {
        state::cache(self).map(|c| c.sizes(dims, given)).unwrap_or_default()
    }
    fn random_state(&self, dims: &Dims, seed: u64) -> Result<Tensors<f64>> {
        if let Some(c) = state::cache(self) {
            // Room for 5 cached tokens before the run, as many as the λ levels `L` reach: a run
            // of `T` tokens after `a` needs `L ≥ L(a + T)`.
            let t_len = dims.get("T").copied().unwrap_or(0);
            let mut d = dims.clone();
            d.insert(crate::mixers::cache::CAPACITY, t_len + 5);
            let shapes = self.state_shapes(&d).map_err(|why| crate::state::no_state(&self.name, &why))?;
            let nl = dims.get("L").copied().unwrap_or(0);
            let reach = (0..=5).take_while(|&a| self.levels(a + t_len) <= nl).last().unwrap_or(0);
            return c.random_state(&shapes, seed, reach);
        }
        let shapes = self.state_shapes(dims).map_err(|why| crate::state::no_state(&self.name, &why))?;
        let s = crate::state::random(&shapes, seed);
        match self.lift {
            Some(_) => lift_state::random_state(dims, s),
            None => Ok(s),
        }
    }
    state_oracle!(state);
    fn form_unsupported(&self, form: crate::Form) -> Option<String> {
        let needs_fenwick = matches!(form, crate::Form::Fast | crate::Form::Recurrent);
        (needs_fenwick && !self.has_fenwick_structure())
            .then(|| format!("the {form} form needs the Fenwick mask (the chunked and O(log T) recurrent algorithms use its structure)"))
    }

    fn working_memory(&self, form: crate::Form, dims: &crate::Dims, elem: f64) -> f64 {
        crate::memory::loglinear(form, dims, elem, self.base.has_beta(), self.chunk)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The `(H, L)` of raw λ of shape `[…, H, L]`, after checking that `lambda_param`, when given,
/// is `[H, L]`: the shape rule every backend's λ map applies.
pub fn lambda_shape(raw: &[usize], param: Option<&[usize]>) -> Result<(usize, usize)> {
    let n = raw.len();
    if n < 2 {
        return Err(Error::shape("lambda", "[…, H, L]", crate::error::fmt_shape(raw)));
    }
    let (nh, nl) = (raw[n - 2], raw[n - 1]);
    if let Some(p) = param
        && p != [nh, nl]
    {
        return Err(Error::shape(
            "lambda_param",
            format!("[H, L] = [{nh}, {nl}] (as `lambda`)"),
            crate::error::fmt_shape(p),
        ));
    }
    Ok((nh, nl))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mixer::complete_dims;

    fn dims(t: usize) -> Dims {
        [("B", 2), ("T", t), ("H", 2), ("Dk", 3), ("Dv", 2)].into_iter().collect()
    }

    fn lifted(base: Base) -> LogLinear {
        let lift = Lift { mask: LevelMask::fenwick(), lambda: LambdaScheme::identity() };
        LogLinear::new("x", base, Some(lift), 0.7, 16).unwrap()
    }

    /// The GDN materialization against the literal state recurrence of docs/math.md §2.1/§2.5
    /// (levels kept separately, λ read per level).
    #[test]
    fn gated_deltanet_materialization_matches_level_recurrence() {
        let m = lifted(Base::GatedDeltaNet);
        let t_len = 23;
        let d = complete_dims(&m, &dims(t_len));
        let x = m.random_inputs(&d, 3).unwrap();
        let mat = m.materialize(&x).unwrap();
        let y = crate::oracle::solve(&mat, &x["v"]).unwrap();
        let (q, k, v, g, beta, lam) = (&x["q"], &x["k"], &x["v"], &x["g"], &x["beta"], &x["lambda"]);
        for b in 0..2 {
            for h in 0..2 {
                // states[l] is Dv×Dk.
                let mut st: Vec<Array2<f64>> = Vec::new();
                for t in 0..t_len {
                    if t >= 1 {
                        let mm = t.trailing_zeros() as usize;
                        while st.len() < mm + 2 {
                            st.push(Array2::zeros((2, 3)));
                        }
                        let mut sum = Array2::zeros((2, 3));
                        for l in 0..=mm {
                            sum += &st[l];
                            st[l].fill(0.0);
                        }
                        st[mm + 1] += &sum;
                    }
                    if st.is_empty() {
                        st.push(Array2::zeros((2, 3)));
                    }
                    let kt: Vec<f64> = (0..3).map(|i| k[[b, t, h, i]]).collect();
                    let bt = beta[[b, t, h]];
                    let e = g[[b, t, h]].exp();
                    for s in st.iter_mut() {
                        let sk: Vec<f64> = (0..2).map(|r| (0..3).map(|c| s[[r, c]] * kt[c]).sum()).collect();
                        for r in 0..2 {
                            for c in 0..3 {
                                s[[r, c]] = e * (s[[r, c]] - bt * sk[r] * kt[c]);
                            }
                        }
                    }
                    for r in 0..2 {
                        for c in 0..3 {
                            st[0][[r, c]] = bt * v[[b, t, h, r]] * kt[c];
                        }
                    }
                    for r in 0..2 {
                        let mut want = 0.0;
                        for (l, s) in st.iter().enumerate() {
                            let sq: f64 = (0..3).map(|c| s[[r, c]] * q[[b, t, h, c]]).sum();
                            want += 0.7 * lam[[b, t, h, l]] * sq;
                        }
                        let got = y[[b, t, h, r]];
                        assert!((got - want).abs() < 1e-10 * (1.0 + want.abs()), "t={t}: {got} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn bounds_and_config() {
        let m = lifted(Base::Mamba2);
        assert_eq!(m.bounds(&dims(65)), vec![("L", Bound::AtLeast(8), m.bounds(&dims(65))[0].2)]);
        assert_eq!(m.config()["mask"], "fenwick");
        assert!(LogLinear::new("x", Base::Mamba2, None, 1.0, 48).is_err());
        assert!(LogLinear::new("x", Base::Mamba2, None, f64::NAN, 64).is_err());
        let names: Vec<&str> = m.spec().inputs.iter().map(|d| d.name).collect();
        assert_eq!(names, ["q", "k", "v", "g", "lambda"]);
    }
}
