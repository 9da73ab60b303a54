"""States of several tensors through the PyTorch functions (docs/python.md): the lifts' level
states and position, the GLR's past outputs, attention's KV cache and the Toeplitz mixer's past
inputs, as dicts of tensors. A sequence run in two parts, the second from the first's final
state, equals the whole run, forward and backward (the gradients flow through the state)."""

import pytest
import torch

import mixers
from conftest import inputs

SIZES = dict(batch=2, heads=2, dk=4, dv=3, channels=5)
CASES = [
    "loglinear-mamba2",
    "loglinear-attention",
    "loglinear-gated-deltanet",
    "glr",
    "attention",
    "toeplitz",
    "log-distance-mamba2",
]
# Mixers whose state is a cache of past tokens with a capacity: attention, and a lift under a
# mask other than Fenwick (the example plugin's), which also caches the decays.
CACHED = {"attention": ("length", []), "log-distance-mamba2": ("position", ["g"])}
# The plugin's lift has no fast form (it needs the Fenwick mask).
FORM = {"log-distance-mamba2": "parallel"}


def _per_token(name):
    return {i["name"] for i in mixers.spec(name)["inputs"] if i["per_token"]}


def _split(name, x, a):
    tok = _per_token(name)
    first = {k: (v[:, :a] if k in tok else v) for k, v in x.items()}
    rest = {k: (v[:, a:] if k in tok else v) for k, v in x.items()}
    return first, rest


def _start(name, x, t):
    """A fresh state where the mixer needs one to say its capacity (a zero cache of capacity
    ``t``), else ``None``."""
    if name not in CACHED:
        return None
    count, more = CACHED[name]
    b, _, h, dk = x["k"].shape
    dv = x["v"].shape[-1]
    z = x["k"].new_zeros
    return {"k": z(b, t, h, dk), "v": z(b, t, h, dv), count: z(b), **{n: z(b, t, h) for n in more}}


@pytest.mark.parametrize("a", [1, 9, 16])
@pytest.mark.parametrize("name", CASES)
def test_two_parts_from_a_state_dict_equal_the_whole_run(name, a):
    t = 21
    x = inputs(name, seq=t, grad=True, **SIZES)
    r = torch.randn(x[mixers.spec(name)["mixed"]].shape, dtype=torch.float64)
    form = FORM.get(name, "fast")
    start = _start(name, x, t)
    whole = mixers.run(name, initial_state=start, form=form, **x) if start else mixers.run(name, form=form, **x)
    (whole * r).sum().backward()
    want = {k: v.grad.clone() for k, v in x.items()}
    for v in x.values():
        v.grad = None
    first, rest = _split(name, x, a)
    y1, s = mixers.run(name, initial_state=_start(name, x, t), output_final_state=True, form=form, **first)
    assert isinstance(s, dict) and len(s) > 1, f"{name}: a state of several tensors comes back as a dict"
    y2, s2 = mixers.run(name, initial_state=s, output_final_state=True, form=form, **rest)
    assert sorted(s2) == sorted(s)
    y = torch.cat([y1, y2], dim=1)
    assert torch.allclose(y, whole, rtol=1e-10, atol=1e-12), f"{name}: {(y - whole).abs().max().item()}"
    (y * r).sum().backward()
    for k, v in x.items():
        assert v.grad is not None, f"{name}: no gradient of {k} through the split run"
        assert torch.allclose(v.grad, want[k], rtol=1e-9, atol=1e-11), f"{name} d_{k}"


def test_a_state_dict_is_checked():
    x = inputs("loglinear-mamba2", seq=10, **SIZES)
    _, s = mixers.run("loglinear-mamba2", output_final_state=True, **x)
    with pytest.raises(ValueError, match="position"):
        mixers.run("loglinear-mamba2", initial_state={"S": s["S"]}, **x)
    with pytest.raises(ValueError, match="dict"):
        mixers.run("loglinear-mamba2", initial_state=s["S"], **x)
    with pytest.raises(TypeError, match="dict"):
        mixers.run("loglinear-mamba2", initial_state=[s["S"]], **x)
    # A one-tensor state may be a dict too.
    xm = inputs("mamba2", seq=10, **SIZES)
    _, sm = mixers.run("mamba2", output_final_state=True, **xm)
    y1 = mixers.run("mamba2", initial_state={"S": sm}, **xm)
    assert torch.equal(y1, mixers.run("mamba2", initial_state=sm, **xm))


