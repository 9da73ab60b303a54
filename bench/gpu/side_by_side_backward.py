"""Forward + backward side by side on the GPU machine, one run: ours against the references that
run there, at the shapes of the gradient goals (issue 37/38's grid: (B, T, H, D) = (1, 16k, 16, 64),
(8, 4k, 16, 64), (8, 4k, 16, 128) by default).

    python3 bench/gpu/side_by_side_backward.py --bin .gpu-run/bin/mixers --out $OUT

Ours: `mixers bench --backward --backend cuda` (device events around the fast forward and around
the backward of every input, on device-resident inputs and a standard-normal cotangent; the
backward includes its device-side value checks). References (CUDA events, medians, see
reference.py; device-resident inputs; forward + backward = a forward with autograd recording and
`backward` of a random cotangent):
  * attention: torch SDPA causal, fp32 and bf16, forward + backward;
  * loglinear-mamba2: fla `chunk_log_linear_attn` fp32, forward + backward;
  * loglinear-gated-deltanet: none (fla has no kernel for it); the goal compares it with our
    gated-deltanet row;
  * mamba2, gated-deltanet: fla `chunk_simple_gla` / `chunk_gated_delta_rule` forward only (fla's
    backward of both refuses to run with the Triton of the H200 machine: the forward is the
    anchor the goals name).
fla is imported from ./.fla (carried, never committed) or the environment. Writes
side_by_side_backward.md and .json to --out, rewritten after every row.
"""
import argparse
import json
import math
import os
import re
import subprocess

import torch

from reference import timed as reference_timed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
from side_by_side import FLA, ref_gdn, ref_simple_gla  # noqa: E402 - after the path set-up

if FLA is None:
    from fla.ops.log_linear_attn import chunk_log_linear_attn


def timed(fn):
    return reference_timed(fn)[0]


def fwd_bwd(make):
    """Median ms of a forward with autograd and its backward of a fixed random cotangent."""
    leaves = make()

    def step():
        out = leaves["fn"](*leaves["args"])
        out.backward(leaves["dy"])

    return timed(step)


def _leaves(shapes, dtype):
    return [torch.randn(*s, device="cuda", dtype=dtype, requires_grad=True) for s in shapes]


def ref_sdpa(B, T, H, D, dtype, backward):
    q, k, v = _leaves([(B, H, T, D)] * 3, dtype)
    f = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    if not backward:
        with torch.no_grad():
            return timed(lambda: f(q, k, v))
    return fwd_bwd(lambda: {"fn": f, "args": (q, k, v), "dy": torch.randn(B, H, T, D, device="cuda", dtype=dtype)})


def ref_loglinear(B, T, H, D, backward):
    q, k = _leaves([(B, T, 1, D)] * 2, torch.float32)
    v, = _leaves([(B, T, H, D)], torch.float32)
    g = (-torch.rand(B, T, H, device="cuda") * 0.1).requires_grad_()
    lam = torch.rand(B, T, H, int(math.ceil(math.log2(max(T, 2)))) + 2, device="cuda", requires_grad=True)
    f = lambda q, k, v, g, lam: chunk_log_linear_attn(q, k, v, g, lam)[0]  # noqa: E731
    if not backward:
        with torch.no_grad():
            return timed(lambda: f(q, k, v, g, lam))
    return fwd_bwd(lambda: {"fn": f, "args": (q, k, v, g, lam), "dy": torch.randn(B, T, H, D, device="cuda")})


ROW = re.compile(r"^\|\s*(?P<mixer>[^|]+?)\s*\|\s*cuda\s*\|\s*(?P<T>\d+)\s*\|\s*(?P<f>[\d.]+)\s*\|\s*(?P<b>[\d.]+)\s*\|")


