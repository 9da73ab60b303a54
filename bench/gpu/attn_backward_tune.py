"""Tuning harness for the tensor-core attention backward (mixer-cuda/kernels/attention_backward_fused.cu)
on a GPU machine with CuPy and PyTorch, without a Rust build: compiles the kernel file with NVRTC
under given compile-time settings (ATC_WARPS, ATC_BN) and times atc_dkdv and atc_dq alone (CUDA
events, median of 5, causal, device-resident inputs in the [B, T, H, D] layout) beside torch SDPA's
backward alone (forward + backward less forward, the same dtype: bf16, or fp32 with TF32 off for
the tf32 and exact modes; the exact mode's kernels are the tf32x3 ones). The row statistics are
zeros: the kernels' work does not depend on values (no data-dependent branches); correctness is
checked by bench/gpu/attention_backward_harness.cpp and the GPU tests
(mixer-cuda/tests/all/backward.rs), not here.

    python3 bench/gpu/attn_backward_tune.py [--shape B,T,H,D (1,16384,16,64)] [--mode bf16|tf32|exact] \
        [ATC_WARPS=4,ATC_BN=64 ...]

With no variant, the default tiles of attention::backward_fused (8 warps; 64 columns up to D = 64,
32 above) are timed for both kernels; the plan's own choice per kernel and mode
(attention::backward_fused::tiles) may differ.
"""
import argparse
import math

import cupy as cp
import numpy as np
import torch

# SDPA's timing and the median of CUDA-event runs, as the side-by-side script measures them.
from attention_backward_torch import median_ms, sdpa

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="1,16384,16,64", help="B,T,H,D")
ap.add_argument("--mode", default="bf16", choices=["bf16", "tf32", "exact"])
ap.add_argument("variants", nargs="*")
a = ap.parse_args()
B, T, H, D = map(int, a.shape.split(","))
torch.backends.cuda.matmul.allow_tf32 = False
dt = torch.bfloat16 if a.mode == "bf16" else torch.float32
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, dy = (torch.randn(B, T, H, D, device="cuda", generator=g).to(dt) for _ in range(4))
stats = torch.zeros(B * H * T * 4, device="cuda")
scale = 1.0 / math.sqrt(D)


f_ref, fb_ref = sdpa(B, T, H, D, dt)
t_bwd = fb_ref - f_ref
print(f"SDPA {a.mode} backward alone B={B} T={T} H={H} D={D}: {t_bwd:.3f} ms", flush=True)
src = open("mixer-cuda/kernels/common.cuh").read() + "\n" + open("mixer-cuda/kernels/attention_backward_fused.cu").read()
default = f"ATC_WARPS=8,ATC_BN={64 if D <= 64 else 32}"
suffix = {"bf16": "bf16", "tf32": "tf32", "exact": "tf32x3"}[a.mode]
for var in a.variants or [default]:
    d = dict(kv.split("=") for kv in var.split(",") if kv)
    warps, bn = int(d.get("ATC_WARPS", 8)), int(d.get("ATC_BN", 64))
    bm = 16 * warps
    opts = ("--std=c++17", f"-DATC_D={D}") + tuple(f"-D{kk}={vv}" for kk, vv in d.items())
    try:
        mod = cp.RawModule(code=src, options=opts)
        fk, fq = mod.get_function(f"atc_dkdv_{suffix}"), mod.get_function(f"atc_dq_{suffix}")
    except Exception as e:  # a variant that does not compile is reported, not fatal
        print(f"{var}: compile error {str(e)[-400:]}")
        continue
    row = 2 * D if a.mode == "bf16" else 4 * (D + 8)
    smem_q = (2 * bm + 4 * bn) * row
    smem_k = smem_q + 2 * bn * 16
    if max(smem_k, smem_q) > 227 * 1024:
        print(f"{var}: {smem_k} bytes of shared memory, too many")
        continue
    fk.max_dynamic_shared_size_bytes = smem_k
    fq.max_dynamic_shared_size_bytes = smem_q
    gk, gv, gq = (torch.empty(B, T, H, D, device="cuda") for _ in range(3))
    ptr = lambda x: np.uint64(x.data_ptr())  # noqa: E731
    # T, H, window, σ·log₂e, σ, skip (null: no overflow flag)
    tail = (np.int32(T), np.int32(H), np.int32(0), np.float32(scale * math.log2(math.e)), np.float32(scale),
            np.uint64(0))
    grid = ((T + bm - 1) // bm, B * H)
    common = (ptr(q), ptr(k), ptr(v), ptr(dy), ptr(stats))
    dkdv = lambda: fk(grid, (32 * warps,), common + (ptr(gk), ptr(gv)) + tail, shared_mem=smem_k)  # noqa: E731
    dq = lambda: fq(grid, (32 * warps,), common + (ptr(gq),) + tail, shared_mem=smem_q)  # noqa: E731
    t_k, t_q = median_ms(dkdv), median_ms(dq)
    flops = B * H * T * (T + 1) / 2 * D * 2 * (4 + 3)  # dkdv: four products, dq: three
    print(
        f"{var}: dkdv {t_k:.3f} ms, dq {t_q:.3f} ms, together {t_k + t_q:.3f} ms "
        f"({(t_k + t_q) / t_bwd:.2f}x SDPA's backward, {flops / (t_k + t_q) / 1e9:.0f} TFLOP/s)",
        flush=True,
    )
