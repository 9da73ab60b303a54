"""Where a packed batch's time goes on CUDA: Mamba-2 (H = 16, D = 64, T = 16384, float32 gates) in
the tf32 and bf16 modes through the PyTorch op, one sequence of T against N sequences of random
lengths filling T (a fixed seed): the host time of a call (20 calls enqueued back to back), the
time until the device is done, and every kernel's device time of one call (torch.profiler).

    PYTHONPATH=<wheel dir> python3 bench/gpu/packed_profile.py [--t 16384] [--counts 1,4,32]

N = 1 is the call without `cu_seqlens`. The kernel names say which path ran: one launch sequence
over the chunk table (`llc_states_tc`/`llc_walk_tc`, `llc_scan`, `llc_out_direct_tc` once) or one
run per sequence (the same kernels N times).
"""
import argparse
import time

import torch

import mixers
from packed_cost import packed_inputs, random_offsets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", type=int, default=16384)
    ap.add_argument("--counts", default="1,4,32")
    a = ap.parse_args()
    T, H, D = a.t, 16, 64
    gen = torch.Generator().manual_seed(3)
    for mode in ("tf32", "bf16"):
        x = packed_inputs("mamba2", mode, T, H, D)
        for n in map(int, a.counts.split(",")):
            cu = random_offsets(T, n, gen)
            kw = {} if n == 1 else {"cu_seqlens": cu}
            for _ in range(3):
                mixers.run("mamba2", precision=mode, **kw, **x)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                mixers.run("mamba2", precision=mode, **kw, **x)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
                mixers.run("mamba2", precision=mode, **kw, **x)
                torch.cuda.synchronize()
            kernels = [(e.key[:32], round(e.device_time_total, 1)) for e in p.key_averages() if e.device_time_total > 0]
            print(f"{mode} N={n} host {1e6 * (t1 - t0) / 20:.0f} us/call, until done {1e6 * (t2 - t0) / 20:.0f} "
                  f"us/call, kernels (us): {kernels}", flush=True)


if __name__ == "__main__":
    main()
