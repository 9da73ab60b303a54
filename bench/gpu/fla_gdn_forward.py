"""fla's `chunk_gated_delta_rule` forward (fp32 and bf16) at the shapes of gated DeltaNet's backward
goal, the anchor of "forward + backward ≤ 3× fla's forward" (fla's own backward refuses to run on
this Triton version on Hopper). CUDA events, median of 10 after warm-up (bench/gpu/reference.py's
`timed`); inputs as bench/gpu/side_by_side.py's `ref_gdn` makes them. fla from ./.fla.

    python3 bench/gpu/fla_gdn_forward.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from side_by_side import FLA, ref_gdn  # noqa: E402

if FLA:
    sys.exit(FLA)
for B, T, H, D in [(1, 16384, 16, 64), (8, 4096, 16, 64), (8, 4096, 16, 128)]:
    for dt in (torch.float32, torch.bfloat16):
        med, lo, hi = ref_gdn(B, T, H, D, dt)
        print(f"FLA chunk_gated_delta_rule {str(dt)[6:]} (B,T,H,D)=({B},{T},{H},{D}) forward {med:.3f} ms "
              f"(min {lo:.3f}, max {hi:.3f})", flush=True)
