//! The CUDA runtime: NVRTC compilation of every kernel source, host↔device copies, cuFFT
//! round trips, and NVRTC errors as `Error::Backend`. GPU tests skip (printing why) when no
//! device is present, and fail instead under `MIXERS_REQUIRE_CUDA=1`.

use mixer_core::Error;
use mixer_core::Precision;
use mixer_cuda::DeviceTensor;
use mixer_cuda::attention::fast::{Kernel, Storage, plan};
use mixer_cuda::kernels::with_prelude;
use mixer_cuda::runtime::{
    compile_cubin_only, compile_only, compile_only_with, compile_ptx_only, gpu, nvrtc_available,
};
use ndarray::{ArrayD, IxDyn};

#[test]
#[ignore = "needs NVRTC (the CUDA toolkit)"]
fn nvrtc_compiles_different_sources_on_several_threads_at_once() {
    // The module cache compiles different sources on different threads concurrently
    // (`mixer_cuda::once_map`): each PTX must equal that of the same source compiled alone.
    if !nvrtc_here() {
        return;
    }
    let sources: Vec<_> = mixer_cuda::kernels::ALL.iter().take(4).map(|k| (k.name, k.full())).collect();
    let alone: Vec<String> = sources
        .iter()
        .map(|(n, s)| compile_ptx_only(n, s, "sm_90", &[]).unwrap_or_else(|e| panic!("{e}")).to_src())
        .collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = sources
            .iter()
            .map(|(n, s)| scope.spawn(move || compile_ptx_only(n, s, "sm_90", &[]).map(|p| p.to_src())))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("{e}"))).collect()
    });
    for (((n, _), a), b) in sources.iter().zip(&alone).zip(&together) {
        assert!(a == b, "{n}: the PTX compiled beside other sources differs from the one compiled alone");
    }
}

