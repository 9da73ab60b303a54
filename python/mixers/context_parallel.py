"""Context parallelism in PyTorch: one sequence split over the ranks of a ``torch.distributed``
process group, each rank holding a contiguous part of the tokens (in rank order), for the
log-linear base mixers (``linear-attention``, ``mamba2``, ``gated-deltanet``), their lifts and
the GLR, with autograd.

The algorithm is the library's (docs/math.md §7.3, ``mixers::context_parallel`` in Rust): a
part maps its start state affinely, ``S_end = S_start @ P + L`` (``S [B, H, V, K]``), and its
output is affine in it too, ``y_t = y_t^loc + S_start · r_t``, where ``y^loc`` is the part run
from zeros and ``r_t`` what a unit start state adds to ``y_t`` (its *reach*). Each rank computes
``(L, P)`` and ``(y^loc, r)`` in one run, the ranks all-gather ``(L, P)``, and each chains the
earlier ranks' maps from the initial state to its start state ``S_r`` and adds ``S_r · r_t`` to
``y^loc`` (no second run). For gated DeltaNet the run is the part's with ``v`` widened by ``K``
zero columns from the state ``[0; I]``: its end state is ``[L; P]`` and the widened columns of
``y_t`` are ``r_t = σ P_{≤t} q_t``. For Mamba-2 and linear attention ``P = e^{G_T} I`` and
``r_t = σ e^{G_t} q_t`` are closed forms (``G`` the running sum of ``g``, zero for linear
attention), so the run is the part's own. The runs are the package's ops, and the all-gather is
``torch.distributed.nn.functional.all_gather``, which is differentiable, so ``loss.backward()``
on every rank gives every rank's input gradients (and the initial state's) through the other
ranks' parts, at the cost of the one run's backward. Only states and transitions cross ranks
(``O(N·B·H·K·(K + V))`` per call), never tokens.

The lifts (``loglinear-attention``, ``loglinear-mamba2``, ``loglinear-gated-deltanet``) carry
Fenwick level states ``S [B, H, L, V, K]`` and a position (a state dict, docs/python.md): a
part maps its start levels to its end levels, start slot ``i`` landing in one end slot times the
base map (docs/math.md §7.3), so its transition is read off one run from a block-identity
state in the slots that are live at its start position (bit ``i`` of the position set), with
``v`` widened by ``L·K`` zero columns, whose ``y`` columns are each slot's reach; the ranks first
all-gather their parts' lengths, which give every rank its start position.

The GLR's state is its kept stream (``y``, or ``x`` with the pattern on ``A``, both with
``on="both"``) ``[B, R, C]`` and a position: a part's map is linear per channel in the start
rows (the streams stacked, ``N = S·R`` rows for ``S`` streams), ``tr [B, N, C, N]``, read off
one run in which every channel is repeated ``N`` times with ``x = 0``, copy ``C + c·N + i``
started from 1 in row ``i`` for every row that holds a value at the start position
(``_mixers.glr_kept_rows``); that copy's ``y`` is row ``i``'s reach in channel ``c``.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._torch_api import run

_BASES = ("linear-attention", "mamba2", "gated-deltanet")
_LIFTS = ("loglinear-attention", "loglinear-mamba2", "loglinear-gated-deltanet")


def context_parallel(name: str, config: Optional[dict] = None, *, group=None,
                     initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                     **inputs):
    """This rank's ``y`` for its part ``inputs`` (``[B, T_r, H, D]``, ``T_r ≥ 1``) of a sequence
    split over the ranks of ``group`` (default: the default group), started from
    ``initial_state`` (``S [B, H, V, K]``, the same on every rank; ``None``: zeros). With
    ``output_final_state`` also the state at the end of this rank's part (the last rank's is the
    sequence's final state). Every rank of the group calls it together."""
    if name not in _BASES + _LIFTS + ("glr",):
        raise NotImplementedError(
            f"context parallelism in PyTorch covers {', '.join(_BASES + _LIFTS)} and glr; `{name}` is not one "
            "of them")
    if inputs["x" if name == "glr" else "v"].shape[1] == 0:
        raise ValueError("context parallelism: every rank's part needs at least one token")
    if name in _LIFTS:
        return _lifted(name, config, group, initial_state, output_final_state, inputs)
    if name == "glr":
        return _glr(name, config, group, initial_state, output_final_state, inputs)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    b, t, h, dk = k.shape
    work = torch.float64 if v.dtype == torch.float64 else torch.float32
    dv = v.shape[-1]
    zero = torch.zeros(b, h, dv, dk, dtype=work, device=v.device)
    s0 = zero if initial_state is None else initial_state.to(work)
    if name != "gated-deltanet":
        # P = e^{G_T} I is a number per head: one run from zeros gives y_loc and L, and the
        # start state reaches y_t through σ e^{G_t} q_t.
        y_loc, local = _agreed(lambda: run(name, config, output_final_state=True, **inputs), group, v.device)
        logs = inputs["g"].to(work).cumsum(1) if "g" in inputs else torch.zeros(b, t, h, dtype=work, device=v.device)
        scale = float((config or {}).get("scale", 1.0))
        reach = scale * logs.exp().unsqueeze(-1) * q.to(work)
        decay = logs[:, -1].exp()[:, :, None, None].expand(b, h, 1, dk)
        # [L; e^{G_T}] stacked on the state's row axis.
        end = torch.cat([local.to(work), decay], dim=2)
        step = _scaled_step(dv)
    else:
        # L, P and the start state's reach from one run: v widened by K zero columns, from the
        # state [0; I] (each row of a state evolves on its own, so the end state is [L; P] and
        # the widened columns of y_t are σ P_{≤t} q_t).
        eye = torch.eye(dk, dtype=work, device=v.device).expand(b, h, dk, dk)
        widened = dict(inputs, v=torch.cat([v, v.new_zeros(b, t, h, dk)], dim=-1))
        y_w, end = _agreed(lambda: run(name, config, initial_state=torch.cat([zero, eye], dim=2).contiguous(),
                                       output_final_state=True, **widened), group, v.device)
        y_loc, reach, end = y_w[..., :dv], y_w[..., dv:].to(work), end.to(work)
        step = _product_step(dv)
    s = _chain(end, s0, step, group)
    y = (y_loc.to(work) + torch.einsum("bhvk,bthk->bthv", s, reach)).to(y_loc.dtype)
    return (y, step(s, end)) if output_final_state else y


