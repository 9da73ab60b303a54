"""Side by side on the GPU machine: the reference kernels and ours, same sizes, one run.

    python3 bench/gpu/side_by_side.py --bin .gpu-bundle/bin/mixers --out $OUT [--quick]

References (CUDA events, device-resident inputs, median of repeats after warm-up):
  * attention: torch SDPA, causal, fp32 and bf16 ([B, H, T, D]);
  * mamba2: flash-linear-attention `chunk_simple_gla`, fp32 (scalar gate per head);
  * gated-deltanet: fla `chunk_gated_delta_rule`, fp32 (q, k L2-normalised, β = sigmoid);
  * loglinear-mamba2: fla `chunk_log_linear_attn`, fp32 (q, k shared by all heads, as that
    kernel requires; ours has per-head q, k);
  * toeplitz: a causal convolution through torch.fft.rfft/irfft (padding 2T), with one kernel per
    channel (C kernel spectra per call), and with one kernel per head as ours (heads = H), its
    H spectra computed in the call or cached before timing (ours caches spectra keyed by the
    kernel tensor, so the bench's repeated calls reuse them).
flash-linear-attention is imported from ./.fla (its `fla/` folder, carried to the machine in an
ignored folder, never committed) or from the environment; its rows say so when it is missing.
Ours: `mixers bench --backend cuda --form fast` (CUDA events around the form's launches on
device-resident inputs; upload and download reported apart), exact f32, and for attention also
the tf32 and bf16 modes. Writes side_by_side.md and side_by_side.json to --out, rewritten after
every row (a run cut short by a time limit keeps the rows it finished). `bench/gpu/goals.py
side_by_side.json` turns the rows at T = 16k, B = 1 into the log-linear family's goal table.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

from reference import timed as reference_timed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
if os.path.isdir(os.path.join(ROOT, ".fla", "fla")):
    sys.path.insert(0, os.path.join(ROOT, ".fla"))

try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.log_linear_attn import chunk_log_linear_attn
    from fla.ops.simple_gla import chunk_simple_gla

    FLA = None
except Exception as e:  # noqa: BLE001 - any import failure means "not available"
    FLA = f"flash-linear-attention not importable: {type(e).__name__}: {e}"


def timed(fn):
    """Median milliseconds of `fn` (CUDA events; the same timing as reference.py)."""
    return reference_timed(fn)[0]


def ref_attention(B, T, H, D, dtype):
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=dtype) for _ in range(3))
    return timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


def ref_simple_gla(B, T, H, D, dtype=torch.float32):
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=dtype) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda"))
    return timed(lambda: chunk_simple_gla(q, k, v, g=g))


def ref_gdn(B, T, H, D, dtype=torch.float32):
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, D, device="cuda", dtype=dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda"))
    beta = torch.sigmoid(torch.randn(B, T, H, device="cuda"))
    return timed(lambda: chunk_gated_delta_rule(q, k, v, g, beta))


def ref_loglinear(B, T, H, D):
    q, k = (torch.randn(B, T, 1, D, device="cuda") for _ in range(2))
    v = torch.randn(B, T, H, D, device="cuda")
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda"))
    L = int(math.ceil(math.log2(max(T, 2)))) + 2
    lam = torch.rand(B, T, H, L, device="cuda")
    return timed(lambda: chunk_log_linear_attn(q, k, v, g, lam))


def ref_fft_conv(B, T, H, D):
    C = H * D
    x = torch.randn(B, T, C, device="cuda")
    w = torch.randn(C, T, device="cuda")
    n = 2 * T

    def f():
        X = torch.fft.rfft(x, n=n, dim=1)
        W = torch.fft.rfft(w.t(), n=n, dim=0)
        return torch.fft.irfft(X * W.unsqueeze(0), n=n, dim=1)[:, :T]

    return timed(f)


def ref_fft_conv_heads(B, T, H, D, cached):
    """The same causal convolution with one kernel per head (w [H, T], shared by the head's D
    channels: our `toeplitz{"heads": H}`), the kernel spectra computed in the call or, with
    `cached`, once before timing."""
    x = torch.randn(B, T, H, D, device="cuda")
    w = torch.randn(H, T, device="cuda")
    n = 2 * T
    W0 = torch.fft.rfft(w.t(), n=n, dim=0)

    def f():
        X = torch.fft.rfft(x, n=n, dim=1)
        W = W0 if cached else torch.fft.rfft(w.t(), n=n, dim=0)
        return torch.fft.irfft(X * W[None, :, :, None], n=n, dim=1)[:, :T]

    return timed(f)


def plan_kernels(plan):
    """The kernels of the launch plan that ran (`mixers plan`): attention's one function, or the
    log-linear family's launches in order, joined by "+" (`None` without a plan)."""
    if not plan:
        return None
    if plan.get("function"):
        return plan["function"]
    names = [l.get("function") for l in plan.get("launches", []) if l.get("function")]
    return " + ".join(names) or None