def ours(binary, mixer, B, T, H, D, precision):
    """(forward ms, backward ms) from `mixers bench --backward`, or (None, why)."""
    cmd = [binary, "bench", "--backward", "--backend", "cuda", "--mixer", mixer, "--seq", str(T), "--batch", str(B),
           "--heads", str(H), "--dim", str(D), "--precision", precision, "--reps", "5", "--max-seconds", "30"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    for line in r.stdout.splitlines():
        m = ROW.match(line)
        if m and int(m["T"]) == T:
            return float(m["f"]), float(m["b"])
    return None, (r.stdout + r.stderr).strip()[-300:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, ".gpu-run", "bin", "mixers"))
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default="1x16384x16x64,8x4096x16x64,8x4096x16x128", help="BxTxHxD, comma separated")
    ap.add_argument("--only", default="", help="comma list of mixer-name prefixes")
    a = ap.parse_args()
    cases = [
        # (mixer, our precision, reference name, reference(B, T, H, D) or None, whether it includes a backward)
        ("attention", "exact", "SDPA fp32 fwd+bwd", lambda *s: ref_sdpa(*s, torch.float32, True), True),
        ("attention", "tf32", "SDPA fp32 fwd+bwd", lambda *s: ref_sdpa(*s, torch.float32, True), True),
        ("attention", "bf16", "SDPA bf16 fwd+bwd", lambda *s: ref_sdpa(*s, torch.bfloat16, True), True),
        ("loglinear-mamba2", "exact", "fla chunk_log_linear_attn fp32 fwd+bwd",
         None if FLA else lambda *s: ref_loglinear(*s, True), True),
        ("loglinear-mamba2", "tf32", "fla chunk_log_linear_attn fp32 fwd+bwd",
         None if FLA else lambda *s: ref_loglinear(*s, True), True),
        ("mamba2", "exact", "fla chunk_simple_gla fp32 forward", None if FLA else ref_simple_gla, False),
        ("mamba2", "tf32", "fla chunk_simple_gla fp32 forward", None if FLA else ref_simple_gla, False),
        ("mamba2", "bf16", "fla chunk_simple_gla bf16 forward",
         None if FLA else lambda *s: ref_simple_gla(*s, torch.bfloat16), False),
        ("gated-deltanet", "exact", "fla chunk_gated_delta_rule fp32 forward",
         None if FLA else ref_gdn, False),
        ("gated-deltanet", "tf32", "fla chunk_gated_delta_rule fp32 forward",
         None if FLA else ref_gdn, False),
        ("gated-deltanet", "bf16", "fla chunk_gated_delta_rule bf16 forward",
         None if FLA else lambda *s: ref_gdn(*s, torch.bfloat16), False),
        ("loglinear-attention", "exact", "(no reference)", None, False),
        # The lifted gated DeltaNet: no fla kernel; its goal's anchor is the gated-deltanet row above
        # (forward + backward ≤ 1.6× ours).
        ("loglinear-gated-deltanet", "exact", "(no reference; see gated-deltanet)", None, False),
        ("loglinear-gated-deltanet", "tf32", "(no reference; see gated-deltanet)", None, False),
        ("loglinear-gated-deltanet", "bf16", "(no reference; see gated-deltanet)", None, False),
    ]
    if a.only:
        cases = [c for c in cases if c[0].startswith(tuple(a.only.split(",")))]
    rows = []
    fmt = lambda x: "–" if x is None else f"{x:.3g}"  # noqa: E731

    def write():
        md = [f"Device: {torch.cuda.get_device_name()}; command: `python3 bench/gpu/side_by_side_backward.py`", "",
              "| mixer | mode | (B, T, H, D) | ours fwd ms | ours fwd+bwd ms | (fwd+bwd)/fwd | reference | ref ms | "
              "ours fwd+bwd / ref | note |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            md.append(f"| {r['mixer']} | {r['precision']} | {r['shape']} | {fmt(r['fwd'])} | {fmt(r['both'])} | "
                      f"{fmt(r['ratio_self'])} | {r['reference']} | {fmt(r['ref_ms'])} | {fmt(r['ratio_ref'])} | "
                      f"{r['note'] or ''} |")
        os.makedirs(a.out, exist_ok=True)
        open(os.path.join(a.out, "side_by_side_backward.md"), "w").write("\n".join(md) + "\n")
        json.dump(rows, open(os.path.join(a.out, "side_by_side_backward.json"), "w"), indent=1)
        return md

    for shape in a.shapes.split(","):
        B, T, H, D = (int(x) for x in shape.split("x"))
        for mixer, prec, ref_name, ref, _ in cases:
            f, b = ours(a.bin, mixer, B, T, H, D, prec)
            note = None if f is not None else b
            both = f + b if f is not None else None
            try:
                r = ref(B, T, H, D) if ref else None
            except Exception as e:  # noqa: BLE001 - a reference that cannot run at this size
                r, note = None, (note or "") + f" reference: {type(e).__name__}: {str(e)[:120]}"
            torch.cuda.empty_cache()
            rows.append({"mixer": mixer, "precision": prec, "shape": f"({B}, {T}, {H}, {D})", "fwd": f, "both": both,
                         "ratio_self": both / f if both else None, "reference": ref_name, "ref_ms": r,
                         "ratio_ref": both / r if (both and r) else None, "note": note or (FLA if ref is None and
                                                                                           ref_name.startswith("fla") else None)})
            print(json.dumps(rows[-1]), flush=True)
            write()
    print("\n".join(write()))


if __name__ == "__main__":
    main()
