//! The model: token (and position) embedding → `layers` pre-norm blocks
//! (`h += mix(norm(h))`, `h += W₂·gelu(W₁·norm(h) + b₁) + b₂`) → RMSNorm → linear head, with
//! softmax cross-entropy on the labelled positions.

use mixer_core::{Error, Result};
use ndarray::{Array1, Array2};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::layer::{LayerCache, MixerLayer};
use super::nn;
use super::params::{self, Init, ParamSpec, Params, acc1, acc2, mat, vec1};

/// Everything that fixes the model's shapes (saved with a checkpoint).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Registered mixer name (`attention`, `glr`, `mamba2`, …).
    pub mixer: String,
    /// The mixer's JSON config (model defaults are filled in, see `layer::effective_config`).
    #[serde(default)]
    pub mixer_config: Value,
    /// Vocabulary size.
    pub vocab: usize,
    /// Sequence length `T` (position embedding, Toeplitz taps, GLR slots).
    pub seq_len: usize,
    /// Width `D`.
    pub width: usize,
    /// Number of blocks.
    pub layers: usize,
    /// Heads (`D` must be divisible by it).
    pub heads: usize,
    /// MLP hidden width as a multiple of `D`.
    pub mlp_mult: usize,
    /// Learned absolute position embedding.
    pub pos_emb: bool,
    /// Kernel of a short causal depthwise convolution of each mixer layer's input (0: none).
    #[serde(default)]
    pub conv: usize,
}

/// The model: configuration, parameters and the layers built from the configuration.
#[derive(Debug)]
pub struct Model {
    /// Configuration.
    pub cfg: ModelConfig,
    /// Parameters by name.
    pub params: Params,
    layers: Vec<MixerLayer>,
    specs: Vec<ParamSpec>,
}

/// Loss, accuracy and gradients of one batch.
#[derive(Clone, Debug)]
pub struct Output {
    /// Mean cross-entropy over labelled positions.
    pub loss: f64,
    /// Logits `[N·T, V]`.
    pub logits: Array2<f64>,
    /// Per position: `Some(prediction correct)` where labelled.
    pub correct: Vec<Option<bool>>,
}

struct BlockCache {
    h_in: Array2<f64>,
    r1: Array1<f64>,
    /// The convolution's input (the normalised block input), with a convolution.
    n1: Option<Array2<f64>>,
    mix: LayerCache,
    h_mid: Array2<f64>,
    n2: Array2<f64>,
    r2: Array1<f64>,
    a1: Array2<f64>,
    z1: Array2<f64>,
}

