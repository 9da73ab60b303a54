//! Precision modes through the registry on the CPU: `tf32` permits tensor cores (the CPU has
//! none, so it runs the exact form), `bf16` converts at the boundary (activations and `y`
//! rounded to bf16, f32 arithmetic), and every builtin mixer meets each mode's tolerance
//! against the f64 oracle. The backward follows the same rules (`backward_with`): `tf32` is the
//! exact backward, `bf16` rounds the activations and `dy` at the boundary (f32 gradients).

use mixer_core::Requires;
use mixer_core::mixer::complete_dims;
use mixer_core::precision::round_bf16;
use mixer_core::tensor::cast_tensors;
use mixer_core::{AnyTensors, Error, Form, Precision, Tensor};
use mixer_registry::backward::{backward, backward_with};
use mixer_registry::run::{bf16_activations, run, run_with};
use mixer_registry::{Backend, Sizes, check_grad_with, check_with, mixer};

fn cpu() -> Backend {
    Backend::by_name("cpu").unwrap()
}

#[test]
fn tf32_on_the_cpu_is_the_exact_form_and_bf16_rounds_at_the_boundary() {
    let m = mixer("mamba2", &serde_json::json!({"chunk": 8})).unwrap();
    let dims = complete_dims(m.as_ref(), &Sizes { seq: 29, ..Sizes::default() }.dims());
    let x = AnyTensors::F32(cast_tensors::<f32>(&m.random_inputs(&dims, 4).unwrap()));
    let exact = run(m.as_ref(), &cpu(), Form::Fast, &x).unwrap();
    assert_eq!(run_with(m.as_ref(), &cpu(), Form::Fast, &x, Precision::Tf32).unwrap(), exact);

    let AnyTensors::F32(t) = &x else { unreachable!() };
    let rounded = AnyTensors::F32(bf16_activations(t));
    let Tensor::F32(want) = run(m.as_ref(), &cpu(), Form::Fast, &rounded).unwrap() else { unreachable!() };
    let Tensor::F32(got) = run_with(m.as_ref(), &cpu(), Form::Fast, &x, Precision::Bf16).unwrap() else {
        unreachable!()
    };
    assert_eq!(got, want.mapv(round_bf16));
    // Every output is a bf16 number, and the rounding changed some of them.
    assert!(got.iter().all(|v| v.to_bits() & 0xFFFF == 0));
    assert_ne!(Tensor::F32(got), exact);
    // The gates are not activations: only q, k, v were rounded.
    assert_eq!(bf16_activations(t)["g"], t["g"]);
    assert_ne!(bf16_activations(t)["q"], t["q"]);
}

#[test]
fn the_modes_take_f32_inputs() {
    let m = mixer("attention", &serde_json::json!({})).unwrap();
    let dims = complete_dims(m.as_ref(), &Sizes::default().dims());
    let x = AnyTensors::F64(m.random_inputs(&dims, 1).unwrap());
    for p in [Precision::Tf32, Precision::Bf16] {
        match run_with(m.as_ref(), &cpu(), Form::Fast, &x, p) {
            Err(Error::Value { name, constraint, found }) => {
                assert_eq!(name, "precision");
                assert!(constraint.contains("f32 inputs") && found.contains("f64"), "{constraint} / {found}");
            }
            other => panic!("{p}: expected a value error, got {other:?}"),
        }
    }
}

#[test]
fn every_builtin_mixer_meets_each_modes_tolerance_on_the_cpu() {
    let backend = [cpu()];
    for name in ["attention", "glr", "mamba2", "loglinear-gated-deltanet", "toeplitz"] {
        let m = mixer(name, &serde_json::json!({})).unwrap();
        for p in [Precision::Tf32, Precision::Bf16] {
            let rows = check_with(m.as_ref(), &backend, &Sizes { seq: 41, ..Sizes::default() }, 3, p);
            assert!(!rows.is_empty());
            for r in rows {
                assert!(r.pass, "{name} {p} {}: rel RMS {:.2e} {:?}", r.form, r.rel_rms, r.error);
                assert_eq!(r.precision, p);
                if p == Precision::Bf16 {
                    // bf16 storage of y is visible in the error, but within the bound.
                    assert!(r.rel_rms > 1e-5, "{name} {}: {:.2e}", r.form, r.rel_rms);
                }
            }
        }
    }
}

#[test]
fn the_cpu_backward_in_tf32_is_exact_and_in_bf16_rounds_activations_and_dy() {
    let m = mixer("mamba2", &serde_json::json!({"chunk": 8})).unwrap();
    let dims = complete_dims(m.as_ref(), &Sizes { seq: 29, ..Sizes::default() }.dims());
    let x = cast_tensors::<f32>(&m.random_inputs(&dims, 4).unwrap());
    let dy = x["v"].mapv(|e| (3.0 * e + 0.2).sin());
    let (ax, ady) = (AnyTensors::F32(x.clone()), Tensor::F32(dy.clone()));
    for form in [Form::Fast, Form::Materialized] {
        let exact = backward(m.as_ref(), "cpu", form, &ax, &ady, &Requires::All).unwrap();
        let tf32 =
            backward_with(m.as_ref(), "cpu", form, &ax, &ady, &Requires::All, Precision::Tf32).unwrap();
        assert_eq!(tf32, exact, "{form}");
        let rounded = AnyTensors::F32(bf16_activations(&x));
        let want =
            backward(m.as_ref(), "cpu", form, &rounded, &Tensor::F32(dy.mapv(round_bf16)), &Requires::All)
                .unwrap();
        let got = backward_with(m.as_ref(), "cpu", form, &ax, &ady, &Requires::All, Precision::Bf16).unwrap();
        assert_eq!(got, want, "{form}");
        assert_ne!(got, exact, "{form}: the bf16 rounding changed nothing");
    }
    // The modes take f32 inputs.
    let x64 = AnyTensors::F64(m.random_inputs(&dims, 4).unwrap());
    let dy64 = Tensor::F64(dy.mapv(f64::from));
    match backward_with(m.as_ref(), "cpu", Form::Fast, &x64, &dy64, &Requires::All, Precision::Tf32) {
        Err(Error::Value { name, .. }) => assert_eq!(name, "precision"),
        other => panic!("expected a value error, got {other:?}"),
    }
}

#[test]
fn the_gradient_check_in_each_mode_meets_its_tolerance_on_the_cpu() {
    let backend = [cpu()];
    for name in ["mamba2", "attention"] {
        let m = mixer(name, &serde_json::json!({})).unwrap();
        for p in [Precision::Tf32, Precision::Bf16] {
            let rows = check_grad_with(m.as_ref(), &backend, &Sizes { seq: 23, ..Sizes::default() }, 5, p);
            let checked: Vec<_> = rows.iter().filter(|r| r.backend == "cpu").collect();
            assert!(!checked.is_empty(), "{name} {p}: no backward form checked");
            for r in &rows {
                assert!(r.pass, "{name} {p} {} d_{}: {:.2e} {:?}", r.form, r.input, r.rel_err, r.error);
            }
            for r in checked {
                assert_eq!((r.precision, r.dtype), (p, mixer_core::DType::F32), "{name} {}", r.form);
            }
        }
    }
}
