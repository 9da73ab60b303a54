//! The candle ops' `y` (and final state) against the typed API on the same values, bit for
//! bit, and against the f64 oracle; lengths that are not chunk multiples.

use candle_core::{DType, Tensor, Var};
use mixers::ops::{self, Options};
use mixers::prelude::{Form, Tolerance};

use crate::common::*;

#[test]
fn every_typed_op_equals_the_typed_api_bit_for_bit() {
    for (name, _) in TYPED {
        for (b, t) in [(1, 1), (2, 63), (1, 64), (2, 65)] {
            let (_, x) = inputs(name, &sizes(b, t), 7 + t as u64);
            let opts = Options::default();
            let y64 = candle_op(name, &vars(&x, DType::F64), &opts).unwrap();
            assert_eq!(array::<f64>(&y64), typed_api::<f64>(name, &x, &opts), "{name} f64 T = {t}");
            let y32 = candle_op(name, &vars(&x, DType::F32), &opts).unwrap();
            assert_eq!(array::<f32>(&y32), typed_api::<f32>(name, &to_f32(&x), &opts), "{name} f32 T = {t}");
        }
    }
}

#[test]
fn gated_deltanet_at_t_1000_equals_the_typed_api_and_the_oracle() {
    let (m, x) = inputs("gated-deltanet", &sizes(1, 1000), 3);
    let opts = Options::default();
    let y = array::<f32>(&candle_op("gated-deltanet", &vars(&x, DType::F32), &opts).unwrap());
    assert_eq!(y, typed_api::<f32>("gated-deltanet", &to_f32(&x), &opts));
    let (oracle, _) = m.state_oracle(&x, None).unwrap();
    let c = Tolerance::F32.compare(y.mapv(f64::from).view(), oracle.view());
    assert!(c.pass, "{c:?}");
}

#[test]
fn forms_and_options_reach_the_library() {
    // parallel form, a chunk of 16 and a scale: still the typed API's bits.
    let (_, x) = inputs("mamba2", &sizes(2, 37), 11);
    for opts in [Options::default().form(Form::Parallel), Options::default().chunk(16).scale(0.3)] {
        let y = candle_op("mamba2", &vars(&x, DType::F64), &opts).unwrap();
        assert_eq!(array::<f64>(&y), typed_api::<f64>("mamba2", &x, &opts), "{opts:?}");
    }
    // A window for attention.
    let (_, x) = inputs("attention", &sizes(1, 20), 12);
    let opts = Options::default().window(5);
    let y = candle_op("attention", &vars(&x, DType::F64), &opts).unwrap();
    assert_eq!(array::<f64>(&y), typed_api::<f64>("attention", &x, &opts));
}

#[test]
fn state_ops_equal_the_typed_state_api() {
    let sz = sizes(2, 65);
    for name in ["linear-attention", "mamba2", "gated-deltanet"] {
        let (m, x) = inputs(name, &sz, 5);
        let dims = mixers::core::mixer::complete_dims(m.as_ref(), &sz.dims());
        let s0 = m.random_state(&dims, 9).unwrap().remove("S").unwrap();
        let v = vars(&x, DType::F64);
        let s0c = tensor(&s0, DType::F64);
        let t = |n: &str| v[n].as_tensor();
        let opts = Options::default();
        let a4 = |n: &str| x[n].view().into_dimensionality::<mixers::ndarray::Ix4>().unwrap();
        let a3 = |n: &str| x[n].view().into_dimensionality::<mixers::ndarray::Ix3>().unwrap();
        let s0v = s0.view().into_dimensionality::<mixers::ndarray::Ix4>().unwrap();
        let ((y, s), (yr, sr)) = match name {
            "linear-attention" => (
                mixers_candle::ops::linear_attention_state(t("q"), t("k"), t("v"), Some(&s0c), &opts)
                    .unwrap(),
                ops::linear_attention_state(a4("q"), a4("k"), a4("v"), Some(s0v), &on_cpu(&opts)).unwrap(),
            ),
            "mamba2" => (
                mixers_candle::ops::mamba2_state(t("q"), t("k"), t("v"), t("g"), Some(&s0c), &opts).unwrap(),
                ops::mamba2_state(a4("q"), a4("k"), a4("v"), a3("g"), Some(s0v), &on_cpu(&opts)).unwrap(),
            ),
            _ => (
                mixers_candle::ops::gated_deltanet_state(
                    t("q"),
                    t("k"),
                    t("v"),
                    t("g"),
                    t("beta"),
                    Some(&s0c),
                    &opts,
                )
                .unwrap(),
                ops::gated_deltanet_state(
                    a4("q"),
                    a4("k"),
                    a4("v"),
                    a3("g"),
                    a3("beta"),
                    Some(s0v),
                    &on_cpu(&opts),
                )
                .unwrap(),
            ),
        };
        assert_eq!(array::<f64>(&y), yr.into_dyn(), "{name} y");
        assert_eq!(array::<f64>(&s), sr.into_dyn(), "{name} S_T");
        // And the state against the f64 reference.
        let (_, fin) = m.state_oracle(&x, Some(&[("S".to_string(), s0.clone())].into())).unwrap();
        let c = Tolerance::F64.compare(array::<f64>(&s).view(), fin["S"].view());
        assert!(c.pass, "{name}: {c:?}");
    }
}

