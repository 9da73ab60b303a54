"""Shared helpers of the Python package's tests: valid random inputs drawn by the library's own
generator (docs/math.md §4), and the list of registered mixers with a config each."""

import json

import pytest
import torch

import mixers


def inputs(name, config=None, dtype=torch.float64, grad=False, **sizes):
    """Valid random inputs of mixer ``name`` as tensors (``requires_grad`` with ``grad``)."""
    arrays = mixers.random_inputs(name, config, **sizes)
    return {k: torch.from_numpy(v).to(dtype).requires_grad_(grad) for k, v in arrays.items()}


def registered():
    """``(name, config)`` for every registered mixer: its first example config, else ``{}``."""
    out = []
    for m in mixers.list()["mixers"]:
        examples = m.get("examples") or ["{}"]
        out.append((m["name"], json.loads(examples[0])))
    return out


def cpu_forms(name):
    """The forms mixer ``name`` (default config) runs on the CPU."""
    for m in mixers.list()["mixers"]:
        if m["name"] == name:
            return m["backends"]["cpu"]
    raise KeyError(name)


MIXERS = registered()
STATEFUL = ["linear-attention", "mamba2", "gated-deltanet"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
