//! Runs from a state of attention, the Toeplitz mixer and the GLR on the CPU (docs/math.md
//! §7.1): the shared suite's `state` check in every form at lengths around chunk and block
//! sizes, that the check catches a wrong state, prefill followed by decoding at any split, and
//! the errors for bad states.

use mixer_core::Mixer;
use mixer_core::state::POSITION;
use mixer_core::{Form, Precision, Tensors};
use mixer_registry::harness::Sizes;
use mixer_registry::mixer;
use mixer_registry::state::{decoder_from_state, run_state};
use mixer_registry::suite::{Check, check_mixer};
use ndarray::{ArrayD, Axis, Slice};
use serde_json::json;

use crate::cpu;

/// The configurations with a state, one per family and layout.
fn configs() -> Vec<(&'static str, serde_json::Value)> {
    mixer_registry::harness::cache_state_configs()
}

fn sizes(t: usize) -> Sizes {
    Sizes { batch: 2, seq: t, channels: 4, heads: 2, dk: 3, dv: 2 }
}

/// The `state` check runs in every form that runs from a state (the reference, `parallel`
/// where the family has it, `fast`, `recurrent`), `f64` and `f32`, and passes, at lengths that
/// are not chunk or block multiples and at the edges (1, 63, 64, 65).
#[test]
fn every_form_runs_from_a_state() {
    let cpu = cpu();
    for (i, (name, cfg)) in configs().into_iter().enumerate() {
        let m = mixer(name, &cfg).unwrap();
        let want = mixer_registry::state::forms(m.as_ref(), &cpu);
        assert!(want.contains(&Form::Fast) && want.contains(&Form::Recurrent), "{name} {cfg}: {want:?}");
        for t in [1, 2, 63, 65] {
            let cases = check_mixer(m.as_ref(), &cpu, &sizes(t), 11 + i as u64);
            let state: Vec<_> = cases.iter().filter(|c| c.check == Check::State).collect();
            assert_eq!(state.len(), 2 * want.len(), "{name} {cfg} T={t}");
            let failed: Vec<String> =
                cases.iter().filter(|c| c.failure.is_some()).map(|c| c.to_string()).collect();
            assert!(failed.is_empty(), "{name} {cfg} T={t}:\n{}", failed.join("\n"));
        }
    }
}

/// Draws the inputs of the state checks and a random state.
fn setup(m: &dyn Mixer, t: usize, seed: u64) -> (Tensors<f64>, Tensors<f64>) {
    let d = mixer_core::mixer::complete_dims(m, &sizes(t).dims());
    let d = mixer_core::mixer::validate(m, &mixer_core::AnyTensors::F64(m.random_inputs(&d, seed).unwrap()))
        .unwrap();
    let x = m.random_inputs(&m.state_check_dims(&d), seed).unwrap();
    let d = mixer_core::mixer::validate(m, &mixer_core::AnyTensors::F64(x.clone())).unwrap();
    let s0 = m.random_state(&d, seed).unwrap();
    (x, s0)
}

/// The comparison the check makes fails on a perturbed state: one entry of a live row of the
/// initial state moved by 1e-3 changes `y` or the final state beyond the f64 tolerance, in every
/// form (so the check can fail).
#[test]
fn a_perturbed_state_is_caught() {
    let cpu = cpu();
    for (name, cfg) in configs() {
        let m = mixer(name, &cfg).unwrap();
        let (x, s0) = setup(m.as_ref(), 9, 3);
        let (want_y, want_f) = m.state_oracle(&x, Some(&s0)).unwrap();
        for form in mixer_registry::state::forms(m.as_ref(), &cpu) {
            let mut bad = s0.clone();
            let (k, a) = bad.iter_mut().find(|(k, _)| k.as_str() != POSITION).unwrap();
            if a.is_empty() {
                continue; // a window of 1 caches nothing
            }
            let ix = live_entry(m.as_ref(), k, a, &s0);
            a[ix.as_slice()] += 1e-3;
            let (y, f) = run_state(m.as_ref(), &cpu, form, &x, Some(&bad), Precision::Exact).unwrap();
            let tol = mixer_core::Tolerance::for_dtype("f64");
            let same_y = tol.compare(y.view(), want_y.view()).pass;
            let same_f = f.iter().all(|(k, v)| tol.compare(v.view(), want_f[k].view()).pass);
            assert!(!(same_y && same_f), "{name} {cfg} {form}: a perturbed state passed");
        }
    }
}

