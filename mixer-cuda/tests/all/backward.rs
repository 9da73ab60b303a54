//! The CUDA `fast` backward of attention and the Toeplitz mixer against the CPU's `fast`
//! backward on the same inputs and cotangent (every input gradient, `f64` within 1e-10 and
//! `f32` within 1e-4 relative RMS), bit-for-bit repeatability, logits near and beyond the `f32`
//! range, and a timing of forward against backward on device-resident tensors.

use super::common;

use mixer_core::mixer::{Mixer, complete_dims};
use mixer_core::tensor::cast_tensors;
use mixer_core::{DType, Form, Precision, Requires, Tensors};
use mixer_cuda::forms::{download_as, f32_to_bf16, upload_inputs, upload_one};
use mixer_cuda::{AnyDeviceTensor, backward_device, run_device};
use mixer_registry::backward::backward_as;
use mixer_registry::{Sizes, mixer};
use ndarray::ArrayD;

/// A cotangent of `shape` with entries in [−1, 1] that depend on the seed and the position.
fn cotangent(shape: &[usize], seed: u64) -> ArrayD<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    ArrayD::from_shape_simple_fn(shape.to_vec(), || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    })
}

fn rms(a: &ArrayD<f64>) -> f64 {
    (a.iter().map(|x| x * x).sum::<f64>() / a.len().max(1) as f64).sqrt()
}

/// The median of 5 timed runs of `f` after a warm-up run, in milliseconds (CUDA events around each
/// run on the backend's stream).
fn median_ms(f: &mut dyn FnMut()) -> f64 {
    let stream = mixer_cuda::stream().unwrap();
    // Events with timing (cudarc's default flags leave it out).
    let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    f();
    stream.synchronize().unwrap();
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let e0 = stream.record_event(timed).unwrap();
            f();
            let e1 = stream.record_event(timed).unwrap();
            stream.synchronize().unwrap();
            f64::from(e0.elapsed_ms(&e1).unwrap())
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[2]
}

/// `rms(got − want) / max(rms(want), floor)` (`floor`: the size of the gradient's summands, for
/// gradients that cancel to about zero, e.g. `d_q` of a window of one).
fn rel(got: &ArrayD<f64>, want: &ArrayD<f64>, floor: f64) -> f64 {
    assert_eq!(got.shape(), want.shape());
    rms(&(got - want)) / rms(want).max(floor).max(f64::MIN_POSITIVE)
}

/// The `fast` backward of `m` on `backend` in `dtype`, every gradient, as `f64`.
fn grads(m: &dyn Mixer, backend: &str, x: &Tensors<f64>, dy: &ArrayD<f64>, dtype: DType) -> Tensors<f64> {
    backward_as(m, backend, Form::Fast, x, dy, dtype, &Requires::All)
        .unwrap_or_else(|e| panic!("{} on {backend} ({}): {e}", m.name(), dtype.name()))
}

/// Checks every gradient of the CUDA backward against the CPU's in both dtypes; `floors` gives
/// each gradient's floor of the relative error.
fn against_cpu(m: &dyn Mixer, what: &str, x: &Tensors<f64>, dy: &ArrayD<f64>, floors: &[(&str, f64)]) {
    for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 1e-4)] {
        let want = grads(m, "cpu", x, dy, dtype);
        let got = grads(m, "cuda", x, dy, dtype);
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{what}");
        for (name, w) in &want {
            let floor = floors.iter().find(|(n, _)| n == name).map_or(0.0, |f| f.1);
            let g = &got[name];
            let e = rel(g, w, floor);
            println!("GRAD {what} {} {name} rel_rms={e:.3e}", dtype.name());
            assert!(g.iter().all(|v| v.is_finite()), "{what} {}: {name} not finite", dtype.name());
            assert!(e <= tol, "{what} {}: {name} rel_rms {e:.3e} > {tol:e}", dtype.name());
        }
    }
}

/// Attention: T ∈ {1, 63, 64, 65, 1000, 4099}, head dims from 5 to 256 (Dk ≠ Dv too), windows
/// of 1 and 100 and none, a negative scale.
#[test]
#[ignore = "needs a CUDA device"]
fn attention_backward_matches_the_cpu() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let cases: &[(usize, usize, usize, usize, usize, serde_json::Value)] = &[
        (1, 1, 2, 16, 16, serde_json::json!({})),
        (2, 63, 2, 5, 70, serde_json::json!({"window": 100})),
        (1, 64, 2, 64, 64, serde_json::json!({"window": 1})),
        (2, 65, 1, 70, 16, serde_json::json!({})),
        (1, 200, 2, 33, 20, serde_json::json!({"scale": -0.7})),
        (1, 1000, 2, 128, 128, serde_json::json!({"window": 100})),
        (1, 1000, 1, 256, 70, serde_json::json!({})),
        (1, 300, 1, 256, 256, serde_json::json!({"window": 100})),
        (1, 4099, 1, 16, 64, serde_json::json!({})),
        (1, 4099, 1, 64, 64, serde_json::json!({"window": 100})),
    ];
    for (i, (b, t, h, dk, dv, cfg)) in cases.iter().enumerate() {
        let m = mixer("attention", cfg).unwrap();
        let s = Sizes { batch: *b, seq: *t, channels: 1, heads: *h, dk: *dk, dv: *dv };
        let x = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 40 + i as u64).unwrap();
        let dy = cotangent(&[*b, *t, *h, *dv], 7 + i as u64);
        let sigma = cfg.get("scale").and_then(|v| v.as_f64()).unwrap_or(1.0 / (*dk as f64).sqrt()).abs();
        // d_q and d_k: σ · (dy·v) · k (or q), the size of the summands before they cancel.
        let summand = |other: &str| sigma * rms(&dy) * rms(&x["v"]) * rms(&x[other]);
        let floors = [("d_q", summand("k")), ("d_k", summand("q"))];
        let what = format!("attention {cfg} B={b} T={t} H={h} Dk={dk} Dv={dv}");
        against_cpu(m.as_ref(), &what, &x, &dy, &floors);
    }
}

