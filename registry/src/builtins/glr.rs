//! The generalized linear recurrence (docs/math.md §1.2) and its aliases: `glr`, `diagonal-ssm`,
//! `kth-order`, `dense-recurrence`. The pattern is resolved by name through the pattern registry
//! (builtins and plugins alike).

use mixer_core::Result;
use mixer_core::mixer::Mixer;
use mixer_core::mixers::glr::Glr;
use mixer_core::pattern::OffsetFn;

fn resolve(name: &str) -> Result<OffsetFn> {
    crate::lookup::pattern(name).map(|e| e.offset)
}

fn build(name: &str, cfg: &serde_json::Value) -> Result<Box<dyn Mixer>> {
    Ok(Box::new(Glr::from_json(name, cfg, resolve)?))
}

super::mixer_entries! {
    family: "glr", build: build;
    GLR = "glr",
        "generalized linear recurrence on an offset pattern: y_t = α_t x_t + Σ_k β_{t,k} y_{d_k(t)}",
        [
            r#"{"pattern": "pow2"}"#,
            r#"{"pattern": "pow2", "cache_efficient": true}"#,
            r#"{"pattern": "sq1"}"#,
            r#"{"pattern": "sq1", "cache_efficient": true, "on": "both"}"#,
            r#"{"pattern": "pow2", "on": "a"}"#,
            r#"{"pattern": "sq1", "order": 3, "on": "both"}"#,
        ];
    DIAGONAL_SSM = "diagonal-ssm",
        "first-order recurrence y_t = α_t x_t + β_t y_{t−1} (glr, pattern linear, order 1)",
        ["{}", r#"{"on": "both"}"#];
    KTH_ORDER = "kth-order",
        "k-th order recurrence over y_{t−1..t−k} (glr, pattern linear, config order, default 2)",
        ["{}", r#"{"order": 8}"#, r#"{"order": 3, "on": "a"}"#];
    DENSE_RECURRENCE = "dense-recurrence",
        "dense recurrence over every past output (glr, pattern linear, untruncated)",
        ["{}"];
}
