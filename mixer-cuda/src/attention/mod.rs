//! Softmax attention and local attention on CUDA (docs/math.md §1.3):
//! `y_t = Σ_{s ≤ t, t−s < w} softmax_s(scale· q_t · k_s) v_s`.
//!
//! - `fast`: the forward of [`fast`]: one launch ([`fast::plan`]) of either the exact kernel
//!   (FlashAttention-2 on the FMA units, f32 or f64, head dims up to 256 and more: register tiles of scores and
//!   outputs, key/value tiles in shared memory, a running maximum and normalizer per query, masks
//!   on boundary tiles only) or, in the `tf32` and `bf16` modes at `Dk = Dv ∈ {32, 64, 96, 128}`,
//!   the fused tensor-core kernel ([`fused`]). `O(T²)` work (or `O(T w)` with a window), `O(T)`
//!   memory.
//! - `recurrent`: a decoder with the KV cache **on the device** ([`decoder`]), a ring buffer of
//!   `min(T, w)` positions; each step appends `k_t, v_t` and runs one block per (batch, head).
//! - backward of `fast`: FlashAttention-2 style ([`backward`]): per-row softmax statistics, then
//!   one pass per key tile for `d_k, d_v` and one per query tile for `d_q`, no atomics; on
//!   tensor cores in the `tf32` and `bf16` modes where [`backward_fused::plan`] applies.

pub mod backward;
pub mod backward_fused;
pub mod common;
pub mod decoder;
pub mod fast;
pub mod fused;
pub mod state;

use mixer_core::mixers::attention::Attention;

use crate::forms::{
    DeviceBackwardFn, DeviceDecoderFn, DeviceFamily, DeviceFormFn, DeviceSavingFn, DeviceStateBackwardFn,
    DeviceStateFn,
};
use crate::runtime::{gpu, max_dynamic_smem};
use crate::tensor::GpuReal;
use mixer_core::{Dims, Form, Precision, Result, Tensors};
use mixer_registry::StateDecoderFn;

use common::FAMILY;

/// Softmax attention on CUDA.
pub struct AttentionCuda;

impl<F: GpuReal> DeviceFamily<F> for AttentionCuda {
    type Mixer = Attention;
    /// The fast form's launch ([`fast::plan`]) on this process's device, with the activations
    /// stored as the mode stores them (bf16 in the bf16 mode); `null` where nothing is launched. Its
    /// key `backward` holds the tensor-core backward's launches ([`backward_fused::plan`]), `null`
    /// where the exact backward kernels run.
    fn plan(a: &Attention, form: Form, dims: &Dims, p: Precision) -> Option<Result<serde_json::Value>> {
        if form != Form::Fast {
            return None;
        }
        let storage = match p {
            Precision::Bf16 => fast::Storage::Bf16,
            _ if F::SUFFIX == "f64" => fast::Storage::F64,
            _ => fast::Storage::F32,
        };
        let shape = ["B", "T", "H", "Dk", "Dv"].map(|k| dims.get(k).copied().unwrap_or(0));
        let wgmma = gpu().is_ok_and(|g| g.has_wgmma());
        Some((|| {
            let mut plan = to_json(&fast::plan(a, shape, p, storage, max_dynamic_smem(), wgmma)?)?;
            // The tensor-core backward's launches where its plan applies (null: the exact kernels).
            let backward = backward_fused::plan(a, shape, p, storage, max_dynamic_smem(), wgmma)?;
            if let Some(obj) = plan.as_object_mut() {
                obj.insert("backward".into(), to_json(&backward)?);
            }
            Ok(plan)
        })())
    }
    fn fast() -> Option<DeviceFormFn<Attention>> {
        Some(fast::run::<F>)
    }
    fn decoder() -> Option<DeviceDecoderFn<Attention, F>> {
        Some(|a, _statics, dims| Ok(Box::new(decoder::AttentionDecoder::<F>::new(a, dims)?)))
    }
    fn decoder_from_state() -> Option<StateDecoderFn<Attention, F>> {
        Some(decoder::from_state::<F>)
    }
    fn backward() -> Option<DeviceBackwardFn<Attention>> {
        Some(backward::run::<F>)
    }
    /// With the tensor-core backward's statistics ([`backward::run_saving`]).
    fn fast_saving() -> Option<DeviceSavingFn<Attention>> {
        Some(backward::run_saving::<F>)
    }
    /// From a KV cache: the run's queries against the cached keys and its own ([`state`]).
    fn fast_from_state() -> Option<DeviceStateFn<Attention>> {
        Some(state::run_from::<F>)
    }
    /// The host's checks of a cache: the lengths and the zero rows past them
    /// (`mixer_core::mixers::attention::state::lengths`).
    fn check_host_state(a: &Attention, x: &Tensors<F>, s: &Tensors<F>) -> Result<()> {
        let t_len = x.get("q").map_or(0, |q| q.shape()[1]);
        mixer_core::mixers::attention::state::lengths(a, s, t_len).map(drop)
    }
    /// From a KV cache: the backward on the extension by the cache, on the device ([`state`]).
    fn fast_backward_from_state() -> Option<DeviceStateBackwardFn<Attention>> {
        Some(state::backward_from::<F>)
    }
}

cuda_family!(ATTENTION_CUDA, FAMILY, AttentionCuda);

/// A plan as JSON.
fn to_json<T: serde::Serialize>(v: &T) -> Result<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| crate::runtime::err(FAMILY, format!("plan as JSON: {e}")))
}
