//! Attention from a KV cache on CUDA (`mixer_cuda::attention::state`): the run's queries against
//! the cached keys and its own, the cached rows not computed again. Against the CPU (which runs
//! the extension by the cache) on host arrays in f64 and f32, at head dims that take the FMA
//! kernel and the tensor-core kernels, with and without a window, rows of different cached
//! lengths (0 included) and a long cache; on device tensors the same bits as the host-array path
//! in every mode, the modes within their tolerance of the f64 CPU run, and the backward from a
//! cache on device tensors against the CPU's.
//! GPU tests are `#[ignore]`d and skip without a device (fail under `MIXERS_REQUIRE_CUDA=1`).

use mixer_core::mixer::Mixer;
use mixer_core::tensor::{cast_tensors, tensors_to_f64};
use mixer_core::{Dims, Form, Precision, Requires, Tensors, Tolerance};
use mixer_cuda::forms::{download_as, upload_inputs, upload_one};
use mixer_cuda::{backward_device_from_state, run_device_from_state};
use mixer_registry::family::Scalar;
use mixer_registry::mixer;
use mixer_registry::state::run_state;
use ndarray::{ArrayD, IxDyn};
use serde_json::json;

use crate::common::{cpu, cuda, gpu};

fn dims(b: usize, t: usize, d: usize) -> Dims {
    [("B", b), ("T", t), ("H", 2), ("Dk", d), ("Dv", d)].into_iter().collect()
}

/// A cache of capacity `n` with `lens[b]` random rows in batch row `b` (zeros after).
fn cache(lens: &[usize], n: usize, d: usize, seed: u64) -> Tensors<f64> {
    let mut s = Tensors::new();
    for (i, name) in ["k", "v"].into_iter().enumerate() {
        let mut a = ArrayD::<f64>::zeros(IxDyn(&[lens.len(), n, 2, d]));
        for (b, &l) in lens.iter().enumerate() {
            for r in 0..l {
                for h in 0..2 {
                    for c in 0..d {
                        let u = (seed as usize * 7919 + i * 104729 + b * 613 + r * 37 + h * 11 + c) as f64;
                        a[[b, r, h, c]] = (u * 0.61803).sin() * 1.3;
                    }
                }
            }
        }
        s.insert(name.into(), a);
    }
    s.insert(
        "length".into(),
        ArrayD::from_shape_vec(IxDyn(&[lens.len()]), lens.iter().map(|&l| l as f64).collect()).unwrap(),
    );
    s
}

/// The configurations: no window (capacity `ℓ + T + 3`), windows of 5 and 40 (capacity `w − 1`).
fn cases(t: usize) -> Vec<(serde_json::Value, Vec<usize>, usize)> {
    let lens = vec![0, 13, 150];
    vec![
        (json!({}), lens.clone(), 150 + t + 3),
        (json!({"window": 5}), vec![0, 3, 4], 4),
        (json!({"window": 40}), vec![39, 0, 17], 39),
    ]
}

