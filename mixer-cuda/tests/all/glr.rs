//! GLR on CUDA (fast = sparse recurrence, recurrent = lattice-cache decoder) against the f64
//! oracle and the CPU forms, for builtin patterns, every `on`, both lattices, the named
//! aliases, and a plugin pattern (Fibonacci) that has no kernel of its own.

use super::common;

use mixer_core::Form;

const WANT: [Form; 2] = [Form::Fast, Form::Recurrent];

#[test]
#[ignore = "needs a CUDA device"]
fn glr_cuda_builtin_patterns() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    for cfg in [
        r#"{"pattern": "pow2"}"#,
        r#"{"pattern": "pow2", "cache_efficient": true}"#,
        r#"{"pattern": "pow2", "cache_efficient": true, "on": "a"}"#,
        r#"{"pattern": "sq1"}"#,
        r#"{"pattern": "sq1", "cache_efficient": true, "on": "both"}"#,
        r#"{"pattern": "pow2", "on": "a"}"#,
        r#"{"pattern": "sq1", "order": 3, "on": "both"}"#,
        r#"{"pattern": "linear", "order": 2, "cache_efficient": true}"#,
    ] {
        common::cross_check("glr", cfg, &common::sizes(&[1, 37, 100]), &WANT);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn glr_cuda_aliases() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    common::cross_check("diagonal-ssm", "{}", &common::sizes(&[37, 100]), &WANT);
    common::cross_check("diagonal-ssm", r#"{"on": "both"}"#, &common::sizes(&[37]), &WANT);
    common::cross_check("kth-order", r#"{"order": 8}"#, &common::sizes(&[37, 100]), &WANT);
    common::cross_check("kth-order", r#"{"order": 3, "on": "a"}"#, &common::sizes(&[37]), &WANT);
    common::cross_check("dense-recurrence", "{}", &common::sizes(&[37, 70]), &WANT);
}

#[test]
#[ignore = "needs a CUDA device"]
fn glr_cuda_plugin_pattern() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    for cfg in [
        r#"{"pattern": "fibonacci"}"#,
        r#"{"pattern": "fibonacci", "cache_efficient": true}"#,
        r#"{"pattern": "fibonacci", "cache_efficient": true, "on": "both"}"#,
    ] {
        common::cross_check("glr", cfg, &common::sizes(&[37, 100]), &WANT);
    }
    common::cross_check("fibonacci-glr", r#"{"cache_efficient": true}"#, &common::sizes(&[37]), &WANT);
}

/// The tiled kernel over many tiles (64 tokens each, 8 for patterns with many small offsets) and a
/// channel count that is not a multiple of the block's 8: taps that reach the previous tile, far
/// taps, and patterns whose near taps at tiles of 64 outnumber a gather list (`kth-order` 20,
/// `dense-recurrence` 127), which run tiles of 8 tokens (`glr::fast::TILES`).
#[test]
#[ignore = "needs a CUDA device"]
fn glr_cuda_many_tiles() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let sizes = |seqs: &[usize]| -> Vec<mixer_registry::Sizes> {
        seqs.iter()
            .map(|&t| mixer_registry::Sizes { batch: 2, seq: t, channels: 13, heads: 1, dk: 1, dv: 1 })
            .collect()
    };
    for (name, cfg) in [
        ("glr", r#"{"pattern": "pow2"}"#),
        ("glr", r#"{"pattern": "pow2", "cache_efficient": true, "on": "both"}"#),
        ("glr", r#"{"pattern": "sq1", "cache_efficient": true}"#),
        ("glr", r#"{"pattern": "sq1", "on": "a"}"#),
        ("kth-order", r#"{"order": 20}"#),
    ] {
        common::cross_check(name, cfg, &sizes(&[300, 1000]), &WANT);
    }
    common::cross_check("dense-recurrence", "{}", &sizes(&[200]), &WANT);
}
