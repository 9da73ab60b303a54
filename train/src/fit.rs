//! The training loop: batches from a task's train split, AdamW steps, periodic evaluation
//! on a fixed test set, and a log of everything.

use std::time::Instant;

use mixer_core::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::model::{Model, ModelConfig};
use super::optim::{AdamW, AdamWConfig};
use super::tasks::{Batch, Split, TaskConfig, TaskKind};

/// A whole training run's settings (`--config` JSON overrides these fields).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Task and its length settings.
    pub task: TaskConfig,
    /// Registered mixer name.
    pub mixer: String,
    /// The mixer's JSON config.
    pub mixer_config: Value,
    /// Width `D`.
    pub width: usize,
    /// Number of blocks.
    pub layers: usize,
    /// Heads.
    pub heads: usize,
    /// MLP hidden width as a multiple of `D`.
    pub mlp_mult: usize,
    /// Learned absolute position embedding.
    pub pos_emb: bool,
    /// Kernel of a short causal depthwise convolution before each mixer (0: none).
    pub conv: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Optimiser.
    pub optim: AdamWConfig,
    /// Evaluate every this many steps (and at the end); 0: only at the end.
    pub eval_every: usize,
    /// Size of the fixed test set.
    pub test_size: usize,
    /// Seed of the initialisation and of the data.
    pub seed: u64,
    /// The backend the mixer layers run on (`cpu`, or `cuda` for the mixers' forward and
    /// backward on the GPU; the rest of the model runs on the host).
    pub backend: String,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            task: TaskConfig::new(TaskKind::Copy),
            mixer: "attention".into(),
            mixer_config: serde_json::json!({}),
            width: 32,
            layers: 2,
            heads: 2,
            mlp_mult: 2,
            pos_emb: true,
            conv: 0,
            steps: 1000,
            batch: 32,
            optim: AdamWConfig::default(),
            eval_every: 100,
            test_size: 256,
            seed: 0,
            backend: "cpu".into(),
        }
    }
}

impl TrainConfig {
    /// The model configuration this run trains.
    pub fn model(&self) -> ModelConfig {
        ModelConfig {
            mixer: self.mixer.clone(),
            mixer_config: self.mixer_config.clone(),
            vocab: self.task.vocab_size(),
            seq_len: self.task.seq_len(),
            width: self.width,
            layers: self.layers,
            heads: self.heads,
            mlp_mult: self.mlp_mult,
            pos_emb: self.pos_emb,
            conv: self.conv,
        }
    }
}

/// Metrics on a set of examples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Mean cross-entropy over labelled positions.
    pub loss: f64,
    /// Fraction of labelled positions predicted right (copy: character accuracy; MQAR:
    /// accuracy on the queried keys; multi-hop: fraction of queries answered).
    pub accuracy: f64,
    /// Fraction of examples with every labelled position right (copy: string accuracy).
    pub sequence_accuracy: f64,
    /// Accuracy per group (multi-hop: per hop count), `(name, accuracy, count)`.
    pub groups: Vec<(String, f64, usize)>,
}

/// One logged training step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepLog {
    /// Step (1-based: after that many updates).
    pub step: usize,
    /// Training loss of the step's batch (before the update).
    pub loss: f64,
    /// Training accuracy of the step's batch.
    pub accuracy: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
}

/// One evaluation on the test set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalLog {
    /// After this many steps.
    pub step: usize,
    /// Test metrics.
    pub test: Metrics,
}

/// Everything about a run (written as JSON by `mixers train`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainLog {
    /// Settings.
    pub config: TrainConfig,
    /// Number of parameters.
    pub params: usize,
    /// Every step.
    pub steps: Vec<StepLog>,
    /// Every evaluation (the last one is after the final step).
    pub evals: Vec<EvalLog>,
    /// Wall time of the run, seconds.
    pub wall_s: f64,
}

impl TrainLog {
    /// The last evaluation's metrics.
    pub fn final_test(&self) -> Metrics {
        self.evals.last().map(|e| e.test.clone()).unwrap_or_default()
    }
}

