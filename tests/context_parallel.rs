//! Context parallelism on the CPU simulation (`mixers::context_parallel`, ranks as threads of
//! one process): N ranks equal one device at every split tried, forward (`y`, the final state)
//! and backward (every input's gradient, the initial state's), for linear attention, Mamba-2,
//! gated DeltaNet, their lifts and the GLR, f64 and f32, from an initial state and from zeros;
//! the other families refused.

use std::ops::Range;

use mixer_core::mixer::Mixer;
use mixer_core::state::segment_from_state;
use mixer_core::tensor::{cast_tensors, tensors_to_f64};
use mixer_core::{Dims, Form, Precision, Requires, Tensors, Tolerance};
use mixers::context_parallel::{InProcess, backward, forward};
use mixers::registry::family::Scalar;
use mixers::registry::state::{backward_state, run_state};
use mixers::registry::{Backend, mixer};
use ndarray::{ArrayD, Axis, Slice};

/// The parts of `t` tokens at the cut points `cuts` (increasing, inside `0..=t`).
fn parts(t: usize, cuts: &[usize]) -> Vec<Range<usize>> {
    let mut edges = vec![0];
    edges.extend_from_slice(cuts);
    edges.push(t);
    edges.windows(2).map(|w| w[0]..w[1]).collect()
}

/// The splits tried at `t` tokens for `n` ranks: as even as possible, and uneven ones (an empty
/// part included where `n > 1`).
fn splits(t: usize, n: usize) -> Vec<Vec<Range<usize>>> {
    let even: Vec<usize> = (1..n).map(|i| i * t / n).collect();
    let mut out = vec![parts(t, &even)];
    if n > 1 {
        let skew: Vec<usize> = (1..n).map(|i| (t * i * i) / (n * n)).collect();
        out.push(parts(t, &skew));
        let mut empty = even.clone();
        empty[0] = 0;
        out.push(parts(t, &empty));
    }
    out
}

struct Run<F> {
    y: ArrayD<F>,
    fin: Tensors<F>,
    grads: Tensors<F>,
    d_initial: Tensors<F>,
}

/// The whole sequence on one device.
fn whole<F: Scalar>(
    m: &dyn Mixer,
    x: &Tensors<F>,
    s0: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    df: &Tensors<F>,
) -> Run<F> {
    let cpu = Backend::by_name("cpu").unwrap();
    let (y, fin) = run_state(m, &cpu, Form::Fast, x, s0, Precision::Exact).unwrap();
    let (grads, d_initial) =
        backward_state(m, &cpu, Form::Fast, x, s0, dy, Some(df), &Requires::All).unwrap();
    Run { y, fin, grads, d_initial }
}

