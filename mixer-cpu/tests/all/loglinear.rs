//! Registry-wide tests of the log-linear family on CPU (docs/math.md §2): every mixer × form
//! against the f64 oracle in f64 and f32, decode = fast at every prefix, the family's
//! properties, numerical robustness, input errors, and a plugin level mask.

use super::{cpu, suite_on};
use mixer_core::mixer::{Mixer, complete_dims, validate};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{AnyTensors, DType, Dims, Error, Form, Tensors, Tolerance};
use mixer_registry::harness::{Sizes, check};
use mixer_registry::run::{oracle, run, run_as};
use mixer_registry::{MaskEntry, mixer, register};
use ndarray::{ArrayD, Axis, IxDyn, Slice};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::json;

const BASES: [&str; 3] = ["linear-attention", "mamba2", "gated-deltanet"];
const LIFTS: [&str; 3] = ["loglinear-attention", "loglinear-mamba2", "loglinear-gated-deltanet"];

fn all_six() -> Vec<&'static str> {
    BASES.iter().chain(LIFTS.iter()).copied().collect()
}

fn sizes(t: usize) -> Sizes {
    Sizes { batch: 2, seq: t, channels: 1, heads: 2, dk: 5, dv: 3 }
}

fn dims(m: &dyn Mixer, s: &Sizes) -> Dims {
    complete_dims(m, &s.dims())
}

fn assert_close(got: &ArrayD<f64>, want: &ArrayD<f64>, tol: Tolerance, what: &str) {
    let c = tol.compare(got.view(), want.view());
    assert!(c.pass, "{what}: {c:?}");
}

/// A plugin level mask (distance buckets, translation invariant): ℓ(t,s) = bitlen(t − s).
fn distance_level(t: usize, s: usize) -> usize {
    let d = t.saturating_sub(s);
    (usize::BITS - d.leading_zeros()) as usize
}
fn distance_levels(t_len: usize) -> usize {
    let d = t_len.saturating_sub(1);
    (usize::BITS - d.leading_zeros()) as usize + 1
}
#[register]
static DISTANCE: MaskEntry = MaskEntry {
    name: "test-distance",
    doc: "test plugin: ℓ(t,s) = bitlen(t − s)",
    level: distance_level,
    levels: distance_levels,
    cuda: None,
};