/// The index of an entry of a state tensor that a run reads: the largest in batch row 0 (the
/// random states fill the live rows and zero the others).
fn live_entry(_m: &dyn Mixer, _k: &str, a: &ArrayD<f64>, _s0: &Tensors<f64>) -> Vec<usize> {
    let row0 = a.index_axis(Axis(0), 0);
    let (ix, _) = row0
        .indexed_iter()
        .fold((None, 0.0), |(bi, bv), (i, &v)| if v.abs() > bv { (Some(i), v.abs()) } else { (bi, bv) });
    let ix = ix.expect("a live entry in row 0");
    std::iter::once(0).chain(ndarray::Dimension::as_array_view(&ix).iter().copied()).collect()
}

/// Prefill of `x[0:a]` then a decoder built from its final state: the decoder's outputs are rows
/// `a..` of the whole run and its exported state is the whole run's final state, at every split.
#[test]
fn prefill_then_decode_at_any_split() {
    let cpu = cpu();
    for (name, cfg) in configs() {
        let m = mixer(name, &cfg).unwrap();
        let t = 12;
        let (x, s0) = setup(m.as_ref(), t, 5);
        let (y, fin) = run_state(m.as_ref(), &cpu, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
        for a in 0..=t {
            let head = mixer_core::state::segment_from_state(m.as_ref(), &x, 0..a).unwrap();
            let (_, sa) =
                run_state(m.as_ref(), &cpu, Form::Fast, &head, Some(&s0), Precision::Exact).unwrap();
            let tail = mixer_core::state::segment_from_state(m.as_ref(), &x, a..t).unwrap();
            let d = mixer_core::mixer::validate_typed(m.as_ref(), &tail).unwrap();
            let mut dec = decoder_from_state(m.as_ref(), &cpu, &tail, &d, Some(&sa)).unwrap();
            let yd = mixer_core::mixer::run_decoder(dec.as_mut(), &m.spec(), &tail, |_, _| {}).unwrap();
            // `position` counts the tokens this decoder consumed, not the state's.
            assert_eq!(dec.position(), t - a, "{name} {cfg} split {a}: position");
            let want = y.slice_axis(Axis(1), Slice::from(a..t));
            let c = mixer_core::Tolerance::for_dtype("f64").compare(yd.view(), want);
            assert!(c.pass, "{name} {cfg} split {a}: {c:?}");
            let sd = dec.state().unwrap();
            for (k, v) in &fin {
                let c = mixer_core::Tolerance::for_dtype("f64").compare(sd[k].view(), v.view());
                assert!(c.pass, "{name} {cfg} split {a}: state `{k}` {c:?}");
            }
        }
    }
}

/// A KV cache that cannot take the run, or of the wrong capacity, is refused with what was
/// given, in every form.
#[test]
fn bad_caches_are_refused() {
    let cpu = cpu();
    let m = mixer("attention", &json!({})).unwrap();
    let (x, s0) = setup(m.as_ref(), 6, 1);
    let mut full = s0.clone();
    full.get_mut("length").unwrap()[0] = 6.0;
    for form in [Form::Fast, Form::Parallel, Form::Recurrent, Form::Materialized] {
        let e = run_state(m.as_ref(), &cpu, form, &x, Some(&full), Precision::Exact).unwrap_err().to_string();
        assert!(
            e.contains("capacity N ≥ length + T") && e.contains("N = 11, length 6, T = 6"),
            "{form}: {e}"
        );
    }
    let w = mixer("attention", &json!({"window": 4})).unwrap();
    let (x, s0) = setup(w.as_ref(), 6, 1);
    let mut wide = s0.clone();
    wide.insert("k".into(), ArrayD::zeros(ndarray::IxDyn(&[2, 5, 2, 3])));
    let e =
        run_state(w.as_ref(), &cpu, Form::Fast, &x, Some(&wide), Precision::Exact).unwrap_err().to_string();
    assert!(e.contains("initial_state.k") && e.contains("[2, 3, 2, 3]") && e.contains("[2, 5, 2, 3]"), "{e}");
}

/// Bad states are refused with what was expected and what was given: a wrong shape, and a
/// position that leaves no room for the run.
#[test]
fn bad_states_are_refused() {
    let cpu = cpu();
    let m = mixer("toeplitz", &json!({"heads": 2})).unwrap();
    let (x, s0) = setup(m.as_ref(), 6, 1);
    let mut wrong = s0.clone();
    wrong.insert("x".into(), ArrayD::zeros(ndarray::IxDyn(&[2, 11, 4])));
    let e =
        run_state(m.as_ref(), &cpu, Form::Fast, &x, Some(&wrong), Precision::Exact).unwrap_err().to_string();
    assert!(e.contains("initial_state.x") && e.contains("[2, 12, 4]") && e.contains("[2, 11, 4]"), "{e}");
    let mut far = s0.clone();
    far.get_mut("x").unwrap().fill(0.0);
    far.get_mut(POSITION).unwrap()[1] = 7.0;
    for form in [Form::Fast, Form::Parallel, Form::Recurrent] {
        let e = run_state(m.as_ref(), &cpu, form, &x, Some(&far), Precision::Exact).unwrap_err().to_string();
        assert!(e.contains("position + T ≤ Tw = 12") && e.contains("position 7, T = 6"), "{form}: {e}");
    }
}

/// A lift under a mask other than Fenwick (the example plugin's `log-distance`) keeps a cache of
/// its past tokens (docs/math.md §7.1): the suite's `state` check passes in the forms that run
/// from it (the reference and `parallel`; `fast` and `recurrent` need the Fenwick mask, and say
/// so), runs of one token at a time from the prefill's cache give the whole run's rows and final
/// cache at every split, and a cache too small for the run is refused with its sizes.
#[test]
fn a_lift_under_a_plugin_mask_runs_from_its_cache() {
    let cpu = cpu();
    for (name, cfg) in
        [("log-distance-mamba2", json!({})), ("loglinear-gated-deltanet", json!({"mask": "log-distance"}))]
    {
        let m = mixer(name, &cfg).unwrap();
        let forms = mixer_registry::state::forms(m.as_ref(), &cpu);
        assert_eq!(forms, [Form::Materialized, Form::Parallel], "{name}");
        for t in [1, 2, 63, 65] {
            let cases = check_mixer(m.as_ref(), &cpu, &sizes(t), 7);
            let state: Vec<_> = cases.iter().filter(|c| c.check == Check::State).collect();
            assert_eq!(state.len(), 2 * forms.len(), "{name} T={t}");
            let failed: Vec<String> =
                state.iter().filter(|c| c.failure.is_some()).map(|c| c.to_string()).collect();
            assert!(failed.is_empty(), "{name} T={t}:\n{}", failed.join("\n"));
        }
        let e = run_state(m.as_ref(), &cpu, Form::Fast, &setup(m.as_ref(), 4, 1).0, None, Precision::Exact)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs the Fenwick mask"), "{name}: {e}");
        // λ with levels for the cached tokens too (L ≥ L(position + T)).
        let t = 12;
        let mut d = mixer_core::mixer::complete_dims(m.as_ref(), &sizes(t).dims());
        d.insert("L", 6);
        let x = m.random_inputs(&d, 5).unwrap();
        let s0 = m.random_state(&d, 5).unwrap();
        assert_eq!(s0[POSITION].as_slice().unwrap(), &[5.0, 2.0], "{name}: the cached tokens per row");
        let (y, fin) = run_state(m.as_ref(), &cpu, Form::Parallel, &x, Some(&s0), Precision::Exact).unwrap();
        let (yr, fr) =
            run_state(m.as_ref(), &cpu, Form::Materialized, &x, Some(&s0), Precision::Exact).unwrap();
        let tol = mixer_core::Tolerance::for_dtype("f64");
        assert!(tol.compare(y.view(), yr.view()).pass, "{name}: parallel vs the reference");
        for a in 0..=t {
            let head = mixer_core::state::segment_from_state(m.as_ref(), &x, 0..a).unwrap();
            let (_, mut s) =
                run_state(m.as_ref(), &cpu, Form::Parallel, &head, Some(&s0), Precision::Exact).unwrap();
            for i in a..t {
                let tok = mixer_core::state::segment_from_state(m.as_ref(), &x, i..i + 1).unwrap();
                let (yi, si) =
                    run_state(m.as_ref(), &cpu, Form::Parallel, &tok, Some(&s), Precision::Exact).unwrap();
                let c = tol.compare(yi.view(), y.slice_axis(Axis(1), Slice::from(i..i + 1)));
                assert!(c.pass, "{name} split {a}, token {i}: {c:?}");
                s = si;
            }
            for (k, v) in &fin {
                assert!(tol.compare(s[k].view(), v.view()).pass, "{name} split {a}: final `{k}`");
                assert!(tol.compare(fr[k].view(), v.view()).pass, "{name}: final `{k}` vs the reference");
            }
        }
        let mut full = s0.clone();
        full.get_mut(POSITION).unwrap()[0] = 6.0;
        full.get_mut("k").unwrap().fill(1.0);
        let e = run_state(m.as_ref(), &cpu, Form::Parallel, &x, Some(&full), Precision::Exact)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("capacity N ≥ position + T") && e.contains("N = 17, position 6, T = 12"),
            "{name}: {e}"
        );
    }
}

