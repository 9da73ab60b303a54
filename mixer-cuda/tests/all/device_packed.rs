//! Packed batches on device tensors (`mixer_cuda::{run_device_packed, backward_device_packed}`)
//! against the host-array packed path on CUDA (`mixer_registry::packed`, which runs the same
//! device forms sequence by sequence on uploaded copies), bit for bit: linear attention, Mamba-2
//! and gated DeltaNet with and without states in every precision mode, attention without; an
//! empty sequence, one token, two, around a chunk (63, 64, 65, 68) and the last offset short of
//! the buffer (rows past it zero); the GLR and the Toeplitz mixer without states; and the errors.

use mixer_core::mixer::Mixer;
use mixer_core::state::StateVjp;
use mixer_core::tensor::cast_tensors;
use mixer_core::{Dims, Form, Precision, Requires, Tensors};
use mixer_cuda::forms::{download_as, upload_inputs, upload_one};
use mixer_cuda::{DeviceTensors, backward_device_packed, run_device_packed};
use mixer_registry::mixer;
use mixer_registry::packed::{backward_packed, run_packed};
use mixer_registry::run::bf16_activations;
use ndarray::{ArrayD, Axis, Slice};

use crate::common::{cpu, cuda, gpu};

/// Sequences of 0, 1, 2, 63, 64, 65, 68 and 37 tokens, then 10 rows past the last offset.
const CU: [usize; 9] = [0, 0, 1, 3, 66, 130, 195, 263, 300];
const T: usize = 310;

fn down(t: &DeviceTensors) -> Tensors<f32> {
    t.iter().map(|(k, v)| (k.clone(), download_as::<f32>(v).expect("download"))).collect()
}

/// `max |a − b| / max |b|`.
fn max_rel(a: &ArrayD<f32>, b: &ArrayD<f32>) -> f64 {
    let scale = b.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs())).max(1e-30);
    a.iter().zip(b).fold(0f64, |m, (&x, &y)| m.max((f64::from(x) - f64::from(y)).abs())) / scale
}

/// `got` equals `want` bit for bit, or, where the two ran other kernels (`rounded`), within
/// 5·10⁻³ of `want`'s largest entry (the tf32 mode's tolerance; the error is printed).
fn agree(got: &ArrayD<f32>, want: &ArrayD<f32>, rounded: bool, what: &str) {
    if !rounded {
        assert_eq!(got, want, "{what}");
        return;
    }
    let err = max_rel(got, want);
    eprintln!("{what}: max error {err:.3e} of the largest entry");
    assert!(err <= 5e-3, "{what}: max error {err:.3e} of the largest entry");
}

fn tail_is_zero(y: &ArrayD<f32>, what: &str) {
    let tail = y.slice_axis(Axis(1), Slice::from(CU[8]..));
    assert!(tail.iter().all(|&v| v == 0.0), "{what}: rows past the last offset are not zero");
}

