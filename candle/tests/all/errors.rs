//! Bad inputs come back as candle errors carrying the library's message (or this crate's).

use candle_core::{DType, Device, Tensor};
use mixers::ops::Options;

use crate::common::*;

fn msg(r: candle_core::Result<Tensor>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn shapes_values_and_options_fail_with_the_library_message() {
    let (_, x) = inputs("gated-deltanet", &sizes(1, 5), 1);
    let v = vars(&x, DType::F64);
    let t = |n: &str| v[n].as_tensor().clone();
    let c = mixers_candle::ops::gated_deltanet;
    let o = Options::default();
    // k with another head dim.
    let k_bad = Tensor::zeros((1, 5, 2, 4), DType::F64, &Device::Cpu).unwrap();
    let e = msg(c(&t("q"), &k_bad, &t("v"), &t("g"), &t("beta"), &o));
    assert!(e.contains("input `k`") && e.contains("expected shape"), "{e}");
    // g > 0 somewhere.
    let g_bad = (t("g") + 1.0).unwrap();
    let e = msg(c(&t("q"), &t("k"), &t("v"), &g_bad, &t("beta"), &o));
    assert!(e.contains("input `g`: log-decay must be ≤ 0"), "{e}");
    // β outside [0, 1].
    let b_bad = (t("beta") * 3.0).unwrap();
    let e = msg(c(&t("q"), &t("k"), &t("v"), &t("g"), &b_bad, &o));
    assert!(e.contains("input `beta`: values must lie in [0, 1]"), "{e}");
    // NaN in q.
    let q_nan = (t("q") * f64::NAN).unwrap();
    let e = msg(c(&q_nan, &t("k"), &t("v"), &t("g"), &t("beta"), &o));
    assert!(e.contains("input `q`") && e.contains("finite"), "{e}");
    // An option the mixer does not take.
    let e = msg(c(&t("q"), &t("k"), &t("v"), &t("g"), &t("beta"), &Options::default().window(3)));
    assert!(e.contains("gated-deltanet") && e.contains("window"), "{e}");
    // A chunk that is not a power of two.
    let e = msg(c(&t("q"), &t("k"), &t("v"), &t("g"), &t("beta"), &Options::default().chunk(12)));
    assert!(e.contains("chunk"), "{e}");
    // A packed batch with B > 1.
    let (_, x2) = inputs("gated-deltanet", &sizes(2, 5), 1);
    let v2 = vars(&x2, DType::F64);
    let t2 = |n: &str| v2[n].as_tensor().clone();
    let e = msg(c(
        &t2("q"),
        &t2("k"),
        &t2("v"),
        &t2("g"),
        &t2("beta"),
        &Options::default().cu_seqlens(&[0, 2, 5]),
    ));
    assert!(e.contains("cu_seqlens"), "{e}");
}

#[test]
fn dtypes_devices_and_names_fail_with_this_crates_message() {
    let (_, x) = inputs("mamba2", &sizes(1, 4), 2);
    let v = vars(&x, DType::F64);
    let t = |n: &str| v[n].as_tensor().clone();
    let o = Options::default();
    let e =
        msg(mixers_candle::ops::mamba2(&t("q"), &t("k").to_dtype(DType::F32).unwrap(), &t("v"), &t("g"), &o));
    assert!(e.contains("input `k`: expected dtype F64 (as `q`), got F32"), "{e}");
    let e =
        msg(mixers_candle::ops::mamba2(&t("q").to_dtype(DType::U32).unwrap(), &t("k"), &t("v"), &t("g"), &o));
    assert!(e.contains("input `q`: expected dtype F32, F64, BF16 or F16, got U32"), "{e}");
    let e = msg(mixers_candle::run("mamba3", &serde_json::json!({}), &[("q", &t("q"))], &o));
    assert!(e.contains("unknown mixer `mamba3`") && e.contains("mamba2"), "{e}");
    let e = msg(mixers_candle::run("mamba2", &serde_json::json!({}), &[("q", &t("q")), ("x", &t("v"))], &o));
    assert!(e.contains("`x`"), "{e}");
    // Attention's state is its KV cache (k, v, length): run_state returns it, with no error.
    let (_, xa) = inputs("attention", &sizes(1, 4), 2);
    let va = vars(&xa, DType::F64);
    let named: Vec<(&str, &Tensor)> = va.iter().map(|(k, t)| (k.as_str(), t.as_tensor())).collect();
    let (_, fin) = mixers_candle::run_state("attention", &serde_json::json!({}), &named, None, &o).unwrap();
    let names: Vec<&str> = fin.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["k", "length", "v"]);
}

#[test]
fn a_state_of_the_wrong_shape_fails_with_the_library_message() {
    let (_, x) = inputs("linear-attention", &sizes(1, 4), 3);
    let v = vars(&x, DType::F64);
    let t = |n: &str| v[n].as_tensor().clone();
    let s = Tensor::zeros((1, 2, 5, 3), DType::F64, &Device::Cpu).unwrap(); // Dk and Dv swapped
    let e =
        mixers_candle::ops::linear_attention_state(&t("q"), &t("k"), &t("v"), Some(&s), &Options::default())
            .unwrap_err()
            .to_string();
    assert!(e.contains("input `initial_state.S`: expected shape [1, 2, 3, 5], got [1, 2, 5, 3]"), "{e}");
}
