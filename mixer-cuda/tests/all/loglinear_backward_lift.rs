//! The `fast` backward of the lifts on CUDA (`loglinear-attention`, `loglinear-mamba2`,
//! `loglinear-gated-deltanet`) against the CPU backward on the same inputs: every input gradient
//! (`d_q`, `d_k`, `d_v`, `d_g`, `d_beta`, `d_lambda`) in f64 and f32 at sizes that are not chunk
//! multiples, the softplus scheme with `lambda_param`, the tf32 and bf16 modes on device tensors,
//! vanishing decays, gates at 0 and 1 and zero weights, the same bits twice, and a timing. GPU tests are `#[ignore]`d and skip
//! without a device (fail under `MIXERS_REQUIRE_CUDA=1`).

use mixer_core::{DType, Precision};
use mixer_registry::{LambdaEntry, LambdaGradEntry, mixer, register};

use crate::common::gpu;
use crate::loglinear_backward::{
    REGISTER_PASS_SIZES, base, case, compare, cpu_grads, cuda_exact, f32_rounded,
    matches_the_cpu_in_f64_and_f32, modes_match_the_cpu, same_bits_twice, small_case,
    time_forward_and_backward,
};

fn softplus(raw: f64, param: f64) -> f64 {
    let z = param * raw;
    if z > 30.0 { z } else { z.exp().ln_1p() }
}

fn softplus_grad(raw: f64, param: f64) -> (f64, f64) {
    let sig = 1.0 / (1.0 + (-param * raw).exp());
    (sig * param, sig * raw)
}

/// The softplus scheme with its derivative on the host only: the backward maps λ's gradient back
/// on the host (the fallback for a plugin without `LambdaGradEntry::cuda`).
#[register]
static SOFTPLUS_HOST_GRAD: LambdaEntry = LambdaEntry {
    name: "test-softplus-host-grad",
    doc: "test: softplus with no device derivative",
    map: softplus,
    cuda: Some(
        "__device__ double mixers_lambda(double raw, double param) { double z = param * raw; return z > 30.0 ? z : log1p(exp(z)); }",
    ),
};
#[register]
static SOFTPLUS_HOST_GRAD_D: LambdaGradEntry =
    LambdaGradEntry { name: "test-softplus-host-grad", grad: softplus_grad, cuda: None };

const LIFTS: [&str; 3] = ["loglinear-attention", "loglinear-mamba2", "loglinear-gated-deltanet"];

#[test]
#[ignore = "needs a CUDA device"]
fn lifted_backward_matches_the_cpu_loglinear_attention() {
    matches_the_cpu_in_f64_and_f32("loglinear-attention");
}

#[test]
#[ignore = "needs a CUDA device"]
fn lifted_backward_matches_the_cpu_loglinear_mamba2() {
    matches_the_cpu_in_f64_and_f32("loglinear-mamba2");
}

#[test]
#[ignore = "needs a CUDA device"]
fn lifted_backward_matches_the_cpu_loglinear_gated_deltanet() {
    matches_the_cpu_in_f64_and_f32("loglinear-gated-deltanet");
}

