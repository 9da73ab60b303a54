//! The ops on candle's CUDA tensors (feature `cuda`): `y`, the final state and the gradients of
//! candle's `backward()` against the same ops on CPU tensors in `f64`, within each mode's
//! tolerance. `#[ignore]`d like every GPU test: `cargo test -p mixers-candle --features cuda --
//! --include-ignored cuda` on a machine with a GPU (`MIXERS_REQUIRE_CUDA=1` turns a missing
//! device into a failure).
//!
//! The sizes have `Dk = 5`, `Dv = 3` (parts of the packed buffer that start off a 16-byte
//! boundary: the aligned copy) and `Dk = Dv = 64` (the tensor-core paths), lengths that are not
//! chunk multiples.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor, Var};
use mixers::ndarray::ArrayD;
use mixers::ops::{Options, Precision};
use mixers::registry::Sizes;

use crate::common::*;

/// The first CUDA device, or `None` (the test passes vacuously) where there is none, unless
/// `MIXERS_REQUIRE_CUDA=1`.
fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("MIXERS_REQUIRE_CUDA").as_deref() == Ok("1") => panic!("no CUDA device: {e}"),
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// The modes on CUDA with the dtype they take and the tolerance of `max |a − b| / max |b|`
/// against the CPU in `f64`.
const MODES: [(Precision, DType, f64); 4] = [
    (Precision::Exact, DType::F64, 1e-10),
    (Precision::Exact, DType::F32, 1e-4),
    (Precision::Tf32, DType::F32, 5e-3),
    (Precision::Bf16, DType::F32, 2e-2),
];

/// Every input as a candle variable of `dtype` on `dev`.
fn vars_on(x: &mixers::prelude::Tensors<f64>, dtype: DType, dev: &Device) -> BTreeMap<String, Var> {
    x.iter()
        .map(|(k, a)| (k.clone(), Var::from_tensor(&tensor(a, dtype).to_device(dev).unwrap()).unwrap()))
        .collect()
}

/// A tensor (any device, any dtype) as an `f64` array.
fn host(t: &Tensor) -> ArrayD<f64> {
    array::<f64>(&t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap())
}

/// `max |a − b| ≤ tol · max(max |b|, 1)`, or what failed. The inputs are of order one, so the
/// floor keeps a quantity that is zero in exact arithmetic (attention's `d_k` and Mamba-2's `d_g`
/// at `T = 1`, sums of terms of order one that cancel) from being judged by its rounding.
fn within(a: &ArrayD<f64>, b: &ArrayD<f64>, tol: f64, what: &str) -> Result<(), String> {
    if a.shape() != b.shape() {
        return Err(format!("{what}: shape {:?}, expected {:?}", a.shape(), b.shape()));
    }
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1.0);
    let err = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    if err <= tol * scale {
        return Ok(());
    }
    Err(format!("{what}: max error {err:.3e} above {tol:.0e} × max {scale:.3e}"))
}

/// Asserts [`within`].
fn close(a: &ArrayD<f64>, b: &ArrayD<f64>, tol: f64, what: &str) {
    if let Err(e) = within(a, b, tol, what) {
        panic!("{e}");
    }
}

