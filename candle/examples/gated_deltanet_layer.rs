//! An fla-style gated DeltaNet layer in candle, trained for a few steps on a toy task.
//!
//! The layer is fla's `GatedDeltaNet` (without its fused kernels): projections
//! `q, k, v = W_{q,k,v} x`, an optional causal depthwise short convolution (width 4) and SiLU on
//! each, L2-normalised `q` and `k`, `β = sigmoid(W_b x)`, the decay
//! `g = −exp(A_log) · softplus(W_a x + dt_bias)`, the mixer
//! `o = gated_deltanet(q, k, v, g, β)` with `scale = 1/√Dk` (mixers-candle: the library's CPU
//! forward and backward, or its CUDA ones on CUDA tensors), an output gate `RMSNorm(o) ⊙ SiLU(W_g x)` per head and `W_o`.
//!
//! The model embeds tokens, adds the layer on a pre-norm residual and reads logits out; the task
//! is to output the previous token (without the short convolution only the mixer can carry it). It trains with
//! Adam and prints the loss of each step:
//!
//! ```sh
//! cargo run --release -p mixers-candle --example gated_deltanet_layer
//! ```
//!
//! `--short-conv` adds the short convolutions; `--cuda` trains on the first CUDA device (a build
//! with the feature `cuda`, docs/candle.md).

use candle_core::{D, DType, Device, Result, Tensor, Var};
use mixers_candle::{Options, ops};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// Sizes of the toy model and task.
pub struct Config {
    pub vocab: usize,
    pub d_model: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub short_conv: bool,
    pub batch: usize,
    pub seq: usize,
    pub lag: usize,
    /// Where the model and the data live (`--cuda`: the first CUDA device, with the feature
    /// `cuda`).
    pub device: Device,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            vocab: 8,
            d_model: 32,
            heads: 2,
            head_dim: 16,
            short_conv: false,
            batch: 8,
            seq: 33,
            lag: 1,
            device: Device::Cpu,
        }
    }
}

/// Where parameters come from: the random generator and the device they live on.
pub struct Init {
    pub rng: StdRng,
    pub device: Device,
}

/// A trainable tensor drawn uniformly from `[−a, a]`.
fn param(init: &mut Init, shape: &[usize], a: f32) -> Result<Var> {
    let n = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| init.rng.random_range(-a..a)).collect();
    Var::from_tensor(&Tensor::from_vec(data, shape, &init.device)?)
}

/// `x W` for `x [B, T, in]`, `W [in, out]` (initialised with `a = 1/√in`).
struct Linear(Var);

impl Linear {
    fn new(init: &mut Init, d_in: usize, d_out: usize) -> Result<Self> {
        Ok(Linear(param(init, &[d_in, d_out], 1.0 / (d_in as f32).sqrt())?))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.broadcast_matmul(self.0.as_tensor())
    }
}

/// Causal depthwise convolution of width `w.dims()[1]` along `T`:
/// `y_{t,c} = Σ_i w_{c,i} x_{t−i,c}` (zeros before the start).
struct ShortConv(Var);

impl ShortConv {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (_, t, _) = x.dims3()?;
        let width = self.0.dims()[1];
        let padded = x.pad_with_zeros(1, width - 1, 0)?;
        let mut y = x.zeros_like()?;
        for i in 0..width {
            let shifted = padded.narrow(1, width - 1 - i, t)?;
            y = (y + shifted.broadcast_mul(&self.0.as_tensor().narrow(1, i, 1)?.squeeze(1)?)?)?;
        }
        Ok(y)
    }
}

/// `x / √(mean(x²) + ε)` over the last axis.
fn rms_norm(x: &Tensor) -> Result<Tensor> {
    x.broadcast_div(&(x.sqr()?.mean_keepdim(D::Minus1)? + 1e-6)?.sqrt()?)
}

/// `x / √(Σ x² + ε)` over the last axis (fla's `use_qk_l2norm_in_kernel`).
fn l2_norm(x: &Tensor) -> Result<Tensor> {
    x.broadcast_div(&(x.sqr()?.sum_keepdim(D::Minus1)? + 1e-6)?.sqrt()?)
}

