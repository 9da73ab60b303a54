//! Attention-like weights over a GLR pattern's slots, per head, for the training layer
//! ([`crate::layer`]): for row `r` (token `t` of a sequence) and entry `s` of its slot set,
//!
//! `z[r, s, h] = σ · q_r · k_{src(t, s)} + bias[s, h]`,  `p[r, ·, h] = softmax over the row's active entries`,
//!
//! with `q, k [N·T, D]` (head `h` the channels `h·D/H … (h+1)·D/H`), `σ = 1/√(D/H)` and a learned
//! bias per entry and head. The slot set is the pattern's active slots `(j, d_j(t))` — the
//! recurrence's `β` (docs/math.md §1.2) — or, for the pattern on `A`, the token itself first and
//! then every slot: entry 0 reads `t`, entry `j + 1` reads `d_j(t)` (the layout of `alpha [B, T,
//! K + 1, C]`). Weights of inactive entries are 0; a row without an active entry has none.

use mixer_core::pattern::Slots;
use ndarray::{Array2, ArrayD, ArrayView2, IxDyn};

/// The entries of a row: the pattern's slots, with or without the token itself in front.
#[derive(Clone, Copy)]
pub(crate) struct SlotSet<'a> {
    pub(crate) slots: &'a Slots,
    /// Entry 0 is the token itself (the pattern on `A`).
    pub(crate) with_self: bool,
}

/// Sizes of one call: `n` sequences of `t` tokens, `h` heads of `dh` channels.
#[derive(Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) n: usize,
    pub(crate) t: usize,
    pub(crate) h: usize,
    pub(crate) dh: usize,
}

impl SlotSet<'_> {
    /// Entries per row (the slot axis of the weights and of the coefficients).
    pub(crate) fn len(&self) -> usize {
        self.slots.len() + usize::from(self.with_self)
    }

    /// `(entry, source position)` of the active entries of token `tt`.
    fn entries(&self, tt: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let own = self.with_self.then_some((0, tt));
        let shift = usize::from(self.with_self);
        own.into_iter().chain(self.slots.deps(tt).map(move |(j, src)| (j + shift, src)))
    }
}

/// The weights `p [N·T, S·H]` (entry-major: column `s·H + h`).
pub(crate) fn weights(
    q: &Array2<f64>,
    k: &Array2<f64>,
    bias: ArrayView2<'_, f64>,
    set: SlotSet<'_>,
    d: Dims,
) -> Array2<f64> {
    let (s_len, scale) = (set.len(), 1.0 / (d.dh as f64).sqrt());
    let mut p = Array2::<f64>::zeros((d.n * d.t, s_len * d.h));
    let mut z = Vec::with_capacity(s_len);
    for r in 0..d.n * d.t {
        let (b0, tt) = (r - r % d.t, r % d.t);
        for hh in 0..d.h {
            let cs = hh * d.dh..(hh + 1) * d.dh;
            z.clear();
            z.extend(set.entries(tt).map(|(s, src)| {
                let dot: f64 = cs.clone().map(|c| q[[r, c]] * k[[b0 + src, c]]).sum();
                (s, scale * dot + bias[[s, hh]])
            }));
            let m = z.iter().map(|&(_, v)| v).fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = z.iter().map(|&(_, v)| (v - m).exp()).sum();
            for &(s, v) in &z {
                p[[r, s * d.h + hh]] = (v - m).exp() / sum;
            }
        }
    }
    p
}

/// The mixer's coefficients `[N, T, S, D]`: `p [N·T, S·H]` per head spread over its channels,
/// times `gate [N·T, H]` where given (the recurrence's `γ`).
pub(crate) fn spread(p: &Array2<f64>, gate: Option<&Array2<f64>>, d: Dims) -> ArrayD<f64> {
    let (width, s_len) = (d.h * d.dh, p.ncols() / d.h.max(1));
    let mut out = ArrayD::<f64>::zeros(IxDyn(&[d.n, d.t, s_len, width]));
    for r in 0..d.n * d.t {
        for s in 0..s_len {
            for hh in 0..d.h {
                let w = p[[r, s * d.h + hh]] * gate.map_or(1.0, |g| g[[r, hh]]);
                for c in hh * d.dh..(hh + 1) * d.dh {
                    out[[r / d.t, r % d.t, s, c]] = w;
                }
            }
        }
    }
    out
}

/// The cotangent of the per-head weights from that of the coefficients `[N·T, S·D]` (entry-major):
/// the sum over each head's channels (`[N·T, S·H]`).
pub(crate) fn head_sums(dcoef: &Array2<f64>, d: Dims) -> Array2<f64> {
    let width = d.h * d.dh;
    let s_len = dcoef.ncols() / width.max(1);
    let mut out = Array2::<f64>::zeros((dcoef.nrows(), s_len * d.h));
    for r in 0..dcoef.nrows() {
        for s in 0..s_len {
            for hh in 0..d.h {
                out[[r, s * d.h + hh]] =
                    (hh * d.dh..(hh + 1) * d.dh).map(|c| dcoef[[r, s * width + c]]).sum();
            }
        }
    }
    out
}