/// Toeplitz: T ∈ {1, 63, 64, 65, 1000, 4099}, heads, kernel widths above 1, a bias, kernels
/// longer than T (their gradient is zero past T).
#[test]
#[ignore = "needs a CUDA device"]
fn toeplitz_backward_matches_the_cpu() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    // (B, T, C, heads, Kw, bias, extra taps)
    let cases = [
        (1, 1, 4, 1, 1, false, 0),
        (2, 63, 6, 2, 1, true, 0),
        (1, 64, 8, 2, 3, true, 5),
        (2, 65, 10, 5, 2, false, 0),
        (1, 1000, 12, 3, 2, true, 7),
        (1, 4099, 6, 2, 1, true, 0),
        (2, 4099, 9, 3, 4, true, 3),
    ];
    for (i, &(b, t, c, h, kw, bias, extra)) in cases.iter().enumerate() {
        let m = mixer("toeplitz", &serde_json::json!({"heads": h, "kernel_width": kw})).unwrap();
        let s = Sizes { batch: b, seq: t, channels: c, heads: h, dk: 1, dv: 1 };
        let mut dims = complete_dims(m.as_ref(), &s.dims());
        dims.insert("Tw", t + extra);
        let mut x = m.random_inputs(&dims, 60 + i as u64).unwrap();
        if bias {
            x.insert("bias".into(), cotangent(&[h, t + extra], 90 + i as u64));
        }
        let dy = cotangent(&[b, t, c], 30 + i as u64);
        let what = format!("toeplitz B={b} T={t} C={c} H={h} Kw={kw} bias={bias} Tw={}", t + extra);
        against_cpu(m.as_ref(), &what, &x, &dy, &[]);
        let g = grads(m.as_ref(), "cuda", &x, &dy, DType::F64);
        let dw = &g["d_w"];
        let last = dw.ndim() - 1;
        let past = dw.indexed_iter().filter(|(i, _)| i[last] >= t).all(|(_, &v)| v == 0.0);
        assert!(past, "{what}: d_w past T is not zero");
    }
}

/// The same inputs give the same bits, run after run (no order-dependent reductions).
#[test]
#[ignore = "needs a CUDA device"]
fn backward_is_repeatable_bit_for_bit() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let att = mixer("attention", &serde_json::json!({"window": 300})).unwrap();
    let tz = mixer("toeplitz", &serde_json::json!({"heads": 2, "kernel_width": 2})).unwrap();
    for (m, s) in [
        (att, Sizes { batch: 2, seq: 1000, channels: 1, heads: 2, dk: 64, dv: 70 }),
        (tz, Sizes { batch: 2, seq: 1000, channels: 8, heads: 2, dk: 1, dv: 1 }),
    ] {
        let x = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 5).unwrap();
        let y_shape: Vec<usize> = if m.family() == "attention" {
            vec![s.batch, s.seq, s.heads, s.dv]
        } else {
            vec![s.batch, s.seq, s.channels]
        };
        let dy = cotangent(&y_shape, 3);
        for dtype in [DType::F32, DType::F64] {
            let a = grads(m.as_ref(), "cuda", &x, &dy, dtype);
            let b = grads(m.as_ref(), "cuda", &x, &dy, dtype);
            for (name, g) in &a {
                let same = g.iter().zip(b[name].iter()).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "{} {}: {name} differs between two runs", m.name(), dtype.name());
            }
        }
    }
}

/// Logits near and beyond the f32 range: f32 `q, k` of 2⁶³ (dot products beyond 3.4e38) and a
/// scale of 1e308, at head dims 3, 4 (the FMA kernels) and 64 (in f32 the exact mode's tensor-core
/// backward, whose forward finds the overflow and hands every gradient to the FMA kernels). The
/// gradients are finite, and `d_v` keeps the identity `Σ_s d_v[s] = Σ_t dy[t]` (every softmax
/// row sums to 1).
#[test]
#[ignore = "needs a CUDA device"]
fn attention_backward_huge_logits_give_no_nan() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let cases = [(serde_json::json!({}), 2f64.powi(63)), (serde_json::json!({"scale": 1e308}), 1.0)];
    for ((cfg, mag), (dk, dv)) in cases.iter().flat_map(|c| [(3, 4), (64, 64)].map(|d| (c, d))) {
        let (b, t, h, mag) = (2, 150, 2, *mag);
        let m = mixer("attention", cfg).unwrap();
        let s = Sizes { batch: b, seq: t, channels: 1, heads: h, dk, dv };
        let mut x = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 17).unwrap();
        for name in ["q", "k"] {
            x.get_mut(name).unwrap().mapv_inplace(|v| v * mag);
        }
        let dy = cotangent(&[b, t, h, dv], 4);
        for dtype in [DType::F32, DType::F64] {
            let g = grads(m.as_ref(), "cuda", &x, &dy, dtype);
            for (name, v) in &g {
                assert!(v.iter().all(|e| e.is_finite()), "{cfg} {}: {name} has {v:?}", dtype.name());
            }
            let sum_dv = g["d_v"].sum_axis(ndarray::Axis(1));
            let sum_dy = dy.sum_axis(ndarray::Axis(1));
            let e = rel(&sum_dv, &sum_dy, 0.0);
            println!("GRAD attention huge logits {cfg} {}: Σ d_v vs Σ dy rel_rms={e:.3e}", dtype.name());
            assert!(e < 1e-4, "{cfg} {}: Σ d_v vs Σ dy {e:.3e}", dtype.name());
        }
    }
}

