//! The `fast` backward of the log-linear base mixers on CUDA (`linear-attention`, `mamba2`,
//! `gated-deltanet`) against the CPU backward on the same inputs, every input gradient, in each
//! precision mode; decays that reach zero and `β ∈ {0, 1}`; the same bits twice; every member
//! listing the backward; and a timing (the lifts: `loglinear_backward_lift.rs`) of forward alone
//! against forward + backward (CUDA events, device-resident inputs). GPU tests are `#[ignore]`d and skip without a device (fail under
//! `MIXERS_REQUIRE_CUDA=1`).

use mixer_core::mixer::Mixer;
use mixer_core::precision::round_bf16;
use mixer_core::{AnyTensors, DType, Dims, Form, Precision, Requires, Tensor, Tensors};
use mixer_cuda::device_run::run_device_with;
use mixer_cuda::forms::{download_as, upload_inputs};
use mixer_cuda::{AnyDeviceTensor, DeviceTensor, DeviceTensors, backward_device, run_device};
use mixer_registry::backward::{backward, backward_forms};
use mixer_registry::mixer;
use ndarray::ArrayD;

use crate::common::gpu;

const BASES: [&str; 3] = ["linear-attention", "mamba2", "gated-deltanet"];

pub(crate) fn base(name: &str) -> Box<dyn Mixer> {
    mixer(name, &serde_json::json!({"scale": 0.7})).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn dims([b, t, h, dk, dv]: [usize; 5]) -> Dims {
    [("B", b), ("T", t), ("H", h), ("Dk", dk), ("Dv", dv)].into_iter().collect()
}

/// The mixer's random inputs at these sizes and a cotangent of the shape of `y`.
pub(crate) fn case(m: &dyn Mixer, shape: [usize; 5], seed: u64) -> (Tensors<f64>, ArrayD<f64>) {
    let x = m.random_inputs(&dims(shape), seed).expect("random inputs");
    let v = &x["v"];
    let n = v.len();
    let dy = ArrayD::from_shape_vec(
        v.raw_dim(),
        (0..n).map(|i| ((i as f64) * 0.618_034 + seed as f64).sin() * 1.3 + 0.05).collect(),
    )
    .unwrap();
    (x, dy)
}

/// The CPU `fast` backward in f64 (every gradient).
pub(crate) fn cpu_grads(m: &dyn Mixer, x: &Tensors<f64>, dy: &ArrayD<f64>) -> Tensors<f64> {
    backward(m, "cpu", Form::Fast, &AnyTensors::F64(x.clone()), &Tensor::F64(dy.clone()), &Requires::All)
        .unwrap_or_else(|e| panic!("{}: cpu backward: {e}", m.name()))
        .into_iter()
        .map(|(k, v)| (k, v.to_f64()))
        .collect()
}

/// `‖a − b‖ / ‖b‖` (`‖a − b‖` where `b` is 0).
fn rel_rms(a: &ArrayD<f64>, b: &ArrayD<f64>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    let n: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    if n > 0.0 { d / n } else { d }
}

/// Compares every gradient of `want` with `got`, printing one line each; returns the failures.
pub(crate) fn compare(label: &str, got: &Tensors<f64>, want: &Tensors<f64>, tol: f64) -> Vec<String> {
    let mut bad = Vec::new();
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{label}: gradient names");
    for (k, w) in want {
        let g = &got[k];
        let finite = g.iter().all(|v| v.is_finite());
        let e = rel_rms(g, w);
        println!("BWD {label} {k} rel_rms={e:.3e} tol={tol:.0e}");
        if !finite || e > tol {
            bad.push(format!("{label} {k}: rel_rms {e:.3e} > {tol:.0e} (finite: {finite})"));
        }
    }
    bad
}

/// The CUDA backward through the host-array path (exact mode) in `dtype`, as f64.
pub(crate) fn cuda_exact(m: &dyn Mixer, x: &Tensors<f64>, dy: &ArrayD<f64>, dtype: DType) -> Tensors<f64> {
    mixer_registry::backward::backward_as(m, "cuda", Form::Fast, x, dy, dtype, &Requires::All)
        .unwrap_or_else(|e| panic!("{} {}: cuda backward: {e}", m.name(), dtype.name()))
}

/// The CUDA backward on device tensors in mode `p` (f32 inputs; bf16 activations and `dy` in the
/// bf16 mode), as f64.
pub(crate) fn cuda_mode(m: &dyn Mixer, x: &Tensors<f64>, dy: &ArrayD<f64>, p: Precision) -> Tensors<f64> {
    let x32: Tensors<f32> = x.iter().map(|(k, v)| (k.clone(), v.mapv(|e| e as f32))).collect();
    let dev = upload_inputs(&x32, p).expect("upload");
    let d = device_dy(dy, p);
    let g = backward_device(m, &dev, &d, &Requires::All, p)
        .unwrap_or_else(|e| panic!("{} {p}: cuda backward: {e}", m.name()));
    // The gradients are f32 in every mode here (f32 inputs; f32 out of the bf16 mode).
    g.iter().map(|(k, v)| (k.clone(), download_as::<f32>(v).expect("download").mapv(f64::from))).collect()
}

fn device_dy(dy: &ArrayD<f64>, p: Precision) -> AnyDeviceTensor {
    let d32 = dy.mapv(|e| e as f32);
    if p == Precision::Bf16 {
        let b = d32.mapv(|e| mixer_cuda::bf16::from_f32(round_bf16(e)));
        AnyDeviceTensor::Bf16(DeviceTensor::upload(&b).expect("upload"))
    } else {
        AnyDeviceTensor::F32(DeviceTensor::upload(&d32).expect("upload"))
    }
}

/// `x` with its activations and `dy` rounded to bf16 (what the bf16 mode computes from).
pub(crate) fn bf16_rounded(x: &Tensors<f64>, dy: &ArrayD<f64>) -> (Tensors<f64>, ArrayD<f64>) {
    let r = |a: &ArrayD<f64>| a.mapv(|e| f64::from(round_bf16(e as f32)));
    let x = x
        .iter()
        .map(|(k, v)| (k.clone(), if ["q", "k", "v"].contains(&k.as_str()) { r(v) } else { v.clone() }))
        .collect();
    (x, r(dy))
}

/// The sizes per mode: `[B, T, H, Dk, Dv]`, T and head dims not powers of two or chunk multiples
/// where it matters.
const F64_SIZES: [[usize; 5]; 6] = [
    [2, 1, 2, 5, 16],
    [1, 63, 2, 16, 5],
    [1, 64, 1, 64, 64],
    [2, 65, 1, 70, 70],
    [1, 1000, 2, 16, 128],
    [1, 4099, 1, 5, 16],
];
const F32_SIZES: [[usize; 5]; 5] =
    [[2, 1, 1, 16, 5], [1, 65, 2, 128, 128], [1, 1000, 2, 70, 64], [1, 4099, 1, 64, 64], [2, 63, 3, 5, 70]];
/// The modes' sizes: the last one long, where the decay gradient's rounding would add up over the
/// sequence if it were summed past the chunk boundaries (docs/math.md §2.7).
const MODE_SIZES: [[usize; 5]; 3] = [[1, 1000, 1, 70, 16], [2, 4099, 1, 128, 64], [1, 16411, 2, 64, 64]];
/// Gated DeltaNet's modes also at enough batch·heads for its register passes (more than one wave
/// of 16-column blocks on the H200), at `Dk = 64` (with `Dv > 64`: the state products on tensor
/// cores) and `Dk = 128`.
pub(crate) const REGISTER_PASS_SIZES: [[usize; 5]; 2] = [[3, 700, 12, 64, 70], [2, 300, 40, 128, 32]];

/// Every gradient of `name` against the CPU at [`F64_SIZES`] (f64) and [`F32_SIZES`] (f32, the
/// reference on the f32-rounded inputs).
pub(crate) fn matches_the_cpu_in_f64_and_f32(name: &str) {
    let Some(_turn) = gpu() else { return };
    let mut bad = Vec::new();
    let m = base(name);
    for (i, s) in F64_SIZES.iter().enumerate() {
        let (x, dy) = case(m.as_ref(), *s, 10 + i as u64);
        let want = cpu_grads(m.as_ref(), &x, &dy);
        let got = cuda_exact(m.as_ref(), &x, &dy, DType::F64);
        bad.extend(compare(&format!("{name} f64 {s:?}"), &got, &want, 1e-10));
    }
    for (i, s) in F32_SIZES.iter().enumerate() {
        let (x, dy) = case(m.as_ref(), *s, 30 + i as u64);
        let (x32, dy32) = (f32_rounded(&x), dy.mapv(|e| f64::from(e as f32)));
        let want = cpu_grads(m.as_ref(), &x32, &dy32);
        let got = cuda_exact(m.as_ref(), &x32, &dy32, DType::F32);
        bad.extend(compare(&format!("{name} f32 {s:?}"), &got, &want, 1e-4));
    }
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_matches_the_cpu_linear_attention() {
    matches_the_cpu_in_f64_and_f32("linear-attention");
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_matches_the_cpu_mamba2() {
    matches_the_cpu_in_f64_and_f32("mamba2");
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_matches_the_cpu_gated_deltanet() {
    matches_the_cpu_in_f64_and_f32("gated-deltanet");
}

/// Gated DeltaNet at the widest head the forward takes (`Dk = 256`: the passes' widest state
/// slice, four key tiles of the gradient kernel), f64 and f32.
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_gated_deltanet_at_head_dim_256() {
    let Some(_turn) = gpu() else { return };
    let m = base("gated-deltanet");
    let mut bad = Vec::new();
    for (s, dtype, tol) in
        [([1, 100, 1, 256, 256], DType::F64, 1e-10), ([1, 130, 2, 256, 40], DType::F32, 1e-4)]
    {
        let (x, dy) = case(m.as_ref(), s, 60);
        let (x, dy) = (f32_rounded(&x), dy.mapv(|e| f64::from(e as f32)));
        let want = cpu_grads(m.as_ref(), &x, &dy);
        let got = cuda_exact(m.as_ref(), &x, &dy, dtype);
        bad.extend(compare(&format!("gated-deltanet {} {s:?}", dtype.name()), &got, &want, tol));
    }
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

/// `x` with every input rounded to f32 (what an f32 run computes from), as f64.
pub(crate) fn f32_rounded(x: &Tensors<f64>) -> Tensors<f64> {
    x.iter().map(|(k, v)| (k.clone(), v.mapv(|e| f64::from(e as f32)))).collect()
}

/// One small case of each of `names` in f32 (two chunks, a partial block of state columns)
/// against the CPU, in the exact mode and in the tf32 mode (where linear attention's and
/// Mamba-2's reversed run for `d_v` reads the run for `d_k`'s chunk states, transposed; also at
/// `Dk = 70`, the 128-column kernels): the failures.
pub(crate) fn small_case(names: &[&str]) -> Vec<String> {
    let mut bad = Vec::new();
    for name in names {
        let m = base(name);
        for (shape, exact) in [([1, 70, 2, 5, 12], true), ([1, 70, 2, 70, 12], false)] {
            let (x, dy) = case(m.as_ref(), shape, 8);
            let (x32, dy32) = (f32_rounded(&x), dy.mapv(|e| f64::from(e as f32)));
            let want = cpu_grads(m.as_ref(), &x32, &dy32);
            if exact {
                let got = cuda_exact(m.as_ref(), &x32, &dy32, DType::F32);
                bad.extend(compare(&format!("{name} f32 small"), &got, &want, 1e-4));
            }
            let got = cuda_mode(m.as_ref(), &x32, &dy32, Precision::Tf32);
            bad.extend(compare(&format!("{name} tf32 small {shape:?}"), &got, &want, 5e-3));
        }
    }
    bad
}

/// The small case of every member: what compute-sanitizer's memcheck and racecheck run.
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_small_case() {
    let Some(_turn) = gpu() else { return };
    let bad = small_case(&BASES);
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

/// `names` in the tf32 and bf16 modes on device tensors at [`MODE_SIZES`] and `more`, against
/// the CPU on the f32 inputs (bf16-rounded activations and `dy` for the bf16 mode): the failures.
pub(crate) fn modes_match_the_cpu(names: &[&str], more: &[[usize; 5]]) -> Vec<String> {
    let mut bad = Vec::new();
    for name in names {
        let m = base(name);
        for (i, s) in MODE_SIZES.iter().chain(more).enumerate() {
            let (x, dy) = case(m.as_ref(), *s, 50 + i as u64);
            let (x32, dy32) = (f32_rounded(&x), dy.mapv(|e| f64::from(e as f32)));
            let want = cpu_grads(m.as_ref(), &x32, &dy32);
            let got = cuda_mode(m.as_ref(), &x32, &dy32, Precision::Tf32);
            bad.extend(compare(&format!("{name} tf32 {s:?}"), &got, &want, 5e-3));
            let (xb, dyb) = bf16_rounded(&x32, &dy32);
            let want = cpu_grads(m.as_ref(), &xb, &dyb);
            let got = cuda_mode(m.as_ref(), &x32, &dy32, Precision::Bf16);
            bad.extend(compare(&format!("{name} bf16 {s:?}"), &got, &want, 2e-2));
        }
    }
    bad
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_in_the_tf32_and_bf16_modes_on_device_tensors() {
    let Some(_turn) = gpu() else { return };
    let bad = modes_match_the_cpu(&BASES, &[]);
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

/// Gated DeltaNet alone in the tf32 and bf16 modes, also at [`REGISTER_PASS_SIZES`] (its
/// backward's tensor-core passes: the shared-memory and register forward passes, the reverse
/// register pass, the products on tensor cores at `Dv > 64`) and at two key tiles with those
/// products (`Dk = 128`, `Dv = 96`, the reverse pass at four warps with few columns).
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_gated_deltanet_in_the_tf32_and_bf16_modes() {
    let Some(_turn) = gpu() else { return };
    let sizes = [REGISTER_PASS_SIZES.as_slice(), &[[1, 333, 2, 128, 96]]].concat();
    let bad = modes_match_the_cpu(&["gated-deltanet"], &sizes);
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_is_finite_where_decays_vanish_and_beta_is_0_or_1() {
    let Some(_turn) = gpu() else { return };
    let mut bad = Vec::new();
    for name in ["mamba2", "gated-deltanet"] {
        let m = base(name);
        let s = [1, 130, 2, 16, 24];
        let (mut x, dy) = case(m.as_ref(), s, 70);
        // g = −1e4 on every third token (the state is wiped there), β alternating 0 and 1.
        for ((_, t, _), g) in x
            .get_mut("g")
            .unwrap()
            .view_mut()
            .into_dimensionality::<ndarray::Ix3>()
            .unwrap()
            .indexed_iter_mut()
        {
            if t % 3 == 1 {
                *g = -1e4;
            }
        }
        if let Some(beta) = x.get_mut("beta") {
            for (i, b) in beta.iter_mut().enumerate() {
                *b = (i % 2) as f64;
            }
        }
        let want = cpu_grads(m.as_ref(), &x, &dy);
        bad.extend(compare(
            &format!("{name} f64 vanishing decays"),
            &cuda_exact(m.as_ref(), &x, &dy, DType::F64),
            &want,
            1e-10,
        ));
        let got = cuda_exact(m.as_ref(), &x, &dy, DType::F32);
        bad.extend(compare(&format!("{name} f32 vanishing decays"), &got, &want, 1e-4));
        let got = cuda_mode(m.as_ref(), &x, &dy, Precision::Tf32);
        assert!(got.values().all(|a| a.iter().all(|v| v.is_finite())), "{name} tf32: a non-finite gradient");
    }
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

/// Asserts that two runs of the backward of each of `names` in each of `modes` give the same
/// bits.
pub(crate) fn same_bits_twice(names: &[&str], modes: &[Precision]) {
    for name in names {
        let m = base(name);
        for &p in modes {
            let (x, dy) = case(m.as_ref(), [2, 333, 3, 70, 40], 90);
            let a = cuda_mode(m.as_ref(), &x, &dy, p);
            let b = cuda_mode(m.as_ref(), &x, &dy, p);
            for (k, v) in &a {
                let same = v.iter().zip(&b[k]).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{name} {p}: {k} differs between two runs");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_gives_the_same_bits_twice() {
    let Some(_turn) = gpu() else { return };
    same_bits_twice(&BASES, &[Precision::Exact, Precision::Tf32]);
}

/// Device-side errors: `dy` of the wrong shape or dtype, and a required input that is not given.
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_backward_on_device_tensors_checks_its_arguments() {
    let Some(_turn) = gpu() else { return };
    let m = base("mamba2");
    let (x, dy) = case(m.as_ref(), [1, 10, 2, 4, 3], 5);
    let x32: Tensors<f32> = x.iter().map(|(k, v)| (k.clone(), v.mapv(|e| e as f32))).collect();
    let dev = upload_inputs(&x32, Precision::Exact).unwrap();
    let wrong = AnyDeviceTensor::F32(DeviceTensor::upload(&ArrayD::<f32>::zeros(vec![1, 10, 2, 4])).unwrap());
    let e =
        backward_device(m.as_ref(), &dev, &wrong, &Requires::All, Precision::Exact).unwrap_err().to_string();
    assert!(e.contains("dy") && e.contains("shape of y"), "{e}");
    let d64 = AnyDeviceTensor::F64(DeviceTensor::upload(&dy).unwrap());
    let e =
        backward_device(m.as_ref(), &dev, &d64, &Requires::All, Precision::Exact).unwrap_err().to_string();
    assert!(e.contains("dy") && e.contains("f32"), "{e}");
    let d = device_dy(&dy, Precision::Exact);
    let e = backward_device(m.as_ref(), &dev, &d, &Requires::only(["beta"]), Precision::Exact)
        .unwrap_err()
        .to_string();
    assert!(e.contains("beta"), "{e}");
    // Only what is required comes back.
    let g = backward_device(m.as_ref(), &dev, &d, &Requires::only(["g", "v"]), Precision::Exact).unwrap();
    assert_eq!(g.keys().collect::<Vec<_>>(), ["d_g", "d_v"]);
}

/// Every member of the family, the three lifts included, lists the `fast` backward on CUDA (no
/// GPU needed).
#[test]
fn every_member_lists_the_fast_backward_on_cuda() {
    for name in
        BASES.into_iter().chain(["loglinear-attention", "loglinear-mamba2", "loglinear-gated-deltanet"])
    {
        let m = base(name);
        assert!(backward_forms(m.as_ref(), "cuda").contains(&Form::Fast), "{name}");
    }
}

/// Forward alone against forward + backward of `names` at `shapes` in `modes`, CUDA events around
/// device-resident runs (f32 inputs; bf16 activations and `dy` in the bf16 mode), printed as
/// `TIME` lines: medians of 5.
pub(crate) fn time_forward_and_backward(names: &[&str], shapes: &[[usize; 5]], modes: &[Precision]) {
    let Some(_turn) = gpu() else { return };
    let g = mixer_cuda::runtime::gpu().unwrap();
    let event =
        || g.stream().record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).unwrap();
    let forward =
        |m: &dyn Mixer, dev: &DeviceTensors, p| run_device_with(m, Form::Fast, dev, p, false).unwrap();
    for shape in shapes {
        for name in names {
            let m = base(name);
            let (x, dy) = case(m.as_ref(), *shape, 3);
            let x32: Tensors<f32> = x.iter().map(|(k, v)| (k.clone(), v.mapv(|e| e as f32))).collect();
            for &p in modes {
                let dev: DeviceTensors = upload_inputs(&x32, p).unwrap();
                let d = device_dy(&dy, p);
                // Warm-up: compiles and fills the pool.
                drop(run_device(m.as_ref(), Form::Fast, &dev, p).unwrap());
                drop(backward_device(m.as_ref(), &dev, &d, &Requires::All, p).unwrap());
                g.sync("timing").unwrap();
                let time = |f: &dyn Fn()| {
                    let mut v: Vec<f64> = (0..5)
                        .map(|_| {
                            let a = event();
                            f();
                            let b = event();
                            f64::from(a.elapsed_ms(&b).unwrap())
                        })
                        .collect();
                    v.sort_by(f64::total_cmp);
                    v[2]
                };
                let fwd = time(&|| drop(forward(m.as_ref(), &dev, p)));
                let both = time(&|| {
                    drop(forward(m.as_ref(), &dev, p));
                    drop(backward_device(m.as_ref(), &dev, &d, &Requires::All, p).unwrap());
                });
                println!(
                    "TIME {name} {p} (B,T,H,D)=({},{},{},{}) forward {fwd:.3} ms, forward+backward {both:.3} ms, \
                     ratio {:.2}",
                    shape[0],
                    shape[1],
                    shape[2],
                    shape[3],
                    both / fwd
                );
            }
        }
    }
}

/// Linear attention and Mamba-2 at issue 37's three shapes in every mode.
#[test]
#[ignore = "needs a CUDA device; a timing, not a check"]
fn loglinear_backward_timing() {
    time_forward_and_backward(
        &["linear-attention", "mamba2"],
        &[[1, 16384, 16, 64, 64], [8, 4096, 16, 64, 64], [8, 4096, 16, 128, 128]],
        &[Precision::Tf32, Precision::Bf16, Precision::Exact],
    );
}

/// Gated DeltaNet at the goal's three shapes in every mode.
#[test]
#[ignore = "needs a CUDA device; a timing, not a check"]
fn loglinear_backward_timing_gated_deltanet() {
    time_forward_and_backward(
        &["gated-deltanet"],
        &[[1, 16384, 16, 64, 64], [8, 4096, 16, 64, 64], [8, 4096, 16, 128, 128]],
        &[Precision::Tf32, Precision::Exact, Precision::Bf16],
    );
}
