//! Gradients from candle's `backward()` through the ops: equal to the library's CPU backward
//! for the same cotangent, bit for bit, and to central differences of the forward in f64.

use std::collections::BTreeMap;

use candle_core::{DType, Tensor, Var};
use mixers::ndarray::ArrayD;
use mixers::ops::Options;
use mixers::prelude::{Form, Requires, Tensors};
use mixers::registry::call::Target;
use mixers::registry::{Backend, call};

use crate::common::*;

/// A fixed random cotangent of the shape of `y`, as an array.
fn cotangent(shape: &[usize], seed: u64) -> ArrayD<f64> {
    use mixers::core::spec::{Gen, draw};
    use rand::SeedableRng;
    draw(Gen::Normal(1.0), shape, &mut rand::rngs::StdRng::seed_from_u64(seed))
}

/// `Σ y ⊙ w` as a candle scalar.
fn loss(y: &Tensor, w: &ArrayD<f64>) -> Tensor {
    (y * tensor(w, y.dtype())).unwrap().sum_all().unwrap()
}

/// The candle gradient of every variable.
fn candle_grads(v: &BTreeMap<String, Var>, l: &Tensor) -> Tensors<f64> {
    let g = l.backward().unwrap();
    v.iter()
        .map(|(k, t)| (k.clone(), array::<f64>(&g.get(t).unwrap().to_dtype(DType::F64).unwrap())))
        .collect()
}

#[test]
fn candle_gradients_equal_the_library_backward_bit_for_bit() {
    let cpu = Backend::by_name("cpu").unwrap();
    for (name, _) in TYPED {
        for t in [1, 63, 65] {
            let (m, x) = inputs(name, &sizes(2, t), 30 + t as u64);
            let v = vars(&x, DType::F64);
            let y = candle_op(name, &v, &Options::default()).unwrap();
            let w = cotangent(y.dims(), 1);
            let got = candle_grads(&v, &loss(&y, &w));
            let (want, _) = call::backward(
                Target::new(m.as_ref(), &cpu, Form::Fast),
                &x,
                None,
                &w,
                None,
                &Requires::All,
                Default::default(),
            )
            .unwrap();
            for (k, g) in &got {
                assert_eq!(g, &want[&format!("d_{k}")], "{name} T = {t}: d_{k}");
            }
            // f32 too.
            let v = vars(&x, DType::F32);
            let y = candle_op(name, &v, &Options::default()).unwrap();
            let got = candle_grads(&v, &loss(&y, &w));
            let x32 = to_f32(&x);
            let w32 = w.mapv(|a| a as f32);
            let (want, _) = call::backward(
                Target::new(m.as_ref(), &cpu, Form::Fast),
                &x32,
                None,
                &w32,
                None,
                &Requires::All,
                Default::default(),
            )
            .unwrap();
            for (k, g) in &got {
                assert_eq!(g, &want[&format!("d_{k}")].mapv(f64::from), "{name} f32 T = {t}: d_{k}");
            }
        }
    }
}

/// The central difference `(L(θ + h e_i) − L(θ − h e_i)) / 2h` of `f` at every entry of every
/// named tensor, against `grads`; `f` maps the named values to the loss.
fn check_central_differences(
    what: &str,
    x: &Tensors<f64>,
    grads: &Tensors<f64>,
    f: impl Fn(&Tensors<f64>) -> f64,
) {
    let h = 1e-6;
    for (k, a) in x {
        let g = &grads[k];
        let scale = g.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for i in 0..a.len() {
            let mut plus = x.clone();
            let mut minus = x.clone();
            plus.get_mut(k).unwrap().as_slice_mut().unwrap()[i] += h;
            minus.get_mut(k).unwrap().as_slice_mut().unwrap()[i] -= h;
            let fd = (f(&plus) - f(&minus)) / (2.0 * h);
            let an = g.as_slice().unwrap()[i];
            assert!((fd - an).abs() <= 1e-6 * scale, "{what}: d{k}[{i}] = {an}, central difference {fd}");
        }
    }
}

#[test]
fn candle_gradients_match_central_differences_in_f64() {
    for (name, _) in TYPED {
        let (_, x) = inputs(name, &sizes(1, 6), 40);
        let v = vars(&x, DType::F64);
        let y = candle_op(name, &v, &Options::default()).unwrap();
        let w = cotangent(y.dims(), 2);
        let grads = candle_grads(&v, &loss(&y, &w));
        check_central_differences(name, &x, &grads, |p| {
            let y = candle_op(name, &vars(p, DType::F64), &Options::default()).unwrap();
            loss(&y, &w).to_scalar::<f64>().unwrap()
        });
    }
}

