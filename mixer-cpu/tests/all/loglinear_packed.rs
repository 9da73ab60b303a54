//! The CPU log-linear family's native packed path (docs/math.md §7.2: one job list over
//! (sequence, head), `Family::packed` and `Family::packed_backward`): a packed batch gives every
//! sequence exactly what the sequence gets alone, bit for bit, in `f64` and `f32`, for the six
//! members — the plain forward, the forward from states with the final states, the backward
//! (static inputs' gradients summed over the sequences in order) and the backward from states
//! with the initial states' gradient — at lengths around the chunk (1, 2, 63, 64, 65, with an
//! empty sequence) and at seeded random lengths up to 5000, the last offset short of the buffer.
//! The same checks hold the GLR's native packed path (plain runs; from states its sequences run
//! one by one) on the translation-invariant and cache-efficient patterns, on `B`, `A` and both.

use mixer_core::mixer::complete_dims;
use mixer_core::state::{StateVjp, segment, segment_from_state, state_row};
use mixer_core::tensor::cast_tensors;
use mixer_core::{Form, Precision, Requires, Tensors};
use mixer_registry::family::Scalar;
use mixer_registry::harness::Sizes;
use mixer_registry::packed::{backward_packed, run_packed};
use mixer_registry::state::{backward_state, run_state};
use mixer_registry::{backward, mixer, run};
use ndarray::{ArrayD, Axis, Dimension, Slice};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::json;

use super::cpu;

/// The offsets of sequences of lengths `lens` back to back.
fn offsets(lens: &[usize]) -> Vec<usize> {
    std::iter::once(0)
        .chain(lens.iter().scan(0, |end, &n| {
            *end += n;
            Some(*end)
        }))
        .collect()
}

fn rows<F: Clone>(a: &ArrayD<F>, r: std::ops::Range<usize>) -> ArrayD<F> {
    a.slice_axis(Axis(1), Slice::from(r)).to_owned()
}

/// Whether `packed` is `alone` where `alone` has entries and zero elsewhere (a slot axis that
/// a shorter sequence alone has fewer slots of).
fn holds<F: Scalar>(packed: &ArrayD<F>, alone: &ArrayD<F>) -> bool {
    if packed.ndim() != alone.ndim() || packed.shape().iter().zip(alone.shape()).any(|(p, a)| p < a) {
        return false;
    }
    let mut inside = packed.view();
    for (ax, &n) in alone.shape().iter().enumerate() {
        inside.slice_axis_inplace(Axis(ax), Slice::from(0..n));
    }
    let outside_zero = packed
        .indexed_iter()
        .all(|(i, v)| *v == F::zero() || i.slice().iter().zip(alone.shape()).all(|(j, n)| j < n));
    inside == alone.view() && outside_zero
}

fn untag<F: Scalar>(g: std::collections::BTreeMap<String, mixer_core::Tensor>) -> Tensors<F> {
    g.into_iter().map(|(k, v)| (k, F::untag(v).expect("the inputs' dtype"))).collect()
}

