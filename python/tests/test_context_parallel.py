"""Context parallelism in PyTorch (``mixers.context_parallel``): 2 and 3 ranks of a gloo process
group (processes on this machine) give one process's ``y``, final state and gradients (every
input's, and the initial state's summed over the ranks), float64, for the three base mixers and
their lifts (level states and a position, from a prefix's final state), and the GLR (its kept
streams and a position, from a prefix's state; on B, on A and on both); the other mixers
refused."""

import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mixers
from conftest import inputs

SIZES = dict(batch=2, heads=2, dk=5, dv=7, channels=3)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _case(name, seq):
    """The whole sequence's inputs, initial state and cotangents (float64, fixed seed): a random
    ``S`` for a base mixer, a lift's state after a prefix of 13 tokens (a dict)."""
    g = torch.Generator().manual_seed(3)
    if name in _GLR:
        pre = inputs("glr", _config(name), seq=13 + seq, seed=5, **SIZES)
        x = {k: v[:, 13:].clone() for k, v in pre.items()}
        _, s0 = mixers.run("glr", _config(name), output_final_state=True, **{k: v[:, :13] for k, v in pre.items()})
        dy = torch.randn(x["x"].shape, dtype=torch.float64, generator=g)
        return x, s0, dy, {k: torch.randn(s0[k].shape, dtype=torch.float64, generator=g) for k in _keys(s0)}
    x = inputs(name, seq=seq, **SIZES)
    b, _, h, dk = x["k"].shape
    dy = torch.randn(x["v"].shape, dtype=torch.float64, generator=g)
    if name.startswith("loglinear-"):
        pre = inputs(name, seq=13 + seq, seed=5, **SIZES)
        x["lambda"] = pre["lambda"][:, 13:].clone()  # levels enough for the whole run
        _, s0 = mixers.run(name, _config(name), output_final_state=True,
                           **{k: v[:, :13] for k, v in pre.items()})
        df = {"S": torch.randn(s0["S"].shape, dtype=torch.float64, generator=g)}
        return x, s0, dy, df
    s0 = torch.randn(b, h, x["v"].shape[-1], dk, dtype=torch.float64, generator=g)
    df = torch.randn(s0.shape, dtype=torch.float64, generator=g)
    return x, s0, dy, df


_GLR = {"glr": {"pattern": "pow2"}, "glr/cache-efficient": {"pattern": "sq1", "cache_efficient": True},
        "glr/on-a": {"pattern": "pow2", "on": "a"},
        "glr/on-both": {"pattern": "sq1", "on": "both"},
        "glr/on-both-cache-efficient": {"pattern": "pow2", "cache_efficient": True, "on": "both"}}


def _config(case):
    return _GLR.get(case, {"scale": 0.5})


def _mixer(case):
    return case.split("/")[0]


def _keys(state):
    """A state dict's tensors that take a gradient (a lift's ``S``, the GLR's streams)."""
    return [k for k in state if k != "position"]


def _leaf(s0):
    """The initial state as autograd leaves (its position takes no gradient)."""
    if isinstance(s0, dict):
        return {k: (v.clone() if k == "position" else v.clone().requires_grad_()) for k, v in s0.items()}
    return s0.clone().requires_grad_()


def _fin_loss(fin, df):
    return sum((fin[k] * df[k]).sum() for k in _keys(fin)) if isinstance(fin, dict) else (fin * df).sum()


def _grad(s0):
    return torch.cat([s0[k].grad for k in _keys(s0)]) if isinstance(s0, dict) else s0.grad


def _value(fin):
    return torch.cat([fin[k].detach() for k in _keys(fin)]) if isinstance(fin, dict) else fin.detach()


def _to(obj, device):
    """A tensor, or a dict of tensors (``None`` kept), on ``device``."""
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return None if obj is None else obj.to(device)