#[test]
fn state_gradients_match_central_differences_and_the_library() {
    let cpu = Backend::by_name("cpu").unwrap();
    let sz = sizes(2, 7);
    let (m, mut x) = inputs("gated-deltanet", &sz, 41);
    let dims = mixers::core::mixer::complete_dims(m.as_ref(), &sz.dims());
    let s0 = m.random_state(&dims, 3).unwrap();
    let w = cotangent(&[2, 7, 2, 3], 4);
    let ws = cotangent(&[2, 2, 3, 5], 5);
    // y and S_T both in the loss: Σ y ⊙ w + Σ S_T ⊙ w_S.
    let run = |p: &Tensors<f64>| {
        let v = vars(p, DType::F64);
        let t = |n: &str| v[n].as_tensor();
        let (y, s) = mixers_candle::ops::gated_deltanet_state(
            t("q"),
            t("k"),
            t("v"),
            t("g"),
            t("beta"),
            Some(t("S")),
            &Options::default(),
        )
        .unwrap();
        let l = (loss(&y, &w) + loss(&s, &ws)).unwrap();
        (v, l)
    };
    x.insert("S".into(), s0["S"].clone());
    let (v, l) = run(&x);
    let grads = candle_grads(&v, &l);
    check_central_differences("gated-deltanet from a state", &x, &grads, |p| {
        run(p).1.to_scalar::<f64>().unwrap()
    });
    // The same as the library's backward from a state.
    let inputs: Tensors<f64> =
        x.iter().filter(|(k, _)| *k != "S").map(|(k, a)| (k.clone(), a.clone())).collect();
    let d_final: Tensors<f64> = [("S".to_string(), ws.clone())].into();
    let (want, d_s0) = call::backward(
        Target::new(m.as_ref(), &cpu, Form::Fast),
        &inputs,
        Some(&s0),
        &w,
        Some(&d_final),
        &Requires::All,
        Default::default(),
    )
    .unwrap();
    assert_eq!(grads["S"], d_s0["S"]);
    for k in inputs.keys() {
        assert_eq!(grads[k], want[&format!("d_{k}")], "d_{k}");
    }
}

#[test]
fn only_y_in_the_loss_gives_the_state_op_a_zero_state_cotangent() {
    // With S_T unused, the state op's backward equals the plain op's.
    let (_, x) = inputs("mamba2", &sizes(1, 9), 42);
    let w = cotangent(&[1, 9, 2, 3], 6);
    let v = vars(&x, DType::F64);
    let t = |n: &str| v[n].as_tensor();
    let (y, _) =
        mixers_candle::ops::mamba2_state(t("q"), t("k"), t("v"), t("g"), None, &Options::default()).unwrap();
    let a = candle_grads(&v, &loss(&y, &w));
    let y = mixers_candle::ops::mamba2(t("q"), t("k"), t("v"), t("g"), &Options::default()).unwrap();
    let b = candle_grads(&v, &loss(&y, &w));
    for (k, g) in &a {
        let c = mixers::prelude::Tolerance::F64.compare(g.view(), b[k].view());
        assert!(c.pass, "d{k}: {c:?}");
    }
}

#[test]
fn packed_batch_gradients_match_central_differences() {
    let (_, x) = inputs("mamba2", &sizes(1, 8), 43);
    let opts = Options::default().cu_seqlens(&[0, 3, 3, 7]);
    let w = cotangent(&[1, 8, 2, 3], 7);
    let v = vars(&x, DType::F64);
    let y = candle_op("mamba2", &v, &opts).unwrap();
    let grads = candle_grads(&v, &loss(&y, &w));
    check_central_differences("packed mamba2", &x, &grads, |p| {
        loss(&candle_op("mamba2", &vars(p, DType::F64), &opts).unwrap(), &w).to_scalar::<f64>().unwrap()
    });
}

#[test]
fn run_gradients_of_the_glr_and_the_toeplitz_mixer_match_central_differences() {
    let sz = mixers::registry::Sizes { batch: 1, seq: 6, channels: 4, heads: 2, dk: 3, dv: 2 };
    for (name, cfg) in [
        ("toeplitz", serde_json::json!({"heads": 2, "kernel_width": 2})),
        ("glr", serde_json::json!({"pattern": "sq1"})),
        ("glr", serde_json::json!({"pattern": "sq1", "on": "both"})),
    ] {
        let m = mixers::registry::mixer(name, &cfg).unwrap();
        let x = mixers::registry::grad_check::grad_inputs(m.as_ref(), &sz, 8).unwrap();
        let f = |p: &Tensors<f64>| {
            let v = vars(p, DType::F64);
            let named: Vec<(&str, &Tensor)> = v.iter().map(|(k, t)| (k.as_str(), t.as_tensor())).collect();
            let y = mixers_candle::run(name, &cfg, &named, &Options::default()).unwrap();
            let w = cotangent(y.dims(), 9);
            (v, loss(&y, &w))
        };
        let (v, l) = f(&x);
        let grads = candle_grads(&v, &l);
        check_central_differences(&format!("{name} {cfg}"), &x, &grads, |p| {
            f(p).1.to_scalar::<f64>().unwrap()
        });
    }
}