/// The exact mode's tensor-core backward (split-tf32 products) against the FMA kernels on the same
/// f32 inputs: at D = 64 and 128 (causal, T = 300; a window of 40, T = 129) every gradient agrees
/// to the f32 tolerance, and the tensor-core path ran (its bits differ from the FMA kernels').
#[test]
#[ignore = "needs a CUDA device"]
fn attention_backward_exact_tensor_cores_match_the_fma_kernels() {
    use mixer_cuda::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};
    let Some(_turn) = common::gpu() else {
        return;
    };
    for (t, d, cfg) in [(300, 64, serde_json::json!({})), (129, 128, serde_json::json!({"window": 40}))] {
        let m = mixer("attention", &cfg).unwrap();
        let a = mixer_core::mixers::attention::Attention::from_json("attention", &cfg).unwrap();
        let s = Sizes { batch: 2, seq: t, channels: 1, heads: 3, dk: d, dv: d };
        let x = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 5).unwrap();
        let dy = cotangent(&[2, t, 3, d], 6);
        let up = |a: &ArrayD<f64>| AnyDeviceTensor::F32(DeviceTensor::upload(&a.mapv(|v| v as f32)).unwrap());
        let host = |g: &AnyDeviceTensor| g.typed::<f32>("g").unwrap().to_host().unwrap().mapv(f64::from);
        let dev: DeviceTensors = x.iter().map(|(k, v)| (k.clone(), up(v))).collect();
        let tc =
            mixer_cuda::attention::backward::run::<f32>(&a, &dev, &up(&dy), &Requires::All, Precision::Exact)
                .unwrap();
        let fma =
            mixer_cuda::attention::backward::run_fma::<f32>(&a, &dev, &up(&dy), &Requires::All).unwrap();
        let mut differ = false;
        for name in ["d_q", "d_k", "d_v"] {
            let (p, q) = (host(&tc[name]), host(&fma[name]));
            differ |= p.iter().zip(q.iter()).any(|(u, v)| u != v);
            let e = rel(&p, &q, 0.0);
            println!("GRAD attention exact tensor cores vs FMA {cfg} T={t} D={d} {name} rel_rms={e:.3e}");
            assert!(e < 1e-5, "{cfg} T={t} D={d} {name}: {e:.3e}");
        }
        assert!(
            differ,
            "{cfg} T={t} D={d}: the tensor-core path did not run (bits equal to the FMA kernels')"
        );
    }
}

/// Times the forward and the backward on device-resident f32 tensors (CUDA events, the median
/// of 5 runs after a warm-up), printing one `TIMING` line per shape: attention at (B, T, H, D) =
/// (1, 16384, 16, 64), (8, 4096, 16, 64), (8, 4096, 16, 128) and the Toeplitz mixer at the same
/// (B, T) with C = H·D channels, H heads.
#[test]
#[ignore = "needs a CUDA device; a measurement"]
fn backward_timing() {
    let Some(_turn) = common::gpu_alone() else {
        return;
    };
    use mixer_cuda::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};
    let dev = |shape: &[usize], seed: u64| -> AnyDeviceTensor {
        AnyDeviceTensor::F32(DeviceTensor::upload(&cotangent(shape, seed).mapv(|v| v as f32)).unwrap())
    };
    for (b, t, h, d) in [(1, 16384, 16, 64), (8, 4096, 16, 64), (8, 4096, 16, 128)] {
        let m = mixer("attention", &serde_json::json!({})).unwrap();
        let a =
            mixer_core::mixers::attention::Attention::from_json("attention", &serde_json::json!({})).unwrap();
        let x: DeviceTensors = [("q", 1), ("k", 2), ("v", 3)]
            .into_iter()
            .map(|(n, s)| (n.to_string(), dev(&[b, t, h, d], s)))
            .collect();
        let dy = dev(&[b, t, h, d], 4);
        let mut out = Vec::new();
        for p in [Precision::Exact, Precision::Tf32] {
            let fwd = median_ms(&mut || {
                drop(mixer_cuda::device_run::run_device_with(m.as_ref(), Form::Fast, &x, p, false).unwrap())
            });
            out.push(format!("fwd_{}={fwd:.3}", p.name()));
        }
        let bwd = median_ms(&mut || {
            drop(
                mixer_cuda::attention::backward::run::<f32>(&a, &x, &dy, &Requires::All, Precision::Exact)
                    .unwrap(),
            )
        });
        println!("TIMING attention B={b} T={t} H={h} D={d} ms: {} bwd={bwd:.3}", out.join(" "));

        let c = h * d;
        let tzm = mixer("toeplitz", &serde_json::json!({"heads": h})).unwrap();
        let tz =
            mixer_core::mixers::toeplitz::Toeplitz::from_json("toeplitz", &serde_json::json!({"heads": h}))
                .unwrap();
        let mut xt: DeviceTensors = DeviceTensors::new();
        xt.insert("x".into(), dev(&[b, t, c], 5));
        xt.insert("w".into(), dev(&[h, t], 6));
        xt.insert("bias".into(), dev(&[h, t], 7));
        let dyt = dev(&[b, t, c], 8);
        let fwd = median_ms(&mut || {
            drop(
                mixer_cuda::device_run::run_device_with(
                    tzm.as_ref(),
                    Form::Fast,
                    &xt,
                    Precision::Exact,
                    false,
                )
                .unwrap(),
            )
        });
        let bwd = median_ms(&mut || {
            drop(
                mixer_cuda::toeplitz::backward::run::<f32>(&tz, &xt, &dyt, &Requires::All, Precision::Exact)
                    .unwrap(),
            )
        });
        println!("TIMING toeplitz B={b} T={t} C={c} H={h} ms: fwd={fwd:.3} bwd={bwd:.3}");
    }
}

/// One small backward of each family on the CUDA backend alone (for compute-sanitizer's memcheck
/// and racecheck: a window, head dims that are not multiples of 16, a partial last tile; two
/// taps, a bias and kernels longer than T; a GLR lattice with far taps and a partial block),
/// checked against the CPU.
#[test]
#[ignore = "needs a CUDA device"]
fn backward_small_cases() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let m = mixer("attention", &serde_json::json!({"window": 20})).unwrap();
    let s = Sizes { batch: 1, seq: 70, channels: 1, heads: 2, dk: 5, dv: 7 };
    let x = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 1).unwrap();
    let dy = cotangent(&[1, 70, 2, 7], 2);
    against_cpu(m.as_ref(), "attention small", &x, &dy, &[("d_q", 1e-3), ("d_k", 1e-3)]);
    let m = mixer("toeplitz", &serde_json::json!({"heads": 2, "kernel_width": 2})).unwrap();
    let s = Sizes { batch: 2, seq: 33, channels: 6, heads: 2, dk: 1, dv: 1 };
    let mut dims = complete_dims(m.as_ref(), &s.dims());
    dims.insert("Tw", 40);
    let mut x = m.random_inputs(&dims, 3).unwrap();
    x.insert("bias".into(), cotangent(&[2, 40], 4));
    let dy = cotangent(&[2, 33, 6], 5);
    against_cpu(m.as_ref(), "toeplitz small", &x, &dy, &[]);
    // The GLR: far taps beyond the reverse sweep's 32-row ring, positions shared by two taps
    // (sq1's lattice), a channel count that is no multiple of a block.
    let m =
        mixer("glr", &serde_json::json!({"pattern": "sq1", "cache_efficient": true, "on": "both"})).unwrap();
    let (x, dy) = glr_case(m.as_ref(), 2, 100, 70, 6);
    against_cpu(m.as_ref(), "glr small", &x, &dy, &[]);
    // Translation-invariant: the reverse recurrence through the forward's kernel, x̄ gathered.
    let m = mixer("glr", &serde_json::json!({"pattern": "pow2", "on": "both"})).unwrap();
    let (x, dy) = glr_case(m.as_ref(), 2, 100, 70, 7);
    against_cpu(m.as_ref(), "glr pow2 small", &x, &dy, &[]);
}

