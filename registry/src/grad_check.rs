//! The gradient cross-check: for a mixer, a seed and sizes, three checks of its backward
//! passes, all in one report ([`GradRow`] per input gradient):
//!
//! 1. **finite differences** — the `materialized` (reference) backward against central
//!    differences in `f64` of `f(θ) = ⟨ ȳ, y(θ) ⟩` along a random
//!    direction `δ_u` per input `u`: the error
//!    `|(f(θ + hδ_u) − f(θ − hδ_u))/2h − ⟨ ū, δ_u⟩|`
//!    is reported relative to the Cauchy–Schwarz scale `‖ū‖_2 ‖δ_u‖_2`;
//! 2. **materialized vs fast** — every other backward form of every backend in `f64`
//!    against the reference, with [`Tolerance::F64`];
//! 3. **f32 vs f64** — the same forms in `f32` against the `f64` reference, with
//!    [`Tolerance::F32`].
//!
//! Inputs are drawn by the mixer ([`Mixer::random_inputs`]) plus its optional inputs (e.g.
//! `lambda_param`, so that every gradient is covered); the cotangent is standard normal.
//!
//! In the `tf32` and `bf16` modes ([`check_grad_with`]) check 3 runs the forms in `f32` in that
//! mode ([`crate::backward::backward_with`]) against the mode's tolerance
//! ([`Precision::tolerance`]) and check 2 is skipped; for `bf16` the activations and the
//! cotangent are rounded to bf16 first, so the reference sees the values the call stores.

use mixer_core::grad::{Requires, grad_name, materialized_backward};
use mixer_core::mixer::{Mixer, complete_dims};
use mixer_core::spec::{Gen, draw};
use mixer_core::tensor::{cast_tensors, tensors_to_f64};
use mixer_core::{AnyTensors, DType, Precision, Tensor, Tensors};
use ndarray::ArrayD;
use rand::{SeedableRng, rngs::StdRng};
use serde::Serialize;

use crate::backend::Backend;
use crate::backward::{backward_as, backward_forms, backward_with};
use crate::harness::Sizes;
use crate::run::oracle;
use crate::run::{bf16_activations, bf16_value};

/// Bound on the finite-difference error relative to `‖ū‖_2‖δ_u‖_2`.
pub const FD_TOLERANCE: f64 = 1e-6;

/// The step of the central differences.
pub const FD_STEP: f64 = 1e-5;

/// The form label of the finite-difference rows.
pub const FINITE_DIFFERENCES: &str = "finite-diff";

/// One line of a gradient check report.
#[derive(Clone, Debug, Serialize)]
pub struct GradRow {
    /// Mixer name.
    pub mixer: String,
    /// Its config (JSON).
    pub config: String,
    /// Backend (`-` for the finite-difference rows).
    pub backend: String,
    /// The checked backward form (`finite-diff` for the reference against differences).
    pub form: String,
    /// Scalar type.
    pub dtype: DType,
    /// Precision mode of the checked backward (`exact` for the reference rows).
    pub precision: Precision,
    /// Sequence length.
    pub seq: usize,
    /// The input whose gradient is compared (`-` when the whole pass failed).
    pub input: String,
    /// Relative error: relative RMS against the reference (absolute when the reference is
    /// exactly zero), or the finite-difference error.
    pub rel_err: f64,
    /// Max-abs error against the reference (finite differences: the absolute error).
    pub max_abs: f64,
    /// Whether it passed.
    pub pass: bool,
    /// The error message, if the pass failed to run.
    pub error: Option<String>,
}

/// Valid random inputs of `m` including its optional inputs.
pub fn grad_inputs(m: &dyn Mixer, sizes: &Sizes, seed: u64) -> mixer_core::Result<Tensors<f64>> {
    let dims = complete_dims(m, &sizes.dims());
    let mut inputs = m.random_inputs(&dims, seed)?;
    let all = m.spec().random(&dims, seed ^ 0x5eed_0f0f, true)?;
    for (k, v) in all {
        inputs.entry(k).or_insert(v);
    }
    Ok(inputs)
}

fn normal_like(a: &ArrayD<f64>, rng: &mut StdRng) -> ArrayD<f64> {
    draw(Gen::Normal(1.0), a.shape(), rng)
}

fn dot(a: &ArrayD<f64>, b: &ArrayD<f64>) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &ArrayD<f64>) -> f64 {
    dot(a, a).sqrt()
}

/// Checks the backward passes of one configured mixer (see the module documentation).
/// A failure to run is a failed row, not an error.
pub fn check_grad(m: &dyn Mixer, backends: &[Backend], sizes: &Sizes, seed: u64) -> Vec<GradRow> {
    check_grad_with(m, backends, sizes, seed, Precision::Exact)
}

