//! The lifts' `fast` form from a state on CUDA (docs/math.md §7.1, "The lifts' fast form from a
//! state on CUDA"; `mixer_cuda::loglinear::lift_state`): against the CPU's run from the same
//! level states at positions that cut the run into many segments (odd positions, one below a
//! power of two, rows at different positions), forward, final state and backward (every input,
//! λ's parameter, the initial state); split runs on CUDA equal the whole run; device tensors in the
//! tf32 and bf16 modes within the mode's tolerance. GPU tests are `#[ignore]`d and skip without a
//! device (fail under `MIXERS_REQUIRE_CUDA=1`).

use mixer_core::mixer::Mixer;
use mixer_core::mixers::loglinear::lift_state::at_positions;
use mixer_core::state::segment;
use mixer_core::tensor::{cast_tensors, tensors_to_f64};
use mixer_core::{DType, Dims, Form, Precision, Tensors, Tolerance};
use mixer_cuda::forms::upload_inputs;
use mixer_cuda::{AnyDeviceTensor, run_device_from_state};
use mixer_registry::mixer;
use mixer_registry::state::run_state;
use ndarray::{ArrayD, Axis};

use crate::common::{cpu, cuda, gpu};
use crate::state_grads::against_the_cpu;

const LIFTS: [&str; 3] = ["loglinear-attention", "loglinear-mamba2", "loglinear-gated-deltanet"];

fn dims([b, t, h, dk, dv, l]: [usize; 6]) -> Dims {
    [("B", b), ("T", t), ("H", h), ("Dk", dk), ("Dv", dv), ("L", l)].into_iter().collect()
}

/// A random level state of `m` at `dims` whose batch row `b` sits at `pos[b]` (its slots zero
/// where the position's bit is clear, as a state at that position is).
fn state_at(m: &dyn Mixer, d: &Dims, pos: &[usize], seed: u64) -> Tensors<f64> {
    let mut s = m.random_state(d, seed).unwrap();
    at_positions(&mut s, pos).unwrap();
    s
}

