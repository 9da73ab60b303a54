//! The `bf16` mode's device backward against the CPU backend: the plain backward, the backward
//! from a state with the final state's cotangent, and the backward over a packed batch of device
//! tensors, each against the CPU's exact backward on the values the mode stores (activations and
//! `dy` rounded to bf16). The bit-for-bit tests of `device_state` and `device_packed` compare
//! the device entries with the host-array path on CUDA, which runs the same device code; this is
//! the check with an anchor outside it.

use mixer_core::precision::round_bf16;
use mixer_core::state::StateVjp;
use mixer_core::tensor::cast_tensors;
use mixer_core::{Dims, Form, Precision, Requires, Tensors};
use mixer_cuda::forms::{download_as, upload_inputs, upload_one};
use mixer_cuda::{DeviceTensors, backward_device, backward_device_from_state, backward_device_packed};
use mixer_registry::mixer;
use mixer_registry::packed::backward_packed;
use mixer_registry::run::bf16_activations;
use mixer_registry::state::backward_state;
use ndarray::ArrayD;

use crate::common::{cpu, gpu};

/// An empty sequence, one token, a chunk and one, then rows past the last offset.
const CU: [usize; 5] = [0, 0, 1, 66, 100];

fn down(t: &DeviceTensors) -> Tensors<f32> {
    t.iter().map(|(k, v)| (k.clone(), download_as::<f32>(v).expect("download"))).collect()
}

/// The gradients of `got` that are not within `tol · max(max |want|, 10⁻³)` of `want`'s, one
/// line each (printed for every gradient, so that a run shows the margins).
fn compare(got: &Tensors<f32>, want: &Tensors<f32>, tol: f64, what: &str) -> Vec<String> {
    let mut bad = Vec::new();
    if got.keys().ne(want.keys()) {
        bad.push(format!("{what}: gradients {:?}, expected {:?}", got.keys(), want.keys()));
        return bad;
    }
    for (k, g) in got {
        let w = &want[k];
        if g.shape() != w.shape() {
            bad.push(format!("{what} {k}: shape {:?}, expected {:?}", g.shape(), w.shape()));
            continue;
        }
        let scale = w.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs())).max(1e-3);
        let err = g.iter().zip(w).fold(0f64, |m, (&a, &b)| m.max((f64::from(a) - f64::from(b)).abs()));
        eprintln!("{what} {k}: max error {err:.3e}, max {scale:.3e}");
        if err > tol * scale || err.is_nan() {
            bad.push(format!("{what} {k}: max error {err:.3e} above {tol:.0e} × max {scale:.3e}"));
        }
    }
    bad
}

/// A cotangent of `shape` with entries in [−1, 1], rounded to bf16.
fn cotangent(shape: &[usize], phase: f32) -> ArrayD<f32> {
    let n: usize = shape.iter().product();
    ArrayD::from_shape_vec(shape, (0..n).map(|i| round_bf16((i as f32 * 0.37 + phase).sin())).collect())
        .unwrap()
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_mode_device_backwards_match_the_cpu_on_the_stored_values() {
    let Some(_turn) = gpu() else { return };
    let cpu = cpu();
    let all = Requires::All;
    let p = Precision::Bf16;
    let tol = 2e-2;
    let mut bad = Vec::new();
    for name in ["linear-attention", "mamba2", "gated-deltanet"] {
        let m = mixer(name, &serde_json::json!({"scale": 0.6})).unwrap();
        for (t, dk, dv) in [(107, 5, 3), (130, 64, 64)] {
            let what = format!("{name} T = {t} Dk = {dk} Dv = {dv}");
            let dims: Dims = [("B", 1), ("T", t), ("H", 2), ("Dk", dk), ("Dv", dv)].into_iter().collect();
            let x = cast_tensors::<f32>(&m.random_inputs(&dims, 3).unwrap());
            let xs = bf16_activations(&x);
            let dev = upload_inputs(&x, p).unwrap();
            let dy = cotangent(&[1, t, 2, dv], 0.3);
            let dyd = upload_one(&dy, true).unwrap();

            let g = down(&backward_device(m.as_ref(), &dev, &dyd, &all, p).unwrap());
            let (want, _) = backward_state(m.as_ref(), &cpu, Form::Fast, &xs, None, &dy, None, &all).unwrap();
            bad.extend(compare(&g, &want, tol, &format!("{what} plain")));

            let (g, _) =
                backward_device_packed(m.as_ref(), &dev, &CU, None, &dyd, None, &all, p, true).unwrap();
            let args = StateVjp { x: &xs, initial: None, dy: &dy, d_final: None, requires: &all };
            let (want, _) = backward_packed(m.as_ref(), &cpu, Form::Fast, &CU, args).unwrap();
            bad.extend(compare(&down(&g), &want, tol, &format!("{what} packed")));

            let s0 = cast_tensors::<f32>(&m.random_state(&dims, 4).unwrap());
            let df: Tensors<f32> = s0.iter().map(|(k, v)| (k.clone(), cotangent(v.shape(), 1.1))).collect();
            let (s0d, dfd) = (
                upload_inputs(&s0, Precision::Exact).unwrap(),
                upload_inputs(&df, Precision::Exact).unwrap(),
            );
            let (g, ds) =
                backward_device_from_state(m.as_ref(), &dev, Some(&s0d), &dyd, Some(&dfd), &all, p).unwrap();
            let (want, want_s) =
                backward_state(m.as_ref(), &cpu, Form::Fast, &xs, Some(&s0), &dy, Some(&df), &all).unwrap();
            bad.extend(compare(&down(&g), &want, tol, &format!("{what} from a state")));
            bad.extend(compare(&down(&ds), &want_s, tol, &format!("{what} from a state, initial state")));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
