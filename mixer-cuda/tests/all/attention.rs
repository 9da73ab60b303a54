//! Attention and local attention on CUDA (fast = tiled online softmax, recurrent = device KV
//! cache) against the f64 oracle and the CPU forms.

use super::common;

use mixer_core::Form;
use mixer_registry::Sizes;

const WANT: [Form; 2] = [Form::Fast, Form::Recurrent];

#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_small_heads() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    for (name, cfg) in [
        ("attention", "{}"),
        ("attention", r#"{"window": 9, "scale": 0.3}"#),
        ("local-attention", "{}"),
        ("local-attention", r#"{"window": 5}"#),
    ] {
        common::cross_check(name, cfg, &common::sizes(&[1, 37, 100]), &WANT);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_several_tiles() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    // Dk = 64, Dv = 48: several query and key tiles (f64 tiles hold 27 rows), T not a multiple.
    let s = [Sizes { batch: 2, seq: 203, channels: 1, heads: 3, dk: 64, dv: 48 }];
    common::cross_check("attention", "{}", &s, &WANT);
    common::cross_check("local-attention", r#"{"window": 40}"#, &s, &WANT);
}

/// Issue 14: f32 q, k near 1e19 (q·k beyond f32) and a scale of 1e308 gave NaN; the kernels
/// now form dot products and maxima in double (as the CPU's `Logits`). Both CUDA forms must
/// match the f64 oracle and be finite.
#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_huge_logits() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    use mixer_core::{DType, Tensors, Tolerance};
    use ndarray::{ArrayD, IxDyn};
    let (bn, t_len, hn, dk, dv) = (2, 13, 2, 3, 2);
    let shape = |d: usize| IxDyn(&[bn, t_len, hn, d]);
    // Multiples of 1/8 times a power of two: exact in f32 (same inputs and ties as the oracle).
    let val = |i: &IxDyn, salt: usize| {
        ((i[0] * 31 + i[1] * 17 + i[2] * 7 + i[3] * 3 + salt * 11) % 13) as f64 / 8.0 - 0.75
    };
    for (cfg, mag) in [(serde_json::json!({}), 2f64.powi(63)), (serde_json::json!({"scale": 1e308}), 1.0)] {
        let m = mixer_registry::mixer("attention", &cfg).unwrap();
        let mut x = Tensors::<f64>::new();
        x.insert("q".into(), ArrayD::from_shape_fn(shape(dk), |i| mag * val(&i, 1)));
        x.insert("k".into(), ArrayD::from_shape_fn(shape(dk), |i| mag * val(&i, 2)));
        x.insert("v".into(), ArrayD::from_shape_fn(shape(dv), |i| val(&i, 3)));
        let want = mixer_registry::run::oracle(m.as_ref(), &x).unwrap();
        for form in WANT {
            for dtype in [DType::F32, DType::F64] {
                let y = mixer_registry::run::run_as(m.as_ref(), &crate::common::cuda(), form, &x, dtype)
                    .unwrap_or_else(|e| panic!("{cfg} {form} {dtype:?}: {e}"));
                let c = Tolerance::for_dtype(dtype.name()).compare(y.view(), want.view());
                assert!(c.pass, "{cfg} {form} {dtype:?}: {c:?}");
            }
        }
    }
}
