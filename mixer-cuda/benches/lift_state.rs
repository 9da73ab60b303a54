//! The lifts' `fast` form from a level state on CUDA (docs/gpu-report.md, "The lifts from a
//! state"): `T` new tokens after `a` earlier ones, per lift, shape and precision mode, CUDA-event
//! medians on device-resident tensors (`mixer_cuda::timing::median_event_time`) of
//! - `state`: the lift from a random level state at position `a` (`run_device_from_state`): every
//!   launch of its segments (the lift from zero on each, the base mixer's rows, the gathers and
//!   merges) and the stream's idle gap while the host reads the positions back;
//! - `new`: the lift's `fast` form over the `T` tokens alone, from zero (no state);
//! - `base`: the base mixer's `fast` form from a state over the same `T` tokens (one state, no
//!   levels: the floor a lift from a state could reach).
//!
//! One JSON object per line on stdout. Needs a GPU:
//!
//!     cargo bench -p mixer-cuda --bench lift_state -- [--quick] [--reps N]

use mixer_core::mixer::Mixer;
use mixer_core::mixers::loglinear::lift_state::at_positions;
use mixer_core::{Dims, Form, Precision, Tensors};
use mixer_cuda::forms::upload_inputs;
use mixer_cuda::timing::{bench_options, median_event_time};
use mixer_cuda::{run_device, run_device_from_state};

/// `(B, a, T, H, D)`: chunked prefill after a power of two and after an odd position (a segment
/// per set bit of `a` at the start), batches, head dims 64 and 128, few tokens after a long prefix.
const SHAPES: [(usize, usize, usize, usize, usize); 6] = [
    (1, 16384, 2048, 16, 64),
    (1, 17001, 2048, 16, 64),
    (8, 4096, 512, 16, 64),
    (8, 4095, 512, 16, 128),
    (1, 65535, 64, 16, 64),
    (1, 12345, 4096, 16, 128),
];

fn dims([b, t, h, d, l]: [usize; 5]) -> Dims {
    [("B", b), ("T", t), ("H", h), ("Dk", d), ("Dv", d), ("L", l)].into_iter().collect()
}

/// A random level state of `m` at position `a` for every batch row (slots zero where `a`'s bit is
/// clear).
fn state_at(m: &dyn Mixer, d: &Dims, a: usize) -> mixer_core::Result<Tensors<f32>> {
    let mut s = m.random_state(d, 5)?;
    at_positions(&mut s, &vec![a; d.get("B").copied().unwrap_or(1)])?;
    Ok(mixer_core::tensor::cast_tensors::<f32>(&s))
}

fn main() -> mixer_core::Result<()> {
    let (quick, reps) = bench_options();
    let shapes = if quick { &SHAPES[..2] } else { &SHAPES[..] };
    for name in ["loglinear-mamba2", "loglinear-gated-deltanet"] {
        let m = mixer_registry::mixer(name, &serde_json::json!({}))?;
        let base_name = name.trim_start_matches("loglinear-");
        let base = mixer_registry::mixer(base_name, &serde_json::json!({}))?;
        for &(b, a, t, h, d) in shapes {
            let l = mixer_core::fenwick::num_levels(a + t);
            let dm = dims([b, t, h, d, l]);
            let x = mixer_core::tensor::cast_tensors::<f32>(&m.random_inputs(&dm, 3)?);
            let s0 = upload_inputs(&state_at(m.as_ref(), &dm, a)?, Precision::Exact)?;
            let bx: Tensors<f32> = x
                .iter()
                .filter(|(k, _)| !k.starts_with("lambda"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let bs = upload_inputs(
                &mixer_core::tensor::cast_tensors::<f32>(&base.random_state(&dm, 6)?),
                Precision::Exact,
            )?;
            for p in [Precision::Exact, Precision::Tf32] {
                let (xd, bd) = (upload_inputs(&x, p)?, upload_inputs(&bx, p)?);
                let (m, base) = (m.as_ref(), base.as_ref());
                let t_state = median_event_time(reps, 10.0, || run_device_from_state(m, &xd, Some(&s0), p))?;
                let t_new = median_event_time(reps, 10.0, || run_device(m, Form::Fast, &xd, p))?;
                let t_base =
                    median_event_time(reps, 10.0, || run_device_from_state(base, &bd, Some(&bs), p))?;
                println!(
                    "{}",
                    serde_json::json!({
                        "mixer": name, "B": b, "a": a, "T": t, "H": h, "D": d, "mode": p.name(),
                        "segments": segments(a, t),
                        "state_ms": t_state * 1e3, "new_ms": t_new * 1e3, "base_ms": t_base * 1e3,
                    })
                );
            }
        }
    }
    Ok(())
}

/// How many segments the run from `a` takes (module documentation of `loglinear::lift_state`).
fn segments(a: usize, t: usize) -> usize {
    mixer_cuda::loglinear::lift_state::segments(a, t).len()
}
