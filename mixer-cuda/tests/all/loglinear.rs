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
/// first's CUDA final state gives the whole run. Gated DeltaNet is refused with its reason.
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
    let gdn = mixer_registry::mixer("gated-deltanet", &serde_json::json!({})).unwrap();
    let dims: mixer_core::Dims = [("B", 1), ("T", 9), ("H", 1), ("Dk", 4), ("Dv", 4)].into_iter().collect();
    let x = gdn.random_inputs(&dims, 1).unwrap();
    let e = run_state(gdn.as_ref(), &gpu, Form::Fast, &x, None, Precision::Exact).unwrap_err().to_string();
    assert!(e.contains("gated DeltaNet's CUDA state pass"), "{e}");
}
