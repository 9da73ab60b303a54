"""The cost of one small call on the CPU: a decoding step from a state (chunked prefill, then
one token at a time), through the Python package and through its extension (the Rust path),
next to the same step written in PyTorch ops, in one run.

    python3 bench/cpu/call_cost.py [--threads 2] [--calls 2000] [--out DIR]

Needs the package installed (`pip install ./python`) and PyTorch. For each mixer and shape
`(B, H, D)` (head dims 64 and 128, B = 1 and 8, H = 4), one token `[B, 1, H, D]` and a random
state `S [B, H, D, D]`:
  * ours      `mixers.<fn>(…, form="recurrent", initial_state=S, output_final_state=True)`
              (the package's function: PyTorch tensors in and out, the library's decoder from
              the state);
  * extension `mixers._mixers.forward(…)` on numpy arrays, the same call without the Python
              layer (what the Rust API costs plus the array conversions);
  * torch     the step in PyTorch ops on the same tensors: `S ← e^g S + v kᵀ` (Mamba-2),
              `S ← e^g S;  S ← S + β (v − S k) kᵀ` (gated DeltaNet), `y = S q`.
Each time is the best of 5 rounds of `--calls` calls (wall clock, after 200 warm-up calls), in
microseconds per call; ratio = ours / torch. The three agree to 1e-5 (checked first).
Writes call_cost.md / .json under --out and prints the Markdown table.
"""
import argparse
import json
import os
import time


def best_us(f, calls):
    for _ in range(200):
        f()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", default="out/call_cost")
    args = ap.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    import numpy as np
    import torch

    import mixers
    from mixers import _mixers

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for mixer in ("mamba2", "gated-deltanet"):
        for b, h, d in ((1, 4, 64), (8, 4, 64), (1, 4, 128), (8, 4, 128)):
            q, k, v = (torch.randn(b, 1, h, d) for _ in range(3))
            k = torch.nn.functional.normalize(k, dim=-1)
            g = -torch.rand(b, 1, h)
            beta = torch.rand(b, 1, h)
            s = torch.randn(b, h, d, d) * 0.1
            inputs = {"q": q, "k": k, "v": v, "g": g}
            if mixer == "gated-deltanet":
                inputs["beta"] = beta
            arrays = {n: t.numpy() for n, t in inputs.items()}
            fn = mixers.mamba2 if mixer == "mamba2" else mixers.gated_delta_rule

            def ours():
                return fn(**inputs, form="recurrent", initial_state=s, output_final_state=True)

            def extension():
                return _mixers.forward(mixer, arrays, form="recurrent", backend="cpu", initial={"S": s.numpy()},
                                       want_final=True)

            def reference():
                st = s * g[:, 0, :, None, None].exp()
                kt, vt, qt = k[:, 0], v[:, 0], q[:, 0]
                if mixer == "gated-deltanet":
                    err = vt - torch.einsum("bhvk,bhk->bhv", st, kt)
                    st = st + beta[:, 0, :, None, None] * err[..., :, None] * kt[..., None, :]
                else:
                    st = st + vt[..., :, None] * kt[..., None, :]
                return torch.einsum("bhvk,bhk->bhv", st, qt)[:, None], st

            y, fin = ours()
            ye, fe = extension()
            yr, fr = reference()
            for a, r in ((y, yr), (torch.from_numpy(ye), yr), (fin, fr), (torch.from_numpy(fe["S"]), fr)):
                err = (a - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
                if err > 1e-5:
                    raise SystemExit(f"{mixer} {b, h, d}: ours and the torch step differ by {err:.2e}")
            t_ours, t_ext, t_ref = (best_us(f, args.calls) for f in (ours, extension, reference))
            rows.append({"mixer": mixer, "B": b, "H": h, "D": d, "ours_us": t_ours, "extension_us": t_ext,
                         "torch_us": t_ref, "ratio": t_ours / t_ref})
            print(f"{mixer} B={b} H={h} D={d}: ours {t_ours:.1f} us, extension {t_ext:.1f}, torch {t_ref:.1f}",
                  flush=True)
    lines = ["| mixer | B, H, D | ours µs | extension µs | torch step µs | ours / torch |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mixer']} | {r['B']}, {r['H']}, {r['D']} | {r['ours_us']:.1f} | {r['extension_us']:.1f} | "
                     f"{r['torch_us']:.1f} | {r['ratio']:.2f} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "call_cost.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "call_cost.json"), "w") as f:
        json.dump({"threads": args.threads, "calls": args.calls, "rows": rows}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
