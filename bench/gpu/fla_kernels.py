"""Per-kernel GPU times of flash-linear-attention's chunk_gated_delta_rule and chunk_simple_gla, fp32 and
bf16, at B = 1, T = 16384, H = 16, D = 64 or the shape given (torch.profiler over five calls after a warm-up that
includes Triton's autotuning), to set next to ours kernel by kernel (bench/gpu/ncu_kernels.py).
fla is imported from ./.fla (its fla/ folder, fetched for side-by-side runs and never committed).

    python3 bench/gpu/fla_kernels.py [B,T,H,D] [NAME-FILTER]    # e.g. 8,4096,16,128 "simple_gla bf16"
"""
import os, sys, torch
sys.path.insert(0, os.path.join(os.getcwd(), ".fla"))
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
from fla.ops.simple_gla import chunk_simple_gla
from torch.profiler import profile, ProfilerActivity
B, T, H, D = map(int, sys.argv[1].split(",")) if len(sys.argv) > 1 else (1, 16384, 16, 64)
only = sys.argv[2] if len(sys.argv) > 2 else ""
F = torch.nn.functional
def gdn(dt):
    q, k = (F.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).to(dt) for _ in range(2))
    v = torch.randn(B, T, H, D, device="cuda", dtype=dt)
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda")); beta = torch.sigmoid(torch.randn(B, T, H, device="cuda"))
    return lambda: chunk_gated_delta_rule(q, k, v, g, beta)
def sgla(dt):
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=dt) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda"))
    return lambda: chunk_simple_gla(q, k, v, g=g)
for name, fn in (("gdn fp32", gdn(torch.float32)), ("gdn bf16", gdn(torch.bfloat16)), ("simple_gla fp32", sgla(torch.float32)), ("simple_gla bf16", sgla(torch.bfloat16))):
    if only not in name: continue
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5): fn()
        torch.cuda.synchronize()
    print(f"=== {name} (5 calls; per-call us)")
    dt_ = lambda e: getattr(e, 'device_time_total', None) or getattr(e, 'cuda_time_total', 0)
    ev = [e for e in p.key_averages() if dt_(e) > 0 and not e.key.startswith(('cuda', 'aten'))]
    tot = 0
    for e in sorted(ev, key=lambda e: -dt_(e)):
        us = dt_(e) / 5; tot += us
        print(f"  {us:8.1f}  n={e.count // 5:2d}  {e.key[:90]}")
    print(f"  total {tot:.1f} us")