#[test]
fn packed_batches_equal_the_typed_api() {
    let (_, x) = inputs("gated-deltanet", &sizes(1, 40), 21);
    let opts = Options::default().cu_seqlens(&[0, 1, 17, 17, 33]);
    let v = vars(&x, DType::F64);
    let y = candle_op("gated-deltanet", &v, &opts).unwrap();
    assert_eq!(array::<f64>(&y), typed_api::<f64>("gated-deltanet", &x, &opts));
    // With states: one row per sequence (4 sequences).
    let t = |n: &str| v[n].as_tensor();
    let (y, s) =
        mixers_candle::ops::gated_deltanet_state(t("q"), t("k"), t("v"), t("g"), t("beta"), None, &opts)
            .unwrap();
    let a4 = |n: &str| x[n].view().into_dimensionality::<mixers::ndarray::Ix4>().unwrap();
    let a3 = |n: &str| x[n].view().into_dimensionality::<mixers::ndarray::Ix3>().unwrap();
    let (yr, sr) =
        ops::gated_deltanet_state(a4("q"), a4("k"), a4("v"), a3("g"), a3("beta"), None, &on_cpu(&opts))
            .unwrap();
    assert_eq!(s.dims(), &[4, 2, 3, 5]);
    assert_eq!(array::<f64>(&y), yr.into_dyn());
    assert_eq!(array::<f64>(&s), sr.into_dyn());
}

#[test]
fn run_reaches_the_glr_and_the_toeplitz_mixer() {
    use mixers::ndarray::{Ix2, Ix3};
    let sz = sizes(2, 37);
    // Toeplitz, two heads, kernel width 2: against the typed API.
    let cfg = serde_json::json!({"heads": 2, "kernel_width": 2});
    let m = mixers::registry::mixer("toeplitz", &cfg).unwrap();
    let x = mixers::registry::grad_check::grad_inputs(m.as_ref(), &sz, 4).unwrap();
    let v = vars(&x, DType::F64);
    let named: Vec<(&str, &candle_core::Tensor)> =
        v.iter().map(|(k, t)| (k.as_str(), t.as_tensor())).collect();
    let y = mixers_candle::run("toeplitz", &cfg, &named, &Options::default()).unwrap();
    let want = ops::toeplitz(
        x["x"].view().into_dimensionality::<Ix3>().unwrap(),
        x["w"].view().into_dimensionality::<Ix3>().unwrap(),
        x.get("bias").map(|b| b.view().into_dimensionality::<Ix2>().unwrap()),
        &on_cpu(&Options::default()),
    )
    .unwrap();
    assert_eq!(array::<f64>(&y), want.into_dyn());
    // GLR with the `sq1` pattern: against the f64 oracle.
    let cfg = serde_json::json!({"pattern": "sq1"});
    let m = mixers::registry::mixer("glr", &cfg).unwrap();
    let x = mixers::registry::grad_check::grad_inputs(m.as_ref(), &sz, 5).unwrap();
    let v = vars(&x, DType::F64);
    let named: Vec<(&str, &candle_core::Tensor)> =
        v.iter().map(|(k, t)| (k.as_str(), t.as_tensor())).collect();
    let y = mixers_candle::run("glr", &cfg, &named, &Options::default()).unwrap();
    let oracle = mixers::registry::run::oracle(m.as_ref(), &x).unwrap();
    let c = Tolerance::F64.compare(array::<f64>(&y).view(), oracle.view());
    assert!(c.pass, "{c:?}");
}

#[test]
fn bf16_inputs_are_computed_in_f32_and_returned_in_bf16() {
    let (_, x) = inputs("mamba2", &sizes(1, 9), 2);
    let opts = Options::default();
    let y = candle_op("mamba2", &vars(&x, DType::BF16), &opts).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    // The same as f32 on the bf16-rounded values, rounded to bf16.
    let rounded: mixers::prelude::Tensors<f64> = vars(&x, DType::BF16)
        .iter()
        .map(|(k, t)| (k.clone(), array::<f64>(&t.to_dtype(DType::F64).unwrap())))
        .collect();
    let y32 = candle_op("mamba2", &vars(&rounded, DType::F32), &opts).unwrap();
    assert_eq!(
        array::<f32>(&y.to_dtype(DType::F32).unwrap()),
        array::<f32>(&y32.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap())
    );
}