/// The backward of [`weights`]: from `dp [N·T, S·H]`, the gradients `(dq, dk, dbias)`.
pub(crate) fn backward(
    dp: &Array2<f64>,
    p: &Array2<f64>,
    q: &Array2<f64>,
    k: &Array2<f64>,
    set: SlotSet<'_>,
    d: Dims,
) -> (Array2<f64>, Array2<f64>, Array2<f64>) {
    let scale = 1.0 / (d.dh as f64).sqrt();
    let (mut dq, mut dk) = (Array2::<f64>::zeros(q.raw_dim()), Array2::<f64>::zeros(k.raw_dim()));
    let mut dbias = Array2::<f64>::zeros((set.len().max(1), d.h));
    for r in 0..d.n * d.t {
        let (b0, tt) = (r - r % d.t, r % d.t);
        for hh in 0..d.h {
            let col = |s: usize| s * d.h + hh;
            // Softmax: dz = p ⊙ (dp − Σ p·dp) over the active entries.
            let mean: f64 = set.entries(tt).map(|(s, _)| p[[r, col(s)]] * dp[[r, col(s)]]).sum();
            for (s, src) in set.entries(tt) {
                let dz = p[[r, col(s)]] * (dp[[r, col(s)]] - mean);
                dbias[[s, hh]] += dz;
                for c in hh * d.dh..(hh + 1) * d.dh {
                    dq[[r, c]] += scale * dz * k[[b0 + src, c]];
                    dk[[b0 + src, c]] += scale * dz * q[[r, c]];
                }
            }
        }
    }
    (dq, dk, dbias)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::tests::rand2;
    use mixer_core::mixer::downcast;
    use mixer_core::mixers::glr::Glr;
    use mixer_core::{AnyTensors, Form, Tensors};
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// The weights are a distribution over each row's active entries, and spread as `alpha` of
    /// the pattern on `A` they give the library's `y_t = Σ_s p[t, s] · x_{src(t, s)}` with entry 0
    /// the token itself: the entry layout is the library's (docs/math.md §1.2).
    #[test]
    fn the_weights_on_a_read_the_token_and_its_slots_as_the_library_does() {
        let mut rng = StdRng::seed_from_u64(5);
        for cfg in [
            r#"{"pattern": "sq1", "cache_efficient": true, "on": "a"}"#,
            r#"{"pattern": "linear", "on": "a"}"#,
        ] {
            let (n, t, h, dh) = (2, 13, 2, 3);
            let d = Dims { n, t, h, dh };
            let mixer = mixer_registry::mixer("glr", &serde_json::from_str(cfg).unwrap()).unwrap();
            let slots = downcast::<Glr>(mixer.as_ref(), "cpu").unwrap().slots(t);
            let set = SlotSet { slots: &slots, with_self: true };
            let (q, k, x) = (
                rand2(&mut rng, n * t, h * dh),
                rand2(&mut rng, n * t, h * dh),
                rand2(&mut rng, n * t, h * dh),
            );
            let p = weights(&q, &k, rand2(&mut rng, set.len(), h).view(), set, d);
            for r in 0..n * t {
                for hh in 0..h {
                    let active: Vec<usize> = set.entries(r % t).map(|(s, _)| s).collect();
                    let total: f64 = active.iter().map(|&s| p[[r, s * h + hh]]).sum();
                    assert!((total - 1.0).abs() < 1e-12);
                    let idle = (0..set.len()).filter(|s| !active.contains(s));
                    assert!(idle.into_iter().all(|s| p[[r, s * h + hh]] == 0.0));
                }
            }
            let mut inputs = Tensors::new();
            inputs.insert("x".into(), x.clone().into_shape_with_order(IxDyn(&[n, t, h * dh])).unwrap());
            inputs.insert("alpha".into(), spread(&p, None, d));
            let y = mixer_registry::run::run(
                mixer.as_ref(),
                &mixer_registry::Backend::by_name("cpu").unwrap(),
                Form::Fast,
                &AnyTensors::F64(inputs),
            )
            .unwrap()
            .to_f64();
            for r in 0..n * t {
                let b0 = r - r % t;
                for c in 0..h * dh {
                    let want: f64 =
                        set.entries(r % t).map(|(s, src)| p[[r, s * h + c / dh]] * x[[b0 + src, c]]).sum();
                    assert!((y[[r / t, r % t, c]] - want).abs() < 1e-12, "{cfg}: row {r}, channel {c}");
                }
            }
        }
    }
}