/// The GLR's inputs for `m` at (B, T, C), drawn by the mixer (β keeps the recurrence stable), and
/// a cotangent.
fn glr_case(m: &dyn Mixer, b: usize, t: usize, c: usize, seed: u64) -> (Tensors<f64>, ArrayD<f64>) {
    let s = Sizes { batch: b, seq: t, channels: c, heads: 1, dk: 1, dv: 1 };
    let x = m.random_inputs(&complete_dims(m, &s.dims()), seed).unwrap();
    (x, cotangent(&[b, t, c], seed + 1))
}

/// GLR: every registered pattern (the fibonacci plugin included; `linear` truncated to order 3),
/// translation-invariant and cache-efficient, `on = b / a / both`, at T ∈ {1, 63, 64, 65, 1000,
/// 4099} (B = 2, C = 13 below 4099, B = 1, C = 5 at 4099); the aliases, dense-recurrence with
/// K = T − 1 included.
#[test]
#[ignore = "needs a CUDA device"]
fn glr_backward_matches_the_cpu() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let mut n = 0;
    for p in mixer_registry::PATTERNS.iter() {
        for ce in [false, true] {
            for on in ["b", "a", "both"] {
                let mut cfg = serde_json::json!({"pattern": p.name, "cache_efficient": ce, "on": on});
                if p.name == "linear" {
                    cfg["order"] = 3.into();
                }
                // A pattern whose f(0) ≠ 1 has no cache-efficient lattice: the mixer refuses it.
                let Ok(m) = mixer("glr", &cfg) else {
                    assert!(ce, "glr {cfg} refused");
                    continue;
                };
                for (i, t) in [1, 63, 64, 65, 1000, 4099].into_iter().enumerate() {
                    let (b, c) = if t > 1000 { (1, 5) } else { (2, 13) };
                    let (x, dy) = glr_case(m.as_ref(), b, t, c, 100 * n + i as u64);
                    against_cpu(m.as_ref(), &format!("glr {cfg} B={b} T={t} C={c}"), &x, &dy, &[]);
                }
                n += 1;
            }
        }
    }
    assert!(n >= 18, "only {n} GLR configurations ran");
    for (name, cfg, t) in [
        ("diagonal-ssm", serde_json::json!({}), 1000),
        ("diagonal-ssm", serde_json::json!({"on": "both"}), 65),
        ("kth-order", serde_json::json!({"order": 20}), 1000),
        ("kth-order", serde_json::json!({"order": 3, "on": "a"}), 63),
        ("dense-recurrence", serde_json::json!({}), 200),
        ("dense-recurrence", serde_json::json!({"on": "both"}), 65),
        ("fibonacci-glr", serde_json::json!({"cache_efficient": true}), 1000),
    ] {
        let m = mixer(name, &cfg).unwrap();
        let (x, dy) = glr_case(m.as_ref(), 2, t, 13, 7);
        against_cpu(m.as_ref(), &format!("{name} {cfg} B=2 T={t} C=13"), &x, &dy, &[]);
    }
}

/// GLR: the same inputs give the same bits twice, and a subset of the gradients equals the same
/// gradients of the full set.
#[test]
#[ignore = "needs a CUDA device"]
fn glr_backward_is_repeatable_and_requires_subsets() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    for cfg in [
        serde_json::json!({"pattern": "sq1", "cache_efficient": true, "on": "both"}),
        serde_json::json!({"pattern": "pow2", "on": "a"}),
    ] {
        let m = mixer("glr", &cfg).unwrap();
        let (x, dy) = glr_case(m.as_ref(), 2, 1000, 13, 11);
        for dtype in [DType::F32, DType::F64] {
            let a = grads(m.as_ref(), "cuda", &x, &dy, dtype);
            let b = grads(m.as_ref(), "cuda", &x, &dy, dtype);
            for (name, g) in &a {
                let same = g.iter().zip(b[name].iter()).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "glr {cfg} {}: {name} differs between two runs", dtype.name());
            }
            for only in x.keys() {
                let req = Requires::only([only.as_str()]);
                let s = backward_as(m.as_ref(), "cuda", Form::Fast, &x, &dy, dtype, &req).unwrap();
                let name = format!("d_{only}");
                assert_eq!(s.keys().collect::<Vec<_>>(), vec![&name], "glr {cfg}: {only}");
                let same = s[&name].iter().zip(a[&name].iter()).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "glr {cfg} {}: {name} alone differs from {name} of all", dtype.name());
            }
        }
    }
}

