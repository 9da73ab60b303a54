"""Context parallelism in PyTorch (``mixers.context_parallel``): 2 and 3 ranks of a gloo process
group (processes on this machine) give one process's ``y``, final state and gradients (every
input's, and the initial state's summed over the ranks), float64, for the three base mixers; the
other mixers refused."""

import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mixers
from conftest import inputs

SIZES = dict(batch=2, heads=2, dk=5, dv=7)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _case(name, seq):
    """The whole sequence's inputs, initial state and cotangents (float64, fixed seed)."""
    x = inputs(name, seq=seq, **SIZES)
    g = torch.Generator().manual_seed(3)
    b, _, h, dk = x["k"].shape
    s0 = torch.randn(b, h, x["v"].shape[-1], dk, dtype=torch.float64, generator=g)
    dy = torch.randn(x["v"].shape, dtype=torch.float64, generator=g)
    df = torch.randn(s0.shape, dtype=torch.float64, generator=g)
    return x, s0, dy, df


def _rank(rank, world, port, name, seq, cuts, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        x, s0, dy, df = _case(name, seq)
        edges = [0, *cuts, seq]
        part = slice(edges[rank], edges[rank + 1])
        mine = {k: v[:, part].clone().requires_grad_() for k, v in x.items()}
        s0 = s0.clone().requires_grad_()
        y, fin = mixers.context_parallel(name, {"scale": 0.5}, initial_state=s0, output_final_state=True, **mine)
        loss = (y * dy[:, part]).sum() + ((fin * df).sum() if rank == world - 1 else 0.0)
        loss.backward()
        torch.save({"y": y.detach(), "fin": fin.detach(), "s0_grad": s0.grad,
                    "grads": {k: v.grad for k, v in mine.items()}}, os.path.join(out, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("cuts", [[30], [1, 50]])
@pytest.mark.parametrize("name", ["linear-attention", "mamba2", "gated-deltanet"])
def test_ranks_equal_one_process(name, cuts):
    seq = 77
    world = len(cuts) + 1
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(world, _free_port(), name, seq, cuts, out), nprocs=world, join=True)
        parts = [torch.load(os.path.join(out, f"{r}.pt")) for r in range(world)]
    x, s0, dy, df = _case(name, seq)
    whole = {k: v.clone().requires_grad_() for k, v in x.items()}
    s0 = s0.clone().requires_grad_()
    y, fin = mixers.run(name, {"scale": 0.5}, initial_state=s0, output_final_state=True, **whole)
    ((y * dy).sum() + (fin * df).sum()).backward()
    close = dict(rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(torch.cat([p["y"] for p in parts], dim=1), y.detach(), **close)
    torch.testing.assert_close(parts[-1]["fin"], fin.detach(), **close)
    for k, v in whole.items():
        torch.testing.assert_close(torch.cat([p["grads"][k] for p in parts], dim=1), v.grad, **close)
    torch.testing.assert_close(sum(p["s0_grad"] for p in parts), s0.grad, **close)


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
