//! Registry-wide tests of the GLR family (docs/math.md §1.1, §1.2, §1.4) on CPU: every mixer × form
//! against the f64 oracle in f64 and f32, decode = fast at every prefix, closed-form shortest
//! paths of the materialized sparsity, the lattice invariant for every registered pattern,
//! measured decoder cache sizes, and configuration errors.

use super::{cpu, suite_on};
use mixer_core::metrics::{CommGraph, shift_distances};
use mixer_core::mixer::{complete_dims, run_decoder};
use mixer_core::mixers::glr::Glr;
use mixer_core::pattern::Pattern;
use mixer_core::{AnyTensors, Dims, Error, Form, Tensors};
use mixer_registry::harness::{Sizes, check};
use mixer_registry::run::{decoder, run};
use mixer_registry::{PATTERNS, PatternEntry, mixer, register};
use ndarray::ArrayD;
use serde_json::json;

/// A plugin-style pattern registered from this test: `f(k) = C(k+1, 2) + 1` = 1, 2, 4, 7, 11, …
fn tri1(k: usize) -> u64 {
    let k = k as u64;
    k.saturating_mul(k + 1) / 2 + 1
}
#[register]
static TRI1: PatternEntry =
    PatternEntry { name: "test-tri1", doc: "test plugin: k(k+1)/2 + 1", offset: tri1 };

/// A pattern with f(0) = 2: fine translation-invariant, rejected by the lattice.
fn plus2(k: usize) -> u64 {
    (k as u64).saturating_add(2)
}
#[register]
static PLUS2: PatternEntry = PatternEntry { name: "test-plus2", doc: "test: k + 2", offset: plus2 };

fn configs() -> Vec<(&'static str, serde_json::Value)> {
    let mut v = Vec::new();
    for pattern in ["pow2", "sq1", "linear", "test-tri1"] {
        for ce in [false, true] {
            for on in ["b", "a", "both"] {
                let order = if pattern == "linear" { json!(3) } else { json!(null) };
                v.push(("glr", json!({"pattern": pattern, "cache_efficient": ce, "order": order, "on": on})));
            }
        }
    }
    v.push(("glr", json!({"pattern": "sq1", "order": 2, "cache_efficient": true})));
    v.push(("glr", json!({"pattern": "test-plus2"})));
    v.push(("glr", json!({"pattern": "test-plus2", "on": "both"})));
    v.push(("diagonal-ssm", json!({})));
    v.push(("diagonal-ssm", json!({"on": "a"})));
    v.push(("kth-order", json!({})));
    v.push(("kth-order", json!({"order": 5, "on": "both"})));
    v.push(("dense-recurrence", json!({})));
    v.push(("dense-recurrence", json!({"on": "both"})));
    v
}

const TS: [usize; 6] = [1, 2, 7, 64, 100, 257];

fn sizes(t: usize, i: usize) -> Sizes {
    // Vary batch and channels with the length (several C and B, none a power of two beyond 2).
    let (batch, channels) = [(1, 3), (2, 5), (3, 1), (1, 7), (2, 2), (1, 3)][i % 6];
    Sizes { batch, seq: t, channels, ..Sizes::default() }
}

#[test]
fn every_form_matches_the_oracle() {
    let cpu = [cpu()];
    let mut n = 0;
    for (name, cfg) in configs() {
        let m = mixer(name, &cfg).unwrap();
        for (i, &t) in TS.iter().enumerate() {
            let rows = check(m.as_ref(), &cpu, &sizes(t, i), 100 + i as u64);
            // fast + recurrent, in f64 and f32.
            assert_eq!(rows.len(), 4, "{name} {cfg}: {rows:?}");
            for r in rows {
                assert!(r.pass, "{name} {cfg} T={t}: {r:?}");
                n += 1;
            }
        }
    }
    assert!(n > 400);
}

/// The shared backend suite on every configuration here (prefixes cut the slot axes too,
/// `Glr::prefix`), at T = 45.
#[test]
fn shared_suite_on_every_config() {
    let sizes = Sizes { batch: 2, seq: 45, channels: 3, ..Sizes::default() };
    let n = suite_on(configs(), &sizes);
    assert!(n >= 10 * configs().len(), "{n} cases");
}

