//! The token-mixing layer of a block: the coefficients of one registered mixer made from the
//! (normalised) layer input `u [N·T, D]`, the mixer's fast form on the CPU, and an output
//! projection. The backward runs the mixer's fast backward form through
//! [`mixer_registry::backward::backward`] and maps its input gradients back to the layer's
//! parameters.
//!
//! | family | coefficients |
//! |---|---|
//! | attention | `q, k, v = u·W_q, u·W_k, u·W_v` (`H` heads of `D/H`) |
//! | glr (`on = "b"`) | `x = u·W_x`, `alpha = σ(u·W_α + b_α)`, `beta[t,k] = γ_t · softmax_{k : f(k) ≤ t}(σ q_t·k_{d_k(t)} + b_k)` per head (`q, k` projections of `u`, `σ = 1/√(D/H)`, a learned bias per slot), `γ = σ(u·W_γ + b_γ)`, so `Σ_k |β| ≤ 1` |
//! | glr (`on = "a"`) | `x = u·W_x`, `alpha[t, ·] = softmax` over the token itself (entry 0) and its active slots of `σ q'_t·k'_s + b'` per head (its own `W_q', W_k'` and bias `[K+1, H]`): attention restricted to the pattern, no `beta` |
//! | glr (`on = "both"`) | the `alpha` of `"a"` and the `beta` of `"b"` |
//! | mamba2, linear attention | `q, k, v` projections, `g = −e^{a_h} · softplus(u·W_g + b_g)` |
//! | gated DeltaNet | the above with `q, k` L2-normalised per head, `beta = σ(u·W_b + b_b)` |
//! | log-linear lifts | the base's, and `lambda = u·W_λ + b_λ` with the `softplus` λ scheme and its learnable `lambda_param [H, L]` (init 1) |
//! | toeplitz | `x = u·W_x`; the taps `w [H, T]` are parameters |

use mixer_core::grad::{Requires, SAVED_OUTPUT};
use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::pattern::Slots;
use mixer_core::{AnyTensors, Error, Form, Result, Tensor, Tensors};
use mixer_registry::Backend;
use ndarray::{Array2, ArrayD, Axis, IxDyn};
use serde_json::Value;

use super::nn;
use super::params::{Init, ParamSpec, Params, acc1, acc2, mat, vec1};
use super::slot_softmax::{self as slot, Dims, SlotSet};
use mixer_core::mixers::glr::On;

/// The backend a layer runs its mixer on unless told otherwise ([`MixerLayer::on_backend`]).
pub const BACKEND: &str = "cpu";

#[derive(Clone, Debug)]
enum Kind {
    Attention,
    Glr { slots: Slots, on: On },
    Ssd { gdn: bool, lift: Option<usize> },
    Toeplitz { kw: usize },
}

/// One side of the GLR layer's slot weights (docs/training.md): its projections and bias, the
/// names under which the forward keeps its `q`, `k` and weights, and whether the token itself is
/// entry 0 (the pattern on `A`).
struct Side {
    wq: &'static str,
    wk: &'static str,
    bias: &'static str,
    q: &'static str,
    k: &'static str,
    probs: &'static str,
    with_self: bool,
}

/// `alpha` with the pattern on `A`: attention over the token itself and its slots.
const SIDE_A: Side =
    Side { wq: "wqa", wk: "wka", bias: "slot_bias_a", q: "qa", k: "ka", probs: "probs_a", with_self: true };
/// `beta` with the pattern on `B`: the softmax over the slots of the past outputs read (times `γ`).
const SIDE_B: Side =
    Side { wq: "wq", wk: "wk", bias: "slot_bias", q: "q", k: "k", probs: "probs", with_self: false };

impl Side {
    /// The side's entries of each row over the pattern's `slots`.
    fn set<'a>(&self, slots: &'a Slots) -> SlotSet<'a> {
        SlotSet { slots, with_self: self.with_self }
    }
}

/// One mixer layer of a model: its mixer, sizes and parameter names under `prefix`.
pub struct MixerLayer {
    mixer: Box<dyn Mixer>,
    kind: Kind,
    prefix: String,
    d: usize,
    h: usize,
    t: usize,
    backend: Backend,
}

impl std::fmt::Debug for MixerLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MixerLayer({}, {:?})", self.mixer.name(), self.kind)
    }
}

