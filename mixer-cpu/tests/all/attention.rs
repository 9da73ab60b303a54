//! Registry-wide tests of softmax attention (docs/math.md §1.3) on CPU: every form against the f64
//! oracle in f64 and f32, decode = fast = parallel at every prefix, the KV-cache size, the
//! sparsity of the materialization, and configuration/shape errors.

use super::{cpu, suite_on};
use mixer_core::metrics::CommGraph;
use mixer_core::mixer::run_decoder;
use mixer_core::{AnyTensors, Dims, Form, Tolerance};
use mixer_registry::harness::{Sizes, check};
use mixer_registry::mixer;
use mixer_registry::run::{decoder, run};
use ndarray::ArrayD;
use serde_json::json;

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
    let cpu = [cpu()];
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

/// The fast form's tiles (64 queries × 128 keys, queries padded to 32 lanes) at lengths that
/// are no multiple of either, with head sizes like a model's (Dk = 64, Dv = 40) and windows
/// whose edge cuts through tiles: every form against the f64 oracle in f64 and f32.
#[test]
fn fast_form_across_tile_boundaries() {
    let cpu = [cpu()];
    for (i, (cfg, t)) in
        [(json!({}), 331usize), (json!({"window": 150}), 331), (json!({"window": 64, "scale": -0.2}), 203)]
            .into_iter()
            .enumerate()
    {
        let m = mixer("attention", &cfg).unwrap();
        let sizes = Sizes { batch: 1, seq: t, heads: 2, dk: 64, dv: 40, ..Sizes::default() };
        let rows = check(m.as_ref(), &cpu, &sizes, 90 + i as u64);
        assert_eq!(rows.len(), 6, "{rows:?}");
        for r in rows {
            assert!(r.pass, "{cfg} T={t}: {r:?}");
        }
    }
}

/// The fused AVX-512 kernel of the fast form (f32, Dv ≤ 64; 96-query blocks of 6-query
/// micro-tiles, 64-key blocks, keys and values packed from the `[B,T,H,D]` inputs) at lengths
/// that are no multiple of any of these, several batch rows and heads (the packing's
/// indexing), value widths that fill 1, 3 and 4 registers and one past the kernel (Dv = 65,
/// the faer path), windows that cut micro-tiles and blocks, and a negative scale: every form
/// against the f64 oracle in f64 and f32 (on CPUs without AVX-512 the same cases check the
/// faer path). The same cases check the decoder's AVX-512 step at every token (groups of 16
/// keys, a ring of odd length that wraps, key widths with a masked tail (13, 17), value
/// widths past 64 (65: a second column pass of one lane)), and a large scale (40: weights
/// down to e⁻⁴⁰ and below).
#[test]
fn fused_kernel_across_blocks_heads_and_widths() {
    let cpu = [cpu()];
    let cases = [
        (json!({}), 389usize, 64usize, 64usize),
        (json!({"window": 100}), 389, 64, 48),
        (json!({"window": 7, "scale": -0.3}), 211, 32, 16),
        (json!({"scale": 2.5}), 97, 13, 64),
        (json!({"window": 250}), 301, 64, 65),
        (json!({"window": 37, "scale": 40.0}), 150, 17, 65),
    ];
    for (i, (cfg, t, dk, dv)) in cases.into_iter().enumerate() {
        let m = mixer("attention", &cfg).unwrap();
        let sizes = Sizes { batch: 2, seq: t, heads: 3, dk, dv, ..Sizes::default() };
        let rows = check(m.as_ref(), &cpu, &sizes, 120 + i as u64);
        assert_eq!(rows.len(), 6, "{rows:?}");
        for r in rows {
            assert!(r.pass, "{cfg} T={t} Dk={dk} Dv={dv}: {r:?}");
        }
    }
}

/// The shared backend suite on every configuration here, at T = 150 (several 64-key
/// blocks, not a multiple of one): decode = fast at every prefix, the KV-cache formula, f32
/// against f64, error paths.
#[test]
fn shared_suite_on_every_config() {
    let sizes = Sizes { batch: 2, seq: 150, channels: 1, heads: 2, dk: 3, dv: 2 };
    let n = suite_on(configs(), &sizes);
    assert!(n >= 10 * configs().len(), "{n} cases");
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
            decoder::<f32>(m.as_ref(), &cpu(), &mixer_core::tensor::cast_tensors(&inp), &dims).unwrap();
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
    let e = run(m.as_ref(), &cpu(), Form::Fast, &AnyTensors::F64(inp)).unwrap_err().to_string();
    assert!(e.contains("`k`") && e.contains("Dk=3") && e.contains("[1, 6, 2, 4]"), "{e}");
    // T = 1: every form returns v.
    let dims: Dims = [("B", 2), ("T", 1), ("H", 1), ("Dk", 2), ("Dv", 2)].into_iter().collect();
    let inp = m.random_inputs(&dims, 0).unwrap();
    for form in [Form::Parallel, Form::Fast, Form::Recurrent] {
        let y = run(m.as_ref(), &cpu(), form, &AnyTensors::F64(inp.clone())).unwrap().to_f64();
        let c = Tolerance::F64.compare(y.view(), inp["v"].view());
        assert!(c.pass, "T = 1 returns v: {c:?}");
    }
}