/// [`check_grad`] with the backends' backward forms run in `precision` (module documentation).
pub fn check_grad_with(
    m: &dyn Mixer,
    backends: &[Backend],
    sizes: &Sizes,
    seed: u64,
    precision: Precision,
) -> Vec<GradRow> {
    let cfg = m.config().to_string();
    let row = |backend: &str, form: &str, dtype: DType, input: &str| GradRow {
        mixer: m.name().to_string(),
        config: cfg.clone(),
        backend: backend.into(),
        form: form.into(),
        dtype,
        precision: Precision::Exact,
        seq: sizes.seq,
        input: input.into(),
        rel_err: f64::INFINITY,
        max_abs: f64::INFINITY,
        pass: false,
        error: None,
    };
    let fail = |form: &str, e: String| vec![GradRow { error: Some(e), ..row("-", form, DType::F64, "-") }];
    let inputs = match grad_inputs(m, sizes, seed) {
        // Rounded through f32 first, so that the reference sees exactly the stored bf16 values.
        Ok(i) if precision == Precision::Bf16 => tensors_to_f64(&bf16_activations(&cast_tensors::<f32>(&i))),
        Ok(i) => i,
        Err(e) => return fail(FINITE_DIFFERENCES, format!("random inputs: {e}")),
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0xd1_d7);
    let y = match oracle(m, &inputs) {
        Ok(y) => y,
        Err(e) => return fail(FINITE_DIFFERENCES, format!("oracle: {e}")),
    };
    let dy = normal_like(&y, &mut rng);
    let dy = if precision == Precision::Bf16 { dy.mapv(|e| f64::from(bf16_value(e as f32))) } else { dy };
    let reference = match materialized_backward(m, &inputs, &dy, &Requires::All) {
        Ok(g) => g,
        Err(e) => return fail("materialized", format!("materialized backward: {e}")),
    };
    let mut rows = Vec::new();
    // 1. Finite differences of ⟨dy, y⟩ along a random direction per input.
    for (name, x) in &inputs {
        let mut r = row("-", FINITE_DIFFERENCES, DType::F64, name);
        let Some(g) = reference.get(&grad_name(name)) else {
            r.error = Some(format!("the materialized backward returned no d_{name}"));
            rows.push(r);
            continue;
        };
        let delta = normal_like(x, &mut rng);
        // A fixed step: inputs are O(1) by construction (a scale taken from the values would
        // be blown up by the ±10⁶ planted in ignored slots).
        let h = FD_STEP;
        let f = |sign: f64| -> mixer_core::Result<f64> {
            let mut p = inputs.clone();
            p.insert(name.clone(), x + &(&delta * (sign * h)));
            Ok(dot(&dy, &oracle(m, &p)?))
        };
        match f(1.0).and_then(|fp| Ok((fp - f(-1.0)?) / (2.0 * h))) {
            Ok(fd) => {
                let an = dot(g, &delta);
                let scale = norm(g) * norm(&delta);
                r.max_abs = (fd - an).abs();
                r.rel_err = if scale > 0.0 { r.max_abs / scale } else { r.max_abs };
                r.pass = r.rel_err <= FD_TOLERANCE;
            }
            Err(e) => r.error = Some(format!("oracle at a perturbed point: {e}")),
        }
        rows.push(r);
    }
    // 2–3. Every other backward form against the reference, in f64 and f32.
    for b in backends {
        for (form, dtype, tol) in crate::harness::cases(backward_forms(m, b.name()), precision) {
            let got = if precision == Precision::Exact {
                backward_as(m, b.name(), form, &inputs, &dy, dtype, &Requires::All)
            } else {
                let x = AnyTensors::F32(cast_tensors::<f32>(&inputs));
                let d = Tensor::F32(dy.mapv(|e| e as f32));
                backward_with(m, b.name(), form, &x, &d, &Requires::All, precision)
                    .map(|g| g.into_iter().map(|(k, v)| (k, v.to_f64())).collect::<Tensors<f64>>())
            };
            let at = |input: &str| GradRow { precision, ..row(b.name(), form.name(), dtype, input) };
            match got {
                Ok(got) => {
                    for (name, want) in &reference {
                        let input = name.strip_prefix("d_").unwrap_or(name);
                        let mut r = at(input);
                        match got.get(name) {
                            Some(gv) => {
                                let c = tol.compare_grad(gv.view(), want.view());
                                r.max_abs = c.max_abs;
                                // A gradient that is exactly zero (e.g. d_k at T = 1) has no
                                // relative error: compare absolutely then.
                                let zero = want.iter().all(|&v| v == 0.0);
                                r.rel_err = if zero { c.max_abs } else { c.rel_rms };
                                r.pass = c.pass;
                            }
                            None => r.error = Some(format!("no {name}")),
                        }
                        rows.push(r);
                    }
                }
                Err(e) => rows.push(GradRow { error: Some(e.to_string()), ..at("-") }),
            }
        }
    }
    rows
}
