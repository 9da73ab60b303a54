//! Runs from a state on CUDA for the families whose state is a prefix of their inputs
//! (docs/math.md §7: attention's KV cache, the Toeplitz mixer's input history, the GLR's past
//! outputs): the device `fast` form and its backward on the inputs extended by the state
//! (`mixer_cuda::forms::Extension`). Against the CPU's run from the same state, f64 and f32:
//! `y`, the final state, every input's gradient and the initial state's gradient; and a packed
//! batch whose sequences start from their own states against the CPU's. The shared suite also
//! holds these runs to the f64 oracle at every split (`suite.rs`). GPU tests are `#[ignore]`d and
//! skip without a device (fail under `MIXERS_REQUIRE_CUDA=1`).

use mixer_core::mixer::{Mixer, validate};
use mixer_core::tensor::{cast_tensors, tensors_to_f64};
use mixer_core::{AnyTensors, DType, Dims, Form, Precision, Tensors, Tolerance};
use mixer_registry::packed::run_packed;
use mixer_registry::state::run_state;
use mixer_registry::{Backend, mixer};
use ndarray::ArrayD;

use crate::common::{cpu, cuda, gpu};
use crate::state_grads::against_the_cpu;

/// The mixers (name, configuration) and their sizes but `T`: causal and windowed attention with
/// `Dk ≠ Dv`, a two-head Toeplitz mixer with a kernel longer than some sequences, the GLR on a
/// lattice pattern, on a pattern over `a` (the slot axis on `alpha`, cut to
/// `K(T)` for the CUDA forms) and a translation-invariant one.
fn cases() -> Vec<(&'static str, serde_json::Value, Vec<(&'static str, usize)>)> {
    use serde_json::json;
    let att = vec![("B", 2), ("H", 2), ("Dk", 40), ("Dv", 24)];
    let chan = vec![("B", 2), ("C", 6)];
    vec![
        ("attention", json!({"scale": 0.3}), att.clone()),
        ("attention", json!({"scale": 0.3, "window": 20}), att),
        ("toeplitz", json!({"heads": 2, "kernel_width": 70}), chan.clone()),
        ("glr", json!({"pattern": "pow2", "cache_efficient": true}), chan.clone()),
        ("glr", json!({"pattern": "sq1", "on": "a"}), chan.clone()),
        ("kth-order", json!({"order": 3}), chan),
    ]
}

