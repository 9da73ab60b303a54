"""Context parallelism in PyTorch: one sequence split over the ranks of a ``torch.distributed``
process group, each rank holding a contiguous part of the tokens (in rank order), for the
log-linear base mixers (``linear-attention``, ``mamba2``, ``gated-deltanet``), with autograd.

The algorithm is the library's (docs/math.md §7.3, ``mixers::context_parallel`` in Rust): a
part maps its start state affinely, ``S_end = S_start @ P + L`` (``S [B, H, V, K]``); each rank
computes ``L`` (its part run from zeros) and ``P`` (its part run with ``v = 0`` of width ``K``
from the identity) in one run (``v`` widened by ``K`` zero columns, from the state ``[0; I]``),
the ranks all-gather them, and each chains the earlier ranks' maps from the
initial state and runs its part from there. All three runs are the package's ops, and the
all-gather is ``torch.distributed.nn.functional.all_gather``, which is differentiable, so
``loss.backward()`` on every rank gives every rank's input gradients (and the initial state's)
through the other ranks' parts. Only states and transitions cross ranks (``O(N·B·H·K·(K + V))``
per call), never tokens.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._torch_api import run

_BASES = ("linear-attention", "mamba2", "gated-deltanet")


def context_parallel(name: str, config: Optional[dict] = None, *, group=None,
                     initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                     **inputs):
    """This rank's ``y`` for its part ``inputs`` (``[B, T_r, H, D]``, ``T_r ≥ 1``) of a sequence
    split over the ranks of ``group`` (default: the default group), started from
    ``initial_state`` (``S [B, H, V, K]``, the same on every rank; ``None``: zeros). With
    ``output_final_state`` also the state at the end of this rank's part (the last rank's is the
    sequence's final state). Every rank of the group calls it together."""
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_gather

    if name not in _BASES:
        raise NotImplementedError(
            f"context parallelism in PyTorch covers {', '.join(_BASES)}; `{name}` is not one of them "
            "(the Rust module mixers::context_parallel also covers the lifts and the GLR)")
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    b, t, h, dk = k.shape
    if t == 0:
        raise ValueError("context parallelism: every rank's part needs at least one token")
    work = torch.float64 if v.dtype == torch.float64 else torch.float32
    dv = v.shape[-1]
    zero = torch.zeros(b, h, dv, dk, dtype=work, device=v.device)
    # L and P from one run: v widened by K zero columns, from the state [0; I] (each row of a
    # state evolves on its own, so the end state is [L; P]).
    eye = torch.eye(dk, dtype=work, device=v.device).expand(b, h, dk, dk)
    widened = dict(inputs, v=torch.cat([v, v.new_zeros(b, t, h, dk)], dim=-1))
    try:
        _, local_p = run(name, config, initial_state=torch.cat([zero, eye], dim=2).contiguous(),
                         output_final_state=True, **widened)
        error = None
    except Exception as e:  # noqa: BLE001 - reported to every rank below, then raised here
        error = e
    # Every rank learns whether any rank failed before the data's collective, so that a failure
    # on one rank never leaves the others waiting in it.
    flags = [torch.zeros(1, dtype=torch.int32, device=v.device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(flags, torch.tensor([int(error is not None)], dtype=torch.int32, device=v.device), group=group)
    failed = [r for r, f in enumerate(flags) if f.item()]
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(f"context parallel: rank {failed[0]} failed (its own error says why)")
    # One collective (so that every rank's backward runs the same collectives in the same
    # order): [L; P] stacked on the state's row axis.
    gathered = all_gather(local_p, group=group)
    s = zero if initial_state is None else initial_state.to(work)
    for r in range(dist.get_rank(group)):
        s = s @ gathered[r][:, :, dv:] + gathered[r][:, :, :dv]
    # Every rank's result depends on the collective (rank 0's adds exact zeros), so that every
    # rank takes part in its backward.
    s = s + 0.0 * torch.stack(gathered).sum()
    y, fin = run(name, config, initial_state=s, output_final_state=True, **inputs)
    return (y, fin) if output_final_state else y
