//! The `parallel` form: direct causal convolution, `O(T²)` per (batch row, channel, shift).

use mixer_core::Real;
use mixer_core::mixers::toeplitz::{Prepared, Toeplitz};
use rayon::prelude::*;

/// `y[t] += Σ_{s≤t} w[t−s] x[s]` for `t < y.len()` (`w` and `x` at least that long).
/// Written as one axpy per input position so that the inner loop vectorises.
pub fn conv_accumulate<F: Real>(w: &[F], x: &[F], y: &mut [F]) {
    let t = y.len();
    for s in 0..t {
        let xs = x[s];
        if xs == F::zero() {
            continue;
        }
        for (o, &wj) in y[s..].iter_mut().zip(&w[..t - s]) {
            *o += xs * wj;
        }
    }
}

/// The `parallel` form on gathered columns `xcols[b·C + c]`; returns output columns in the
/// same order: $y_e = \mathrm{bias}_{h} + \sum_i w_{i,h} * x_{e-\delta_i}$ (causal, truncated
/// to `T`). Parallel over batch × channel.
pub fn direct<F: Real>(m: &Toeplitz, p: &Prepared<F>, xcols: &[Vec<F>]) -> Vec<Vec<F>> {
    let (t, c, d) = (p.seq, p.channels, p.head_dim);
    (0..p.batch * c)
        .into_par_iter()
        .map(|idx| {
            let (b, e) = (idx / c, idx % c);
            let h = e / d;
            let mut y = match p.bias_row(h) {
                Some(bias) => bias.to_vec(),
                None => vec![F::zero(); t],
            };
            for (i, dl) in m.shifts(e % d) {
                conv_accumulate(p.tap_row(i, h), &xcols[b * c + e - dl], &mut y);
            }
            y
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn conv_by_hand() {
        let mut y = vec![0.0; 4];
        super::conv_accumulate(&[1.0, 2.0, 3.0, 4.0], &[1.0, 0.0, -1.0, 2.0], &mut y);
        // y0 = 1; y1 = 2; y2 = 3 − 1 = 2; y3 = 4 − 2 + 2 = 4.
        assert_eq!(y, vec![1.0, 2.0, 2.0, 4.0]);
    }
}
