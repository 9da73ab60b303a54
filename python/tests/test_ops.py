"""Every registered mixer's op: torch.library.opcheck (schema, fake tensors, autograd
registration, AOT dispatch) and torch.autograd.gradcheck in float64 against finite
differences, plain, from a state and over packed sequences."""

import json

import numpy as np
import pytest
import torch

import mixers
from mixers._ops import mixer_op

from conftest import MIXERS, STATEFUL, cpu_forms, inputs

SMALL = dict(batch=2, seq=6, channels=4, heads=2, dk=3, dv=2)


def op_args(name, config, x, form="fast", initial=None, cu=None, final=False, precision="exact"):
    names = list(x)
    return ([x[n] for n in names], names, initial, cu, final, json.dumps(config), form, "cpu", precision)


def test_every_mixer_has_an_op():
    names = [n for n, _ in MIXERS]
    for builtin in ["attention", "linear-attention", "mamba2", "gated-deltanet", "loglinear-mamba2",
                    "loglinear-gated-deltanet", "loglinear-attention", "glr", "toeplitz"]:
        assert builtin in names
    assert "fibonacci-glr" in names  # the example plugin linked into the extension
    assert hasattr(torch.ops.mixers, "gated_deltanet") and hasattr(torch.ops.mixers, "mamba2_backward")


def best_form(name):
    """``fast`` where the mixer has it on the CPU, else its last form there."""
    forms = cpu_forms(name)["forms"]
    return "fast" if "fast" in forms else forms[-1]


@pytest.mark.parametrize("name,config", MIXERS, ids=[n for n, _ in MIXERS])
def test_opcheck(name, config):
    x = inputs(name, config, grad=True, **SMALL)
    torch.library.opcheck(mixer_op(name), op_args(name, config, x, form=best_form(name)))


