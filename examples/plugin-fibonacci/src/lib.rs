//! An example plugin for `mixers`, in its own crate: a Fibonacci offset pattern, a custom
//! level mask and a custom λ scheme — one `#[register]` attribute each — plus two mixers that
//! combine them with builtin families.
//!
//! A binary or test that wants these registrations must reference the crate, or the linker
//! drops it: `use mixers_plugin_fibonacci as _;`.

use mixer_registry::mixer_core::{Mixer, Result, serde_json};
use mixer_registry::{LambdaEntry, LambdaGradEntry, MaskEntry, MixerEntry, PatternEntry, register};

/// Fibonacci offsets `f(k) = F(k+2)`: 1, 2, 3, 5, 8, 13, … (saturating). Every Δ is a sum of
/// non-consecutive Fibonacci numbers (Zeckendorf), so shortest paths are `O(log_φ Δ)`.
pub fn fibonacci(k: usize) -> u64 {
    let (mut a, mut b) = (1u64, 2u64);
    for _ in 0..k {
        let c = a.saturating_add(b);
        a = b;
        b = c;
        if a == u64::MAX {
            break;
        }
    }
    a
}

/// The `fibonacci` pattern's entry (public, so that typed calls can take it by value).
#[register]
pub static FIBONACCI: PatternEntry = PatternEntry {
    name: "fibonacci",
    doc: "plugin: f(k) = F(k+2) = 1, 2, 3, 5, 8, …; O(log_φ T) hops (Zeckendorf)",
    offset: fibonacci,
};

/// Level by distance: `ℓ(t, s) = bitlen(t − s)` (0 on the diagonal). Unlike Fenwick levels,
/// buckets are fixed distance bands `[2^{ℓ−1}, 2^ℓ)` relative to `t`.
pub fn log_distance_level(t: usize, s: usize) -> usize {
    let d = t.abs_diff(s);
    (usize::BITS - d.leading_zeros()) as usize
}

/// Levels needed for length `T`: `bitlen(T − 1) + 1`.
pub fn log_distance_levels(t_len: usize) -> usize {
    log_distance_level(t_len.max(1) - 1, 0) + 1
}

/// The `log-distance` mask's entry (public, so that typed calls can take it by value).
#[register]
pub static LOG_DISTANCE: MaskEntry = MaskEntry {
    name: "log-distance",
    doc: "plugin: ℓ(t,s) = bitlen(t − s), distance bands [2^(ℓ−1), 2^ℓ)",
    level: log_distance_level,
    levels: log_distance_levels,
    cuda: Some(
        "__device__ int mixers_level(long long t, long long s) { long long d = t - s; return d == 0 ? 0 : 64 - __clzll(d); }",
    ),
};

/// `λ = 2 σ(param · raw)`: in (0, 2), equal to 1 at `raw = 0`.
pub fn sigmoid2(raw: f64, param: f64) -> f64 {
    2.0 / (1.0 + (-param * raw).exp())
}

/// The `sigmoid2` λ scheme's entry (public, so that typed calls can take it by value).
#[register]
pub static SIGMOID2: LambdaEntry = LambdaEntry {
    name: "sigmoid2",
    doc: "plugin: λ = 2·sigmoid(L · raw), 1 at raw = 0",
    map: sigmoid2,
    cuda: Some(
        "__device__ double mixers_lambda(double raw, double param) { return 2.0 / (1.0 + exp(-param * raw)); }",
    ),
};

/// `(∂λ/∂raw, ∂λ/∂param)` of [`sigmoid2`]: `2σ(1−σ) · (param, raw)` with `σ = σ(param·raw)`;
/// registered so that gradients flow through the scheme (and its parameter).
pub fn sigmoid2_grad(raw: f64, param: f64) -> (f64, f64) {
    let sig = 1.0 / (1.0 + (-param * raw).exp());
    let d = 2.0 * sig * (1.0 - sig);
    (d * param, d * raw)
}

#[register]
static SIGMOID2_GRAD: LambdaGradEntry = LambdaGradEntry {
    name: "sigmoid2",
    grad: sigmoid2_grad,
    cuda: Some(
        "__device__ void mixers_lambda_grad(double raw, double param, double* dr, double* dp) { \
         double s = 1.0 / (1.0 + exp(-param * raw)); double d = 2.0 * s * (1.0 - s); \
         *dr = d * param; *dp = d * raw; }",
    ),
};

fn with_defaults(base: serde_json::Value, user: &serde_json::Value) -> serde_json::Value {
    let mut cfg = base;
    if let (Some(c), Some(u)) = (cfg.as_object_mut(), user.as_object()) {
        for (k, v) in u {
            c.insert(k.clone(), v.clone());
        }
    }
    cfg
}

fn build_fibonacci_glr(_name: &str, cfg: &serde_json::Value) -> Result<Box<dyn Mixer>> {
    mixer_registry::mixer("glr", &with_defaults(serde_json::json!({"pattern": "fibonacci"}), cfg))
}

fn build_log_distance_mamba2(_name: &str, cfg: &serde_json::Value) -> Result<Box<dyn Mixer>> {
    let base = serde_json::json!({"mask": "log-distance", "lambda_scheme": "sigmoid2"});
    mixer_registry::mixer("loglinear-mamba2", &with_defaults(base, cfg))
}

#[register]
static FIBONACCI_GLR: MixerEntry = MixerEntry {
    name: "fibonacci-glr",
    family: "plugin",
    doc: "plugin: glr on the Fibonacci pattern (any glr config; pattern preset)",
    build: build_fibonacci_glr,
    examples: &[r#"{}"#, r#"{"cache_efficient": true}"#, r#"{"on": "both"}"#],
};

#[register]
static LOG_DISTANCE_MAMBA2: MixerEntry = MixerEntry {
    name: "log-distance-mamba2",
    family: "plugin",
    doc: "plugin: Mamba-2 lifted by the log-distance mask with sigmoid2 λ",
    build: build_log_distance_mamba2,
    examples: &[r#"{}"#],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fibonacci_offsets() {
        let v: Vec<u64> = (0..8).map(fibonacci).collect();
        assert_eq!(v, [1, 2, 3, 5, 8, 13, 21, 34]);
        assert_eq!(fibonacci(200), u64::MAX);
    }

    #[test]
    fn log_distance_levels_cover_every_level_used() {
        for t_len in 1..300usize {
            let l = log_distance_levels(t_len);
            for t in 0..t_len {
                for s in 0..=t {
                    assert!(log_distance_level(t, s) < l);
                }
            }
        }
    }

    #[test]
    fn sigmoid2_is_one_at_zero() {
        assert_eq!(sigmoid2(0.0, 1.0), 1.0);
        assert!(sigmoid2(5.0, 1.0) > 1.9 && sigmoid2(-5.0, 1.0) < 0.1);
    }
}