/// Checks a packed batch of sequences of lengths `lens` (then `tail` rows past the last offset)
/// of `name` with `cfg` against the sequences run one by one, bit for bit.
fn check<F: Scalar>(name: &str, cfg: serde_json::Value, lens: &[usize], tail: usize, seed: u64) {
    let cpu = cpu();
    let m = mixer(name, &cfg).unwrap();
    let cu = offsets(lens);
    let t_len = cu[cu.len() - 1] + tail;
    let what = format!("{name} {cfg} {} lengths {lens:?} + {tail}", F::DTYPE.name());
    let sizes = Sizes { batch: 1, seq: t_len, channels: 1, heads: 2, dk: 5, dv: 3 };
    let dims = complete_dims(m.as_ref(), &sizes.dims());
    let mut x = m.random_inputs(&dims, seed).unwrap();
    if cfg.get("lambda_scheme").is_some() {
        // The optional static `lambda_param [H, L]`, whose gradient is a sum over the tokens.
        let l = x["lambda"].shape()[3];
        let p = ndarray::Array2::from_shape_fn((2, l), |(h, j)| 0.6 + 0.1 * (h * l + j) as f64);
        x.insert("lambda_param".into(), p.into_dyn());
    }
    let x = cast_tensors::<F>(&x);
    let mut state_dims = dims.clone();
    state_dims.insert("B", lens.len());
    let s0 = cast_tensors::<F>(&m.random_state(&state_dims, seed + 1).unwrap());
    let fast = Form::Fast;
    let exact = Precision::Exact;

    let (y, _) = run_packed(m.as_ref(), &cpu, fast, &x, &cu, None, false, exact).unwrap();
    let (ys, fin) = run_packed(m.as_ref(), &cpu, fast, &x, &cu, Some(&s0), true, exact).unwrap();
    let fin = fin.unwrap();
    let dy = y.mapv(|v| F::of((2.3 * v.f64() + 0.1).cos()));
    let df: Tensors<F> =
        fin.iter().map(|(k, v)| (k.clone(), v.mapv(|x| F::of((1.3 * x.f64()).sin())))).collect();
    let plain = StateVjp { x: &x, initial: None, dy: &dy, d_final: None, requires: &Requires::All };
    let (g, _) = backward_packed(m.as_ref(), &cpu, fast, &cu, plain).unwrap();
    let (gs, ds) = backward_packed(
        m.as_ref(),
        &cpu,
        fast,
        &cu,
        StateVjp { initial: Some(&s0), d_final: Some(&df), ..plain },
    )
    .unwrap();

    let per_token = m.spec().per_token();
    let is_token = |k: &str| per_token.iter().any(|p| p == k.strip_prefix("d_").unwrap_or(k));
    let zeros = |g: &Tensors<F>| -> Tensors<F> {
        g.iter().filter(|(k, _)| !is_token(k)).map(|(k, v)| (k.clone(), ArrayD::zeros(v.raw_dim()))).collect()
    };
    let (mut sums, mut sums_s) = (zeros(&g), zeros(&gs));
    for (i, w) in cu.windows(2).enumerate() {
        let r = w[0]..w[1];
        let (s_i, df_i) = (state_row(&s0, i), state_row(&df, i));
        if r.is_empty() {
            assert_eq!(state_row(&fin, i), s_i, "{what}: empty sequence {i}'s final state");
            assert_eq!(state_row(&ds, i), df_i, "{what}: empty sequence {i}'s state gradient");
            continue;
        }
        // A sequence alone: its slot axes (GLR) cut to its own length; from a state, kept whole.
        let seg = segment(m.as_ref(), &x, r.clone()).unwrap();
        let seg_s = segment_from_state(m.as_ref(), &x, r.clone()).unwrap();
        let dy_i = rows(&dy, r.clone());
        let alone = F::untag(run::run(m.as_ref(), &cpu, fast, &F::tag(seg.clone())).unwrap()).unwrap();
        assert!(rows(&y, r.clone()) == alone, "{what}: sequence {i}'s y");
        let (alone_s, fin_i) = run_state(m.as_ref(), &cpu, fast, &seg_s, Some(&s_i), exact).unwrap();
        assert!(rows(&ys, r.clone()) == alone_s, "{what}: sequence {i}'s y from a state");
        assert_eq!(state_row(&fin, i), fin_i, "{what}: sequence {i}'s final state");
        let g_i = untag::<F>(
            backward::backward(
                m.as_ref(),
                "cpu",
                fast,
                &F::tag(seg.clone()),
                &F::tag_one(dy_i.clone()),
                &Requires::All,
            )
            .unwrap(),
        );
        let (gs_i, ds_i) =
            backward_state(m.as_ref(), &cpu, fast, &seg_s, Some(&s_i), &dy_i, Some(&df_i), &Requires::All)
                .unwrap();
        assert_eq!(state_row(&ds, i), ds_i, "{what}: sequence {i}'s initial state gradient");
        for (packed, one, sums) in [(&g, &g_i, &mut sums), (&gs, &gs_i, &mut sums_s)] {
            assert_eq!(packed.keys().collect::<Vec<_>>(), one.keys().collect::<Vec<_>>(), "{what}");
            for (k, a) in one {
                match sums.get_mut(k) {
                    Some(acc) => *acc += a,
                    None => assert!(holds(&rows(&packed[k], r.clone()), a), "{what}: sequence {i}'s {k}"),
                }
            }
        }
    }
    let end = cu[cu.len() - 1];
    for (k, a) in g.iter().chain(&gs).filter(|(k, _)| is_token(k)) {
        assert!(rows(a, end..t_len).iter().all(|&v| v == F::zero()), "{what}: {k} past the end");
    }
    assert!(rows(&y, end..t_len).iter().chain(rows(&ys, end..t_len).iter()).all(|&v| v == F::zero()));
    for (packed, sums) in [(&g, &sums), (&gs, &sums_s)] {
        for (k, s) in sums {
            assert!(packed[k] == *s, "{what}: {k} is not the sum over the sequences");
        }
        assert_eq!(sums.contains_key("d_lambda_param"), x.contains_key("lambda_param"), "{what}");
    }
}

