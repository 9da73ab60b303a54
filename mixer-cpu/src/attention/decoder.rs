//! The recurrent form of attention: a KV cache. Token `t` appends `(k_t, v_t)` and attends
//! over the cached keys `s ∈ [max(0, t + 1 − w), t]` with a (max-subtracted) softmax whose keys and maximum are `f64`
//! ([`Logits`]), so no finite input overflows. The
//! cache is a ring of `min(w, T)` slots (all `T` for full attention), so it holds
//! `min(t + 1, w)` tokens × B × H × (Dk + Dv) scalars.

use mixer_core::mixer::Decoder;
use mixer_core::mixers::attention::{Attention, Logits, dot_f64};
use mixer_core::tensor::contiguous;
use mixer_core::{Dims, DimsExt, Error, Real, Result, Tensors};
use ndarray::{ArrayD, IxDyn};

/// The attention KV-cache decoder on CPU.
pub struct AttentionDecoder<F> {
    t_len: usize,
    dims: [usize; 4], // B, H, Dk, Dv
    cap: usize,
    logits: Logits,
    keys: Vec<F>,   // [cap, B, H, Dk]
    values: Vec<F>, // [cap, B, H, Dv]
    pos: usize,
}

impl<F: Real> AttentionDecoder<F> {
    /// A decoder for `T` tokens of `B × H` heads.
    pub fn new(a: &Attention, dims: &Dims) -> Result<Self> {
        let (t_len, bn, hn, dk, dv) =
            (dims.size("T")?, dims.size("B")?, dims.size("H")?, dims.size("Dk")?, dims.size("Dv")?);
        let cap = a.window().unwrap_or(t_len).min(t_len);
        Ok(AttentionDecoder {
            t_len,
            dims: [bn, hn, dk, dv],
            cap,
            logits: a.logits(dk),
            keys: vec![F::zero(); cap * bn * hn * dk],
            values: vec![F::zero(); cap * bn * hn * dv],
            pos: 0,
        })
    }
}

impl<F: Real> Decoder<F> for AttentionDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let t = self.pos;
        mixer_core::mixer::check_decoder_capacity(t, self.t_len)?;
        let [bn, hn, dk, dv] = self.dims;
        let q = contiguous(token, "q", &[bn, hn, dk])?;
        let k = contiguous(token, "k", &[bn, hn, dk])?;
        let v = contiguous(token, "v", &[bn, hn, dv])?;
        let slot = t % self.cap;
        let nk = bn * hn * dk;
        let nv = bn * hn * dv;
        self.keys[slot * nk..(slot + 1) * nk].copy_from_slice(&k);
        self.values[slot * nv..(slot + 1) * nv].copy_from_slice(&v);
        let first = (t + 1).saturating_sub(self.cap);
        let mut y = vec![F::zero(); nv];
        let mut scores = vec![0.0f64; t + 1 - first];
        for bh in 0..bn * hn {
            let qv = &q[bh * dk..(bh + 1) * dk];
            for (i, s) in (first..=t).enumerate() {
                let kv = &self.keys[(s % self.cap) * nk + bh * dk..][..dk];
                scores[i] = self.logits.key(dot_f64(qv.iter().copied(), kv.iter().copied()), t, s)?;
            }
            let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut den = F::zero();
            let out = &mut y[bh * dv..(bh + 1) * dv];
            for (i, s) in (first..=t).enumerate() {
                let e = F::of(self.logits.weight(scores[i], mx));
                den += e;
                let vv = &self.values[(s % self.cap) * nv + bh * dv..][..dv];
                for (o, &x) in out.iter_mut().zip(vv) {
                    *o += e * x;
                }
            }
            for o in out.iter_mut() {
                *o /= den;
            }
        }
        self.pos += 1;
        ArrayD::from_shape_vec(IxDyn(&[bn, hn, dv]), y).map_err(|e| Error::Decoder(e.to_string()))
    }

    fn cache_elems(&self) -> usize {
        let [bn, hn, dk, dv] = self.dims;
        self.pos.min(self.cap) * bn * hn * (dk + dv)
    }

    fn position(&self) -> usize {
        self.pos
    }
}
