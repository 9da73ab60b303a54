//! Device tensors: every registered mixer × form on device tensors agrees bit for bit with the
//! host-array path; batch views; steady-state calls allocate nothing; a 1,000-token decode
//! loop never waits for the stream; invalid values are reported when the result is read; the
//! precision modes meet their tolerances.

use mixer_core::mixer::{complete_dims, fit_dims};
use mixer_core::tensor::cast_tensors;
use mixer_core::{AnyTensors, Error, Form, Precision, Tensor, Tensors};
use mixer_cuda::forms::upload_inputs;
use mixer_cuda::{AnyDeviceTensor, DeviceTensor, DeviceTensors, decoder_device, pool, run_device};
use mixer_registry::run::{bf16_activations, forms, oracle, run, run_with};
use mixer_registry::suite::registered_configs;
use mixer_registry::{Sizes, mixer};
use ndarray::{ArrayD, Axis};

use super::common::{cuda, gpu, gpu_alone};

fn host(y: &AnyDeviceTensor) -> Tensor {
    match y {
        AnyDeviceTensor::F32(t) => Tensor::F32(t.to_host().unwrap()),
        AnyDeviceTensor::F64(t) => Tensor::F64(t.to_host().unwrap()),
        AnyDeviceTensor::Bf16(t) => Tensor::F32(t.to_host().unwrap().mapv(|b| b.to_f32())),
    }
}

fn device_inputs(x: &AnyTensors) -> DeviceTensors {
    match x {
        AnyTensors::F32(t) => upload_inputs(t, Precision::Exact).unwrap(),
        AnyTensors::F64(t) => upload_inputs(t, Precision::Exact).unwrap(),
    }
}

fn sizes() -> Sizes {
    Sizes { batch: 3, seq: 45, channels: 6, heads: 2, dk: 5, dv: 3 }
}

#[test]
#[ignore = "needs a CUDA device"]
fn every_form_on_device_tensors_equals_the_host_path_bit_for_bit() {
    let Some(_turn) = gpu() else {
        return;
    };
    let backend = cuda();
    let mut n = 0;
    for (name, cfg) in registered_configs() {
        let m = mixer(name, &cfg).unwrap();
        let dims = complete_dims(m.as_ref(), &sizes().dims());
        let x64 = m.random_inputs(&dims, 7).unwrap();
        for form in forms(m.as_ref(), &backend) {
            if !matches!(form, Form::Parallel | Form::Fast) {
                continue;
            }
            for x in [AnyTensors::F64(x64.clone()), AnyTensors::F32(cast_tensors::<f32>(&x64))] {
                let want = run(m.as_ref(), &backend, form, &x).unwrap();
                let dev = device_inputs(&x);
                let got = host(&run_device(m.as_ref(), form, &dev, Precision::Exact).unwrap());
                assert_eq!(got, want, "{name} {cfg} {form} {:?}", x.dtype());
                // A zero-copy view of batch entries 1..3 gives the same rows.
                let view: DeviceTensors = dev
                    .iter()
                    .map(|(k, v)| {
                        let per_batch = m.spec().inputs.iter().any(|d| {
                            d.name == k
                                && d.shape.first().is_some_and(|s| matches!(s, mixer_core::Dim::Sym("B")))
                        });
                        (k.clone(), if per_batch { v.batch(1..3).unwrap() } else { v.clone() })
                    })
                    .collect();
                let part = host(&run_device(m.as_ref(), form, &view, Precision::Exact).unwrap());
                let rows = |t: &Tensor| t.to_f64().slice_axis(Axis(0), (1..3).into()).to_owned();
                assert_eq!(part.to_f64(), rows(&want), "{name} {cfg} {form}: batch view");
                n += 1;
            }
        }
    }
    assert!(n >= 20, "only {n} mixer × form × dtype cases ran");
    println!("DEVICE bit-for-bit: {n} cases");
}

/// A buffer of most of the free device memory, dropped, stays cached in the pool; a buffer of
/// another size that fits only without it is still allocated: the pool gives its cache back to
/// the driver when the driver runs out, and tries again.
#[test]
#[ignore = "needs a CUDA device"]
fn the_pool_gives_its_cache_back_when_the_device_runs_out() {
    let Some(_turn) = gpu_alone() else { return };
    let g = mixer_cuda::runtime::gpu().unwrap();
    g.stream().synchronize().unwrap();
    pool::release_cached();
    let (free, _) = g.ctx.mem_get_info().unwrap();
    let n = free / 10 * 6 / 4;
    drop(pool::take::<f32>("test", n).unwrap());
    assert!(pool::stats().cached_bytes >= n * 4, "the dropped buffer is cached");
    let b = pool::take::<f32>("test", n / 4 * 5);
    assert!(b.is_ok(), "0.75 of the free memory after 0.6 of it was cached: {:?}", b.err());
    drop(b);
    pool::release_cached();
}