impl Model {
    fn build(cfg: &ModelConfig) -> Result<(Vec<MixerLayer>, Vec<ParamSpec>)> {
        let check = |ok: bool, what: &str| if ok { Ok(()) } else { Err(Error::Io(format!("model: {what}"))) };
        check(cfg.vocab >= 2, "vocab must be ≥ 2")?;
        check(cfg.seq_len >= 1, "seq_len must be ≥ 1")?;
        check(cfg.layers >= 1 && cfg.layers <= 64, "layers must be in 1..=64")?;
        check(cfg.width >= 1 && cfg.width <= 4096, "width must be in 1..=4096")?;
        check(cfg.mlp_mult >= 1 && cfg.mlp_mult <= 16, "mlp_mult must be in 1..=16")?;
        check(cfg.conv <= 64, "conv (the short convolution's kernel) must be in 0..=64")?;
        let (d, v, t) = (cfg.width, cfg.vocab, cfg.seq_len);
        let f = cfg.mlp_mult * d;
        let mut layers = Vec::new();
        let mut specs = vec![ParamSpec {
            name: "embed".into(),
            shape: vec![v, d],
            init: Init::Normal(1.0),
            decay: false,
        }];
        if cfg.pos_emb {
            specs.push(ParamSpec {
                name: "pos".into(),
                shape: vec![t, d],
                init: Init::Normal(0.5),
                decay: false,
            });
        }
        for i in 0..cfg.layers {
            let pre = format!("blocks.{i}");
            let layer =
                MixerLayer::new(&format!("{pre}.mix"), &cfg.mixer, &cfg.mixer_config, d, cfg.heads, t)?;
            specs.push(ParamSpec::vector(format!("{pre}.norm1"), d, 1.0));
            if cfg.conv > 0 {
                // The standard deviation of PyTorch's default `Conv1d` initialisation
                // (uniform in ±1/√K); the bias starts at zero.
                specs.push(ParamSpec {
                    name: format!("{pre}.conv.w"),
                    shape: vec![cfg.conv, d],
                    init: Init::Normal(1.0 / (3.0 * cfg.conv as f64).sqrt()),
                    decay: true,
                });
                specs.push(ParamSpec::vector(format!("{pre}.conv.b"), d, 0.0));
            }
            specs.extend(layer.param_specs(cfg.layers));
            specs.push(ParamSpec::vector(format!("{pre}.norm2"), d, 1.0));
            specs.push(ParamSpec::matrix(format!("{pre}.mlp.w1"), d, f, 1.0));
            specs.push(ParamSpec::vector(format!("{pre}.mlp.b1"), f, 0.0));
            specs.push(ParamSpec::matrix(
                format!("{pre}.mlp.w2"),
                f,
                d,
                1.0 / (2.0 * cfg.layers as f64).sqrt(),
            ));
            specs.push(ParamSpec::vector(format!("{pre}.mlp.b2"), d, 0.0));
            layers.push(layer);
        }
        specs.push(ParamSpec::vector("norm_f".into(), d, 1.0));
        specs.push(ParamSpec::matrix("head".into(), d, v, 1.0));
        Ok((layers, specs))
    }

    /// A freshly initialised model (the same seed gives the same parameters).
    pub fn new(cfg: ModelConfig, seed: u64) -> Result<Self> {
        let (layers, specs) = Self::build(&cfg)?;
        let params = params::init(&specs, &mut StdRng::seed_from_u64(seed));
        Ok(Model { cfg, params, layers, specs })
    }

    /// Runs every mixer layer on `backend` ([`MixerLayer::on_backend`]); the rest of the model
    /// stays on the host.
    pub fn on_backend(&mut self, backend: &str) -> Result<()> {
        self.layers.iter_mut().try_for_each(|l| l.on_backend(backend))
    }

    /// A model with given parameters (checked against the configuration's shapes).
    pub fn from_params(cfg: ModelConfig, params: Params) -> Result<Self> {
        let (layers, specs) = Self::build(&cfg)?;
        params::check(&specs, &params)?;
        Ok(Model { cfg, params, layers, specs })
    }

    /// The parameter specifications (names, shapes, decay).
    pub fn specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    fn check_tokens(&self, tokens: &[usize], n: usize) -> Result<()> {
        if tokens.len() != n * self.cfg.seq_len {
            return Err(Error::shape(
                "tokens",
                format!("{n}·{} tokens", self.cfg.seq_len),
                format!("{}", tokens.len()),
            ));
        }
        if let Some(&x) = tokens.iter().find(|&&x| x >= self.cfg.vocab) {
            return Err(Error::Value {
                name: "tokens".into(),
                constraint: format!("< vocab {}", self.cfg.vocab),
                found: x.to_string(),
            });
        }
        Ok(())
    }

    fn check_targets(&self, tokens: &[usize], targets: &[Option<usize>]) -> Result<()> {
        if targets.len() != tokens.len() {
            return Err(Error::shape("targets", format!("{}", tokens.len()), format!("{}", targets.len())));
        }
        if let Some(&x) = targets.iter().flatten().find(|&&x| x >= self.cfg.vocab) {
            return Err(Error::Value {
                name: "targets".into(),
                constraint: format!("< vocab {}", self.cfg.vocab),
                found: x.to_string(),
            });
        }
        Ok(())
    }

    fn embed(&self, tokens: &[usize]) -> Result<Array2<f64>> {
        let e = mat(&self.params, "embed")?;
        let t = self.cfg.seq_len;
        let mut h = Array2::zeros((tokens.len(), self.cfg.width));
        let pos = if self.cfg.pos_emb { Some(mat(&self.params, "pos")?) } else { None };
        for (r, &tok) in tokens.iter().enumerate() {
            let mut row = h.row_mut(r);
            row.assign(&e.row(tok));
            if let Some(p) = &pos {
                row += &p.row(r % t);
            }
        }
        Ok(h)
    }