#[test]
#[ignore = "needs NVRTC (the CUDA toolkit)"]
fn every_kernel_compiles_with_nvrtc_for_sm90() {
    if !nvrtc_here() {
        return;
    }
    // Each job: (kernel, source, architecture, options); compiled on every core at the end (one
    // NVRTC run per job takes seconds, and the list is long).
    let mut jobs: Vec<(&str, String, &str, Vec<String>)> = Vec::new();
    for k in mixer_cuda::kernels::ALL {
        jobs.push((k.name, k.full(), "sm_90", Vec::new()));
    }
    // The Hopper-only part of the attention source: the wgmma kernel, as the host compiles it.
    let src = mixer_cuda::kernels::ATTENTION_FUSED.full();
    for (d, warps, bk) in [(64, 8, 64), (128, 12, 128), (256, 8, 64)] {
        let extra: Vec<String> = vec![
            "-DATT_WGMMA=1".into(),
            "-DATT_WM=1".into(),
            format!("-DATT_WARPS={warps}"),
            format!("-DATT_BK={bk}"),
            format!("-DATT_D={d}"),
        ];
        jobs.push(("attention_fused", src.clone(), "sm_90a", extra));
    }
    // Gated DeltaNet's chunked backward with the head dims fixed as the host compiles it.
    let bwd = mixer_cuda::kernels::LOGLINEAR_BACKWARD_CHUNKED.full();
    for (dk, dv) in [(5, 16), (70, 70), (64, 64), (128, 128), (256, 256), (16, 5)] {
        let extra = vec![format!("-DLLC_DK={dk}"), format!("-DLLC_DV={dv}")];
        jobs.push(("loglinear_backward_chunked", bwd.clone(), "sm_90", extra));
    }
    // The exact attention kernel and the mma.sync kernels at the launch plans of other head dims
    // (attention::fast::plan: Dk ≠ Dv, odd, 256 in f64; tensor cores at 32, 96, 128).
    let a = mixer_core::mixers::attention::Attention::new("attention", Default::default()).unwrap();
    for (shape, p, storage) in [
        ([1, 100, 1, 70, 70], Precision::Exact, Storage::F32),
        ([1, 100, 1, 40, 200], Precision::Exact, Storage::F32),
        ([1, 100, 1, 256, 256], Precision::Exact, Storage::F64),
        ([1, 100, 1, 32, 32], Precision::Bf16, Storage::Bf16),
        ([1, 100, 1, 96, 96], Precision::Bf16, Storage::Bf16),
        ([1, 100, 1, 128, 128], Precision::Tf32, Storage::F32),
    ] {
        let pl = plan(&a, shape, p, storage, 219 << 10, true).unwrap().unwrap();
        let k = if pl.kernel == Kernel::Exact {
            mixer_cuda::kernels::ATTENTION
        } else {
            mixer_cuda::kernels::ATTENTION_FUSED
        };
        jobs.push((k.name, k.full(), "sm_90", pl.options));
    }
    // The tensor-core backward at every head dim and mode its plan takes (one source; each set
    // of tiles its own options).
    let bwd = mixer_cuda::kernels::ATTENTION_BACKWARD_FUSED.full();
    let mut seen = std::collections::HashSet::new();
    for d in [32, 64, 96, 128] {
        for (p, storage) in [
            (Precision::Bf16, Storage::Bf16),
            (Precision::Tf32, Storage::F32),
            (Precision::Exact, Storage::F32),
        ] {
            let pl = mixer_cuda::attention::backward_fused::plan(
                &a,
                [1, 100, 1, d, d],
                p,
                storage,
                219 << 10,
                true,
            )
            .unwrap()
            .unwrap();
            for options in [pl.dkdv.options, pl.dq.options] {
                if seen.insert(options.clone()) {
                    jobs.push(("attention_backward_fused", bwd.clone(), "sm_90", options));
                }
            }
        }
    }
    // Gated DeltaNet's state passes as the host compiles them: head dims fixed, warps per block
    // and buffers of the register-state passes (tf32 and bf16), k's bits taken as they are in the
    // bf16 mode, the shared-memory pass with the lift's levels `lg` at a time; and the WY/UT step
    // with and without the bf16 mode's kernels.
    let pass = mixer_cuda::kernels::LOGLINEAR_STATE_PASS.full();
    let wy = mixer_cuda::kernels::LOGLINEAR_WY.full();
    for (dk, warps, stages, bf16, lg) in [
        (5, 1, 3, false, 1),
        (70, 2, 2, true, 8),
        (64, 4, 3, false, 8),
        (128, 1, 2, true, 4),
        (40, 2, 3, false, 4),
        (8, 4, 2, false, 16),
        (64, 3, 3, false, 1),
    ] {
        let dims = [format!("-DLLC_DK={dk}"), format!("-DLLC_DV={dk}")];
        let mut extra = dims.to_vec();
        extra.extend([format!("-DDHR_WARPS={warps}"), format!("-DDHR_ST={stages}"), format!("-DDH_LG={lg}")]);
        if bf16 {
            extra.push("-DDH_K_TF32=1".into());
        }
        // The bf16 mode's kernels (llc_wy_tc_bf16, llc_delta_h_rb_bf16) at Dk ≤ 128, with the warps
        // the host gives the bf16 pass (1, 2 or 4).
        let mut wy_opts = dims.to_vec();
        if dk <= 128 && warps != 3 {
            extra.push("-DDH_BF16=1".into());
            wy_opts.push("-DDH_BF16=1".into());
        }
        jobs.push(("loglinear_state_pass", pass.clone(), "sm_90", extra));
        jobs.push(("loglinear_wy", wy.clone(), "sm_90", wy_opts));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len());
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut bad = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((name, src, arch, opts)) = jobs.get(i) else {
                            return bad;
                        };
                        match compile_only_with(name, src, arch, opts) {
                            Ok(n) if n > 100 => {}
                            Ok(n) => bad.push(format!("{name} {arch} {opts:?}: PTX of {n} bytes")),
                            Err(e) => bad.push(format!("{name} {arch} {opts:?}: {e}")),
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} compilations failed:\n{}",
        failures.len(),
        jobs.len(),
        failures.join("\n")
    );
}

/// `true` when NVRTC is here; otherwise prints why the test skips (and fails it under
/// `MIXERS_REQUIRE_CUDA=1` or `MIXERS_REQUIRE_NVRTC=1`, as CI sets).
fn nvrtc_here() -> bool {
    if nvrtc_available() {
        return true;
    }
    for var in ["MIXERS_REQUIRE_CUDA", "MIXERS_REQUIRE_NVRTC"] {
        assert!(!std::env::var(var).is_ok_and(|v| v == "1"), "{var}=1 but NVRTC is not available");
    }
    eprintln!("skipped: NVRTC (libnvrtc.so) not found");
    false
}

const ELF_MAGIC: &[u8] = b"\x7fELF";

