//! The `fast` backward of the log-linear base mixers from a state on CUDA (docs/math.md §7.1,
//! "The CUDA backward from a state"): through the registry's `backward_state` (host arrays), every
//! input gradient and the initial state's gradient against the CPU's backward from the same state,
//! with and without the final state's cotangent; a split run's gradient chained through the state
//! equals the whole run's; the lifts listed (no device needed; their values: `lift_state.rs`). GPU tests are
//! `#[ignore]`d and skip without a device (fail under `MIXERS_REQUIRE_CUDA=1`).

use mixer_core::mixer::Mixer;
use mixer_core::state::segment;
use mixer_core::tensor::{cast_tensors, tensors_to_f64};
use mixer_core::{DType, Dims, Form, Precision, Tensors, Tolerance};
use mixer_registry::state::{backward_forms, run_state};
use mixer_registry::{Backend, mixer};
use ndarray::{ArrayD, Axis, Slice};

use crate::common::{cpu, cuda, gpu};
use crate::state_grads::{compare, grads};

fn base(name: &str) -> Box<dyn Mixer> {
    mixer(name, &serde_json::json!({"scale": 0.7})).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn dims([b, t, h, dk, dv]: [usize; 5]) -> Dims {
    [("B", b), ("T", t), ("H", h), ("Dk", dk), ("Dv", dv)].into_iter().collect()
}

/// One case: inputs, `dy`, a random initial state and a cotangent of the final state (f64).
#[derive(Clone)]
struct Case {
    x: Tensors<f64>,
    dy: ArrayD<f64>,
    s0: Tensors<f64>,
    df: Tensors<f64>,
}

fn case(m: &dyn Mixer, shape: [usize; 5], seed: u64) -> Case {
    let d = dims(shape);
    let x = m.random_inputs(&d, seed).expect("random inputs");
    let s0 = m.random_state(&d, seed + 1).expect("random state");
    let n = x["v"].len();
    let dy = ArrayD::from_shape_vec(
        x["v"].raw_dim(),
        (0..n).map(|i| ((i as f64) * 0.618_034 + seed as f64).sin() * 1.3 + 0.05).collect(),
    )
    .unwrap();
    let df = s0.iter().map(|(k, v)| (k.clone(), v.mapv(|e| (1.7 * e + 0.3).cos()))).collect();
    Case { x, dy, s0, df }
}

/// The case's values rounded to f32 (what an f32 run computes from), as f64.
fn rounded(c: &Case) -> Case {
    let r = |t: &Tensors<f64>| tensors_to_f64(&cast_tensors::<f32>(t));
    Case { x: r(&c.x), dy: c.dy.mapv(|e| f64::from(e as f32)), s0: r(&c.s0), df: r(&c.df) }
}

/// The head dims `(Dk, Dv)` of the tests: 64, 70 (not a multiple of 16 or 4), 128 (one stage of
/// the gated DeltaNet passes in f64, two in f32), and `Dk ≠ Dv` (48 × 70) so that a transposed
/// state (`S_0ᵀ`, `S̄_Tᵀ`, `S_Tᵀ`) read the wrong way round shows.
const DIMS: [(usize, usize); 4] = [(64, 64), (70, 70), (128, 128), (48, 70)];

/// Lengths: one token, around one chunk of 64 in f32 (two of 32 in f64), many chunks with a
/// partial last one.
const LENGTHS: [usize; 5] = [1, 63, 64, 65, 1000];

/// The CUDA backward of `name` from a random state against the CPU's from the same state at every
/// `dims` × [`LENGTHS`], f64 (`Tolerance::F64`) and f32 (`Tolerance::F32`, the CPU reference on
/// the f32-rounded values): from `S_0` with `S̄_T`, from `S_0` without, and with `S̄_T` alone.
fn matches_the_cpu_from_a_state(name: &str, dims: &[(usize, usize)]) {
    let Some(_turn) = gpu() else { return };
    let (cpu, gpu) = (cpu(), cuda());
    let m = base(name);
    let mut bad = Vec::new();
    for &(dk, dv) in dims {
        for (i, t) in LENGTHS.into_iter().enumerate() {
            let c64 = case(m.as_ref(), [2, t, 2, dk, dv], 100 + i as u64);
            for (dtype, tol) in [(DType::F64, Tolerance::F64), (DType::F32, Tolerance::F32)] {
                let c = if dtype == DType::F32 { rounded(&c64) } else { c64.clone() };
                for (with_s0, with_df) in [(true, true), (true, false), (false, true)] {
                    let s0 = with_s0.then_some(&c.s0);
                    let df = with_df.then_some(&c.df);
                    let label = format!(
                        "{name} {} [B, T, H, Dk, Dv] = [2, {t}, 2, {dk}, {dv}] S_0: {with_s0} S̄_T: {with_df}",
                        dtype.name()
                    );
                    let want = grads(m.as_ref(), &cpu, DType::F64, [Some(&c.x), s0, df], &c.dy);
                    let got = grads(m.as_ref(), &gpu, dtype, [Some(&c.x), s0, df], &c.dy);
                    bad.extend(compare(&label, &got, &want, tol));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{} comparisons failed:\n{}", bad.len(), bad.join("\n"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_from_a_state_matches_the_cpu_linear_attention() {
    matches_the_cpu_from_a_state("linear-attention", &DIMS);
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_from_a_state_matches_the_cpu_mamba2() {
    matches_the_cpu_from_a_state("mamba2", &DIMS);
}

/// Gated DeltaNet, also at `Dk = 256` (the passes' widest state slice; its forward from a state
/// takes the sequential form, its backward the same five launches).
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_from_a_state_matches_the_cpu_gated_deltanet() {
    let mut dims = DIMS.to_vec();
    dims.push((256, 256));
    matches_the_cpu_from_a_state("gated-deltanet", &dims);
}

/// The backward of a run split at `a`: the second part `x[a:T]` from the first part's CUDA final
/// state with `S̄_T`, then the first part `x[0:a]` from `S_0` with the second part's
/// `d_initial_state` as its final state's cotangent, joined along the sequence, against the whole
/// run's backward on CUDA (and the first part's `d_initial_state` against the whole run's), for
/// each base mixer in f64 (`Tolerance::F64`) and f32 (`Tolerance::F32`), `T = 200`, at splits on a
/// chunk boundary in f32 and f64 (64, 128), on one in f64 only (96: 3 chunks of 32, inside the
/// second chunk of 64 in f32), inside a chunk (1, 100, 199).
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_from_a_state_split_equals_the_whole_run() {
    let Some(_turn) = gpu() else { return };
    let gpu = cuda();
    let mut bad = Vec::new();
    let t_len = 200;
    for name in ["linear-attention", "mamba2", "gated-deltanet"] {
        let m = base(name);
        let c64 = case(m.as_ref(), [2, t_len, 2, 48, 70], 7);
        for (dtype, tol) in [(DType::F64, Tolerance::F64), (DType::F32, Tolerance::F32)] {
            let c = if dtype == DType::F32 { rounded(&c64) } else { c64.clone() };
            let whole = grads(m.as_ref(), &gpu, dtype, [Some(&c.x), Some(&c.s0), Some(&c.df)], &c.dy);
            for a in [1, 64, 96, 100, 128, 199] {
                let part = |r: std::ops::Range<usize>| segment(m.as_ref(), &c.x, r).expect("segment");
                let dy_part = |r: std::ops::Range<usize>| c.dy.slice_axis(Axis(1), Slice::from(r)).to_owned();
                let (x1, x2) = (part(0..a), part(a..t_len));
                // The state after x[0:a], from the CUDA forward from S_0 in this dtype.
                let sa = match dtype {
                    DType::F64 => run_state(m.as_ref(), &gpu, Form::Fast, &x1, Some(&c.s0), Precision::Exact)
                        .map(|r| r.1),
                    DType::F32 => run_state(
                        m.as_ref(),
                        &gpu,
                        Form::Fast,
                        &cast_tensors::<f32>(&x1),
                        Some(&cast_tensors::<f32>(&c.s0)),
                        Precision::Exact,
                    )
                    .map(|r| tensors_to_f64(&r.1)),
                }
                .unwrap_or_else(|e| panic!("{name} {}: the forward of x[0:{a}]: {e}", dtype.name()));
                let second =
                    grads(m.as_ref(), &gpu, dtype, [Some(&x2), Some(&sa), Some(&c.df)], &dy_part(a..t_len));
                let first =
                    grads(m.as_ref(), &gpu, dtype, [Some(&x1), Some(&c.s0), Some(&second.1)], &dy_part(0..a));
                let joined: Tensors<f64> = first
                    .0
                    .iter()
                    .map(|(k, g1)| {
                        let g2 = &second.0[k];
                        (k.clone(), ndarray::concatenate(Axis(1), &[g1.view(), g2.view()]).unwrap())
                    })
                    .collect();
                let label =
                    format!("{name} {} T = {t_len} split at {a} (chained) vs the whole run", dtype.name());
                bad.extend(compare(&label, &(joined, first.1), &whole, tol));
            }
        }
    }
    assert!(bad.is_empty(), "{} comparisons failed:\n{}", bad.len(), bad.join("\n"));
}

/// The state backward forms on CUDA, from the family implementations alone (no device needed):
/// `fast` for the base mixers and the lifts (`lift_state.rs` checks the lifts' values).
#[test]
fn loglinear_backward_from_a_state_lists_the_bases_and_the_lifts() {
    let cuda = Backend::registered("cuda").unwrap();
    for name in mixer_core::mixers::loglinear::MEMBERS {
        let m = mixer(name, &serde_json::json!({})).unwrap();
        let have = backward_forms(m.as_ref(), &cuda);
        assert!(have.contains(&Form::Fast), "{name}: no fast backward from a state on cuda, only {have:?}");
    }
}
