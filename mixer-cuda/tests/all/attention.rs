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

/// The exact kernel (f32 and f64) and the tensor-core modes (tf32, bf16) against the f64 oracle
/// at head dims `dims` (`(Dk, Dv)`), lengths `seqs`, windows 1, 100 and none, batch 2 and three
/// heads below T = 4000 (one batch row and head above): exact within the dtype's tolerance, tf32
/// and bf16 within the mode's (bf16 on inputs rounded to bf16, against their oracle).
fn every_mode_against_the_oracle(dims: &[(usize, usize)], seqs: &[usize]) {
    use mixer_core::mixer::complete_dims;
    use mixer_core::tensor::cast_tensors;
    use mixer_core::{AnyTensors, Precision, Tolerance};
    use mixer_registry::run::{bf16_activations, oracle, run_with};
    let backend = common::cuda();
    for &(dk, dv) in dims {
        for &t in seqs {
            for window in [Some(1), Some(100), None] {
                let cfg = serde_json::json!({ "window": window });
                let m = mixer_registry::mixer("attention", &cfg).unwrap();
                let (batch, heads) = if t > 4000 { (1, 1) } else { (2, 3) };
                let dims =
                    complete_dims(m.as_ref(), &Sizes { batch, seq: t, channels: 1, heads, dk, dv }.dims());
                let x = m.random_inputs(&dims, (dk * 7 + t) as u64).unwrap();
                let want = oracle(m.as_ref(), &x).unwrap();
                let tag = format!("Dk={dk} Dv={dv} T={t} window={window:?}");
                let y =
                    run_with(m.as_ref(), &backend, Form::Fast, &AnyTensors::F64(x.clone()), Precision::Exact)
                        .unwrap_or_else(|e| panic!("{tag} f64: {e}"));
                let c = Tolerance::for_dtype("f64").compare(y.to_f64().view(), want.view());
                println!("HEADDIM {tag} exact f64: {c:?}");
                assert!(c.pass, "{tag} exact f64: {c:?}");
                let x32 = AnyTensors::F32(cast_tensors::<f32>(&x));
                for p in [Precision::Exact, Precision::Tf32] {
                    let y = run_with(m.as_ref(), &backend, Form::Fast, &x32, p)
                        .unwrap_or_else(|e| panic!("{tag} {p}: {e}"));
                    let c = p.tolerance("f32").compare(y.to_f64().view(), want.view());
                    println!("HEADDIM {tag} {p} f32: {c:?}");
                    assert!(c.pass, "{tag} {p}: {c:?}");
                }
                let xb = bf16_activations(&x);
                let want = oracle(m.as_ref(), &xb).unwrap();
                let y = run_with(
                    m.as_ref(),
                    &backend,
                    Form::Fast,
                    &AnyTensors::F32(cast_tensors::<f32>(&xb)),
                    Precision::Bf16,
                )
                .unwrap_or_else(|e| panic!("{tag} bf16: {e}"));
                let c = Precision::Bf16.tolerance("f32").compare(y.to_f64().view(), want.view());
                println!("HEADDIM {tag} bf16: {c:?}");
                assert!(c.pass, "{tag} bf16: {c:?}");
            }
        }
    }
}

/// Lengths around the tiles' edges (64-key tiles, 64- and 128-row query blocks).
const SEQS: [usize; 5] = [1, 63, 64, 65, 1000];

#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_head_dims_16_32() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    every_mode_against_the_oracle(&[(16, 16), (32, 32)], &SEQS);
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_head_dims_64_70() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    every_mode_against_the_oracle(&[(64, 64), (70, 70)], &SEQS);
    every_mode_against_the_oracle(&[(70, 70)], &[4099]);
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_head_dims_96_128() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    every_mode_against_the_oracle(&[(96, 96), (128, 128)], &SEQS);
    every_mode_against_the_oracle(&[(128, 128)], &[4099]);
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_head_dim_256() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    every_mode_against_the_oracle(&[(256, 256)], &SEQS);
    every_mode_against_the_oracle(&[(64, 64)], &[4099]);
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_head_dims_differ() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    every_mode_against_the_oracle(&[(40, 200), (128, 16)], &[65, 1000]);
}

/// Logits near and beyond f32's range at D = 64 (128-row blocks in the exact mode's kernels, the
/// split-tf32 kernel for f32 and the FMA kernel for f64): tokens 130..200 of q and k scaled by
/// `mag`. At 1e19 their f32 dot products overflow, so the query blocks that see them (rows
/// 128..299) take the double-precision rows and the first block (rows 0..127) stays on the f32
/// tiles: exact f32 and f64 within tolerance of the oracle. At 1e18 the logits
/// (about 1e37) are finite in f32: every mode's output is finite, the exact mode's within
/// tolerance.
#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_logits_near_overflow() {
    use mixer_core::mixer::complete_dims;
    use mixer_core::tensor::cast_tensors;
    use mixer_core::{AnyTensors, Precision, Tolerance};
    use mixer_registry::run::{oracle, run_with};
    let Some(_turn) = common::gpu() else {
        return;
    };
    let backend = common::cuda();
    let m = mixer_registry::mixer("attention", &serde_json::json!({})).unwrap();
    let dims = complete_dims(
        m.as_ref(),
        &Sizes { batch: 1, seq: 300, channels: 1, heads: 2, dk: 64, dv: 64 }.dims(),
    );
    for mag in [1e19, 1e18] {
        let mut x = m.random_inputs(&dims, 3).unwrap();
        for name in ["q", "k"] {
            let a = x.get_mut(name).unwrap();
            for (i, v) in a.indexed_iter_mut() {
                if (130..200).contains(&i[1]) {
                    *v *= mag;
                }
            }
        }
        let want = oracle(m.as_ref(), &x).unwrap();
        let x32 = AnyTensors::F32(cast_tensors::<f32>(&x));
        for (dtype, input) in [("f64", AnyTensors::F64(x.clone())), ("f32", x32.clone())] {
            let y = run_with(m.as_ref(), &backend, Form::Fast, &input, Precision::Exact).unwrap().to_f64();
            let c = Tolerance::for_dtype(dtype).compare(y.view(), want.view());
            println!("OVERFLOW mag={mag:e} exact {dtype}: {c:?}");
            assert!(y.iter().all(|v| v.is_finite()) && c.pass, "mag {mag:e} {dtype}: {c:?}");
        }
        if mag < 1e19 {
            for p in [Precision::Tf32, Precision::Bf16] {
                let y = run_with(m.as_ref(), &backend, Form::Fast, &x32, p).unwrap().to_f64();
                assert!(y.iter().all(|v| v.is_finite()), "mag {mag:e} {p}: not finite");
            }
        }
    }
}
