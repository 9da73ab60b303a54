//! Registry-wide checks of the Toeplitz mixer on CPU: every form against the f64 oracle,
//! the online decoder against the naive one at every step, and the error paths.

use super::cpu;
use mixer_core::mixer::{Decoder, Mixer};
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{AnyTensors, DType, Dims, Form, Tensors, Tolerance};
use mixer_cpu::toeplitz::{naive::NaiveDecoder, online::OnlineDecoder};
use mixer_registry::harness::{Sizes, check};
use mixer_registry::mixer;
use mixer_registry::run::{oracle, run, run_as};
use ndarray::{ArrayD, Axis, IxDyn, Slice};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const CONFIGS: [&str; 5] = [
    r#"{}"#,
    r#"{"heads": 2}"#,
    r#"{"heads": 3, "kernel_width": 2}"#,
    r#"{"heads": 2, "kernel_width": 4, "decoder": "naive"}"#,
    r#"{"heads": 1, "kernel_width": 3}"#,
];

/// Every form (parallel, fast, recurrent) × f64/f32 against the oracle, over lengths that
/// include 1, primes and non-fast FFT sizes, with bias (random inputs draw it).
#[test]
fn every_form_matches_the_oracle() {
    for cfg in CONFIGS {
        let m = mixer("toeplitz", &serde_json::from_str(cfg).unwrap()).unwrap();
        for t in [1usize, 2, 5, 64, 100, 257, 1000] {
            let sizes = Sizes { seq: t, ..Sizes::default() };
            let rows = check(m.as_ref(), &[cpu()], &sizes, 11 + t as u64);
            assert_eq!(rows.len(), 6, "{cfg} T={t}: {rows:?}");
            for r in &rows {
                assert!(
                    r.pass,
                    "{cfg} T={t} {} {:?}: rel {} max {} {:?}",
                    r.form, r.dtype, r.rel_rms, r.max_abs, r.error
                );
            }
        }
    }
}

fn random(m: &dyn Mixer, b: usize, t: usize, c: usize, seed: u64) -> Tensors<f64> {
    m.random_inputs(&[("B", b), ("T", t), ("C", c)].into_iter().collect(), seed).unwrap()
}

/// Without the optional bias, and with more channels per head than the kernel width.
#[test]
fn forms_without_bias() {
    for cfg in [json!({"heads": 2}), json!({"heads": 2, "kernel_width": 3})] {
        let m = mixer("toeplitz", &cfg).unwrap();
        let mut inp = random(m.as_ref(), 3, 77, 10, 5);
        inp.remove("bias");
        let want = oracle(m.as_ref(), &inp).unwrap();
        for form in [Form::Parallel, Form::Fast, Form::Recurrent] {
            for dt in [DType::F64, DType::F32] {
                let got = run_as(m.as_ref(), &cpu(), form, &inp, dt).unwrap();
                let c = Tolerance::for_dtype(dt.name()).compare(got.view(), want.view());
                assert!(c.pass, "{cfg} {form} {dt:?}: {c:?}");
            }
        }
    }
}

/// One kernel per head with more channels than one task's block of 16 and a partial last
/// block (C = 39), two batch rows, with and without bias: the fast form against the oracle.
#[test]
fn fast_form_over_channel_blocks() {
    let m = mixer("toeplitz", &json!({"heads": 3})).unwrap();
    for with_bias in [true, false] {
        let mut inp = random(m.as_ref(), 2, 300, 39, 21);
        if !with_bias {
            inp.remove("bias");
        }
        let want = oracle(m.as_ref(), &inp).unwrap();
        for dt in [DType::F64, DType::F32] {
            let got = run_as(m.as_ref(), &cpu(), Form::Fast, &inp, dt).unwrap();
            let c = Tolerance::for_dtype(dt.name()).compare(got.view(), want.view());
            assert!(c.pass, "bias {with_bias} {dt:?}: {c:?}");
        }
    }
}

/// Long sequences with a kernel that does not decay: fast (FFT) against direct, f64 and f32.
#[test]
fn fast_matches_direct_on_long_flat_kernels() {
    let m = mixer("toeplitz", &json!({"heads": 2, "kernel_width": 2})).unwrap();
    for t in [4099usize, 6000] {
        let mut inp = random(m.as_ref(), 1, t, 4, 9);
        let mut rng = StdRng::seed_from_u64(1);
        let s = 1.0 / (t as f64).sqrt();
        inp.insert(
            "w".into(),
            ArrayD::from_shape_fn(IxDyn(&[2, 2, t]), |_| s * (2.0 * rng.random::<f64>() - 1.0)),
        );
        for dt in [DType::F64, DType::F32] {
            let a = run_as(m.as_ref(), &cpu(), Form::Parallel, &inp, dt).unwrap();
            let b = run_as(m.as_ref(), &cpu(), Form::Fast, &inp, dt).unwrap();
            let tol = if dt == DType::F64 { Tolerance::F64 } else { Tolerance::F32 };
            let c = tol.compare(b.view(), a.view());
            assert!(c.pass, "T={t} {dt:?}: {c:?}");
        }
    }
}

