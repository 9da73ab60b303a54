//! The recurrent form of attention: a KV cache. Token `t` appends `(k_t, v_t)` and attends
//! over the cached keys `s ∈ [max(0, t + 1 − w), t]` with a (max-subtracted) softmax whose keys
//! and maximum are `f64` ([`Logits`]), so no finite input overflows. The cache is a ring of
//! `min(w, T)` slots (all `T` for full attention) per (batch, head), rows contiguous, so it holds
//! `min(t + 1, w)` tokens × B × H × (Dk + Dv) scalars.
//!
//! Per (batch, head), in parallel over them when the step is large. In `f32` on CPUs with
//! AVX-512 the step runs the vector loops of the fused fast form ([`super::decode_fused`]:
//! scores 16 keys at a time, weights `2^{|σ|·log₂e·(u_s − max u)}` by the fast form's `exp2`,
//! the value rows added into register accumulators). Elsewhere (`f64`, other CPUs, and the
//! inputs that path declines: a score or the scores' range beyond `f32`): the scores `q·k_s` in
//! `F` with independent partial sums (vectorised; formed again in `f64` where `F` overflows, as
//! in the fast form), the keys and their maximum in `f64`, the weights `e^{|σ|(u_s − max u)}`
//! by the vectorised exponential of [`VecMath`] on the `f64` differences rounded to `F`, and
//! `y = Σ_s w_s v_s / Σ_s w_s` with the value rows added in order.

use mixer_core::mixer::Decoder;
use mixer_core::mixers::attention::state::LENGTH;
use mixer_core::mixers::attention::{Attention, Logits};
use mixer_core::parallel::min_len;
use mixer_core::real::dot8;
use mixer_core::tensor::contiguous;
use mixer_core::{Dims, DimsExt, Error, Result, Tensors};
use ndarray::{ArrayD, ArrayView1, IxDyn};
use rayon::prelude::*;

use crate::vmath::VecMath;

/// Cache entries × head dims per step above which the heads run in parallel.
const PAR_WORK: usize = 1 << 16;

/// The attention KV-cache decoder on CPU.
pub struct AttentionDecoder<F> {
    t_len: usize,
    dims: [usize; 4], // B, H, Dk, Dv
    cap: usize,
    logits: Logits,
    /// Whether `σ < 0`.
    neg: bool,
    /// The window `w`.
    window: Option<usize>,
    keys: Vec<F>,   // [B·H, cap, Dk]
    values: Vec<F>, // [B·H, cap, Dv]
    pos: usize,
    /// The capacity `N` of the exported state's cache (docs/math.md §7.1).
    state_cap: usize,
}

impl<F: VecMath> AttentionDecoder<F> {
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
            neg: a.scale(dk) < 0.0,
            window: a.window(),
            keys: vec![F::zero(); cap * bn * hn * dk],
            values: vec![F::zero(); cap * bn * hn * dv],
            pos: 0,
            state_cap: a.window().map_or(t_len, |w| w - 1),
        })
    }

    /// A decoder for `T` more tokens after the `len` tokens cached in the state `cache`
    /// (`k [B, N, H, Dk]`, `v [B, N, H, Dv]`, every row holding `len`; docs/math.md §7.1): the
    /// cached tokens become tokens `0 … len − 1` of the ring, and [`Decoder::state`] exports a
    /// cache of the same capacity `N`.
    pub fn from_state(a: &Attention, dims: &Dims, cache: Option<(&Tensors<F>, usize)>) -> Result<Self> {
        let Some((s, len)) = cache else { return Self::new(a, dims) };
        let mut more = dims.clone();
        more.insert("T", dims.size("T")? + len);
        let mut d = Self::new(a, &more)?;
        let [bn, hn, dk, dv] = d.dims;
        let (ka, va) = (mixer_core::tensor::get(s, "k")?, mixer_core::tensor::get(s, "v")?);
        let (k, v) = (contiguous(s, "k", ka.shape())?, contiguous(s, "v", va.shape())?);
        let n = ka.shape()[1];
        for (b, h, j) in (0..bn).flat_map(|b| (0..hn).flat_map(move |h| (0..len).map(move |j| (b, h, j)))) {
            let (bh, slot, row) = (b * hn + h, j % d.cap, (b * n + j) * hn + h);
            d.keys[(bh * d.cap + slot) * dk..][..dk].copy_from_slice(&k[row * dk..][..dk]);
            d.values[(bh * d.cap + slot) * dv..][..dv].copy_from_slice(&v[row * dv..][..dv]);
        }
        d.pos = len;
        d.state_cap = n;
        Ok(d)
    }
}