def _rank(rank, world, port, name, seq, cuts, out, backend="gloo"):
    """One rank: its part on the CPU (gloo), or on ``cuda:<rank>`` (nccl); results saved on the CPU."""
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        x, s0, dy, df = (_to(o, device) for o in _case(name, seq))
        edges = [0, *cuts, seq]
        part = slice(edges[rank], edges[rank + 1])
        mine = {k: v[:, part].clone().requires_grad_() for k, v in x.items()}
        s0 = _leaf(s0)
        y, fin = mixers.context_parallel(_mixer(name), _config(name), initial_state=s0, output_final_state=True,
                                         **mine)
        loss = (y * dy[:, part]).sum() + (_fin_loss(fin, df) if rank == world - 1 else 0.0)
        loss.backward()
        torch.save(_to({"y": y.detach(), "fin": _value(fin), "s0_grad": _grad(s0)}, "cpu")
                   | {"grads": {k: v.grad.cpu() for k, v in mine.items()}}, os.path.join(out, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


_NAMES = ["linear-attention", "mamba2", "gated-deltanet", "loglinear-attention", "loglinear-mamba2",
          "loglinear-gated-deltanet", *_GLR]


@pytest.mark.parametrize("cuts", [[30], [1, 50]])
@pytest.mark.parametrize("name", _NAMES)
def test_ranks_equal_one_process(name, cuts):
    _check_ranks(name, cuts, "gloo")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2
                    or not dist.is_nccl_available(), reason="needs two CUDA devices and NCCL")
@pytest.mark.parametrize("name", _NAMES)
def test_ranks_on_two_gpus_equal_one_process(name):
    """Two ranks on two GPUs over NCCL (each process's CUDA backend on its rank's device), the
    lifts included (their run from a state on CUDA: docs/math.md §7.1)."""
    _check_ranks(name, [30], "nccl")


def _check_ranks(name, cuts, backend):
    seq = 77
    world = len(cuts) + 1
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(world, _free_port(), name, seq, cuts, out, backend), nprocs=world, join=True)
        parts = [torch.load(os.path.join(out, f"{r}.pt")) for r in range(world)]
    x, s0, dy, df = _case(name, seq)
    whole = {k: v.clone().requires_grad_() for k, v in x.items()}
    s0 = _leaf(s0)
    y, fin = mixers.run(_mixer(name), _config(name), initial_state=s0, output_final_state=True, **whole)
    ((y * dy).sum() + _fin_loss(fin, df)).backward()
    close = dict(rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(torch.cat([p["y"] for p in parts], dim=1), y.detach(), **close)
    torch.testing.assert_close(parts[-1]["fin"], _value(fin), **close)
    for k, v in whole.items():
        torch.testing.assert_close(torch.cat([p["grads"][k] for p in parts], dim=1), v.grad, **close)
    torch.testing.assert_close(sum(p["s0_grad"] for p in parts), _grad(s0), **close)


def _failing_rank(rank, world, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        x, _, _, _ = _case("mamba2", 20)
        mine = {k: v[:, rank * 10:(rank + 1) * 10].clone() for k, v in x.items()}
        if rank == 1:
            mine["g"] = mine["g"].abs() + 0.5  # a positive log decay: invalid
        try:
            mixers.context_parallel("mamba2", **mine)
            message = "no error"
        except Exception as e:  # noqa: BLE001 - the test reads what each rank raised
            message = f"{type(e).__name__}: {e}"
        with open(os.path.join(out, f"{rank}.txt"), "w") as f:
            f.write(message)
    finally:
        dist.destroy_process_group()


def test_a_failing_rank_fails_every_rank():
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_failing_rank, args=(2, _free_port(), out), nprocs=2, join=True)
        messages = [open(os.path.join(out, f"{r}.txt")).read() for r in range(2)]
    assert messages[1].startswith("ValueError") and "log-decay" in messages[1], messages
    assert messages[0] == "RuntimeError: context parallel: rank 1 failed (its own error says why)", messages


def test_other_mixers_are_refused():
    with pytest.raises(NotImplementedError, match="context parallelism"):
        mixers.context_parallel("attention", **inputs("attention", seq=4, **SIZES))