/// The device packed run and backward of `m` against the host packed path on CUDA, bit for bit.
fn same_bits(m: &dyn Mixer, stateful: bool) {
    let gpu = cuda();
    let n = CU.len() - 1;
    let dims: Dims = [("B", 1), ("T", T), ("H", 2), ("Dk", 48), ("Dv", 40)].into_iter().collect();
    let x = cast_tensors::<f32>(&m.random_inputs(&dims, 5).unwrap());
    let s0 = stateful.then(|| {
        let mut d = dims.clone();
        d.insert("B", n);
        cast_tensors::<f32>(&m.random_state(&d, 6).unwrap())
    });
    let all = Requires::All;
    for p in [Precision::Exact, Precision::Tf32, Precision::Bf16] {
        let label = format!("{} {p}", m.name());
        let dev = upload_inputs(&x, p).unwrap();
        // Without states.
        let (want, _) = run_packed(m, &gpu, Form::Fast, &x, &CU, None, false, p).unwrap();
        let (y, fin) = run_device_packed(m, &dev, &CU, None, false, p, true).unwrap();
        assert!(fin.is_none(), "{label}: a final state without asking");
        let y = download_as::<f32>(&y).unwrap();
        assert_eq!(y, want, "{label}: y");
        tail_is_zero(&y, &label);
        let dy = want.mapv(|v| (1.7 * v + 0.2).sin());
        if p == Precision::Exact {
            let args = StateVjp { x: &x, initial: None, dy: &dy, d_final: None, requires: &all };
            let (g, _) = backward_packed(m, &gpu, Form::Fast, &CU, args).unwrap();
            let dyd = upload_one(&dy, false).unwrap();
            let (gd, ds) = backward_device_packed(m, &dev, &CU, None, &dyd, None, &all, p, true).unwrap();
            assert!(ds.is_empty(), "{label}: an initial state's gradient without one");
            let gd = down(&gd);
            assert_eq!(gd, g, "{label}: gradients");
            for (k, v) in &gd {
                tail_is_zero(v, &format!("{label} {k}"));
            }
        }
        let Some(s0) = &s0 else { continue };
        // From states (one row per sequence; the empty sequence passes its row through).
        let (want, want_f) = run_packed(m, &gpu, Form::Fast, &x, &CU, Some(s0), true, p).unwrap();
        let s0d = upload_inputs(s0, Precision::Exact).unwrap();
        let (y, fin) = run_device_packed(m, &dev, &CU, Some(&s0d), true, p, true).unwrap();
        assert_eq!(download_as::<f32>(&y).unwrap(), want, "{label} from states: y");
        let fin = down(&fin.expect("final states"));
        assert_eq!(fin, want_f.unwrap(), "{label} from states: final states");
        assert_eq!(fin["S"].index_axis(Axis(0), 0), s0["S"].index_axis(Axis(0), 0), "{label}: the empty one");
        // The backward from states: exact on the values as the mode stores them.
        let bf16 = p == Precision::Bf16;
        let xs = if bf16 { bf16_activations(&x) } else { x.clone() };
        let dy = want.mapv(|v| (1.3 * v - 0.4).cos());
        let dy = if bf16 { dy.mapv(mixer_core::precision::round_bf16) } else { dy };
        let df: Tensors<f32> = fin.iter().map(|(k, v)| (k.clone(), v.mapv(|e| (0.9 * e).sin()))).collect();
        let args = StateVjp { x: &xs, initial: Some(s0), dy: &dy, d_final: Some(&df), requires: &all };
        let (g, ds) = backward_packed(m, &gpu, Form::Fast, &CU, args).unwrap();
        let (dyd, dfd) = (upload_one(&dy, bf16).unwrap(), upload_inputs(&df, Precision::Exact).unwrap());
        let (gd, dsd) =
            backward_device_packed(m, &dev, &CU, Some(&s0d), &dyd, Some(&dfd), &all, p, true).unwrap();
        assert_eq!(down(&gd), g, "{label} from states: gradients");
        assert_eq!(down(&dsd), ds, "{label} from states: the initial states' gradient");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_packed_batches_equal_the_host_packed_path_bit_for_bit() {
    let Some(_turn) = gpu() else { return };
    for name in ["linear-attention", "mamba2", "gated-deltanet"] {
        same_bits(mixer(name, &serde_json::json!({})).unwrap().as_ref(), true);
    }
    same_bits(mixer("attention", &serde_json::json!({})).unwrap().as_ref(), false);
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_packed_batches_refuse_what_they_cannot_run() {
    let Some(_turn) = gpu() else { return };
    let m = mixer("mamba2", &serde_json::json!({})).unwrap();
    let dims: Dims = [("B", 2), ("T", 9), ("H", 1), ("Dk", 4), ("Dv", 4)].into_iter().collect();
    let x =
        upload_inputs(&cast_tensors::<f32>(&m.random_inputs(&dims, 1).unwrap()), Precision::Exact).unwrap();
    let e = run_device_packed(m.as_ref(), &x, &[0, 4, 9], None, false, Precision::Exact, true).unwrap_err();
    assert!(e.to_string().contains("B = 1"), "{e}");
    let one: Dims = [("B", 1), ("T", 9), ("H", 1), ("Dk", 4), ("Dv", 4)].into_iter().collect();
    let x =
        upload_inputs(&cast_tensors::<f32>(&m.random_inputs(&one, 1).unwrap()), Precision::Exact).unwrap();
    let e = run_device_packed(m.as_ref(), &x, &[0, 4, 10], None, false, Precision::Exact, true).unwrap_err();
    assert!(e.to_string().contains("at most at T = 9"), "{e}");
    let wrong =
        upload_inputs(&cast_tensors::<f32>(&m.random_state(&one, 2).unwrap()), Precision::Exact).unwrap();
    let e = run_device_packed(m.as_ref(), &x, &[0, 4, 9], Some(&wrong), true, Precision::Exact, true)
        .unwrap_err();
    assert!(e.to_string().contains("one row per sequence"), "{e}");
}

/// The GLR (slots cut to each sequence's length on the device, their gradients placed back with
/// zeros in the slots a shorter sequence lacks) and the Toeplitz mixer (taps and bias taken whole,
/// their gradients summed over the sequences) over the sequences of [`CU`]: the device packed run
/// and backward against the host packed path on CUDA, bit for bit, in every mode the host path
/// runs (and refused by both in the others).
#[test]
#[ignore = "needs a CUDA device"]
fn device_packed_batches_of_the_glr_and_the_toeplitz_mixer_equal_the_host_packed_path() {
    let Some(_turn) = gpu() else { return };
    let gpu = cuda();
    let all = Requires::All;
    let sizes = mixer_registry::Sizes { batch: 1, seq: T, channels: 6, heads: 2, dk: 4, dv: 4 }.dims();
    for (name, cfg) in [
        ("glr", serde_json::json!({"pattern": "pow2"})),
        ("glr", serde_json::json!({"pattern": "sq1", "cache_efficient": true})),
        ("glr", serde_json::json!({"pattern": "pow2", "on": "both"})),
        ("kth-order", serde_json::json!({"order": 3})),
        ("toeplitz", serde_json::json!({})),
        ("toeplitz", serde_json::json!({"heads": 3})),
    ] {
        let m = mixer(name, &cfg).unwrap();
        let dims = mixer_core::mixer::complete_dims(m.as_ref(), &sizes);
        let x = cast_tensors::<f32>(&m.random_inputs(&dims, 7).unwrap());
        for p in [Precision::Exact, Precision::Tf32, Precision::Bf16] {
            let label = format!("{name} {cfg} {p}");
            let dev = upload_inputs(&x, p).unwrap();
            let device = run_device_packed(m.as_ref(), &dev, &CU, None, false, p, true);
            let want = match run_packed(m.as_ref(), &gpu, Form::Fast, &x, &CU, None, false, p) {
                Ok((want, _)) => want,
                Err(e) => {
                    assert!(device.is_err(), "{label}: the host path refuses ({e}), the device path runs");
                    continue;
                }
            };
            let y = download_as::<f32>(&device.unwrap().0).unwrap();
            assert_eq!(y, want, "{label}: y");
            tail_is_zero(&y, &label);
            if p != Precision::Exact {
                continue;
            }
            let dy = want.mapv(|v| (1.7 * v + 0.2).sin());
            let args = StateVjp { x: &x, initial: None, dy: &dy, d_final: None, requires: &all };
            let (g, _) = backward_packed(m.as_ref(), &gpu, Form::Fast, &CU, args).unwrap();
            let dyd = upload_one(&dy, false).unwrap();
            let (gd, _) =
                backward_device_packed(m.as_ref(), &dev, &CU, None, &dyd, None, &all, p, true).unwrap();
            let gd = down(&gd);
            assert_eq!(
                gd.keys().collect::<Vec<_>>(),
                g.keys().collect::<Vec<_>>(),
                "{label}: gradient names"
            );
            for (k, v) in &g {
                assert_eq!(&gd[k], v, "{label}: {k}");
            }
            assert!(g.values().all(|v| v.iter().any(|&e| e != 0.0)), "{label}: a zero gradient");
        }
    }
}

/// Linear attention and Mamba-2 over 60 sequences (H = 4, D = 64) in every mode, with and without
/// states: one launch sequence on the chunk table — in the tf32 and bf16 modes walking the chunks
/// of every (sequence, head), in the exact mode the FMA states, scan and outputs (checked through
/// the packed plan) — equals the host packed path on CUDA, which runs every sequence alone, bit
/// for bit; and the eight sequences of [`CU`] (the table's chunk states and scan, no walk). Gated
/// DeltaNet likewise where it takes the table (its register state passes: the bf16 one at any
/// count, the tf32 one at 60 sequences, where a sequence alone takes another pass, so the two
/// agree within the tf32 tolerance and the batch with the CPU too), sequence by sequence elsewhere.
#[test]
#[ignore = "needs a CUDA device"]
fn packed_batches_of_the_base_mixers_run_as_one_batch_and_equal_the_sequences_alone() {
    let Some(_turn) = gpu() else { return };
    let gpu = cuda();
    // Lengths 0, 1, 63, 64, 65, 128, 200 and pseudo-random ones up to 300.
    let mut lens = vec![0usize, 1, 63, 64, 65, 128, 200];
    let mut r = 12345u64;
    while lens.len() < 60 {
        r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        lens.push((r >> 33) as usize % 301);
    }
    let mut cu = vec![0];
    for l in &lens {
        cu.push(cu.last().unwrap() + l);
    }
    let t = cu.last().unwrap() + 7;
    let device = mixer_cuda::loglinear::Device::current();
    for name in ["linear-attention", "mamba2", "gated-deltanet"] {
        let gdn = name == "gated-deltanet";
        let m = mixer(name, &serde_json::json!({})).unwrap();
        let ll = m.as_any().downcast_ref::<mixer_core::mixers::loglinear::LogLinear>().unwrap();
        let dims: Dims = [("B", 1), ("T", t), ("H", 4), ("Dk", 64), ("Dv", 64)].into_iter().collect();
        let x = cast_tensors::<f32>(&m.random_inputs(&dims, 9).unwrap());
        let mut d = dims.clone();
        d.insert("B", lens.len());
        let s0 = cast_tensors::<f32>(&m.random_state(&d, 10).unwrap());
        let s0d = upload_inputs(&s0, Precision::Exact).unwrap();
        for p in [Precision::Exact, Precision::Tf32, Precision::Bf16] {
            let storage = if p == Precision::Bf16 {
                mixer_cuda::loglinear::Storage::Bf16 { aligned: true }
            } else {
                mixer_cuda::loglinear::Storage::Real(mixer_cuda::loglinear::Elem::F32)
            };
            for (cu, walks) in [(&cu[..], true), (&CU[..], false)] {
                let tt = if walks { t } else { T };
                let x = if walks { x.clone() } else { slice_t(&x, tt) };
                let pl =
                    mixer_cuda::loglinear::packed::plan_packed(ll, [tt, 4, 64, 64], cu, p, storage, device)
                        .unwrap();
                // Gated DeltaNet takes the table with its register passes only: the bf16 one, and
                // the tf32 one where there are many (sequence, head) rows.
                let native = !gdn || p == Precision::Bf16 || (walks && p == Precision::Tf32);
                assert_eq!(pl.is_some(), native, "{name} {p} {} sequences", cu.len() - 1);
                if let Some(pl) = &pl {
                    let walk = !gdn && walks && p != Precision::Exact;
                    let l = &pl.launches;
                    assert_eq!(l[0].function.starts_with("llc_walk_tc"), walk, "{name} {p}: {l:?}");
                }
                let label = format!("{name} {p} {} sequences", cu.len() - 1);
                let dev = upload_inputs(&x, p).unwrap();
                let (want, _) = run_packed(m.as_ref(), &gpu, Form::Fast, &x, cu, None, false, p).unwrap();
                let (y, _) = run_device_packed(m.as_ref(), &dev, cu, None, false, p, true).unwrap();
                let y = download_as::<f32>(&y).unwrap();
                // Gated DeltaNet's sequences alone take the shared-memory state pass in the tf32
                // mode (too few rows for the register pass the table takes): other roundings, so
                // the two are compared within the mode's tolerance, and both with the CPU.
                let rounded = gdn && walks && p == Precision::Tf32;
                agree(&y, &want, rounded, &format!("{label}: y against the sequences alone"));
                if rounded {
                    let (cpu_y, _) =
                        run_packed(m.as_ref(), &cpu(), Form::Fast, &x, cu, None, false, p).unwrap();
                    agree(&y, &cpu_y, true, &format!("{label}: y against the CPU"));
                }
                if !walks {
                    continue;
                }
                let (want, want_f) =
                    run_packed(m.as_ref(), &gpu, Form::Fast, &x, cu, Some(&s0), true, p).unwrap();
                let (y, fin) = run_device_packed(m.as_ref(), &dev, cu, Some(&s0d), true, p, true).unwrap();
                let y = download_as::<f32>(&y).unwrap();
                agree(&y, &want, rounded, &format!("{label} from states: y"));
                assert!(y.slice_axis(Axis(1), Slice::from(cu[cu.len() - 1]..)).iter().all(|&v| v == 0.0));
                let (fin, want_f) = (down(&fin.expect("final states")), want_f.unwrap());
                assert!(fin.keys().eq(want_f.keys()), "{label}: the final states' names");
                for (k, v) in &fin {
                    agree(v, &want_f[k], rounded, &format!("{label}: final state {k}"));
                }
            }
        }
    }
}

/// Mamba-2 with Dk = 136 (the general tensor-core output kernel, `llc_out_tc`) over the sequences
/// of [`CU`] in the tf32 mode, from states: one launch sequence on the chunk table equals the host
/// packed path on CUDA bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn packed_batches_with_wide_keys_run_the_general_output_kernel_on_the_table() {
    let Some(_turn) = gpu() else { return };
    let m = mixer("mamba2", &serde_json::json!({})).unwrap();
    let ll = m.as_any().downcast_ref::<mixer_core::mixers::loglinear::LogLinear>().unwrap();
    let dims: Dims = [("B", 1), ("T", T), ("H", 2), ("Dk", 136), ("Dv", 40)].into_iter().collect();
    let x = cast_tensors::<f32>(&m.random_inputs(&dims, 11).unwrap());
    let mut d = dims.clone();
    d.insert("B", CU.len() - 1);
    let s0 = cast_tensors::<f32>(&m.random_state(&d, 12).unwrap());
    let p = Precision::Tf32;
    let storage = mixer_cuda::loglinear::Storage::Real(mixer_cuda::loglinear::Elem::F32);
    let device = mixer_cuda::loglinear::Device::current();
    let l = mixer_cuda::loglinear::packed::plan_packed(ll, [T, 2, 136, 40], &CU, p, storage, device)
        .unwrap()
        .expect("one launch sequence")
        .launches;
    assert_eq!(l.last().unwrap().function, "llc_out_tc_f32");
    let (want, want_f) = run_packed(m.as_ref(), &cuda(), Form::Fast, &x, &CU, Some(&s0), true, p).unwrap();
    let (dev, s0d) = (upload_inputs(&x, p).unwrap(), upload_inputs(&s0, Precision::Exact).unwrap());
    let (y, fin) = run_device_packed(m.as_ref(), &dev, &CU, Some(&s0d), true, p, true).unwrap();
    assert_eq!(download_as::<f32>(&y).unwrap(), want, "y");
    assert_eq!(down(&fin.expect("final states")), want_f.unwrap(), "final states");
}

/// The first `t` rows of every `[1, T, …]` input.
fn slice_t(x: &Tensors<f32>, t: usize) -> Tensors<f32> {
    x.iter().map(|(k, v)| (k.clone(), v.slice_axis(Axis(1), Slice::from(..t)).to_owned())).collect()
}
