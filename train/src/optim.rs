//! AdamW with global gradient-norm clipping and a warm-up + cosine learning-rate schedule.

use std::collections::BTreeMap;

use ndarray::{ArrayD, Zip};
use serde::{Deserialize, Serialize};

use super::params::{ParamSpec, Params};

/// Optimiser settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdamWConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// `β₁`.
    pub beta1: f64,
    /// `β₂`.
    pub beta2: f64,
    /// `ε`.
    pub eps: f64,
    /// Decoupled weight decay (projection matrices only).
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (0: no clipping).
    pub clip: f64,
    /// Warm-up steps (linear from 0), as a fraction of all steps.
    pub warmup: f64,
    /// The cosine decay ends at this fraction of `lr`.
    pub final_lr_frac: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-8,
            weight_decay: 0.01,
            clip: 1.0,
            warmup: 0.05,
            final_lr_frac: 0.1,
        }
    }
}

/// AdamW state: first and second moments per parameter.
#[derive(Clone, Debug)]
pub struct AdamW {
    /// Settings.
    pub cfg: AdamWConfig,
    m: Params,
    v: Params,
    decay: BTreeMap<String, bool>,
    step: usize,
}

impl AdamW {
    /// A fresh optimiser for parameters of `specs`.
    pub fn new(cfg: AdamWConfig, specs: &[ParamSpec]) -> Self {
        let z = |s: &ParamSpec| (s.name.clone(), ArrayD::zeros(ndarray::IxDyn(&s.shape)));
        AdamW {
            cfg,
            m: specs.iter().map(z).collect(),
            v: specs.iter().map(z).collect(),
            decay: specs.iter().map(|s| (s.name.clone(), s.decay)).collect(),
            step: 0,
        }
    }

    /// The learning rate at step `s` (0-based) of `total`.
    pub fn lr_at(&self, s: usize, total: usize) -> f64 {
        let c = &self.cfg;
        let warm = (c.warmup * total as f64).round().max(1.0);
        let s = s as f64;
        if s < warm {
            return c.lr * (s + 1.0) / warm;
        }
        let p = ((s - warm) / (total as f64 - warm).max(1.0)).clamp(0.0, 1.0);
        let f = c.final_lr_frac + (1.0 - c.final_lr_frac) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos());
        c.lr * f
    }

    /// One update with learning rate `lr`; returns the gradient norm before clipping.
    pub fn update(&mut self, params: &mut Params, grads: &Params, lr: f64) -> f64 {
        let norm = grads.values().map(|g| g.iter().map(|x| x * x).sum::<f64>()).sum::<f64>().sqrt();
        let scale = if self.cfg.clip > 0.0 && norm > self.cfg.clip { self.cfg.clip / norm } else { 1.0 };
        self.step += 1;
        let c = &self.cfg;
        let (b1, b2) = (c.beta1, c.beta2);
        let bc1 = 1.0 - b1.powi(self.step as i32);
        let bc2 = 1.0 - b2.powi(self.step as i32);
        for (name, p) in params.iter_mut() {
            let (Some(g), Some(m), Some(v)) = (grads.get(name), self.m.get_mut(name), self.v.get_mut(name))
            else {
                continue;
            };
            let wd = if self.decay.get(name).copied().unwrap_or(false) { c.weight_decay } else { 0.0 };
            Zip::from(p).and(g).and(m).and(v).for_each(|p, &g, m, v| {
                let g = g * scale;
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                *p -= lr * (wd * *p + (*m / bc1) / ((*v / bc2).sqrt() + c.eps));
            });
        }
        norm
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Init;

    #[test]
    fn adamw_minimises_a_quadratic_and_schedules() {
        let specs =
            vec![ParamSpec { name: "w".into(), shape: vec![3], init: Init::Const(0.0), decay: false }];
        let mut p: Params =
            [("w".to_string(), ArrayD::from_shape_vec(ndarray::IxDyn(&[3]), vec![1.0, -2.0, 3.0]).unwrap())]
                .into();
        let mut opt = AdamW::new(AdamWConfig { lr: 0.1, clip: 0.0, ..Default::default() }, &specs);
        for _ in 0..300 {
            let g: Params = [("w".to_string(), p["w"].mapv(|x| 2.0 * x))].into();
            opt.update(&mut p, &g, 0.05);
        }
        assert!(p["w"].iter().all(|x| x.abs() < 1e-2), "{:?}", p["w"]);
        let o = AdamW::new(AdamWConfig::default(), &specs);
        assert!(o.lr_at(0, 100) < o.lr_at(4, 100));
        assert!((o.lr_at(5, 100) - 3e-3).abs() < 1e-4);
        assert!((o.lr_at(99, 100) - 3e-4).abs() < 1e-4);
    }
}