    fn run(
        &self,
        tokens: &[usize],
        n: usize,
    ) -> Result<(Array2<f64>, Vec<BlockCache>, Array2<f64>, Array1<f64>)> {
        self.check_tokens(tokens, n)?;
        let p = &self.params;
        let mut h = self.embed(tokens)?;
        let mut caches = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let pre = format!("blocks.{i}");
            let (n1, r1) = nn::rmsnorm(h.view(), &vec1(p, &format!("{pre}.norm1"))?);
            let (m, mix, n1) = if self.cfg.conv > 0 {
                let w = mat(p, &format!("{pre}.conv.w"))?;
                let u = nn::causal_conv(n1.view(), w, &vec1(p, &format!("{pre}.conv.b"))?, self.cfg.seq_len);
                let (m, mix) = layer.forward(p, &u, n)?;
                (m, mix, Some(n1))
            } else {
                let (m, mix) = layer.forward(p, &n1, n)?;
                (m, mix, None)
            };
            let h_mid = &h + &m;
            let (n2, r2) = nn::rmsnorm(h_mid.view(), &vec1(p, &format!("{pre}.norm2"))?);
            let mut a1 = nn::linear(n2.view(), mat(p, &format!("{pre}.mlp.w1"))?);
            nn::add_bias(&mut a1, &vec1(p, &format!("{pre}.mlp.b1"))?);
            let z1 = a1.mapv(nn::gelu);
            let mut o = nn::linear(z1.view(), mat(p, &format!("{pre}.mlp.w2"))?);
            nn::add_bias(&mut o, &vec1(p, &format!("{pre}.mlp.b2"))?);
            let h_out = &h_mid + &o;
            caches.push(BlockCache { h_in: h, r1, n1, mix, h_mid, n2, r2, a1, z1 });
            h = h_out;
        }
        let (nf, rf) = nn::rmsnorm(h.view(), &vec1(p, "norm_f")?);
        let logits = nn::linear(nf.view(), mat(p, "head")?);
        Ok((logits, caches, h, rf))
    }

    /// Logits `[N·T, V]` of `n` sequences of `tokens` (row-major `[N, T]`).
    pub fn logits(&self, tokens: &[usize], n: usize) -> Result<Array2<f64>> {
        Ok(self.run(tokens, n)?.0)
    }

    /// Loss and accuracy of a batch, without gradients.
    pub fn evaluate(&self, tokens: &[usize], targets: &[Option<usize>], n: usize) -> Result<Output> {
        self.check_targets(tokens, targets)?;
        let logits = self.logits(tokens, n)?;
        let ce = nn::cross_entropy(logits.view(), targets);
        Ok(Output { loss: ce.loss, logits, correct: ce.correct })
    }

    /// Loss, accuracy and the gradient of the loss with respect to every parameter.
    pub fn loss_and_grad(
        &self,
        tokens: &[usize],
        targets: &[Option<usize>],
        n: usize,
    ) -> Result<(Output, Params)> {
        self.check_targets(tokens, targets)?;
        let p = &self.params;
        let (logits, caches, h, rf) = self.run(tokens, n)?;
        let ce = nn::cross_entropy(logits.view(), targets);
        let mut grads = Params::new();
        // Head and final norm.
        let (nf, _) = nn::rmsnorm(h.view(), &vec1(p, "norm_f")?);
        let (dnf, dhead) = nn::linear_back(nf.view(), mat(p, "head")?, ce.dlogits.view());
        acc2(&mut grads, "head", dhead);
        let (mut dh, dgf) = nn::rmsnorm_back(h.view(), &vec1(p, "norm_f")?, &rf, dnf.view());
        acc1(&mut grads, "norm_f", dgf);
        for (i, (layer, c)) in self.layers.iter().zip(caches).enumerate().rev() {
            let pre = format!("blocks.{i}");
            // MLP branch.
            let w2 = format!("{pre}.mlp.w2");
            let (dz1, dw2) = nn::linear_back(c.z1.view(), mat(p, &w2)?, dh.view());
            acc2(&mut grads, &w2, dw2);
            acc1(&mut grads, &format!("{pre}.mlp.b2"), nn::bias_back(dh.view()));
            let da1 = dz1 * &c.a1.mapv(nn::gelu_grad);
            let w1 = format!("{pre}.mlp.w1");
            let (dn2, dw1) = nn::linear_back(c.n2.view(), mat(p, &w1)?, da1.view());
            acc2(&mut grads, &w1, dw1);
            acc1(&mut grads, &format!("{pre}.mlp.b1"), nn::bias_back(da1.view()));
            let g2 = format!("{pre}.norm2");
            let (dmid, dg2) = nn::rmsnorm_back(c.h_mid.view(), &vec1(p, &g2)?, &c.r2, dn2.view());
            acc1(&mut grads, &g2, dg2);
            dh += &dmid;
            // Mixer branch.
            let mut dn1 = layer.backward(p, c.mix, &dh, &mut grads)?;
            if let Some(n1) = &c.n1 {
                let w = format!("{pre}.conv.w");
                let (du, dw, db) = nn::causal_conv_back(n1.view(), mat(p, &w)?, dn1.view(), self.cfg.seq_len);
                acc2(&mut grads, &w, dw);
                acc1(&mut grads, &format!("{pre}.conv.b"), db);
                dn1 = du;
            }
            let g1 = format!("{pre}.norm1");
            let (dx, dg1) = nn::rmsnorm_back(c.h_in.view(), &vec1(p, &g1)?, &c.r1, dn1.view());
            acc1(&mut grads, &g1, dg1);
            dh += &dx;
        }
        // Embeddings.
        let t = self.cfg.seq_len;
        let mut de = Array2::<f64>::zeros((self.cfg.vocab, self.cfg.width));
        let mut dp = Array2::<f64>::zeros((t, self.cfg.width));
        for (r, &tok) in tokens.iter().enumerate() {
            let row = dh.row(r);
            let mut e = de.row_mut(tok);
            e += &row;
            if self.cfg.pos_emb {
                let mut q = dp.row_mut(r % t);
                q += &row;
            }
        }
        acc2(&mut grads, "embed", de);
        if self.cfg.pos_emb {
            acc2(&mut grads, "pos", dp);
        }
        // Parameters that got no gradient (e.g. unused) get zeros.
        for s in &self.specs {
            grads.entry(s.name.clone()).or_insert_with(|| ndarray::ArrayD::zeros(ndarray::IxDyn(&s.shape)));
        }
        Ok((Output { loss: ce.loss, logits, correct: ce.correct }, grads))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::normal;

    fn cfg(mixer: &str, mixer_config: Value) -> ModelConfig {
        ModelConfig {
            mixer: mixer.into(),
            mixer_config,
            vocab: 7,
            seq_len: 9,
            width: 8,
            layers: 2,
            heads: 2,
            mlp_mult: 2,
            pos_emb: true,
            conv: 0,
        }
    }

    /// Central differences of the loss along a random direction in parameter space, against
    /// `⟨grad, dir⟩`: checks the whole backward (embedding, norms, MLP, head, the layer's
    /// coefficient maps and the mixer's gradients) at once.
    fn check_model(mixer: &str, mixer_config: Value) {
        check_model_config(cfg(mixer, mixer_config));
    }

    fn check_model_config(c: ModelConfig) {
        let mixer = c.mixer.clone();
        let mut m = Model::new(c, 3).unwrap();
        let (n, t) = (2, m.cfg.seq_len);
        let tokens: Vec<usize> = (0..n * t).map(|i| (i * 5 + 3) % 7).collect();
        let targets: Vec<Option<usize>> = (0..n * t).map(|i| (i % 3 != 0).then_some((i * 3) % 7)).collect();
        let (_, grads) = m.loss_and_grad(&tokens, &targets, n).unwrap();
        let mut rng = StdRng::seed_from_u64(9);
        let dir: Params = m.params.iter().map(|(k, v)| (k.clone(), v.mapv(|_| normal(&mut rng)))).collect();
        let base = m.params.clone();
        let mut at = |eps: f64| {
            for (k, v) in m.params.iter_mut() {
                *v = &base[k] + &(&dir[k] * eps);
            }
            m.evaluate(&tokens, &targets, n).unwrap().loss
        };
        let h = 1e-5;
        let num = (at(h) - at(-h)) / (2.0 * h);
        let ana: f64 = grads.iter().map(|(k, g)| (g * &dir[k]).sum()).sum();
        let rel = (num - ana).abs() / ana.abs().max(1e-3);
        assert!(rel < 1e-5, "{mixer}: finite difference {num} vs backward {ana} (rel {rel:e})");
        // Every parameter tensor must get some gradient signal (a forgotten path shows as 0).
        for (k, g) in &grads {
            assert!(g.iter().any(|&x| x != 0.0), "{mixer}: no gradient reaches `{k}`");
        }
    }

    #[test]
    fn attention_model_gradient() {
        check_model("attention", serde_json::json!({}));
    }
    #[test]
    fn glr_model_gradient() {
        check_model("glr", serde_json::json!({"pattern": "pow2", "cache_efficient": true}));
        check_model("dense-recurrence", serde_json::json!({}));
    }
    #[test]
    fn glr_model_gradient_with_the_pattern_on_a_and_on_both() {
        for on in ["a", "both"] {
            check_model("glr", serde_json::json!({"pattern": "sq1", "cache_efficient": true, "on": on}));
            check_model("dense-recurrence", serde_json::json!({"on": on}));
        }
    }
    #[test]
    fn mamba2_model_gradient() {
        check_model("mamba2", serde_json::json!({}));
        check_model("loglinear-mamba2", serde_json::json!({}));
    }
    #[test]
    fn gated_deltanet_model_gradient() {
        check_model("gated-deltanet", serde_json::json!({}));
        check_model("loglinear-gated-deltanet", serde_json::json!({}));
    }
    #[test]
    fn toeplitz_model_gradient() {
        check_model("toeplitz", serde_json::json!({}));
    }
    #[test]
    fn models_with_a_short_convolution() {
        for (mixer, c) in [("attention", "{}"), ("mamba2", "{}"), ("glr", r#"{"pattern": "pow2"}"#)] {
            check_model_config(ModelConfig { conv: 3, ..cfg(mixer, serde_json::from_str(c).unwrap()) });
        }
        // Causal: a token changes no logit before it, in its sequence or the other.
        let m = Model::new(ModelConfig { conv: 4, ..cfg("attention", serde_json::json!({})) }, 1).unwrap();
        let t = m.cfg.seq_len;
        let tokens: Vec<usize> = (0..2 * t).map(|i| (i * 5 + 3) % 7).collect();
        let base = m.logits(&tokens, 2).unwrap();
        let mut changed = tokens.clone();
        changed[t + 4] = (changed[t + 4] + 1) % 7;
        let moved = m.logits(&changed, 2).unwrap();
        for r in 0..2 * t {
            let same = base.row(r) == moved.row(r);
            assert_eq!(same, r < t + 4, "row {r}");
        }
    }

    #[test]
    fn bad_tokens_and_configs_are_errors() {
        let m = Model::new(cfg("attention", serde_json::json!({})), 0).unwrap();
        assert!(m.logits(&[0; 9], 2).is_err());
        assert!(m.logits(&[9; 9], 1).is_err());
        assert!(m.evaluate(&[0; 9], &[Some(7); 9], 1).is_err());
        assert!(m.loss_and_grad(&[0; 9], &[None; 8], 1).is_err());
        assert!(Model::new(cfg("no-such-mixer", serde_json::json!({})), 0).is_err());
        assert!(Model::new(ModelConfig { heads: 3, ..cfg("attention", serde_json::json!({})) }, 0).is_err());
        let mut p = m.params.clone();
        p.remove("head");
        assert!(Model::from_params(m.cfg.clone(), p).is_err());
    }
}