/// A kernel (and bias) longer than T is truncated to T: same result as the truncated one,
/// for every form; and repeated calls (spectrum cache hits) give the same result.
#[test]
fn longer_kernels_are_truncated() {
    let m = mixer("toeplitz", &json!({"heads": 3, "kernel_width": 2})).unwrap();
    let t = 50;
    let long =
        m.random_inputs(&[("B", 2), ("T", t), ("C", 6), ("Tw", t + 13)].into_iter().collect(), 4).unwrap();
    let mut short = long.clone();
    for k in ["w", "bias"] {
        let a = &long[k];
        let ax = Axis(a.ndim() - 1);
        short.insert(k.into(), a.slice_axis(ax, Slice::from(0..t)).to_owned());
    }
    let want = oracle(m.as_ref(), &short).unwrap();
    let want_long = oracle(m.as_ref(), &long).unwrap();
    assert!(Tolerance::F64.compare(want_long.view(), want.view()).pass);
    for form in [Form::Parallel, Form::Fast, Form::Fast, Form::Recurrent] {
        let got = run(m.as_ref(), &cpu(), form, &AnyTensors::F64(long.clone())).unwrap().to_f64();
        let c = Tolerance::F64.compare(got.view(), want.view());
        assert!(c.pass, "{form}: {c:?}");
    }
}

/// Kernels shorter than T, C not divisible by H, a wrong head count: clear errors.
#[test]
fn clear_errors() {
    let m = mixer("toeplitz", &json!({"heads": 2})).unwrap();
    let mut inp = random(m.as_ref(), 1, 20, 4, 0);
    inp.insert("w".into(), ArrayD::zeros(IxDyn(&[2, 19])));
    inp.insert("bias".into(), ArrayD::zeros(IxDyn(&[2, 19])));
    for form in [Form::Fast, Form::Recurrent] {
        let e = run(m.as_ref(), &cpu(), form, &AnyTensors::F64(inp.clone())).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("Tw ≥ 20") && e.contains("Tw = 19"), "{e}");
    }
    let mut inp = random(m.as_ref(), 1, 20, 4, 0);
    inp.insert("x".into(), ArrayD::zeros(IxDyn(&[1, 20, 5])));
    let e = run(m.as_ref(), &cpu(), Form::Fast, &AnyTensors::F64(inp)).unwrap_err().to_string();
    assert!(e.contains("`x`") && e.contains("multiple of `heads`") && e.contains("C = 5"), "{e}");
    let mut inp = random(m.as_ref(), 1, 20, 4, 0);
    inp.insert("w".into(), ArrayD::zeros(IxDyn(&[3, 20])));
    let e = run(m.as_ref(), &cpu(), Form::Parallel, &AnyTensors::F64(inp)).unwrap_err().to_string();
    assert!(e.contains("`w`") && e.contains("[3, 20]"), "{e}");
    // The kernel variant wants w [Kw, H, Tw].
    let m = mixer("toeplitz", &json!({"heads": 2, "kernel_width": 3})).unwrap();
    let mut inp = random(m.as_ref(), 1, 20, 4, 0);
    inp.insert("w".into(), ArrayD::zeros(IxDyn(&[2, 20])));
    let e = run(m.as_ref(), &cpu(), Form::Fast, &AnyTensors::F64(inp)).unwrap_err().to_string();
    assert!(e.contains("`w`") && e.contains("rank 3"), "{e}");
}

