"""Attention forward and forward+backward side by side on the GPU: PyTorch's
scaled_dot_product_attention (causal; fp32 with TF32 off, and bf16) and ours, in one run, at the
shapes of the CUDA backward's timing tests (mixer-cuda/tests/all/backward.rs). CUDA events,
device-resident inputs, median of 5 runs after a warm-up, on both sides.

    python3 bench/gpu/attention_backward_torch.py [--bin ./all-<hash>]

Without --bin: the SDPA rows alone. With --bin (the mixer-cuda test binary `all`): it runs the test
`backward::attention_backward_timing_modes` (our tf32 mode on f32 tensors and bf16 mode on bf16
tensors) and prints the table of docs/gradients.md: ours against SDPA fp32 (tf32) and SDPA bf16
(bf16), and our backward over our forward.
"""

import argparse
import re
import subprocess

import torch
import torch.nn.functional as F

from reference import timed as reference_timed

SHAPES = [(1, 16384, 16, 64), (8, 4096, 16, 64), (8, 4096, 16, 128)]


def median_ms(f):
    """Median milliseconds of `f` over 5 runs after a warm-up (reference.py's CUDA-event timer)."""
    return reference_timed(f, warmup=1, reps=5)[0]


def sdpa(b, t, h, d, dtype):
    """(fwd, fwd+bwd) milliseconds of causal SDPA in `dtype`."""
    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    dy = torch.randn(b, h, t, d, device="cuda", dtype=dtype)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(y, (q, k, v), dy)

    return median_ms(fwd), median_ms(fwd_bwd)


def ours(binary):
    """{(mode, b, t, h, d): (fwd, bwd)} from the test binary's TIMING lines."""
    out = subprocess.run(
        [binary, "--include-ignored", "--exact", "backward::attention_backward_timing_modes", "--nocapture"],
        capture_output=True,
        text=True,
        env={"MIXERS_REQUIRE_CUDA": "1", **__import__("os").environ},
    )
    rows = {}
    pat = re.compile(r"TIMING attention (\w+) B=(\d+) T=(\d+) H=(\d+) D=(\d+) ms: fwd=([\d.]+) bwd=([\d.]+)")
    for line in out.stdout.splitlines():
        m = pat.search(line)
        if m:
            key = (m[1], *map(int, m.group(2, 3, 4, 5)))
            rows[key] = (float(m[6]), float(m[7]))
    if not rows:
        print(out.stdout[-3000:], out.stderr[-3000:])
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="the mixer-cuda test binary (all-<hash>)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ref = {}
    for b, t, h, d in SHAPES:
        for name, dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16)]:
            f, fb = sdpa(b, t, h, d, dtype)
            ref[(name, b, t, h, d)] = (f, fb)
            print(f"TORCH sdpa {name} B={b} T={t} H={h} D={d} ms: fwd={f:.3f} fwd+bwd={fb:.3f}", flush=True)
    if not args.bin:
        return
    mine = ours(args.bin)
    print()
    print("| shape (B, T, H, D) | mode | ours fwd / fwd+bwd (ms) | SDPA fwd / fwd+bwd (ms) | fwd+bwd ours / SDPA | our bwd / our fwd |")
    print("|---|---|---|---|---|---|")
    for b, t, h, d in SHAPES:
        for mode, refname in [("tf32", "fp32"), ("bf16", "bf16")]:
            r = ref[(refname, b, t, h, d)]
            o = mine.get((mode, b, t, h, d))
            if o is None:
                print(f"| ({b}, {t}, {h}, {d}) | {mode} | not measured | {r[0]:.2f} / {r[1]:.2f} | | |")
                continue
            fb = o[0] + o[1]
            print(
                f"| ({b}, {t}, {h}, {d}) | {mode} vs SDPA {refname} | {o[0]:.2f} / {fb:.2f} | {r[0]:.2f} / {r[1]:.2f} "
                f"| {fb / r[1]:.2f} | {o[1] / o[0]:.2f} |"
            )


if __name__ == "__main__":
    main()
