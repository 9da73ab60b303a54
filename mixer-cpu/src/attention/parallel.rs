//! The parallel form of attention: per batch row and head, the full masked score matrix
//! `S = σ QKᵀ` (entries with `s > t` or `t − s ≥ w` masked before the exponential), a
//! row softmax, then `Y = PV`. `O(T²)` time and memory per head; parallel over batch × heads.

use mixer_core::mixers::attention::Attention;
use mixer_core::parallel::min_len;
use mixer_core::{Real, Result, Tensors};
use ndarray::{Array2, Array4, ArrayD, s};
use rayon::prelude::*;

use super::{heads_major, key};

/// `y [B,T,H,Dv]` from `q, k [B,T,H,Dk]`, `v [B,T,H,Dv]`. Scores are turned into weights
/// through [`Logits`](mixer_core::mixers::attention::Logits), so no finite input overflows.
pub fn parallel<F: Real>(a: &Attention, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let (q, k, v) = (heads_major(inputs, "q")?, heads_major(inputs, "k")?, heads_major(inputs, "v")?);
    let (bn, hn, tn, dk) = q.dim();
    let dv = v.dim().3;
    let lg = a.logits(dk);
    let pairs: Vec<(usize, usize)> = (0..bn).flat_map(|b| (0..hn).map(move |h| (b, h))).collect();
    let outs: Vec<Array2<F>> = pairs
        .par_iter()
        .with_min_len(min_len())
        .map(|&(b, h)| {
            let qh = q.slice(s![b, h, .., ..]);
            let kh = k.slice(s![b, h, .., ..]);
            let mut p = qh.dot(&kh.t());
            let mut keys = vec![0.0f64; tn];
            for t in 0..tn {
                let lo = a.first_key(t);
                let mut row = p.row_mut(t);
                for s in lo..=t {
                    keys[s] = key(&lg, row[s], qh.row(t), kh.row(s), t, s)?;
                }
                let mx = keys[lo..=t].iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut den = F::zero();
                for s in 0..tn {
                    row[s] = if s >= lo && s <= t {
                        let e = F::of(lg.weight(keys[s], mx));
                        den += e;
                        e
                    } else {
                        F::zero()
                    };
                }
                row.mapv_inplace(|e| e / den);
            }
            Ok(p.dot(&v.slice(s![b, h, .., ..])))
        })
        .collect::<Result<_>>()?;
    let mut y = Array4::<F>::zeros((bn, tn, hn, dv));
    for (&(b, h), o) in pairs.iter().zip(&outs) {
        y.slice_mut(s![b, .., h, ..]).assign(o);
    }
    Ok(y.into_dyn())
}
