"""Checks and times mixer-cuda/kernels/attention_fused.cu (tensor-core attention) against torch.

    python3 bench/gpu/attention_mma.py [--check] [--time] [--sanitize] [--variants W:M:BKb:BKt,...] [--seq ...] [--out DIR]

Compiles the kernel file with NVRTC through CuPy (the same compiler the mixers CUDA backend
uses) for several compile-time variants, then
  --check: compares every variant with a float64 reference (T ≤ 2048) or torch's fp32 SDPA
           (larger T) at awkward sizes (T = 1, 63, 64, 65, 1000, 4099; B = 2, H = 3), causal and
           sliding-window; outputs are poisoned with NaN first, so an unwritten element fails;
  --time:  times each variant and torch SDPA (causal; fp32 and bf16) with CUDA events on
           device-resident inputs, B = 1 and 4, H = 16, D = 64, T = 4k/16k/64k; reports ms,
           TFLOP/s (4·B·H·D·T²/2 causal) and the ratio ours / SDPA of the same dtype;
  --sanitize: one small run of each kernel, for compute-sanitizer.
Times include only the kernel (no copies, no compilation: warm-up first).
"""
import argparse
import json
import math
import os
import sys

import cupy
import numpy as np
import torch

from reference import timed as reference_timed

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = open(os.path.join(HERE, "..", "..", "mixer-cuda", "kernels", "attention_fused.cu")).read()
LOG2E = 1.4426950408889634


def module(D, warps, wm, bk_bf16, bk_tf32):
    # one module per kernel: ATT_BK differs between the two
    opts = ("-std=c++17", f"-DATT_D={D}", f"-DATT_WM={wm}", f"-DATT_WARPS={warps}")
    mb = cupy.RawModule(code=SRC, options=opts + (f"-DATT_BK={bk_bf16}",))
    mt = cupy.RawModule(code=SRC, options=opts + (f"-DATT_BK={bk_tf32}",))
    kb = mb.get_function("attn_mma_bf16")
    kt = mt.get_function("attn_mma_tf32")
    bq = 16 * wm * warps
    smem_b = (bq * D + 4 * bk_bf16 * D) * 2
    smem_t = 2 * bk_tf32 * (D + 8) * 4 + 2 * bk_tf32 * (D + 4) * 4
    kb.max_dynamic_shared_size_bytes = smem_b
    kt.max_dynamic_shared_size_bytes = smem_t
    return kb, kt, smem_b, smem_t


