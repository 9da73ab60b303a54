"""Tuning harness for the tensor-core attention kernels (mixer-cuda/kernels/attention_fused.cu) on
a GPU machine with CuPy and PyTorch, without a Rust build: compiles a kernel file with NVRTC
under given compile-time settings, checks the output against torch SDPA (causal, or a sliding
window through an explicit mask), and times the kernel alone and SDPA with CUDA events on the
same device-resident inputs (B, H, D = 64; q, k, v, y in the [B, T, H, D] layout the library
uses, SDPA on [B, H, T, D] views of the same tensors).

    python3 bench/gpu/attn_tune.py [--T 16384] [--B 1] [--H 16] [--mode bf16|tf32|exact] [--window W]
        FILE.cu[:DEF=V,DEF=V...] ...

Each variant names a kernel file and the -D settings (ATT_BK, ATT_WM, ATT_WARPS); with none,
the shipped file at the shipped settings is timed. --mode exact times attn_mma_tf32x3 (the exact
mode's split-tf32 kernel) on f32 inputs, against SDPA fp32. ATT_WGMMA=1 (bf16, with ATT_WM=1 and ATT_WARPS
4 or 8) times the warpgroup-MMA kernel attn_wgmma_bf16, compiled for sm_90a (its V descriptor settings WG_V_LBO, WG_V_SBO,
WG_V_STEP are fixed in the kernel file: wgmma_probe.py found them).
"""
import argparse
import math
import os
import sys

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

from reference import timed as reference_timed

ap = argparse.ArgumentParser()
ap.add_argument("--T", type=int, default=16384)
ap.add_argument("--B", type=int, default=1)
ap.add_argument("--H", type=int, default=16)
ap.add_argument("--D", type=int, default=64)
ap.add_argument("--mode", default="bf16")
ap.add_argument("--window", type=int, default=0)
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("variants", nargs="*")
a = ap.parse_args()
B, T, H, D = a.B, a.T, a.H, a.D
dt = torch.bfloat16 if a.mode == "bf16" else torch.float32
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, T, H, D, device="cuda", generator=g).to(dt) for _ in range(3))
scale = 1.0 / math.sqrt(D)


def timed(f, reps):
    """Median milliseconds of `f` (reference.py's CUDA-event timer)."""
    return reference_timed(f, reps=reps)[0]


def sdpa():
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    if a.window > 0:
        i = torch.arange(T, device="cuda")
        m = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < a.window)
        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=m, scale=scale)
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)


ref = sdpa().transpose(1, 2).float()
t_ref = timed(sdpa, a.reps)
print(f"SDPA {a.mode} B={B} T={T} H={H} D={D} window={a.window}: {t_ref:.3f} ms")
variants = a.variants or ["mixer-cuda/kernels/attention_fused.cu:ATT_BK=64,ATT_WM=2,ATT_WARPS=4"]
for var in variants:
    path, _, defs = var.partition(":")
    d = dict(kv.split("=") for kv in defs.split(",") if kv)
    bk, wm, warps = int(d.get("ATT_BK", 64)), int(d.get("ATT_WM", 1)), int(d.get("ATT_WARPS", 4))
    bq = 16 * wm * warps
    opts = ("--std=c++17", f"-DATT_D={D}") + tuple(f"-D{kk}={vv}" for kk, vv in d.items())
    wgmma = "ATT_WGMMA" in d  # Hopper's warpgroup MMA: sm_90a, compiled through NVRTC directly
    try:
        src = "\n".join(open(f).read() for f in
                        ("mixer-cuda/kernels/common.cuh", "mixer-cuda/kernels/attention_common.cuh", path))
        if wgmma:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from nvrtc_cubin import load
            mod = load(src, "sm_90a", opts[1:])
        else:
            mod = cp.RawModule(code=src, options=opts)
        name = {"bf16": "attn_mma_bf16", "tf32": "attn_mma_tf32", "exact": "attn_mma_tf32x3"}[a.mode]
        fn = mod.get_function("attn_wgmma_bf16" if wgmma else name)
    except Exception as e:  # a variant that does not compile is reported, not fatal
        print(f"{var}: compile error {str(e)[-400:]}")
        continue
    smem = (bq * D + 4 * bk * D) * 2 + (1024 if wgmma else 0) if a.mode == "bf16" else (2 * bk * (D + 8) + 2 * bk * (D + 4)) * 4
    smem = int(d.get("SMEM", smem))
    fn.max_dynamic_shared_size_bytes = smem
    y = torch.full_like(q, float("nan"))
    args = tuple(np.uint64(x.data_ptr()) for x in (q, k, v, y)) + (
        np.int32(B), np.int32(T), np.int32(H), np.int32(a.window), np.float32(scale * math.log2(math.e)),
        np.uint64(0))  # no row statistics (the backward's)
    if a.mode == "exact":
        args += (np.float64(scale), np.uint64(0))  # σ for rows computed again in double; no flag
    grid, block = ((T + bq - 1) // bq, B * H), (32 * warps,)

    def ours():
        fn(grid, block, args, shared_mem=smem)

    ours()
    torch.cuda.synchronize()
    err = ((y.float() - ref).norm() / ref.norm()).item()
    t = timed(ours, a.reps)
    flops = 4.0 * B * H * D * (T * (T + 1) / 2 if a.window <= 0 else T * min(a.window, T))
    print(f"{var}: {t:.3f} ms ({t / t_ref:.2f}x SDPA, {flops / t / 1e9:.0f} TFLOP/s), rel err {err:.2e}, "
          f"finite {bool(torch.isfinite(y).all())}")