/// Inputs with room for a state's prefix and a random initial state, drawn from `seed` (f64).
fn draw(m: &dyn Mixer, sizes: &[(&'static str, usize)], t: usize, seed: u64) -> (Tensors<f64>, Tensors<f64>) {
    let dims: Dims = sizes.iter().copied().chain([("T", t)]).collect();
    let sd = m.state_check_dims(&dims);
    let x = m.random_inputs(&sd, seed).unwrap_or_else(|e| panic!("{}: inputs: {e}", m.name()));
    let d = validate(m, &AnyTensors::F64(x.clone())).unwrap_or_else(|e| panic!("{}: {e}", m.name()));
    let s0 = m.random_state(&d, seed + 1).unwrap_or_else(|e| panic!("{}: state: {e}", m.name()));
    (x, s0)
}

/// `y` and the final state of a run from `s0` on `backend` in `dtype`, as f64.
fn forward(
    m: &dyn Mixer,
    backend: &Backend,
    dtype: DType,
    x: &Tensors<f64>,
    s0: &Tensors<f64>,
) -> (ArrayD<f64>, Tensors<f64>) {
    let r = match dtype {
        DType::F64 => run_state(m, backend, Form::Fast, x, Some(s0), Precision::Exact),
        DType::F32 => run_state(
            m,
            backend,
            Form::Fast,
            &cast_tensors::<f32>(x),
            Some(&cast_tensors::<f32>(s0)),
            Precision::Exact,
        )
        .map(|(y, f)| (y.mapv(f64::from), tensors_to_f64(&f))),
    };
    r.unwrap_or_else(|e| panic!("{} {} from a state on {}: {e}", m.name(), dtype.name(), backend.name()))
}

/// Compares one tensor, printing a line; returns the failure, if any.
fn check(label: &str, got: &ArrayD<f64>, want: &ArrayD<f64>, tol: Tolerance) -> Option<String> {
    let c = tol.compare(got.view(), want.view());
    println!("STATE-EXT {label} rel_rms={:.3e} max_abs={:.3e} pass={}", c.rel_rms, c.max_abs, c.pass);
    (!c.pass).then(|| format!("{label}: rel_rms {:.3e}, max_abs {:.3e}", c.rel_rms, c.max_abs))
}

/// The values an f32 run computes from, as f64.
fn rounded(t: &Tensors<f64>) -> Tensors<f64> {
    tensors_to_f64(&cast_tensors::<f32>(t))
}

#[test]
#[ignore = "needs a CUDA device"]
fn runs_from_a_state_by_the_extension_match_the_cpu() {
    let Some(_turn) = gpu() else { return };
    let (cpu, gpu) = (cpu(), cuda());
    let mut bad = Vec::new();
    for (name, config, sizes) in cases() {
        let m = mixer(name, &config).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (i, t) in [1, 63, 65, 300].into_iter().enumerate() {
            let (x64, s064) = draw(m.as_ref(), &sizes, t, 40 + i as u64);
            for (dtype, tol) in [(DType::F64, Tolerance::F64), (DType::F32, Tolerance::F32)] {
                let (x, s0) = if dtype == DType::F32 {
                    (rounded(&x64), rounded(&s064))
                } else {
                    (x64.clone(), s064.clone())
                };
                let label = format!("{name} {config} {} T={t}", dtype.name());
                let (want_y, want_f) = forward(m.as_ref(), &cpu, DType::F64, &x, &s0);
                let (y, fin) = forward(m.as_ref(), &gpu, dtype, &x, &s0);
                bad.extend(check(&format!("{label} y"), &y, &want_y, tol));
                if fin.keys().ne(want_f.keys()) {
                    bad.push(format!(
                        "{label}: final state {:?}, the CPU gives {:?}",
                        fin.keys(),
                        want_f.keys()
                    ));
                    continue;
                }
                for (k, w) in &want_f {
                    bad.extend(check(&format!("{label} final {k}"), &fin[k], w, tol));
                }
                let backends = [&cpu, &gpu];
                bad.extend(against_the_cpu(
                    &label,
                    m.as_ref(),
                    backends,
                    dtype,
                    [&x, &s0],
                    (&want_y, &want_f),
                    tol,
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{} comparisons failed:\n{}", bad.len(), bad.join("\n"));
}

/// A packed batch (`B = 1`) whose sequences start from their own states: CUDA (the sequences
/// one by one through the extension) against the CPU, f64, with an empty sequence, a single
/// token and the last offset short of the buffer.
#[test]
#[ignore = "needs a CUDA device"]
fn packed_runs_from_states_by_the_extension_match_the_cpu() {
    let Some(_turn) = gpu() else { return };
    let (cpu, gpu) = (cpu(), cuda());
    let cu = [0usize, 0, 1, 40, 40, 97];
    let mut bad = Vec::new();
    for (name, config, mut sizes) in cases() {
        let m = mixer(name, &config).unwrap_or_else(|e| panic!("{name}: {e}"));
        // One row per sequence for the initial states, one packed row for the inputs.
        sizes.retain(|&(k, _)| k != "B");
        let seqs = cu.len() - 1;
        let (_, s0) = draw(m.as_ref(), &[sizes.clone(), vec![("B", seqs)]].concat(), 100, 7);
        let (x, _) = draw(m.as_ref(), &[sizes, vec![("B", 1)]].concat(), 100, 9);
        let run = |b: &Backend| {
            run_packed(m.as_ref(), b, Form::Fast, &x, &cu, Some(&s0), true, Precision::Exact)
                .unwrap_or_else(|e| panic!("{name} packed from states on {}: {e}", b.name()))
        };
        let ((want_y, want_f), (y, fin)) = (run(&cpu), run(&gpu));
        let label = format!("{name} {config} packed");
        bad.extend(check(&format!("{label} y"), &y, &want_y, Tolerance::F64));
        let (want_f, fin) = (want_f.expect("final states"), fin.expect("final states"));
        for (k, w) in &want_f {
            bad.extend(check(&format!("{label} final {k}"), &fin[k], w, Tolerance::F64));
        }
    }
    assert!(bad.is_empty(), "{} comparisons failed:\n{}", bad.len(), bad.join("\n"));
}