fn sigmoid(x: &Tensor) -> Result<Tensor> {
    (x.neg()?.exp()? + 1.0)?.recip()
}

fn softplus(x: &Tensor) -> Result<Tensor> {
    (x.exp()? + 1.0)?.log()
}

/// fla's gated DeltaNet layer (see the module documentation).
pub struct GatedDeltaNet {
    q: Linear,
    k: Linear,
    v: Linear,
    a: Linear,
    b: Linear,
    gate: Linear,
    out: Linear,
    a_log: Var,
    dt_bias: Var,
    convs: Option<[ShortConv; 3]>,
    heads: usize,
    head_dim: usize,
}

impl GatedDeltaNet {
    pub fn new(init: &mut Init, c: &Config) -> Result<Self> {
        let (d, hd) = (c.d_model, c.heads * c.head_dim);
        let conv = |init: &mut Init| param(init, &[hd, 4], 0.5).map(ShortConv);
        let convs = if c.short_conv { Some([conv(init)?, conv(init)?, conv(init)?]) } else { None };
        Ok(GatedDeltaNet {
            q: Linear::new(init, d, hd)?,
            k: Linear::new(init, d, hd)?,
            v: Linear::new(init, d, hd)?,
            a: Linear::new(init, d, c.heads)?,
            b: Linear::new(init, d, c.heads)?,
            gate: Linear::new(init, d, hd)?,
            out: Linear::new(init, hd, d)?,
            a_log: param(init, &[c.heads], 0.5)?,
            dt_bias: param(init, &[c.heads], 0.5)?,
            convs,
            heads: c.heads,
            head_dim: c.head_dim,
        })
    }

    fn vars(&self) -> Vec<&Var> {
        let mut v = vec![
            &self.q.0,
            &self.k.0,
            &self.v.0,
            &self.a.0,
            &self.b.0,
            &self.gate.0,
            &self.out.0,
            &self.a_log,
            &self.dt_bias,
        ];
        if let Some(c) = &self.convs {
            v.extend(c.iter().map(|c| &c.0));
        }
        v
    }

    /// `x [B, T, d_model]` → `[B, T, d_model]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (h, dh) = (self.heads, self.head_dim);
        let project = |lin: &Linear, i: usize| -> Result<Tensor> {
            let p = lin.forward(x)?;
            let p = match &self.convs {
                Some(c) => c[i].forward(&p)?,
                None => p,
            };
            p.silu()?.reshape((b, t, h, dh))
        };
        let q = l2_norm(&project(&self.q, 0)?)?;
        let k = l2_norm(&project(&self.k, 1)?)?;
        let v = project(&self.v, 2)?;
        let beta = sigmoid(&self.b.forward(x)?)?;
        let g = softplus(&self.a.forward(x)?.broadcast_add(self.dt_bias.as_tensor())?)?
            .broadcast_mul(&self.a_log.as_tensor().exp()?)?
            .neg()?;
        let o =
            ops::gated_deltanet(&q, &k, &v, &g, &beta, &Options::default().scale(1.0 / (dh as f64).sqrt()))?;
        let gate = self.gate.forward(x)?.silu()?.reshape((b, t, h, dh))?;
        let o = (rms_norm(&o)? * gate)?.reshape((b, t, h * dh))?;
        self.out.forward(&o)
    }
}

/// Embedding, one pre-norm residual gated DeltaNet block, readout.
pub struct Model {
    embed: Var,
    layer: GatedDeltaNet,
    readout: Linear,
}

impl Model {
    pub fn new(init: &mut Init, c: &Config) -> Result<Self> {
        Ok(Model {
            embed: param(init, &[c.vocab, c.d_model], 1.0)?,
            layer: GatedDeltaNet::new(init, c)?,
            readout: Linear::new(init, c.d_model, c.vocab)?,
        })
    }

    pub fn vars(&self) -> Vec<&Var> {
        let mut v = vec![&self.embed, &self.readout.0];
        v.extend(self.layer.vars());
        v
    }

    /// Logits `[B, T, vocab]` for tokens `[B, T]` (u32).
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let (b, t) = tokens.dims2()?;
        let x = self.embed.as_tensor().index_select(&tokens.flatten_all()?, 0)?.reshape((b, t, ()))?;
        let h = (&x + self.layer.forward(&rms_norm(&x)?)?)?;
        self.readout.forward(&rms_norm(&h)?)
    }
}