/// After a long prefix the GLR's fast form from a state runs only the run's tokens (reading the
/// state's kept values, not an extension of the prefix): the rows of the whole run and its final
/// state, on lattices and windows with the pattern on `B`, on `A` and on both; its backward (into
/// the state's rows) equals the extension's backward; and its rows are bit for bit the
/// extension's where the pattern is on one side (the same sums in the same order).
#[test]
fn the_glr_runs_after_a_long_prefix_without_its_extension() {
    let cpu = cpu();
    for (name, cfg) in configs().into_iter().filter(|(n, _)| !n.contains("attention") && *n != "toeplitz") {
        let m = mixer(name, &cfg).unwrap();
        let (t, a) = (700, 613);
        let d = mixer_core::mixer::complete_dims(m.as_ref(), &sizes(t).dims());
        let x = m.random_inputs(&d, 21).unwrap();
        // The whole run by the materialized oracle (the dense `(I − B)⁻¹ A x`).
        let (y, fin) = m.state_oracle(&x, None).unwrap();
        let head = mixer_core::state::segment_from_state(m.as_ref(), &x, 0..a).unwrap();
        let tail = mixer_core::state::segment_from_state(m.as_ref(), &x, a..t).unwrap();
        let (_, sa) = run_state(m.as_ref(), &cpu, Form::Fast, &head, None, Precision::Exact).unwrap();
        let (yb, sb) = run_state(m.as_ref(), &cpu, Form::Fast, &tail, Some(&sa), Precision::Exact).unwrap();
        let tol = mixer_core::Tolerance::for_dtype("f64");
        let c = tol.compare(yb.view(), y.slice_axis(Axis(1), Slice::from(a..t)));
        assert!(c.pass, "{name} {cfg}: y after {a} {c:?}");
        for (k, v) in &fin {
            let c = tol.compare(sb[k].view(), v.view());
            assert!(c.pass, "{name} {cfg}: final `{k}` {c:?}");
        }
        let g = m.as_any().downcast_ref::<mixer_core::mixers::glr::Glr>().unwrap();
        // The backward from the state against the extension's backward, with cotangents of `y`
        // and of the final state.
        let dy = yb.mapv(|v| (3.1 * v).sin());
        let df: Tensors<f64> =
            sb.iter().map(|(k, v)| (k.clone(), v.mapv(|v| (1.7 * v + 0.2).cos()))).collect();
        let all = mixer_core::Requires::All;
        let (gd, sd) = mixer_cpu::glr::backward::vjp_from(g, &tail, Some(&sa), &dy, Some(&df), &all).unwrap();
        let args = mixer_core::state::StateVjp {
            x: &tail,
            initial: Some(&sa),
            dy: &dy,
            d_final: Some(&df),
            requires: &all,
        };
        let (ge, se) =
            mixer_core::mixers::glr::state::vjp(g, args, |e, d| mixer_cpu::glr::backward::vjp(g, e, d, &all))
                .unwrap();
        for (k, v) in ge.iter().chain(se.iter()) {
            let got = gd.get(k).or_else(|| sd.get(k)).unwrap();
            let c = tol.compare(got.view(), v.view());
            assert!(c.pass, "{name} {cfg}: `{k}` of the backward after {a} {c:?}");
        }
        if g.on() != mixer_core::mixers::glr::On::Both {
            let (ye, _) = mixer_core::mixers::glr::state::run(g, &tail, Some(&sa), |e| {
                mixer_cpu::glr::fast::fast(g, e)
            })
            .unwrap();
            assert_eq!(yb, ye, "{name} {cfg}: the direct run and the extension's differ");
        }
    }
}