/// What the forward pass keeps for the backward pass.
pub struct LayerCache {
    u: Array2<f64>,
    inputs: Tensors<f64>,
    y: Array2<f64>,
    /// Pre-activations and derived values by name (gates, normalised q/k, softmax weights).
    aux: Tensors<f64>,
}

fn to_array(t: Tensor) -> ArrayD<f64> {
    t.to_f64()
}

fn reshape(a: Array2<f64>, shape: &[usize]) -> Result<ArrayD<f64>> {
    a.into_shape_with_order(IxDyn(shape)).map_err(|e| Error::Io(format!("internal reshape: {e}")))
}

fn flat(a: &ArrayD<f64>, cols: usize) -> Result<Array2<f64>> {
    let rows = a.len() / cols.max(1);
    a.as_standard_layout()
        .into_owned()
        .into_shape_with_order((rows, cols))
        .map_err(|e| Error::Io(format!("internal reshape: {e}")))
}

/// The mixer's JSON config with the model's defaults filled in: `heads` (Toeplitz), `scale`
/// `1/√(D/H)` (log-linear family), `lambda_scheme: "softplus"` (lifts).
pub fn effective_config(name: &str, cfg: &Value, heads: usize, width: usize) -> Value {
    let mut c = if cfg.is_object() { cfg.clone() } else { serde_json::json!({}) };
    let Some(o) = c.as_object_mut() else { return c };
    let dh = (width / heads.max(1)).max(1) as f64;
    match mixer_registry::mixer_entry(name).map(|e| e.family) {
        Ok("toeplitz") => {
            o.entry("heads").or_insert(heads.into());
        }
        Ok("loglinear") => {
            o.entry("scale").or_insert((1.0 / dh.sqrt()).into());
            if name.starts_with("loglinear-") {
                o.entry("lambda_scheme").or_insert("softplus".into());
            }
        }
        _ => {}
    }
    c
}

/// The backend `backend` when it is available here and has a `fast` backward for `mixer`.
fn trainable_on(mixer: &dyn Mixer, backend: &str) -> Result<Backend> {
    let b = Backend::by_name(backend)?;
    if !mixer_registry::backward::backward_forms(mixer, b.name()).contains(&Form::Fast) {
        return Err(Error::config(
            mixer.name(),
            format!("this configuration has no fast backward form on the {} backend", b.name()),
        ));
    }
    Ok(b)
}

impl MixerLayer {
    /// Builds the layer for mixer `name` with JSON `config` (defaults of
    /// [`effective_config`] filled in), width `d`, `h` heads and sequence length `t`.
    pub fn new(prefix: &str, name: &str, config: &Value, d: usize, h: usize, t: usize) -> Result<Self> {
        if h == 0 || !d.is_multiple_of(h) {
            return Err(Error::Io(format!("width {d} must be a positive multiple of heads {h}")));
        }
        let cfg = effective_config(name, config, h, d);
        let mixer = mixer_registry::mixer(name, &cfg)?;
        let kind = match mixer.family() {
            "attention" => Kind::Attention,
            "glr" => {
                let g = downcast::<mixer_core::mixers::glr::Glr>(mixer.as_ref(), BACKEND)?;
                Kind::Glr { slots: g.slots(t), on: g.on() }
            }
            "loglinear" => {
                let l = downcast::<LogLinear>(mixer.as_ref(), BACKEND)?;
                let lift = l.lift.map(|_| l.levels(t));
                Kind::Ssd { gdn: l.base == Base::GatedDeltaNet, lift }
            }
            "toeplitz" => {
                let tz = downcast::<Toeplitz>(mixer.as_ref(), BACKEND)?;
                tz.head_dim(d)?;
                Kind::Toeplitz { kw: tz.cfg.kernel_width }
            }
            other => {
                return Err(Error::config(
                    name,
                    format!(
                        "no training layer for the `{other}` family (attention, glr, loglinear, toeplitz)"
                    ),
                ));
            }
        };
        let backend = trainable_on(mixer.as_ref(), BACKEND)?;
        Ok(MixerLayer { mixer, kind, prefix: prefix.to_string(), d, h, t, backend })
    }

    /// Runs the layer's mixer, forward and backward, on `backend` (a registered backend's name,
    /// e.g. `cuda`: the mixer's inputs are the model's `f64` host arrays, which that backend takes
    /// to its device and back); an error when the backend is not available here or has no `fast`
    /// backward for this mixer.
    pub fn on_backend(&mut self, backend: &str) -> Result<()> {
        self.backend = trainable_on(self.mixer.as_ref(), backend)?;
        Ok(())
    }