/// The configurations checked: the six members at the default chunk (64), and a lift with the
/// softplus λ scheme, whose `lambda_param` is a static input (its gradient a sum).
fn configs() -> Vec<(&'static str, serde_json::Value)> {
    let mut v: Vec<_> = ["linear-attention", "mamba2", "gated-deltanet"]
        .into_iter()
        .chain(["loglinear-attention", "loglinear-mamba2", "loglinear-gated-deltanet"])
        .map(|n| (n, json!({})))
        .collect();
    v.push(("loglinear-mamba2", json!({"lambda_scheme": "softplus"})));
    v
}

#[test]
fn the_cpu_log_linear_family_runs_packed_batches_natively() {
    let entry = mixer_registry::family("loglinear", "cpu").expect("the CPU log-linear family");
    assert!(entry.f64.implements_packed(Form::Fast) && entry.f32.implements_packed_backward(Form::Fast));
    assert!(!entry.f64.implements_packed(Form::Parallel), "only the fast form is native");
}

/// The λ parameter's gradient is checked (a static input: the sum over the sequences).
#[test]
fn the_checked_gradients_include_the_lambda_parameter() {
    let m = mixer("loglinear-mamba2", &json!({"lambda_scheme": "softplus"})).unwrap();
    assert!(m.spec().inputs.iter().any(|d| d.name == "lambda_param"));
    assert!(!m.spec().per_token().iter().any(|p| p == "lambda_param"));
}

#[test]
fn packed_batches_around_the_chunk_equal_the_sequences_alone_bit_for_bit() {
    for (i, (name, cfg)) in configs().into_iter().enumerate() {
        let seed = 50 + i as u64;
        check::<f64>(name, cfg.clone(), &[1, 2, 63, 0, 64, 65, 130], 3, seed);
        check::<f32>(name, cfg, &[65, 1, 64, 2, 0, 63], 0, seed);
    }
}

/// Seeded random lengths up to 5000 (about 10,000 tokens per batch).
#[test]
fn packed_batches_of_random_lengths_equal_the_sequences_alone_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(39);
    for (i, (name, cfg)) in configs().into_iter().enumerate() {
        let lens: Vec<usize> = (0..4).map(|_| rng.random_range(0..=5000)).collect();
        let tail = rng.random_range(0..3);
        if i % 2 == 0 {
            check::<f64>(name, cfg, &lens, tail, 70 + i as u64);
        } else {
            check::<f32>(name, cfg, &lens, tail, 70 + i as u64);
        }
    }
}

