//! The log-linear family on CUDA (generic quadratic form with the mask's and λ scheme's
//! device functions spliced in by NVRTC) against the f64 oracle and the CPU forms, including
//! a plugin mask and λ scheme that have no kernel of their own.

mod common;

use mixer_core::Form;
use mixer_cpu as _;
use mixers_plugin_fibonacci as _;

const WANT: [Form; 1] = [Form::Parallel];

#[test]
fn loglinear_cuda_base_mixers() {
    if !common::gpu() {
        return;
    }
    for (name, cfg) in [
        ("linear-attention", "{}"),
        ("mamba2", "{}"),
        ("mamba2", r#"{"scale": 0.5}"#),
        ("gated-deltanet", "{}"),
    ] {
        common::cross_check(name, cfg, &common::sizes(&[1, 37, 100]), &WANT);
    }
}

#[test]
fn loglinear_cuda_lifted_mixers() {
    if !common::gpu() {
        return;
    }
    for (name, cfg) in [
        ("loglinear-attention", "{}"),
        ("loglinear-attention", r#"{"lambda_scheme": "softplus"}"#),
        ("loglinear-mamba2", r#"{"scale": 0.5}"#),
        ("loglinear-gated-deltanet", "{}"),
        ("loglinear-gated-deltanet", r#"{"lambda_scheme": "ones"}"#),
    ] {
        common::cross_check(name, cfg, &common::sizes(&[1, 37, 100]), &WANT);
    }
}

#[test]
fn loglinear_cuda_plugin_mask_and_scheme() {
    if !common::gpu() {
        return;
    }
    common::cross_check("log-distance-mamba2", "{}", &common::sizes(&[37, 100]), &WANT);
    common::cross_check(
        "loglinear-gated-deltanet",
        r#"{"mask": "log-distance", "lambda_scheme": "sigmoid2"}"#,
        &common::sizes(&[37]),
        &WANT,
    );
}