def test_a_state_dict_compiles_without_graph_breaks():
    x = inputs("loglinear-mamba2", seq=12, grad=True, **SIZES)

    def f(first, rest):
        y1, s = mixers.run("loglinear-mamba2", output_final_state=True, **first)
        y2, s2 = mixers.run("loglinear-mamba2", initial_state=s, output_final_state=True, **rest)
        return (torch.cat([y1, y2], dim=1) ** 2).sum() + s2["S"].sum()

    first, rest = _split("loglinear-mamba2", x, 5)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss = compiled(first, rest)
    loss.backward()
    want = {n: t.grad.clone() for n, t in x.items()}
    for t in x.values():
        t.grad = None
    assert torch.equal(f(first, rest), loss.detach())
    f(first, rest).backward()
    for n, t in x.items():
        assert torch.equal(t.grad, want[n]), n


@pytest.mark.parametrize("a", [1, 9, 16])
@pytest.mark.parametrize("config", [{"pattern": "pow2", "on": "both"},
                                    {"pattern": "sq1", "cache_efficient": True, "on": "both"}])
def test_a_glr_on_both_keeps_both_streams(config, a):
    """``on = "both"``: the state holds the past inputs ``x`` and outputs ``y``; two parts equal
    the whole run, forward and backward."""
    t = 21
    x = inputs("glr", config, seq=t, grad=True, **SIZES)
    r = torch.randn(x["x"].shape, dtype=torch.float64)
    whole = mixers.run("glr", config, **x)
    (whole * r).sum().backward()
    want = {k: v.grad.clone() for k, v in x.items()}
    for v in x.values():
        v.grad = None
    first, rest = _split("glr", x, a)
    y1, s = mixers.run("glr", config, output_final_state=True, **first)
    assert sorted(s) == ["position", "x", "y"]
    y2, _ = mixers.run("glr", config, initial_state=s, output_final_state=True, **rest)
    y = torch.cat([y1, y2], dim=1)
    assert torch.allclose(y, whole, rtol=1e-10, atol=1e-12), (y - whole).abs().max().item()
    (y * r).sum().backward()
    for k, v in x.items():
        assert torch.allclose(v.grad, want[k], rtol=1e-9, atol=1e-11), f"d_{k}"


@pytest.mark.parametrize("name", ["mamba2", "loglinear-mamba2", "attention"])
def test_calls_without_a_gradient_take_no_autograd_node(name, monkeypatch):
    """A call from a state or over a packed batch that needs no gradient (no input or state
    requires one, or grad mode off) runs the op's forward implementation without an autograd
    ``Function``: no ``grad_fn``, the same values as the call whose inputs require a gradient
    (which does go through the ``Function`` and has one)."""
    from mixers import _ops
    eager = []
    real = _ops._Eager.apply
    monkeypatch.setattr(_ops._Eager, "apply", lambda *a: (eager.append(1), real(*a))[1])
    t = 12
    x = inputs(name, seq=t, **SIZES)
    start = _start(name, x, t)
    y, s = mixers.run(name, initial_state=start, output_final_state=True, **x)
    assert y.grad_fn is None and not eager, f"{name}: an autograd node without a gradient wanted"
    xg = {k: v.clone().requires_grad_() for k, v in x.items()}
    yg, sg = mixers.run(name, initial_state=start, output_final_state=True, **xg)
    assert yg.grad_fn is not None and eager == [1], f"{name}: no autograd node for a gradient"
    assert torch.equal(yg.detach(), y), f"{name}: the two paths differ"
    with torch.no_grad():
        yn, _ = mixers.run(name, initial_state=start, output_final_state=True, **xg)
    assert yn.grad_fn is None and eager == [1] and torch.equal(yn, y)
    if name != "attention":
        cu = torch.tensor([0, 5, 12])
        one = {k: v[:1] for k, v in x.items()}
        yp = mixers.run(name, cu_seqlens=cu, **one)
        assert yp.grad_fn is None and eager == [1], f"{name}: a packed call without a gradient"
