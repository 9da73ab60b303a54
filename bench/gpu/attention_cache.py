"""Attention continuing a KV cache on the GPU: ours against PyTorch SDPA, in one process call.

    python3 bench/gpu/attention_cache.py --bin PATH/attention_cache-HASH [--quick] [--out DIR]

Runs our bench binary (`cargo bench -p mixer-cuda --bench attention_cache --no-run` builds it; it
prints one JSON line per shape and mode: `cached_ms`, `whole_ms`, `new_ms`, see its documentation),
then times torch's scaled_dot_product_attention on the same shape: queries [B, H, T, D] against
keys and values [B, H, L + T, D] under the lower-right causal mask (query t sees keys 0 … L + t,
`torch.nn.attention.bias.causal_lower_right`), bf16 for the bf16 mode and fp32 otherwise, CUDA-event
medians (reference.py's `timed`) on device-resident tensors. Prints a markdown table and writes
attention_cache.json to --out.
"""
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import timed  # noqa: E402


def sdpa(B, L, T, H, D, dtype):
    from torch.nn.attention.bias import causal_lower_right

    q = torch.randn(B, H, T, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, H, L + T, D, device="cuda", dtype=dtype) for _ in range(2))
    mask = causal_lower_right(T, L + T)
    ms = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))[0]
    del q, k, v
    torch.cuda.empty_cache()
    return ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    cmd = [a.bin] + (["--quick"] if a.quick else [])
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{cmd} failed:\n{run.stderr[-4000:]}")
    rows = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
    print("| (B, L, T, H, D) | mode | from the cache ms | whole L + T ms | T alone ms | SDPA ms | "
          "cache / SDPA | cache / whole |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        dtype = torch.bfloat16 if r["mode"] == "bf16" else torch.float32
        r["sdpa_ms"] = sdpa(r["B"], r["L"], r["T"], r["H"], r["D"], dtype)
        shape = f'({r["B"]}, {r["L"]}, {r["T"]}, {r["H"]}, {r["D"]})'
        print(f'| {shape} | {r["mode"]} | {r["cached_ms"]:.3f} | {r["whole_ms"]:.3f} | {r["new_ms"]:.3f} | '
              f'{r["sdpa_ms"]:.3f} ({"bf16" if dtype == torch.bfloat16 else "fp32"}) | '
              f'{r["cached_ms"] / r["sdpa_ms"]:.2f} | {r["cached_ms"] / r["whole_ms"]:.3f} |', flush=True)
    with open(os.path.join(a.out, "attention_cache.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
