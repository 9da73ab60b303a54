//! Softmax attention and local attention on CUDA (docs/math.md §1.3):
//! `y_t = Σ_{s ≤ t, t−s < w} softmax_s(scale· q_t · k_s) v_s`.
//!
//! - `fast`: a tiled online-softmax forward ([`fast`]): one block per (query tile, batch·head),
//!   key/value tiles staged in shared memory, a running maximum and normalizer per query,
//!   causal and window masks applied before exponentiating. `O(T²)` work (or `O(T w)` with a
//!   window), `O(T)` memory. In the `tf32` and `bf16` modes, the fused tensor-core kernel ([`fused`]).
//! - `recurrent`: a decoder with the KV cache **on the device** ([`decoder`]), a ring buffer of
//!   `min(T, w)` positions; each step appends `k_t, v_t` and runs one block per (batch, head).
//! - backward of `fast`: FlashAttention-2 style ([`backward`]): per-row softmax statistics, then
//!   one pass per key tile for `d_k, d_v` and one per query tile for `d_q`, no atomics.

pub mod backward;
pub mod common;
pub mod decoder;
pub mod fast;
pub mod fused;

use mixer_core::mixers::attention::Attention;

use crate::forms::{DeviceBackwardFn, DeviceDecoderFn, DeviceFamily, DeviceFormFn};
use crate::runtime::GpuReal;

use common::FAMILY;

/// Softmax attention on CUDA.
pub struct AttentionCuda;

impl<F: GpuReal> DeviceFamily<F> for AttentionCuda {
    type Mixer = Attention;
    fn fast() -> Option<DeviceFormFn<Attention>> {
        Some(fast::run::<F>)
    }
    fn decoder() -> Option<DeviceDecoderFn<Attention, F>> {
        Some(|a, _statics, dims| Ok(Box::new(decoder::AttentionDecoder::<F>::new(a, dims)?)))
    }
    fn backward() -> Option<DeviceBackwardFn<Attention>> {
        Some(backward::run::<F>)
    }
}

cuda_family!(ATTENTION_CUDA, FAMILY, AttentionCuda);