/// GLR: given the forward's output (`y`, `SAVED_OUTPUT`), the backward reads it instead of
/// running the forward again — the same bits as without it (the forward is deterministic), and
/// another `y` changes `d_beta` only.
#[test]
#[ignore = "needs a CUDA device"]
fn glr_backward_reads_the_saved_output() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let cuda = mixer_registry::Backend::by_name("cuda").unwrap();
    for cfg in [
        serde_json::json!({"pattern": "pow2"}),
        serde_json::json!({"pattern": "sq1", "cache_efficient": true, "on": "both"}),
    ] {
        let m = mixer("glr", &cfg).unwrap();
        let (x, dy) = glr_case(m.as_ref(), 2, 1000, 13, 11);
        for dtype in [DType::F32, DType::F64] {
            let y = mixer_registry::run::run_as(m.as_ref(), &cuda, Form::Fast, &x, dtype).unwrap();
            let mut with_y = x.clone();
            with_y.insert("y".into(), y.clone());
            let a = backward_as(m.as_ref(), "cuda", Form::Fast, &x, &dy, dtype, &Requires::All).unwrap();
            let b = backward_as(m.as_ref(), "cuda", Form::Fast, &with_y, &dy, dtype, &Requires::All).unwrap();
            assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "glr {cfg}: no d_y");
            for (name, g) in &a {
                let same = g.iter().zip(b[name].iter()).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "glr {cfg} {}: {name} differs with the saved output", dtype.name());
            }
            with_y.insert("y".into(), y.mapv(|v| 0.5 * v + 0.25));
            let c = backward_as(m.as_ref(), "cuda", Form::Fast, &with_y, &dy, dtype, &Requires::All).unwrap();
            assert_ne!(c["d_beta"], a["d_beta"], "glr {cfg}: the saved output is read");
            assert_eq!(c["d_alpha"], a["d_alpha"], "glr {cfg}: only d_beta reads y");
        }
        // On device tensors, as a training step holds them: y as the device forward wrote it (and
        // in the bf16 mode also rounded to bf16, dy's dtype), no d_y; d_alpha and d_x the same
        // bits as without it, d_beta (which reads y) within the mode's rounding of y of the one
        // from the recomputed y.
        let (x32, dy32) = (cast_tensors::<f32>(&x), dy.mapv(|v| v as f32));
        for (p, round) in [(Precision::Tf32, false), (Precision::Bf16, false), (Precision::Bf16, true)] {
            let dev = upload_inputs(&x32, p).unwrap();
            let d = upload_one(&dy32, p == Precision::Bf16).unwrap();
            let mut with_y = upload_inputs(&x32, p).unwrap();
            let y = run_device(m.as_ref(), Form::Fast, &dev, p).unwrap();
            let y = match (round, y) {
                (true, AnyDeviceTensor::F32(t)) => AnyDeviceTensor::Bf16(f32_to_bf16(&t).unwrap()),
                (_, y) => y,
            };
            with_y.insert("y".into(), y);
            let a = backward_device(m.as_ref(), &dev, &d, &Requires::All, p).unwrap();
            let b = backward_device(m.as_ref(), &with_y, &d, &Requires::All, p).unwrap();
            assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "glr {cfg} {p:?}: no d_y");
            for (name, g) in &a {
                let f64s = |t| download_as::<f32>(t).unwrap().mapv(f64::from);
                let (ga, gb) = (f64s(g), f64s(&b[name]));
                if name == "d_beta" {
                    let rel = rms(&(&ga - &gb)) / rms(&ga);
                    let tol = if p == Precision::Bf16 { 1e-2 } else { 1e-5 };
                    assert!(rel < tol, "glr {cfg} {p:?}: d_beta rel {rel:.2e} with the saved output");
                } else {
                    let same = ga.iter().zip(gb.iter()).all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "glr {cfg} {p:?}: {name} differs with the saved output on device");
                }
            }
            // A saved output of another shape is refused, naming it.
            let short = x32["x"].slice(ndarray::s![.., ..999, ..]).to_owned().into_dyn();
            with_y.insert("y".into(), upload_one(&short, false).unwrap());
            let e = backward_device(m.as_ref(), &with_y, &d, &Requires::All, p).unwrap_err().to_string();
            assert!(e.contains("input `y`") && e.contains("999"), "glr {cfg} {p:?}: {e}");
        }
    }
}

/// GLR in the bf16 mode on device tensors: bf16 `x` and `dy` are converted on the device and the
/// gradients are computed in f32, so they match the CPU's f64 backward on the bf16-rounded
/// values within f32 accuracy.
#[test]
#[ignore = "needs a CUDA device"]
fn glr_backward_bf16_activations() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    use mixer_core::precision::round_bf16;
    use mixer_cuda::tensor::{AnyDeviceTensor, DeviceTensor, bf16};
    let cfg = serde_json::json!({"pattern": "pow2", "cache_efficient": true, "on": "both"});
    let m = mixer("glr", &cfg).unwrap();
    let glr = m.as_any().downcast_ref::<mixer_core::mixers::glr::Glr>().unwrap();
    let (mut x, mut dy) = glr_case(m.as_ref(), 2, 300, 13, 21);
    let round = |a: &mut ArrayD<f64>| a.mapv_inplace(|v| f64::from(round_bf16(v as f32)));
    round(x.get_mut("x").unwrap());
    round(&mut dy);
    for name in ["alpha", "beta"] {
        x.get_mut(name).unwrap().mapv_inplace(|v| f64::from(v as f32));
    }
    let want = grads(m.as_ref(), "cpu", &x, &dy, DType::F64);
    let up_bf16 =
        |a: &ArrayD<f64>| AnyDeviceTensor::Bf16(DeviceTensor::upload(&a.mapv(bf16::from_f64)).unwrap());
    let mut dev = mixer_cuda::DeviceTensors::new();
    dev.insert("x".into(), up_bf16(&x["x"]));
    for name in ["alpha", "beta"] {
        dev.insert(
            name.into(),
            AnyDeviceTensor::F32(DeviceTensor::upload(&x[name].mapv(|v| v as f32)).unwrap()),
        );
    }
    let got =
        mixer_cuda::glr::backward::run::<f32>(glr, &dev, &up_bf16(&dy), &Requires::All, Precision::Bf16)
            .unwrap();
    for (name, w) in &want {
        let AnyDeviceTensor::F32(g) = &got[name] else { panic!("{name}: not f32") };
        let e = rel(&g.to_host().unwrap().mapv(f64::from), w, 0.0);
        println!("GRAD glr bf16 {cfg} {name} rel_rms={e:.3e}");
        assert!(e <= 1e-4, "glr bf16 {cfg}: {name} rel_rms {e:.3e}");
    }
}

