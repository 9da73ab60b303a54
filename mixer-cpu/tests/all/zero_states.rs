//! States that are zero by value in the `fast` backward of the log-linear mixers: a live Fenwick
//! level of an initial state that holds zeros (its gradient does not depend on its value), and
//! chunks whose values are all zero (their chunk state is zero, yet `v̄` of their tokens collects
//! every later read). Both were dropped by the chunked sweep once (the first gave a zero initial
//! state's gradient from positions on a chunk boundary, the second wrong `v̄`).

use mixer_core::mixer::complete_dims;
use mixer_core::mixers::loglinear::lift_state::at_positions;
use mixer_core::{AnyTensors, Dims, Form, Requires, Tensor, Tolerance};
use mixer_registry::backward::backward;
use mixer_registry::state::backward_state;
use mixer_registry::{Backend, mixer};
use ndarray::ArrayD;

/// The lifts from a level state at positions on a chunk boundary (64, 4096) and off one, with
/// every slot zero except at the random state's own position bits (so the live slots at the
/// position hold zeros): the initial state's gradient of the `fast` backward against the literal
/// recurrence's reverse mode (`state_oracle_vjp`).
#[test]
fn a_zero_live_level_keeps_its_gradient() {
    let cpu = Backend::by_name("cpu").unwrap();
    for name in ["loglinear-attention", "loglinear-mamba2", "loglinear-gated-deltanet"] {
        let m = mixer(name, &serde_json::json!({"scale": 0.8})).unwrap();
        for (a, t) in [(64usize, 65usize), (4096, 64), (4095, 70), (128, 10)] {
            let d: Dims =
                [("B", 1), ("T", t), ("H", 2), ("Dk", 8), ("Dv", 6), ("L", 14)].into_iter().collect();
            let x = m.random_inputs(&d, 3).unwrap();
            let mut s = m.random_state(&d, 4).unwrap();
            at_positions(&mut s, &[a]).unwrap();
            s.get_mut("S").unwrap().slice_mut(ndarray::s![.., .., ..6, .., ..]).fill(0.0);
            let (y, f) = m.state_oracle(&x, Some(&s)).unwrap();
            let dy = y.mapv(|v| (2.3 * v + 0.4).sin());
            let df: mixer_core::Tensors<f64> =
                f.iter().map(|(k, v)| (k.clone(), v.mapv(|e| (1.3 * e).cos()))).collect();
            let (want_g, want_s) = m.state_oracle_vjp(&x, Some(&s), &dy, Some(&df), &Requires::All).unwrap();
            let (g, ds) =
                backward_state(m.as_ref(), &cpu, Form::Fast, &x, Some(&s), &dy, Some(&df), &Requires::All)
                    .unwrap();
            let c = Tolerance::F64.compare_grad(ds["S"].view(), want_s["S"].view());
            assert!(c.pass, "{name} from {a}, T = {t}: the initial state's gradient {c:?}");
            for (k, w) in &want_g {
                let c = Tolerance::F64.compare_grad(g[k].view(), w.view());
                assert!(c.pass, "{name} from {a}, T = {t}: {k} {c:?}");
            }
        }
    }
}

/// Mamba-2, gated DeltaNet and the lifts with `v = 0` on the first two chunks of 64 tokens: every
/// gradient of the `fast` backward against the materialized backward.
#[test]
fn chunks_with_zero_values_keep_their_gradients() {
    for name in ["mamba2", "gated-deltanet", "loglinear-mamba2", "loglinear-gated-deltanet"] {
        let m = mixer(name, &serde_json::json!({})).unwrap();
        let d: Dims = [("B", 1), ("T", 300), ("H", 1), ("Dk", 8), ("Dv", 6), ("L", 10)].into_iter().collect();
        let d = complete_dims(m.as_ref(), &d);
        let mut x = m.random_inputs(&d, 3).unwrap();
        x.get_mut("v").unwrap().slice_mut(ndarray::s![.., 0..128, .., ..]).fill(0.0);
        let dy = ArrayD::from_shape_fn(x["v"].raw_dim(), |i| ((i[1] * 7 + i[3]) % 5) as f64 / 2.0 - 1.0);
        let run = |form| {
            backward(
                m.as_ref(),
                "cpu",
                form,
                &AnyTensors::F64(x.clone()),
                &Tensor::F64(dy.clone()),
                &Requires::All,
            )
            .unwrap()
        };
        let (fast, want) = (run(Form::Fast), run(Form::Materialized));
        for (k, w) in &want {
            let c = Tolerance::F64.compare_grad(fast[k].to_f64().view(), w.to_f64().view());
            assert!(c.pass, "{name}: {k} {c:?}");
        }
    }
}
