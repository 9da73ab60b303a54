//! CPU forms of softmax attention (docs/math.md §1.3): `attention` and `local-attention`.
//!
//! - `parallel`: the masked-softmax matrix per head, `Y = softmax(σ QKᵀ + M)V`
//!   ([`parallel`], `O(T²)` memory per head);
//! - `fast`: streaming over key blocks with an online softmax, flash-style ([`fast`]):
//!   `O(T)` memory, never a `T × T` matrix; with a window `w` only the key blocks that
//!   intersect `(t − w, t]` are visited, so local attention costs `O(T · w)`;
//! - `recurrent`: a KV-cache decoder ([`decoder`]) holding `min(t, w)` keys and values.

pub mod backward;
mod decode_fused;
pub mod decoder;
pub mod fast;
mod fused;
pub mod parallel;

use mixer_core::Form;
use mixer_core::mixers::attention::{Attention, Logits, dot_f64};
use mixer_core::tensor::get;
use mixer_core::{Error, Real, Result, Tensors};
use mixer_registry::{BackwardFn, DecoderFn, Family, FamilyEntry, FormFn, register};
use ndarray::{Array4, ArrayView1};
use rayon::prelude::*;

/// `a [B,T,H,D]` as a contiguous `[B,H,T,D]` array (one head's rows contiguous), copied
/// row by row (the `D` values of one `(b, t, h)` are contiguous in the input), in parallel
/// over `(b, h)`.
pub(crate) fn heads_major<F: Real>(inputs: &Tensors<F>, name: &str) -> Result<Array4<F>> {
    let a = get(inputs, name)?;
    if a.ndim() != 4 {
        return Err(Error::shape(name, "[B, T, H, D]", mixer_core::error::fmt_shape(a.shape())));
    }
    let (bn, tn, hn, dn) = (a.shape()[0], a.shape()[1], a.shape()[2], a.shape()[3]);
    let src = a.as_standard_layout();
    let src = src.as_slice().expect("a standard-layout array is contiguous");
    let mut data = vec![F::zero(); src.len()];
    if tn * dn > 0 {
        data.par_chunks_mut(tn * dn).enumerate().for_each(|(bh, dst)| {
            let (b, h) = (bh / hn, bh % hn);
            for (t, row) in dst.chunks_exact_mut(dn).enumerate() {
                row.copy_from_slice(&src[((b * tn + t) * hn + h) * dn..][..dn]);
            }
        });
    }
    Array4::from_shape_vec((bn, hn, tn, dn), data).map_err(|e| Error::Numerical(e.to_string()))
}

/// The softmax key ([`Logits::key`]) of a score `dot` computed in `F` between query row
/// `q` (token `t`) and key row `k` (token `s`): where `F` overflowed (an `f32` q·k beyond
/// 3.4e38), the dot product is formed again in `f64`.
pub(crate) fn key<F: Real>(
    lg: &Logits,
    dot: F,
    q: ArrayView1<'_, F>,
    k: ArrayView1<'_, F>,
    t: usize,
    s: usize,
) -> Result<f64> {
    let d = dot.f64();
    if d.is_finite() {
        return lg.key(d, t, s);
    }
    lg.key(dot_f64(q.iter().copied(), k.iter().copied()), t, s)
}

/// Softmax attention on CPU.
struct AttentionCpu;

impl<F: crate::vmath::VecMath> Family<F> for AttentionCpu {
    type Mixer = Attention;
    fn parallel(&self) -> Option<FormFn<Attention, F>> {
        Some(parallel::parallel)
    }
    fn fast(&self) -> Option<FormFn<Attention, F>> {
        Some(fast::fast)
    }
    fn decoder(&self) -> Option<DecoderFn<Attention, F>> {
        Some(|a, _statics, dims| Ok(Box::new(decoder::AttentionDecoder::<F>::new(a, dims)?)))
    }
    fn backward(&self, form: Form) -> Option<BackwardFn<Attention, F>> {
        (form == Form::Fast).then_some(backward::vjp)
    }
}

#[register]
static ATTENTION_CPU: FamilyEntry =
    FamilyEntry { family: "attention", backend: "cpu", f64: &AttentionCpu, f32: &AttentionCpu, device: None };