    /// The backend the layer runs its mixer on.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The mixer.
    pub fn mixer(&self) -> &dyn Mixer {
        self.mixer.as_ref()
    }

    fn n(&self, s: &str) -> String {
        format!("{}.{s}", self.prefix)
    }

    fn heads_of_toeplitz(&self) -> usize {
        downcast::<Toeplitz>(self.mixer.as_ref(), BACKEND).map_or(1, |t| t.cfg.heads)
    }

    /// The layer's parameters.
    pub fn param_specs(&self, layers: usize) -> Vec<ParamSpec> {
        let (d, h, t) = (self.d, self.h, self.t);
        let m = |s: &str, cols: usize| ParamSpec::matrix(self.n(s), d, cols, 1.0);
        let mut v = Vec::new();
        match &self.kind {
            Kind::Attention => {
                v.extend([m("wq", d), m("wk", d), m("wv", d)]);
            }
            Kind::Glr { slots, on } => {
                v.push(m("wx", d));
                let weights = |v: &mut Vec<ParamSpec>, side: &Side| {
                    v.extend([m(side.wq, d), m(side.wk, d)]);
                    v.push(ParamSpec {
                        name: self.n(side.bias),
                        shape: vec![side.set(slots).len().max(1), h],
                        init: Init::Const(0.0),
                        decay: false,
                    });
                };
                if on.has_a() {
                    weights(&mut v, &SIDE_A);
                } else {
                    v.push(m("walpha", d));
                    v.push(ParamSpec::vector(self.n("balpha"), d, 0.0));
                }
                if on.has_b() {
                    weights(&mut v, &SIDE_B);
                    v.push(m("wgamma", h));
                    v.push(ParamSpec::vector(self.n("bgamma"), h, 1.0));
                }
            }
            Kind::Ssd { gdn, lift } => {
                v.extend([m("wq", d), m("wk", d), m("wv", d)]);
                v.push(ParamSpec::matrix(self.n("wg"), d, h, 0.1));
                // Δ = softplus(b_g) spread over the heads (slow to fast decay), a_h = 0.
                let bg = (0..h)
                    .map(|i| nn::softplus_inv(0.02 * 8f64.powf(i as f64 / h.max(2) as f64 * 2.0)))
                    .collect();
                v.push(ParamSpec {
                    name: self.n("bg"),
                    shape: vec![h],
                    init: Init::Values(bg),
                    decay: false,
                });
                v.push(ParamSpec::vector(self.n("a_log"), h, 0.0));
                if *gdn {
                    v.push(m("wb", h));
                    v.push(ParamSpec::vector(self.n("bb"), h, 0.0));
                }
                if let Some(l) = lift {
                    v.push(ParamSpec::matrix(self.n("wlambda"), d, h * l, 0.1));
                    v.push(ParamSpec::vector(self.n("blambda"), h * l, nn::softplus_inv(1.0)));
                    v.push(ParamSpec {
                        name: self.n("lambda_param"),
                        shape: vec![h, *l],
                        init: Init::Const(1.0),
                        decay: false,
                    });
                }
            }
            Kind::Toeplitz { kw } => {
                v.push(m("wx", d));
                let th = self.heads_of_toeplitz();
                // Taps: an identity tap at lag 0 plus a decaying average of the past.
                let mut w = Vec::with_capacity(kw * th * t);
                for i in 0..*kw {
                    for _ in 0..th {
                        for lag in 0..t {
                            let base = if i + 1 == *kw {
                                if lag == 0 { 1.0 } else { 0.5 / (lag as f64 + 1.0) }
                            } else {
                                0.0
                            };
                            w.push(base);
                        }
                    }
                }
                let shape = if *kw == 1 { vec![th, t] } else { vec![*kw, th, t] };
                v.push(ParamSpec { name: self.n("taps"), shape, init: Init::Values(w), decay: false });
            }
        }
        v.push(ParamSpec::matrix(self.n("wo"), d, d, 1.0 / (2.0 * layers as f64).sqrt()));
        v
    }

