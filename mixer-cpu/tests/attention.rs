//! Registry-wide tests of softmax attention (docs/math.md §1.3) on CPU: every form against the f64
//! oracle in f64 and f32, decode = fast = parallel at every prefix, the KV-cache size, the
//! sparsity of the materialization, and configuration/shape errors.

use mixer_core::metrics::CommGraph;
use mixer_core::mixer::{complete_dims, run_decoder};
use mixer_core::tensor::prefix;
use mixer_core::{AnyTensors, Dims, Form, Tolerance};
use mixer_registry::harness::{Sizes, check};
use mixer_registry::run::{decoder, run};
use mixer_registry::{Backend, mixer};
use ndarray::{ArrayD, Axis, Slice};
use serde_json::json;

use mixer_cpu as _;

fn configs() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        ("attention", json!({})),
        ("attention", json!({"window": 9, "scale": 0.3})),
        ("attention", json!({"window": 1})),
        ("local-attention", json!({})),
        ("local-attention", json!({"window": 5})),
        ("local-attention", json!({"window": 70})),
    ]
}

#[test]
fn every_form_matches_the_oracle() {
    let cpu = [Backend::by_name("cpu").unwrap()];
    for (name, cfg) in configs() {
        let m = mixer(name, &cfg).unwrap();
        for (i, &t) in [1usize, 2, 7, 64, 100, 257].iter().enumerate() {
            let (batch, heads, dk, dv) =
                [(1, 2, 5, 3), (2, 1, 3, 4), (3, 2, 1, 2), (1, 3, 4, 4), (2, 1, 7, 3)][i % 5];
            let sizes = Sizes { batch, seq: t, heads, dk, dv, ..Sizes::default() };
            let rows = check(m.as_ref(), &cpu, &sizes, 40 + i as u64);
            // parallel, fast, recurrent × f64, f32.
            assert_eq!(rows.len(), 6, "{rows:?}");
            for r in rows {
                assert!(r.pass, "{name} {cfg} T={t}: {r:?}");
            }
        }
    }
}

#[test]
fn decode_equals_fast_at_every_prefix() {
    for (name, cfg) in configs() {
        let m = mixer(name, &cfg).unwrap();
        let t_len = 150; // crosses several 64-blocks, not a multiple of one
        let dims: Dims = [("B", 2), ("T", t_len), ("H", 2), ("Dk", 3), ("Dv", 2)].into_iter().collect();
        let dims = complete_dims(m.as_ref(), &dims);
        let inp = m.random_inputs(&dims, 5).unwrap();
        let mut dec = decoder::<f64>(m.as_ref(), "cpu", &inp, &dims).unwrap();
        let yd = run_decoder(dec.as_mut(), &m.spec(), &inp, |_, _| {}).unwrap();
        let names: Vec<String> = inp.keys().cloned().collect();
        for len in (1..=t_len).filter(|l| *l < 70 || l % 7 == 0 || *l == t_len) {
            let p = AnyTensors::F64(prefix(&inp, &names, len));
            let want = yd.slice_axis(Axis(1), Slice::from(0..len));
            for form in [Form::Fast, Form::Parallel] {
                let y = run(m.as_ref(), "cpu", form, &p).unwrap().to_f64();
                let c = Tolerance::F64.compare(y.view(), want.view());
                assert!(c.pass, "{name} {cfg} {form} prefix {len}: {c:?}");
            }
        }
    }
}

#[test]
fn kv_cache_is_the_window() {
    for (name, cfg, w) in [
        ("local-attention", json!({"window": 5}), 5usize),
        ("local-attention", json!({}), 64),
        ("attention", json!({}), usize::MAX),
    ] {
        let m = mixer(name, &cfg).unwrap();
        let dims: Dims = [("B", 1), ("T", 100), ("H", 2), ("Dk", 3), ("Dv", 4)].into_iter().collect();
        let inp = m.random_inputs(&dims, 1).unwrap();
        let mut dec =
            decoder::<f32>(m.as_ref(), "cpu", &mixer_core::tensor::cast_tensors(&inp), &dims).unwrap();
        run_decoder(dec.as_mut(), &m.spec(), &mixer_core::tensor::cast_tensors(&inp), |t, e| {
            assert_eq!(e, (t + 1).min(w) * 2 * 7, "{name} t = {t}");
        })
        .unwrap();
    }
}

#[test]
fn materialized_sparsity() {
    let dims: Dims = [("B", 1), ("T", 40), ("H", 1), ("Dk", 2), ("Dv", 1)].into_iter().collect();
    for (name, cfg, unreachable) in
        [("attention", json!({}), 0usize), ("local-attention", json!({"window": 6}), 35 * 34 / 2)]
    {
        let m = mixer(name, &cfg).unwrap();
        let mat = m.materialize(&m.random_inputs(&dims, 2).unwrap()).unwrap();
        let g = CommGraph::from_dense(mat.blocks[0].terms[0].a.view(), None).unwrap();
        let st = g.shortest_paths();
        assert_eq!(st.unreachable, unreachable, "{name}");
        assert_eq!(st.histogram.len(), 2, "{name}: one hop or none");
        if unreachable == 0 {
            assert_eq!(st.max, Some(1));
            assert_eq!(g.congestion().value, 1);
        } else {
            assert_eq!(st.max, None);
        }
    }
}

#[test]
fn errors() {
    let e = mixer("local-attention", &json!({"window": 0})).unwrap_err().to_string();
    assert!(e.contains("window must be ≥ 1") && e.contains("got 0"), "{e}");
    let e = mixer("attention", &json!({"scale": "big"})).unwrap_err().to_string();
    assert!(e.contains("invalid type"), "{e}");
    let m = mixer("attention", &json!({})).unwrap();
    let dims: Dims = [("B", 1), ("T", 6), ("H", 2), ("Dk", 3), ("Dv", 4)].into_iter().collect();
    let mut inp = m.random_inputs(&dims, 0).unwrap();
    inp.insert("k".into(), ArrayD::zeros(ndarray::IxDyn(&[1, 6, 2, 4])));
    let e = run(m.as_ref(), "cpu", Form::Fast, &AnyTensors::F64(inp)).unwrap_err().to_string();
    assert!(e.contains("`k`") && e.contains("Dk=3") && e.contains("[1, 6, 2, 4]"), "{e}");
    // T = 1: every form returns v.
    let dims: Dims = [("B", 2), ("T", 1), ("H", 1), ("Dk", 2), ("Dv", 2)].into_iter().collect();
    let inp = m.random_inputs(&dims, 0).unwrap();
    for form in [Form::Parallel, Form::Fast, Form::Recurrent] {
        let y = run(m.as_ref(), "cpu", form, &AnyTensors::F64(inp.clone())).unwrap().to_f64();
        let c = Tolerance::F64.compare(y.view(), inp["v"].view());
        assert!(c.pass, "T = 1 returns v: {c:?}");
    }
}
