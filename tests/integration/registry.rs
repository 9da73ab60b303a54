//! Registry-wide properties (builtins and the linked example plugin): unique names, every
//! mixer's examples build and pass the cross-check on the CPU, every registered pattern meets
//! the lattice invariant.

use mixers::prelude::*;
use mixers::registry::{MIXERS, PATTERNS};

#[test]
fn names_are_unique() {
    assert!(mixers::registry::duplicates().is_empty(), "{:?}", mixers::registry::duplicates());
}

#[test]
fn every_pattern_meets_the_lattice_invariant() {
    for e in PATTERNS.iter() {
        let p = mixers::core::pattern::Pattern::new(e.name, e.offset, None, true)
            .unwrap_or_else(|err| panic!("{}: {err}", e.name));
        p.check_lattice_invariant(3000).unwrap_or_else(|err| panic!("{err}"));
    }
}

#[test]
fn every_mixer_example_passes_on_cpu() {
    let cpu = vec![Backend::by_name("cpu").unwrap()];
    let mut checked = 0;
    for e in MIXERS.iter() {
        for ex in e.examples {
            let cfg: serde_json::Value = serde_json::from_str(ex).unwrap();
            let m = (e.build)(e.name, &cfg).unwrap_or_else(|err| panic!("{} {ex}: {err}", e.name));
            for seq in [1, 2, 29] {
                for r in mixers::registry::check(m.as_ref(), &cpu, &Sizes { seq, ..Sizes::default() }, 11) {
                    assert!(r.pass, "{} {ex} T={seq}: {r:?}", e.name);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 0);
}

#[test]
fn auto_backend_is_cpu_without_a_gpu() {
    let cuda = mixers::registry::backend_entry("cuda").unwrap();
    if let mixers::registry::Availability::Unavailable(reason) = (cuda.probe)() {
        if std::env::var("MIXERS_BACKEND").is_err() && std::env::var("MIXERS_REQUIRE_CUDA").is_err() {
            assert_eq!(Backend::auto().unwrap().name(), "cpu", "no GPU ({reason}) → cpu");
        }
    } else {
        eprintln!(
            "a CUDA device is present; auto() → {}",
            Backend::auto().map(|b| b.name()).unwrap_or("error")
        );
    }
}

/// Gradients, three ways, for every registered mixer's examples on the CPU: the
/// materialized backward against central finite differences, every fast backward against
/// it in f64, and in f32 (T = 1, and lengths that are not chunk multiples).
#[test]
fn every_mixer_gradient_passes_three_ways_on_cpu() {
    let cpu = vec![Backend::by_name("cpu").unwrap()];
    let (mut fd, mut fast) = (0, 0);
    let mut failed = Vec::new();
    for e in MIXERS.iter() {
        for ex in e.examples {
            let cfg: serde_json::Value = serde_json::from_str(ex).unwrap();
            let m = (e.build)(e.name, &cfg).unwrap_or_else(|err| panic!("{} {ex}: {err}", e.name));
            for seq in [1, 19] {
                let sizes = Sizes { seq, ..Sizes::default() };
                for r in mixers::registry::check_grad(m.as_ref(), &cpu, &sizes, 5) {
                    if !r.pass {
                        failed.push(format!("{} {ex} T={seq}: {r:?}", e.name));
                    }
                    if r.form == mixers::registry::grad_check::FINITE_DIFFERENCES {
                        fd += 1;
                    } else {
                        fast += 1;
                    }
                }
            }
        }
    }
    assert!(failed.is_empty(), "{} failures:\n{}", failed.len(), failed.join("\n"));
    assert!(fd > 100 && fast > 100, "{fd} finite-difference rows, {fast} fast rows");
}

/// With λ ≡ 1 a lifted mixer's gradients with respect to the base inputs are the base
/// mixer's, on every backward form.
#[test]
fn gradients_reduce_to_the_base_mixer_when_lambda_is_one() {
    use mixers::registry::backward::{backward_as, backward_forms};
    for base in ["linear-attention", "mamba2", "gated-deltanet"] {
        let lifted = format!("loglinear-{}", if base == "linear-attention" { "attention" } else { base });
        let mb = mixers::registry::mixer(base, &serde_json::json!({"chunk": 8})).unwrap();
        let ml = mixers::registry::mixer(&lifted, &serde_json::json!({"chunk": 8})).unwrap();
        let sizes = Sizes { seq: 21, ..Sizes::default() };
        let x = mixers::registry::grad_check::grad_inputs(mb.as_ref(), &sizes, 2).unwrap();
        let mut xl = x.clone();
        let (b, t, h) = (x["q"].shape()[0], x["q"].shape()[1], x["q"].shape()[2]);
        xl.insert("lambda".into(), ndarray::ArrayD::from_elem(ndarray::IxDyn(&[b, t, h, 6]), 1.0));
        let dy = x["v"].mapv(|v| (3.0 * v).sin());
        let want =
            backward_as(mb.as_ref(), "cpu", Form::Materialized, &x, &dy, DType::F64, &Requires::All).unwrap();
        for form in backward_forms(ml.as_ref(), "cpu") {
            let got = backward_as(ml.as_ref(), "cpu", form, &xl, &dy, DType::F64, &Requires::All).unwrap();
            for (name, w) in &want {
                let c = Tolerance::F64.compare(got[name].view(), w.view());
                assert!(c.pass, "{lifted} {form} {name}: {c:?}");
            }
            assert!(got.contains_key("d_lambda"));
        }
    }
}

/// The log-linear family's fast backward runs through the chunk form (gated DeltaNet's WY/UT
/// form), so its checks must span many chunks: chunk sizes 1, 4 and 8 against lengths that
/// are 1, shorter than a chunk, and several chunks with a partial last one (the lifts then
/// read up to four chunk levels).
#[test]
fn loglinear_backward_three_ways_over_many_chunks() {
    let cpu = vec![Backend::by_name("cpu").unwrap()];
    let (mut fast, mut failed) = (0, Vec::new());
    for name in mixers::core::mixers::loglinear::MEMBERS {
        for chunk in [1, 4, 8] {
            let m =
                mixers::registry::mixer(name, &serde_json::json!({"chunk": chunk, "scale": 0.7})).unwrap();
            for seq in [1, 3, 29, 45] {
                let sizes = Sizes { seq, batch: 1, ..Sizes::default() };
                for r in mixers::registry::check_grad(m.as_ref(), &cpu, &sizes, 9) {
                    if !r.pass {
                        failed.push(format!("{name} chunk {chunk} T={seq}: {r:?}"));
                    }
                    fast += usize::from(r.form == "fast");
                }
            }
        }
    }
    assert!(failed.is_empty(), "{} failures:\n{}", failed.len(), failed.join("\n"));
    // At least q, k, v in f64 and f32, for 6 mixers × 3 chunks × 4 lengths.
    assert!(fast >= 6 * 3 * 4 * 2 * 3, "{fast} fast rows");
}

/// Asserts that `m`'s fast backward on the CPU has the gradients of its materialized one, within
/// the `f64` tolerance, for the cotangent `dy` at `x`; `what` names the case.
fn fast_backward_is_the_reference(m: &dyn Mixer, x: &Tensors<f64>, dy: &ndarray::ArrayD<f64>, what: &str) {
    use mixers::registry::backward::backward_as;
    let want = backward_as(m, "cpu", Form::Materialized, x, dy, DType::F64, &Requires::All).unwrap();
    let got = backward_as(m, "cpu", Form::Fast, x, dy, DType::F64, &Requires::All).unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, w) in &want {
        let c = Tolerance::F64.compare(got[k].view(), w.view());
        assert!(c.pass, "{what} {k}: {c:?}");
    }
}

/// A state that decays below the smallest normal number inside a chunk is dropped by the
/// chunked forward; the backward passes it no adjoint, and the gradients still match the
/// materialized reference (log-decays of −200 per token over a stretch of two chunks).
#[test]
fn loglinear_backward_with_states_dropped_by_decay() {
    for name in ["mamba2", "gated-deltanet", "loglinear-mamba2", "loglinear-gated-deltanet"] {
        let m = mixers::registry::mixer(name, &serde_json::json!({"chunk": 4})).unwrap();
        let sizes = Sizes { seq: 27, batch: 1, ..Sizes::default() };
        let mut x = mixers::registry::grad_check::grad_inputs(m.as_ref(), &sizes, 3).unwrap();
        x.get_mut("g").unwrap().slice_mut(ndarray::s![.., 8..16, ..]).fill(-200.0);
        let dy = x["v"].mapv(|v| (2.0 * v).cos());
        fast_backward_is_the_reference(m.as_ref(), &x, &dy, name);
    }
}

/// Attention's fast backward works in 128 × 128 tiles and sums `q̄` over key blocks: a length
/// of three partial blocks, full and windowed (a window wider than a block), and a negative
/// scale (the vectorised exponentials take the sign into the keys), against the reference in
/// f64 and f32.
#[test]
fn attention_backward_over_several_blocks() {
    use mixers::registry::backward::backward_as;
    let configs = [serde_json::json!({}), serde_json::json!({"window": 150, "scale": -0.4})];
    for cfg in configs {
        let m = mixers::registry::mixer("attention", &cfg).unwrap();
        let sizes = Sizes { seq: 301, batch: 1, ..Sizes::default() };
        let x = mixers::registry::grad_check::grad_inputs(m.as_ref(), &sizes, 4).unwrap();
        let dy = x["v"].mapv(|v| (1.7 * v).sin());
        let want =
            backward_as(m.as_ref(), "cpu", Form::Materialized, &x, &dy, DType::F64, &Requires::All).unwrap();
        for (dtype, tol) in [(DType::F64, Tolerance::F64), (DType::F32, Tolerance::F32)] {
            let got = backward_as(m.as_ref(), "cpu", Form::Fast, &x, &dy, dtype, &Requires::All).unwrap();
            for (k, w) in &want {
                let c = tol.compare(got[k].view(), w.view());
                assert!(c.pass, "{cfg} {dtype:?} {k}: {c:?}");
            }
        }
    }
}

/// The Toeplitz backward skips the work of gradients that are not required; what it returns
/// for a subset equals the full pass (one kernel per head, which streams, and `Kw = 2`).
#[test]
fn toeplitz_backward_subsets_match_the_full_pass() {
    use mixers::registry::backward::backward_as;
    for cfg in [serde_json::json!({"heads": 2}), serde_json::json!({"heads": 3, "kernel_width": 2})] {
        let m = mixers::registry::mixer("toeplitz", &cfg).unwrap();
        let x =
            mixers::registry::grad_check::grad_inputs(m.as_ref(), &Sizes { seq: 23, ..Sizes::default() }, 6)
                .unwrap();
        let dy = x["x"].mapv(|v| (1.3 * v).cos());
        let all = backward_as(m.as_ref(), "cpu", Form::Fast, &x, &dy, DType::F64, &Requires::All).unwrap();
        for name in ["x", "w"] {
            let one =
                backward_as(m.as_ref(), "cpu", Form::Fast, &x, &dy, DType::F64, &Requires::only([name]))
                    .unwrap();
            let key = format!("d_{name}");
            assert_eq!(one.keys().collect::<Vec<_>>(), [&key], "{cfg}");
            assert_eq!(one[&key], all[&key], "{cfg} {name}");
        }
    }
}

/// The GLR backward writes each (batch row, channel block) of its gradients in place: with
/// 41 channels there are several blocks of at least 16 (the last one shorter), for every `on`.
#[test]
fn glr_backward_over_several_channel_blocks() {
    for cfg in [
        serde_json::json!({"pattern": "pow2"}),
        serde_json::json!({"pattern": "sq1", "on": "a", "cache_efficient": true}),
        serde_json::json!({"pattern": "pow2", "on": "both"}),
    ] {
        let m = mixers::registry::mixer("glr", &cfg).unwrap();
        let sizes = Sizes { seq: 23, batch: 2, channels: 41, ..Sizes::default() };
        let x = mixers::registry::grad_check::grad_inputs(m.as_ref(), &sizes, 8).unwrap();
        let dy = x["x"].mapv(|v| (0.9 * v).sin());
        fast_backward_is_the_reference(m.as_ref(), &x, &dy, &cfg.to_string());
    }
}

/// `requires` selects gradients; bad names, absent inputs and a wrong `dy` are errors.
#[test]
fn backward_requires_and_validation() {
    use mixers::registry::backward::backward;
    let m = mixers::registry::mixer("mamba2", &serde_json::json!({})).unwrap();
    let x = mixers::registry::grad_check::grad_inputs(m.as_ref(), &Sizes { seq: 7, ..Sizes::default() }, 1)
        .unwrap();
    let inputs = AnyTensors::F64(x.clone());
    let dy = Tensor::F64(x["v"].clone());
    let only = Requires::only(["g", "q"]);
    let g = backward(m.as_ref(), "cpu", Form::Materialized, &inputs, &dy, &only).unwrap();
    assert_eq!(g.keys().collect::<Vec<_>>(), ["d_g", "d_q"]);
    let e = backward(m.as_ref(), "cpu", Form::Materialized, &inputs, &dy, &Requires::only(["lambda"]))
        .unwrap_err();
    assert!(e.to_string().contains("`lambda`"), "{e}");
    let short = Tensor::F64(x["v"].slice(ndarray::s![.., ..3, .., ..]).to_owned().into_dyn());
    let e = backward(m.as_ref(), "cpu", Form::Materialized, &inputs, &short, &Requires::All).unwrap_err();
    assert!(e.to_string().contains("dy"), "{e}");
    let dy32 = Tensor::F32(x["v"].mapv(|v| v as f32));
    assert!(backward(m.as_ref(), "cpu", Form::Materialized, &inputs, &dy32, &Requires::All).is_err());
    let e = backward(m.as_ref(), "cpu", Form::Recurrent, &inputs, &dy, &Requires::All).unwrap_err();
    assert!(e.to_string().contains("backward"), "{e}");
}

/// Found by the config fuzzer (issue 14): serde reads a JSON array as a struct's fields in
/// order, so `[1e308]` was accepted as `{"scale": 1e308}`. A config must be an object.
#[test]
fn configs_must_be_objects() {
    for cfg in [serde_json::json!([1e308]), serde_json::json!(3), serde_json::json!("pow2")] {
        for name in ["gated-deltanet", "attention", "glr", "toeplitz"] {
            let e = mixers::registry::mixer(name, &cfg).unwrap_err().to_string();
            assert!(e.contains("a config is a JSON object") && e.contains(&cfg.to_string()), "{name}: {e}");
        }
    }
    assert!(mixers::registry::mixer("attention", &serde_json::Value::Null).is_ok());
}

/// A backward given the forward's output (`y`, `mixer_core::grad::SAVED_OUTPUT`): the GLR reads
/// it instead of running its forward again, with the same bits; other mixers and the
/// materialized form ignore it; it has no gradient; a wrong shape, a non-finite value, or a
/// packed or stateful backward is an error that names it.
#[test]
fn backward_takes_the_forwards_saved_output() {
    use mixers::core::Precision;
    use mixers::core::tensor::cast_tensors;
    use mixers::registry::backward::{backward, backward_typed_with};
    use mixers::registry::run::run_typed_with;
    let cpu = Backend::by_name("cpu").unwrap();
    let glr = [
        ("glr", serde_json::json!({"pattern": "pow2"})),
        ("glr", serde_json::json!({"pattern": "pow2", "on": "both", "cache_efficient": true})),
        ("glr", serde_json::json!({"pattern": "sq1", "on": "a"})),
    ];
    for (name, cfg) in glr.iter().cloned().chain([("mamba2", serde_json::json!({}))]) {
        let m = mixers::registry::mixer(name, &cfg).unwrap();
        let sizes = Sizes { seq: 37, batch: 2, channels: 41, ..Sizes::default() };
        let x = mixers::registry::grad_check::grad_inputs(m.as_ref(), &sizes, 3).unwrap();
        let mixed = m.spec().mixed;
        let dy = x[mixed].mapv(|v| (1.3 * v).cos());
        for form in [Form::Fast, Form::Materialized] {
            let y = run_typed_with(m.as_ref(), &cpu, form, &x, Precision::Exact).unwrap();
            let mut with_y = x.clone();
            with_y.insert("y".into(), y.clone());
            let want =
                backward_typed_with(m.as_ref(), "cpu", form, &x, &dy, &Requires::All, Precision::Exact)
                    .unwrap();
            let got =
                backward_typed_with(m.as_ref(), "cpu", form, &with_y, &dy, &Requires::All, Precision::Exact)
                    .unwrap();
            assert_eq!(got, want, "{name} {cfg} {form:?}: the same gradients, and no d_y");
            // f32 the same way.
            let x32 = cast_tensors::<f32>(&x);
            let y32 = run_typed_with(m.as_ref(), &cpu, form, &x32, Precision::Exact).unwrap();
            let mut with_y32 = x32.clone();
            with_y32.insert("y".into(), y32);
            let dy32 = dy.mapv(|v| v as f32);
            let want =
                backward_typed_with(m.as_ref(), "cpu", form, &x32, &dy32, &Requires::All, Precision::Exact);
            let got = backward_typed_with(
                m.as_ref(),
                "cpu",
                form,
                &with_y32,
                &dy32,
                &Requires::All,
                Precision::Exact,
            );
            assert_eq!(got.unwrap(), want.unwrap(), "{name} {cfg} {form:?} f32");
        }
        // The GLR's fast backward reads the given y (as `backward_reads_output` says): another y
        // gives other gradients for beta.
        let reads = name == "glr" && cfg.get("on").is_none_or(|o| o != "a");
        assert_eq!(m.backward_reads_output(), reads, "{name} {cfg}: backward_reads_output");
        if reads {
            let mut other = x.clone();
            other.insert("y".into(), x[mixed].mapv(|v| 0.5 * v + 0.25));
            let a =
                backward_typed_with(m.as_ref(), "cpu", Form::Fast, &x, &dy, &Requires::All, Precision::Exact)
                    .unwrap();
            let b = backward_typed_with(
                m.as_ref(),
                "cpu",
                Form::Fast,
                &other,
                &dy,
                &Requires::All,
                Precision::Exact,
            )
            .unwrap();
            assert_ne!(a["d_beta"], b["d_beta"], "{cfg}: the saved output is read");
            assert_eq!(a["d_alpha"], b["d_alpha"], "{cfg}: only beta's gradient reads y");
        }
        // Errors name it: a wrong shape, a non-finite value.
        let short = x[mixed].slice_axis(ndarray::Axis(1), (0..5).into()).to_owned();
        let mut nan = x[mixed].clone();
        *nan.iter_mut().nth(7).unwrap() = f64::NAN;
        for (y, want) in [(short, "input `y`: expected shape"), (nan, "input `y`: values must be finite")] {
            let mut bad = x.clone();
            bad.insert("y".into(), y);
            let dy = Tensor::F64(dy.clone());
            let e = backward(m.as_ref(), "cpu", Form::Fast, &AnyTensors::F64(bad), &dy, &Requires::All)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        }
        let mut with_y = x.clone();
        with_y.insert("y".into(), x[mixed].clone());
        let at = mixers::registry::call::Target {
            mixer: m.as_ref(),
            backend: &cpu,
            form: Form::Fast,
            cu_seqlens: Some(&[0, 10, 37]),
        };
        let e =
            mixers::registry::call::backward(at, &with_y, None, &dy, None, &Requires::All, Precision::Exact)
                .unwrap_err()
                .to_string();
        assert!(e.contains("`y`"), "{e}");
    }
}