def ours(binary, mixer, seqs, B, H, D, precision, max_seconds):
    with tempfile.TemporaryDirectory() as d:
        cmd = [binary, "bench", "--backend", "cuda", "--form", "fast", "--mixer", mixer,
               "--seq", ",".join(map(str, seqs)), "--batch", str(B), "--heads", str(H), "--dim", str(D),
               "--reps", "10", "--max-seconds", str(max_seconds), "--quiet", "--out", d, "--precision", precision]
        r = subprocess.run(cmd, capture_output=True, text=True)
        path = os.path.join(d, "bench.json")
        if not os.path.exists(path):
            return {}, r.stderr.strip()[-300:]
        rep = json.load(open(path))
    out = {}
    for p in rep["points"]:
        kernel = plan_kernels(p.get("plan"))
        if p["backend"] == "cuda" and p["status"] == "ok":
            out[p["seq"]] = (p["timing"]["median"] * 1e3, p["upload_s"] * 1e3, p["download_s"] * 1e3, kernel)
        elif p["backend"] == "cuda":
            out[p["seq"]] = (None, None, p.get("reason"), kernel)
    return out, rep["meta"].get("device")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, ".gpu-bundle", "bin", "mixers"))
    ap.add_argument("--out", default=".")
    ap.add_argument("--seqs", default="4096,16384,65536")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--max-seconds", type=float, default=10.0)
    ap.add_argument("--only", default="", help="comma list: run only the cases whose mixer name starts with one of these")
    a = ap.parse_args()
    seqs = [int(s) for s in a.seqs.split(",")]
    H, D = a.heads, a.dim
    cases = [
        # (our mixer, our precision, reference name, reference function or None)
        ("attention", "exact", "SDPA causal fp32", lambda B, T: ref_attention(B, T, H, D, torch.float32)),
        ("attention", "tf32", "SDPA causal fp32", lambda B, T: ref_attention(B, T, H, D, torch.float32)),
        ("attention", "bf16", "SDPA causal bf16", lambda B, T: ref_attention(B, T, H, D, torch.bfloat16)),
        ("mamba2", "exact", "fla chunk_simple_gla fp32", None if FLA else lambda B, T: ref_simple_gla(B, T, H, D)),
        ("mamba2", "tf32", "fla chunk_simple_gla fp32", None if FLA else lambda B, T: ref_simple_gla(B, T, H, D)),
        ("mamba2", "bf16", "fla chunk_simple_gla bf16",
         None if FLA else lambda B, T: ref_simple_gla(B, T, H, D, torch.bfloat16)),
        ("gated-deltanet", "exact", "fla chunk_gated_delta_rule fp32", None if FLA else lambda B, T: ref_gdn(B, T, H, D)),
        ("gated-deltanet", "tf32", "fla chunk_gated_delta_rule fp32", None if FLA else lambda B, T: ref_gdn(B, T, H, D)),
        ("gated-deltanet", "bf16", "fla chunk_gated_delta_rule bf16",
         None if FLA else lambda B, T: ref_gdn(B, T, H, D, torch.bfloat16)),
        ("loglinear-mamba2", "exact", "fla chunk_log_linear_attn fp32", None if FLA else lambda B, T: ref_loglinear(B, T, H, D)),
        ("loglinear-mamba2", "tf32", "fla chunk_log_linear_attn fp32", None if FLA else lambda B, T: ref_loglinear(B, T, H, D)),
        ("loglinear-gated-deltanet", "exact", "(no public fp32 kernel)", None),
        ("loglinear-gated-deltanet", "tf32", "(no public fp32 kernel)", None),
        ("toeplitz{\"heads\":%d}" % H, "exact", "torch.fft causal conv fp32", lambda B, T: ref_fft_conv(B, T, H, D)),
        ("toeplitz{\"heads\":%d}" % H, "exact", "torch.fft conv fp32, a kernel per head",
         lambda B, T: ref_fft_conv_heads(B, T, H, D, False)),
        ("toeplitz{\"heads\":%d}" % H, "exact", "torch.fft conv fp32, a kernel per head, spectra cached",
         lambda B, T: ref_fft_conv_heads(B, T, H, D, True)),
    ]
    if a.only:
        keep = tuple(a.only.split(","))
        cases = [c for c in cases if c[0].startswith(keep)]
    rows, device = [], None
    fmt = lambda x: "–" if x is None else (f"{x:.3g}" if x < 100 else f"{x:.0f}")

    def write_tables():
        """side_by_side.md and .json of the rows so far: rewritten after every row, so that a run
        cut short by a time limit still leaves its table."""
        md = [f"Device: {device or torch.cuda.get_device_name()}; B ∈ {{{a.batches}}}, H = {H}, D = {D}; "
              f"command: `python3 bench/gpu/side_by_side.py --bin .gpu-bundle/bin/mixers --out $OUT`", "",
              "| mixer | mode | B | T | ours ms | our kernel | reference | ref ms | ours / ref | our upload / download ms | note |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            note = r["ours_note"] or r["ref_note"] or ""
            md.append(f"| {r['mixer']} | {r['precision']} | {r['B']} | {r['T']} | {fmt(r['ours_ms'])} | {r['kernel'] or '–'} | {r['reference']} | "
                      f"{fmt(r['ref_ms'])} | {fmt(r['ratio'])} | {fmt(r['upload_ms'])} / {fmt(r['download_ms'])} | {note} |")
        os.makedirs(a.out, exist_ok=True)
        open(os.path.join(a.out, "side_by_side.md"), "w").write("\n".join(md) + "\n")
        json.dump(rows, open(os.path.join(a.out, "side_by_side.json"), "w"), indent=1)
        return md

    for B in [int(b) for b in a.batches.split(",")]:
        for mixer, prec, ref_name, ref in cases:
            mine, dev = ours(a.bin, mixer, seqs, B, H, D, prec, a.max_seconds)
            device = device or (dev if isinstance(dev, str) and not dev.startswith("error") else None)
            for T in seqs:
                try:
                    r = ref(B, T) if ref else None
                    why = None if ref else FLA
                except Exception as e:  # noqa: BLE001 - a reference that cannot run at this size
                    r, why = None, f"{type(e).__name__}: {str(e)[:120]}"
                torch.cuda.empty_cache()
                m = mine.get(T, (None, None, dev if not mine else "not measured", None))
                rows.append({
                    "mixer": mixer, "precision": prec, "B": B, "T": T, "ours_ms": m[0],
                    "upload_ms": m[1], "download_ms": m[2] if m[0] is not None else None,
                    "ours_note": None if m[0] is not None else m[2], "kernel": m[3],
                    "reference": ref_name, "ref_ms": r, "ref_note": why,
                    "ratio": (m[0] / r) if (m[0] is not None and r) else None,
                })
                print(json.dumps(rows[-1]), flush=True)
                write_tables()
    print("\n".join(write_tables()))

if __name__ == "__main__":
    main()