/// Times the GLR's forward and backward on device-resident f32 tensors (CUDA events, the median
/// of 5 runs after a warm-up), one `TIMING` line per case: pow2 and sq1, translation-invariant and
/// cache-efficient, `on = b` (the backward recomputes y), at (B, T, C) = (1, 16384, 1024) and
/// (8, 4096, 1024).
#[test]
#[ignore = "needs a CUDA device; a measurement"]
fn glr_backward_timing() {
    let Some(_turn) = common::gpu_alone() else {
        return;
    };
    use mixer_cuda::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};
    let all = [
        serde_json::json!({"pattern": "pow2"}),
        serde_json::json!({"pattern": "pow2", "cache_efficient": true}),
        serde_json::json!({"pattern": "sq1"}),
    ];
    // The goal's shape (T = 64k) with pow2 only: sq1's β alone would take 68 GB there.
    for (b, t, c, cfgs) in
        [(1, 16384, 1024, &all[..]), (8, 4096, 1024, &all[..]), (1, 65536, 1024, &all[..1])]
    {
        for cfg in cfgs {
            let m = mixer("glr", cfg).unwrap();
            let glr = m.as_any().downcast_ref::<mixer_core::mixers::glr::Glr>().unwrap();
            let s = Sizes { batch: b, seq: t, channels: c, heads: 1, dk: 1, dv: 1 };
            let host = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 3).unwrap();
            let x: DeviceTensors = host
                .iter()
                .map(|(k, v)| {
                    (k.clone(), AnyDeviceTensor::F32(DeviceTensor::upload(&v.mapv(|e| e as f32)).unwrap()))
                })
                .collect();
            let dy = AnyDeviceTensor::F32(
                DeviceTensor::upload(&cotangent(&[b, t, c], 4).mapv(|v| v as f32)).unwrap(),
            );
            let fwd = median_ms(&mut || {
                drop(
                    mixer_cuda::device_run::run_device_with(
                        m.as_ref(),
                        Form::Fast,
                        &x,
                        Precision::Exact,
                        false,
                    )
                    .unwrap(),
                )
            });
            let bwd = median_ms(&mut || {
                drop(
                    mixer_cuda::glr::backward::run::<f32>(glr, &x, &dy, &Requires::All, Precision::Exact)
                        .unwrap(),
                )
            });
            println!(
                "TIMING glr {cfg} B={b} T={t} C={c} ms: fwd={fwd:.3} bwd={bwd:.3} ratio={:.2}",
                bwd / fwd
            );
        }
    }
}

/// The attention mixer for a window (none: full causal).
fn attention_with(window: Option<usize>) -> Box<dyn Mixer> {
    let cfg = match window {
        Some(w) => serde_json::json!({ "window": w }),
        None => serde_json::json!({}),
    };
    mixer("attention", &cfg).unwrap()
}

/// The tf32 and bf16 modes on device tensors (f32 inputs in tf32, bf16 in bf16) against the CPU's
/// f64 backward on the same values (rounded to f32, or to bf16 for `q, k, v, dy`), relative RMS
/// within 5e-3 (tf32) and 2e-2 (bf16), every gradient; `d_q`, `d_k` against the size of their
/// summands where they cancel (a window of 1). Returns the failures.
fn modes_against_cpu(m: &dyn Mixer, what: &str, x: &Tensors<f64>, dy: &ArrayD<f64>) -> Vec<String> {
    use crate::loglinear_backward::{bf16_rounded, cpu_grads, cuda_mode};
    let x32: Tensors<f64> = x.iter().map(|(k, v)| (k.clone(), v.mapv(|e| f64::from(e as f32)))).collect();
    let dy32 = dy.mapv(|e| f64::from(e as f32));
    let sigma = 1.0 / (x["q"].shape()[3] as f64).sqrt();
    let mut bad = Vec::new();
    for (p, tol) in [(Precision::Tf32, 5e-3), (Precision::Bf16, 2e-2)] {
        let (xr, dyr) =
            if p == Precision::Bf16 { bf16_rounded(&x32, &dy32) } else { (x32.clone(), dy32.clone()) };
        let want = cpu_grads(m, &xr, &dyr);
        let got = cuda_mode(m, &x32, &dy32, p);
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{what} {p}");
        for (name, w) in &want {
            // d_q and d_k: σ · (dy·v) · k (or q), the size of the summands before they cancel;
            // dy·v is a dot product of Dv terms, of size √Dv · rms(dy) · rms(v).
            let dot = (dyr.shape()[3] as f64).sqrt() * rms(&dyr) * rms(&xr["v"]);
            let floor = match name.as_str() {
                "d_q" => sigma * dot * rms(&xr["k"]),
                "d_k" => sigma * dot * rms(&xr["q"]),
                _ => 0.0,
            };
            let g = &got[name];
            let e = rel(g, w, floor);
            let finite = g.iter().all(|v| v.is_finite());
            println!("GRAD {what} {p} {name} rel_rms={e:.3e} tol={tol:.0e}");
            if !finite || e > tol {
                bad.push(format!("{what} {p}: {name} rel_rms {e:.3e} > {tol:.0e} (finite: {finite})"));
            }
        }
    }
    bad
}

