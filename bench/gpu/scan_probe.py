"""Where llc_scan's time goes with the cut points of a packed batch (Mamba-2, tf32, T = 16384,
H = 16, D = 64): one sequence, equal lengths in whole groups of 32 chunks, equal lengths leaving a
short group per sequence, random cuts; the chunk kernels' device time per call (torch.profiler).

    PYTHONPATH=<wheel dir> python3 bench/gpu/scan_probe.py      # from the repository root
"""
import sys
import torch
sys.path.insert(0, "bench/gpu")
import mixers
from packed_cost import packed_inputs, random_offsets

T, H, D = 16384, 16, 64
x = packed_inputs("mamba2", "tf32", T, H, D)
gen = torch.Generator().manual_seed(3)
cases = {
    "one": None,
    "4x4096 (2 full groups each)": [0, 4096, 8192, 12288, 16384],
    "4x4032 (63 chunks: 1 full + short 31)": [0, 4032, 8064, 12096, 16128],
    "2x8192": [0, 8192, 16384],
    "16x1024 (16 chunks: short only)": list(range(0, 16385, 1024)),
    "random 4": random_offsets(T, 4, gen).tolist(),
}
for name, cu in cases.items():
    kw = {} if cu is None else {"cu_seqlens": torch.tensor(cu)}
    for _ in range(3):
        mixers.run("mamba2", precision="tf32", **kw, **x)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            mixers.run("mamba2", precision="tf32", **kw, **x)
        torch.cuda.synchronize()
    ks = [(e.key[:24], e.count, round(e.device_time_total / e.count, 1)) for e in p.key_averages() if e.device_time_total > 0 and "llc" in e.key]
    print(f"{name}: {ks}", flush=True)