/// The sequence over one rank per part (threads), joined.
fn split<F: Scalar>(
    m: &dyn Mixer,
    x: &Tensors<F>,
    s0: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    df: &Tensors<F>,
    ranges: &[Range<usize>],
) -> Run<F> {
    let cpu = Backend::by_name("cpu").unwrap();
    let ranks = InProcess::group(ranges.len()).unwrap();
    let outs: Vec<_> = std::thread::scope(|sc| {
        let handles: Vec<_> = ranks
            .iter()
            .zip(ranges)
            .map(|(comm, r)| {
                let cpu = &cpu;
                sc.spawn(move || {
                    let xr = segment_from_state(m, x, r.clone()).unwrap();
                    let dyr = dy.slice_axis(Axis(1), Slice::from(r.clone())).to_owned();
                    let (y, fin) = forward(comm, m, cpu, &xr, s0).unwrap();
                    let (g, ds) = backward(comm, m, cpu, &xr, s0, &dyr, Some(df)).unwrap();
                    (y, fin, g, ds)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let join = |f: &dyn Fn(usize) -> ArrayD<F>| {
        let views: Vec<_> = (0..outs.len()).map(f).collect();
        ndarray::concatenate(Axis(1), &views.iter().map(|a| a.view()).collect::<Vec<_>>()).unwrap()
    };
    let y = join(&|i| outs[i].0.clone());
    let grads = outs[0].2.keys().map(|k| (k.clone(), join(&|i| outs[i].2[k].clone()))).collect();
    let last = outs.len() - 1;
    Run { y, fin: outs[last].1.clone(), grads, d_initial: outs[0].3.clone() }
}

fn close(label: &str, got: &ArrayD<f64>, want: &ArrayD<f64>, tol: Tolerance, bad: &mut Vec<String>) {
    let c = tol.compare_grad(got.view(), want.view());
    if !c.pass {
        bad.push(format!("{label}: rel_rms {:.3e}, max_abs {:.3e}", c.rel_rms, c.max_abs));
    }
}

fn compare<F: Scalar>(label: &str, got: &Run<F>, want: &Run<F>, tol: Tolerance, bad: &mut Vec<String>) {
    let f = |a: &ArrayD<F>| a.mapv(|v| v.f64());
    close(&format!("{label} y"), &f(&got.y), &f(&want.y), tol, bad);
    for (what, g, w) in [
        ("final", &got.fin, &want.fin),
        ("grad", &got.grads, &want.grads),
        ("d_initial", &got.d_initial, &want.d_initial),
    ] {
        if g.keys().ne(w.keys()) {
            bad.push(format!("{label} {what}: tensors {:?}, one device gives {:?}", g.keys(), w.keys()));
            continue;
        }
        let (g, w) = (tensors_to_f64(g), tensors_to_f64(w));
        for k in w.keys() {
            close(&format!("{label} {what} {k}"), &g[k], &w[k], tol, bad);
        }
    }
}

/// Every split of every rank count at `t` tokens: the parts on their ranks against one device,
/// f64 and f32, from `s0` and from zeros; the failures go to `bad`. Returns the runs made.
fn check_splits(
    m: &dyn Mixer,
    x: &Tensors<f64>,
    s0: &Tensors<f64>,
    dy: &ArrayD<f64>,
    label: &str,
    bad: &mut Vec<String>,
) -> usize {
    let t = x[m.spec().mixed].shape()[1];
    let df: Tensors<f64> = s0
        .iter()
        .map(|(k, v)| {
            (k.clone(), if k == "position" { v.mapv(|_| 0.0) } else { v.mapv(|e| (2.0 * e).cos()) })
        })
        .collect();
    let mut runs = 0;
    for n in [1, 2, 3, 4, 7] {
        for ranges in splits(t, n) {
            for with_s0 in [true, false] {
                let s = with_s0.then_some(s0);
                let label = format!("{label} T={t} parts {ranges:?} S_0: {with_s0}");
                compare(
                    &format!("{label} f64"),
                    &split(m, x, s, dy, &df, &ranges),
                    &whole(m, x, s, dy, &df),
                    Tolerance::F64,
                    bad,
                );
                let (x32, s32, dy32, df32) = (
                    cast_tensors::<f32>(x),
                    cast_tensors::<f32>(s0),
                    dy.mapv(|v| v as f32),
                    cast_tensors::<f32>(&df),
                );
                let s = with_s0.then_some(&s32);
                compare(
                    &format!("{label} f32"),
                    &split(m, &x32, s, &dy32, &df32, &ranges),
                    &whole(m, &x32, s, &dy32, &df32),
                    Tolerance::F32,
                    bad,
                );
                runs += 2;
            }
        }
    }
    runs
}

/// The GLR on a lattice and on translation-invariant patterns, on `b`, on `a` and on both (two
/// kept streams), from states at positions past 0 (inputs with room for them,
/// `Mixer::state_check_dims`).
#[test]
fn glr_ranks_equal_one_device_at_every_split() {
    let mut bad = Vec::new();
    let mut runs = 0;
    let configs = [
        ("glr", serde_json::json!({"pattern": "pow2", "cache_efficient": true})),
        ("glr", serde_json::json!({"pattern": "sq1"})),
        ("glr", serde_json::json!({"pattern": "pow2", "on": "a"})),
        ("glr", serde_json::json!({"pattern": "sq1", "on": "both"})),
        ("glr", serde_json::json!({"pattern": "pow2", "cache_efficient": true, "on": "both"})),
        ("kth-order", serde_json::json!({"order": 3})),
        ("diagonal-ssm", serde_json::json!({})),
    ];
    for (name, config) in configs {
        let m = mixer(name, &config).unwrap();
        for t in [1, 40, 97] {
            let dims: Dims = [("B", 2), ("T", t), ("C", 3)].into_iter().collect();
            let sd = m.state_check_dims(&dims);
            let x = m.random_inputs(&sd, 21).unwrap();
            let d = mixer_core::mixer::validate(m.as_ref(), &mixer_core::AnyTensors::F64(x.clone())).unwrap();
            let s0 = m.random_state(&d, 22).unwrap();
            let dy = ArrayD::from_shape_fn(x["x"].raw_dim(), |i| {
                ((i[1] * 5 + i[2] * 3 + i[0]) as f64 * 0.41).sin()
            });
            runs += check_splits(m.as_ref(), &x, &s0, &dy, &format!("{name} {config}"), &mut bad);
        }
    }
    assert!(bad.is_empty(), "{} comparisons differ over {runs} runs:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn ranks_equal_one_device_at_every_split() {
    let mut bad = Vec::new();
    let mut runs = 0;
    for name in mixers::core::mixers::loglinear::MEMBERS {
        let m = mixer(name, &serde_json::json!({"scale": 0.5})).unwrap();
        for t in [1, 63, 130] {
            // A lift's λ has two levels more than T needs, so its random state sits at a position
            // past 0.
            let levels = mixer_core::fenwick::num_levels(t) + 2;
            let dims: Dims =
                [("B", 2), ("T", t), ("H", 2), ("Dk", 5), ("Dv", 7), ("L", levels)].into_iter().collect();
            let x = m.random_inputs(&dims, 11).unwrap();
            let s0 = m.random_state(&dims, 12).unwrap();
            let dy = ArrayD::from_shape_fn(x["v"].raw_dim(), |i| {
                ((i[1] * 7 + i[3] * 3 + i[2]) as f64 * 0.37).sin()
            });
            let df: Tensors<f64> = s0.iter().map(|(k, v)| (k.clone(), v.mapv(|e| (2.0 * e).cos()))).collect();
            for n in [1, 2, 3, 4, 7] {
                for ranges in splits(t, n) {
                    for with_s0 in [true, false] {
                        let s = with_s0.then_some(&s0);
                        let label = format!("{name} T={t} parts {ranges:?} S_0: {with_s0}");
                        compare(
                            &format!("{label} f64"),
                            &split(m.as_ref(), &x, s, &dy, &df, &ranges),
                            &whole(m.as_ref(), &x, s, &dy, &df),
                            Tolerance::F64,
                            &mut bad,
                        );
                        let (x32, s32, dy32, df32) = (
                            cast_tensors::<f32>(&x),
                            cast_tensors::<f32>(&s0),
                            dy.mapv(|v| v as f32),
                            cast_tensors::<f32>(&df),
                        );
                        let s = with_s0.then_some(&s32);
                        compare(
                            &format!("{label} f32"),
                            &split(m.as_ref(), &x32, s, &dy32, &df32, &ranges),
                            &whole(m.as_ref(), &x32, s, &dy32, &df32),
                            Tolerance::F32,
                            &mut bad,
                        );
                        runs += 2;
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{} comparisons differ over {runs} runs:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn other_families_are_refused() {
    let cpu = Backend::by_name("cpu").unwrap();
    let ranks = InProcess::group(1).unwrap();
    for name in ["attention", "toeplitz"] {
        let m = mixer(name, &serde_json::json!({})).unwrap();
        let dims: Dims = [("B", 1), ("T", 8), ("H", 1), ("Dk", 4), ("Dv", 4), ("C", 4)].into_iter().collect();
        let x = m.random_inputs(&dims, 1).unwrap();
        let e = forward(&ranks[0], m.as_ref(), &cpu, &x, None).unwrap_err().to_string();
        assert!(
            e.contains("context parallelism covers the log-linear family") && e.contains("GLR"),
            "{name}: {e}"
        );
    }
    assert!(InProcess::group(0).is_err());
}

/// Two ranks at every split point of a short sequence (every Fenwick level boundary included):
/// the same as one device, f64, for a base mixer, a lift and a GLR lattice, from a state.
#[test]
fn two_ranks_equal_one_device_at_every_split_point() {
    let mut bad = Vec::new();
    let t = 21;
    let cases = [
        ("gated-deltanet", serde_json::json!({"scale": 0.5})),
        ("loglinear-gated-deltanet", serde_json::json!({"scale": 0.5})),
        ("glr", serde_json::json!({"pattern": "pow2", "cache_efficient": true})),
        ("glr", serde_json::json!({"pattern": "pow2", "on": "both"})),
    ];
    for (name, config) in cases {
        let m = mixer(name, &config).unwrap();
        let levels = mixer_core::fenwick::num_levels(t) + 2;
        let dims: Dims = [("B", 2), ("T", t), ("H", 2), ("Dk", 3), ("Dv", 4), ("L", levels), ("C", 3)]
            .into_iter()
            .collect();
        let sd = m.state_check_dims(&dims);
        let x = m.random_inputs(&sd, 31).unwrap();
        let d = mixer_core::mixer::validate(m.as_ref(), &mixer_core::AnyTensors::F64(x.clone())).unwrap();
        let s0 = m.random_state(&d, 32).unwrap();
        let mixed = &x[m.spec().mixed];
        let dy = ArrayD::from_shape_fn(mixed.raw_dim(), |i| ((i[1] * 3 + i[0] + i[2]) as f64 * 0.53).cos());
        let df: Tensors<f64> = s0
            .iter()
            .map(|(k, v)| (k.clone(), if k == "position" { v.mapv(|_| 0.0) } else { v.mapv(|e| e.sin()) }))
            .collect();
        let want = whole(m.as_ref(), &x, Some(&s0), &dy, &df);
        for a in 0..=t {
            let got = split(m.as_ref(), &x, Some(&s0), &dy, &df, &[0..a, a..t]);
            compare(&format!("{name} split at {a}"), &got, &want, Tolerance::F64, &mut bad);
        }
    }
    assert!(bad.is_empty(), "{} comparisons differ:\n{}", bad.len(), bad.join("\n"));
}

/// A rank whose part is invalid (`g > 0` for Mamba-2) makes every rank return an error that names
/// it, in the forward and in the backward, instead of leaving the others waiting.
#[test]
fn a_failing_rank_fails_every_rank_without_a_hang() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let m = mixer("mamba2", &serde_json::json!({})).unwrap();
        let dims: Dims = [("B", 1), ("T", 30), ("H", 1), ("Dk", 4), ("Dv", 4)].into_iter().collect();
        let x = m.random_inputs(&dims, 5).unwrap();
        let cpu = Backend::by_name("cpu").unwrap();
        let parts = [0..10, 10..20, 20..30];
        let ranks = InProcess::group(parts.len()).unwrap();
        let errors: Vec<(String, String)> = std::thread::scope(|sc| {
            let handles: Vec<_> = ranks
                .iter()
                .zip(&parts)
                .map(|(comm, r)| {
                    let (m, x, cpu) = (&m, &x, &cpu);
                    sc.spawn(move || {
                        let mut xr = segment_from_state(m.as_ref(), x, r.clone()).unwrap();
                        if r.start == 10 {
                            xr.get_mut("g").unwrap().fill(0.5); // a positive log decay: invalid
                        }
                        let f = forward(comm, m.as_ref(), cpu, &xr, None).unwrap_err().to_string();
                        let dy = ArrayD::zeros(xr["v"].raw_dim());
                        let b =
                            backward(comm, m.as_ref(), cpu, &xr, None, &dy, None).unwrap_err().to_string();
                        (f, b)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        tx.send(errors).unwrap();
    });
    let errors = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the ranks hung");
    for (f, b) in errors {
        for e in [f, b] {
            assert!(e.contains("rank 1 failed") && e.contains("log-decay must be ≤ 0"), "{e}");
        }
    }
}

/// States and parts of the wrong sizes are errors on every rank (never a panic): an initial
/// state of another shape, a rank with another head dim, a final-state cotangent of another shape.
#[test]
fn wrong_sizes_are_errors() {
    let cpu = Backend::by_name("cpu").unwrap();
    let m = mixer("gated-deltanet", &serde_json::json!({})).unwrap();
    let dims =
        |dk: usize| -> Dims { [("B", 1), ("T", 12), ("H", 2), ("Dk", dk), ("Dv", 3)].into_iter().collect() };
    let x = m.random_inputs(&dims(4), 1).unwrap();
    let other = m.random_inputs(&dims(5), 2).unwrap();
    let s0 = m.random_state(&dims(4), 3).unwrap();
    let bad_state: Tensors<f64> =
        [("S".to_string(), ArrayD::zeros(ndarray::IxDyn(&[1, 2, 4, 3])))].into_iter().collect();
    let run = |parts: [&Tensors<f64>; 2], initial: Option<&Tensors<f64>>, d_final: Option<&Tensors<f64>>| {
        let ranks = InProcess::group(2).unwrap();
        std::thread::scope(|sc| {
            let handles: Vec<_> = ranks
                .iter()
                .zip(parts)
                .map(|(comm, xr)| {
                    let (m, cpu) = (&m, &cpu);
                    sc.spawn(move || {
                        let dy = ArrayD::zeros(xr["v"].raw_dim());
                        let f = forward(comm, m.as_ref(), cpu, xr, initial).err().map(|e| e.to_string());
                        let b = backward(comm, m.as_ref(), cpu, xr, initial, &dy, d_final)
                            .err()
                            .map(|e| e.to_string());
                        (f, b)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect::<Vec<_>>()
        })
    };
    for (f, b) in run([&x, &x], Some(&bad_state), None) {
        assert!(f.as_deref().is_some_and(|e| e.contains("initial state")), "{f:?}");
        assert!(b.is_some(), "{b:?}");
    }
    for (f, b) in run([&x, &other], None, None) {
        assert!(f.as_deref().is_some_and(|e| e.contains("every part shares every size")), "{f:?}");
        assert!(b.is_some(), "{b:?}");
    }
    for (f, b) in run([&x, &x], Some(&s0), Some(&bad_state)) {
        assert!(f.is_none(), "{f:?}");
        assert!(b.as_deref().is_some_and(|e| e.contains("cotangent")), "{b:?}");
    }
}