/// Mean cross-entropy of `logits [B, T, V]` against the one-hot targets `[B, T, V]`.
fn cross_entropy(logits: &Tensor, one_hot: &Tensor) -> Result<Tensor> {
    let m = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&m)?;
    let log_z = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let log_p = shifted.broadcast_sub(&log_z)?;
    let (b, t, _) = logits.dims3()?;
    (log_p * one_hot)?.sum_all()?.neg()? / (b * t) as f64
}

/// Adam (β₁ = 0.9, β₂ = 0.999, ε = 10⁻⁸).
struct Adam {
    lr: f64,
    step: i32,
    moments: Vec<(Tensor, Tensor)>,
}

impl Adam {
    fn new(vars: &[&Var], lr: f64) -> Result<Self> {
        let moments = vars.iter().map(|v| Ok((v.zeros_like()?, v.zeros_like()?))).collect::<Result<_>>()?;
        Ok(Adam { lr, step: 0, moments })
    }

    fn update(&mut self, vars: &[&Var], loss: &Tensor) -> Result<()> {
        let grads = loss.backward()?;
        self.step += 1;
        let (c1, c2) = (1.0 - 0.9f64.powi(self.step), 1.0 - 0.999f64.powi(self.step));
        for (v, (m, s)) in vars.iter().zip(&mut self.moments) {
            let Some(g) = grads.get(v) else { continue };
            *m = ((&*m * 0.9)? + (g * 0.1)?)?;
            *s = ((&*s * 0.999)? + (g.sqr()? * 0.001)?)?;
            let step = ((&*m / c1)? / ((&*s / c2)?.sqrt()? + 1e-8)?)?;
            v.set(&(v.as_tensor() - (step * self.lr)?)?)?;
        }
        Ok(())
    }
}

/// A batch of the task: random tokens, targets the tokens `lag` positions earlier (0 before
/// the start); returns the tokens and the one-hot targets.
fn batch(rng: &mut StdRng, c: &Config) -> Result<(Tensor, Tensor)> {
    let tokens: Vec<u32> = (0..c.batch * c.seq).map(|_| rng.random_range(0..c.vocab as u32)).collect();
    let mut one_hot = vec![0f32; c.batch * c.seq * c.vocab];
    for b in 0..c.batch {
        for t in 0..c.seq {
            let target = if t >= c.lag { tokens[b * c.seq + t - c.lag] } else { 0 };
            one_hot[(b * c.seq + t) * c.vocab + target as usize] = 1.0;
        }
    }
    Ok((
        Tensor::from_vec(tokens, (c.batch, c.seq), &c.device)?,
        Tensor::from_vec(one_hot, (c.batch, c.seq, c.vocab), &c.device)?,
    ))
}

/// Trains a fresh model for `steps` Adam steps and returns the loss of each step.
pub fn train(c: &Config, steps: usize, lr: f64, seed: u64, print: bool) -> Result<Vec<f32>> {
    let mut init = Init { rng: StdRng::seed_from_u64(seed), device: c.device.clone() };
    let model = Model::new(&mut init, c)?;
    let vars = model.vars();
    let mut adam = Adam::new(&vars, lr)?;
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let (tokens, targets) = batch(&mut init.rng, c)?;
        let loss = cross_entropy(&model.forward(&tokens)?, &targets)?;
        let l = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        if print {
            println!("step {step:3}  loss {l:.4}");
        }
        losses.push(l);
        adam.update(&vars, &loss)?;
    }
    Ok(losses)
}

fn main() -> Result<()> {
    let flag = |f: &str| std::env::args().any(|a| a == f);
    let device = if flag("--cuda") { Device::new_cuda(0)? } else { Device::Cpu };
    let c = Config { short_conv: flag("--short-conv"), device, ..Config::default() };
    let losses = train(&c, 60, 2e-2, 0, true)?;
    println!(
        "first loss {:.4}, last loss {:.4} (chance: ln {} = {:.4})",
        losses[0],
        losses[losses.len() - 1],
        c.vocab,
        (c.vocab as f32).ln()
    );
    Ok(())
}
