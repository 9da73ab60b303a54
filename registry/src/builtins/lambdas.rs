//! Builtin λ schemes (docs/math.md §2.4): `λ = map(raw, param)`, with `param` learnable (init 1).

use crate::entries::{LambdaEntry, LambdaGradEntry};
use crate::register;

fn identity(raw: f64, _param: f64) -> f64 {
    raw
}

fn ones(_raw: f64, _param: f64) -> f64 {
    1.0
}

/// `softplus(param · raw)`, computed without overflow.
pub fn softplus(raw: f64, param: f64) -> f64 {
    let z = param * raw;
    if z > 30.0 { z } else { z.exp().ln_1p() }
}

/// `(∂/∂raw, ∂/∂param)` of identity.
fn identity_grad(_raw: f64, _param: f64) -> (f64, f64) {
    (1.0, 0.0)
}

fn ones_grad(_raw: f64, _param: f64) -> (f64, f64) {
    (0.0, 0.0)
}

/// `(∂/∂raw, ∂/∂param)` of `softplus(param · raw)`: `σ(param·raw) · (param, raw)`, with the
/// logistic σ computed without overflow.
pub fn softplus_grad(raw: f64, param: f64) -> (f64, f64) {
    let z = param * raw;
    let sig = if z >= 0.0 { 1.0 / (1.0 + (-z).exp()) } else { z.exp() / (1.0 + z.exp()) };
    (sig * param, sig * raw)
}

#[register]
static IDENTITY_GRAD: LambdaGradEntry = LambdaGradEntry {
    name: "identity",
    grad: identity_grad,
    cuda: Some(
        "__device__ void mixers_lambda_grad(double raw, double param, double* dr, double* dp) { *dr = 1.0; *dp = 0.0; }",
    ),
};
#[register]
static ONES_GRAD: LambdaGradEntry = LambdaGradEntry {
    name: "ones",
    grad: ones_grad,
    cuda: Some(
        "__device__ void mixers_lambda_grad(double raw, double param, double* dr, double* dp) { *dr = 0.0; *dp = 0.0; }",
    ),
};
#[register]
static SOFTPLUS_GRAD: LambdaGradEntry = LambdaGradEntry {
    name: "softplus",
    grad: softplus_grad,
    cuda: Some(
        "__device__ void mixers_lambda_grad(double raw, double param, double* dr, double* dp) { \
         double z = param * raw; double e = exp(-fabs(z)); \
         double sig = z >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e); *dr = sig * param; *dp = sig * raw; }",
    ),
};

#[register]
static IDENTITY: LambdaEntry = LambdaEntry {
    name: "identity",
    doc: "λ = raw (the op's λ input is used as given)",
    map: identity,
    cuda: Some("__device__ double mixers_lambda(double raw, double param) { return raw; }"),
};

#[register]
static ONES: LambdaEntry = LambdaEntry {
    name: "ones",
    doc: "λ ≡ 1 (reduces every log-linear mixer to its base mixer)",
    map: ones,
    cuda: Some("__device__ double mixers_lambda(double raw, double param) { return 1.0; }"),
};

#[register]
static SOFTPLUS: LambdaEntry = LambdaEntry {
    name: "softplus",
    doc: "λ = softplus(L_{h,ℓ} · raw), L learnable, initialised to 1",
    map: softplus,
    cuda: Some(
        "__device__ double mixers_lambda(double raw, double param) { double z = param * raw; return z > 30.0 ? z : log1p(exp(z)); }",
    ),
};

#[cfg(test)]
mod tests {
    #[test]
    fn softplus_is_stable_and_positive() {
        assert!((super::softplus(0.0, 1.0) - 2f64.ln()).abs() < 1e-15);
        assert_eq!(super::softplus(1e4, 1.0), 1e4);
        assert!(super::softplus(-1e4, 1.0) >= 0.0);
    }

    #[test]
    fn softplus_derivative_matches_central_differences() {
        let h = 1e-6;
        for (r, p) in [(0.3, 1.0), (-2.0, 0.7), (5.0, -1.3), (40.0, 1.0), (-40.0, 1.0)] {
            let (dr, dp) = super::softplus_grad(r, p);
            let fr = (super::softplus(r + h, p) - super::softplus(r - h, p)) / (2.0 * h);
            let fp = (super::softplus(r, p + h) - super::softplus(r, p - h)) / (2.0 * h);
            assert!((dr - fr).abs() < 1e-6 && (dp - fp).abs() < 1e-6, "({r}, {p}): {dr} {dp} vs {fr} {fp}");
        }
    }
}