class Variant:
    def __init__(self, D=64, warps=4, wm=1, bk_bf16=64, bk_tf32=32):
        self.D, self.warps = D, warps
        self.kb, self.kt, self.smem_b, self.smem_t = module(D, warps, wm, bk_bf16, bk_tf32)
        self.bq = 16 * wm * warps
        self.name = f"w{warps}-wm{wm}-bk{bk_bf16}/{bk_tf32}"

    def run(self, q, k, v, y, window=0, scale=None):
        B, T, H, D = q.shape
        assert D == self.D
        scale = 1.0 / math.sqrt(D) if scale is None else scale
        grid = ((T + self.bq - 1) // self.bq, B * H)
        args = (
            np.uint64(q.data_ptr()), np.uint64(k.data_ptr()), np.uint64(v.data_ptr()), np.uint64(y.data_ptr()),
            np.int32(B), np.int32(T), np.int32(H), np.int32(window), np.float32(scale * LOG2E),
            np.uint64(0),  # no row statistics (the backward's)
        )
        if q.dtype == torch.bfloat16:
            self.kb(grid, (32 * self.warps,), args, shared_mem=self.smem_b)
        else:
            self.kt(grid, (32 * self.warps,), args, shared_mem=self.smem_t)


def reference(q, k, v, window, scale=None):
    """float64 softmax attention in [B,T,H,D] layout (small T) or fp32 SDPA (large T)."""
    B, T, H, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qh, kh, vh = (t.permute(0, 2, 1, 3) for t in (q, k, v))
    if T <= 2048:
        qh, kh, vh = (t.double() for t in (qh, kh, vh))
        s = (qh @ kh.transpose(-1, -2)) * scale
        i = torch.arange(T, device=q.device)
        ok = i[None, :] <= i[:, None]
        if window > 0:
            ok &= (i[:, None] - i[None, :]) < window
        s = s.masked_fill(~ok, float("-inf"))
        return (torch.softmax(s, -1) @ vh).permute(0, 2, 1, 3)
    assert window == 0
    y = torch.nn.functional.scaled_dot_product_attention(qh.float(), kh.float(), vh.float(), is_causal=True)
    return y.permute(0, 2, 1, 3).double()


def rel_rms(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def check(variants):
    rows, ok = [], True
    torch.manual_seed(0)
    for T in (1, 63, 64, 65, 1000, 4099):
        for window in (0, 100, 512):
            if T > 2048 and window:
                continue
            B, H, D = 2, 3, variants[0].D
            q, k, v = (torch.randn(B, T, H, D, device="cuda") for _ in range(3))
            ref = reference(q, k, v, window)
            for var in variants:
                for dt, tol in ((torch.float32, 5e-3), (torch.bfloat16, 2e-2)):
                    qq, kk, vv = (t.to(dt).contiguous() for t in (q, k, v))
                    y = torch.full_like(qq, float("nan"))
                    var.run(qq, kk, vv, y, window)
                    torch.cuda.synchronize()
                    err = rel_rms(y, ref) if torch.isfinite(y).all() else float("inf")
                    good = err <= tol
                    ok &= good
                    rows.append(dict(variant=var.name, dtype=str(dt).split(".")[1], T=T, window=window, rel_rms=err, ok=good))
    bad = [r for r in rows if not r["ok"]]
    worst = {}
    for r in rows:
        key = r["dtype"]
        worst[key] = max(worst.get(key, 0.0), r["rel_rms"])
    print(f"check: {len(rows)} comparisons, {len(bad)} failed; worst rel RMS {worst}")
    for r in bad[:20]:
        print("  FAIL", r)
    return ok, rows


def timed(fn, reps=20):
    """(median, min) milliseconds of `fn`, with CUDA events (reference.py's timing)."""
    median, low, _ = reference_timed(fn, reps=reps)
    return median, low


def timing(variants, sizes, windows=(0,)):
    rows = []
    for (B, T) in sizes:
        H, D = 16, 64
        flops = 4 * B * H * D * T * T / 2
        q32, k32, v32 = (torch.randn(B, T, H, D, device="cuda") for _ in range(3))
        qb, kb, vb = (t.bfloat16() for t in (q32, k32, v32))
        qh32, kh32, vh32 = (t.permute(0, 2, 1, 3).contiguous() for t in (q32, k32, v32))
        qhb, khb, vhb = (t.bfloat16() for t in (qh32, kh32, vh32))
        sdpa = {}
        for name, (a, b_, c) in (("fp32", (qh32, kh32, vh32)), ("bf16", (qhb, khb, vhb))):
            med, mn = timed(lambda: torch.nn.functional.scaled_dot_product_attention(a, b_, c, is_causal=True),
                            reps=10 if T >= 65536 else 20)
            sdpa[name] = med
            rows.append(dict(impl=f"torch SDPA {name}", B=B, T=T, window=0, ms=med, min_ms=mn, tflops=flops / med / 1e9))
        for var in variants:
            for window in windows:
                for name, (a, b_, c) in (("tf32", (q32, k32, v32)), ("bf16", (qb, kb, vb))):
                    y = torch.empty_like(a)
                    med, mn = timed(lambda: var.run(a, b_, c, y, window), reps=10 if T >= 65536 else 20)
                    ref = sdpa["fp32" if name == "tf32" else "bf16"]
                    fl = flops if window == 0 else 4 * B * H * D * T * min(window, T)
                    rows.append(dict(impl=f"ours {name} {var.name}", B=B, T=T, window=window, ms=med, min_ms=mn,
                                     tflops=fl / med / 1e9, ratio_vs_sdpa=med / ref if window == 0 else None))
        del q32, k32, v32, qb, kb, vb, qh32, kh32, vh32, qhb, khb, vhb
        torch.cuda.empty_cache()
    return rows


def table(rows):
    out = ["| impl | B | T | window | median ms | min ms | TFLOP/s | ours/SDPA same dtype |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r.get("ratio_vs_sdpa")
        out.append(f"| {r['impl']} | {r['B']} | {r['T']} | {r['window'] or '-'} | {r['ms']:.3f} | {r['min_ms']:.3f} | "
                   f"{r['tflops']:.1f} | {'' if ratio is None else f'{ratio:.2f}×'} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--variants", default="4:2:64:64,8:1:64:64,4:2:128:64,8:2:64:64", help="warps:wm:bk_bf16:bk_tf32,...")
    ap.add_argument("--seq", default="4096,16384,65536")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    variants = []
    for spec in a.variants.split(","):
        warps, wm, bkb, bkt = (int(x) for x in spec.split(":"))
        variants.append(Variant(64, warps, wm, bkb, bkt))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "cupy", cupy.__version__)
    result = {"device": torch.cuda.get_device_name()}
    status = 0
    if a.sanitize:
        q, k, v = (torch.randn(1, 130, 2, 64, device="cuda") for _ in range(3))
        for var in variants[:1]:
            for dt in (torch.float32, torch.bfloat16):
                y = torch.empty_like(q.to(dt))
                var.run(q.to(dt), k.to(dt), v.to(dt), y, 0)
                var.run(q.to(dt), k.to(dt), v.to(dt), y, 50)
        torch.cuda.synchronize()
        print("sanitize run done")
    if a.check:
        ok, rows = check(variants)
        result["check"] = rows
        status |= 0 if ok else 1
    if a.time:
        seqs = [int(s) for s in a.seq.split(",")]
        sizes = [(1, T) for T in seqs] + [(4, 16384)]
        rows = timing(variants, sizes)
        rows += timing(variants[:1], [(1, T) for T in seqs], windows=(512,))
        result["time"] = rows
        md = table(rows)
        print(md)
        with open(os.path.join(a.out, "attention_mma.md"), "w") as f:
            f.write(md + "\n")
    with open(os.path.join(a.out, "attention_mma.json"), "w") as f:
        json.dump(result, f, indent=1)
    sys.exit(status)


if __name__ == "__main__":
    main()