    /// `u [N·T, D]` → the layer's output `[N·T, D]` and what the backward needs.
    pub fn forward(&self, p: &Params, u: &Array2<f64>, n: usize) -> Result<(Array2<f64>, LayerCache)> {
        let (d, h, t) = (self.d, self.h, self.t);
        let dh = d / h;
        let mut inputs = Tensors::new();
        let mut aux = Tensors::new();
        let proj = |w: &str| -> Result<Array2<f64>> { Ok(nn::linear(u.view(), mat(p, &self.n(w))?)) };
        match &self.kind {
            Kind::Attention => {
                for (name, w) in [("q", "wq"), ("k", "wk"), ("v", "wv")] {
                    inputs.insert(name.into(), reshape(proj(w)?, &[n, t, h, dh])?);
                }
            }
            Kind::Glr { slots, on } => {
                inputs.insert("x".into(), reshape(proj("wx")?, &[n, t, d])?);
                let dims = Dims { n, t, h, dh };
                // A side's weights `[N·T, S·H]`; its `q` and `k` kept for the backward.
                let weights = |side: &Side, aux: &mut Tensors<f64>| -> Result<Array2<f64>> {
                    let (q, kk) = (proj(side.wq)?, proj(side.wk)?);
                    let probs = slot::weights(&q, &kk, mat(p, &self.n(side.bias))?, side.set(slots), dims);
                    aux.insert(side.q.into(), q.into_dyn());
                    aux.insert(side.k.into(), kk.into_dyn());
                    Ok(probs)
                };
                if on.has_a() {
                    let probs = weights(&SIDE_A, &mut aux)?;
                    inputs.insert("alpha".into(), slot::spread(&probs, None, dims));
                    aux.insert(SIDE_A.probs.into(), probs.into_dyn());
                } else {
                    let mut za = proj("walpha")?;
                    nn::add_bias(&mut za, &vec1(p, &self.n("balpha"))?);
                    inputs.insert("alpha".into(), reshape(za.mapv(nn::sigmoid), &[n, t, d])?);
                    aux.insert("alpha".into(), inputs["alpha"].clone());
                }
                if on.has_b() {
                    let probs = weights(&SIDE_B, &mut aux)?;
                    let mut zg = proj("wgamma")?;
                    nn::add_bias(&mut zg, &vec1(p, &self.n("bgamma"))?);
                    let gamma = zg.mapv(nn::sigmoid); // [N·T, H]
                    inputs.insert("beta".into(), slot::spread(&probs, Some(&gamma), dims));
                    aux.insert("gamma".into(), gamma.into_dyn());
                    aux.insert(SIDE_B.probs.into(), probs.into_dyn());
                }
            }
            Kind::Ssd { gdn, lift } => {
                let (mut q, mut k) = (proj("wq")?, proj("wk")?);
                if *gdn {
                    let (qn, qi) = nn::l2norm_groups(q.view(), dh);
                    let (kn, ki) = nn::l2norm_groups(k.view(), dh);
                    aux.insert("qn".into(), qn.clone().into_dyn());
                    aux.insert("qinv".into(), qi.into_dyn());
                    aux.insert("kn".into(), kn.clone().into_dyn());
                    aux.insert("kinv".into(), ki.into_dyn());
                    (q, k) = (qn, kn);
                }
                inputs.insert("q".into(), reshape(q, &[n, t, h, dh])?);
                inputs.insert("k".into(), reshape(k, &[n, t, h, dh])?);
                inputs.insert("v".into(), reshape(proj("wv")?, &[n, t, h, dh])?);
                let mut zg = proj("wg")?;
                nn::add_bias(&mut zg, &vec1(p, &self.n("bg"))?);
                let a = vec1(p, &self.n("a_log"))?.mapv(f64::exp);
                let mut g = zg.mapv(nn::softplus);
                g *= &a.mapv(|x| -x);
                inputs.insert("g".into(), reshape(g, &[n, t, h])?);
                aux.insert("zg".into(), zg.into_dyn());
                if *gdn {
                    let mut zb = proj("wb")?;
                    nn::add_bias(&mut zb, &vec1(p, &self.n("bb"))?);
                    let b = zb.mapv(nn::sigmoid);
                    aux.insert("beta".into(), b.clone().into_dyn());
                    inputs.insert("beta".into(), reshape(b, &[n, t, h])?);
                }
                if let Some(l) = lift {
                    let mut raw = proj("wlambda")?;
                    nn::add_bias(&mut raw, &vec1(p, &self.n("blambda"))?);
                    inputs.insert("lambda".into(), reshape(raw, &[n, t, h, *l])?);
                    let lp = p
                        .get(&self.n("lambda_param"))
                        .ok_or_else(|| Error::Io("missing lambda_param".into()))?;
                    inputs.insert("lambda_param".into(), lp.clone());
                }
            }
            Kind::Toeplitz { .. } => {
                inputs.insert("x".into(), reshape(proj("wx")?, &[n, t, d])?);
                let w = p.get(&self.n("taps")).ok_or_else(|| Error::Io("missing taps".into()))?;
                inputs.insert("w".into(), w.clone());
            }
        }
        let y = mixer_registry::run::run(
            self.mixer.as_ref(),
            &self.backend,
            Form::Fast,
            &AnyTensors::F64(inputs.clone()),
        )?;
        let y = flat(&to_array(y), d)?;
        let out = nn::linear(y.view(), mat(p, &self.n("wo"))?);
        Ok((out, LayerCache { u: u.clone(), inputs, y, aux }))
    }