/// Asserts [`within`] for every gradient of `got`, naming all that fail.
fn grads_close(
    got: &BTreeMap<String, ArrayD<f64>>,
    want: &BTreeMap<String, ArrayD<f64>>,
    tol: f64,
    what: &str,
) {
    let failed: Vec<String> = got
        .iter()
        .filter_map(|(k, g)| within(g, &want[k], tol.max(1e-9) * 4.0, &format!("{what}: d_{k}")).err())
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A fixed cotangent of `y`'s shape with entries in [−1, 1].
fn weights(shape: &[usize]) -> ArrayD<f64> {
    let n: usize = shape.iter().product();
    ArrayD::from_shape_vec(shape, (0..n).map(|i| (i as f64 * 0.37).sin()).collect()).unwrap()
}

/// `y`, and the gradients of `Σ y ⊙ w` of every input, for the typed op `name` on variables `v`.
fn run_op(
    name: &str,
    v: &BTreeMap<String, Var>,
    opts: &Options,
) -> (ArrayD<f64>, BTreeMap<String, ArrayD<f64>>) {
    let y = candle_op(name, v, opts).unwrap();
    let w = tensor(&weights(y.dims()), y.dtype()).to_device(y.device()).unwrap();
    let g = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let grads = v.iter().map(|(k, t)| (k.clone(), host(g.get(t).unwrap()))).collect();
    (host(&y), grads)
}

fn sizes_wide(b: usize, t: usize) -> Sizes {
    Sizes { batch: b, seq: t, channels: 128, heads: 2, dk: 64, dv: 64 }
}

#[test]
#[ignore = "needs a CUDA device"]
fn typed_ops_on_cuda_tensors_match_the_cpu_forward_and_backward_in_every_mode() {
    let Some(dev) = gpu() else { return };
    for (name, _) in TYPED {
        for sz in [sizes(1, 1), sizes(2, 63), sizes(1, 130), sizes_wide(2, 65), sizes_wide(1, 200)] {
            let (_, x) = inputs(name, &sz, 40 + sz.seq as u64);
            let (y_ref, g_ref) = run_op(name, &vars(&x, DType::F64), &Options::default());
            for (p, dtype, tol) in MODES {
                let what = format!("{name} {p} {dtype:?} B = {} T = {} Dk = {}", sz.batch, sz.seq, sz.dk);
                let (y, g) = run_op(name, &vars_on(&x, dtype, &dev), &Options::default().precision(p));
                close(&y, &y_ref, tol, &format!("{what}: y"));
                grads_close(&g, &g_ref, tol, &what);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn state_ops_on_cuda_tensors_match_the_cpu_with_the_state_gradient() {
    let Some(dev) = gpu() else { return };
    for name in ["linear-attention", "mamba2", "gated-deltanet"] {
        for sz in [sizes(2, 65), sizes_wide(1, 130)] {
            let (m, x) = inputs(name, &sz, 7);
            let dims = mixers::core::mixer::complete_dims(m.as_ref(), &sz.dims());
            let s0 = m.random_state(&dims, 9).unwrap().remove("S").unwrap();
            let run = |dev: &Device, dtype: DType, p: Precision| {
                let v = vars_on(&x, dtype, dev);
                let s = Var::from_tensor(&tensor(&s0, dtype).to_device(dev).unwrap()).unwrap();
                let t = |n: &str| v[n].as_tensor();
                let opts = Options::default().precision(p);
                let (y, fin) = match name {
                    "linear-attention" => {
                        mixers_candle::ops::linear_attention_state(t("q"), t("k"), t("v"), Some(&s), &opts)
                    }
                    "mamba2" => {
                        mixers_candle::ops::mamba2_state(t("q"), t("k"), t("v"), t("g"), Some(&s), &opts)
                    }
                    _ => mixers_candle::ops::gated_deltanet_state(
                        t("q"),
                        t("k"),
                        t("v"),
                        t("g"),
                        t("beta"),
                        Some(&s),
                        &opts,
                    ),
                }
                .unwrap();
                let wy = tensor(&weights(y.dims()), y.dtype()).to_device(dev).unwrap();
                let ws = tensor(&weights(fin.dims()), fin.dtype()).to_device(dev).unwrap();
                let l = ((&y * &wy).unwrap().sum_all().unwrap() + (&fin * &ws).unwrap().sum_all().unwrap())
                    .unwrap();
                let g = l.backward().unwrap();
                let mut grads: BTreeMap<String, ArrayD<f64>> =
                    v.iter().map(|(k, t)| (k.clone(), host(g.get(t).unwrap()))).collect();
                grads.insert("S".into(), host(g.get(&s).unwrap()));
                (host(&y), host(&fin), grads)
            };
            let (y_ref, s_ref, g_ref) = run(&Device::Cpu, DType::F64, Precision::Exact);
            for (p, dtype, tol) in MODES {
                let what = format!("{name} from a state, {p} {dtype:?} T = {} Dk = {}", sz.seq, sz.dk);
                let (y, s, g) = run(&dev, dtype, p);
                close(&y, &y_ref, tol, &format!("{what}: y"));
                close(&s, &s_ref, tol, &format!("{what}: S_T"));
                grads_close(&g, &g_ref, tol, &what);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn packed_batches_and_the_host_fallback_on_cuda_tensors_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    // A packed batch: an empty sequence, one token, a chunk and one, rows past the last offset.
    let cu = vec![0, 0, 1, 66, 100];
    for name in ["mamba2", "gated-deltanet", "attention", "loglinear-mamba2"] {
        let (_, x) = inputs(name, &sizes(1, 107), 3);
        let opts = Options::default().cu_seqlens(&cu);
        let (y_ref, g_ref) = run_op(name, &vars(&x, DType::F64), &opts);
        for (p, dtype, tol) in MODES {
            let what = format!("{name} packed, {p} {dtype:?}");
            let (y, g) = run_op(name, &vars_on(&x, dtype, &dev), &opts.clone().precision(p));
            close(&y, &y_ref, tol, &format!("{what}: y"));
            grads_close(&g, &g_ref, tol, &what);
        }
    }
    // The Toeplitz mixer and the GLR through `run`, forward and backward: whatever the device
    // forms lack runs on the host copies.
    for (name, cfg) in [
        ("toeplitz", serde_json::json!({"heads": 2, "kernel_width": 2})),
        ("glr", serde_json::json!({"pattern": "sq1"})),
    ] {
        let m = mixers::registry::mixer(name, &cfg).unwrap();
        let x = mixers::registry::grad_check::grad_inputs(m.as_ref(), &sizes(2, 37), 4).unwrap();
        let run = |v: &BTreeMap<String, Var>| {
            let named: Vec<(&str, &Tensor)> = v.iter().map(|(k, t)| (k.as_str(), t.as_tensor())).collect();
            let y = mixers_candle::run(name, &cfg, &named, &Options::default()).unwrap();
            let w = tensor(&weights(y.dims()), y.dtype()).to_device(y.device()).unwrap();
            let g = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let grads: BTreeMap<String, ArrayD<f64>> =
                v.iter().map(|(k, t)| (k.clone(), host(g.get(t).unwrap()))).collect();
            (host(&y), grads)
        };
        let (y_ref, g_ref) = run(&vars(&x, DType::F64));
        let (y, g) = run(&vars_on(&x, DType::F64, &dev));
        close(&y, &y_ref, 1e-10, &format!("{name} on CUDA tensors: y"));
        for (k, gk) in &g {
            close(gk, &g_ref[k], 1e-9, &format!("{name} on CUDA tensors: d_{k}"));
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_gated_deltanet_layer_example_learns_on_cuda_tensors() {
    let Some(dev) = gpu() else { return };
    crate::example::assert_learns(&dev);
}