/// The `tf32` and `bf16` modes (f32 inputs), which the CPU handles at the boundary (no form of
/// its own for them): the native packed path gives every sequence what `run::run_with` and
/// `run_state` give it alone in the same mode, bit for bit — the exact form, on the activations
/// rounded to bf16 with `y` rounded in `bf16` — with and without states, zero past the end.
#[test]
fn packed_batches_in_the_tf32_and_bf16_modes_equal_the_sequences_alone_in_the_mode() {
    let cpu = cpu();
    let entry = mixer_registry::family("loglinear", "cpu").expect("the CPU log-linear family");
    assert!(!entry.f32.implements_precise(Form::Fast), "the CPU has no tf32/bf16 form of its own");
    let lens = [65, 0, 1, 64, 2, 63];
    let cu = offsets(&lens);
    let t_len = cu[cu.len() - 1] + 2;
    for (k, (name, cfg)) in configs().into_iter().enumerate() {
        let m = mixer(name, &cfg).unwrap();
        let sizes = Sizes { batch: 1, seq: t_len, channels: 1, heads: 2, dk: 5, dv: 3 };
        let dims = complete_dims(m.as_ref(), &sizes.dims());
        let mut x = m.random_inputs(&dims, 90 + k as u64).unwrap();
        if cfg.get("lambda_scheme").is_some() {
            let l = x["lambda"].shape()[3];
            x.insert("lambda_param".into(), ndarray::Array2::from_elem((2, l), 0.7).into_dyn());
        }
        let x = cast_tensors::<f32>(&x);
        let mut state_dims = dims.clone();
        state_dims.insert("B", lens.len());
        let s0 = cast_tensors::<f32>(&m.random_state(&state_dims, 91).unwrap());
        for p in [Precision::Tf32, Precision::Bf16] {
            let what = format!("{name} {cfg} {p}");
            let (y, _) = run_packed(m.as_ref(), &cpu, Form::Fast, &x, &cu, None, false, p).unwrap();
            let (ys, fin) = run_packed(m.as_ref(), &cpu, Form::Fast, &x, &cu, Some(&s0), true, p).unwrap();
            let fin = fin.unwrap();
            for (i, w) in cu.windows(2).enumerate() {
                let r = w[0]..w[1];
                if r.is_empty() {
                    continue;
                }
                let seg = segment(m.as_ref(), &x, r.clone()).unwrap();
                let alone = run::run_with(m.as_ref(), &cpu, Form::Fast, &f32::tag(seg.clone()), p).unwrap();
                assert!(rows(&y, r.clone()) == f32::untag(alone).unwrap(), "{what}: sequence {i}'s y");
                let (alone_s, fin_i) =
                    run_state(m.as_ref(), &cpu, Form::Fast, &seg, Some(&state_row(&s0, i)), p).unwrap();
                assert!(rows(&ys, r.clone()) == alone_s, "{what}: sequence {i}'s y from a state");
                assert_eq!(state_row(&fin, i), fin_i, "{what}: sequence {i}'s final state");
            }
            let end = cu[cu.len() - 1];
            assert!(rows(&y, end..t_len).iter().chain(rows(&ys, end..t_len).iter()).all(|&v| v == 0.0));
        }
    }
}

/// GLR configurations: patterns with and without their cache-efficient lattice, on `B`, on `A`
/// and on both (the dense recurrence, `K(T) = T − 1` slots, only at the short lengths).
fn glr_configs() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        ("glr", json!({"pattern": "pow2"})),
        ("glr", json!({"pattern": "sq1", "cache_efficient": true})),
        ("glr", json!({"pattern": "pow2", "on": "a"})),
        ("glr", json!({"pattern": "fibonacci", "on": "both"})),
        ("diagonal-ssm", json!({})),
    ]
}

#[test]
fn the_cpu_glr_runs_plain_packed_batches_natively_and_states_one_by_one() {
    let entry = mixer_registry::family("glr", "cpu").expect("the CPU GLR family");
    assert!(entry.f64.implements_packed(Form::Fast) && entry.f32.implements_packed_backward(Form::Fast));
    assert!(!entry.f64.implements_packed_states(Form::Fast));
}

#[test]
fn glr_packed_batches_equal_the_sequences_alone_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(40);
    for (i, (name, cfg)) in glr_configs().into_iter().chain([("dense-recurrence", json!({}))]).enumerate() {
        let seed = 150 + i as u64;
        check::<f64>(name, cfg.clone(), &[1, 2, 63, 0, 64, 65, 130], 3, seed);
        check::<f32>(name, cfg.clone(), &[65, 1, 64, 2, 0, 63], 0, seed);
        if name != "dense-recurrence" {
            let lens: Vec<usize> = (0..4).map(|_| rng.random_range(0..=5000)).collect();
            check::<f64>(name, cfg, &lens, rng.random_range(0..3), seed + 20);
        }
    }
}
