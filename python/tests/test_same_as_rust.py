"""The PyTorch ops compute what the Rust library computes, bit for bit: the same inputs through
the `mixers run` command line (an .npz in, an .npz out), forward and backward, plain, from a
state and packed. The command line is `$MIXERS_CLI`, else the `mixers` binary that
`cargo test --workspace` leaves in target/debug (then target/release), else
`cargo build -p mixers-cli` builds it."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import mixers

from conftest import inputs

ROOT = Path(__file__).resolve().parents[2]


def cli() -> str:
    if os.environ.get("MIXERS_CLI"):
        return os.environ["MIXERS_CLI"]
    for profile in ["debug", "release"]:
        exe = ROOT / "target" / profile / "mixers"
        if exe.exists():
            return str(exe)
    if shutil.which("cargo") is None:
        pytest.skip("no `mixers` command line and no cargo to build it")
    subprocess.run(["cargo", "build", "-q", "-p", "mixers-cli"], cwd=ROOT, check=True)
    return str(ROOT / "target" / "debug" / "mixers")


def run_cli(tmp_path, name, config, x, dy=None, extra=(), form="fast"):
    np.savez(tmp_path / "in.npz", **{k: v.detach().numpy() for k, v in x.items()})
    cmd = [cli(), "run", "--mixer", name, "--config", json.dumps(config), "--inputs", str(tmp_path / "in.npz"),
           "--backend", "cpu", "--form", form, "--out", str(tmp_path / "out.npz"), *extra]
    if dy is not None:
        np.savez(tmp_path / "dy.npz", **{k: v.detach().numpy() for k, v in dy.items()})
        cmd += ["--grad", str(tmp_path / "dy.npz")]
    subprocess.run(cmd, check=True, capture_output=True)
    with np.load(tmp_path / "out.npz") as f:
        return {k: torch.from_numpy(f[k]) for k in f.files}


CASES = [
    ("mamba2", {}),
    ("gated-deltanet", {"chunk": 4}),
    ("attention", {"window": 3}),
    ("loglinear-mamba2", {}),
    ("loglinear-gated-deltanet", {}),
    ("glr", {"pattern": "sq1"}),
    ("toeplitz", {"heads": 2}),
    ("fibonacci-glr", {}),
]


@pytest.mark.parametrize("name,config", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward_equal_the_command_line(tmp_path, name, config):
    x = inputs(name, config, dtype=torch.float32, grad=True, batch=2, seq=11, channels=4, heads=2, dk=4, dv=3)
    y = mixers.run(name, config, **x)
    dy = torch.randn_like(y)
    y.backward(dy)
    out = run_cli(tmp_path, name, config, x, {"dy": dy})
    assert torch.equal(y.detach(), out["y"])
    for n, t in x.items():
        assert torch.equal(t.grad, out["d_" + n]), n


@pytest.mark.parametrize("form", ["fast", "recurrent"])
def test_states_and_packed_equal_the_command_line(tmp_path, form):
    x = inputs("gated-deltanet", dtype=torch.float32, grad=True, batch=1, seq=10, heads=2, dk=4, dv=3)
    cu = [0, 3, 10]
    s0 = torch.randn(2, 2, 3, 4, requires_grad=True)
    y, s = mixers.gated_delta_rule(**x, form=form, initial_state=s0, output_final_state=True,
                                   cu_seqlens=torch.tensor(cu))
    dy, ds = torch.randn_like(y), torch.randn_like(s)
    torch.autograd.backward([y, s], [dy, ds])
    with_state = dict(x, initial_state=s0)
    out = run_cli(tmp_path, "gated-deltanet", {}, with_state, {"dy": dy, "d_final_state": ds},
                  extra=["--cu-seqlens", ",".join(map(str, cu))], form=form)
    assert torch.equal(y.detach(), out["y"])
    assert torch.equal(s.detach(), out["final_state"])
    assert torch.equal(s0.grad, out["d_initial_state"])
    for n, t in x.items():
        assert torch.equal(t.grad, out["d_" + n]), n
