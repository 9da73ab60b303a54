//! Toeplitz on CUDA (fast = cuFFT, parallel = direct, recurrent = online or naive decoder)
//! against the f64 oracle and the CPU forms.

use super::common;

use mixer_core::Form;
use mixer_registry::run::{oracle, run_as};
use mixer_registry::{Sizes, mixer};

#[test]
#[ignore = "needs a CUDA device"]
fn toeplitz_cuda_forms_match_the_oracle() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let want = [Form::Fast, Form::Parallel, Form::Recurrent];
    for cfg in [
        r#"{"decoder": "naive"}"#,
        r#"{"heads": 2, "decoder": "naive"}"#,
        r#"{"heads": 3, "kernel_width": 2, "decoder": "naive"}"#,
        r#"{"heads": 1, "kernel_width": 4, "decoder": "naive"}"#,
    ] {
        common::cross_check("toeplitz", cfg, &common::sizes(&[1, 37, 100]), &want);
    }
}

/// The online decoder past its direct tiles: from n = 128 on, tiles of 128, 256 and 512 inputs go
/// through cuFFT (transform sizes 256–1024), with kernel widths above 1 and several heads.
#[test]
#[ignore = "needs a CUDA device"]
fn toeplitz_cuda_online_decoder() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    for cfg in [r#"{}"#, r#"{"heads": 2, "kernel_width": 3}"#, r#"{"heads": 3, "kernel_width": 2}"#] {
        common::cross_check("toeplitz", cfg, &common::sizes(&[1, 100, 300, 1000]), &[Form::Recurrent]);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn toeplitz_cuda_without_bias_and_large_t() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let m = mixer("toeplitz", &serde_json::json!({"heads": 2, "kernel_width": 3})).unwrap();
    let s = Sizes { batch: 3, seq: 1111, channels: 10, heads: 2, dk: 1, dv: 1 };
    let dims = mixer_core::mixer::complete_dims(m.as_ref(), &s.dims());
    let mut inputs = m.random_inputs(&dims, 7).unwrap();
    inputs.remove("bias");
    let want = oracle(m.as_ref(), &inputs).unwrap();
    for form in [Form::Fast, Form::Parallel] {
        for dtype in [mixer_core::DType::F32, mixer_core::DType::F64] {
            let got = run_as(m.as_ref(), &common::cuda(), form, &inputs, dtype).unwrap();
            let c = mixer_core::Tolerance::for_dtype(dtype.name()).compare(got.view(), want.view());
            println!(
                "CHECK toeplitz no-bias T=1111 form={form} dtype={} rel_rms={:.3e}",
                dtype.name(),
                c.rel_rms
            );
            assert!(c.pass, "{form} {}: {c:?}", dtype.name());
        }
    }
}

/// More spectra than a grid has block rows (65535): the spectral products stride over the rows,
/// and the last rows must be neither skipped nor written twice — the paired path (one tap,
/// 7300 channels per head: B·C/2 = 65700 complex rows) and the real path (two taps, B·C =
/// 131400 rows).
#[test]
#[ignore = "needs a CUDA device"]
fn toeplitz_cuda_more_rows_than_the_grid_height() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    for kw in [1, 2] {
        let m = mixer("toeplitz", &serde_json::json!({"heads": 2, "kernel_width": kw})).unwrap();
        let s = Sizes { batch: 9, seq: 5, channels: 14600, heads: 2, dk: 1, dv: 1 };
        let dims = mixer_core::mixer::complete_dims(m.as_ref(), &s.dims());
        let inputs = m.random_inputs(&dims, 11).unwrap();
        let want = oracle(m.as_ref(), &inputs).unwrap();
        let got = run_as(m.as_ref(), &common::cuda(), Form::Fast, &inputs, mixer_core::DType::F32).unwrap();
        let c = mixer_core::Tolerance::for_dtype("f32").compare(got.view(), want.view());
        println!("CHECK toeplitz B = 9, C = 14600, Kw = {kw} form=fast rel_rms={:.3e}", c.rel_rms);
        assert!(c.pass, "Kw = {kw}: {c:?}");
    }
}
