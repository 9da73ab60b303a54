//! CPU forms of softmax attention (docs/math.md §1.3): `attention` and `local-attention`.
//!
//! - `parallel`: the masked-softmax matrix per head, `Y = softmax(σ QKᵀ + M)V`
//!   ([`parallel`], `O(T²)` memory per head);
//! - `fast`: streaming over key blocks with an online softmax, flash-style ([`fast`]):
//!   `O(T)` memory, never a `T × T` matrix; with a window `w` only the key blocks that
//!   intersect `(t − w, t]` are visited, so local attention costs `O(T · w)`;
//! - `recurrent`: a KV-cache decoder ([`decoder`]) holding `min(t, w)` keys and values.
//!
//! Every form runs from a KV cache and returns the final one (docs/math.md §7.1): `parallel` and
//! `fast` (and the `fast` backward) on the extension of [`attention_state`], the decoder with
//! the cache loaded ([`decoder_from_state`]).

pub mod backward;
mod decode_fused;
pub mod decoder;
pub mod fast;
mod fused;
pub mod parallel;

use mixer_core::Form;
use mixer_core::mixer::Decoder;
use mixer_core::mixers::attention::state as attention_state;
use mixer_core::mixers::attention::{Attention, Logits, dot_f64};
use mixer_core::parallel::min_len;
use mixer_core::state::StateVjp;
use mixer_core::tensor::get;
use mixer_core::{Dims, DimsExt, Error, Real, Requires, Result, Tensors};
use mixer_registry::{
    BackwardFn, DecoderFn, Family, FamilyEntry, FormFn, StateBackwardFn, StateDecoderFn, StateFn, register,
};
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
        data.par_chunks_mut(tn * dn).with_min_len(min_len()).enumerate().for_each(|(bh, dst)| {
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

/// The decoder started from a KV cache (docs/math.md §7.1; `None`: an empty one): the cached
/// tokens are loaded into its ring. Rows with different cached lengths get one decoder each
/// ([`mixer_core::state::decoder_by_rows`]).
pub fn decoder_from_state<F: crate::vmath::VecMath>(
    a: &Attention,
    _statics: &Tensors<F>,
    dims: &Dims,
    initial: Option<&Tensors<F>>,
) -> Result<Box<dyn Decoder<F>>> {
    let Some(s) = initial else { return Ok(Box::new(decoder::AttentionDecoder::<F>::new(a, dims)?)) };
    let lens = attention_state::lengths(a, s, dims.size("T")?)?;
    let len = lens.first().copied().unwrap_or(0);
    if let Some(d) = mixer_core::state::by_rows_if_uneven(&lens, s, dims, |one, row| {
        decoder_from_state(a, _statics, one, Some(row))
    }) {
        return d;
    }
    let d = decoder::AttentionDecoder::<F>::from_state(a, dims, Some((s, len)))?;
    Ok(mixer_core::state::resumed(Box::new(d), len))
}

/// The rows of the extension `e` of a run of the inputs `x` from a KV cache that are the cache's
/// (its first rows, before the run's own).
fn cached<F>(x: &Tensors<F>, e: &Tensors<F>) -> Result<usize> {
    let rows =
        |t: &Tensors<F>| mixer_core::tensor::get(t, "q").map(|q| q.shape().get(1).copied().unwrap_or(0));
    Ok(rows(e)?.saturating_sub(rows(x)?))
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
    /// `parallel` and `fast` from a KV cache: the form on the extension by the cache
    /// ([`attention_state::run`]); `fast` computes only the extension's rows past the cache
    /// ([`fast::fast_from`]).
    fn stateful(&self, form: Form) -> Option<StateFn<Attention, F>> {
        match form {
            Form::Parallel => Some(|a, x, s| attention_state::run(a, x, s, |e| parallel::parallel(a, e))),
            // Only the extension's rows past the cache: the run's own.
            Form::Fast => {
                Some(|a, x, s| attention_state::run(a, x, s, |e| fast::fast_from(a, e, cached(x, e)?)))
            }
            _ => None,
        }
    }
    fn stateful_backward(&self, form: Form) -> Option<StateBackwardFn<Attention, F>> {
        (form == Form::Fast).then_some(|a, x, s, dy, df, req| {
            // Only the extension's rows past the cache carry a cotangent.
            attention_state::vjp(a, StateVjp { x, initial: s, dy, d_final: df, requires: req }, |e, d| {
                backward::vjp_from(a, e, d, &Requires::All, cached(x, e)?)
            })
        })
    }
    fn decoder_from_state(&self) -> Option<StateDecoderFn<Attention, F>> {
        Some(decoder_from_state)
    }
}

#[register]
static ATTENTION_CPU: FamilyEntry =
    FamilyEntry { family: "attention", backend: "cpu", f64: &AttentionCpu, f32: &AttentionCpu, device: None };