/// The tensor-core backward (tf32 and bf16 modes) against the CPU: T ∈ {1, 63, 64, 65, 1000, 4099},
/// head dims 32, 64, 96, 128 (the plan takes each: checked), windows 1, 100, 4099 and none; then the
/// head dims the tensor cores do not take (16, 70, 256: the exact kernels in these modes).
#[test]
#[ignore = "needs a CUDA device"]
fn attention_backward_tensor_cores_match_the_cpu() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    use mixer_cuda::attention::{backward_fused, fast::Storage};
    // (B, T, H, D, window)
    let cases: &[(usize, usize, usize, usize, Option<usize>)] = &[
        (1, 1, 2, 64, None),
        (2, 63, 2, 32, Some(100)),
        (1, 64, 2, 96, Some(1)),
        (2, 65, 1, 128, None),
        (1, 1000, 2, 64, Some(100)),
        (1, 1000, 1, 128, None),
        (1, 1000, 2, 96, Some(4099)),
        (1, 4099, 1, 64, Some(4099)),
        (1, 4099, 1, 32, None),
        (1, 4099, 1, 128, Some(100)),
        (1, 300, 2, 128, Some(1)),
        (2, 333, 3, 16, Some(100)),
        (1, 200, 2, 70, None),
        (1, 100, 1, 256, Some(40)),
    ];
    let mut bad = Vec::new();
    for (i, &(b, t, h, d, window)) in cases.iter().enumerate() {
        let m = attention_with(window);
        let a = m.as_any().downcast_ref::<mixer_core::mixers::attention::Attention>().unwrap();
        for (p, s) in [(Precision::Tf32, Storage::F32), (Precision::Bf16, Storage::Bf16)] {
            let tc = backward_fused::plan(a, [b, t, h, d, d], p, s, 219 << 10, true).unwrap().is_some();
            assert_eq!(tc, [32, 64, 96, 128].contains(&d), "D = {d} {p}: tensor cores {tc}");
        }
        let s = Sizes { batch: b, seq: t, channels: 1, heads: h, dk: d, dv: d };
        let x = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 300 + i as u64).unwrap();
        let dy = cotangent(&[b, t, h, d], 400 + i as u64);
        bad.extend(modes_against_cpu(
            m.as_ref(),
            &format!("attention w={window:?} B={b} T={t} H={h} D={d}"),
            &x,
            &dy,
        ));
    }
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

/// One small case per tensor-core kernel and mode (for compute-sanitizer): T = 70 (a partial tile),
/// D = 32, a window of 20, against the CPU.
#[test]
#[ignore = "needs a CUDA device"]
fn attention_backward_tensor_cores_small_case() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let m = attention_with(Some(20));
    let s = Sizes { batch: 1, seq: 70, channels: 1, heads: 2, dk: 32, dv: 32 };
    let x = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 8).unwrap();
    let bad = modes_against_cpu(m.as_ref(), "attention small", &x, &cotangent(&[1, 70, 2, 32], 9));
    assert!(bad.is_empty(), "failed:\n{}", bad.join("\n"));
}

/// The tensor-core backward gives the same bits twice, and logits near the f32 range (q, k of a
/// block of tokens times 1e18: logits about 1e36) give finite gradients.
#[test]
#[ignore = "needs a CUDA device"]
fn attention_backward_tensor_cores_repeat_and_stay_finite() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    use crate::loglinear_backward::cuda_mode;
    let m = attention_with(Some(300));
    let s = Sizes { batch: 2, seq: 1000, channels: 1, heads: 2, dk: 64, dv: 64 };
    let x = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 5).unwrap();
    let dy = cotangent(&[2, 1000, 2, 64], 3);
    for p in [Precision::Tf32, Precision::Bf16] {
        let (a, b) = (cuda_mode(m.as_ref(), &x, &dy, p), cuda_mode(m.as_ref(), &x, &dy, p));
        for (name, g) in &a {
            let same = g.iter().zip(b[name].iter()).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "{p}: {name} differs between two runs");
        }
    }
    let m = attention_with(None);
    let s = Sizes { batch: 1, seq: 300, channels: 1, heads: 2, dk: 64, dv: 64 };
    let mut x = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 3).unwrap();
    for name in ["q", "k"] {
        for (i, v) in x.get_mut(name).unwrap().indexed_iter_mut() {
            if (130..200).contains(&i[1]) {
                *v *= 1e18;
            }
        }
    }
    let dy = cotangent(&[1, 300, 2, 64], 4);
    for p in [Precision::Tf32, Precision::Bf16] {
        for (name, g) in cuda_mode(m.as_ref(), &x, &dy, p) {
            assert!(g.iter().all(|v| v.is_finite()), "{p}: {name} not finite with logits near 1e36");
        }
    }
}

