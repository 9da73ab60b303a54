"""The cost of a packed batch on CUDA tensors against one sequence of the same total length.

    PYTHONPATH=<wheel dir> python3 bench/gpu/packed_cost.py [--t 16384] [--counts 4,16,64]

Mamba-2 and gated DeltaNet (H = 16, D = 64, float32 gates), tf32 and bf16 modes, through the
PyTorch op on the zero-copy path: `mixers.run(..., cu_seqlens=...)` with N sequences of random
lengths (a fixed seed) filling T tokens, against the same call without `cu_seqlens` (one
sequence of T). Median milliseconds of CUDA events around each call on device-resident inputs
(bench/gpu/reference.py's `timed`; the offsets are a CPU tensor, so no synchronisation is timed).
"""
import argparse

import torch

import mixers
from reference import timed

F = torch.nn.functional


def packed_inputs(name, mode, T, H, D):
    """Inputs of `name` (mamba2 or gated-deltanet) as one buffer row of T tokens on the GPU, in
    the dtypes of `mode` (bf16 activations in the bf16 mode)."""
    dt = torch.bfloat16 if mode == "bf16" else torch.float32
    q, k = (F.normalize(torch.randn(1, T, H, D, device="cuda"), dim=-1).to(dt) for _ in range(2))
    x = {"q": q, "k": k, "v": torch.randn(1, T, H, D, device="cuda", dtype=dt),
         "g": F.logsigmoid(torch.randn(1, T, H, device="cuda"))}
    if name == "gated-deltanet":
        x["beta"] = torch.sigmoid(torch.randn(1, T, H, device="cuda"))
    return x


def random_offsets(T, n, gen):
    """`cu_seqlens` of n sequences of random lengths filling T tokens."""
    cuts = sorted(torch.randperm(T - 1, generator=gen)[: n - 1].add(1).tolist())
    return torch.tensor([0] + cuts + [T])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", type=int, default=16384)
    ap.add_argument("--counts", default="4,16,64")
    a = ap.parse_args()
    T, H, D = a.t, 16, 64
    gen = torch.Generator().manual_seed(3)
    print("| mixer | mode | N | one sequence of T (ms) | packed (ms) | packed / one |")
    print("|---|---|---|---|---|---|")
    for name in ("mamba2", "gated-deltanet"):
        for mode in ("tf32", "bf16"):
            x = packed_inputs(name, mode, T, H, D)
            one = timed(lambda: mixers.run(name, precision=mode, **x))[0]
            for n in map(int, a.counts.split(",")):
                cu = random_offsets(T, n, gen)
                packed = timed(lambda: mixers.run(name, precision=mode, cu_seqlens=cu, **x))[0]
                print(f"| {name} | {mode} | {n} | {one:.3f} | {packed:.3f} | {packed / one:.2f} |", flush=True)


if __name__ == "__main__":
    main()
