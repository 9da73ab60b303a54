//! Runs from a state in the tf32 and bf16 modes (docs/math.md §7.1): the three base mixers take
//! the kernels of the run without a state — the tensor-core output kernels read `H_0 = S_0ᵀ` in
//! chunk 0, gated DeltaNet's tensor-core and bf16 state passes start from it and write the final
//! state — so a run from a state costs what the run without one costs.

use std::collections::BTreeSet;

use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::state::segment;
use mixer_core::tensor::{cast_tensors, tensors_to_f64};
use mixer_core::{Dims, Form, Precision, Tensors};
use mixer_cuda::loglinear::{Device, Elem, Storage, plan};
use mixer_cuda::{AnyDeviceTensor, DeviceTensor};
use mixer_registry::run::bf16_activations;
use mixer_registry::state::run_state;

use super::common;

/// `y` of a device run as f64 on the host, whatever its dtype.
fn host_y(y: &AnyDeviceTensor) -> ndarray::ArrayD<f64> {
    match y {
        AnyDeviceTensor::Bf16(y) => y.to_host().unwrap().mapv(|v| f64::from(v.to_f32())),
        AnyDeviceTensor::F32(y) => y.to_host().unwrap().mapv(f64::from),
        AnyDeviceTensor::F64(y) => y.to_host().unwrap(),
    }
}

/// The device run of `ll` from `s0` in mode `p` on `x` (f32 values, stored as the mode stores
/// them): `y` and the final state, f64 on the host.
fn device_run(
    ll: &LogLinear,
    x: &Tensors<f32>,
    s0: &ndarray::ArrayD<f32>,
    p: Precision,
) -> (ndarray::ArrayD<f64>, ndarray::ArrayD<f64>) {
    let dev = mixer_cuda::forms::upload_inputs(x, p).unwrap();
    let s0d = DeviceTensor::<f32>::upload(s0).unwrap();
    let (y, fin) = mixer_cuda::loglinear::fast::run_from::<f32>(ll, &dev, p, Some(&s0d), true).unwrap();
    (host_y(&y), fin.expect("a final state").to_host().unwrap().mapv(f64::from))
}

