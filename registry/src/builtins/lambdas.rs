//! Builtin λ schemes (docs/math.md §2.4): `λ = map(raw, param)`, with `param` learnable (init 1).

use crate::entries::LambdaEntry;
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
}