/// Issue 14: f32 queries and keys near 1e19 (q·k ≈ 1e38·Dk overflows f32) and a scale of
/// 1e308 used to give NaN in the fast, parallel and recurrent forms. Every form must now
/// agree with the materialized oracle and be finite.
#[test]
fn huge_logits_do_not_overflow() {
    let t_len = 13;
    let (bn, hn, dk, dv) = (2, 2, 3, 2);
    let shape = |d: usize| ndarray::IxDyn(&[bn, t_len, hn, d]);
    // Multiples of 1/8 times a power of two: exact in f32, so the f32 forms see the same
    // inputs (and the same ties between dot products) as the f64 oracle.
    let val = |i: &ndarray::IxDyn, salt: usize| {
        let h = (i[0] * 31 + i[1] * 17 + i[2] * 7 + i[3] * 3 + salt * 11) % 13;
        h as f64 / 8.0 - 0.75
    };
    // ≈ 9.2e18: each term of q·k is near 1e38, and f32 attention used to overflow.
    let big = 2f64.powi(63);
    for (cfg, mag) in [
        (json!({}), big),
        (json!({"scale": 1e308}), 1.0),
        (json!({"window": 4, "scale": -1e300}), 4.0),
        (json!({"window": 5}), big),
    ] {
        let m = mixer("attention", &cfg).unwrap();
        let mut x = mixer_core::Tensors::<f64>::new();
        x.insert("q".into(), ArrayD::from_shape_fn(shape(dk), |i| mag * val(&i, 1)));
        x.insert("k".into(), ArrayD::from_shape_fn(shape(dk), |i| mag * val(&i, 2)));
        x.insert("v".into(), ArrayD::from_shape_fn(shape(dv), |i| val(&i, 3)));
        let want = mixer_registry::run::oracle(m.as_ref(), &x).unwrap();
        assert!(want.iter().all(|y| y.is_finite()));
        for form in [Form::Parallel, Form::Fast, Form::Recurrent] {
            for dtype in [mixer_core::DType::F32, mixer_core::DType::F64] {
                let y = mixer_registry::run::run_as(m.as_ref(), &crate::cpu(), form, &x, dtype)
                    .unwrap_or_else(|e| panic!("{cfg} {form} {dtype:?}: {e}"));
                let c = Tolerance::for_dtype(dtype.name()).compare(y.view(), want.view());
                assert!(c.pass, "{cfg} {form} {dtype:?}: {c:?}");
            }
        }
    }
    // Dk = 1 and entries near 2^64: every f32 q·k is finite (up to ≈ 1.9e38), but the range
    // max u − min u of a row overflows f32, while with σ = 1e-38 the logits are of order 1 and
    // every weight counts (the decoder's f32 step declines such a row).
    let m = mixer("attention", &json!({"scale": 1e-38})).unwrap();
    let shape1 = |d: usize| ndarray::IxDyn(&[1, t_len, 1, d]);
    let mut x = mixer_core::Tensors::<f64>::new();
    x.insert("q".into(), ArrayD::from_shape_fn(shape1(1), |i| 2f64.powi(64) * val(&i, 1)));
    x.insert("k".into(), ArrayD::from_shape_fn(shape1(1), |i| 2f64.powi(64) * val(&i, 2)));
    x.insert("v".into(), ArrayD::from_shape_fn(shape1(dv), |i| val(&i, 3)));
    let want = mixer_registry::run::oracle(m.as_ref(), &x).unwrap();
    for form in [Form::Parallel, Form::Fast, Form::Recurrent] {
        let y =
            mixer_registry::run::run_as(m.as_ref(), &crate::cpu(), form, &x, mixer_core::DType::F32).unwrap();
        let c = Tolerance::for_dtype("f32").compare(y.view(), want.view());
        assert!(c.pass, "Dk = 1, entries near 2^64, {form}: {c:?}");
    }
    // f64 inputs whose dot products overflow even f64 have no finite logits: a clear error.
    let m = mixer("attention", &json!({})).unwrap();
    let mut x = mixer_core::Tensors::<f64>::new();
    x.insert("q".into(), ArrayD::from_elem(shape(dk), 1e200));
    x.insert("k".into(), ArrayD::from_elem(shape(dk), 1e200));
    x.insert("v".into(), ArrayD::from_elem(shape(dv), 1.0));
    for form in [Form::Materialized, Form::Parallel, Form::Fast, Form::Recurrent] {
        let e = run(m.as_ref(), &crate::cpu(), form, &AnyTensors::F64(x.clone())).unwrap_err().to_string();
        assert!(e.contains("overflows f64") && e.contains("q_0·k_0"), "{form}: {e}");
    }
}