#[test]
#[ignore = "needs NVRTC (the CUDA toolkit)"]
fn nvrtc_gives_a_cubin_for_every_kernel() {
    // What the runtime loads by default: an ELF image per source for sm_90, and for the sm_90a
    // wgmma attention kernel; a virtual architecture has none (the runtime then loads PTX).
    if !nvrtc_here() {
        return;
    }
    for k in mixer_cuda::kernels::ALL {
        let c = compile_cubin_only(k.name, &k.full(), "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            c.starts_with(ELF_MAGIC) && c.len() > 1000,
            "{}: {} bytes, not an ELF image",
            k.name,
            c.len()
        );
    }
    let wgmma = ["-DATT_WGMMA=1", "-DATT_WM=1", "-DATT_WARPS=8"].map(String::from);
    let c =
        compile_cubin_only("attention_fused", &mixer_cuda::kernels::ATTENTION_FUSED.full(), "sm_90a", &wgmma)
            .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.starts_with(ELF_MAGIC), "attention_fused sm_90a: not an ELF image");
    assert!(compile_cubin_only("glr", &mixer_cuda::kernels::GLR.full(), "compute_90", &[]).is_err());
}

#[test]
#[ignore = "needs a CUDA device"]
fn cubin_and_ptx_modules_compute_the_same_bits() {
    let Some(_turn) = crate::common::gpu() else {
        return;
    };
    let g = gpu().unwrap();
    let src = "extern \"C\" __global__ void mix(const float* x, float* y, int n) {\n\
               int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
               if (i < n) y[i] = __expf(x[i]) * 0.75f + sinf(3.0f * x[i]) / (1.0f + x[i] * x[i]);\n}";
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 / 25.0 - 2.0).collect();
    let dx = g.stream().clone_htod(&x).unwrap();
    let run = |m: std::sync::Arc<cudarc::driver::CudaModule>| {
        use cudarc::driver::PushKernelArg;
        let f = m.load_function("mix").unwrap();
        let mut dy = g.stream().alloc_zeros::<f32>(n).unwrap();
        let ni = n as i32;
        let stream = g.stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&dx).arg(&mut dy).arg(&ni);
        // SAFETY: the arguments match `mix`'s signature; both buffers hold n floats.
        unsafe { b.launch(mixer_cuda::runtime::grid1(n, 128)) }.unwrap();
        let mut y = vec![0f32; n];
        g.stream().memcpy_dtoh(&dy, &mut y[..]).unwrap();
        g.sync("cubin").unwrap();
        y
    };
    let cubin = compile_cubin_only("cubin", src, &g.arch(), &[]).unwrap();
    let from_cubin = run(g.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)).unwrap());
    // The PTX path explicitly (the runtime's default is the CUBIN).
    let ptx = compile_ptx_only("cubin", src, &g.arch(), &[]).unwrap();
    let from_ptx = run(g.ctx.load_module(ptx).unwrap());
    // And the runtime's own module: whichever it loads, the same bits.
    let from_runtime = run(g.module("cubin", src, &[]).unwrap());
    assert!(from_runtime.iter().zip(&from_ptx).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(from_cubin.iter().zip(&from_ptx).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(from_cubin.iter().all(|v| v.is_finite()) && from_cubin.iter().any(|&v| v != 0.0));
    // The largest sources load from their CUBIN too (head dims fixed as the host compiles them).
    let dims = ["-DLLC_DK=64", "-DLLC_DV=64", "-DDH_BF16=1", "-DDHR_WARPS=2", "-DDHR_ST=3"].map(String::from);
    for (src, functions) in [
        (&mixer_cuda::kernels::LOGLINEAR_WY, &["llc_wy_tc_f32", "llc_wy_tc_bf16"][..]),
        (
            &mixer_cuda::kernels::LOGLINEAR_STATE_PASS,
            &["llc_delta_h_rb_bf16", "llc_delta_h_tc_f32", "llc_lift_h_tc_f32"],
        ),
    ] {
        let cubin = compile_cubin_only(src.name, &src.full(), &g.arch(), &dims).unwrap();
        let m = g.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)).unwrap();
        for f in functions {
            assert!(m.load_function(f).is_ok(), "{f} not in the CUBIN module");
        }
    }
}

