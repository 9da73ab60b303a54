"""Chunked prefill of a GLR after a long prefix, through the Python package on the CPU: the time
of one 64-token run from the state after a prefix of `a` tokens (best of 5), its largest
difference from rows `a …` of the whole run (0: the same run), and the time of that run with its
backward into the inputs and the state (best of 3).

    python3 bench/cpu/glr_prefill_after_prefix.py [--prefixes 1000 20000 100000] [--channels 256]

The CPU backend runs the sparse recurrence over the run's tokens only, reading the positions
before them from the state (docs/math.md §7.1), so the time does not grow with the prefix as it
did when the run was that of the state's extension (the prefix and the run).
"""

import argparse
import time

import torch

import mixers


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefixes", type=int, nargs="+", default=[1000, 20000, 100000])
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--chunk", type=int, default=64)
    a = p.parse_args()
    torch.manual_seed(0)
    lattice = ("glr", {"pattern": "pow2", "cache_efficient": True}, None)
    for mixer, cfg, k in [("kth-order", {"order": 8}, 8), ("diagonal-ssm", {}, 1), lattice]:
        for prefix in a.prefixes:
            n, c = prefix + a.chunk, a.channels
            slots = k or (n - 1).bit_length()  # 2^k: the K(n) slots of a run of n tokens
            x = torch.randn(1, n, c, dtype=torch.float64)
            al = torch.rand(1, n, c, dtype=torch.float64)
            be = torch.rand(1, n, slots, c, dtype=torch.float64) * 0.1

            def inputs(s, e):
                return dict(x=x[:, s:e], alpha=al[:, s:e], beta=be[:, s:e])

            _, state = mixers.run(mixer, cfg, output_final_state=True, **inputs(0, prefix))
            dt = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                y, _ = mixers.run(mixer, cfg, initial_state=state, output_final_state=True, **inputs(prefix, n))
                dt = min(dt, time.perf_counter() - t0)
            whole = mixers.run(mixer, cfg, **inputs(0, n))[:, prefix:]
            err = (y - whole).abs().max().item()
            grad = {k: v.clone().requires_grad_(k != "position") for k, v in state.items()}
            tail = {k: v.clone().requires_grad_(True) for k, v in inputs(prefix, n).items()}
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                y, _ = mixers.run(mixer, cfg, initial_state=grad, output_final_state=True, **tail)
                y.pow(2).sum().backward()
                best = min(best, time.perf_counter() - t0)
            print(f"{mixer:14s} prefix {prefix:7d}  chunk {a.chunk}: {dt * 1e3:8.2f} ms  max |Δ| {err:.1e}"
                  f"  with the backward {best * 1e3:8.2f} ms", flush=True)


if __name__ == "__main__":
    main()