fn materialized_paths(name: &str, cfg: serde_json::Value, t_len: usize) -> mixer_core::metrics::PathStats {
    let m = mixer(name, &cfg).unwrap();
    let dims: Dims = [("B", 1), ("T", t_len), ("C", 1)].into_iter().collect();
    let inp = m.random_inputs(&dims, 3).unwrap();
    let mat = m.materialize(&inp).unwrap();
    let blk = &mat.blocks[0];
    let g = CommGraph::from_dense(blk.terms[0].a.view(), blk.b.as_ref().map(|b| b.view())).unwrap();
    g.shortest_paths()
}

/// Histogram over pairs s < t < T of a shift function d(t − s).
fn pair_histogram(t_len: usize, d: impl Fn(usize) -> usize) -> Vec<usize> {
    let mut h = Vec::new();
    for delta in 1..t_len {
        let v = d(delta);
        if h.len() <= v {
            h.resize(v + 1, 0);
        }
        h[v] += t_len - delta;
    }
    h
}

#[test]
fn closed_form_paths_of_the_materialized_sparsity() {
    let t_len = 300;
    // pow2: popcount(t − s).
    let st = materialized_paths("glr", json!({"pattern": "pow2"}), t_len);
    assert_eq!(st.histogram, pair_histogram(t_len, |d| d.count_ones() as usize));
    assert_eq!(st.max, Some(8)); // 255 = 0b11111111
    // order k: ⌈(t − s)/k⌉.
    for k in [1usize, 2, 3, 8] {
        let st = materialized_paths("kth-order", json!({"order": k}), t_len);
        assert_eq!(st.histogram, pair_histogram(t_len, |d| d.div_ceil(k)), "k = {k}");
    }
    let st = materialized_paths("diagonal-ssm", json!({}), 50);
    assert_eq!(st.max, Some(49));
    // dense: 1.
    let st = materialized_paths("dense-recurrence", json!({}), 120);
    assert_eq!(st.max, Some(1));
    // sq1: ≤ 4, and equal to the pattern's shift distances.
    let st = materialized_paths("glr", json!({"pattern": "sq1"}), t_len);
    assert!(st.max.unwrap() <= 4, "{st:?}");
    let m = mixer("glr", &json!({"pattern": "sq1"})).unwrap();
    let g = mixer_core::mixer::downcast::<Glr>(m.as_ref(), "test").unwrap();
    let sd = shift_distances(g.pattern(), t_len);
    assert_eq!(st.histogram, pair_histogram(t_len, |d| sd[d].unwrap()));
    // sq1 up to T = 20000 (Lagrange: four squares), on the mixer's own pattern.
    let sd = shift_distances(g.pattern(), 20000);
    assert!(sd[1..].iter().all(|d| d.is_some_and(|d| d <= 4)));
    assert!(sd[1..].contains(&Some(4)));
    // on = "a": A edges do not chain; pow2 reaches exactly the single-offset shifts.
    let st = materialized_paths("glr", json!({"pattern": "pow2", "on": "a"}), 64);
    assert_eq!(st.histogram[1], (0..6).map(|k| 64 - (1 << k)).sum::<usize>());
    assert!(st.max.is_none());
}

#[test]
fn lattice_invariant_for_every_registered_pattern() {
    let mut checked = 0;
    for e in PATTERNS.iter() {
        for order in [None, Some(1), Some(4)] {
            match Pattern::new(e.name, e.offset, order, true) {
                Ok(p) => {
                    p.check_lattice_invariant(2500).unwrap();
                    checked += 1;
                }
                Err(err) => {
                    assert_ne!((e.offset)(0), 1, "{}: {err}", e.name);
                    assert!(err.to_string().contains("needs f(0) = 1"), "{err}");
                }
            }
            Pattern::new(e.name, e.offset, order, false).unwrap().check_lattice_invariant(2500).unwrap();
        }
    }
    assert!(checked >= 12, "{checked}");
}