@pytest.mark.parametrize("name", STATEFUL)
def test_opcheck_state_and_packed(name):
    x = inputs(name, grad=True, **dict(SMALL, batch=1, seq=7))
    h, dk, dv = SMALL["heads"], SMALL["dk"], SMALL["dv"]
    cu = torch.tensor([0, 3, 3, 7])
    s0 = torch.randn(3, h, dv, dk, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(mixer_op(name), op_args(name, {}, x, initial=s0, cu=cu, final=True))
    s0 = torch.randn(1, h, dv, dk, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(mixer_op(name), op_args(name, {}, x, initial=s0, final=True))


@pytest.mark.parametrize("name,config", MIXERS, ids=[n for n, _ in MIXERS])
def test_gradcheck(name, config):
    x = inputs(name, config, grad=True, **SMALL)
    names = list(x)

    def f(*tensors):
        return mixers.run(name, config, form=best_form(name), **dict(zip(names, tensors)))

    assert torch.autograd.gradcheck(f, tuple(x[n] for n in names), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", STATEFUL)
@pytest.mark.parametrize("form", ["fast", "recurrent"])
def test_gradcheck_through_states(name, form):
    x = inputs(name, grad=True, **SMALL)
    names = list(x)
    s0 = torch.randn(SMALL["batch"], SMALL["heads"], SMALL["dv"], SMALL["dk"], dtype=torch.float64,
                     requires_grad=True)

    def f(s, *tensors):
        return mixers.run(name, form=form, initial_state=s, output_final_state=True, **dict(zip(names, tensors)))

    assert torch.autograd.gradcheck(f, (s0, *[x[n] for n in names]), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", STATEFUL)
def test_gradcheck_packed_with_states(name):
    x = inputs(name, grad=True, **dict(SMALL, batch=1, seq=9))
    names = list(x)
    cu = torch.tensor([0, 4, 4, 8])  # an empty sequence, and a row past the last offset
    s0 = torch.randn(3, SMALL["heads"], SMALL["dv"], SMALL["dk"], dtype=torch.float64, requires_grad=True)

    def f(s, *tensors):
        return mixers.run(name, cu_seqlens=cu, initial_state=s, output_final_state=True, **dict(zip(names, tensors)))

    assert torch.autograd.gradcheck(f, (s0, *[x[n] for n in names]), atol=1e-6, rtol=1e-5)


def test_packed_equals_sequences_one_by_one():
    x = inputs("gated-deltanet", dtype=torch.float32, **dict(SMALL, batch=1, seq=9))
    cu = [0, 4, 9]
    y, s = mixers.gated_delta_rule(**x, cu_seqlens=torch.tensor(cu), output_final_state=True)
    for i in range(2):
        part = {n: t[:, cu[i]:cu[i + 1]] for n, t in x.items()}
        yi, si = mixers.gated_delta_rule(**part, output_final_state=True)
        assert torch.equal(y[:, cu[i]:cu[i + 1]], yi)
        assert torch.equal(s[i:i + 1], si)


def test_compiles_without_graph_breaks():
    x = inputs("mamba2", dtype=torch.float32, grad=True, **SMALL)

    def f(q, k, v, g):
        return (mixers.mamba2(q, k, v, g) * 2).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss = compiled(**x)
    loss.backward()
    want = {n: t.grad.clone() for n, t in x.items()}
    for t in x.values():
        t.grad = None
    f(**x).backward()
    for n, t in x.items():
        assert torch.equal(t.grad, want[n]), n


def test_half_inputs_compute_in_float32():
    x = inputs("mamba2", dtype=torch.float32, **SMALL)
    y32 = mixers.mamba2(**x)
    xb = {n: t.to(torch.bfloat16) for n, t in x.items()}
    yb = mixers.mamba2(**xb)
    assert yb.dtype == torch.bfloat16
    want = mixers.mamba2(**{n: t.float() for n, t in xb.items()}).to(torch.bfloat16)
    assert torch.equal(yb, want)
    assert (yb.float() - y32).abs().max() < 0.1


def test_precision_modes():
    x = inputs("mamba2", dtype=torch.float32, **SMALL)
    exact = mixers.mamba2(**x)
    assert torch.equal(mixers.mamba2(**x, precision="tf32"), exact)  # the CPU has no tensor cores
    b = mixers.mamba2(**x, precision="bf16")
    assert torch.equal(b, b.to(torch.bfloat16).float())  # y stored in bf16
    assert (b - exact).abs().max() < 0.05 * exact.abs().max()


def test_the_spec_says_which_mixers_save_for_their_cuda_backward():
    """Attention's CUDA forward run for a backward saves its row statistics (the eager autograd
    node on CUDA tensors keeps them; docs/python.md); the recurrent families save nothing. A static
    property of the registration: the same answer on a machine without a GPU."""
    from mixers import _ops

    assert _ops.spec("attention", "{}")["cuda_saves_for_backward"]
    assert _ops.spec("local-attention", '{"window": 4}')["cuda_saves_for_backward"]
    for name in ("mamba2", "gated-deltanet", "glr", "toeplitz", "loglinear-mamba2"):
        assert not _ops.spec(name, "{}")["cuda_saves_for_backward"], name


def test_autograd_gives_the_glr_backward_the_forwards_output(monkeypatch):
    """The GLR's backward reads ``y`` (for ``d_beta``): its autograd node keeps the forward's
    output and passes it (the library's backward then skips its own forward), with the same
    gradients as the library's backward without it, eager and under ``torch.compile``, and not
    once it is changed in place; Mamba-2's does not read it and gets none."""
    from mixers import _ops

    assert _ops.spec("glr", "{}")["backward_reads_output"]
    assert not _ops.spec("mamba2", "{}")["backward_reads_output"]
    seen = []
    library_backward = _ops._mixers.backward

    def spy(name, x, *args, **kwargs):
        seen.append((name, sorted(x)))
        return library_backward(name, x, *args, **kwargs)

    monkeypatch.setattr(_ops._mixers, "backward", spy)
    for name in ["glr", "mamba2"]:
        x = inputs(name, grad=True, **dict(SMALL, seq=37))
        y = mixers.run(name, **x)
        dy = torch.randn_like(y)
        got = torch.autograd.grad(y, list(x.values()), dy)
        assert seen[-1] == (name, sorted(list(x) + (["y"] if name == "glr" else [])))
        want = mixers.backward(name, dy, **{n: t.detach() for n, t in x.items()})
        assert seen[-1] == (name, sorted(x))
        for n, g in zip(x, got):
            assert torch.equal(g, want["d_" + n]), f"{name}: d_{n}"
    # Changed in place after the call (a residual added to it), y is not given: the backward runs
    # the forward again, with the same gradients.
    x = inputs("glr", grad=True, **dict(SMALL, seq=37))
    y = mixers.run("glr", **x)
    dy = torch.randn_like(y)
    want = torch.autograd.grad(y, list(x.values()), dy, retain_graph=True)
    assert seen[-1] == ("glr", sorted(list(x) + ["y"]))
    y += 1.0
    got = torch.autograd.grad(y, list(x.values()), dy)
    assert seen[-1] == ("glr", sorted(x))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # On the CPU outside the exact mode the backward would not be given y: the node keeps none.
    x = inputs("glr", dtype=torch.float32, grad=True, **dict(SMALL, seq=37))
    assert hasattr(mixers.run("glr", **x).grad_fn, "kept")
    assert not hasattr(mixers.run("glr", precision="tf32", **x).grad_fn, "kept")
    # The op's own autograd formula (what torch.compile traces) keeps it too.
    x = inputs("glr", grad=True, **dict(SMALL, seq=37))
    torch.compile(lambda **x: mixers.run("glr", **x), fullgraph=True)(**x).sum().backward()
    assert seen[-1] == ("glr", sorted(list(x) + ["y"]))
    # The numpy layer passes a given y on: the same gradients, no d_y.
    xn = mixers.random_inputs("glr", None, batch=1, seq=20, channels=3)
    yn = mixers.run_numpy("glr", **xn)
    plain = mixers.backward("glr", np.cos(yn), **xn)
    given = mixers.backward("glr", np.cos(yn), **xn, y=yn)
    assert seen[-1] == ("glr", sorted(list(xn) + ["y"]))
    assert sorted(given) == sorted(plain) and all(np.array_equal(given[k], plain[k]) for k in plain)