/// What a progress display gets after every step.
#[derive(Clone, Debug)]
pub enum Event<'a> {
    /// A training step finished.
    Step(&'a StepLog),
    /// An evaluation finished.
    Eval(&'a EvalLog),
}

/// Metrics of `model` on `batch`, evaluated `chunk` sequences at a time.
pub fn evaluate(model: &Model, task: &TaskConfig, batch: &Batch, chunk: usize) -> Result<Metrics> {
    let t = batch.t;
    let names = task.groups();
    let mut group = vec![(0usize, 0usize); names.len()];
    let (mut loss, mut labelled, mut right, mut seq_right) = (0.0, 0usize, 0usize, 0usize);
    let chunk = chunk.max(1);
    for start in (0..batch.n).step_by(chunk) {
        let n = chunk.min(batch.n - start);
        let r = start * t..(start + n) * t;
        let out = model.evaluate(&batch.tokens[r.clone()], &batch.targets[r.clone()], n)?;
        let k = batch.targets[r.clone()].iter().filter(|x| x.is_some()).count();
        loss += out.loss * k as f64;
        labelled += k;
        for i in 0..n {
            let mut all = true;
            for j in 0..t {
                if let Some(c) = out.correct[i * t + j] {
                    let gi = batch.groups[r.start + i * t + j].min(names.len() - 1);
                    group[gi].1 += 1;
                    if c {
                        right += 1;
                        group[gi].0 += 1;
                    } else {
                        all = false;
                    }
                }
            }
            seq_right += usize::from(all);
        }
    }
    let frac = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Ok(Metrics {
        loss: if labelled == 0 { 0.0 } else { loss / labelled as f64 },
        accuracy: frac(right, labelled),
        sequence_accuracy: frac(seq_right, batch.n),
        groups: names.into_iter().zip(group).map(|(n, (a, b))| (n, frac(a, b), b)).collect(),
    })
}

/// The seed of step `s`'s training batch.
fn step_seed(seed: u64, s: usize) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(s as u64 + 1)
}