/// One head's output over the cached rows `slots` (token indices `first..=t` in order):
/// `out = Σ w_s v_s / Σ w_s`. `u` and `w` are scratch of at least `slots.len()` entries;
/// `neg` whether `σ < 0`.
#[allow(clippy::too_many_arguments)]
fn head<F: VecMath>(
    (lg, neg): (&Logits, bool),
    q: &[F],
    keys: &[F],
    values: &[F],
    (cap, first, t): (usize, usize, usize),
    u: &mut [f64],
    w: &mut [F],
    out: &mut [F],
) -> Result<()> {
    let (dk, dv, n) = (q.len(), out.len(), t + 1 - first);
    if let (Some(qf), Some(kf), Some(vf)) = (F::as_f32(q), F::as_f32(keys), F::as_f32(values))
        && let (Some(wf), Some(of)) = (F::as_f32_mut(w), F::as_f32_mut(&mut *out))
        && super::decode_fused::head(qf, kf, vf, (cap, first, t), neg, lg.weight_scale(), wf, of)
    {
        return Ok(());
    }
    let mut mx = f64::NEG_INFINITY;
    for (i, s) in (first..=t).enumerate() {
        let kr = &keys[(s % cap) * dk..][..dk];
        let key = super::key(lg, dot8(q, kr), ArrayView1::from(q), ArrayView1::from(kr), t, s)?;
        u[i] = key;
        mx = mx.max(key);
    }
    // e^{|σ|(u − max)}: the difference and product in f64 (≤ 0, so no overflow), the
    // exponential vectorised in F; |σ| = 0 gives 0·d = 0, weight 1, as Logits::weight.
    let abs = lg.weight_scale();
    for (wi, &ui) in w[..n].iter_mut().zip(&u[..n]) {
        *wi = F::of(abs * (ui - mx));
    }
    let den = F::exp_scaled_sum(&mut w[..n], F::zero(), F::one());
    out.fill(F::zero());
    for (i, s) in (first..=t).enumerate() {
        let vr = &values[(s % cap) * dv..][..dv];
        let e = w[i];
        for (o, &x) in out.iter_mut().zip(vr) {
            *o += e * x;
        }
    }
    for o in out.iter_mut() {
        *o /= den;
    }
    Ok(())
}

impl<F: VecMath> Decoder<F> for AttentionDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let t = self.pos;
        mixer_core::mixer::check_decoder_capacity(t, self.t_len)?;
        let [bn, hn, dk, dv] = self.dims;
        let q = contiguous(token, "q", &[bn, hn, dk])?;
        let k = contiguous(token, "k", &[bn, hn, dk])?;
        let v = contiguous(token, "v", &[bn, hn, dv])?;
        let (cap, slot) = (self.cap, t % self.cap);
        for bh in 0..bn * hn {
            self.keys[(bh * cap + slot) * dk..][..dk].copy_from_slice(&k[bh * dk..(bh + 1) * dk]);
            self.values[(bh * cap + slot) * dv..][..dv].copy_from_slice(&v[bh * dv..(bh + 1) * dv]);
        }
        let first = (t + 1).saturating_sub(cap);
        let n = t + 1 - first;
        let mut y = vec![F::zero(); bn * hn * dv];
        let (keys, values, lg) = (&self.keys, &self.values, (&self.logits, self.neg));
        let run = |(bh, out): (usize, &mut [F]), u: &mut Vec<f64>, w: &mut Vec<F>| {
            let kh = &keys[bh * cap * dk..(bh + 1) * cap * dk];
            let vh = &values[bh * cap * dv..(bh + 1) * cap * dv];
            head(lg, &q[bh * dk..(bh + 1) * dk], kh, vh, (cap, first, t), u, w, out)
        };
        let scratch = || (vec![0.0f64; n], vec![F::zero(); n]);
        if dv > 0 && n * bn * hn * (dk + dv) >= PAR_WORK {
            y.par_chunks_mut(dv)
                .with_min_len(min_len())
                .enumerate()
                .map_init(scratch, |(u, w), job| run(job, u, w))
                .collect::<Result<()>>()?;
        } else if dv > 0 {
            let (mut u, mut w) = scratch();
            for job in y.chunks_mut(dv).enumerate() {
                run(job, &mut u, &mut w)?;
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

    /// The cache of the last `min(pos, w − 1)` tokens (all `pos` without a window) at rows
    /// `0 …`, oldest first, in a cache of the capacity this decoder was built with.
    fn state(&self) -> Result<Tensors<F>> {
        let [bn, hn, dk, dv] = self.dims;
        let (n, cap) = (self.state_cap, self.cap);
        let len = self.window.map_or(self.pos, |w| self.pos.min(w - 1));
        if len > n {
            return Err(Error::Decoder(format!(
                "the decoder holds {len} tokens, more than the state's capacity N = {n}"
            )));
        }
        let mut k = ndarray::Array4::<F>::zeros((bn, n, hn, dk));
        let mut v = ndarray::Array4::<F>::zeros((bn, n, hn, dv));
        for (b, h, j) in (0..bn).flat_map(|b| (0..hn).flat_map(move |h| (0..len).map(move |j| (b, h, j)))) {
            let (bh, slot) = (b * hn + h, (self.pos - len + j) % cap);
            for c in 0..dk {
                k[[b, j, h, c]] = self.keys[(bh * cap + slot) * dk + c];
            }
            for c in 0..dv {
                v[[b, j, h, c]] = self.values[(bh * cap + slot) * dv + c];
            }
        }
        let l = ArrayD::from_elem(IxDyn(&[bn]), F::of(len as f64));
        Ok([("k".to_string(), k.into_dyn()), (LENGTH.to_string(), l), ("v".to_string(), v.into_dyn())]
            .into_iter()
            .collect())
    }
}