/// `fast_from` (the fast form from row `r` on, what a run from a KV cache of `r` rows uses) gives
/// `fast`'s rows from `r` on bit for bit, at cuts inside, at and around query blocks, f32 (the
/// fused kernel where the CPU has it) and f64, causal and windowed.
#[test]
fn the_fast_form_from_a_row_gives_the_fast_rows() {
    use mixer_core::mixers::attention::Attention;
    use mixer_cpu::attention::fast::{fast, fast_from};
    for cfg in [json!({"scale": 0.4}), json!({"window": 37})] {
        let m = mixer("attention", &cfg).unwrap();
        let a = mixer_core::mixer::downcast::<Attention>(m.as_ref(), "test").unwrap();
        let dims: Dims = [("B", 2), ("T", 300), ("H", 2), ("Dk", 16), ("Dv", 16)].into_iter().collect();
        let x = m.random_inputs(&dims, 9).unwrap();
        let x32 = mixer_core::tensor::cast_tensors::<f32>(&x);
        let (want64, want32) = (fast(a, &x).unwrap(), fast(a, &x32).unwrap());
        for r in [0, 1, 63, 64, 65, 96, 97, 150, 299, 300] {
            let tail = |y: &ArrayD<f64>| y.slice_axis(ndarray::Axis(1), ndarray::Slice::from(r..)).to_owned();
            let tail32 =
                |y: &ArrayD<f32>| y.slice_axis(ndarray::Axis(1), ndarray::Slice::from(r..)).to_owned();
            assert_eq!(tail(&fast_from(a, &x, r).unwrap()), tail(&want64), "{cfg} f64 from {r}");
            assert_eq!(tail32(&fast_from(a, &x32, r).unwrap()), tail32(&want32), "{cfg} f32 from {r}");
        }
    }
}

/// `vjp_from` (the backward of a run from a KV cache of `r` rows, on its extension, whose `dy` is
/// zero before `r`) gives `vjp`'s `d_k`, `d_v` and the rows of `d_q` from `r` on bit for bit.
#[test]
fn the_backward_from_a_row_gives_the_backward() {
    use mixer_core::Requires;
    use mixer_core::mixers::attention::Attention;
    use mixer_cpu::attention::backward::{vjp, vjp_from};
    for cfg in [json!({"scale": 0.4}), json!({"window": 37})] {
        let m = mixer("attention", &cfg).unwrap();
        let a = mixer_core::mixer::downcast::<Attention>(m.as_ref(), "test").unwrap();
        let dims: Dims = [("B", 2), ("T", 200), ("H", 2), ("Dk", 8), ("Dv", 8)].into_iter().collect();
        let x = m.random_inputs(&dims, 9).unwrap();
        for r in [0, 1, 63, 64, 65, 130, 199] {
            let dy = ArrayD::from_shape_fn(x["v"].raw_dim(), |i| {
                if i[1] < r { 0.0 } else { ((i[1] + 3 * i[3]) as f64).sin() }
            });
            let (want, got) =
                (vjp(a, &x, &dy, &Requires::All).unwrap(), vjp_from(a, &x, &dy, &Requires::All, r).unwrap());
            assert_eq!(got["d_k"], want["d_k"], "{cfg} d_k from {r}");
            assert_eq!(got["d_v"], want["d_v"], "{cfg} d_v from {r}");
            let tail = |g: &ArrayD<f64>| g.slice_axis(ndarray::Axis(1), ndarray::Slice::from(r..)).to_owned();
            assert_eq!(tail(&got["d_q"]), tail(&want["d_q"]), "{cfg} d_q from {r}");
        }
    }
}