/// Trains a model per `cfg`; `on` sees every step and evaluation (for a progress bar).
/// Deterministic for a configuration (seed included).
pub fn train(cfg: &TrainConfig, on: &mut dyn FnMut(Event<'_>)) -> Result<(Model, TrainLog)> {
    cfg.task.validate()?;
    if cfg.steps == 0 || cfg.batch == 0 || cfg.test_size == 0 {
        return Err(Error::Io("steps, batch and test_size must be ≥ 1".into()));
    }
    if !(cfg.optim.lr > 0.0 && cfg.optim.lr.is_finite()) {
        return Err(Error::Io(format!("lr must be positive and finite, got {}", cfg.optim.lr)));
    }
    let start = Instant::now();
    let mut model = Model::new(cfg.model(), cfg.seed)?;
    model.on_backend(&cfg.backend)?;
    let mut opt = AdamW::new(cfg.optim.clone(), model.specs());
    let test = cfg.task.batch(step_seed(cfg.seed, usize::MAX - 1), cfg.test_size, Split::Test)?;
    let mut log = TrainLog {
        config: cfg.clone(),
        params: super::params::count(&model.params),
        steps: Vec::new(),
        evals: Vec::new(),
        wall_s: 0.0,
    };
    for s in 0..cfg.steps {
        let b = cfg.task.batch(step_seed(cfg.seed, s), cfg.batch, Split::Train)?;
        let (out, grads) = model.loss_and_grad(&b.tokens, &b.targets, b.n)?;
        if !out.loss.is_finite() {
            return Err(Error::Io(format!("the loss is not finite at step {} ({})", s + 1, out.loss)));
        }
        let lr = opt.lr_at(s, cfg.steps);
        let grad_norm = opt.update(&mut model.params, &grads, lr);
        let (right, all) =
            out.correct.iter().flatten().fold((0, 0), |(r, a), &c| (r + usize::from(c), a + 1));
        let st = StepLog {
            step: s + 1,
            loss: out.loss,
            accuracy: right as f64 / all.max(1) as f64,
            lr,
            grad_norm,
        };
        on(Event::Step(&st));
        log.steps.push(st);
        if (cfg.eval_every > 0 && (s + 1) % cfg.eval_every == 0) || s + 1 == cfg.steps {
            let e = EvalLog { step: s + 1, test: evaluate(&model, &cfg.task, &test, cfg.batch)? };
            on(Event::Eval(&e));
            log.evals.push(e);
        }
    }
    log.wall_s = start.elapsed().as_secs_f64();
    Ok((model, log))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(mixer: &str) -> TrainConfig {
        TrainConfig {
            task: TaskConfig { min_len: 2, max_len: 4, alphabet: 4, ..TaskConfig::new(TaskKind::Copy) },
            mixer: mixer.into(),
            width: 16,
            layers: 1,
            steps: 6,
            batch: 4,
            eval_every: 3,
            test_size: 8,
            ..TrainConfig::default()
        }
    }

    #[test]
    fn training_is_deterministic_for_a_seed() {
        let (m1, l1) = train(&small("mamba2"), &mut |_| {}).unwrap();
        let (m2, l2) = train(&small("mamba2"), &mut |_| {}).unwrap();
        assert_eq!(m1.params, m2.params);
        let strip = |l: &TrainLog| (l.steps.clone(), l.evals.clone());
        assert_eq!(strip(&l1), strip(&l2));
        assert_eq!(l1.evals.len(), 2);
        let (m3, _) = train(&TrainConfig { seed: 1, ..small("mamba2") }, &mut |_| {}).unwrap();
        assert_ne!(m1.params, m3.params);
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(train(&TrainConfig { steps: 0, ..small("attention") }, &mut |_| {}).is_err());
        let mut c = small("attention");
        c.optim.lr = f64::NAN;
        assert!(train(&c, &mut |_| {}).is_err());
        assert!(train(&small("no-such-mixer"), &mut |_| {}).is_err());
        let e = train(&TrainConfig { backend: "no-such-backend".into(), ..small("attention") }, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("no-such-backend"), "{e}");
    }

    /// Whether the CUDA backend runs here: `false` (after saying why) without a device, a panic
    /// instead under `MIXERS_REQUIRE_CUDA=1`.
    fn cuda_here() -> bool {
        match mixer_registry::Backend::by_name("cuda") {
            Ok(_) => true,
            Err(e) if std::env::var("MIXERS_REQUIRE_CUDA").is_ok_and(|v| v == "1") => panic!("{e}"),
            Err(e) => {
                eprintln!("skipped: {e}");
                false
            }
        }
    }

    /// Without a device, the mixer layers on `cuda` are refused with the backend's reason.
    #[test]
    fn mixer_layers_on_an_unavailable_backend_are_refused() {
        if mixer_registry::Backend::by_name("cuda").is_ok() {
            return;
        }
        let e = train(&TrainConfig { backend: "cuda".into(), ..small("mamba2") }, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("backend `cuda` is not available"), "{e}");
    }

    /// The mixer layers on the GPU (forward and backward on `cuda`, f64 host arrays) train as on
    /// the CPU: every step's loss and gradient norm agree to rounding, and so do the final
    /// parameters.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn mixer_layers_on_cuda_train_as_on_the_cpu() {
        if !cuda_here() {
            return;
        }
        for mixer in ["attention", "mamba2", "gated-deltanet", "diagonal-ssm", "toeplitz"] {
            let (m_cpu, cpu) = train(&small(mixer), &mut |_| {}).unwrap();
            let (m_gpu, gpu) = train(&TrainConfig { backend: "cuda".into(), ..small(mixer) }, &mut |_| {})
                .unwrap_or_else(|e| panic!("{mixer} on cuda: {e}"));
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
            for (c, g) in cpu.steps.iter().zip(&gpu.steps) {
                println!("TRAIN-CUDA {mixer} step {} loss {:.12} / {:.12}", c.step, c.loss, g.loss);
                assert!(
                    close(c.loss, g.loss),
                    "{mixer} step {}: loss {} on cpu, {} on cuda",
                    c.step,
                    c.loss,
                    g.loss
                );
                assert!(close(c.grad_norm, g.grad_norm), "{mixer} step {}: gradient norm", c.step);
            }
            assert_eq!(cpu.steps.len(), gpu.steps.len());
            for (k, v) in &m_cpu.params {
                let w = &m_gpu.params[k];
                let err = (v - w).iter().fold(0.0f64, |a, &x| a.max(x.abs()));
                assert!(err <= 1e-8, "{mixer}: parameter {k} differs by {err}");
            }
        }
    }
}
