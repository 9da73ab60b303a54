//! The naive Toeplitz decoder (as in the paper): keep the whole input history and compute
//! `y_t = bias_h[t] + Σ_i Σ_{s≤ t} w_{i,h}[t−s] x_s` directly — `O(t)` work
//! per token and channel, `O(T²)` for a sequence.

use mixer_core::mixer::Decoder;
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Dims, Real, Result, Tensors};
use ndarray::ArrayD;

use super::decoder::History;

/// `Σ_{s<n} w[n−1−s] x[s]` for `n = w.len() ≤ x.len()`, with four independent
/// accumulators (so the loop vectorises; the naive baseline should not be slow for
/// avoidable reasons).
pub fn dot_rev<F: Real>(w: &[F], x: &[F]) -> F {
    let n = w.len();
    let mut acc = [F::zero(); 4];
    let mut s = 0;
    while s + 4 <= n {
        for l in 0..4 {
            acc[l] += w[n - 1 - s - l] * x[s + l];
        }
        s += 4;
    }
    let mut tail = F::zero();
    for s in s..n {
        tail += w[n - 1 - s] * x[s];
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// Naive decoder; cache = the input history (`B·C·t` scalars).
pub struct NaiveDecoder<F> {
    base: History<F>,
}

impl<F: Real> NaiveDecoder<F> {
    /// From the static inputs `w`, `bias` and the sizes.
    pub fn new(m: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        Ok(NaiveDecoder { base: History::new(m, statics, dims)? })
    }
}

impl<F: Real> Decoder<F> for NaiveDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let t = self.base.push(token)?;
        let base = &self.base;
        let (c, d) = (base.channels, base.head_dim);
        Ok(base.output(|b, e| {
            let h = e / d;
            let mut acc = base.bias(h, t);
            for (i, dl) in base.m.shifts(e % d) {
                acc += dot_rev(&base.tap_row(i, h)[..=t], &base.hist[b * c + e - dl]);
            }
            acc
        }))
    }
    fn cache_elems(&self) -> usize {
        self.base.hist_elems()
    }
    fn position(&self) -> usize {
        self.base.pos
    }
    fn state(&self) -> Result<Tensors<F>> {
        Ok(self.base.state())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dot_rev_by_hand() {
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let x = [1.0, -1.0, 2.0, 0.5, 1.0, 3.0];
        for n in 0..=6 {
            let want: f64 = (0..n).map(|s| w[n - 1 - s] * x[s]).sum();
            assert_eq!(super::dot_rev(&w[..n], &x), want, "n = {n}");
        }
    }
}
