//! Generalized linear recurrence on CUDA (docs/math.md §1.2), for any offset pattern, on `b`,
//! `a` or `both`, translation-invariant or cache-efficient:
//! `y_t = α_{t,0} x_t + Σ_{k: f(k) ≤ t} (α_{t,k+1} x_{d_k(t)} + β_{t,k} y_{d_k(t)})`.
//!
//! The pattern reaches the GPU as the table of [`mixer_core::pattern::Slots`] (offsets `f(k)`
//! and lattice strides `a_k`, `k < K(T)`), computed on the host by the same code as every other
//! form, so a plugin pattern works with no kernel of its own.
//! - `fast`: the sparse recurrence, pipelined over tiles of 64 tokens: per block of 8 channels
//!   one warp runs the sequential part (one FMA per token on its critical path) while the other
//!   threads gather the next tile's terms ([`fast`]); `O(T · K)` work per channel.
//! - `recurrent`: a decoder whose cache holds exactly the positions later tokens read
//!   (the lattice's `P_{t+1}`, or the last `f(K−1)` outputs for translation-invariant
//!   patterns), on the device; slots are assigned on the host ([`decoder`]).
//! - backward of `fast` ([`backward`]): the reverse sparse recurrence, one thread per (batch,
//!   channel) running tokens from `T − 1` down and scattering each token's cotangent to the
//!   positions it read, then every gradient in parallel; `O(T · K)` work per channel.

pub mod backward;
pub mod common;
pub mod decoder;
pub mod fast;

use mixer_core::mixer::Mixer;
use mixer_core::mixers::glr::Glr;
use mixer_core::mixers::glr::state as glr_state;
use mixer_core::state::StateVjp;
use mixer_core::state::{cut, scatter};
use mixer_core::tensor::get;
use mixer_core::{Real, Requires, Result, Tensors};
use mixer_registry::StateDecoderFn;
use ndarray::ArrayD;

use crate::forms::{
    DeviceBackwardFn, DeviceDecoderFn, DeviceFamily, DeviceFormFn, Extension, host_backward, host_fast,
};
use crate::tensor::GpuReal;

use common::FAMILY;

/// The GLR on CUDA.
pub struct GlrCuda;

impl<F: GpuReal> DeviceFamily<F> for GlrCuda {
    type Mixer = Glr;
    fn fast() -> Option<DeviceFormFn<Glr>> {
        Some(fast::run::<F>)
    }
    fn backward() -> Option<DeviceBackwardFn<Glr>> {
        Some(backward::run::<F>)
    }
    fn decoder() -> Option<DeviceDecoderFn<Glr, F>> {
        Some(|g, _statics, dims| Ok(Box::new(decoder::GlrDecoder::<F>::new(g, dims)?)))
    }
    fn decoder_from_state() -> Option<StateDecoderFn<Glr, F>> {
        Some(decoder::from_state::<F>)
    }
    /// From a state (the past outputs the pattern reads): the fast form and its backward on the
    /// extension by them ([`glr_state`]).
    fn extension() -> Option<Extension<Glr, F>> {
        Some(Extension {
            run: |g, x, s| glr_state::run(g, x, s, |e| host_fast::<F, GlrCuda>(g, &exact_slots(g, e)?)),
            backward: |g, x, s, dy, df, req| {
                let args = StateVjp { x, initial: s, dy, d_final: df, requires: req };
                glr_state::vjp(g, args, |e, d| {
                    let grads = host_backward::<F, GlrCuda>(g, &exact_slots(g, e)?, d, &Requires::All)?;
                    padded(grads, e)
                })
            },
        })
    }
}

/// The extended inputs `e` with their slot axes cut to exactly the `K(T)` slots of their length
/// (`Mixer::length_axes`), as the CUDA forms take them: an extension by a state carries the
/// slots of the whole sequence, and the slots past `K(T)` are never read (docs/math.md §1.1).
fn exact_slots<F: Real>(g: &Glr, e: &Tensors<F>) -> Result<Tensors<F>> {
    let t = get(e, "x")?.shape().get(1).copied().unwrap_or(0);
    cut(e, &[], &g.length_axes(t), 0..t)
}

/// The gradients of [`exact_slots`]'s inputs as gradients of `e`'s: zero in the slots that were
/// cut (they are never read).
fn padded<F: Real>(grads: Tensors<F>, e: &Tensors<F>) -> Result<Tensors<F>> {
    grads
        .into_iter()
        .map(|(k, g)| {
            let Some(full) = k.strip_prefix("d_").and_then(|n| e.get(n)) else { return Ok((k, g)) };
            if full.shape() == g.shape() {
                return Ok((k, g));
            }
            let mut out = ArrayD::<F>::zeros(full.raw_dim());
            let t = g.shape().get(1).copied().unwrap_or(0);
            scatter(&mut out, &g, 0..t, true)?;
            Ok((k, out))
        })
        .collect()
}

cuda_family!(GLR_CUDA, FAMILY, GlrCuda);
