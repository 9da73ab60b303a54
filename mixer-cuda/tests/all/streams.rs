//! Two threads, each on a stream of its own, running the same calls at the same time get the
//! bits one thread gets alone. What the backend keeps between calls per stream (the pool's free
//! lists, cuFFT plans, Toeplitz spectra) is keyed by the stream's handle and, for
//! `CU_STREAM_PER_THREAD`, the thread: candle's CUDA devices run on that one handle, which names a
//! different stream on every thread, and free lists keyed by the handle alone handed one thread's
//! buffers to the other while its kernels still used them (gradients of state runs and packed
//! batches came out wrong with two test threads; this test failed that way on the H200).

use std::sync::{Arc, Barrier};

use cudarc::driver::CudaStream;
use mixer_core::mixer::{Mixer, complete_dims};
use mixer_core::tensor::cast_tensors;
use mixer_core::{Form, Precision, Requires, Tensors};
use mixer_cuda::device_call::{self, Call};
use mixer_cuda::device_state::Cotangents;
use mixer_cuda::forms::{download_as, upload_inputs, upload_one};
use mixer_cuda::{DeviceTensors, on_stream};
use mixer_registry::{Sizes, mixer};
use ndarray::ArrayD;

use crate::common::gpu;

/// Offsets of a packed batch of four sequences (none a multiple of the chunk) in `T` rows.
const CU: [usize; 5] = [0, 37, 130, 131, 260];
const T: usize = 260;
/// Rounds each thread runs.
const ROUNDS: usize = 12;

/// Every result of one round of `m` (forward and backward of a plain call, of a call from and to
/// a state where `stateful`, of a packed batch where `packed`), downloaded on the calling
/// thread's stream, in a fixed order.
fn round(m: &dyn Mixer, x: &DeviceTensors, stateful: bool, packed: bool) -> Vec<(String, ArrayD<f32>)> {
    let mut out = Vec::new();
    let mut keep = |what: &str, t: &DeviceTensors| {
        let mut keys: Vec<_> = t.keys().cloned().collect();
        keys.sort();
        for k in keys {
            out.push((format!("{what} {k}"), download_as::<f32>(&t[&k]).unwrap()));
        }
    };
    let all = Requires::All;
    let plain = Call {
        form: Form::Fast,
        precision: Precision::Exact,
        initial: None,
        cu_seqlens: None,
        checks: false,
    };
    let (y, fin) = device_call::forward(m, x, &plain, stateful).unwrap();
    let dy_host = download_as::<f32>(&y).unwrap().mapv(|v| (1.3 * v + 0.1).sin());
    let dy = upload_one(&dy_host, false).unwrap();
    let c = Cotangents { dy: &dy, d_final: None, requires: &all };
    let (g, _) = device_call::backward(m, x, &plain, c).unwrap();
    keep("plain y", &[("y".to_string(), y)].into_iter().collect());
    keep("plain d", &g);
    if let Some(fin) = fin {
        // From the final state of the plain call, to a final state with a cotangent.
        let call = Call { initial: Some(&fin), ..plain };
        let (y, fin2) = device_call::forward(m, x, &call, true).unwrap();
        let fin2 = fin2.unwrap();
        let c = Cotangents { dy: &dy, d_final: Some(&fin2), requires: &all };
        let (g, ds) = device_call::backward(m, x, &call, c).unwrap();
        keep("state y", &[("y".to_string(), y)].into_iter().collect());
        keep("state final", &fin2);
        keep("state d", &g);
        keep("state d_initial", &ds);
    }
    if packed {
        let call = Call { cu_seqlens: Some(&CU), ..plain };
        let (y, _) = device_call::forward(m, x, &call, false).unwrap();
        let c = Cotangents { dy: &dy, d_final: None, requires: &all };
        let (g, _) = device_call::backward(m, x, &call, c).unwrap();
        keep("packed y", &[("y".to_string(), y)].into_iter().collect());
        keep("packed d", &g);
    }
    out
}

/// Runs [`round`] `ROUNDS` times on each of two threads at once, each on the stream `stream`
/// gives it, and compares every round's results with `want`, bit for bit.
fn two_threads(
    name: &str,
    m: &Arc<dyn Mixer>,
    x: &Arc<DeviceTensors>,
    flags: (bool, bool),
    want: &Arc<Vec<(String, ArrayD<f32>)>>,
    stream: fn() -> Arc<CudaStream>,
    label: &str,
) {
    let start = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let (m, x, want, start) = (m.clone(), x.clone(), want.clone(), start.clone());
            let (name, label) = (name.to_string(), label.to_string());
            std::thread::spawn(move || {
                let s = stream();
                start.wait();
                on_stream(s, || {
                    for r in 0..ROUNDS {
                        let got = round(m.as_ref(), &x, flags.0, flags.1);
                        assert_eq!(got.len(), want.len(), "{name} ({label}), thread {i}, round {r}");
                        for ((k, a), (_, b)) in got.iter().zip(want.iter()) {
                            assert_eq!(a, b, "{name} ({label}), thread {i}, round {r}: {k}");
                        }
                    }
                })
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a thread failed");
    }
}

/// The calling thread's per-thread default stream (candle's `Device::new_cuda`).
fn per_thread() -> Arc<CudaStream> {
    // SAFETY: CU_STREAM_PER_THREAD names a stream that lives as long as the thread.
    unsafe { mixer_cuda::borrowed_stream(0x2) }.unwrap()
}

/// A new stream of the backend's context (PyTorch's side streams).
fn fresh() -> Arc<CudaStream> {
    mixer_cuda::runtime::gpu().unwrap().ctx.new_stream().unwrap()
}

#[test]
#[ignore = "needs a CUDA device"]
fn two_threads_on_their_own_streams_get_the_bits_of_one() {
    let Some(_g) = gpu() else {
        return;
    };
    let cases: [(&str, bool, bool); 6] = [
        ("linear-attention", true, true),
        ("mamba2", true, true),
        ("gated-deltanet", true, true),
        ("toeplitz", false, false),
        ("glr", false, false),
        ("attention", false, false),
    ];
    for (name, stateful, packed) in cases {
        let m: Arc<dyn Mixer> = Arc::from(mixer(name, &serde_json::json!({})).unwrap());
        let sizes = Sizes { batch: 1, seq: T, channels: 6, heads: 2, dk: 40, dv: 24 };
        let dims = complete_dims(m.as_ref(), &sizes.dims());
        let x: Tensors<f32> = cast_tensors::<f32>(&m.random_inputs(&dims, 11).unwrap());
        let x = Arc::new(upload_inputs(&x, Precision::Exact).unwrap());
        let want = Arc::new(round(m.as_ref(), &x, stateful, packed));
        assert!(!want.is_empty());
        two_threads(name, &m, &x, (stateful, packed), &want, per_thread, "per-thread default streams");
        two_threads(name, &m, &x, (stateful, packed), &want, fresh, "streams of their own");
    }
}
