"""Runs from a recurrent state on the GPU machine, side by side with flash-linear-attention.

    PYTHONPATH=<wheel dir> python3 bench/gpu/state_modes.py [--shapes 1x16384x16x64,8x4096x16x128] [--out DIR]

For Mamba-2 (fla `chunk_simple_gla`) and gated DeltaNet (fla `chunk_gated_delta_rule`, q and k
L2-normalised, β = sigmoid), in the tf32 mode (fla fp32, whose Triton dots are tf32) and the bf16
mode (bf16 activations, f32 gates and states), with and without a state: ours through the
PyTorch op (`mixers.run(..., initial_state=S0, output_final_state=True)`: the zero-copy path, so
the time includes its Python call), fla with `initial_state` (its `[B, H, K, V]`, our state
transposed) and `output_final_state=True`. Median milliseconds of CUDA events around each call on
device-resident inputs (bench/gpu/reference.py's `timed`), and the ratio ours / fla. fla is
imported from ./.fla (its fla/ folder, carried to the machine in an ignored folder, never
committed). Prints a Markdown table and writes state_modes.json to --out.
"""
import argparse
import json
import os
import sys

import torch

from reference import timed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
if os.path.isdir(os.path.join(ROOT, ".fla", "fla")):
    sys.path.insert(0, os.path.join(ROOT, ".fla"))

import mixers  # noqa: E402  (the wheel, on PYTHONPATH)
from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: E402
from fla.ops.simple_gla import chunk_simple_gla  # noqa: E402

F = torch.nn.functional


def case(name, B, T, H, D, mode):
    """Our op's inputs (float32 gates, the mode's activations), fla's call on the same values, and
    a state `[B, H, Dv, Dk]`."""
    dt = torch.bfloat16 if mode == "bf16" else torch.float32
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda"))
    if name == "gated-deltanet":
        q, k = (F.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).to(dt) for _ in range(2))
    else:
        q, k = (torch.randn(B, T, H, D, device="cuda", dtype=dt) for _ in range(2))
    v = torch.randn(B, T, H, D, device="cuda", dtype=dt)
    x = {"q": q, "k": k, "v": v, "g": g}
    if name == "gated-deltanet":
        x["beta"] = torch.sigmoid(torch.randn(B, T, H, device="cuda"))
    s0 = 0.1 * torch.randn(B, H, D, D, device="cuda")

    def fla(state):
        h0 = s0.transpose(-1, -2).contiguous() if state else None
        if name == "gated-deltanet":
            return lambda: chunk_gated_delta_rule(q, k, v, g, x["beta"], initial_state=h0, output_final_state=state)
        return lambda: chunk_simple_gla(q, k, v, g=g, initial_state=h0, output_final_state=state)

    def ours(state):
        if state:
            return lambda: mixers.run(name, precision=mode, initial_state=s0, output_final_state=True, **x)
        return lambda: mixers.run(name, precision=mode, **x)

    return ours, fla


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x16384x16x64,8x4096x16x64,1x16384x16x128,8x4096x16x128")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    print("| mixer | B, T, H, D | mode | ours, no state | ours, from a state | fla, no state | fla, from a state | ratio from a state |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        B, T, H, D = map(int, shape.split("x"))
        for name in ("mamba2", "gated-deltanet"):
            for mode in ("tf32", "bf16"):
                ours, fla = case(name, B, T, H, D, mode)
                r = {"mixer": name, "shape": [B, T, H, D], "mode": mode}
                r["ours"], r["ours_state"] = timed(ours(False))[0], timed(ours(True))[0]
                r["fla"], r["fla_state"] = timed(fla(False))[0], timed(fla(True))[0]
                rows.append(r)
                print(f"| {name} | {B}, {T}, {H}, {D} | {mode} | {r['ours']:.3f} | {r['ours_state']:.3f} | "
                      f"{r['fla']:.3f} | {r['fla_state']:.3f} | {r['ours_state'] / r['fla_state']:.2f} |", flush=True)
                torch.cuda.empty_cache()
    if a.out:
        with open(os.path.join(a.out, "state_modes.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
