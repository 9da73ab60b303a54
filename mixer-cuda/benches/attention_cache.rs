//! Attention continuing a KV cache on CUDA (docs/gpu-report.md, "Attention from a KV cache"): `T`
//! new tokens after `L` cached ones, per shape and precision mode, CUDA-event medians on
//! device-resident tensors (`mixer_cuda::timing::event_times`) of
//! - `cached`: the `fast` form from the cache (`run_device_from_state`): the keys and values put
//!   together with the cache, the kernels, the final cache, the lengths' upload; not the lengths'
//!   read-back before the launches (it waits for the stream, so it falls outside the events);
//! - `whole`: the `fast` form over all `L + T` tokens, what the run from a cache cost when it ran
//!   on the cache's extension (the kernels alone, without that path's host copies);
//! - `new`: the `fast` form over the `T` new tokens alone (no cache).
//!
//! One JSON object per line on stdout (`bench/gpu/attention_cache.py` adds SDPA's time for the same
//! shapes and prints the table). Needs a GPU:
//!
//!     cargo bench -p mixer-cuda --bench attention_cache -- [--quick] [--reps N]

use mixer_core::{Form, Precision, Tensors};
use mixer_cuda::forms::upload_inputs;
use mixer_cuda::timing::{bench_options, median_event_time};
use mixer_cuda::{run_device, run_device_from_state};
use ndarray::{ArrayD, IxDyn};

/// `(B, L, T, H, D)`.
const SHAPES: [(usize, usize, usize, usize, usize); 6] = [
    (1, 16384, 512, 16, 64),
    (1, 16384, 512, 16, 128),
    (8, 4096, 256, 16, 64),
    (8, 4096, 256, 16, 128),
    (1, 65536, 64, 16, 128),
    (1, 65536, 2048, 16, 64),
];

/// Uniform values in `[−1, 1)` from a 64-bit LCG (fast for the large caches).
fn random(shape: &[usize], seed: u64) -> ArrayD<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 40) as f32) / (1u64 << 23) as f32 - 1.0
    })
}

fn main() -> mixer_core::Result<()> {
    let (quick, reps) = bench_options();
    let m = mixer_registry::mixer("attention", &serde_json::json!({}))?;
    let shapes = if quick { &SHAPES[..2] } else { &SHAPES[..] };
    for &(b, l, t, h, d) in shapes {
        let x: Tensors<f32> = ["q", "k", "v"]
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), random(&[b, t, h, d], 3 + i as u64)))
            .collect();
        // The cache: `L` rows of capacity `L + T`, and the whole sequence's inputs.
        let mut s0 = Tensors::<f32>::new();
        let mut whole = Tensors::<f32>::new();
        whole.insert("q".into(), random(&[b, l + t, h, d], 9));
        for n in ["k", "v"] {
            let past = random(&[b, l, h, d], if n == "k" { 7 } else { 8 });
            let mut c = ArrayD::<f32>::zeros(IxDyn(&[b, l + t, h, d]));
            c.slice_mut(ndarray::s![.., ..l, .., ..]).assign(&past);
            s0.insert(n.into(), c.clone());
            c.slice_mut(ndarray::s![.., l.., .., ..]).assign(&x[n]);
            whole.insert(n.into(), c);
        }
        s0.insert("length".into(), ArrayD::from_elem(IxDyn(&[b]), l as f32));
        let s0 = upload_inputs(&s0, Precision::Exact)?;
        for p in [Precision::Exact, Precision::Tf32, Precision::Bf16] {
            let (xd, wd) = (upload_inputs(&x, p)?, upload_inputs(&whole, p)?);
            let m = m.as_ref();
            // Each timed after one warm-up call (compilation, plans, the pool).
            let time = |f: &dyn Fn() -> mixer_core::Result<()>| median_event_time(reps, 10.0, f);
            let t_cached = time(&|| run_device_from_state(m, &xd, Some(&s0), p).map(drop))?;
            let t_whole = time(&|| run_device(m, Form::Fast, &wd, p).map(drop))?;
            let t_new = time(&|| run_device(m, Form::Fast, &xd, p).map(drop))?;
            println!(
                "{}",
                serde_json::json!({
                    "B": b, "L": l, "T": t, "H": h, "D": d, "mode": p.name(),
                    "cached_ms": t_cached * 1e3, "whole_ms": t_whole * 1e3, "new_ms": t_new * 1e3,
                })
            );
        }
    }
    Ok(())
}