/// A mixer of `name` with the config the tests use (scale ≠ 1, and a λ scheme with a parameter
/// for loglinear-mamba2 so that `lambda_param`'s gradient is checked).
fn lift(name: &str) -> Box<dyn Mixer> {
    let cfg = if name == "loglinear-mamba2" {
        serde_json::json!({"scale": 0.8, "lambda_scheme": "softplus"})
    } else {
        serde_json::json!({"scale": 0.8})
    };
    mixer(name, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The cases: per-row positions and run lengths. Positions below and at powers of two, odd ones
/// (a segment per set bit), rows at different positions (run one at a time), position 0.
const CASES: [(&[usize], usize); 7] = [
    (&[0, 0], 77),
    (&[4095, 4095], 70),
    (&[5, 1000], 130),
    (&[63, 64], 65),
    (&[100, 100], 1),
    (&[2047, 6], 300),
    (&[4096, 4096], 64),
];

/// `y`, the final state and the backward (every input, `S̄_0`) on CUDA against the CPU from the
/// same state, f64 (`Tolerance::F64`) and f32 (`Tolerance::F32`, the CPU reference on the
/// f32-rounded values), at [`CASES`], `H = 2`, `Dk = 32`, `Dv = 24`, L = 14 levels.
#[test]
#[ignore = "needs a CUDA device"]
fn lifts_from_a_state_match_the_cpu() {
    let Some(_turn) = gpu() else { return };
    let (cpu, gpu) = (cpu(), cuda());
    let mut bad = Vec::new();
    for name in LIFTS {
        let m = lift(name);
        for (i, &(pos, t)) in CASES.iter().enumerate() {
            let d = dims([pos.len(), t, 2, 32, 24, 14]);
            let x = m.random_inputs(&d, 40 + i as u64).unwrap();
            let s0 = state_at(m.as_ref(), &d, pos, 50 + i as u64);
            let (yc, fc) = run_state(m.as_ref(), &cpu, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
            for (dtype, tol) in [(DType::F64, Tolerance::F64), (DType::F32, Tolerance::F32)] {
                let label = format!("{name} {} positions {pos:?} T = {t}", dtype.name());
                let (y, f) = match dtype {
                    DType::F64 => {
                        run_state(m.as_ref(), &gpu, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap()
                    }
                    DType::F32 => {
                        let (y, f) = run_state(
                            m.as_ref(),
                            &gpu,
                            Form::Fast,
                            &cast_tensors::<f32>(&x),
                            Some(&cast_tensors::<f32>(&s0)),
                            Precision::Exact,
                        )
                        .unwrap_or_else(|e| panic!("{label}: {e}"));
                        (y.mapv(f64::from), tensors_to_f64(&f))
                    }
                };
                for (what, a, b) in
                    [("y", &y, &yc), ("S", &f["S"], &fc["S"]), ("position", &f["position"], &fc["position"])]
                {
                    let c = tol.compare(a.view(), b.view());
                    println!("LIFT-STATE {label} {what} rel_rms={:.3e} pass={}", c.rel_rms, c.pass);
                    if !c.pass {
                        bad.push(format!("{label} {what}: {c:?}"));
                    }
                }
                let backends = [&cpu, &gpu];
                bad.extend(against_the_cpu(&label, m.as_ref(), backends, dtype, [&x, &s0], (&yc, &fc), tol));
            }
        }
    }
    assert!(bad.is_empty(), "{} comparisons failed:\n{}", bad.len(), bad.join("\n"));
}

/// On CUDA, a run of `T = 300` tokens from a state at position 1001 split at points inside the
/// run's first segment, at its segment boundaries (1001 + 300 crosses 1024 and 1280), and near
/// its end: the second part from the first part's final state gives the whole run's rows and
/// final state (f64).
#[test]
#[ignore = "needs a CUDA device"]
fn lifts_from_a_state_split_equals_the_whole_run() {
    let Some(_turn) = gpu() else { return };
    let gpu = cuda();
    let mut bad = Vec::new();
    for name in LIFTS {
        let m = lift(name);
        let t = 300;
        let d = dims([1, t, 2, 16, 16, 13]);
        let x = m.random_inputs(&d, 3).unwrap();
        let s0 = state_at(m.as_ref(), &d, &[1001], 4);
        let (y, f) = run_state(m.as_ref(), &gpu, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
        for a in [1, 2, 22, 23, 24, 150, 278, 279, 280, 299] {
            let part = |r: std::ops::Range<usize>| segment(m.as_ref(), &x, r).unwrap();
            let (ya, sa) =
                run_state(m.as_ref(), &gpu, Form::Fast, &part(0..a), Some(&s0), Precision::Exact).unwrap();
            let (yb, sb) =
                run_state(m.as_ref(), &gpu, Form::Fast, &part(a..t), Some(&sa), Precision::Exact).unwrap();
            let joined = ndarray::concatenate(Axis(1), &[ya.view(), yb.view()]).unwrap();
            for (what, g, w) in [("y", &joined, &y), ("S", &sb["S"], &f["S"])] {
                let c = Tolerance::F64.compare(g.view(), w.view());
                if !c.pass {
                    bad.push(format!("{name} split at {a} {what}: {c:?}"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

fn host(y: &AnyDeviceTensor) -> ArrayD<f64> {
    match y {
        AnyDeviceTensor::Bf16(y) => y.to_host().unwrap().mapv(|v| f64::from(v.to_f32())),
        AnyDeviceTensor::F32(y) => y.to_host().unwrap().mapv(f64::from),
        AnyDeviceTensor::F64(y) => y.to_host().unwrap(),
    }
}

/// On device tensors in the tf32 and bf16 modes (activations stored as the mode stores them) at
/// `D = 64`, positions `[777, 777]` and `[3, 2000]`, `T = 200`: `y` and the final state within the
/// mode's tolerance of the f64 CPU run on the same (rounded) values; `y` in the mode's storage.
#[test]
#[ignore = "needs a CUDA device"]
fn lifts_from_a_state_on_device_tensors_in_the_tf32_and_bf16_modes() {
    let Some(_turn) = gpu() else { return };
    let cpu = cpu();
    let mut bad = Vec::new();
    for name in LIFTS {
        let m = lift(name);
        for pos in [[777usize, 777], [3, 2000]] {
            let d = dims([2, 200, 2, 64, 64, 13]);
            let x = cast_tensors::<f32>(&m.random_inputs(&d, 9).unwrap());
            let s0 = cast_tensors::<f32>(&state_at(m.as_ref(), &d, &pos, 10));
            for p in [Precision::Tf32, Precision::Bf16] {
                let label = format!("{name} positions {pos:?} {p}");
                let dev = upload_inputs(&x, p).unwrap();
                let (y, f) = run_device_from_state(
                    m.as_ref(),
                    &dev,
                    Some(&upload_inputs(&s0, Precision::Exact).unwrap()),
                    p,
                )
                .unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_eq!(y.dtype(), if p == Precision::Bf16 { "bf16" } else { "f32" }, "{label}");
                let xs =
                    if p == Precision::Bf16 { mixer_registry::run::bf16_activations(&x) } else { x.clone() };
                let (yc, fc) = run_state(
                    m.as_ref(),
                    &cpu,
                    Form::Fast,
                    &tensors_to_f64(&xs),
                    Some(&tensors_to_f64(&s0)),
                    Precision::Exact,
                )
                .unwrap();
                let tol = p.tolerance("f32");
                for (what, g, w) in [("y", host(&y), yc), ("S", host(&f["S"]), fc["S"].clone())] {
                    let c = tol.compare(g.view(), w.view());
                    println!("LIFT-STATE {label} {what} rel_rms={:.3e} pass={}", c.rel_rms, c.pass);
                    if !c.pass {
                        bad.push(format!("{label} {what}: {c:?}"));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