/// The softplus scheme with a `lambda_param` input (its gradient mapped back on the device, and
/// on the host for a copy of the scheme without a device derivative), and more λ levels than the
/// sequence reads; 4500 rows of λ make the parameter's sum one of two parts.
#[test]
#[ignore = "needs a CUDA device"]
fn lifted_backward_through_the_softplus_scheme_with_a_parameter() {
    let Some(_turn) = gpu() else { return };
    let mut bad = Vec::new();
    for (name, scheme, s, dtype, tol) in [
        ("loglinear-mamba2", "softplus", [2, 300, 2, 16, 24], DType::F64, 1e-10),
        ("loglinear-mamba2", "softplus", [1, 1000, 2, 64, 64], DType::F32, 1e-4),
        ("loglinear-mamba2", "softplus", [3, 1500, 2, 16, 16], DType::F64, 1e-10),
        ("loglinear-mamba2", "test-softplus-host-grad", [2, 300, 2, 16, 24], DType::F64, 1e-10),
        ("loglinear-gated-deltanet", "softplus", [2, 300, 2, 16, 24], DType::F64, 1e-10),
        ("loglinear-gated-deltanet", "softplus", [1, 1000, 2, 64, 64], DType::F32, 1e-4),
        ("loglinear-gated-deltanet", "test-softplus-host-grad", [1, 1000, 2, 64, 64], DType::F32, 1e-4),
    ] {
        let m = mixer(name, &serde_json::json!({"scale": 0.7, "lambda_scheme": scheme})).unwrap();
        let (mut x, dy) = case(m.as_ref(), s, 12);
        let [b, t, h, _, _] = s;
        let l = x["lambda"].shape()[3] + 2;
        let raw = ndarray::ArrayD::from_shape_fn(vec![b, t, h, l], |ix| {
            ((ix[1] * 7 + ix[3] * 3 + ix[2]) as f64).sin()
        });
        x.insert("lambda".into(), raw);
        let param = ndarray::ArrayD::from_shape_fn(vec![h, l], |ix| 0.5 + 0.1 * (ix[0] + ix[1]) as f64);
        x.insert("lambda_param".into(), param);
        let (x, dy) = (f32_rounded(&x), dy.mapv(|e| f64::from(e as f32)));
        let want = cpu_grads(m.as_ref(), &x, &dy);
        assert!(want.contains_key("d_lambda_param"), "the CPU gives the parameter's gradient");
        let got = cuda_exact(m.as_ref(), &x, &dy, dtype);
        bad.extend(compare(&format!("{name} {scheme} {} {s:?}", dtype.name()), &got, &want, tol));
    }
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn lifted_backward_in_the_tf32_and_bf16_modes_on_device_tensors() {
    let Some(_turn) = gpu() else { return };
    let bad = modes_match_the_cpu(&LIFTS, &[]);
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

/// The lifted gated DeltaNet alone in the tf32 and bf16 modes (the forward's tensor-core WY step
/// and level pass in its backward).
#[test]
#[ignore = "needs a CUDA device"]
fn lifted_gated_deltanet_backward_in_the_tf32_and_bf16_modes() {
    let Some(_turn) = gpu() else { return };
    let bad = modes_match_the_cpu(&["loglinear-gated-deltanet"], &REGISTER_PASS_SIZES);
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

/// `g = −1e4` on every third token (the past is wiped there), λ = 0 on a level and (gated
/// DeltaNet) β alternating 0 and 1: finite, and equal to the CPU's.
#[test]
#[ignore = "needs a CUDA device"]
fn lifted_backward_is_finite_where_decays_vanish_and_weights_are_zero() {
    let Some(_turn) = gpu() else { return };
    let mut bad = Vec::new();
    for name in ["loglinear-mamba2", "loglinear-gated-deltanet"] {
        bad.extend(vanishing(name));
    }
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

/// [`lifted_backward_is_finite_where_decays_vanish_and_weights_are_zero`] for one lift: the
/// failures.
fn vanishing(name: &str) -> Vec<String> {
    let m = base(name);
    let (mut x, dy) = case(m.as_ref(), [1, 300, 2, 16, 24], 70);
    if let Some(beta) = x.get_mut("beta") {
        for (i, b) in beta.iter_mut().enumerate() {
            *b = (i % 2) as f64;
        }
    }
    for ((_, t, _), g) in
        x.get_mut("g").unwrap().view_mut().into_dimensionality::<ndarray::Ix3>().unwrap().indexed_iter_mut()
    {
        if t % 3 == 1 {
            *g = -1e4;
        }
    }
    for ((_, _, _, l), w) in x
        .get_mut("lambda")
        .unwrap()
        .view_mut()
        .into_dimensionality::<ndarray::Ix4>()
        .unwrap()
        .indexed_iter_mut()
    {
        if l == 7 {
            *w = 0.0;
        }
    }
    let want = cpu_grads(m.as_ref(), &x, &dy);
    let mut bad =
        compare(&format!("{name} vanishing f64"), &cuda_exact(m.as_ref(), &x, &dy, DType::F64), &want, 1e-10);
    bad.extend(compare(
        &format!("{name} vanishing f32"),
        &cuda_exact(m.as_ref(), &x, &dy, DType::F32),
        &want,
        1e-4,
    ));
    bad
}

#[test]
#[ignore = "needs a CUDA device"]
fn lifted_backward_gives_the_same_bits_twice() {
    let Some(_turn) = gpu() else { return };
    same_bits_twice(&LIFTS, &[Precision::Exact]);
}

/// The lifts at the goal's three shapes, exact and tf32 (the lifted forward's modes; the backward
/// runs the same FMA kernels in both).
#[test]
#[ignore = "needs a CUDA device; a timing, not a check"]
fn lifted_backward_timing() {
    time_forward_and_backward(
        &LIFTS,
        &[[1, 16384, 16, 64, 64], [8, 4096, 16, 64, 64], [8, 4096, 16, 128, 128]],
        &[Precision::Tf32, Precision::Exact, Precision::Bf16],
    );
}

/// The lifted gated DeltaNet alone, at the same shapes, exact and tf32.
#[test]
#[ignore = "needs a CUDA device; a timing, not a check"]
fn lifted_gated_deltanet_backward_timing() {
    time_forward_and_backward(
        &["loglinear-gated-deltanet"],
        &[[1, 16384, 16, 64, 64], [8, 4096, 16, 64, 64], [8, 4096, 16, 128, 128]],
        &[Precision::Exact, Precision::Tf32],
    );
}

/// One small case per lift in f32 (two chunks, a partial tile): what compute-sanitizer runs.
#[test]
#[ignore = "needs a CUDA device"]
fn lifted_backward_small_case() {
    let Some(_turn) = gpu() else { return };
    let bad = small_case(&LIFTS);
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

/// The lifted gated DeltaNet at `Dk = 256`: the passes' level states do not fit in shared memory
/// next to the chunk's rows and live in global memory; f64 and f32.
#[test]
#[ignore = "needs a CUDA device"]
fn lifted_gated_deltanet_backward_at_head_dim_256() {
    let Some(_turn) = gpu() else { return };
    let m = base("loglinear-gated-deltanet");
    let mut bad = Vec::new();
    for (s, dtype, tol) in
        [([1, 100, 1, 256, 256], DType::F64, 1e-10), ([1, 330, 2, 256, 40], DType::F32, 1e-4)]
    {
        let (x, dy) = case(m.as_ref(), s, 61);
        let (x, dy) = (f32_rounded(&x), dy.mapv(|e| f64::from(e as f32)));
        let want = cpu_grads(m.as_ref(), &x, &dy);
        let got = cuda_exact(m.as_ref(), &x, &dy, dtype);
        bad.extend(compare(&format!("loglinear-gated-deltanet {} {s:?}", dtype.name()), &got, &want, tol));
    }
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}