#[test]
fn a_forward_without_gradients_equals_the_graph_forward_bit_for_bit() {
    // Plain CPU tensors take the detached path (no packed argument, no graph); variables the
    // custom op. Both must give the same bits: every typed mixer, three dtypes, states in and
    // out, a packed batch, and a mixer reached by `run` only.
    fn named<'a>(l: &'a [(&'a str, Tensor)]) -> Vec<(&'a str, &'a Tensor)> {
        l.iter().map(|(n, t)| (*n, t)).collect()
    }
    for (name, order) in TYPED {
        let (m, x) = inputs(name, &sizes(2, 65), 31);
        let dims = mixers::core::mixer::complete_dims(m.as_ref(), &sizes(2, 65).dims());
        let s0 = m.random_state(&dims, 4).ok();
        for dtype in [DType::F64, DType::F32, DType::BF16] {
            let v = vars(&x, dtype);
            let plain: Vec<(&str, Tensor)> = order.iter().map(|n| (*n, v[*n].as_tensor().detach())).collect();
            let graph: Vec<(&str, Tensor)> = order.iter().map(|n| (*n, v[*n].as_tensor().clone())).collect();
            assert!(plain.iter().all(|(_, t)| !t.track_op()) && graph.iter().all(|(_, t)| t.track_op()));
            let cfg = serde_json::json!({});
            let opts = Options::default();
            let y_plain = mixers_candle::run(name, &cfg, &named(&plain), &opts).unwrap();
            let y_graph = mixers_candle::run(name, &cfg, &named(&graph), &opts).unwrap();
            assert!(!y_plain.track_op() && y_graph.track_op(), "{name}: the plain call is off the graph");
            let bits = |t: &Tensor| array::<f64>(&t.to_dtype(DType::F64).unwrap());
            assert_eq!(bits(&y_plain), bits(&y_graph), "{name} {dtype:?}");
            if let Some(s0) = &s0 {
                let s: Vec<(String, Tensor)> =
                    s0.iter().map(|(k, a)| (k.clone(), tensor(a, dtype))).collect();
                let s_named: Vec<(&str, &Tensor)> = s.iter().map(|(k, t)| (k.as_str(), t)).collect();
                let s_var: Vec<(String, Tensor)> = s
                    .iter()
                    .map(|(k, t)| (k.clone(), Var::from_tensor(t).unwrap().as_tensor().clone()))
                    .collect();
                let s_var_named: Vec<(&str, &Tensor)> = s_var.iter().map(|(k, t)| (k.as_str(), t)).collect();
                let (yp, fp) =
                    mixers_candle::run_state(name, &cfg, &named(&plain), Some(&s_named), &opts).unwrap();
                let (yg, fg) =
                    mixers_candle::run_state(name, &cfg, &named(&graph), Some(&s_var_named), &opts).unwrap();
                assert_eq!(bits(&yp), bits(&yg), "{name} {dtype:?} from a state");
                if name == "attention" {
                    // The cache keeps the given capacity (not the inputs' T).
                    let k =
                        |l: &[(String, Tensor)]| l.iter().find(|(n, _)| n == "k").map(|(_, t)| t.dims()[1]);
                    assert_eq!(k(&fp), k(&s), "{dtype:?}: the final cache's capacity");
                }
                assert_eq!(fp.len(), fg.len());
                for ((np, tp), (ng, tg)) in fp.iter().zip(&fg) {
                    assert_eq!(np, ng);
                    assert_eq!(bits(tp), bits(tg), "{name} {dtype:?} final `{np}`");
                }
            }
        }
    }
    // A packed batch, with final states.
    let (_, x) = inputs("gated-deltanet", &sizes(1, 40), 22);
    let opts = Options::default().cu_seqlens(&[0, 1, 17, 17, 33]);
    let v = vars(&x, DType::F32);
    let order = ["q", "k", "v", "g", "beta"];
    let plain: Vec<Tensor> = order.iter().map(|n| v[*n].as_tensor().detach()).collect();
    let graph: Vec<Tensor> = order.iter().map(|n| v[*n].as_tensor().clone()).collect();
    let run = |l: &[Tensor]| {
        let named: Vec<(&str, &Tensor)> = order.iter().copied().zip(l).collect();
        mixers_candle::run_state("gated-deltanet", &serde_json::json!({}), &named, None, &opts).unwrap()
    };
    let ((yp, fp), (yg, fg)) = (run(&plain), run(&graph));
    assert_eq!(array::<f32>(&yp), array::<f32>(&yg));
    assert_eq!(array::<f32>(&fp[0].1), array::<f32>(&fg[0].1));
    assert_eq!(fp[0].1.dims(), &[4, 2, 3, 5]);
}