/// Runs the decoder of `cfg` at length T (B = C = 1) and returns the largest number of cached
/// positions seen, checking that after token t the cache holds exactly |P_{t+1}| positions
/// (none after the last token: nothing reads them).
fn max_cached_positions(cfg: serde_json::Value, t_len: usize) -> usize {
    let m = mixer("glr", &cfg).unwrap();
    let g = mixer_core::mixer::downcast::<Glr>(m.as_ref(), "test").unwrap();
    let dims: Dims = [("B", 1), ("T", t_len), ("C", 1)].into_iter().collect();
    let dims = complete_dims(m.as_ref(), &dims);
    let inp = m.random_inputs(&dims, 1).unwrap();
    let slots = g.slots(t_len);
    let mut dec = decoder::<f64>(m.as_ref(), &cpu(), &inp, &dims).unwrap();
    let mut most = 0;
    run_decoder(dec.as_mut(), &m.spec(), &inp, |t, elems| {
        let mut p: Vec<usize> = (0..slots.active(t + 1)).map(|k| slots.pos(t + 1, k)).collect();
        p.sort_unstable();
        p.dedup();
        let want = if t + 1 == t_len { 0 } else { p.len() };
        assert_eq!(elems, want, "t = {t}");
        most = most.max(elems);
    })
    .unwrap();
    most
}

#[test]
fn measured_cache_sizes() {
    for t in [2usize, 7, 100, 257, 1000, 4096, 5000] {
        let c = max_cached_positions(json!({"pattern": "pow2", "cache_efficient": true}), t);
        assert!(c <= t.ilog2() as usize + 1, "T = {t}: {c}");
    }
    // sq1 lattice: cache grows like √T. Fit log c = a + b log T (least squares, inline).
    let ts = [256usize, 1024, 4096, 16384];
    let cs: Vec<usize> = ts
        .iter()
        .map(|&t| max_cached_positions(json!({"pattern": "sq1", "cache_efficient": true}), t))
        .collect();
    let lx: Vec<f64> = ts.iter().map(|&t| (t as f64).ln()).collect();
    let ly: Vec<f64> = cs.iter().map(|&c| (c as f64).ln()).collect();
    let (mx, my) = (lx.iter().sum::<f64>() / 4.0, ly.iter().sum::<f64>() / 4.0);
    let sxy: f64 = lx.iter().zip(&ly).map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = lx.iter().map(|x| (x - mx).powi(2)).sum();
    let exponent = sxy / sxx;
    eprintln!("sq1 cache-efficient: T = {ts:?}, positions = {cs:?}, fitted exponent {exponent:.3}");
    assert!((0.4..0.6).contains(&exponent), "exponent {exponent}, caches {cs:?}");
    // Translation-invariant: the decoder keeps the last f(K−1) tokens (none after the last).
    let m = mixer("glr", &json!({"pattern": "pow2"})).unwrap();
    let dims = complete_dims(m.as_ref(), &[("B", 2), ("T", 100), ("C", 3)].into_iter().collect());
    let inp = m.random_inputs(&dims, 1).unwrap();
    let mut dec = decoder::<f64>(m.as_ref(), &cpu(), &inp, &dims).unwrap();
    let mut most = 0;
    run_decoder(dec.as_mut(), &m.spec(), &inp, |t, e| {
        assert_eq!(e, if t + 1 == 100 { 0 } else { (t + 1).min(64) * 6 }, "t = {t}");
        most = most.max(e);
    })
    .unwrap();
    assert_eq!(most, 64 * 6);
    // on = "both" keeps x and y.
    let m = mixer("kth-order", &json!({"order": 4, "on": "both"})).unwrap();
    let dims = complete_dims(m.as_ref(), &[("B", 1), ("T", 30), ("C", 2)].into_iter().collect());
    let inp = m.random_inputs(&dims, 1).unwrap();
    let mut dec = decoder::<f64>(m.as_ref(), &cpu(), &inp, &dims).unwrap();
    let mut most = 0;
    run_decoder(dec.as_mut(), &m.spec(), &inp, |_, e| most = most.max(e)).unwrap();
    assert_eq!(most, 4 * 2 * 2);
    // Past the declared length: an error, not a panic.
    let tok = mixer_core::tensor::token_slice(&inp, &m.spec().per_token(), 0);
    assert!(matches!(dec.step(&tok), Err(Error::Decoder(_))));
}