/// CUDA from a cache against the CPU in `F`: `y` within the dtype's tolerance, the final cache the
/// same bits (both copy the same rows).
fn against_cpu<F: mixer_cuda::tensor::GpuReal + Scalar>(
    m: &dyn Mixer,
    x: &Tensors<f64>,
    s0: &Tensors<f64>,
    label: &str,
) {
    let (x, s0) = (cast_tensors::<F>(x), cast_tensors::<F>(s0));
    let (want_y, want_f) = run_state(m, &cpu(), Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
    let (y, fin) = run_state(m, &cuda(), Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
    let tol = Tolerance::for_dtype(F::NAME);
    let f64s = |a: &ArrayD<F>| a.mapv(|v| v.f64());
    let c = tol.compare(f64s(&y).view(), f64s(&want_y).view());
    assert!(c.pass, "{label} {}: y {c:?}", F::NAME);
    assert_eq!(fin, want_f, "{label} {}: final cache", F::NAME);
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_from_a_cache_matches_the_cpu() {
    let Some(_turn) = gpu() else { return };
    // D = 20: the FMA kernel; D = 64: the split-tf32 tensor-core kernel (f32) and FMA (f64).
    for d in [20, 64] {
        for t in [1, 37, 130] {
            for (cfg, lens, n) in cases(t) {
                let m = mixer("attention", &cfg).unwrap();
                let x = m.random_inputs(&dims(3, t, d), 5).unwrap();
                let s0 = cache(&lens, n, d, 9);
                let label = format!("{cfg} D={d} T={t} lengths {lens:?}");
                against_cpu::<f32>(m.as_ref(), &x, &s0, &label);
                against_cpu::<f64>(m.as_ref(), &x, &s0, &label);
            }
        }
    }
}

/// On host arrays the CUDA backend refuses a cache whose rows past its length are not zero, as
/// the CPU does (the device form itself does not read them).
#[test]
#[ignore = "needs a CUDA device"]
fn a_cache_with_rows_past_its_length_is_refused_on_host_arrays() {
    let Some(_turn) = gpu() else { return };
    let m = mixer("attention", &json!({})).unwrap();
    let x = m.random_inputs(&dims(3, 5, 8), 1).unwrap();
    let mut s0 = cache(&[0, 2, 4], 12, 8, 2);
    s0.get_mut("k").unwrap()[[1, 3, 0, 0]] = 1.0;
    for b in [cpu(), cuda()] {
        let e =
            run_state(m.as_ref(), &b, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap_err().to_string();
        assert!(e.contains("state.k[1, 2..]") && e.contains("must be zero"), "{}: {e}", b.name());
    }
}

/// A long cache (3000 tokens) before 65 new ones, with and without a window, in f32.
#[test]
#[ignore = "needs a CUDA device"]
fn attention_continues_a_long_cache() {
    let Some(_turn) = gpu() else { return };
    for (cfg, n) in [(json!({}), 3100), (json!({"window": 700}), 699)] {
        let m = mixer("attention", &cfg).unwrap();
        let x = m.random_inputs(&dims(1, 65, 64), 2).unwrap();
        let l = if n > 3000 { 3000 } else { n };
        against_cpu::<f32>(m.as_ref(), &x, &cache(&[l], n, 64, 4), &format!("{cfg} long cache"));
    }
}

/// Long caches before few tokens on device tensors in the tf32 and bf16 modes, where the launch
/// splits the keys across blocks (`fused::key_splits`): within the mode's tolerance of the f64
/// CPU run, rows of different lengths, with and without a window.
#[test]
#[ignore = "needs a CUDA device"]
fn attention_splits_the_keys_of_a_long_cache() {
    let Some(_turn) = gpu() else { return };
    let up = |t: &Tensors<f32>| upload_inputs(t, Precision::Exact).unwrap();
    for (cfg, lens, n) in [(json!({}), vec![2000, 700], 2040), (json!({"window": 300}), vec![299, 120], 299)]
    {
        for d in [64, 128] {
            let m = mixer("attention", &cfg).unwrap();
            let x64 = m.random_inputs(&dims(2, 33, d), 8).unwrap();
            let s64 = cache(&lens, n, d, 5);
            let (x, s0) = (cast_tensors::<f32>(&x64), cast_tensors::<f32>(&s64));
            for p in [Precision::Tf32, Precision::Bf16] {
                let (y, _) =
                    run_device_from_state(m.as_ref(), &upload_inputs(&x, p).unwrap(), Some(&up(&s0)), p)
                        .unwrap();
                let xs =
                    if p == Precision::Bf16 { mixer_registry::run::bf16_activations(&x) } else { x.clone() };
                let (oracle, _) = run_state(
                    m.as_ref(),
                    &cpu(),
                    Form::Fast,
                    &tensors_to_f64(&xs),
                    Some(&s64),
                    Precision::Exact,
                )
                .unwrap();
                let c = p.tolerance("f32").compare(down64(&y).view(), oracle.view());
                assert!(c.pass, "{cfg} D={d} {p}: y against the f64 CPU run {c:?}");
            }
        }
    }
}

/// On device tensors in every mode: the same bits as the host-array run on CUDA (which uploads the
/// same values), `y` in the mode's storage, within the mode's tolerance of the f64 CPU run; the
/// backward from the cache on device tensors (with and without the final cache's cotangent)
/// against the CPU's.
#[test]
#[ignore = "needs a CUDA device"]
fn attention_from_a_cache_on_device_tensors_in_every_mode() {
    let Some(_turn) = gpu() else { return };
    let up = |t: &Tensors<f32>| upload_inputs(t, Precision::Exact).unwrap();
    // D = 64: the wgmma kernel in the bf16 mode (compute capability 9.0); D = 32: mma.sync.
    for ((cfg, lens, n), d) in cases(70).into_iter().flat_map(|c| [(c.clone(), 64), (c, 32)]) {
        let m = mixer("attention", &cfg).unwrap();
        let x64 = m.random_inputs(&dims(3, 70, d), 7).unwrap();
        let s64 = cache(&lens, n, d, 3);
        let (x, s0) = (cast_tensors::<f32>(&x64), cast_tensors::<f32>(&s64));
        for p in Precision::ALL {
            let label = format!("{cfg} D={d} {p}");
            let (want_y, want_f) = run_state(m.as_ref(), &cuda(), Form::Fast, &x, Some(&s0), p).unwrap();
            let (y, fin) =
                run_device_from_state(m.as_ref(), &upload_inputs(&x, p).unwrap(), Some(&up(&s0)), p).unwrap();
            assert_eq!(y.dtype(), if p == Precision::Bf16 { "bf16" } else { "f32" }, "{label}");
            assert_eq!(download_as::<f32>(&y).unwrap(), want_y, "{label}: y");
            let fin: Tensors<f32> =
                fin.iter().map(|(k, v)| (k.clone(), download_as::<f32>(v).unwrap())).collect();
            assert_eq!(fin, want_f, "{label}: final cache");
            // Against the f64 CPU run on the values as the mode stores them.
            let xs = if p == Precision::Bf16 { mixer_registry::run::bf16_activations(&x) } else { x.clone() };
            let (oracle, _) =
                run_state(m.as_ref(), &cpu(), Form::Fast, &tensors_to_f64(&xs), Some(&s64), Precision::Exact)
                    .unwrap();
            let c = p.tolerance("f32").compare(want_y.mapv(f64::from).view(), oracle.view());
            assert!(c.pass, "{label}: y against the f64 CPU run {c:?}");
        }
        // The backward from the cache on device tensors (exact mode, the extension's) against
        // the CPU's in f64: the inputs' gradients and the cache's, with the final cache's
        // cotangent and without.
        let dy64 = m.random_inputs(&dims(3, 70, d), 11).unwrap().remove("q").unwrap();
        let (_, f64s) =
            run_state(m.as_ref(), &cpu(), Form::Fast, &x64, Some(&s64), Precision::Exact).unwrap();
        let df64: Tensors<f64> =
            f64s.iter().map(|(k, v)| (k.clone(), v.mapv(|e| (1.3 * e + 0.2).cos()))).collect();
        for with_df in [false, true] {
            let df = with_df.then_some(&df64);
            let want = mixer_registry::state::backward_state(
                m.as_ref(),
                &cpu(),
                Form::Fast,
                &x64,
                Some(&s64),
                &dy64,
                df,
                &Requires::All,
            )
            .unwrap();
            let (dy, df32) = (dy64.mapv(|v| v as f32), df.map(cast_tensors::<f32>));
            let (g, ds) = backward_device_from_state(
                m.as_ref(),
                &up(&x),
                Some(&up(&s0)),
                &upload_one(&dy, false).unwrap(),
                df32.as_ref().map(up).as_ref(),
                &Requires::All,
                Precision::Exact,
            )
            .unwrap();
            let label = format!("{cfg} D={d} backward, d_final {with_df}");
            for (got, want) in [(&g, &want.0), (&ds, &want.1)] {
                assert_eq!(got.len(), want.len(), "{label}: {:?}", got.keys().collect::<Vec<_>>());
                for (k, w) in want {
                    let got = down64(&got[k]);
                    let c = Tolerance::F32.compare_grad(got.view(), w.view());
                    assert!(c.pass, "{label}: {k} {c:?}");
                }
            }
        }
    }
}

/// An f32 device tensor read back as f64.
fn down64(t: &mixer_cuda::AnyDeviceTensor) -> ArrayD<f64> {
    download_as::<f32>(t).unwrap().mapv(f64::from)
}