def _scaled_step(dv):
    """The chain's step for an end ``[L; e^{G_T}]``: ``s ↦ e^{G_T} s + L``."""
    return lambda s, e: e[:, :, dv:dv + 1, :1] * s + e[:, :, :dv]


def _product_step(dv):
    """The chain's step for an end ``[L; P]``: ``s ↦ s P + L``."""
    return lambda s, e: s @ e[:, :, dv:] + e[:, :, :dv]


def _chain(end, s, step, group):
    """This rank's start state: the ranks' widened end states ``end`` all-gathered in one
    collective (so that every rank's backward runs the same collectives in the same order), and
    the earlier ranks' maps applied to ``s`` in rank order, ``s = step(s, their end)``. Every
    rank's result depends on the collective (rank 0's adds exact zeros), so that every rank takes
    part in its backward."""
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_gather

    gathered = all_gather(end.contiguous(), group=group)
    for r in range(dist.get_rank(group)):
        s = step(s, gathered[r])
    return s + 0.0 * torch.stack(gathered).sum()


def _agreed(step, group, device):
    """``step()``'s result, after every rank has learned whether any rank's step failed (before
    the data's collective, so that a failure on one rank never leaves the others waiting in it)."""
    import torch.distributed as dist

    try:
        out, error = step(), None
    except Exception as e:  # noqa: BLE001 - reported to every rank below, then raised here
        out, error = None, e
    flags = [torch.zeros(1, dtype=torch.int32, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(flags, torch.tensor([int(error is not None)], dtype=torch.int32, device=device), group=group)
    failed = [r for r, f in enumerate(flags) if f.item()]
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(f"context parallel: rank {failed[0]} failed (its own error says why)")
    return out


def _start_positions(t, b, initial_state, group, device):
    """Every batch row's start position of this rank's part: the initial state's position (0
    without one) plus the earlier ranks' lengths (all-gathered on ``device``, the inputs' device:
    NCCL gathers CUDA tensors only)."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([t], dtype=torch.int64, device=device), group=group)
    p0 = [0] * b if initial_state is None else [int(p) for p in initial_state["position"].tolist()]
    return [p + sum(int(n) for n in lengths[:rank]) for p in p0]


def _glr(name, config, group, initial_state, output_final_state, inputs):
    """:func:`context_parallel` of the GLR (module documentation)."""
    import json

    from . import _mixers

    x = inputs["x"]
    b, t, c = x.shape
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    cfg = json.dumps(config or {}, sort_keys=True)
    shapes = {k: list(v.shape) for k, v in inputs.items()}
    layout = _mixers.state_shapes(name, shapes, cfg)
    # The kept streams (one, or x and y with the pattern on both sides), stacked on the row axis.
    streams = [k for k in layout if k != "position"]
    r = layout[streams[0]][1]
    n = len(streams) * r
    start = _start_positions(t, b, initial_state, group, x.device)
    s = torch.zeros(b, n, c, dtype=work, device=x.device) if initial_state is None else \
        torch.cat([initial_state[k].to(work) for k in streams], dim=1)
    basis = torch.zeros(b, n, c + c * n, dtype=work, device=x.device)
    for bi, p in enumerate(start):
        for i, live in enumerate(_mixers.glr_kept_rows(name, shapes, p, cfg)):
            if live:
                for j in range(i, n, r):
                    basis[bi, j, c + j::n] = 1.0
    position = torch.tensor(start, dtype=work, device=x.device)

    def split(rows):
        return {k: rows[:, i * r:(i + 1) * r].contiguous() for i, k in enumerate(streams)} | {"position": position}

    # Channel C + c·N + i repeats channel c (its input x zero): its y is what a unit in row i adds
    # to channel c's outputs.
    widened = {k: torch.cat([v, (torch.zeros_like(v) if k == "x" else v).repeat_interleave(n, dim=-1)], dim=-1)
               for k, v in inputs.items()}

    def widened_run():
        y_w, fin = run(name, config, initial_state=split(basis), output_final_state=True, **widened)
        return y_w, torch.cat([fin[k] for k in streams], dim=1)

    y_w, end = _agreed(widened_run, group, x.device)
    end = end.to(work)

    def step(s, e):
        return torch.einsum("bjci,bic->bjc", e[:, :, c:].reshape(b, n, c, n), s) + e[:, :, :c]

    s = _chain(end, s, step, group)
    reach = y_w[..., c:].to(work).reshape(b, t, c, n)
    y = (y_w[..., :c].to(work) + torch.einsum("btci,bic->btc", reach, s)).to(y_w.dtype)
    if not output_final_state:
        return y
    fin = split(step(s, end))
    return y, dict(fin, position=position + t)


def _lifted(name, config, group, initial_state, output_final_state, inputs):
    """:func:`context_parallel` of a lift (module documentation): level states ``S [B, H, L, V, K]``
    and positions ``[B]``."""
    k, v = inputs["k"], inputs["v"]
    b, t, h, dk = k.shape
    dv, nl = v.shape[-1], inputs["lambda"].shape[-1]
    work = torch.float64 if v.dtype == torch.float64 else torch.float32
    start = _start_positions(t, b, initial_state, group, v.device)
    s = torch.zeros(b, h, nl, dv, dk, dtype=work, device=v.device) if initial_state is None else \
        initial_state["S"].to(work)
    # The block-identity state: slot i holds I in rows V + i·K … where bit i of the start is set.
    basis = torch.zeros(b, h, nl, dv + nl * dk, dk, dtype=work, device=v.device)
    for bi, p in enumerate(start):
        for i in range(nl):
            if (p >> i) & 1:
                basis[bi, :, i, dv + i * dk: dv + (i + 1) * dk] = torch.eye(dk, dtype=work)
    position = torch.tensor(start, dtype=work, device=v.device)
    widened = dict(inputs, v=torch.cat([v, v.new_zeros(b, t, h, nl * dk)], dim=-1))

    def widened_run():
        y_w, fin = run(name, config, initial_state={"S": basis, "position": position}, output_final_state=True,
                       **widened)
        return y_w, fin["S"]

    y_w, end = _agreed(widened_run, group, v.device)
    end = end.to(work)

    def step(s, e):
        return torch.einsum("bhivk,bhjikc->bhjvc", s, e[:, :, :, dv:].reshape(b, h, nl, nl, dk, dk)) + e[:, :, :, :dv]

    s = _chain(end, s, step, group)
    # The widened columns of y_t for slot i: what a unit start slot i adds to y_t.
    reach = y_w[..., dv:].to(work).reshape(b, t, h, nl, dk)
    y = (y_w[..., :dv].to(work) + torch.einsum("bhivk,bthik->bthv", s, reach)).to(y_w.dtype)
    return (y, {"S": step(s, end), "position": position + t}) if output_final_state else y
