//! Shared by the tests of runs from a state on CUDA: the gradients of `backward_state` on a
//! backend, and their comparison against a reference (every input's gradient and the initial
//! state's gradient).

use mixer_core::mixer::Mixer;
use mixer_core::tensor::{cast_tensors, tensors_to_f64};
use mixer_core::{DType, Form, Requires, Tensors, Tolerance};
use mixer_registry::Backend;
use mixer_registry::state::backward_state;
use ndarray::ArrayD;

/// The gradients and the initial state's gradient of `backward_state` on `backend` in `dtype`,
/// as f64.
pub fn grads(
    m: &dyn Mixer,
    backend: &Backend,
    dtype: DType,
    [x, s0, df]: [Option<&Tensors<f64>>; 3],
    dy: &ArrayD<f64>,
) -> (Tensors<f64>, Tensors<f64>) {
    let x = x.expect("inputs");
    let run = || match dtype {
        DType::F64 => backward_state(m, backend, Form::Fast, x, s0, dy, df, &Requires::All),
        DType::F32 => {
            let c = |t: Option<&Tensors<f64>>| t.map(cast_tensors::<f32>);
            let (s0, df) = (c(s0), c(df));
            backward_state(
                m,
                backend,
                Form::Fast,
                &cast_tensors::<f32>(x),
                s0.as_ref(),
                &dy.mapv(|e| e as f32),
                df.as_ref(),
                &Requires::All,
            )
            .map(|(g, s)| (tensors_to_f64(&g), tensors_to_f64(&s)))
        }
    };
    run().unwrap_or_else(|e| {
        panic!("{} {} backward from a state on {}: {e}", m.name(), dtype.name(), backend.name())
    })
}

/// Compares every gradient and the initial state's gradient (`S̄_0`, keyed `S`) of `got` with
/// `want` ([`Tolerance::compare_grad`]), printing one line each; returns the failures, each
/// naming the case, the tensor and the errors.
pub fn compare(
    label: &str,
    got: &(Tensors<f64>, Tensors<f64>),
    want: &(Tensors<f64>, Tensors<f64>),
    tol: Tolerance,
) -> Vec<String> {
    let mut bad = Vec::new();
    for (what, g, w) in [("gradient", &got.0, &want.0), ("initial state's gradient", &got.1, &want.1)] {
        if g.keys().ne(w.keys()) {
            bad.push(format!("{label}: {what} tensors {:?}, the CPU gives {:?}", g.keys(), w.keys()));
            continue;
        }
        for (k, wv) in w {
            let c = tol.compare_grad(g[k].view(), wv.view());
            let name = if what == "gradient" { k.clone() } else { format!("d_initial_state.{k}") };
            println!(
                "BWD-STATE {label} {name} rel_rms={:.3e} max_abs={:.3e} pass={}",
                c.rel_rms, c.max_abs, c.pass
            );
            if !c.pass {
                bad.push(format!(
                    "{label} {name}: rel_rms {:.3e} (bound {:.0e}), max_abs {:.3e} (bound {:.0e} × {:.3e})",
                    c.rel_rms,
                    tol.rel_rms,
                    c.max_abs,
                    tol.max_abs,
                    c.ref_max.max(1.0)
                ));
            }
        }
    }
    bad
}

/// The backward from `s0` of `m` on `backend` in `dtype` against `cpu`'s in f64 ([`grads`],
/// [`compare`]), with the cotangents drawn from the CPU run's outputs `y` and final state `fin`:
/// `sin(2.3 y + 0.4)` and `cos(1.3 f)`. Returns the failures.
#[allow(clippy::too_many_arguments)]
pub fn against_the_cpu(
    label: &str,
    m: &dyn Mixer,
    [cpu, backend]: [&Backend; 2],
    dtype: DType,
    [x, s0]: [&Tensors<f64>; 2],
    (y, fin): (&ArrayD<f64>, &Tensors<f64>),
    tol: Tolerance,
) -> Vec<String> {
    let dy = y.mapv(|v| (2.3 * v + 0.4).sin());
    let df: Tensors<f64> = fin.iter().map(|(k, v)| (k.clone(), v.mapv(|e| (1.3 * e).cos()))).collect();
    let want = grads(m, cpu, DType::F64, [Some(x), Some(s0), Some(&df)], &dy);
    let got = grads(m, backend, dtype, [Some(x), Some(s0), Some(&df)], &dy);
    compare(label, &got, &want, tol)
}
