//! The naive Toeplitz decoder (as in the paper): keep the whole input history and compute
//! $y_t = \mathrm{bias}_h[t] + \sum_i \sum_{s\le t} w_{i,h}[t-s]\, x_s$ directly — `O(t)` work
//! per token and channel, `O(T²)` for a sequence.

use mixer_core::mixer::Decoder;
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Dims, Real, Result, Tensors};
use ndarray::ArrayD;

use super::decode::Base;

/// Naive decoder; cache = the input history (`B·C·t` scalars).
pub struct NaiveDecoder<F> {
    base: Base<F>,
}

impl<F: Real> NaiveDecoder<F> {
    /// From the static inputs `w`, `bias` and the sizes.
    pub fn new(m: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        Ok(NaiveDecoder { base: Base::new(m, statics, dims)? })
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
                let w = &base.kernel(i, h)[..=t];
                let x = &base.hist[b * c + e - dl];
                // Σ_{s≤t} w[t−s] x[s]
                acc += w.iter().rev().zip(x).map(|(&a, &b)| a * b).sum::<F>();
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
}