#[test]
fn every_mixer_and_form_matches_the_oracle() {
    let mut n_rows = 0;
    let mut failures = Vec::new();
    for name in all_six() {
        for chunk in [16usize, 64] {
            let mut configs = vec![json!({ "chunk": chunk, "scale": 0.8 })];
            if name.starts_with("loglinear") && chunk == 16 {
                configs.push(json!({ "chunk": chunk, "lambda_scheme": "softplus" }));
            }
            for cfg in configs {
                let m = mixer(name, &cfg).unwrap();
                for t in [1usize, 2, 3, 63, 64, 65, 100, 257, 1000] {
                    let s = Sizes { batch: if t > 300 { 1 } else { 2 }, ..sizes(t) };
                    let rows = check(m.as_ref(), &[cpu()], &s, 7 + t as u64);
                    let forms: Vec<Form> = rows.iter().map(|r| r.form).collect();
                    assert!(
                        [Form::Parallel, Form::Fast, Form::Recurrent].iter().all(|f| forms.contains(f)),
                        "{name}: forms {forms:?}"
                    );
                    for r in rows {
                        n_rows += 1;
                        if !r.pass {
                            failures.push(format!(
                                "{name} {cfg} T={t} {} {}: rel {:.2e} max {:.2e} {:?}",
                                r.form,
                                r.dtype.name(),
                                r.rel_rms,
                                r.max_abs,
                                r.error
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {n_rows} failed:\n{}", failures.len(), failures.join("\n"));
    assert!(n_rows >= 6 * 2 * 9 * 6);
}

/// The shared backend suite on all six members with chunk 16 at T = 70 (several chunks, not
/// a multiple of one), and on every registered example.
#[test]
fn shared_suite_on_every_member() {
    let configs: Vec<_> = all_six().into_iter().map(|n| (n, json!({ "chunk": 16 }))).collect();
    let n = suite_on(configs, &sizes(70));
    assert!(n >= 60, "{n} cases");
}

#[test]
fn decoder_cache_is_logarithmic() {
    let m = mixer("loglinear-mamba2", &json!({})).unwrap();
    let s = Sizes { batch: 1, seq: 1500, channels: 1, heads: 1, dk: 3, dv: 2 };
    let x = m.random_inputs(&dims(m.as_ref(), &s), 1).unwrap();
    let spec = m.spec();
    let mut dec = mixer_registry::run::decoder::<f64>(m.as_ref(), &cpu(), &x, &dims(m.as_ref(), &s)).unwrap();
    let mut max_levels = 0;
    mixer_core::mixer::run_decoder(dec.as_mut(), &spec, &x, |t, elems| {
        let levels = elems / 6;
        // Non-empty levels after token t: level 0 plus one per set bit of t (docs/math.md §2.5).
        assert_eq!(levels, 1 + (t as u32).count_ones() as usize, "t={t}");
        max_levels = max_levels.max(levels);
    })
    .unwrap();
    assert!(max_levels <= 11);
    let base = mixer("mamba2", &json!({})).unwrap();
    let xb: Tensors<f64> =
        x.iter().filter(|(k, _)| *k != "lambda").map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut dec = mixer_registry::run::decoder::<f64>(base.as_ref(), &cpu(), &xb, &s.dims()).unwrap();
    mixer_core::mixer::run_decoder(dec.as_mut(), &base.spec(), &xb, |_, e| assert_eq!(e, 6)).unwrap();
}

/// Runs every CPU form (and the oracle) of `m` on `x` in f64.
fn all_forms(m: &dyn Mixer, x: &Tensors<f64>) -> Vec<(String, ArrayD<f64>)> {
    let mut v = vec![("oracle".to_string(), oracle(m, x).unwrap())];
    for f in [Form::Parallel, Form::Fast, Form::Recurrent] {
        v.push((f.name().to_string(), run_as(m, &cpu(), f, x, DType::F64).unwrap()));
    }
    v
}

#[test]
fn lambda_ones_reproduces_the_base_mixer() {
    for (base, lift) in BASES.iter().zip(LIFTS) {
        for chunk in [8usize, 64] {
            let mb = mixer(base, &json!({ "chunk": chunk })).unwrap();
            let ml = mixer(lift, &json!({ "chunk": chunk })).unwrap();
            let s = sizes(150);
            let mut x = ml.random_inputs(&dims(ml.as_ref(), &s), 5).unwrap();
            x.get_mut("lambda").unwrap().fill(1.0);
            let xb: Tensors<f64> =
                x.iter().filter(|(k, _)| *k != "lambda").map(|(k, v)| (k.clone(), v.clone())).collect();
            let want = oracle(mb.as_ref(), &xb).unwrap();
            for (f, y) in all_forms(mb.as_ref(), &xb).into_iter().chain(all_forms(ml.as_ref(), &x)) {
                assert_close(&y, &want, Tolerance { rel_rms: 1e-12, max_abs: 1e-11 }, &format!("{lift} {f}"));
            }
            // The `ones` λ scheme ignores the raw values.
            let mo = mixer(lift, &json!({ "chunk": chunk, "lambda_scheme": "ones" })).unwrap();
            let mut xr = x.clone();
            xr.insert(
                "lambda".into(),
                ml.random_inputs(&dims(ml.as_ref(), &s), 6).unwrap()["lambda"].clone(),
            );
            xr.get_mut("lambda").unwrap().mapv_inplace(|v| v - 0.7);
            for (f, y) in all_forms(mo.as_ref(), &xr) {
                assert_close(
                    &y,
                    &want,
                    Tolerance { rel_rms: 1e-12, max_abs: 1e-11 },
                    &format!("{lift} ones {f}"),
                );
            }
        }
    }
}

#[test]
fn mamba2_without_decay_is_linear_attention() {
    for (a, b) in [("mamba2", "linear-attention"), ("loglinear-mamba2", "loglinear-attention")] {
        let ma = mixer(a, &json!({ "chunk": 16 })).unwrap();
        let mb = mixer(b, &json!({ "chunk": 16 })).unwrap();
        let s = sizes(77);
        let mut x = ma.random_inputs(&dims(ma.as_ref(), &s), 2).unwrap();
        x.get_mut("g").unwrap().fill(0.0);
        let xb: Tensors<f64> =
            x.iter().filter(|(k, _)| *k != "g").map(|(k, v)| (k.clone(), v.clone())).collect();
        let want = oracle(mb.as_ref(), &xb).unwrap();
        for (f, y) in all_forms(ma.as_ref(), &x).into_iter().chain(all_forms(mb.as_ref(), &xb)) {
            assert_close(&y, &want, Tolerance::F64, &format!("{a} {f}"));
        }
    }
}

#[test]
fn gated_deltanet_with_zero_beta_gives_zeros() {
    for name in ["gated-deltanet", "loglinear-gated-deltanet"] {
        let m = mixer(name, &json!({ "chunk": 16 })).unwrap();
        let mut x = m.random_inputs(&dims(m.as_ref(), &sizes(45)), 3).unwrap();
        x.get_mut("beta").unwrap().fill(0.0);
        for (f, y) in all_forms(m.as_ref(), &x) {
            assert!(y.iter().all(|&v| v == 0.0), "{name} {f}: not all zero");
        }
    }
}

/// With g ≡ 0, β ≡ 1 and orthonormal keys, S(I − kkᵀ) + v kᵀ overwrites the slot of k:
/// querying with a key returns the last value written under it (0 if none).
#[test]
fn gated_deltanet_recalls_the_last_value_per_key() {
    let (t_len, dk, dv) = (90, 6, 4);
    let mut rng = StdRng::seed_from_u64(9);
    // A random orthonormal basis (Gram–Schmidt).
    let mut basis: Vec<Vec<f64>> = Vec::new();
    while basis.len() < dk {
        let mut v: Vec<f64> = (0..dk).map(|_| rng.random::<f64>() - 0.5).collect();
        for b in &basis {
            let d: f64 = v.iter().zip(b).map(|(x, y)| x * y).sum();
            v.iter_mut().zip(b).for_each(|(x, y)| *x -= d * y);
        }
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter_mut().for_each(|x| *x /= n);
        basis.push(v);
    }
    let mut x = Tensors::new();
    let mut q = ArrayD::zeros(IxDyn(&[1, t_len, 1, dk]));
    let mut k = q.clone();
    let mut v = ArrayD::zeros(IxDyn(&[1, t_len, 1, dv]));
    let mut want = ArrayD::zeros(IxDyn(&[1, t_len, 1, dv]));
    let mut last: Vec<Option<Vec<f64>>> = vec![None; dk];
    for t in 0..t_len {
        let (kw, kq) = (rng.random_range(0..dk), rng.random_range(0..dk));
        let val: Vec<f64> = (0..dv).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
        for d in 0..dk {
            k[[0, t, 0, d]] = basis[kw][d];
            q[[0, t, 0, d]] = basis[kq][d];
        }
        for d in 0..dv {
            v[[0, t, 0, d]] = val[d];
        }
        last[kw] = Some(val);
        if let Some(l) = &last[kq] {
            for d in 0..dv {
                want[[0, t, 0, d]] = l[d];
            }
        }
    }
    x.insert("q".into(), q);
    x.insert("k".into(), k);
    x.insert("v".into(), v);
    x.insert("g".into(), ArrayD::zeros(IxDyn(&[1, t_len, 1])));
    x.insert("beta".into(), ArrayD::ones(IxDyn(&[1, t_len, 1])));
    for name in ["gated-deltanet", "loglinear-gated-deltanet"] {
        let m = mixer(name, &json!({ "chunk": 16 })).unwrap();
        let mut xi = x.clone();
        if name.starts_with("loglinear") {
            let n_levels = mixer_core::fenwick::num_levels(t_len);
            xi.insert("lambda".into(), ArrayD::ones(IxDyn(&[1, t_len, 1, n_levels])));
        }
        for (f, y) in all_forms(m.as_ref(), &xi) {
            assert_close(&y, &want, Tolerance { rel_rms: 1e-10, max_abs: 1e-10 }, &format!("{name} {f}"));
        }
    }
}

/// At the mixer level: with Dk = Dv = 1, q = k = 1 and λ one-hot at level ℓ, the materialized
/// A of `loglinear-attention` is the indicator of the Fenwick bucket ℓ of every row.
#[test]
fn one_hot_lambda_materializes_the_bucket_masks() {
    let m = mixer("loglinear-attention", &json!({})).unwrap();
    let t_len = 300;
    let n_levels = mixer_core::fenwick::num_levels(t_len);
    for lvl in 0..n_levels {
        let mut x = Tensors::new();
        x.insert("q".into(), ArrayD::ones(IxDyn(&[1, t_len, 1, 1])));
        x.insert("k".into(), ArrayD::ones(IxDyn(&[1, t_len, 1, 1])));
        x.insert("v".into(), ArrayD::ones(IxDyn(&[1, t_len, 1, 1])));
        let mut lam = ArrayD::zeros(IxDyn(&[1, t_len, 1, n_levels]));
        lam.index_axis_mut(Axis(3), lvl).fill(1.0);
        x.insert("lambda".into(), lam);
        let mat = m.materialize(&x).unwrap();
        let a = &mat.blocks[0].terms[0].a;
        for t in 0..t_len {
            let bucket = mixer_core::fenwick::bucket(t, lvl);
            for s in 0..t_len {
                let inside = bucket.as_ref().is_some_and(|r| r.contains(&s));
                assert_eq!(a[[t, s]], if inside { 1.0 } else { 0.0 }, "level {lvl} t={t} s={s}");
            }
        }
    }
}

/// Log-decays down to −1e4 mixed with tiny ones, β at exactly 0 and 1: finite everywhere
/// and equal to the oracle in f64.
#[test]
fn extreme_decays_and_betas_match_the_oracle() {
    let mut rng = StdRng::seed_from_u64(4);
    for name in ["mamba2", "gated-deltanet", "loglinear-mamba2", "loglinear-gated-deltanet"] {
        for chunk in [16usize, 64] {
            let m = mixer(name, &json!({ "chunk": chunk })).unwrap();
            let s = sizes(300);
            let mut x = m.random_inputs(&dims(m.as_ref(), &s), 8).unwrap();
            x.get_mut("g").unwrap().mapv_inplace(|g| match rng.random_range(0..4) {
                0 => -1e4,
                1 => -rng.random::<f64>() * 1e4,
                2 => -1e-6 * rng.random::<f64>(),
                _ => g,
            });
            if let Some(b) = x.get_mut("beta") {
                b.mapv_inplace(|b| match rng.random_range(0..3) {
                    0 => 0.0,
                    1 => 1.0,
                    _ => b,
                });
            }
            let want = oracle(m.as_ref(), &x).unwrap();
            assert!(want.iter().all(|v| v.is_finite()));
            for (f, y) in all_forms(m.as_ref(), &x) {
                assert_close(&y, &want, Tolerance::F64, &format!("{name} chunk {chunk} {f}"));
            }
            for f in [Form::Parallel, Form::Fast, Form::Recurrent] {
                let y = run_as(m.as_ref(), &cpu(), f, &x, DType::F32).unwrap();
                assert_close(&y, &want, Tolerance::F32, &format!("{name} chunk {chunk} {f} f32"));
            }
        }
    }
}

/// T = 65536 with log-decays down to −1e4 and β ∈ {0, 1}: the fast and recurrent forms stay
/// finite and agree (the oracle cannot run at this length).
#[test]
fn long_sequences_stay_finite() {
    let mut rng = StdRng::seed_from_u64(5);
    for name in ["loglinear-attention", "loglinear-mamba2", "loglinear-gated-deltanet"] {
        let m = mixer(name, &json!({})).unwrap();
        let s = Sizes { batch: 1, seq: 65536, channels: 1, heads: 1, dk: 3, dv: 2 };
        let mut x = m.random_inputs(&dims(m.as_ref(), &s), 21).unwrap();
        if let Some(g) = x.get_mut("g") {
            g.mapv_inplace(|g| if rng.random_range(0..50) == 0 { -1e4 } else { g * 0.01 });
        }
        if let Some(b) = x.get_mut("beta") {
            b.mapv_inplace(|_| if rng.random::<bool>() { 1.0 } else { 0.0 });
        }
        for dtype in [DType::F64, DType::F32] {
            let fast = run_as(m.as_ref(), &cpu(), Form::Fast, &x, dtype).unwrap();
            let dec = run_as(m.as_ref(), &cpu(), Form::Recurrent, &x, dtype).unwrap();
            assert!(fast.iter().chain(dec.iter()).all(|v| v.is_finite()), "{name}: non-finite");
            let tol =
                if dtype == DType::F64 { Tolerance { rel_rms: 1e-8, max_abs: 1e-7 } } else { Tolerance::F32 };
            assert_close(&fast, &dec, tol, &format!("{name} {}", dtype.name()));
        }
    }
}

#[test]
fn non_standard_layouts_are_accepted() {
    let m = mixer("loglinear-gated-deltanet", &json!({ "chunk": 8 })).unwrap();
    let x = m.random_inputs(&dims(m.as_ref(), &sizes(30)), 2).unwrap();
    let want = oracle(m.as_ref(), &x).unwrap();
    let mut y = x.clone();
    for name in ["q", "v", "lambda"] {
        // Same values, stored as [T, B, H, D] and viewed as [B, T, H, D].
        let a = x[name].view().permuted_axes(IxDyn(&[1, 0, 2, 3])).as_standard_layout().into_owned();
        let a = a.permuted_axes(IxDyn(&[1, 0, 2, 3]));
        assert!(!a.is_standard_layout());
        y.insert(name.into(), a);
    }
    for f in [Form::Parallel, Form::Fast, Form::Recurrent] {
        let got = run_as(m.as_ref(), &cpu(), f, &y, DType::F64).unwrap();
        assert_close(&got, &want, Tolerance::F64, f.name());
    }
}

#[test]
fn bad_inputs_give_clear_errors() {
    let m = mixer("loglinear-gated-deltanet", &json!({})).unwrap();
    let s = sizes(20);
    let x = m.random_inputs(&dims(m.as_ref(), &s), 1).unwrap();
    let err = |x: Tensors<f64>| run(m.as_ref(), &cpu(), Form::Fast, &AnyTensors::F64(x)).unwrap_err();

    let mut bad = x.clone();
    bad.get_mut("g").unwrap()[[0, 3, 1]] = 0.5;
    let e = err(bad);
    assert!(matches!(&e, Error::Value { name, .. } if name == "g"), "{e}");
    assert!(e.to_string().contains("≤ 0"), "{e}");

    let mut bad = x.clone();
    bad.get_mut("lambda").unwrap()[[1, 2, 0, 1]] = -0.1;
    let e = err(bad);
    assert!(matches!(&e, Error::Value { name, .. } if name == "lambda"), "{e}");

    let mut bad = x.clone();
    let lam = bad["lambda"].slice_axis(Axis(3), Slice::from(0..4)).to_owned();
    bad.insert("lambda".into(), lam);
    let e = err(bad).to_string();
    assert!(e.contains("L ≥ 6") && e.contains("L = 4"), "{e}");

    let mut bad = x.clone();
    let k = bad["k"].slice_axis(Axis(3), Slice::from(0..4)).to_owned();
    bad.insert("k".into(), k);
    let e = err(bad).to_string();
    assert!(e.contains("`k`") && e.contains("Dk"), "{e}");

    let mut bad = x.clone();
    let v = bad["v"].slice_axis(Axis(2), Slice::from(0..1)).to_owned();
    bad.insert("v".into(), v);
    let e = err(bad).to_string();
    assert!(e.contains("`v`") && e.contains("H=2"), "{e}");

    let mut bad = x.clone();
    bad.get_mut("beta").unwrap()[[0, 0, 0]] = 1.5;
    assert!(err(bad).to_string().contains("[0, 1]"));

    // A λ scheme that maps to negative weights is reported after mapping.
    let m2 = mixer("loglinear-attention", &json!({ "lambda_scheme": "softplus" })).unwrap();
    let x2 = m2.random_inputs(&dims(m2.as_ref(), &s), 1).unwrap();
    validate(m2.as_ref(), &AnyTensors::F64(x2.clone())).unwrap();
    run(m2.as_ref(), &cpu(), Form::Fast, &AnyTensors::F64(x2)).unwrap();
}

#[test]
fn plugin_masks_work_in_parallel_form() {
    for name in LIFTS {
        let m = mixer(name, &json!({ "mask": "test-distance", "chunk": 16 })).unwrap();
        let ll: &LogLinear = mixer_core::mixer::downcast(m.as_ref(), "test").unwrap();
        assert_eq!(ll.lift.unwrap().mask.name, "test-distance");
        for t in [1usize, 37, 100] {
            let rows = check(m.as_ref(), &[cpu()], &sizes(t), 3);
            assert!(rows.iter().any(|r| r.form == Form::Parallel), "{name}: no parallel row");
            for r in &rows {
                assert!(r.pass, "{name} T={t}: {r:?}");
            }
            // The chunked and recurrent forms need the Fenwick structure: a clear error.
            let x = m.random_inputs(&dims(m.as_ref(), &sizes(t)), 3).unwrap();
            for f in [Form::Fast, Form::Recurrent] {
                let e = run(m.as_ref(), &cpu(), f, &AnyTensors::F64(x.clone())).unwrap_err();
                assert!(matches!(e, Error::FormUnavailable { .. }), "{name} {f}: {e}");
                assert!(e.to_string().contains("Fenwick"), "{name} {f}: {e}");
            }
        }
        // The plugin mask really differs from Fenwick.
        let fen = mixer(name, &json!({ "chunk": 16 })).unwrap();
        let x = m.random_inputs(&dims(m.as_ref(), &sizes(40)), 4).unwrap();
        let c = Tolerance::F64
            .compare(oracle(m.as_ref(), &x).unwrap().view(), oracle(fen.as_ref(), &x).unwrap().view());
        assert!(!c.pass);
    }
}

/// Issue 14: T = 0 with H ≥ 2 used to panic in the fast and parallel forms (a head's start
/// offset was formed into an empty buffer), and Dv = 0 in the recurrent form
/// (`chunks_exact_mut(0)`). Both are valid sizes with an empty output.
#[test]
fn empty_sequences_and_empty_values() {
    for name in all_six() {
        let m = mixer(name, &json!({})).unwrap();
        for (t, dv) in [(0usize, 3usize), (5, 0), (0, 0), (1, 0)] {
            let s = Sizes { batch: 1, seq: t, channels: 1, heads: 3, dk: 4, dv };
            let d = dims(m.as_ref(), &s);
            let x = m.random_inputs(&d, 3).unwrap();
            for form in [Form::Materialized, Form::Parallel, Form::Fast, Form::Recurrent] {
                let y = run(m.as_ref(), &crate::cpu(), form, &AnyTensors::F64(x.clone()))
                    .unwrap_or_else(|e| panic!("{name} T={t} Dv={dv} {form}: {e}"));
                assert_eq!(y.shape(), &[1, t, 3, dv], "{name} {form}");
            }
        }
    }
}

/// The shared suite's `state` check on the lifts: every form that runs from a state (the
/// reference, `fast`, `recurrent`), `f64` and `f32`, with chunks that put the splits and the
/// Fenwick level boundaries inside chunks, on them, and a whole run inside one chunk.
#[test]
fn the_lifts_run_from_a_state_in_every_form() {
    let cpu = cpu();
    for (i, (name, cfg)) in [
        ("loglinear-attention", json!({"chunk": 8})),
        ("loglinear-mamba2", json!({"chunk": 4})),
        ("loglinear-gated-deltanet", json!({"chunk": 8})),
        ("loglinear-gated-deltanet", json!({"chunk": 2, "lambda_scheme": "softplus"})),
        ("loglinear-mamba2", json!({})),
    ]
    .into_iter()
    .enumerate()
    {
        let m = mixer(name, &cfg).unwrap();
        let cases = mixer_registry::suite::check_mixer(m.as_ref(), &cpu, &sizes(29), 7 + i as u64);
        let state: Vec<_> = cases.iter().filter(|c| c.check == mixer_registry::suite::Check::State).collect();
        let forms: std::collections::BTreeSet<_> = state.iter().map(|c| c.form).collect();
        assert_eq!(forms, [Form::Materialized, Form::Fast, Form::Recurrent].into_iter().collect(), "{name}");
        assert_eq!(state.len(), 6, "{name} {cfg}");
        let failed: Vec<String> =
            cases.iter().filter(|c| c.failure.is_some()).map(|c| c.to_string()).collect();
        assert!(failed.is_empty(), "{name} {cfg}:\n{}", failed.join("\n"));
    }
}