/// Linear attention, Mamba-2 and gated DeltaNet from a random state in the tf32 and bf16 modes,
/// through the device entry point (activations stored as the mode stores them) and through the
/// registry's `run_state`: `y` and `S_T` against the CPU's fast form (f64) from the same state on
/// the same values (rounded to bf16 in the bf16 mode), within the mode's tolerance, at
/// T = 1, 65, 1000 and shapes that reach every kernel that now takes the state: the 64- and
/// 128-column output tiles (`Dk` 64, 100, 128) and the general tensor-core output (`Dk` 130), gated
/// DeltaNet's shared-memory pass (few heads), register pass (many heads) and bf16 pass (`Dk`, `Dv`
/// multiples of 8). A run split at a point inside a chunk and at a chunk boundary, the second part
/// from the first's final state, gives the whole run's rows and final state within the same
/// tolerance. The kernels the plans launched are collected and checked to include all of these.
#[test]
#[ignore = "needs a CUDA device"]
fn runs_from_a_state_in_the_tf32_and_bf16_modes_match_the_cpu() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let (cpu, gpu) = (common::cpu(), common::cuda());
    let device = Device::current();
    let mut launched = BTreeSet::new();
    for name in ["linear-attention", "mamba2", "gated-deltanet"] {
        let m = mixer_registry::mixer(name, &serde_json::json!({})).unwrap();
        let ll = m.as_any().downcast_ref::<LogLinear>().unwrap();
        let shapes: &[(usize, usize, usize, usize)] = if name == "gated-deltanet" {
            &[(2, 2, 64, 64), (2, 40, 64, 64), (1, 2, 128, 128), (2, 3, 100, 72), (1, 2, 48, 40)]
        } else {
            &[(2, 2, 64, 64), (1, 3, 100, 72), (1, 2, 128, 128), (1, 2, 130, 48)]
        };
        for &(b, h, dk, dv) in shapes {
            for t in [1, 65, 1000] {
                let dims: Dims = [("B", b), ("T", t), ("H", h), ("Dk", dk), ("Dv", dv)].into_iter().collect();
                let x = m.random_inputs(&dims, 7 + t as u64).unwrap();
                let s0 = m.random_state(&dims, 8).unwrap();
                let s32 = cast_tensors::<f32>(&s0);
                for p in [Precision::Tf32, Precision::Bf16] {
                    let storage = if p == Precision::Bf16 {
                        Storage::Bf16 { aligned: true }
                    } else {
                        Storage::Real(Elem::F32)
                    };
                    let pl = plan(ll, [b, t, h, dk, dv], p, storage, device).unwrap();
                    launched.extend(pl.launches.iter().map(|l| l.function.clone()));
                    let x32 = cast_tensors::<f32>(&x);
                    let x32 = if p == Precision::Bf16 { bf16_activations(&x32) } else { x32 };
                    let (yc, sc) = run_state(
                        m.as_ref(),
                        &cpu,
                        Form::Fast,
                        &tensors_to_f64(&x32),
                        Some(&s0),
                        Precision::Exact,
                    )
                    .unwrap();
                    let tol = p.tolerance("f32");
                    let (y, st) = device_run(ll, &x32, &s32["S"], p);
                    let (yr, sr) =
                        run_state(m.as_ref(), &gpu, Form::Fast, &cast_tensors::<f32>(&x), Some(&s32), p)
                            .unwrap();
                    for (via, y, st) in [
                        ("run_from", y.clone(), st.clone()),
                        ("run_state", yr.mapv(f64::from), sr["S"].mapv(f64::from)),
                    ] {
                        let cy = tol.compare(y.view(), yc.view());
                        let cs = tol.compare(st.view(), sc["S"].view());
                        println!(
                            "STATE MODES {name} {via} {p} B={b} H={h} Dk={dk} Dv={dv} T={t} {:?}: y rel_rms={:.2e} S_T rel_rms={:.2e}",
                            pl.state_pass, cy.rel_rms, cs.rel_rms
                        );
                        assert!(cy.pass, "{name} {via} {p} {dims:?} y: {cy:?}");
                        assert!(cs.pass, "{name} {via} {p} {dims:?} S_T: {cs:?}");
                    }
                    // Split inside a chunk and on a chunk boundary.
                    for a in [37, 64].into_iter().filter(|&a| a < t) {
                        let xa =
                            cast_tensors::<f32>(&segment(m.as_ref(), &tensors_to_f64(&x32), 0..a).unwrap());
                        let xb =
                            cast_tensors::<f32>(&segment(m.as_ref(), &tensors_to_f64(&x32), a..t).unwrap());
                        let (ya, sa) = device_run(ll, &xa, &s32["S"], p);
                        let (yb, sb) = device_run(ll, &xb, &sa.mapv(|v| v as f32), p);
                        let joined = ndarray::concatenate(ndarray::Axis(1), &[ya.view(), yb.view()]).unwrap();
                        let cy = tol.compare(joined.view(), y.view());
                        let cs = tol.compare(sb.view(), st.view());
                        assert!(cy.pass, "{name} {p} {dims:?} split at {a}, y: {cy:?}");
                        assert!(cs.pass, "{name} {p} {dims:?} split at {a}, S_T: {cs:?}");
                    }
                }
            }
        }
    }
    println!("STATE MODES kernels: {launched:?}");
    for want in [
        "llc_out_direct_tc_f32",
        "llc_out_direct_tc_f32_k128",
        "llc_out_direct_tc_bf16",
        "llc_out_direct_tc_bf16_k128",
        "llc_out_direct_tc_hb",
        "llc_out_direct_tc_hb_k128",
        "llc_out_tc_f32",
        "llc_delta_h_tc_f32",
        "llc_delta_h_rg_f32",
        "llc_delta_h_rb_bf16",
    ] {
        assert!(launched.contains(want), "no run from a state took {want}: {launched:?}");
    }
}