#[test]
#[ignore = "needs a CUDA device"]
fn steady_state_calls_allocate_no_device_memory() {
    let Some(_alone) = gpu_alone() else {
        return;
    };
    for (name, cfg) in [
        ("attention", "{}"),
        ("glr", r#"{"pattern":"pow2"}"#),
        ("mamba2", r#"{"chunk":16}"#),
        ("loglinear-gated-deltanet", r#"{"chunk":16}"#),
        ("toeplitz", r#"{"heads":2}"#),
    ] {
        let m = mixer(name, &serde_json::from_str(cfg).unwrap()).unwrap();
        let dims = complete_dims(m.as_ref(), &Sizes { seq: 300, ..sizes() }.dims());
        let x = AnyTensors::F32(cast_tensors::<f32>(&m.random_inputs(&dims, 3).unwrap()));
        let dev = device_inputs(&x);
        let form = Form::Fast;
        // Warm-up: compiles the kernels, fills the pool and the plan caches.
        host(&run_device(m.as_ref(), form, &dev, Precision::Exact).unwrap());
        // The test runs alone (no other device test takes the shared pool's buffers meanwhile);
        // steady state still means some window of 3 calls allocates nothing, so that a bucket
        // the first calls leave short is not counted; a form that allocates on every call fails
        // all 5 windows.
        let mut windows = Vec::new();
        for _ in 0..5 {
            let before = pool::thread_driver_allocs();
            for _ in 0..3 {
                let y = run_device(m.as_ref(), form, &dev, Precision::Exact).unwrap();
                host(&y);
            }
            windows.push(pool::thread_driver_allocs() - before);
            if windows.last() == Some(&0) {
                break;
            }
        }
        assert_eq!(
            windows.last(),
            Some(&0),
            "{name} {form}: new device allocations per window of 3 calls: {windows:?}"
        );
    }
}

/// The per-token device inputs of position `t` (sequence axis removed).
fn token(x: &Tensors<f32>, per_token: &[String], t: usize) -> DeviceTensors {
    x.iter()
        .filter(|(k, _)| per_token.contains(k))
        .map(|(k, v)| {
            (
                k.clone(),
                AnyDeviceTensor::F32(DeviceTensor::upload(&v.index_axis(Axis(1), t).to_owned()).unwrap()),
            )
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_decode_loop_of_1000_tokens_never_waits_for_the_stream() {
    let Some(_turn) = gpu() else {
        return;
    };
    let backend = cuda();
    for (name, cfg) in [
        ("attention", "{}"),
        ("glr", r#"{"pattern":"pow2","cache_efficient":true}"#),
        ("loglinear-mamba2", "{}"),
        ("gated-deltanet", "{}"),
        ("toeplitz", r#"{"heads":2,"decoder":"naive"}"#),
    ] {
        let m = mixer(name, &serde_json::from_str(cfg).unwrap()).unwrap();
        let t_len = 1000;
        let dims = fit_dims(
            m.as_ref(),
            &complete_dims(m.as_ref(), &Sizes { batch: 1, seq: t_len, ..sizes() }.dims()),
        );
        let x = cast_tensors::<f32>(&m.random_inputs(&dims, 5).unwrap());
        let per_token = m.spec().per_token();
        let statics: Tensors<f32> =
            x.iter().filter(|(k, _)| !per_token.contains(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
        // Every token's inputs are on the device before the loop.
        let tokens: Vec<DeviceTensors> = (0..t_len).map(|t| token(&x, &per_token, t)).collect();
        let mut dec = decoder_device(m.as_ref(), &AnyTensors::F32(statics), &dims).unwrap();
        let syncs = mixer_cuda::runtime::host_syncs();
        let ys: Vec<AnyDeviceTensor> = tokens.iter().map(|tok| dec.step(tok).unwrap()).collect();
        assert_eq!(mixer_cuda::runtime::host_syncs(), syncs, "{name}: the decode loop waited for the stream");
        // Reading the outputs afterwards gives the recurrent form of the host path, bit for bit.
        let want = match run(m.as_ref(), &backend, Form::Recurrent, &AnyTensors::F32(x.clone())).unwrap() {
            Tensor::F32(y) => y,
            Tensor::F64(_) => unreachable!(),
        };
        for (t, y) in ys.iter().enumerate() {
            let Tensor::F32(got) = host(y) else { unreachable!() };
            assert_eq!(got, want.index_axis(Axis(1), t).to_owned(), "{name}: token {t}");
        }
        println!("DECODE {name}: 1000 steps, 0 host synchronisations");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn invalid_values_are_reported_when_the_result_is_read() {
    let Some(_turn) = gpu() else {
        return;
    };
    let m = mixer("mamba2", &serde_json::json!({})).unwrap();
    let dims = complete_dims(m.as_ref(), &sizes().dims());
    let mut x = cast_tensors::<f32>(&m.random_inputs(&dims, 1).unwrap());
    x.get_mut("g").unwrap()[[1, 4, 0]] = 0.5; // a log-decay must be ≤ 0
    let dev = upload_inputs(&x, Precision::Exact).unwrap();
    let y = run_device(m.as_ref(), Form::Fast, &dev, Precision::Exact).unwrap();
    let AnyDeviceTensor::F32(y) = y else { panic!("f32 expected") };
    match y.to_host() {
        Err(Error::Value { name, .. }) => assert_eq!(name, "g"),
        other => panic!("expected a value error on g, got {other:?}"),
    }
    // Wrong dtype mixes are refused before anything runs.
    let mut mixed = dev.clone();
    mixed.insert("v".into(), AnyDeviceTensor::F64(DeviceTensor::<f64>::zeros(dev["v"].shape()).unwrap()));
    assert!(run_device(m.as_ref(), Form::Fast, &mixed, Precision::Exact).is_err());
}

/// The device value check reads 16 bytes at a time over the first `n − n mod W` elements and one
/// at a time after them: the first violation is the one reported wherever the two fall (`g` of
/// mamba2 here has 3·45·2 = 270 entries: the last two are past the vector part in f32 and bf16's
/// f32 `g`, none in f64).
#[test]
#[ignore = "needs a CUDA device"]
fn value_checks_report_the_first_violation_in_the_vector_part_and_the_tail() {
    let Some(_turn) = gpu() else {
        return;
    };
    let m = mixer("mamba2", &serde_json::json!({})).unwrap();
    let dims = complete_dims(m.as_ref(), &sizes().dims());
    let base = m.random_inputs(&dims, 3).unwrap();
    let cases: [(&[usize], usize); 4] =
        [(&[269], 269), (&[269, 101], 101), (&[103, 102], 102), (&[0, 268], 0)];
    for (bad, first) in cases {
        for double in [false, true] {
            let expect = format!("flat index {first} ");
            let found = if double {
                let mut x = cast_tensors::<f64>(&base);
                let g = x.get_mut("g").unwrap();
                for &i in bad {
                    g.as_slice_mut().unwrap()[i] = f64::NAN;
                }
                let dev = upload_inputs(&x, Precision::Exact).unwrap();
                let AnyDeviceTensor::F64(y) =
                    run_device(m.as_ref(), Form::Fast, &dev, Precision::Exact).unwrap()
                else {
                    panic!("f64 expected")
                };
                y.to_host().err()
            } else {
                let mut x = cast_tensors::<f32>(&base);
                let g = x.get_mut("g").unwrap();
                for &i in bad {
                    g.as_slice_mut().unwrap()[i] = 0.25; // a log-decay must be ≤ 0
                }
                let dev = upload_inputs(&x, Precision::Exact).unwrap();
                let AnyDeviceTensor::F32(y) =
                    run_device(m.as_ref(), Form::Fast, &dev, Precision::Exact).unwrap()
                else {
                    panic!("f32 expected")
                };
                y.to_host().err()
            };
            match found {
                Some(Error::Value { name, found, .. }) => {
                    assert_eq!(name, "g");
                    assert!(found.contains(&expect), "violations at {bad:?} (f64 {double}): {found}");
                }
                other => {
                    panic!("expected a value error on g (violations at {bad:?}, f64 {double}), got {other:?}")
                }
            }
        }
    }
}

/// The device's bf16 ⇄ f32 conversions (four elements per access where the pointers allow, one at
/// a time otherwise and past the last multiple of 4) equal the host's rounding (`half`: nearest,
/// ties to even) bit for bit, at every length and at an unaligned start (a batch view).
#[test]
#[ignore = "needs a CUDA device"]
fn bf16_conversions_equal_the_host_rounding_at_any_length_and_offset() {
    use mixer_cuda::forms::{bf16_to_f32, f32_to_bf16};
    use mixer_cuda::tensor::bf16;
    let Some(_turn) = gpu() else {
        return;
    };
    for len in [1usize, 7, 8, 9, 1003] {
        // Ties (1 + 2^-8 and its odd neighbour), signs, a huge, a tiny and a subnormal value.
        let special = [1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5e38, 1.2e-38, 3.0e-42, -0.0, 65504.0];
        let host = ArrayD::from_shape_fn(vec![3, len], |ix| {
            let i = ix[0] * len + ix[1];
            if i % 5 == 0 {
                special[(i / 5) % special.len()]
            } else {
                ((i as f32) * 0.731).sin() * 10f32.powi((i % 9) as i32 - 4)
            }
        });
        let dev = DeviceTensor::<f32>::upload(&host).unwrap();
        for (rows, view) in [(0..3, dev.clone()), (1..3, dev.batch(1..3).unwrap())] {
            let want = host.slice(ndarray::s![rows.clone(), ..]).to_owned().into_dyn();
            let b = f32_to_bf16(&view).unwrap();
            let got = b.to_host().unwrap();
            for (g, w) in got.iter().zip(want.iter()) {
                assert_eq!(g.to_bits(), bf16::from_f32(*w).to_bits(), "len {len}, rows {rows:?}, value {w}");
            }
            // Back to f32 from an unaligned start too: exact.
            for bv in [b.clone(), b.batch(1..rows.len()).unwrap()] {
                let back = bf16_to_f32(&bv).unwrap().to_host().unwrap();
                let src = bv.to_host().unwrap();
                for (f, h) in back.iter().zip(src.iter()) {
                    assert_eq!(f.to_bits(), h.to_f32().to_bits(), "len {len}");
                }
            }
        }
    }
}

/// Relative RMS error of `got` against `want`.
fn rel_rms(got: &ArrayD<f64>, want: &ArrayD<f64>) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    (num / den.max(1e-300)).sqrt()
}

#[test]
#[ignore = "needs a CUDA device"]
fn precision_modes_meet_their_tolerances_on_tensor_cores() {
    let Some(_turn) = gpu() else {
        return;
    };
    let backend = cuda();
    for (cfg, d, t) in [("{}", 64, 1000), (r#"{"window":100}"#, 64, 777), ("{}", 32, 300), ("{}", 48, 515)] {
        let m = mixer("attention", &serde_json::from_str(cfg).unwrap()).unwrap();
        let dims = complete_dims(
            m.as_ref(),
            &Sizes { batch: 2, seq: t, channels: 6, heads: 3, dk: d, dv: d }.dims(),
        );
        let x64 = m.random_inputs(&dims, 11).unwrap();
        for p in [Precision::Tf32, Precision::Bf16] {
            let x =
                if p == Precision::Bf16 { mixer_registry::run::bf16_activations(&x64) } else { x64.clone() };
            let want = oracle(m.as_ref(), &x).unwrap();
            let y = run_with(m.as_ref(), &backend, Form::Fast, &AnyTensors::F32(cast_tensors::<f32>(&x)), p)
                .unwrap();
            let err = rel_rms(&y.to_f64(), &want);
            let exact =
                run(m.as_ref(), &backend, Form::Fast, &AnyTensors::F32(cast_tensors::<f32>(&x))).unwrap();
            let err_exact = rel_rms(&exact.to_f64(), &want);
            println!(
                "PRECISION attention {cfg} D={d} T={t} {p}: rel RMS {err:.2e} (exact f32: {err_exact:.2e})"
            );
            assert!(err <= p.tolerance("f32").rel_rms, "{cfg} D={d} {p}: {err:.3e}");
            if mixer_cuda::attention::fused::applies(d, d) {
                // The exact mode ran the split-tf32 kernel: f32 accuracy, far below tf32's error.
                assert!(err_exact <= 1e-5, "{cfg} D={d} exact (split tf32): {err_exact:.3e}");
                // The tensor-core path ran: its error is visibly above the exact kernel's.
                assert!(err > 2.0 * err_exact, "{cfg} D={d} {p}: {err:.3e} vs exact {err_exact:.3e}");
            } else if p == Precision::Tf32 {
                // Other sizes run the exact kernel (tf32 permits tensor cores, it does not require them).
                assert_eq!(y, exact, "{cfg} D={d} {p}");
            }
        }
        // The bf16 device path stores y as bf16.
        let dev = upload_inputs(&cast_tensors::<f32>(&x64), Precision::Bf16).unwrap();
        let y = run_device(m.as_ref(), Form::Fast, &dev, Precision::Bf16).unwrap();
        assert_eq!(y.dtype(), "bf16");
    }
}

/// Both bf16 attention kernels (`mma.sync`, and Hopper's `wgmma` where the device has it) within
/// the bf16 tolerance of the f64 oracle and close to each other, causal and windowed, at T that is
/// not a tile multiple, at D = 64 and 128 (both kernels) and 256 (`wgmma` only: `mma.sync` has no
/// plan there); the default picks `wgmma` on compute capability 9.0.
#[test]
#[ignore = "needs a CUDA device"]
fn both_bf16_attention_kernels_agree_with_the_oracle() {
    use mixer_cuda::attention::fused::{Bf16Kernel, run_with as run_kernel};
    let Some(_turn) = gpu() else {
        return;
    };
    let wgmma = mixer_cuda::runtime::gpu().unwrap().has_wgmma();
    assert_eq!(
        Bf16Kernel::for_device().unwrap(),
        if wgmma { Bf16Kernel::Wgmma } else { Bf16Kernel::MmaSync }
    );
    let cases = [
        ("{}", 1000, 64),
        (r#"{"window":100}"#, 777, 64),
        ("{}", 129, 64),
        (r#"{"window":1}"#, 200, 64),
        ("{}", 1000, 128),
        (r#"{"window":100}"#, 333, 128),
        ("{}", 65, 128),
        ("{}", 515, 256),
        (r#"{"window":70}"#, 200, 256),
        ("{}", 1, 256),
    ];
    for (cfg, t, d) in cases {
        let m = mixer("attention", &serde_json::from_str(cfg).unwrap()).unwrap();
        let dims = complete_dims(
            m.as_ref(),
            &Sizes { batch: 2, seq: t, channels: 6, heads: 3, dk: d, dv: d }.dims(),
        );
        let x = mixer_registry::run::bf16_activations(&m.random_inputs(&dims, 5).unwrap());
        let want = oracle(m.as_ref(), &x).unwrap();
        let a = m.as_any().downcast_ref::<mixer_core::mixers::attention::Attention>().unwrap();
        let dev = upload_inputs(&cast_tensors::<f32>(&x), Precision::Bf16).unwrap();
        let mut outs = Vec::new();
        for k in [Bf16Kernel::MmaSync, Bf16Kernel::Wgmma] {
            if k == Bf16Kernel::Wgmma && !wgmma {
                assert!(
                    run_kernel(a, &dev, Precision::Bf16, k).is_err(),
                    "wgmma must be refused below sm_90"
                );
                continue;
            }
            let Some(y) = run_kernel(a, &dev, Precision::Bf16, k).unwrap() else {
                assert!(k == Bf16Kernel::MmaSync && d == 256, "{cfg} T={t} D={d} {k:?}: no tensor-core plan");
                continue;
            };
            let y = host(&y).to_f64();
            let err = rel_rms(&y, &want);
            println!("BF16 attention {cfg} T={t} D={d} {k:?}: rel RMS {err:.2e}");
            assert!(err <= Precision::Bf16.tolerance("f32").rel_rms, "{cfg} T={t} D={d} {k:?}: {err:.3e}");
            outs.push(y);
        }
        if let [a, b] = &outs[..] {
            // Both round P to bf16 and accumulate in f32; they differ in accumulation order only.
            let diff = rel_rms(a, b);
            assert!(diff < 4e-3, "{cfg} T={t} D={d}: mma.sync vs wgmma rel RMS {diff:.3e}");
        }
    }
}

/// The log-linear members whose chunked form has a tensor-core path (tf32 mma in the tf32 and bf16
/// modes): within each mode's tolerance of the f64 oracle, and visibly less exact than the exact
/// f32 kernel (so the tensor cores ran), at T and D that are not tile multiples.
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_precision_modes_meet_their_tolerances() {
    let Some(_turn) = gpu() else {
        return;
    };
    let backend = cuda();
    for (name, d, t) in [
        ("mamba2", 64, 1000),
        ("linear-attention", 70, 333),
        ("loglinear-mamba2", 64, 777),
        ("loglinear-attention", 48, 1000),
        ("gated-deltanet", 64, 515),
        // 64 < Dk ≤ 128: the output kernel's tiles of 128 key columns.
        ("mamba2", 128, 1000),
        ("linear-attention", 100, 333),
        ("gated-deltanet", 128, 515),
        // The lift at Dk = 128 past T = 2048: the level-state pass with one buffer.
        ("loglinear-gated-deltanet", 128, 2500),
    ] {
        let m = mixer(name, &serde_json::json!({})).unwrap();
        let dims = complete_dims(
            m.as_ref(),
            &Sizes { batch: 2, seq: t, channels: 1, heads: 3, dk: d, dv: d }.dims(),
        );
        let x64 = m.random_inputs(&dims, 13).unwrap();
        let want = oracle(m.as_ref(), &x64).unwrap();
        let x32 = AnyTensors::F32(cast_tensors::<f32>(&x64));
        let exact = run(m.as_ref(), &backend, Form::Fast, &x32).unwrap();
        let err_exact = rel_rms(&exact.to_f64(), &want);
        let y = run_with(m.as_ref(), &backend, Form::Fast, &x32, Precision::Tf32).unwrap();
        let err = rel_rms(&y.to_f64(), &want);
        println!("PRECISION {name} D={d} T={t} tf32: rel RMS {err:.2e} (exact f32: {err_exact:.2e})");
        assert!(err <= Precision::Tf32.tolerance("f32").rel_rms, "{name}: {err:.3e}");
        assert!(err > 2.0 * err_exact, "{name}: tf32 {err:.3e} vs exact {err_exact:.3e}");
    }
}

/// The lifted gated DeltaNet at `Dk = 128` past T = 16384, where the FMA level pass no longer fits
/// in shared memory: the exact mode runs the one-block-per-head form, the tf32 mode (and the bf16
/// mode, by the same rule) the tensor-core level pass with one buffer (levels four at a time at
/// T = 20000, one at a time at 40000). tf32 within its tolerance of the exact run, and not equal
/// to it (another path ran).
#[test]
#[ignore = "needs a CUDA device"]
fn lifted_gated_deltanet_at_dk_128_past_16384_tokens_runs_on_tensor_cores() {
    let Some(_turn) = gpu() else {
        return;
    };
    let backend = cuda();
    let m = mixer("loglinear-gated-deltanet", &serde_json::json!({})).unwrap();
    for t in [20000, 40000] {
        let sizes = Sizes { batch: 1, seq: t, channels: 1, heads: 1, dk: 128, dv: 128 };
        let x64 = m.random_inputs(&complete_dims(m.as_ref(), &sizes.dims()), 29).unwrap();
        let x32 = AnyTensors::F32(cast_tensors::<f32>(&x64));
        let exact = run(m.as_ref(), &backend, Form::Fast, &x32).unwrap().to_f64();
        let tf32 = run_with(m.as_ref(), &backend, Form::Fast, &x32, Precision::Tf32).unwrap().to_f64();
        let err = rel_rms(&tf32, &exact);
        println!("LIFT D=128 T={t}: tf32 against exact rel RMS {err:.2e}");
        assert!(err <= Precision::Tf32.tolerance("f32").rel_rms, "T = {t}: {err:.3e}");
        assert!(err > 1e-6, "T = {t}: tf32 {err:.3e} from the exact run: the same kernels ran");
    }
}

/// Gated DeltaNet's sequential pass with the state in registers (the host takes it from about 34
/// batch·heads of 64 value columns on the H200) at head dims 20 (two warps per block), 64, 70 and
/// 128 (four warps; two buffers at 128), and the shared-memory pass at B·H = 6, at T that is not a
/// chunk multiple: tf32 within its tolerance of the f64 oracle and visibly less exact than the
/// exact f32 kernel (so the tensor cores ran).
#[test]
#[ignore = "needs a CUDA device"]
fn gated_deltanet_register_pass_at_every_block_shape() {
    let Some(_turn) = gpu() else {
        return;
    };
    let backend = cuda();
    let m = mixer("gated-deltanet", &serde_json::json!({})).unwrap();
    for (batch, heads, d, t) in [
        (2, 3, 64, 515),
        (3, 30, 64, 200),
        (4, 48, 64, 130),
        (2, 40, 70, 333),
        (1, 40, 128, 150),
        (3, 30, 20, 200),
    ] {
        let dims =
            complete_dims(m.as_ref(), &Sizes { batch, seq: t, channels: 1, heads, dk: d, dv: d }.dims());
        let x64 = m.random_inputs(&dims, 17).unwrap();
        let want = oracle(m.as_ref(), &x64).unwrap();
        let x32 = AnyTensors::F32(cast_tensors::<f32>(&x64));
        let err_exact = rel_rms(&run(m.as_ref(), &backend, Form::Fast, &x32).unwrap().to_f64(), &want);
        let err = rel_rms(
            &run_with(m.as_ref(), &backend, Form::Fast, &x32, Precision::Tf32).unwrap().to_f64(),
            &want,
        );
        println!(
            "PRECISION gated-deltanet B={batch} H={heads} D={d} T={t} tf32: rel RMS {err:.2e} (exact f32: {err_exact:.2e})"
        );
        assert!(err <= Precision::Tf32.tolerance("f32").rel_rms, "B={batch} H={heads} D={d}: {err:.3e}");
        assert!(err > 2.0 * err_exact, "B={batch} H={heads} D={d}: tf32 {err:.3e} vs exact {err_exact:.3e}");
    }
}

/// `m`'s fast form on `x` (activations bf16-valued) in the bf16 mode, and how many of its entries
/// differ in their bits from the tf32 mode's output on the same values rounded to bf16.
fn bf16_and_tf32(m: &dyn mixer_core::Mixer, x: &Tensors<f32>) -> (ArrayD<mixer_cuda::tensor::bf16>, usize) {
    use mixer_cuda::tensor::bf16;
    let run_in = |p: Precision| run_device(m, Form::Fast, &upload_inputs(x, p).unwrap(), p).unwrap();
    let (AnyDeviceTensor::Bf16(yb), AnyDeviceTensor::F32(yt)) =
        (run_in(Precision::Bf16), run_in(Precision::Tf32))
    else {
        panic!("{}: a bf16 and an f32 result expected", m.name())
    };
    let (yb, yt) = (yb.to_host().unwrap(), yt.to_host().unwrap());
    assert_eq!(yb.shape(), yt.shape());
    let differ =
        yb.iter().zip(yt.iter()).filter(|(b, f)| b.to_bits() != bf16::from_f32(**f).to_bits()).count();
    (yb, differ)
}

/// Where the bf16 mode has no bf16 kernels it converts the activations and runs the f32 kernels,
/// so it equals the tf32 mode on the same values with its output rounded to bf16, bit for bit
/// (bf16 values are exact in tf32): Mamba-2 and linear attention with `Dk > 128`, gated DeltaNet
/// with head dims that are not multiples of 8 (its sequential pass then takes k's bits without
/// rounding them). With `Dk ≤ 128` (and, for gated DeltaNet, multiples of 8) the mode runs on bf16
/// operands instead (`bf16_operands_…` below).
#[test]
#[ignore = "needs a CUDA device"]
fn loglinear_bf16_mode_equals_tf32_on_the_same_values_where_it_converts() {
    let Some(_turn) = gpu() else {
        return;
    };
    for (name, d, t) in [
        ("mamba2", 130, 129),
        ("linear-attention", 136, 200),
        ("gated-deltanet", 70, 129),
        ("gated-deltanet", 20, 300),
    ] {
        let m = mixer(name, &serde_json::json!({})).unwrap();
        let dims = complete_dims(
            m.as_ref(),
            &Sizes { batch: 2, seq: t, channels: 1, heads: 3, dk: d, dv: d }.dims(),
        );
        let x = bf16_activations(&cast_tensors::<f32>(&m.random_inputs(&dims, 5).unwrap()));
        let (yb, differ) = bf16_and_tf32(m.as_ref(), &x);
        assert_eq!(differ, 0, "{name} Dk = {d}, T = {t}: {differ} of {} entries differ", yb.len());
    }
}

/// `m`'s bf16 mode on bf16 operands at each (batch, heads, Dk, Dv, T) of `shapes`: within 10⁻²
/// relative RMS of the f64 oracle on the same bf16 values (the mode's tolerance is 2·10⁻²), and
/// not bit-equal to the tf32 mode's output rounded to bf16 (so the bf16 kernels ran, not the
/// converted f32 path).
fn bf16_operands_within_tolerance(name: &str, shapes: &[(usize, usize, usize, usize, usize)]) {
    let m = mixer(name, &serde_json::json!({})).unwrap();
    for &(batch, heads, dk, dv, t) in shapes {
        let dims = complete_dims(m.as_ref(), &Sizes { batch, seq: t, channels: 1, heads, dk, dv }.dims());
        let x = bf16_activations(&cast_tensors::<f32>(&m.random_inputs(&dims, 23).unwrap()));
        let x64: Tensors<f64> = x.iter().map(|(k, v)| (k.clone(), v.mapv(f64::from))).collect();
        let want = oracle(m.as_ref(), &x64).unwrap();
        let (yb, differ) = bf16_and_tf32(m.as_ref(), &x);
        let err = rel_rms(&yb.mapv(|v| f64::from(v.to_f32())), &want);
        println!(
            "PRECISION {name} bf16 B={batch} H={heads} Dk={dk} Dv={dv} T={t}: rel RMS {err:.2e}, \
             {differ} of {} entries differ from tf32",
            yb.len()
        );
        assert!(err <= 1e-2, "{name} Dk = {dk}, Dv = {dv}, T = {t}: {err:.3e}");
        assert!(differ > 0, "{name} Dk = {dk}, Dv = {dv}, T = {t}: bit-equal to the tf32 path");
    }
}

/// Mamba-2 and linear attention in the bf16 mode with `Dk ≤ 128` (the states on tensor cores, the
/// bf16 output kernel: bf16 mma on Q, K, V, the state and the scores rounded to bf16) at key dims
/// 5 to 128 (one 16-key step, a partial one at 5 and 70, the 128-column tiles from 70 on), value
/// dims that leave a value tile partly filled (40, 72, 100), T from one token to several chunks,
/// none a multiple of 64 but one.
#[test]
#[ignore = "needs a CUDA device"]
fn scalar_decay_bf16_operands_within_tolerance_at_every_shape() {
    let Some(_turn) = gpu() else {
        return;
    };
    bf16_operands_within_tolerance(
        "mamba2",
        &[
            (2, 3, 64, 64, 1000),
            (1, 2, 5, 5, 130),
            (2, 3, 70, 70, 129),
            (2, 3, 128, 128, 700),
            (1, 2, 96, 40, 200),
            (1, 2, 64, 72, 3),
        ],
    );
    bf16_operands_within_tolerance(
        "linear-attention",
        &[(2, 3, 16, 16, 333), (2, 3, 100, 100, 333), (1, 4, 128, 64, 128)],
    );
}

/// Gated DeltaNet's bf16 mode on bf16 operands (`Dk ≤ 128`, head dims multiples of 8: the WY
/// kernel, the sequential pass with the state in registers and bf16 mma, the bf16 output kernel)
/// at key dims 8 to 128 (one to eight 16-key steps, odd counts at 40 and 72, the output kernel's
/// 128-column tiles from 72 on), value dims that leave a block's last warp partly or wholly past
/// `Dv` (24, 72), one and two warps per block (as the host picks them) and T that is not a chunk
/// multiple.
#[test]
#[ignore = "needs a CUDA device"]
fn gated_deltanet_bf16_operands_within_tolerance_at_every_shape() {
    let Some(_turn) = gpu() else {
        return;
    };
    bf16_operands_within_tolerance(
        "gated-deltanet",
        &[
            (2, 3, 64, 64, 515),
            (1, 5, 40, 24, 200),
            (3, 2, 8, 16, 65),
            (1, 1, 64, 64, 1),
            (2, 4, 16, 72, 130),
            // Dk above 64: the output kernel's tiles of 128 key columns.
            (2, 3, 128, 128, 515),
            (1, 2, 96, 40, 200),
            (1, 3, 72, 64, 130),
        ],
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn toeplitz_kernel_spectra_are_cached_per_device_tensor_and_never_stale() {
    let Some(_turn) = gpu() else {
        return;
    };
    let backend = cuda();
    let m = mixer("toeplitz", &serde_json::json!({"heads": 2})).unwrap();
    let dims = complete_dims(m.as_ref(), &Sizes { seq: 333, ..sizes() }.dims());
    let y_of = |seed: u64| {
        let x = cast_tensors::<f32>(&m.random_inputs(&dims, seed).unwrap());
        let want = run(m.as_ref(), &backend, Form::Fast, &AnyTensors::F32(x.clone())).unwrap();
        (upload_inputs(&x, Precision::Exact).unwrap(), want)
    };
    let (dev, want) = y_of(1);
    let first = host(&run_device(m.as_ref(), Form::Fast, &dev, Precision::Exact).unwrap());
    assert_eq!(first, want);
    // The same kernel tensor again: its spectra come from the cache, with the same bits. (Tests
    // running beside this one share the cache of 8 entries and may evict ours in between, so
    // a hit is asked of one of three calls.)
    let hits = mixer_cuda::toeplitz::spectra::thread_hits();
    for _ in 0..3 {
        let again = host(&run_device(m.as_ref(), Form::Fast, &dev, Precision::Exact).unwrap());
        assert_eq!(again, want);
    }
    assert!(
        mixer_cuda::toeplitz::spectra::thread_hits() > hits,
        "no cache hit in three calls with the same w"
    );
    // New kernels of the same shape (the old tensor dropped, its buffer back in the pool):
    // never the old spectra.
    drop(dev);
    for seed in 2..5 {
        let (dev, want) = y_of(seed);
        assert_eq!(
            host(&run_device(m.as_ref(), Form::Fast, &dev, Precision::Exact).unwrap()),
            want,
            "seed {seed}"
        );
    }
}

/// A view of `t`'s memory as a caller's memory (what the Python package makes of a PyTorch
/// tensor): [`DeviceTensor::borrowed`] over its address, owning a handle on `t`.
fn lent(t: &AnyDeviceTensor, stream: &cudarc::driver::CudaStream) -> AnyDeviceTensor {
    use cudarc::driver::DevicePtr;
    fn one<T: mixer_cuda::tensor::DeviceScalar>(
        t: &DeviceTensor<T>,
        s: &cudarc::driver::CudaStream,
    ) -> DeviceTensor<T> {
        let ptr = {
            let v = t.view();
            let (p, _sync) = v.device_ptr(s);
            p
        };
        // SAFETY: `t`'s elements, row-major, kept alive by the owner (a handle on `t`).
        unsafe { DeviceTensor::<T>::borrowed(ptr, t.shape(), Box::new(t.clone())) }.unwrap()
    }
    match t {
        AnyDeviceTensor::F32(x) => AnyDeviceTensor::F32(one(x, stream)),
        AnyDeviceTensor::F64(x) => AnyDeviceTensor::F64(one(x, stream)),
        AnyDeviceTensor::Bf16(x) => AnyDeviceTensor::Bf16(one(x, stream)),
    }
}

/// What the Python package lends a call: its own stream (`on_stream`), its memory in place
/// (`DeviceTensor::borrowed`) and its allocator (`pool::with_allocator`). The forward and the
/// backward then take every buffer from that allocator and none from the pool, their results'
/// memory belongs to it, and they give the same bits as the backend's own stream and memory.
#[test]
#[ignore = "needs a CUDA device"]
fn a_lent_stream_memory_and_allocator_give_the_same_bits() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use cudarc::driver::DevicePtr;
    use mixer_core::Requires;
    use mixer_cuda::{backward_device, backward_device_with, on_stream, run_device_with};

    let Some(_turn) = gpu_alone() else {
        return;
    };
    let g = mixer_cuda::runtime::gpu().unwrap();
    let sizes = Sizes { batch: 2, seq: 65, channels: 6, heads: 2, dk: 16, dv: 16 };
    for name in ["gated-deltanet", "mamba2", "attention", "toeplitz", "glr"] {
        let m = mixer(name, &serde_json::json!({})).unwrap();
        let dims = complete_dims(m.as_ref(), &sizes.dims());
        let x = cast_tensors::<f32>(&m.random_inputs(&dims, 3).unwrap());
        let dev = upload_inputs(&x, Precision::Exact).unwrap();
        let y0 = run_device(m.as_ref(), Form::Fast, &dev, Precision::Exact).unwrap();
        let shape = y0.shape().to_vec();
        let n: usize = shape.iter().product();
        let dy =
            ArrayD::from_shape_vec(shape, (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect())
                .unwrap();
        let dy = AnyDeviceTensor::F32(DeviceTensor::upload(&dy).unwrap());
        let want = host(&y0);
        let want_g: Vec<(String, Tensor)> =
            backward_device(m.as_ref(), &dev, &dy, &Requires::All, Precision::Exact)
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), host(v)))
                .collect();

        let stream = g.ctx.new_stream().unwrap();
        let inputs: DeviceTensors = dev.iter().map(|(k, v)| (k.clone(), lent(v, &stream))).collect();
        let dy_lent = lent(&dy, &stream);
        let taken = Arc::new(AtomicUsize::new(0));
        let (count, s) = (taken.clone(), stream.clone());
        let alloc: Arc<pool::ExternalAlloc> = Arc::new(move |bytes: usize| {
            count.fetch_add(1, Ordering::Relaxed);
            let buf = s.alloc_zeros::<u8>(bytes).map_err(|e| Error::Numerical(e.to_string()))?;
            let ptr = {
                let (p, _sync) = buf.device_ptr(&s);
                p
            };
            Ok((ptr, Box::new(buf) as Box<dyn std::any::Any + Send + Sync>))
        });
        let before = pool::thread_driver_allocs();
        let (y, grads) = on_stream(stream.clone(), || {
            pool::with_allocator(alloc, || {
                let y = run_device_with(m.as_ref(), Form::Fast, &inputs, Precision::Exact, false).unwrap();
                let d = backward_device_with(
                    m.as_ref(),
                    &inputs,
                    &dy_lent,
                    &Requires::All,
                    Precision::Exact,
                    false,
                )
                .unwrap();
                (y, d)
            })
        });
        assert_eq!(pool::thread_driver_allocs(), before, "{name}: the pool allocated inside with_allocator");
        assert!(taken.load(Ordering::Relaxed) > 0, "{name}: the caller's allocator was never asked");
        let AnyDeviceTensor::F32(yt) = &y else { panic!("{name}: y is {}", y.dtype()) };
        assert!(yt.external_owner().is_some(), "{name}: y's memory is not the caller's");
        let got = on_stream(stream.clone(), || host(&y));
        assert_eq!(got, want, "{name}: y on a lent stream");
        for (k, w) in &want_g {
            let got = on_stream(stream.clone(), || host(&grads[k]));
            assert_eq!(&got, w, "{name}: {k} on a lent stream");
        }
    }
}

/// Enqueueing a small forward (gated DeltaNet, the size of the Python package's overhead test)
/// neither waits for the stream nor allocates device memory in steady state; prints the host
/// time per call, the Rust side of the Python package's per-call overhead.
#[test]
#[ignore = "needs a CUDA device"]
fn enqueueing_a_small_forward_neither_waits_nor_allocates() {
    use mixer_cuda::run_device_with;
    use mixer_cuda::runtime::host_syncs;

    let Some(_turn) = gpu_alone() else {
        return;
    };
    let m = mixer("gated-deltanet", &serde_json::json!({})).unwrap();
    let sizes = Sizes { batch: 2, seq: 64, channels: 6, heads: 2, dk: 16, dv: 16 };
    let dims = complete_dims(m.as_ref(), &sizes.dims());
    let x =
        upload_inputs(&cast_tensors::<f32>(&m.random_inputs(&dims, 1).unwrap()), Precision::Exact).unwrap();
    let run = || run_device_with(m.as_ref(), Form::Fast, &x, Precision::Exact, false).unwrap();
    for _ in 0..50 {
        drop(run());
    }
    mixer_cuda::runtime::gpu().unwrap().sync("test").unwrap();
    let (syncs, allocs) = (host_syncs(), pool::thread_driver_allocs());
    let n = 2000;
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        drop(run());
    }
    let per = t0.elapsed().as_secs_f64() / n as f64;
    assert_eq!(host_syncs(), syncs, "a forward waited for the stream");
    assert_eq!(pool::thread_driver_allocs(), allocs, "a steady-state forward allocated");
    println!(
        "run_device (gated-deltanet, B=2 T=64 H=2 D=16, f32, no value checks): {:.1} µs per call",
        per * 1e6
    );
    mixer_cuda::runtime::gpu().unwrap().sync("test").unwrap();
}
