//! Runs from a state on device tensors (`mixer_cuda::{run_device_from_state,
//! backward_device_from_state}`): the same bits as the host-array runs from a state on CUDA
//! (which upload and call the same device forms) for linear attention, Mamba-2 and gated
//! DeltaNet, f32 and f64, with and without each state, in every precision mode; and the errors: a
//! family whose state runs on host arrays only (the GLR), a lift, inputs not stored as the mode takes them,
//! a state of the wrong shape or dtype.
//! GPU tests are `#[ignore]`d and skip without a device (fail under `MIXERS_REQUIRE_CUDA=1`).

use mixer_core::mixer::Mixer;
use mixer_core::tensor::cast_tensors;
use mixer_core::{Dims, Form, Precision, Requires, Tensors};
use mixer_cuda::forms::{download_as, upload_inputs, upload_one};
use mixer_cuda::{DeviceTensors, backward_device_from_state, run_device_from_state};
use mixer_registry::mixer;
use mixer_registry::state::{backward_state, run_state};
use ndarray::ArrayD;

use crate::common::{cuda, gpu};

fn dims(t: usize) -> Dims {
    [("B", 2), ("T", t), ("H", 2), ("Dk", 48), ("Dv", 70)].into_iter().collect()
}

fn up<F: mixer_cuda::tensor::GpuReal>(t: &Tensors<F>) -> DeviceTensors {
    upload_inputs(t, Precision::Exact).expect("upload")
}

fn down<F: mixer_cuda::tensor::GpuReal>(t: &DeviceTensors) -> Tensors<F> {
    t.iter().map(|(k, v)| (k.clone(), download_as::<F>(v).expect("download"))).collect()
}

