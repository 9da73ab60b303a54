//! The log-linear family on CUDA (generic quadratic form with the mask's and λ scheme's
//! device functions spliced in by NVRTC) against the f64 oracle and the CPU forms, including
//! a plugin mask and λ scheme that have no kernel of their own.

use super::common;

use mixer_core::Form;

const WANT: [Form; 1] = [Form::Parallel];

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_cuda_base_mixers() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    for (name, cfg) in [
        ("linear-attention", "{}"),
        ("mamba2", "{}"),
        ("mamba2", r#"{"scale": 0.5}"#),
        ("gated-deltanet", "{}"),
    ] {
        common::cross_check(name, cfg, &common::sizes(&[1, 37, 100]), &WANT);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_cuda_lifted_mixers() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    for (name, cfg) in [
        ("loglinear-attention", "{}"),
        ("loglinear-attention", r#"{"lambda_scheme": "softplus"}"#),
        ("loglinear-mamba2", r#"{"scale": 0.5}"#),
        ("loglinear-gated-deltanet", "{}"),
        ("loglinear-gated-deltanet", r#"{"lambda_scheme": "ones"}"#),
    ] {
        common::cross_check(name, cfg, &common::sizes(&[1, 37, 100]), &WANT);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_cuda_plugin_mask_and_scheme() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    common::cross_check("log-distance-mamba2", "{}", &common::sizes(&[37, 100]), &WANT);
    common::cross_check(
        "loglinear-gated-deltanet",
        r#"{"mask": "log-distance", "lambda_scheme": "sigmoid2"}"#,
        &common::sizes(&[37]),
        &WANT,
    );
}

// ---- Fenwick forms: chunked `fast` and the O(log T) `recurrent` decoder ----

use mixer_core::mixer::complete_dims;
use mixer_core::{DType, Tolerance};
use mixer_cuda::loglinear::{Device, Elem, Path, Storage, plan};
use mixer_registry::run::run_as;
use mixer_registry::{Sizes, mixer};

const FENWICK_FORMS: [Form; 3] = [Form::Parallel, Form::Fast, Form::Recurrent];
const FAMILY: [&str; 6] = mixer_core::mixers::loglinear::MEMBERS;

/// T around chunk boundaries and powers of two; head dims 5 and 7, three heads.
fn fenwick_sizes() -> Vec<Sizes> {
    [1, 2, 63, 64, 65, 100, 257]
        .into_iter()
        .map(|t| Sizes { batch: 2, seq: t, channels: 6, heads: 3, dk: 5, dv: 7 })
        .collect()
}

fn fenwick_forms_against_oracle(chunk: usize) {
    for name in FAMILY {
        let cfg = format!(r#"{{"chunk": {chunk}}}"#);
        common::cross_check(name, &cfg, &fenwick_sizes(), &FENWICK_FORMS);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_cuda_fenwick_forms_chunk16() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    fenwick_forms_against_oracle(16);
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_cuda_fenwick_forms_chunk64() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    fenwick_forms_against_oracle(64);
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_cuda_fenwick_forms_other_configs() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let s = common::sizes(&[1, 37, 100]);
    for (name, cfg) in [
        ("loglinear-attention", r#"{"lambda_scheme": "softplus", "chunk": 8}"#),
        ("loglinear-mamba2", r#"{"scale": 0.5, "chunk": 1}"#),
        ("loglinear-gated-deltanet", r#"{"lambda_scheme": "ones", "chunk": 32}"#),
        ("gated-deltanet", r#"{"scale": -1.5, "chunk": 128}"#),
    ] {
        common::cross_check(name, cfg, &s, &FENWICK_FORMS);
    }
}

/// The shared backend suite on CUDA for all six members with chunk 16 at T = 100 (several
/// chunks, not a multiple of one): decode = fast at every prefix, 1 + popcount(t) level states
/// per head after token t (one for the base mixers), f32 against f64, error paths.
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_cuda_shared_suite() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let s = Sizes { batch: 2, seq: 100, channels: 1, heads: 2, dk: 6, dv: 5 };
    let configs: Vec<_> = FAMILY.iter().map(|&n| (n, serde_json::json!({"chunk": 16}))).collect();
    let n = common::suite_on(configs, &s);
    assert!(n >= 60, "{n} cases");
}

/// Head dims past one 64-wide tile of the chunk-parallel kernels (Dk = 70, Dv = 130) and several
/// tree levels (T = 700: 11 chunks of 64 in f32, 22 of 32 in f64), every Fenwick form.
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_cuda_wide_heads() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let s = [Sizes { batch: 1, seq: 700, channels: 1, heads: 2, dk: 70, dv: 130 }];
    for name in FAMILY {
        common::cross_check(name, "{}", &s, &[Form::Fast, Form::Recurrent]);
    }
}

/// T = 65536: the CUDA chunked form (f32) against the CPU chunked form (f64 and f32), for the
/// scalar-decay members and gated DeltaNet, each with and without the lift (the lift's pass in
/// its transition form: 1024 chunks, eleven levels).
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_cuda_fast_long_sequence() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let s = Sizes { batch: 1, seq: 65536, channels: 1, heads: 2, dk: 8, dv: 6 };
    for name in ["mamba2", "loglinear-mamba2", "gated-deltanet", "loglinear-gated-deltanet"] {
        let m = mixer(name, &serde_json::json!({})).unwrap();
        let dims = complete_dims(m.as_ref(), &s.dims());
        let x = m.random_inputs(&dims, 5).unwrap();
        let t0 = std::time::Instant::now();
        let want = run_as(m.as_ref(), &common::cpu(), Form::Fast, &x, DType::F64).unwrap();
        let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
        let cpu32 = run_as(m.as_ref(), &common::cpu(), Form::Fast, &x, DType::F32).unwrap();
        run_as(m.as_ref(), &common::cuda(), Form::Fast, &x, DType::F32).unwrap();
        let t0 = std::time::Instant::now();
        let got = run_as(m.as_ref(), &common::cuda(), Form::Fast, &x, DType::F32).unwrap();
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let c = Tolerance::F32.compare(got.view(), want.view());
        let c32 = Tolerance::F32.compare(got.view(), cpu32.view());
        println!(
            "SCALE {name} T=65536 form=fast dtype=f32 rel_rms_vs_cpu_f64={:.3e} rel_rms_vs_cpu_f32={:.3e} \
             cuda_ms={ms:.1} cpu_f64_ms={cpu_ms:.1}",
            c.rel_rms, c32.rel_rms
        );
        assert!(c.pass && c32.pass, "{name}: {c:?} {c32:?}");
    }
}

/// Linear attention and Mamba-2 from a state on CUDA (the scan started from `S_0ᵀ`, `S_T`
/// written after the last chunk) against the CPU's run from the same state, at lengths across
/// many chunks, and split at chunk boundaries and inside chunks: the second part from the
/// first's CUDA final state gives the whole run (gated DeltaNet: the tests below; the lifts:
/// `lift_state.rs`).
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_cuda_runs_from_a_state() {
    use mixer_core::tensor::cast_tensors;
    use mixer_core::{Precision, Tolerance};
    use mixer_registry::state::run_state;
    let Some(_turn) = common::gpu() else {
        return;
    };
    let (cpu, gpu) = (mixer_registry::Backend::by_name("cpu").unwrap(), common::cuda());
    for name in ["linear-attention", "mamba2"] {
        let m = mixer_registry::mixer(name, &serde_json::json!({})).unwrap();
        for t_len in [65, 1000, 4099] {
            let dims: mixer_core::Dims =
                [("B", 2), ("T", t_len), ("H", 3), ("Dk", 16), ("Dv", 70)].into_iter().collect();
            let x = m.random_inputs(&dims, 11).unwrap();
            let s0: mixer_core::Tensors<f64> = [(
                "S".to_string(),
                ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[2, 3, 70, 16]), |i| {
                    ((i[1] * 7 + i[2] * 3 + i[3]) % 13) as f64 / 6.5 - 1.0
                }),
            )]
            .into_iter()
            .collect();
            let (yc, sc) = run_state(m.as_ref(), &cpu, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
            let (yg, sg) = run_state(m.as_ref(), &gpu, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
            for (what, a, b) in [("y", &yg, &yc), ("S_T", &sg["S"], &sc["S"])] {
                let c = Tolerance::F64.compare(a.view(), b.view());
                assert!(c.pass, "{name} T={t_len} f64 {what}: {c:?}");
            }
            let (x32, s32) = (cast_tensors::<f32>(&x), cast_tensors::<f32>(&s0));
            let (y32, f32s) =
                run_state(m.as_ref(), &gpu, Form::Fast, &x32, Some(&s32), Precision::Exact).unwrap();
            for (what, a, b) in
                [("y", &y32.mapv(f64::from), &yc), ("S_T", &f32s["S"].mapv(f64::from), &sc["S"])]
            {
                let c = Tolerance::F32.compare(a.view(), b.view());
                assert!(c.pass, "{name} T={t_len} f32 {what}: {c:?}");
            }
            for a in [64, 100, t_len - 1].into_iter().filter(|&a| a < t_len) {
                let (ya, sa) = run_state(
                    m.as_ref(),
                    &gpu,
                    Form::Fast,
                    &mixer_core::state::segment(m.as_ref(), &x, 0..a).unwrap(),
                    Some(&s0),
                    Precision::Exact,
                )
                .unwrap();
                let (yb, sb) = run_state(
                    m.as_ref(),
                    &gpu,
                    Form::Fast,
                    &mixer_core::state::segment(m.as_ref(), &x, a..t_len).unwrap(),
                    Some(&sa),
                    Precision::Exact,
                )
                .unwrap();
                let joined = ndarray::concatenate(ndarray::Axis(1), &[ya.view(), yb.view()]).unwrap();
                let c = Tolerance::F64.compare(joined.view(), yg.view());
                assert!(c.pass, "{name} T={t_len} split at {a}: {c:?}");
                let c = Tolerance::F64.compare(sb["S"].view(), sg["S"].view());
                assert!(c.pass, "{name} T={t_len} final state split at {a}: {c:?}");
            }
        }
    }
}

// ---- Gated DeltaNet from a state (llc_delta_h from S_0, or ll_chunked where it does not fit) ----

/// Gated DeltaNet's inputs at `[B, T, H, Dk, Dv]` = `[2, t, 2, dk, dv]` and a random state, f64.
fn gdn_case(
    m: &dyn mixer_core::Mixer,
    t: usize,
    dk: usize,
    dv: usize,
    seed: u64,
) -> (mixer_core::Tensors<f64>, mixer_core::Tensors<f64>) {
    let dims: mixer_core::Dims = [("B", 2), ("T", t), ("H", 2), ("Dk", dk), ("Dv", dv)].into_iter().collect();
    (m.random_inputs(&dims, seed).unwrap(), m.random_state(&dims, seed + 1).unwrap())
}

/// The path and state pass CUDA takes for gated DeltaNet (from a state or not) at
/// `[2, t, 2, dk, dv]` in the exact mode on `elem` data on this device (`fast::plan`), printed
/// and returned.
fn gdn_state_path(m: &dyn mixer_core::Mixer, t: usize, dk: usize, dv: usize, elem: Elem) -> Path {
    let ll = m.as_any().downcast_ref::<mixer_core::mixers::loglinear::LogLinear>().unwrap();
    let p = plan(ll, [2, t, 2, dk, dv], mixer_core::Precision::Exact, Storage::Real(elem), Device::current())
        .unwrap();
    let f: Vec<&str> = p.launches.iter().map(|l| l.function.as_str()).collect();
    println!(
        "STATE PLAN gated-deltanet T={t} Dk={dk} Dv={dv} {elem:?}: {:?} {:?} {f:?}",
        p.path, p.state_pass
    );
    p.path
}

/// The head dims of the gated DeltaNet state tests: 64, 70 (not a multiple of 16 or 4), 128,
/// 256 (the sequential form, `ll_chunked`: llc_delta_h's states and buffers do not fit in shared
/// memory), and Dk ≠ Dv (48 × 70) so that a mixed-up stride of `S [B, H, Dv, Dk]` shows.
const GDN_STATE_DIMS: [(usize, usize); 5] = [(64, 64), (70, 70), (128, 128), (256, 256), (48, 70)];

/// Gated DeltaNet from a random state on CUDA (`f64` and `f32`, through the registry's
/// `run_state`) against the CPU's fast form from the same state: `y` and the final state `S_T`
/// at T = 1, 63, 64, 65, 1000 (one token, around one chunk of 64 in f32 and two of 32 in f64, many
/// chunks with a partial last one) and every head dim of [`GDN_STATE_DIMS`]; Dk = 256 must run
/// the sequential form. Tolerances: `Tolerance::F64` and `Tolerance::F32`.
#[test]
#[ignore = "needs a CUDA device"]
fn gated_deltanet_cuda_from_a_state_equals_the_cpu() {
    use mixer_core::tensor::cast_tensors;
    use mixer_core::{Precision, Tolerance};
    use mixer_registry::state::run_state;
    let Some(_turn) = common::gpu() else {
        return;
    };
    let (cpu, gpu) = (common::cpu(), common::cuda());
    let m = mixer("gated-deltanet", &serde_json::json!({})).unwrap();
    for (dk, dv) in GDN_STATE_DIMS {
        for t in [1, 63, 64, 65, 1000] {
            for elem in [Elem::F64, Elem::F32] {
                let path = gdn_state_path(m.as_ref(), t, dk, dv, elem);
                assert_eq!(path == Path::Sequential, dk == 256, "Dk = {dk}, T = {t}, {elem:?}: {path:?}");
            }
            let (x, s0) = gdn_case(m.as_ref(), t, dk, dv, 31);
            let (yc, sc) = run_state(m.as_ref(), &cpu, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
            let (yg, sg) = run_state(m.as_ref(), &gpu, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
            let (x32, s32) = (cast_tensors::<f32>(&x), cast_tensors::<f32>(&s0));
            let (y32, f32s) =
                run_state(m.as_ref(), &gpu, Form::Fast, &x32, Some(&s32), Precision::Exact).unwrap();
            for (dtype, tol, y, st) in [
                ("f64", Tolerance::F64, yg, sg["S"].clone()),
                ("f32", Tolerance::F32, y32.mapv(f64::from), f32s["S"].mapv(f64::from)),
            ] {
                let cy = tol.compare(y.view(), yc.view());
                let cs = tol.compare(st.view(), sc["S"].view());
                println!(
                    "STATE gated-deltanet Dk={dk} Dv={dv} T={t} {dtype}: y rel_rms={:.2e} S_T rel_rms={:.2e}",
                    cy.rel_rms, cs.rel_rms
                );
                assert!(cy.pass, "Dk = {dk}, Dv = {dv}, T = {t}, {dtype} y: {cy:?}");
                assert!(cs.pass, "Dk = {dk}, Dv = {dv}, T = {t}, {dtype} S_T: {cs:?}");
            }
        }
    }
}

/// Gated DeltaNet from a random state in the three precision modes on f32 data: through the
/// device entry point `fast::run_from` on device tensors as the mode stores them (bf16 `q`, `k`,
/// `v` in the bf16 mode, `y` bf16 then), and through the registry's `run_state` in that mode. Against the CPU's fast form (f64)
/// from the same state on the same values (rounded to bf16 in the bf16 mode), within the mode's
/// tolerance (`Precision::tolerance("f32")`), for `y` and `S_T`, at T = 1, 65, 1000 and every head
/// dim of [`GDN_STATE_DIMS`].
#[test]
#[ignore = "needs a CUDA device"]
fn gated_deltanet_cuda_from_a_state_in_every_precision_mode() {
    use mixer_core::Precision;
    use mixer_core::tensor::cast_tensors;
    use mixer_cuda::{AnyDeviceTensor, DeviceTensor};
    use mixer_registry::run::bf16_activations;
    use mixer_registry::state::run_state;
    let Some(_turn) = common::gpu() else {
        return;
    };
    let (cpu, gpu) = (common::cpu(), common::cuda());
    let m = mixer("gated-deltanet", &serde_json::json!({})).unwrap();
    let ll = m.as_any().downcast_ref::<mixer_core::mixers::loglinear::LogLinear>().unwrap();
    for (dk, dv) in GDN_STATE_DIMS {
        for t in [1, 65, 1000] {
            let (x, s0) = gdn_case(m.as_ref(), t, dk, dv, 47);
            let s32 = cast_tensors::<f32>(&s0);
            // The f32 values and the CPU's run from s0 on them: as drawn, and rounded to bf16.
            let cases = [cast_tensors::<f32>(&x), bf16_activations(&cast_tensors::<f32>(&x))].map(|x32| {
                let x64 = mixer_core::tensor::tensors_to_f64(&x32);
                let want =
                    run_state(m.as_ref(), &cpu, Form::Fast, &x64, Some(&s0), Precision::Exact).unwrap();
                (x32, want)
            });
            for p in [Precision::Exact, Precision::Tf32, Precision::Bf16] {
                let (x32, (yc, sc)) = &cases[(p == Precision::Bf16) as usize];
                let tol = p.tolerance("f32");
                // The device entry point, in the mode.
                let dev = mixer_cuda::forms::upload_inputs(x32, p).unwrap();
                let s0d = DeviceTensor::<f32>::upload(&s32["S"]).unwrap();
                let (y, fin) =
                    mixer_cuda::loglinear::fast::run_from::<f32>(ll, &dev, p, Some(&s0d), true).unwrap();
                let y = match (p, y) {
                    (Precision::Bf16, AnyDeviceTensor::Bf16(y)) => {
                        y.to_host().unwrap().mapv(|v| f64::from(v.to_f32()))
                    }
                    (Precision::Exact | Precision::Tf32, AnyDeviceTensor::F32(y)) => {
                        y.to_host().unwrap().mapv(f64::from)
                    }
                    (p, y) => panic!("{p}: y of the wrong type {:?}", y.shape()),
                };
                let st = fin.expect("a final state").to_host().unwrap().mapv(f64::from);
                // The registry in the mode (the bf16 mode rounds the activations and y itself).
                let (yr, sr) =
                    run_state(m.as_ref(), &gpu, Form::Fast, &cast_tensors::<f32>(&x), Some(&s32), p).unwrap();
                for (via, y, st) in
                    [("run_from", y, st), ("run_state", yr.mapv(f64::from), sr["S"].mapv(f64::from))]
                {
                    let cy = tol.compare(y.view(), yc.view());
                    let cs = tol.compare(st.view(), sc["S"].view());
                    println!(
                        "STATE gated-deltanet {via} {p} Dk={dk} Dv={dv} T={t}: y rel_rms={:.2e} S_T rel_rms={:.2e}",
                        cy.rel_rms, cs.rel_rms
                    );
                    assert!(cy.pass, "{via} {p} Dk = {dk}, Dv = {dv}, T = {t} y: {cy:?}");
                    assert!(cs.pass, "{via} {p} Dk = {dk}, Dv = {dv}, T = {t} S_T: {cs:?}");
                }
            }
            // A state of the wrong shape is refused, not misread.
            let dev = mixer_cuda::forms::upload_inputs(&cast_tensors::<f32>(&x), Precision::Exact).unwrap();
            let wrong = DeviceTensor::<f32>::zeros(&[2, 2, dk, dv + 1]).unwrap();
            let e =
                mixer_cuda::loglinear::fast::run_from::<f32>(ll, &dev, Precision::Exact, Some(&wrong), true)
                    .unwrap_err()
                    .to_string();
            assert!(e.contains("the initial state is [B, H, Dv, Dk]"), "{e}");
        }
    }
}

/// Split invisibility of gated DeltaNet's CUDA fast form (`f64` and `f32`): the run of `x[0:a]`
/// from a state (random, or none: zeros) and then of `x[a:T]` from its final state give the rows
/// and the final state of the whole run from that state, at splits inside a chunk (1, 37, 100,
/// T − 1) and on chunk boundaries (64, 128: of both the f32 chunks of 64 and the f64 chunks of
/// 32), T = 130 and 1000, every head dim of [`GDN_STATE_DIMS`]; and a run cut in three parts
/// (at 64 and 101) likewise. Tolerances: `Tolerance::F64` and `Tolerance::F32`.
#[test]
#[ignore = "needs a CUDA device"]
fn gated_deltanet_cuda_split_runs_from_states_equal_the_whole_run() {
    use mixer_core::state::segment;
    use mixer_core::tensor::{cast_tensors, tensors_to_f64};
    use mixer_core::{Precision, Tensors, Tolerance};
    use mixer_registry::state::run_state;
    let Some(_turn) = common::gpu() else {
        return;
    };
    let gpu = common::cuda();
    let m = mixer("gated-deltanet", &serde_json::json!({})).unwrap();
    // The run of `x` from `s` on CUDA as f64 or f32, as f64.
    let run = |x: &Tensors<f64>, s: Option<&Tensors<f64>>, f32: bool| {
        if f32 {
            let (y, f) = run_state(
                m.as_ref(),
                &gpu,
                Form::Fast,
                &cast_tensors::<f32>(x),
                s.map(cast_tensors::<f32>).as_ref(),
                Precision::Exact,
            )
            .unwrap();
            (y.mapv(f64::from), tensors_to_f64(&f))
        } else {
            run_state(m.as_ref(), &gpu, Form::Fast, x, s, Precision::Exact).unwrap()
        }
    };
    for (dk, dv) in GDN_STATE_DIMS {
        for t in [130, 1000] {
            let (x, s0) = gdn_case(m.as_ref(), t, dk, dv, 53);
            for f32 in [false, true] {
                let tol = if f32 { Tolerance::F32 } else { Tolerance::F64 };
                for start in [Some(&s0), None] {
                    let (y, fin) = run(&x, start, f32);
                    let from = if start.is_some() { "a state" } else { "zeros" };
                    let mut parts: Vec<Vec<usize>> = [1, 37, 64, 100, 128, t - 1]
                        .into_iter()
                        .filter(|&a| a < t)
                        .map(|a| vec![a])
                        .collect();
                    parts.push(vec![64, 101]);
                    for cuts in parts {
                        let bounds: Vec<usize> =
                            std::iter::once(0).chain(cuts.iter().copied()).chain([t]).collect();
                        let mut state = start.cloned();
                        let mut ys = Vec::new();
                        for w in bounds.windows(2) {
                            let (yp, sp) =
                                run(&segment(m.as_ref(), &x, w[0]..w[1]).unwrap(), state.as_ref(), f32);
                            ys.push(yp);
                            state = Some(sp);
                        }
                        let views: Vec<_> = ys.iter().map(|y| y.view()).collect();
                        let joined = ndarray::concatenate(ndarray::Axis(1), &views).unwrap();
                        let what = format!(
                            "Dk = {dk}, Dv = {dv}, T = {t}, f32: {f32}, from {from}, cut at {cuts:?}"
                        );
                        let c = tol.compare(joined.view(), y.view());
                        assert!(c.pass, "{what}: y {c:?}");
                        let c = tol.compare(state.unwrap()["S"].view(), fin["S"].view());
                        assert!(c.pass, "{what}: S_T {c:?}");
                    }
                }
            }
        }
    }
}