fn statics(inp: &Tensors<f64>) -> Tensors<f64> {
    inp.iter().filter(|(k, _)| k.as_str() != "x").map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn token(x: &ArrayD<f64>, t: usize) -> Tensors<f64> {
    [("x".to_string(), x.index_axis(Axis(1), t).to_owned())].into_iter().collect()
}

/// The online decoder equals the naive one at every step up to T = 5000 (flat kernel, so
/// every lag matters), for a multi-head, kernel-width-2 configuration with bias.
#[test]
fn online_decoder_equals_naive_at_every_step() {
    let t_len = 5000;
    let tm = Toeplitz::from_json("toeplitz", &json!({"heads": 2, "kernel_width": 2})).unwrap();
    let mut inp = random(&tm, 2, t_len, 4, 21);
    let mut rng = StdRng::seed_from_u64(2);
    let s = 1.0 / (t_len as f64).sqrt();
    inp.insert(
        "w".into(),
        ArrayD::from_shape_fn(IxDyn(&[2, 2, t_len]), |_| s * (2.0 * rng.random::<f64>() - 1.0)),
    );
    let dims: Dims = [("B", 2), ("T", t_len), ("C", 4), ("Tw", t_len)].into_iter().collect();
    let st = statics(&inp);
    let mut on = OnlineDecoder::new(&tm, &st, &dims).unwrap();
    let mut nv = NaiveDecoder::new(&tm, &st, &dims).unwrap();
    let x = &inp["x"];
    let mut worst = 0.0f64;
    for t in 0..t_len {
        let tok = token(x, t);
        let a = on.step(&tok).unwrap();
        let b = nv.step(&tok).unwrap();
        let scale = b.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let err = a.iter().zip(b.iter()).fold(0.0f64, |m, (p, q)| m.max((p - q).abs())) / scale;
        worst = worst.max(err);
        assert!(err < 1e-11, "step {t}: {err}");
        assert_eq!((on.position(), nv.position()), (t + 1, t + 1));
        assert_eq!(nv.cache_elems(), 2 * 4 * (t + 1));
        assert!(on.cache_elems() >= nv.cache_elems() && on.cache_elems() <= 2 * nv.cache_elems());
    }
    // Past the kernel: a clear error.
    let e = on.step(&token(x, 0)).unwrap_err().to_string();
    assert!(e.contains("built for T = 5000 tokens") && e.contains("step 5001"), "{e}");
    eprintln!("worst relative step error {worst:e}");
}

/// The same in f32 (every step within f32 accuracy) for the single-kernel variant.
#[test]
fn online_decoder_f32_tracks_naive() {
    let t_len = 3000;
    let tm = Toeplitz::from_json("toeplitz", &json!({})).unwrap();
    let inp = random(&tm, 1, t_len, 3, 8);
    let dims: Dims = [("B", 1), ("T", t_len), ("C", 3), ("Tw", t_len)].into_iter().collect();
    let inp32 = mixer_core::tensor::cast_tensors::<f32>(&inp);
    let st: Tensors<f32> =
        inp32.iter().filter(|(k, _)| k.as_str() != "x").map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut on = OnlineDecoder::<f32>::new(&tm, &st, &dims).unwrap();
    let mut nv = NaiveDecoder::<f32>::new(&tm, &st, &dims).unwrap();
    for t in 0..t_len {
        let tok: Tensors<f32> =
            [("x".to_string(), inp32["x"].index_axis(Axis(1), t).to_owned())].into_iter().collect();
        let a = on.step(&tok).unwrap();
        let b = nv.step(&tok).unwrap();
        for (p, q) in a.iter().zip(b.iter()) {
            assert!((p - q).abs() <= 2e-5 * q.abs().max(1.0), "step {t}: {p} vs {q}");
        }
    }
}

/// A decoder built with a kernel longer than the sequence decodes up to Tw tokens, and its
/// prefix equals the full run's.
#[test]
fn decoders_accept_full_length_kernels_for_a_prefix() {
    for dec in ["online", "naive"] {
        let m = mixer("toeplitz", &json!({"heads": 2, "decoder": dec})).unwrap();
        let full = m.random_inputs(&[("B", 1), ("T", 90), ("C", 4)].into_iter().collect(), 3).unwrap();
        let want = oracle(m.as_ref(), &full).unwrap();
        let mut prefix = full.clone();
        prefix.insert("x".into(), full["x"].slice_axis(Axis(1), Slice::from(0..37)).to_owned());
        let got = run(m.as_ref(), &cpu(), Form::Recurrent, &AnyTensors::F64(prefix)).unwrap().to_f64();
        let want = want.slice_axis(Axis(1), Slice::from(0..37)).to_owned();
        assert!(Tolerance::F64.compare(got.view(), want.view()).pass, "{dec}");
    }
}

#[test]
fn registered_examples_check_clean() {
    let e = mixer_registry::mixer_entry("toeplitz").unwrap();
    assert_eq!(e.family, "toeplitz");
    for cfg in e.examples {
        let m = mixer("toeplitz", &serde_json::from_str(cfg).unwrap()).unwrap();
        assert_eq!(mixer_registry::run::forms(m.as_ref(), &cpu()).len(), 4);
        for r in check(m.as_ref(), &[cpu()], &Sizes { seq: 41, ..Sizes::default() }, 0) {
            assert!(r.pass, "{cfg}: {r:?}");
        }
    }
}
