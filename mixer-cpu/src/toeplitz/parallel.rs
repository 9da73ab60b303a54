//! The `parallel` form: direct causal convolution, `O(T²)` per (batch row, channel, shift).

use mixer_core::Real;
use mixer_core::mixers::toeplitz::{Prepared, Toeplitz};
use mixer_core::parallel::min_len;
use rayon::prelude::*;

use super::columns::Columns;

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

/// The `parallel` form on channel-major columns (`b·C + c`); returns the output columns in
/// the same order: `y_e = bias_h + Σ_i w_{i,h} * x_{e−δ_i}` (causal, truncated
/// to `T`). Parallel over batch × channel.
pub fn direct<F: Real>(m: &Toeplitz, p: &Prepared<F>, x: &Columns<F>) -> Columns<F> {
    let (t, c, d) = (p.seq, p.channels, p.head_dim);
    let mut out = Columns { data: vec![F::zero(); p.batch * c * t], len: t };
    if t == 0 {
        return out;
    }
    out.data.par_chunks_mut(t).with_min_len(min_len()).enumerate().for_each(|(idx, y)| {
        let (b, e) = (idx / c, idx % c);
        let h = e / d;
        if let Some(bias) = p.bias_row(h) {
            y.copy_from_slice(bias);
        }
        for (i, dl) in m.shifts(e % d) {
            conv_accumulate(p.tap_row(i, h), x.col(b * c + e - dl), y);
        }
    });
    out
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
