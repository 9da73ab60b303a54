//! Error paths of the CUDA backend (a plugin mask without a CUDA function, a mask whose
//! device function disagrees with its level count) and larger sizes checked against the CPU
//! `f64` forms (the dense oracle is too slow there), with wall times printed.

use super::common;

use std::time::Instant;

use mixer_core::{DType, Error, Form, Tolerance};
use mixer_registry::run::{forms, run_as};
use mixer_registry::{MaskEntry, Sizes, mixer, register};

fn fenwick_level(t: usize, s: usize) -> usize {
    mixer_core::fenwick::level(t, s)
}

#[register]
static NO_CUDA_MASK: MaskEntry = MaskEntry {
    name: "test-no-cuda-mask",
    doc: "test: Fenwick levels with no CUDA device function",
    level: fenwick_level,
    levels: mixer_core::fenwick::num_levels,
    cuda: None,
};

#[register]
static LYING_MASK: MaskEntry = MaskEntry {
    name: "test-lying-mask",
    doc: "test: Fenwick levels on the host, level 99 on the device",
    level: fenwick_level,
    levels: mixer_core::fenwick::num_levels,
    cuda: Some("__device__ int mixers_level(long long t, long long s) { return 99; }"),
};

fn inputs(
    name: &str,
    cfg: serde_json::Value,
    s: &Sizes,
) -> (Box<dyn mixer_core::Mixer>, mixer_core::Tensors<f64>) {
    let m = mixer(name, &cfg).unwrap();
    let dims = mixer_core::mixer::complete_dims(m.as_ref(), &s.dims());
    let x = m.random_inputs(&dims, 11).unwrap();
    (m, x)
}

#[test]
#[ignore = "needs a CUDA device"]
fn mask_without_cuda_function_is_a_backend_error() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let s = Sizes { batch: 1, seq: 9, channels: 1, heads: 1, dk: 2, dv: 2 };
    let (m, x) = inputs("loglinear-mamba2", serde_json::json!({"mask": "test-no-cuda-mask"}), &s);
    let e = run_as(m.as_ref(), &common::cuda(), Form::Parallel, &x, DType::F32).unwrap_err();
    assert!(
        matches!(&e, Error::Backend { backend, message, .. } if backend == "cuda" && message.contains("MaskEntry::cuda")),
        "{e}"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_level_out_of_range_is_reported() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let s = Sizes { batch: 1, seq: 9, channels: 1, heads: 1, dk: 2, dv: 2 };
    let (m, x) = inputs("loglinear-attention", serde_json::json!({"mask": "test-lying-mask"}), &s);
    let e = run_as(m.as_ref(), &common::cuda(), Form::Parallel, &x, DType::F64).unwrap_err();
    assert!(matches!(&e, Error::Value { name, .. } if name == "lambda"), "{e}");
}

/// Runs `form` on CUDA in f32 and f64 and compares with the CPU's `cpu_form` in f64 (or, where
/// the CPU lacks it, with the CUDA `parallel` form in f64: an independent algorithm).
fn against_cpu(name: &str, cfg: serde_json::Value, s: &Sizes, form: Form, cpu_form: Form) {
    let (m, x) = inputs(name, cfg.clone(), s);
    let (ref_backend, cpu_form) = if forms(m.as_ref(), &common::cpu()).contains(&cpu_form) {
        (common::cpu(), cpu_form)
    } else {
        (common::cuda(), Form::Parallel)
    };
    let t0 = Instant::now();
    let want = run_as(m.as_ref(), &ref_backend, cpu_form, &x, DType::F64).unwrap();
    let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
    for dtype in [DType::F32, DType::F64] {
        // once to compile and warm up, once timed
        run_as(m.as_ref(), &common::cuda(), form, &x, dtype).unwrap();
        let t0 = Instant::now();
        let got = run_as(m.as_ref(), &common::cuda(), form, &x, dtype).unwrap();
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let c = Tolerance::for_dtype(dtype.name()).compare(got.view(), want.view());
        println!(
            "SCALE {name} {cfg} T={} B={} form={form} dtype={} rel_rms={:.3e} cuda_ms={ms:.1} (incl. copies) ref={ref_backend}:{cpu_form}:f64 ref_ms={cpu_ms:.1}",
            s.seq,
            s.batch,
            dtype.name(),
            c.rel_rms
        );
        assert!(c.pass, "{name} {form} {}: {c:?}", dtype.name());
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn larger_sizes_match_the_cpu() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let big = |seq, channels, heads, dk, dv| Sizes { batch: 2, seq, channels, heads, dk, dv };
    against_cpu(
        "toeplitz",
        serde_json::json!({"heads": 4, "kernel_width": 3}),
        &big(5000, 64, 4, 1, 1),
        Form::Fast,
        Form::Fast,
    );
    against_cpu(
        "toeplitz",
        serde_json::json!({"heads": 4}),
        &big(3001, 32, 4, 1, 1),
        Form::Parallel,
        Form::Fast,
    );
    against_cpu(
        "glr",
        serde_json::json!({"pattern": "pow2", "cache_efficient": true, "on": "both"}),
        &big(20000, 96, 1, 1, 1),
        Form::Fast,
        Form::Fast,
    );
    against_cpu(
        "glr",
        serde_json::json!({"pattern": "sq1"}),
        &big(4000, 33, 1, 1, 1),
        Form::Fast,
        Form::Fast,
    );
    against_cpu("attention", serde_json::json!({}), &big(2000, 1, 4, 64, 64), Form::Fast, Form::Fast);
    against_cpu(
        "local-attention",
        serde_json::json!({"window": 128}),
        &big(3000, 1, 2, 32, 48),
        Form::Fast,
        Form::Fast,
    );
    against_cpu(
        "loglinear-gated-deltanet",
        serde_json::json!({}),
        &big(700, 1, 2, 16, 16),
        Form::Parallel,
        Form::Fast,
    );
    against_cpu(
        "loglinear-mamba2",
        serde_json::json!({}),
        &big(1500, 1, 2, 32, 32),
        Form::Parallel,
        Form::Fast,
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn decoders_at_moderate_length() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let s = Sizes { batch: 2, seq: 700, channels: 8, heads: 2, dk: 8, dv: 8 };
    against_cpu(
        "glr",
        serde_json::json!({"pattern": "sq1", "cache_efficient": true, "on": "both"}),
        &s,
        Form::Recurrent,
        Form::Fast,
    );
    against_cpu("local-attention", serde_json::json!({"window": 50}), &s, Form::Recurrent, Form::Fast);
    against_cpu(
        "toeplitz",
        serde_json::json!({"heads": 2, "kernel_width": 2, "decoder": "naive"}),
        &s,
        Form::Recurrent,
        Form::Fast,
    );
}