#[test]
#[ignore = "needs NVRTC (the CUDA toolkit)"]
fn nvrtc_errors_carry_the_log() {
    if !nvrtc_here() {
        return;
    }
    let e = compile_only("broken", "extern \"C\" __global__ void k() { undefined_thing(); }", "sm_90")
        .unwrap_err();
    match e {
        Error::Backend { backend, family, message } => {
            assert_eq!(backend, "cuda");
            assert_eq!(family.as_deref(), Some("broken"));
            assert!(message.contains("undefined_thing"), "{message}");
        }
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn upload_download_round_trip() {
    let Some(_turn) = crate::common::gpu() else {
        return;
    };
    let a = ArrayD::from_shape_fn(IxDyn(&[3, 5, 7]), |i| (i[0] * 35 + i[1] * 7 + i[2]) as f64 * 0.5 - 3.0);
    let d = DeviceTensor::upload(&a).unwrap();
    assert_eq!(d.to_host().unwrap(), a);
    // a zero-copy view of batch entries 1..3
    assert_eq!(d.batch(1..3).unwrap().to_host().unwrap(), a.slice(ndarray::s![1..3, .., ..]).into_dyn());
    assert!(d.batch(2..4).is_err());
    // a transposed (non-standard) layout is made contiguous first
    let t = a.t().to_owned().into_dyn();
    let d = DeviceTensor::upload(&a.t().into_dyn().to_owned()).unwrap();
    assert_eq!(d.to_host().unwrap(), t);
}

fn fft_round_trip<F: mixer_cuda::fft::FftReal>(tol: f64) {
    let g = gpu().unwrap();
    let (n, batch) = (45usize, 3usize);
    let x: Vec<F> = (0..n * batch).map(|i| F::of(((i * 7919) % 101) as f64 / 50.0 - 1.0)).collect();
    let dx = mixer_cuda::pool::upload("fft", &x).unwrap();
    let spec = mixer_cuda::fft::rfft::<F>("fft", &dx, n, batch).unwrap();
    let back = mixer_cuda::fft::irfft::<F>("fft", spec, n, batch).unwrap();
    let mut host = vec![F::zero(); n * batch];
    g.stream().memcpy_dtoh(&back.slice(0..n * batch), &mut host[..]).unwrap();
    g.sync("fft").unwrap();
    for (a, b) in x.iter().zip(host.iter()) {
        assert!((a.f64() - b.f64() / n as f64).abs() < tol, "{a} vs {}", b.f64() / n as f64);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn cufft_round_trips() {
    let Some(_turn) = crate::common::gpu() else {
        return;
    };
    fft_round_trip::<f32>(1e-5);
    fft_round_trip::<f64>(1e-12);
}

#[test]
#[ignore = "needs a CUDA device"]
fn module_compile_errors_are_backend_errors_on_device() {
    let Some(_turn) = crate::common::gpu() else {
        return;
    };
    let e = gpu().unwrap().module("broken", "extern \"C\" __global__ void k() { nope(); }", &[]).unwrap_err();
    assert!(matches!(e, Error::Backend { ref family, .. } if family.as_deref() == Some("broken")), "{e}");
}

#[test]
#[ignore = "needs NVRTC (the CUDA toolkit)"]
fn loglinear_kernel_compiles_with_every_registered_mask_and_lambda_scheme() {
    if !nvrtc_here() {
        return;
    }
    let body = mixer_cuda::kernels::LOGLINEAR_PARALLEL.body;
    let mut n = 0;
    for mask in mixer_registry::MASKS.iter() {
        for lam in mixer_registry::LAMBDAS.iter() {
            let (Some(ms), Some(ls)) = (mask.cuda, lam.cuda) else { continue };
            let src = with_prelude(&format!("{ms}\n{ls}"), body);
            compile_only("loglinear_parallel", &src, "sm_90")
                .unwrap_or_else(|e| panic!("mask `{}` × λ `{}`: {e}", mask.name, lam.name));
            n += 1;
        }
    }
    assert!(n >= 4, "expected the builtin and plugin masks × schemes, compiled {n}");
}

/// The generic log-linear source with each λ scheme's device functions spliced in, as the host
/// compiles it: the map, and the map's backward where the scheme registered a device derivative
/// (the builtins and the plugin's `sigmoid2`) — its three kernels are then in the PTX.
#[test]
#[ignore = "needs NVRTC (the CUDA toolkit)"]
fn lambda_schemes_compile_with_their_device_derivatives() {
    if !nvrtc_here() {
        return;
    }
    for scheme in ["identity", "ones", "softplus", "sigmoid2"] {
        let m = mixer_registry::mixer("loglinear-mamba2", &serde_json::json!({ "lambda_scheme": scheme }))
            .unwrap();
        let ll = mixer_core::mixer::downcast::<mixer_core::mixers::loglinear::LogLinear>(m.as_ref(), "cuda")
            .unwrap();
        let src = mixer_cuda::loglinear::parallel::kernel_source(ll).unwrap();
        let ptx = compile_ptx_only("loglinear_parallel", &src, "sm_90", &[])
            .unwrap_or_else(|e| panic!("{e}"))
            .to_src();
        for k in
            ["ll_map_lambda_f32", "ll_lambda_vjp_f64", "ll_lambda_vjp_param_f32", "ll_lambda_param_sum_f64"]
        {
            assert!(ptx.contains(&format!(".entry {k}")), "{scheme}: no {k} in the PTX");
        }
    }
}