/// Device entry points against the host-array path on CUDA, bit for bit, in `F`.
fn same_bits<F: mixer_cuda::tensor::GpuReal + mixer_registry::family::Scalar>(m: &dyn Mixer, t: usize) {
    let d = dims(t);
    let x = cast_tensors::<F>(&m.random_inputs(&d, 3).unwrap());
    let s0 = cast_tensors::<F>(&m.random_state(&d, 4).unwrap());
    let gpu = cuda();
    let (want_y, want_f) = run_state(m, &gpu, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
    let (y, fin) = run_device_from_state(m, &up(&x), Some(&up(&s0)), Precision::Exact).unwrap();
    let label = format!("{} {} T={t}", m.name(), F::NAME);
    assert_eq!(download_as::<F>(&y).unwrap(), want_y, "{label}: y");
    assert_eq!(down::<F>(&fin), want_f, "{label}: final state");
    // From zeros: the device run without a state equals the host run from an explicit zero state.
    let zeros: Tensors<F> = s0.iter().map(|(k, v)| (k.clone(), ArrayD::zeros(v.raw_dim()))).collect();
    let (y0, _) = run_device_from_state(m, &up(&x), None, Precision::Exact).unwrap();
    let (want0, _) = run_state(m, &gpu, Form::Fast, &x, Some(&zeros), Precision::Exact).unwrap();
    assert_eq!(download_as::<F>(&y0).unwrap(), want0, "{label}: y from no state");

    let dy = want_y.mapv(|v| F::of((2.1 * v.f64() + 0.3).sin()));
    let df: Tensors<F> =
        want_f.iter().map(|(k, v)| (k.clone(), v.mapv(|e| F::of((1.1 * e.f64()).cos())))).collect();
    let dy_dev = upload_one(&dy, false).unwrap();
    for (with_s0, with_df) in [(true, true), (true, false), (false, true)] {
        let (s, f) = (with_s0.then_some(&s0), with_df.then_some(&df));
        let want = backward_state(m, &gpu, Form::Fast, &x, s, &dy, f, &Requires::All).unwrap();
        let (sd, fd) = (s.map(up), f.map(up));
        let (g, ds) = backward_device_from_state(
            m,
            &up(&x),
            sd.as_ref(),
            &dy_dev,
            fd.as_ref(),
            &Requires::All,
            Precision::Exact,
        )
        .unwrap();
        let what = format!("{label} S_0: {with_s0} S̄_T: {with_df}");
        assert_eq!(down::<F>(&g), want.0, "{what}: gradients");
        assert_eq!(down::<F>(&ds), want.1, "{what}: the initial state's gradient");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_runs_from_a_state_equal_the_host_runs_bit_for_bit() {
    let Some(_turn) = gpu() else { return };
    for name in ["linear-attention", "mamba2", "gated-deltanet"] {
        let m = mixer(name, &serde_json::json!({"scale": 0.6})).unwrap();
        for t in [1, 65, 300] {
            same_bits::<f32>(m.as_ref(), t);
            same_bits::<f64>(m.as_ref(), t);
        }
    }
}

/// In the tf32 and bf16 modes (f32 data; bf16 activations and `dy` in the bf16 mode, as that mode
/// stores them): the device run from a state equals the host-array run on CUDA in the same mode
/// bit for bit, and the device backward from a state (computed in the exact mode on the values as
/// stored) equals the host backward from a state (exact) on the same values bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn device_runs_from_a_state_in_the_tf32_and_bf16_modes_equal_the_host_runs() {
    use mixer_registry::run::bf16_activations;
    let Some(_turn) = gpu() else { return };
    let gpu = cuda();
    for name in ["linear-attention", "mamba2", "gated-deltanet"] {
        let m = mixer(name, &serde_json::json!({"scale": 0.6})).unwrap();
        for t in [1, 65, 300] {
            let d = dims(t);
            let x = cast_tensors::<f32>(&m.random_inputs(&d, 3).unwrap());
            let s0 = cast_tensors::<f32>(&m.random_state(&d, 4).unwrap());
            for p in [Precision::Tf32, Precision::Bf16] {
                let label = format!("{name} T={t} {p}");
                let (want_y, want_f) = run_state(m.as_ref(), &gpu, Form::Fast, &x, Some(&s0), p).unwrap();
                let xd = upload_inputs(&x, p).unwrap();
                let (y, fin) = run_device_from_state(m.as_ref(), &xd, Some(&up(&s0)), p).unwrap();
                assert_eq!(y.dtype(), if p == Precision::Bf16 { "bf16" } else { "f32" }, "{label}");
                assert_eq!(download_as::<f32>(&y).unwrap(), want_y, "{label}: y");
                assert_eq!(down::<f32>(&fin), want_f, "{label}: final state");
                // The backward: exact on the values as the mode stores them.
                let bf16 = p == Precision::Bf16;
                let xs = if bf16 { bf16_activations(&x) } else { x.clone() };
                let dy = want_y.mapv(|v| (2.1 * v + 0.3).sin());
                let dy = if bf16 { dy.mapv(mixer_core::precision::round_bf16) } else { dy };
                let want =
                    backward_state(m.as_ref(), &gpu, Form::Fast, &xs, Some(&s0), &dy, None, &Requires::All)
                        .unwrap();
                let dy_dev = upload_one(&dy, bf16).unwrap();
                let (g, ds) = backward_device_from_state(
                    m.as_ref(),
                    &xd,
                    Some(&up(&s0)),
                    &dy_dev,
                    None,
                    &Requires::All,
                    p,
                )
                .unwrap();
                assert_eq!(down::<f32>(&g), want.0, "{label}: gradients");
                assert_eq!(down::<f32>(&ds), want.1, "{label}: the initial state's gradient");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_runs_from_a_state_refuse_what_they_cannot_run() {
    let Some(_turn) = gpu() else { return };
    let run = |name: &str, config: serde_json::Value, x: &Tensors<f32>, s0: Option<&Tensors<f32>>, p| {
        let m = mixer(name, &config).unwrap();
        run_device_from_state(m.as_ref(), &up(x), s0.map(up).as_ref(), p).map(|_| ()).unwrap_err().to_string()
    };
    let m = mixer("gated-deltanet", &serde_json::json!({})).unwrap();
    let d = dims(33);
    let x = cast_tensors::<f32>(&m.random_inputs(&d, 1).unwrap());
    let s0 = cast_tensors::<f32>(&m.random_state(&d, 2).unwrap());

    // The bf16 mode takes bf16 activations (f32 ones are refused, as in a run without a state).
    let e = run("gated-deltanet", serde_json::json!({}), &x, Some(&s0), Precision::Bf16);
    assert!(e.contains("a bf16 device tensor") && e.contains("bf16 mode"), "{e}");
    let mut wrong = s0.clone();
    wrong.insert("S".into(), ArrayD::zeros(ndarray::IxDyn(&[2, 2, 48, 70])));
    let e = run("gated-deltanet", serde_json::json!({}), &x, Some(&wrong), Precision::Exact);
    assert!(e.contains("initial_state.S") && e.contains("[2, 2, 70, 48]"), "{e}");
    let as64 =
        upload_inputs(&cast_tensors::<f64>(&mixer_core::tensor::tensors_to_f64(&s0)), Precision::Exact)
            .unwrap();
    let e =
        run_device_from_state(m.as_ref(), &up(&x), Some(&as64), Precision::Exact).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("f32 device tensor"), "{e}");

    // A lift's level state of the wrong shape, and one whose position needs more levels than λ.
    let lift = mixer("loglinear-gated-deltanet", &serde_json::json!({})).unwrap();
    let ld = mixer_core::mixer::complete_dims(lift.as_ref(), &d);
    let lx = cast_tensors::<f32>(&lift.random_inputs(&ld, 1).unwrap());
    let ls = cast_tensors::<f32>(&lift.random_state(&ld, 2).unwrap());
    let mut bad = ls.clone();
    let mut shape = ls["S"].shape().to_vec();
    shape[2] += 1;
    bad.insert("S".into(), ArrayD::zeros(ndarray::IxDyn(&shape)));
    let e = run("loglinear-gated-deltanet", serde_json::json!({}), &lx, Some(&bad), Precision::Exact);
    assert!(e.contains("initial_state.S"), "{e}");
    let mut far = ls.clone();
    far.insert("position".into(), ArrayD::from_elem(ndarray::IxDyn(&[2]), (1u32 << 20) as f32));
    let e = run("loglinear-gated-deltanet", serde_json::json!({}), &lx, Some(&far), Precision::Exact);
    assert!(e.contains("state.position[0]") && e.contains("need L ≥"), "{e}");

    let glr = mixer("glr", &serde_json::json!({})).unwrap();
    let mut gd = mixer_core::mixer::complete_dims(glr.as_ref(), &d);
    gd.insert("C", 8);
    let gx = cast_tensors::<f32>(&glr.random_inputs(&gd, 1).unwrap());
    let e = run("glr", serde_json::json!({}), &gx, None, Precision::Exact);
    assert!(e.contains("fast form from a state on host arrays only"), "{e}");
}

/// The Toeplitz mixer from a state on device tensors (the extension by the state's history, built
/// on the device; rows at different positions): `y`, the final state and the backward (with and
/// without the final state's cotangent) against the CPU in f64, within f32's tolerance.
#[test]
#[ignore = "needs a CUDA device"]
fn the_toeplitz_mixer_runs_from_a_state_on_device_tensors() {
    use mixer_core::Tolerance;
    let Some(_turn) = gpu() else { return };
    let cpu = crate::common::cpu();
    for cfg in [serde_json::json!({}), serde_json::json!({"heads": 2, "kernel_width": 3})] {
        let m = mixer("toeplitz", &cfg).unwrap();
        let mut d: Dims = [("B", 3), ("T", 37), ("C", 6), ("Tw", 301)].into_iter().collect();
        d = mixer_core::mixer::complete_dims(m.as_ref(), &d);
        let x64 = m.random_inputs(&d, 5).unwrap();
        let s64 = m.random_state(&d, 6).unwrap();
        let (x, s0) = (cast_tensors::<f32>(&x64), cast_tensors::<f32>(&s64));
        let (want_y, want_f) =
            run_state(m.as_ref(), &cpu, Form::Fast, &x64, Some(&s64), Precision::Exact).unwrap();
        let (y, fin) = run_device_from_state(m.as_ref(), &up(&x), Some(&up(&s0)), Precision::Exact).unwrap();
        let close = |what: &str, got: &ArrayD<f64>, want: &ArrayD<f64>| {
            let c = Tolerance::F32.compare_grad(got.view(), want.view());
            assert!(c.pass, "toeplitz {cfg}: {what} {c:?}");
        };
        close("y", &down64(&y), &want_y);
        for (k, w) in &want_f {
            close(&format!("final {k}"), &down64(&fin[k]), w);
        }
        let dy64 = want_y.mapv(|v| (2.1 * v + 0.3).sin());
        let df64: Tensors<f64> =
            want_f.iter().map(|(k, v)| (k.clone(), v.mapv(|e| (1.1 * e).cos()))).collect();
        for with_df in [false, true] {
            let df = with_df.then_some(&df64);
            let want =
                backward_state(m.as_ref(), &cpu, Form::Fast, &x64, Some(&s64), &dy64, df, &Requires::All)
                    .unwrap();
            let dfd = df.map(|t| up(&cast_tensors::<f32>(t)));
            let (g, ds) = backward_device_from_state(
                m.as_ref(),
                &up(&x),
                Some(&up(&s0)),
                &upload_one(&dy64.mapv(|v| v as f32), false).unwrap(),
                dfd.as_ref(),
                &Requires::All,
                Precision::Exact,
            )
            .unwrap();
            for (got, want) in [(&g, &want.0), (&ds, &want.1)] {
                for (k, w) in want {
                    close(&format!("{k} (d_final {with_df})"), &down64(&got[k]), w);
                }
            }
        }
    }
}

/// An f32 device tensor read back as f64.
fn down64(t: &mixer_cuda::AnyDeviceTensor) -> ArrayD<f64> {
    download_as::<f32>(t).unwrap().mapv(f64::from)
}
