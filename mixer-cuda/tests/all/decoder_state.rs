//! Decoders started from a state on CUDA (docs/math.md §7.1): prefill on the CPU, then the CUDA
//! decoder built from its final state. At every split its outputs are the whole run's rows after
//! the split and its exported state is the whole run's final state; the whole run by the CUDA
//! decoder from the initial state equals the CPU's in `f64` and `f32`.

use mixer_core::mixer::{complete_dims, run_decoder, validate, validate_typed};
use mixer_core::state::segment_from_state;
use mixer_core::tensor::cast_tensors;
use mixer_core::{AnyTensors, Form, Mixer, Precision, Tensors, Tolerance};
use mixer_registry::harness::Sizes;
use mixer_registry::mixer;
use mixer_registry::state::{decoder_from_state, run_state};
use ndarray::{Axis, Slice};
use serde_json::json;

use super::common;

/// One configuration per family and state layout: the log-linear members (a state of level
/// states or one state) and those whose state is a cache or a prefix of the inputs.
fn configs() -> Vec<(&'static str, serde_json::Value)> {
    let mut c = vec![
        ("linear-attention", json!({})),
        ("mamba2", json!({})),
        ("gated-deltanet", json!({})),
        ("loglinear-attention", json!({"lambda_scheme": "softplus"})),
        ("loglinear-mamba2", json!({})),
        ("loglinear-gated-deltanet", json!({})),
    ];
    c.extend(mixer_registry::harness::cache_state_configs());
    c
}

/// The inputs of `t` tokens and a random initial state (rows at different positions or cached
/// lengths where the state has them), as the CPU's state tests draw them.
fn setup(m: &dyn Mixer, sizes: &Sizes, seed: u64) -> (Tensors<f64>, Tensors<f64>) {
    let d = complete_dims(m, &sizes.dims());
    let d = validate(m, &AnyTensors::F64(m.random_inputs(&d, seed).unwrap())).unwrap();
    let x = m.random_inputs(&m.state_check_dims(&d), seed).unwrap();
    let d = validate(m, &AnyTensors::F64(x.clone())).unwrap();
    let s0 = m.random_state(&d, seed).unwrap();
    (x, s0)
}

/// Prefill of `x[0:a]` on the CPU, then the CUDA decoder from its final state over `x[a:T]`, at
/// every split `a`: its outputs are rows `a..` of the CPU's whole run, its `position` counts the
/// tokens it consumed, and its exported state is the whole run's final state.
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_decoders_continue_a_prefill_at_any_split() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let (cpu, gpu) = (common::cpu(), common::cuda());
    let tol = Tolerance::F64;
    for (name, cfg) in configs() {
        let m = mixer(name, &cfg).unwrap();
        assert!(mixer_registry::state::forms(m.as_ref(), &gpu).contains(&Form::Recurrent), "{name} {cfg}");
        for (t, dk, dv) in [(12, 3, 2), (37, 33, 20)] {
            let sizes = Sizes { batch: 2, seq: t, channels: 4, heads: 2, dk, dv };
            let (x, s0) = setup(m.as_ref(), &sizes, 5);
            let (y, fin) = run_state(m.as_ref(), &cpu, Form::Fast, &x, Some(&s0), Precision::Exact).unwrap();
            let splits: Vec<usize> =
                if t <= 12 { (0..=t).collect() } else { vec![0, 1, 8, 16, 31, 32, 33, t] };
            for a in splits {
                let head = segment_from_state(m.as_ref(), &x, 0..a).unwrap();
                let (_, sa) =
                    run_state(m.as_ref(), &cpu, Form::Fast, &head, Some(&s0), Precision::Exact).unwrap();
                let tail = segment_from_state(m.as_ref(), &x, a..t).unwrap();
                let d = validate_typed(m.as_ref(), &tail).unwrap();
                let mut dec = decoder_from_state(m.as_ref(), &gpu, &tail, &d, Some(&sa)).unwrap();
                let yd = run_decoder(dec.as_mut(), &m.spec(), &tail, |_, _| {}).unwrap();
                assert_eq!(dec.position(), t - a, "{name} {cfg} T={t} split {a}: position");
                let c = tol.compare(yd.view(), y.slice_axis(Axis(1), Slice::from(a..t)));
                assert!(c.pass, "{name} {cfg} T={t} split {a}: y {c:?}");
                let sd = dec.state().unwrap();
                for (k, v) in &fin {
                    let c = tol.compare(sd[k].view(), v.view());
                    assert!(c.pass, "{name} {cfg} T={t} split {a}: state `{k}` {c:?}");
                }
            }
        }
    }
}

/// The `recurrent` form from a state through the registry on CUDA (the decoder run over the
/// sequence, its state read at the end) equals the CPU's, `f64` and `f32`, and from no state its
/// final state is the CPU's too.
#[test]
#[ignore = "needs a CUDA device"]
fn the_recurrent_form_from_a_state_on_cuda_matches_the_cpu() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let (cpu, gpu) = (common::cpu(), common::cuda());
    for (name, cfg) in configs() {
        let m = mixer(name, &cfg).unwrap();
        let sizes = Sizes { batch: 3, seq: 65, channels: 6, heads: 2, dk: 16, dv: 12 };
        let (x, s0) = setup(m.as_ref(), &sizes, 9);
        for s in [Some(&s0), None] {
            let (yc, fc) = run_state(m.as_ref(), &cpu, Form::Recurrent, &x, s, Precision::Exact).unwrap();
            let (yg, fg) = run_state(m.as_ref(), &gpu, Form::Recurrent, &x, s, Precision::Exact).unwrap();
            let (x32, s32) = (cast_tensors::<f32>(&x), s.map(cast_tensors::<f32>));
            let (y32, f32s) =
                run_state(m.as_ref(), &gpu, Form::Recurrent, &x32, s32.as_ref(), Precision::Exact).unwrap();
            let from = if s.is_some() { "from a state" } else { "from zeros" };
            for (tol, what, a, b) in [
                (Tolerance::F64, "y f64", yg.clone(), &yc),
                (Tolerance::F32, "y f32", y32.mapv(f64::from), &yc),
            ] {
                let c = tol.compare(a.view(), b.view());
                assert!(c.pass, "{name} {cfg} {from}: {what} {c:?}");
            }
            for (k, v) in &fc {
                let c = Tolerance::F64.compare(fg[k].view(), v.view());
                assert!(c.pass, "{name} {cfg} {from}: final `{k}` f64 {c:?}");
                let c = Tolerance::F32.compare(f32s[k].mapv(f64::from).view(), v.view());
                assert!(c.pass, "{name} {cfg} {from}: final `{k}` f32 {c:?}");
            }
        }
    }
}

/// Without a device: the CUDA backend lists the `recurrent` and `fast` forms from a state for
/// every family whose decoder takes one (the lifts' `fast` form: `lift_state.rs`).
#[test]
fn cuda_lists_the_recurrent_form_from_a_state() {
    let cuda = mixer_registry::Backend::registered("cuda").unwrap();
    for (name, cfg) in configs() {
        let m = mixer(name, &cfg).unwrap();
        let forms = mixer_registry::state::forms(m.as_ref(), &cuda);
        assert!(forms.contains(&Form::Recurrent), "{name} {cfg}: {forms:?}");
        assert!(forms.contains(&Form::Fast), "{name} {cfg}: {forms:?}");
    }
}