#[test]
fn bad_configs_and_inputs_give_clear_errors() {
    let e = mixer("glr", &json!({"pattern": "pow3"})).unwrap_err().to_string();
    assert!(e.contains("unknown pattern `pow3`") && e.contains("did you mean `pow2`"), "{e}");
    let e = mixer("glr", &json!({"order": 0})).unwrap_err().to_string();
    assert!(e.contains("order must be at least 1") && e.contains("got 0"), "{e}");
    let e = mixer("kth-order", &json!({"order": 0})).unwrap_err().to_string();
    assert!(e.contains("got 0"), "{e}");
    let e = mixer("glr", &json!({"pattern": "test-plus2", "cache_efficient": true})).unwrap_err().to_string();
    assert!(e.contains("f(0) = 2") && e.contains("needs f(0) = 1"), "{e}");
    let e = mixer("glr", &json!({"cache_eficient": true})).unwrap_err().to_string();
    assert!(e.contains("unknown field `cache_eficient`"), "{e}");
    let e = mixer("diagonal-ssm", &json!({"order": 2})).unwrap_err().to_string();
    assert!(e.contains("unknown field `order`"), "{e}");

    let m = mixer("glr", &json!({"pattern": "pow2", "on": "both"})).unwrap();
    let dims: Dims = [("B", 2), ("T", 9), ("C", 3)].into_iter().collect();
    let good = m.random_inputs(&dims, 0).unwrap();
    let run_with = |f: &dyn Fn(&mut Tensors<f64>)| {
        let mut inp = good.clone();
        f(&mut inp);
        run(m.as_ref(), &cpu(), Form::Fast, &AnyTensors::F64(inp)).unwrap_err().to_string()
    };
    // alpha with the wrong channel count.
    let e = run_with(&|i| {
        i.insert("alpha".into(), ArrayD::zeros(ndarray::IxDyn(&[2, 9, 5, 4])));
    });
    assert!(e.contains("`alpha`") && e.contains("C=3") && e.contains("[2, 9, 5, 4]"), "{e}");
    // beta with the wrong number of slots (K(9) = 4 for pow2).
    let e = run_with(&|i| {
        i.insert("beta".into(), ArrayD::zeros(ndarray::IxDyn(&[2, 9, 3, 3])));
    });
    assert!(e.contains("`beta`") && e.contains("K ≥ 4") && e.contains("K = 3"), "{e}");
    // alpha of the wrong slot count (K1 = 5).
    let e = run_with(&|i| {
        i.insert("alpha".into(), ArrayD::zeros(ndarray::IxDyn(&[2, 9, 4, 3])));
    });
    assert!(e.contains("K1 ≥ 5") && e.contains("K1 = 4"), "{e}");
    // x of another length.
    let e = run_with(&|i| {
        i.insert("x".into(), ArrayD::zeros(ndarray::IxDyn(&[2, 8, 3])));
    });
    assert!(
        e.contains("`alpha`") && e.contains("T=8") && e.contains("from `x`") && e.contains("[2, 9, 5, 3]"),
        "{e}"
    );
    // Missing beta.
    let e = run_with(&|i| {
        i.remove("beta");
    });
    assert!(e.contains("missing input `beta`"), "{e}");
    // Non-finite coefficient.
    let e = run_with(&|i| {
        i.get_mut("beta").unwrap()[[0, 3, 1, 2]] = f64::NAN;
    });
    assert!(e.contains("`beta`") && e.contains("finite"), "{e}");
    // A T = 1 input has K = 0 (a zero-size axis) and works in every form.
    let dims: Dims = [("B", 2), ("T", 1), ("C", 3)].into_iter().collect();
    let inp = m.random_inputs(&dims, 0).unwrap();
    assert_eq!(inp["beta"].shape(), [2, 1, 0, 3]);
    for form in [Form::Materialized, Form::Fast, Form::Recurrent] {
        run(m.as_ref(), &cpu(), form, &AnyTensors::F64(inp.clone())).unwrap();
    }
}