    /// Backward: from `dout [N·T, D]`, adds the parameter gradients to `grads` and returns `du`.
    pub fn backward(
        &self,
        p: &Params,
        c: LayerCache,
        dout: &Array2<f64>,
        grads: &mut Params,
    ) -> Result<Array2<f64>> {
        let (d, h, t) = (self.d, self.h, self.t);
        let dh = d / h;
        let (dy, dwo) = nn::linear_back(c.y.view(), mat(p, &self.n("wo"))?, dout.view());
        acc2(grads, &self.n("wo"), dwo);
        let mixed = c
            .inputs
            .get(self.mixer.spec().mixed)
            .ok_or_else(|| Error::Io("internal: no mixed input".into()))?;
        let dy = reshape(dy, mixed.shape())?;
        let g_in = c.inputs.get("g").cloned();
        // The mixer's output, kept from the forward, for a backward that reads it (the GLR's).
        let mut inputs = c.inputs;
        if self.mixer.backward_reads_output() {
            let shape = dy.shape().to_vec();
            inputs.insert(SAVED_OUTPUT.into(), reshape(c.y, &shape)?);
        }
        let g = mixer_registry::backward::backward(
            self.mixer.as_ref(),
            self.backend.name(),
            Form::Fast,
            &AnyTensors::F64(inputs),
            &Tensor::F64(dy),
            &Requires::All,
        )?;
        let gd = |name: &str, cols: usize| -> Result<Array2<f64>> {
            let a = g
                .get(&format!("d_{name}"))
                .ok_or_else(|| Error::Io(format!("the backward returned no d_{name}")))?;
            flat(&a.to_f64(), cols)
        };
        let u = &c.u;
        let mut du = Array2::<f64>::zeros(u.raw_dim());
        // Pre-activation gradient `dz` of `z = u·W (+ b)`: accumulates dW, db, du.
        let back = |w: &str,
                    b: Option<&str>,
                    dz: Array2<f64>,
                    du: &mut Array2<f64>,
                    grads: &mut Params|
         -> Result<()> {
            let (dui, dw) = nn::linear_back(u.view(), mat(p, &self.n(w))?, dz.view());
            *du += &dui;
            acc2(grads, &self.n(w), dw);
            if let Some(b) = b {
                acc1(grads, &self.n(b), nn::bias_back(dz.view()));
            }
            Ok(())
        };
        match &self.kind {
            Kind::Attention => {
                for (name, w) in [("q", "wq"), ("k", "wk"), ("v", "wv")] {
                    back(w, None, gd(name, d)?, &mut du, grads)?;
                }
            }
            Kind::Glr { slots, on } => {
                back("wx", None, gd("x", d)?, &mut du, grads)?;
                let dims = Dims { n: u.nrows() / t, t, h, dh };
                // From the cotangent of a side's weights `dp`, the gradients of its parameters.
                let weights_back = |side: &Side,
                                    dp: &Array2<f64>,
                                    probs: &Array2<f64>,
                                    du: &mut Array2<f64>,
                                    grads: &mut Params|
                 -> Result<()> {
                    let (q, kk) = (flat(&c.aux[side.q], d)?, flat(&c.aux[side.k], d)?);
                    let (dq, dk, dbias) = slot::backward(dp, probs, &q, &kk, side.set(slots), dims);
                    acc2(grads, &self.n(side.bias), dbias);
                    back(side.wq, None, dq, du, grads)?;
                    back(side.wk, None, dk, du, grads)
                };
                if on.has_a() {
                    let s_len = SIDE_A.set(slots).len();
                    let dp = slot::head_sums(&gd("alpha", s_len * d)?, dims);
                    let probs = flat(&c.aux[SIDE_A.probs], s_len * h)?;
                    weights_back(&SIDE_A, &dp, &probs, &mut du, grads)?;
                } else {
                    let alpha = flat(&c.aux["alpha"], d)?;
                    let dza = gd("alpha", d)? * &alpha.mapv(|a| a * (1.0 - a));
                    back("walpha", Some("balpha"), dza, &mut du, grads)?;
                }
                if on.has_b() {
                    let s_len = SIDE_B.set(slots).len();
                    // dβ per (slot, head) is the sum over the head's channels; β = γ·p.
                    let db = slot::head_sums(&gd("beta", s_len * d)?, dims);
                    let gamma = flat(&c.aux["gamma"], h)?;
                    let probs = flat(&c.aux[SIDE_B.probs], s_len * h)?;
                    let mut dp = Array2::<f64>::zeros(db.raw_dim());
                    let mut dzg = Array2::<f64>::zeros((u.nrows(), h));
                    for r in 0..u.nrows() {
                        for hh in 0..h {
                            let gm = gamma[[r, hh]];
                            let mut dgamma = 0.0;
                            for s in 0..s_len {
                                let col = s * h + hh;
                                dgamma += probs[[r, col]] * db[[r, col]];
                                dp[[r, col]] = gm * db[[r, col]];
                            }
                            // A token without an active slot has no β: γ does not reach the output.
                            if slots.active(r % t) > 0 {
                                dzg[[r, hh]] = dgamma * gm * (1.0 - gm);
                            }
                        }
                    }
                    weights_back(&SIDE_B, &dp, &probs, &mut du, grads)?;
                    back("wgamma", Some("bgamma"), dzg, &mut du, grads)?;
                }
            }
            Kind::Ssd { gdn, lift } => {
                let (mut dq, mut dk) = (gd("q", d)?, gd("k", d)?);
                if *gdn {
                    let qn = flat(&c.aux["qn"], d)?;
                    let kn = flat(&c.aux["kn"], d)?;
                    dq = nn::l2norm_groups_back(qn.view(), &flat(&c.aux["qinv"], h)?, dq.view(), dh);
                    dk = nn::l2norm_groups_back(kn.view(), &flat(&c.aux["kinv"], h)?, dk.view(), dh);
                }
                back("wq", None, dq, &mut du, grads)?;
                back("wk", None, dk, &mut du, grads)?;
                back("wv", None, gd("v", d)?, &mut du, grads)?;
                // g = −e^{a} softplus(z): dz = dg·(−e^{a})·σ(z), da = Σ dg·g.
                let zg = flat(&c.aux["zg"], h)?;
                let a = vec1(p, &self.n("a_log"))?.mapv(f64::exp);
                let dg = gd("g", h)?;
                let mut dzg = zg.mapv(nn::sigmoid) * &dg;
                dzg *= &a.mapv(|x| -x);
                let gval = flat(g_in.as_ref().ok_or_else(|| Error::Io("internal: no g".into()))?, h)?;
                acc1(grads, &self.n("a_log"), (&dg * &gval).sum_axis(Axis(0)));
                back("wg", Some("bg"), dzg, &mut du, grads)?;
                if *gdn {
                    let b = flat(&c.aux["beta"], h)?;
                    let dzb = gd("beta", h)? * &b.mapv(|x| x * (1.0 - x));
                    back("wb", Some("bb"), dzb, &mut du, grads)?;
                }
                if let Some(l) = lift {
                    back("wlambda", Some("blambda"), gd("lambda", h * l)?, &mut du, grads)?;
                    let dp = g
                        .get("d_lambda_param")
                        .ok_or_else(|| Error::Io("the backward returned no d_lambda_param".into()))?
                        .to_f64();
                    super::params::acc(grads, &self.n("lambda_param"), dp);
                }
            }
            Kind::Toeplitz { .. } => {
                back("wx", None, gd("x", d)?, &mut du, grads)?;
                let dw =
                    g.get("d_w").ok_or_else(|| Error::Io("the backward returned no d_w".into()))?.to_f64();
                super::params::acc(grads, &self.n("taps"), dw);
            }
        }
        Ok(du)
    }
}