/// A forward run for the backward (`run_device_saving`) gives the plain forward's `y` bit for bit
/// and the statistics with which the backward, given that `y` and `y_stats`, skips its forward and
/// gives the gradients of the backward that runs it, bit for bit: every mode (exact and tf32 on
/// f32 tensors, bf16 on bf16 tensors), windowed or not, at sizes that are no tile multiples, and
/// a second backward from the same saved tensors (the backward writes into a copy). Misuse is
/// refused: the statistics without `y`, of another length, where the tensor-core backward does not
/// run (`f64` inputs, which save nothing).
#[test]
#[ignore = "needs a CUDA device"]
fn attention_backward_from_the_saved_statistics() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    use mixer_core::grad::{SAVED_OUTPUT, SAVED_STATISTICS};
    use mixer_cuda::run_device_saving;
    // Each element's bits in its own type (bf16 exactly as f64).
    let bits = |a: &AnyDeviceTensor| -> Vec<u64> {
        match a {
            AnyDeviceTensor::F32(_) => {
                download_as::<f32>(a).unwrap().iter().map(|v| u64::from(v.to_bits())).collect()
            }
            _ => download_as::<f64>(a).unwrap().iter().map(|v| v.to_bits()).collect(),
        }
    };
    for (window, b, t, h, d) in
        [(None, 2, 131, 3, 64), (Some(50), 1, 77, 2, 128), (None, 1, 1, 1, 32), (Some(9), 2, 70, 1, 96)]
    {
        let m = attention_with(window);
        let s = Sizes { batch: b, seq: t, channels: 1, heads: h, dk: d, dv: d };
        let x64 = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 7).unwrap();
        let x32 = cast_tensors::<f32>(&x64);
        let dy = cotangent(&[b, t, h, d], 8).mapv(|v| v as f32);
        for p in [Precision::Exact, Precision::Tf32, Precision::Bf16] {
            let what = format!("{p}, window {window:?}, (B, T, H, D) = ({b}, {t}, {h}, {d})");
            let x = mixer_cuda::forms::upload_inputs(&x32, p).unwrap();
            let dyd = upload_one(&dy, p == Precision::Bf16).unwrap();
            let plain = run_device(m.as_ref(), Form::Fast, &x, p).unwrap();
            let (y, stats) = run_device_saving(m.as_ref(), &x, p, true).unwrap();
            let stats = stats.unwrap_or_else(|| panic!("{what}: nothing saved on tensor cores"));
            assert_eq!(bits(&y), bits(&plain), "{what}: y of the saving forward");
            let want = backward_device(m.as_ref(), &x, &dyd, &Requires::All, p).unwrap();
            let mut xs = x.clone();
            xs.insert(SAVED_OUTPUT.into(), y.clone());
            xs.insert(SAVED_STATISTICS.into(), stats.clone());
            for run in 0..2 {
                let got = backward_device(m.as_ref(), &xs, &dyd, &Requires::All, p).unwrap();
                assert_eq!(got.len(), 3, "{what}: {:?}", got.keys().collect::<Vec<_>>());
                for (name, g) in &want {
                    assert_eq!(
                        bits(&got[name]),
                        bits(g),
                        "{what}: {name} from the saved statistics (run {run})"
                    );
                }
            }
            // Misuse: the statistics without `y`; of another length.
            let mut no_y = x.clone();
            no_y.insert(SAVED_STATISTICS.into(), stats.clone());
            let e = backward_device(m.as_ref(), &no_y, &dyd, &Requires::All, p).unwrap_err().to_string();
            assert!(e.contains("y_stats") && e.contains("without `y`"), "{what}: {e}");
            let mut short = xs.clone();
            let short_stats =
                AnyDeviceTensor::F32(mixer_cuda::DeviceTensor::zeros(&[stats.shape()[0] - 1]).unwrap());
            short.insert(SAVED_STATISTICS.into(), short_stats);
            let e = backward_device(m.as_ref(), &short, &dyd, &Requires::All, p).unwrap_err().to_string();
            assert!(e.contains("y_stats") && e.contains("4 per row"), "{what}: {e}");
        }
    }
    // f64 inputs run the FMA kernels, which read no statistics: nothing is saved.
    let m = attention_with(None);
    let s = Sizes { batch: 1, seq: 40, channels: 1, heads: 1, dk: 16, dv: 16 };
    let x = m.random_inputs(&complete_dims(m.as_ref(), &s.dims()), 2).unwrap();
    let x = mixer_cuda::forms::upload_inputs(&x, Precision::Exact).unwrap();
    let (y, stats) = run_device_saving(m.as_ref(), &x, Precision::Exact, true).unwrap();
    assert!(stats.is_none());
    assert_eq!(bits(&y), bits(&run_device(m.as_ref(), Form::Fast, &x, Precision::Exact).unwrap()));
    // Statistics given where the tensor-core backward does not run (f64 inputs) are refused.
    let mut xs = x.clone();
    xs.insert(SAVED_OUTPUT.into(), y);
    xs.insert(
        SAVED_STATISTICS.into(),
        AnyDeviceTensor::F32(mixer_cuda::DeviceTensor::zeros(&[161]).unwrap()),
    );
    let dy = upload_one(&cotangent(&[1, 40, 1, 16], 3), false).unwrap();
    let e = backward_device(m.as_ref(), &xs, &dy, &Requires::All, Precision::Exact).unwrap_err().to_string();
    assert!(e.contains("y_stats") && e.contains("does not run"), "{e}");
}

/// Times the attention forward and the backward in the tf32 mode (f32 tensors) and the bf16 mode
/// (bf16 tensors) on the device (CUDA events, the median of 5 runs after a warm-up), causal, one
/// `TIMING` line per shape and mode: (B, T, H, D) = (1, 16384, 16, 64), (8, 4096, 16, 64),
/// (8, 4096, 16, 128). `bench/gpu/attn_backward_vs_sdpa.py` runs it beside torch SDPA.
#[test]
#[ignore = "needs a CUDA device; a measurement"]
fn attention_backward_timing_modes() {
    let Some(_turn) = common::gpu_alone() else {
        return;
    };
    use mixer_cuda::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};
    let m = mixer("attention", &serde_json::json!({})).unwrap();
    let a = mixer_core::mixers::attention::Attention::from_json("attention", &serde_json::json!({})).unwrap();
    for (b, t, h, d) in [(1, 16384, 16, 64), (8, 4096, 16, 64), (8, 4096, 16, 128)] {
        for p in [Precision::Tf32, Precision::Bf16] {
            let dev = |seed: u64| -> AnyDeviceTensor {
                let host = cotangent(&[b, t, h, d], seed).mapv(|v| v as f32);
                if p == Precision::Bf16 {
                    AnyDeviceTensor::Bf16(DeviceTensor::upload(&host.mapv(bf16::from_f32)).unwrap())
                } else {
                    AnyDeviceTensor::F32(DeviceTensor::upload(&host).unwrap())
                }
            };
            let x: DeviceTensors =
                [("q", 1), ("k", 2), ("v", 3)].into_iter().map(|(n, s)| (n.to_string(), dev(s))).collect();
            let dy = dev(4);
            let fwd = median_ms(&mut || {
                drop(mixer_cuda::device_run::run_device_with(m.as_ref(), Form::Fast, &x, p, false).unwrap())
            });
            let bwd = median_ms(&mut || {
                drop(mixer_cuda::attention::backward::run::<f32>(&a, &x, &dy, &Requires::All, p).unwrap())
            });
            // The training step's pair: the forward run for the backward, then the backward from
            // what it saved (`y` and the statistics).
            let mut saved_bwd = Vec::new();
            let pair = median_ms(&mut || {
                let (y, stats) = mixer_cuda::run_device_saving(m.as_ref(), &x, p, false).unwrap();
                let mut xs = x.clone();
                xs.insert(mixer_core::grad::SAVED_OUTPUT.into(), y);
                xs.insert(mixer_core::grad::SAVED_STATISTICS.into(), stats.unwrap());
                saved_bwd.push(xs);
            });
            let xs = saved_bwd.pop().unwrap();
            let bwd_saved = median_ms(&mut || {
                drop(mixer_cuda::attention::backward::run::<f32>(&a, &xs, &dy, &Requires::All, p).unwrap())
            });
            println!(
                "TIMING attention {} B={b} T={t} H={h} D={d} ms: fwd={fwd:.3} bwd={bwd:.3} fwd+bwd={:.3} bwd/fwd={:.2} \
                 saving fwd={pair:.3} bwd from saved={bwd_saved:.3} fwd+bwd={:.3} bwd/fwd={:.2}",
                p.name(),
                fwd + bwd,
                bwd / fwd,
                pair + bwd_saved,
                bwd_saved / fwd
            );
        }
    }
}
