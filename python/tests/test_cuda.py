"""The zero-copy CUDA path (mixers._cuda), on a machine with a CUDA device (skipped elsewhere):
results equal to the Rust CUDA path bit for bit and to the CPU backend within each precision
mode's tolerance, forward and backward; inputs read in place and outputs from PyTorch's
allocator; the op on a non-default stream, without waiting for it; CUDA-graph capture and
replay; torch.compile(fullgraph=True) without graph breaks; the per-call overhead over the
library's own call; parity with fla's forward where fla is importable."""

import math
import time

import pytest
import torch

import mixers
from mixers import _cuda, _ops

from conftest import inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# docs/design.md, precision modes: (relative RMS, max-abs scaled by max(1, max|reference|)).
TOL = {"exact": (1e-4, 1e-3), "tf32": (5e-3, 5e-2), "bf16": (2e-2, 1e-1)}
# Mixers with a CUDA `fast` form and backward.
MIXERS = ["gated-deltanet", "mamba2", "linear-attention", "attention", "glr", "toeplitz", "loglinear-attention",
          "loglinear-mamba2", "loglinear-gated-deltanet"]
SIZES = dict(batch=2, heads=2, dk=16, dv=16, channels=6)


def _inputs(name, seq, dtype=torch.float32, seed=0):
    x = inputs(name, dtype=torch.float64, seq=seq, seed=seed, **SIZES)
    return {k: v.to(dtype) for k, v in x.items()}


def _close(got, want, tol, what):
    """The library's comparison (mixer_core::Tolerance): relative RMS error, and max-abs error
    scaled by ``max(1, max|want|)``."""
    got, want = got.double().cpu(), want.double().cpu()
    err = got - want
    scale = want.pow(2).mean().sqrt().item() or 1.0
    rel = err.pow(2).mean().sqrt().item() / scale
    top = err.abs().max().item() / max(1.0, want.abs().max().item()) if err.numel() else 0.0
    assert rel <= tol[0] and top <= tol[1], f"{what}: rel RMS {rel:.3g}, scaled max-abs {top:.3g} (tolerance {tol})"


def _dev(x):
    return {k: v.cuda() for k, v in x.items()}


@pytest.mark.parametrize("precision", ["exact", "tf32", "bf16"])
@pytest.mark.parametrize("seq", [1, 65])
@pytest.mark.parametrize("name", MIXERS)
def test_forward_equals_the_rust_cuda_path_and_the_cpu(name, seq, precision):
    x = _inputs(name, seq)
    y = mixers.run(name, precision=precision, **_dev(x))
    assert y.is_cuda and y.dtype == torch.float32 and y.shape == x[mixers.spec(name)["mixed"]].shape
    rust = mixers.run_numpy(name, backend="cuda", precision=precision, **{k: v.numpy() for k, v in x.items()})
    assert torch.equal(y.cpu(), torch.from_numpy(rust)), f"{name}: not the Rust CUDA path's bits"
    cpu = mixers.run(name, precision=precision, **x)
    _close(y, cpu, TOL[precision], f"{name} T={seq} {precision} against the CPU")


@pytest.mark.parametrize("name", MIXERS)
def test_float64_forward_equals_the_rust_cuda_path(name):
    x = _inputs(name, 63, torch.float64)
    y = mixers.run(name, **_dev(x))
    rust = mixers.run_numpy(name, backend="cuda", **{k: v.numpy() for k, v in x.items()})
    assert y.dtype == torch.float64 and torch.equal(y.cpu(), torch.from_numpy(rust))


@pytest.mark.parametrize("precision", ["exact", "tf32", "bf16"])
@pytest.mark.parametrize("name", MIXERS)
def test_backward_equals_the_rust_cuda_path_and_the_cpu(name, precision):
    x = _inputs(name, 65)
    dev = {k: v.cuda().requires_grad_() for k, v in x.items()}
    y = mixers.run(name, precision=precision, **dev)
    dy = torch.randn(y.shape, dtype=torch.float64).float()
    y.backward(dy.cuda())
    # The reference: the CPU's f64 backward, on the bf16-rounded activations and dy in the bf16
    # mode (what the mode stores), so that the tolerance measures the arithmetic.
    rounded = {k: (v.bfloat16() if precision == "bf16" and k in ("x", "q", "k", "v") else v).double()
               for k, v in x.items()}
    dy_ref = (dy.bfloat16() if precision == "bf16" else dy).double()
    want = mixers.backward(name, dy_ref.numpy(), **{k: v.numpy() for k, v in rounded.items()})
    for k, v in dev.items():
        assert v.grad is not None and v.grad.dtype == torch.float32, f"{name}: no d_{k}"
        _close(v.grad, torch.from_numpy(want["d_" + k]), TOL[precision], f"{name} {precision} d_{k} against the CPU")
    if precision == "exact":
        rust = mixers.backward(name, dy.numpy(), backend="cuda", **{k: v.numpy() for k, v in x.items()})
        for k, v in dev.items():
            assert torch.equal(v.grad.cpu(), torch.from_numpy(rust["d_" + k])), f"{name}: d_{k} not the Rust bits"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["linear-attention", "mamba2", "gated-deltanet"])
def test_runs_from_a_state_are_zero_copy_and_equal_the_rust_cuda_path(name, dtype, monkeypatch):
    """From a state on CUDA tensors (the device-tensor entry points, exact mode): the zero-copy
    path runs (forward and backward), and y, the final state, every gradient and the initial
    state's gradient equal the Rust CUDA path's bits (the host-array path of the same kernels)."""
    calls = []
    for fn in ("forward", "backward"):
        real = getattr(_cuda, fn)
        monkeypatch.setattr(_cuda, fn, lambda *a, _f=real, _n=fn, **k: (calls.append(_n), _f(*a, **k))[1])
    x = _inputs(name, 65, dtype)
    b, _, h, dk = x["q"].shape
    s0 = torch.randn(b, h, x["v"].shape[-1], dk, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).to(dtype)
    dev = {k: v.cuda().requires_grad_() for k, v in x.items()}
    s0_dev = s0.cuda().requires_grad_()
    y, fin = mixers.run(name, initial_state=s0_dev, output_final_state=True, **dev)
    assert fin.is_cuda and fin.dtype == dtype and fin.shape == s0.shape
    host = {k: v.numpy() for k, v in x.items()}
    want_y, want_f = mixers.run_numpy(name, backend="cuda", initial_state={"S": s0.numpy()}, output_final_state=True,
                                      **host)
    assert torch.equal(y.detach().cpu(), torch.from_numpy(want_y)), f"{name}: y not the Rust bits"
    assert torch.equal(fin.detach().cpu(), torch.from_numpy(want_f["S"])), f"{name}: final state not the Rust bits"
    dy, df = torch.randn_like(y), torch.randn_like(fin)
    torch.autograd.backward([y, fin], [dy, df])
    want = mixers.backward(name, dy.cpu().numpy(), backend="cuda", initial_state={"S": s0.numpy()},
                           d_final_state={"S": df.cpu().numpy()}, **host)
    for k, v in dev.items():
        assert torch.equal(v.grad.cpu(), torch.from_numpy(want["d_" + k])), f"{name}: d_{k} not the Rust bits"
    assert torch.equal(s0_dev.grad.cpu(), torch.from_numpy(want["d_initial_state"]["S"])), f"{name}: d_initial_state"
    assert calls == ["forward", "backward"], calls


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("name", ["linear-attention", "mamba2", "gated-deltanet"])
def test_runs_from_a_state_in_the_tf32_and_bf16_modes_are_zero_copy(name, precision, monkeypatch):
    """From a state on float32 CUDA tensors in the tf32 and bf16 modes: the zero-copy path runs
    (forward and backward); y and the final state equal the Rust CUDA path in that mode bit for
    bit, and every gradient and the initial state's (computed in the exact mode on the values as
    the mode stores them: bf16 activations and dy in the bf16 mode) equal the Rust backward from
    a state on those values."""
    calls = []
    for fn in ("forward", "backward"):
        real = getattr(_cuda, fn)
        monkeypatch.setattr(_cuda, fn, lambda *a, _f=real, _n=fn, **k: (calls.append(_n), _f(*a, **k))[1])
    x = _inputs(name, 130, torch.float32)
    b, _, h, dk = x["q"].shape
    s0 = torch.randn(b, h, x["v"].shape[-1], dk, generator=torch.Generator().manual_seed(6))
    dev = {k: v.cuda().requires_grad_() for k, v in x.items()}
    s0_dev = s0.cuda().requires_grad_()
    y, fin = mixers.run(name, precision=precision, initial_state=s0_dev, output_final_state=True, **dev)
    assert fin.is_cuda and fin.dtype == torch.float32 and fin.shape == s0.shape
    host = {k: v.numpy() for k, v in x.items()}
    want_y, want_f = mixers.run_numpy(name, backend="cuda", precision=precision, initial_state={"S": s0.numpy()},
                                      output_final_state=True, **host)
    assert torch.equal(y.detach().cpu().float(), torch.from_numpy(want_y)), f"{name} {precision}: y"
    assert torch.equal(fin.detach().cpu(), torch.from_numpy(want_f["S"])), f"{name} {precision}: final state"
    dy, df = torch.randn_like(y), torch.randn_like(fin)
    torch.autograd.backward([y, fin], [dy, df])
    stored = (lambda t: t.bfloat16().float()) if precision == "bf16" else (lambda t: t)
    xs = {k: (stored(v) if k in ("q", "k", "v") else v).numpy() for k, v in x.items()}
    want = mixers.backward(name, stored(dy.float().cpu()).numpy(), backend="cuda", initial_state={"S": s0.numpy()},
                           d_final_state={"S": df.cpu().numpy()}, **xs)
    for k, v in dev.items():
        assert torch.equal(v.grad.cpu(), torch.from_numpy(want["d_" + k])), f"{name} {precision}: d_{k}"
    assert torch.equal(s0_dev.grad.cpu(), torch.from_numpy(want["d_initial_state"]["S"])), f"{name}: d_initial_state"
    assert calls == ["forward", "backward"], calls


def test_a_lift_runs_from_its_state_on_cuda():
    """A lift's state (a dict of its level states and position) runs on the CUDA backend in the
    ``fast`` form (docs/math.md §7.1, the segments of ``loglinear::lift_state``): the second half
    of a sequence from the first half's CUDA final state equals the second half of the whole run
    on the CPU, and the final state equals the whole run's; ``backend="cpu"`` takes the host path
    and agrees; the ``recurrent`` form (the decoder from the state) agrees too; the gradients
    through the state (of the inputs and of the initial state) equal the CPU's; a lone tensor for
    the state is refused."""
    s0 = torch.zeros(2, 2, 16, 16, device="cuda")
    whole = _dev(_inputs("loglinear-mamba2", 130))
    first = {k: v[:, :65] for k, v in whole.items()}
    second = {k: v[:, 65:] for k, v in whole.items()}
    with pytest.raises(ValueError, match="dict"):
        mixers.run("loglinear-mamba2", initial_state=s0, **first)
    _, s = mixers.run("loglinear-mamba2", output_final_state=True, **first)
    assert isinstance(s, dict) and s["S"].is_cuda
    want = mixers.run("loglinear-mamba2", **{k: v.cpu() for k, v in whole.items()})[:, 65:]
    _, want_fin = mixers.run("loglinear-mamba2", output_final_state=True, **{k: v.cpu() for k, v in whole.items()})
    y, fin = mixers.run("loglinear-mamba2", initial_state=s, output_final_state=True, **second)
    assert y.is_cuda and fin["S"].is_cuda
    _close(y, want, TOL["exact"], "a lift from its CUDA state: the second half of the whole run")
    for k in ("S", "position"):
        _close(fin[k], want_fin[k], TOL["exact"], f"a lift from its CUDA state: final `{k}`")
    y = mixers.run("loglinear-mamba2", initial_state=s, backend="cpu", **second)
    assert y.is_cuda
    _close(y, want, TOL["exact"], "a lift from a state dict on the host path")
    y, fin = mixers.run("loglinear-mamba2", initial_state=s, form="recurrent", output_final_state=True, **second)
    _close(y, want, TOL["exact"], "a lift's CUDA decoder from a state: the second half of the whole run")
    # Gradients through the state: the second half from the first half's state, on CUDA and on
    # the CPU (the same values).
    grads = {}
    for dev in ("cuda", "cpu"):
        x = {k: v.detach().to(dev).requires_grad_(k in ("q", "k", "v", "g")) for k, v in second.items()}
        st = {k: v.detach().to(dev) for k, v in s.items()}
        st["S"].requires_grad_(True)
        y, f = mixers.run("loglinear-mamba2", initial_state=st, output_final_state=True, **x)
        (y.square().sum() + (f["S"] * 0.5).sum()).backward()
        grads[dev] = {k: x[k].grad.cpu() for k in ("q", "k", "v", "g")} | {"S": st["S"].grad.cpu()}
    for k, g in grads["cuda"].items():
        _close(g, grads["cpu"][k], TOL["exact"], f"a lift from its CUDA state: d_{k}")


def test_bfloat16_tensors_run_in_place_in_the_bf16_mode():
    x = _inputs("gated-deltanet", 65)
    dev = _dev(x)
    for k in ("q", "k", "v"):
        dev[k] = dev[k].bfloat16()
    y = mixers.gated_delta_rule(**dev, precision="bf16")
    assert y.dtype == torch.bfloat16
    want = mixers.gated_delta_rule(**{k: v.float() for k, v in dev.items()}, precision="bf16")
    assert torch.equal(y.float(), want)


def test_inputs_are_read_in_place_and_outputs_come_from_torch():
    x = _dev(_inputs("gated-deltanet", 65))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = mixers.gated_delta_rule(**x)
    # y is all that stays allocated, in PyTorch's accounting (rounded to its 512-byte blocks).
    kept = torch.cuda.memory_allocated() - before
    assert y.numel() * 4 <= kept <= y.numel() * 4 + 512, kept
    assert not y._is_view()
    y.mul_(2)  # an output may be modified in place
    # A strided view is made contiguous by the wrapper and gives the same result.
    q = torch.cat([x["q"], x["q"]], dim=-1)[..., : x["q"].shape[-1]]
    assert not q.is_contiguous()
    assert torch.equal(mixers.gated_delta_rule(**{**x, "q": q}) * 2, y)


def test_the_op_runs_on_a_side_stream_without_waiting_for_it():
    x = _dev(_inputs("gated-deltanet", 65))
    want = mixers.gated_delta_rule(**x)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        side.wait_stream(torch.cuda.default_stream())
        torch.cuda._sleep(200_000_000)  # keeps the side stream busy for about 0.1 s
        t0 = time.perf_counter()
        y = mixers.gated_delta_rule(**x)
        dt = time.perf_counter() - t0
        busy = not side.query()
    assert busy, "the call waited for the stream"
    assert dt < 0.05, f"the call took {dt:.3f} s: it waited"
    side.synchronize()
    assert torch.equal(y, want)


@pytest.mark.parametrize("precision", ["exact", "bf16"])
def test_the_glr_backward_is_given_the_forwards_output(precision, monkeypatch):
    """The GLR's autograd node keeps ``y`` (float32 and float64 calls) and passes it to the CUDA
    backward, which reads it instead of running the forward again; Mamba-2's backward does not
    read it and gets none, nor does a float16 call (its ``y`` is rounded), nor a call whose ``y``
    was changed in place. The gradients with ``y`` are checked against the CPU and the Rust path
    by the tests above."""
    seen = []
    real = _cuda._mixers.cuda_backward

    def spy(mixer, raw, *args, **kwargs):
        seen.append((mixer, sorted(r[0] for r in raw)))
        return real(mixer, raw, *args, **kwargs)

    monkeypatch.setattr(_cuda._mixers, "cuda_backward", spy)
    cases = [("glr", torch.float32, True), ("glr", torch.float16, False), ("mamba2", torch.float32, False)]
    if precision == "exact":
        cases.append(("glr", torch.float64, True))
    for name, dtype, keeps in cases:
        x = {k: v.to(dtype).requires_grad_() for k, v in _dev(_inputs(name, 65)).items()}
        y = mixers.run(name, precision=precision, **x)
        y.backward(torch.ones_like(y))
        assert seen[-1] == (name, sorted(list(x) + (["y"] if keeps else []))), (name, dtype, seen[-1])
    # Changed in place after the call, y is not given (the backward runs the forward again).
    x = {k: v.requires_grad_() for k, v in _dev(_inputs("glr", 65)).items()}
    y = mixers.run("glr", precision=precision, **x)
    y += 1.0
    y.backward(torch.ones_like(y))
    assert seen[-1] == ("glr", sorted(x))


@pytest.mark.parametrize("precision", ["exact", "bf16"])
@pytest.mark.parametrize("name", ["gated-deltanet", "attention", "glr"])
def test_the_direct_eager_path_equals_the_op_bit_for_bit(name, precision, monkeypatch):
    """The common eager call (no state, no cu_seqlens) skips the op's generic path
    (``_ops._Plain``, or no autograd Function when no gradient is wanted): y and every gradient
    equal the ``torch.library`` op's bits (its generic forward and backward implementations), for
    float32 and float16 inputs; under ``torch.no_grad`` the result has no autograd history."""
    plain = []
    real = _ops._plain_forward
    monkeypatch.setattr(_ops, "_plain_forward", lambda *a: (plain.append(1), real(*a))[1])
    op = getattr(torch.ops.mixers, _ops.op_name(name).split("::")[1])
    for dtype in (torch.float32, torch.float16):
        x = {k: v.to(dtype) for k, v in _dev(_inputs(name, 65)).items()}
        names = list(x)
        want, _ = op([x[n] for n in names], names, None, None, False, "{}", "fast", "cuda", precision)
        plain.clear()
        y = mixers.run(name, precision=precision, **x)
        assert plain == [1] and y.grad_fn is None and y.dtype == dtype and not y._is_view()
        assert torch.equal(y, want), f"{name} {dtype}: the direct path's y differs from the op's"

        leaves = {k: v.clone().requires_grad_() for k, v in x.items()}
        y = mixers.run(name, precision=precision, **leaves)
        assert plain == [1, 1] and type(y.grad_fn).__name__ == "_PlainBackward", y.grad_fn
        with torch.no_grad():
            assert mixers.run(name, precision=precision, **leaves).grad_fn is None
        assert torch.equal(y.detach(), want)
        dy = torch.randn_like(y)
        got = torch.autograd.grad(y, list(leaves.values()), dy)
        ref = {k: v.clone().requires_grad_() for k, v in x.items()}
        y_op, _ = op(list(ref.values()), names, None, None, False, "{}", "fast", "cuda", precision)
        expected = torch.autograd.grad(y_op, list(ref.values()), dy)
        for k, a, b in zip(names, got, expected):
            assert a.dtype == b.dtype == dtype and torch.equal(a, b), f"{name} {dtype}: d_{k} differs from the op's"


@pytest.mark.parametrize("precision", ["exact", "tf32", "bf16"])
def test_attention_backward_reads_the_statistics_its_forward_saved(precision, monkeypatch):
    """Where attention runs on tensor cores (head dim 64 here), its autograd node keeps the row
    statistics the forward saved with the library's ``y``, and the CUDA backward given both skips
    the forward: ``y`` and every gradient equal, bit for bit, those of the op (whose backward runs
    the forward again), for float32 and bfloat16 inputs; a ``y`` changed in place is not given
    (the backward runs the forward)."""
    seen = []
    real = _cuda._mixers.cuda_backward

    def spy(mixer, raw, *args, **kwargs):
        seen.append(sorted(r[0] for r in raw))
        return real(mixer, raw, *args, **kwargs)

    monkeypatch.setattr(_cuda._mixers, "cuda_backward", spy)
    op = getattr(torch.ops.mixers, _ops.op_name("attention").split("::")[1])
    x0 = _dev(inputs("attention", dtype=torch.float64, seq=77, seed=3, batch=2, heads=3, dk=64, dv=64, channels=6))
    for dtype in (torch.float32, torch.bfloat16):
        x = {k: v.to(dtype) for k, v in x0.items()}
        names = list(x)
        leaves = {k: v.clone().requires_grad_() for k, v in x.items()}
        y = mixers.run("attention", precision=precision, **leaves)
        dy = torch.randn_like(y)
        got = torch.autograd.grad(y, list(leaves.values()), dy)
        assert seen[-1] == sorted(names + ["y", "y_stats"]), (dtype, seen[-1])
        ref = {k: v.clone().requires_grad_() for k, v in x.items()}
        y_op, _ = op(list(ref.values()), names, None, None, False, "{}", "fast", "cuda", precision)
        expected = torch.autograd.grad(y_op, list(ref.values()), dy)
        assert seen[-1] == sorted(names), (dtype, seen[-1])
        assert torch.equal(y.detach(), y_op.detach()), f"{dtype}: y of the saving forward differs from the op's"
        for k, a, b in zip(names, got, expected):
            assert a.dtype == b.dtype == dtype and torch.equal(a, b), f"{dtype}: d_{k} differs from the op's"
    # float32 inputs: in the bf16 mode the node keeps the library's bfloat16 `y`, of which the
    # caller's float32 `y` is a copy (changing that copy changes nothing the backward reads);
    # elsewhere it is the caller's `y` itself, and a change in place is noticed.
    leaves = {k: v.float().requires_grad_() for k, v in x0.items()}
    y = mixers.run("attention", precision=precision, **leaves)
    y += 1.0
    y.backward(torch.ones_like(y))
    kept = ["y", "y_stats"] if precision == "bf16" else []
    assert seen[-1] == sorted(list(leaves) + kept), seen[-1]


def test_a_dual_tensor_is_refused_as_before():
    """Forward-mode AD takes the autograd Function (no jvp): an error, never a silent zero
    tangent."""
    import torch.autograd.forward_ad as fwAD

    x = _dev(_inputs("gated-deltanet", 65))
    with fwAD.dual_level():
        dual = {**x, "q": fwAD.make_dual(x["q"], torch.ones_like(x["q"]))}
        with pytest.raises(NotImplementedError, match="jvp"):
            mixers.gated_delta_rule(**dual)


def test_cuda_graph_capture_and_replay():
    x = _dev(_inputs("gated-deltanet", 65))
    static = {k: v.clone() for k, v in x.items()}
    grads = {k: v.clone().requires_grad_() for k, v in x.items()}
    mixers.cuda_warmup(mixers.gated_delta_rule, **grads)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = mixers.gated_delta_rule(**static)
    fresh = _dev(_inputs("gated-deltanet", 65, seed=5))
    for k, v in fresh.items():
        static[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, mixers.gated_delta_rule(**fresh))

    # The backward, captured through torch.autograd.grad.
    dy = torch.randn_like(y)
    leaves = {k: v.clone().requires_grad_() for k, v in x.items()}
    mixers.cuda_warmup(mixers.gated_delta_rule, **leaves)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        out = mixers.gated_delta_rule(**leaves)
        d = torch.autograd.grad(out, list(leaves.values()), dy)
    with torch.no_grad():
        for k, v in fresh.items():
            leaves[k].copy_(v)
    g2.replay()
    torch.cuda.synchronize()
    again = {k: v.clone().requires_grad_() for k, v in fresh.items()}
    want = torch.autograd.grad(mixers.gated_delta_rule(**again), list(again.values()), dy)
    for a, b in zip(d, want):
        assert torch.equal(a, b)


def test_cuda_graph_capture_of_the_fft_mixer():
    """The Toeplitz mixer's cuFFT transforms inside a capture: plans are kept per stream and none
    can be made while capturing, so the capture stream takes the plan the warm-up made on its side
    stream. The replay equals an eager call on the new values."""
    x = _dev(_inputs("toeplitz", 65))
    static = {k: v.clone() for k, v in x.items()}
    mixers.cuda_warmup(lambda **kw: mixers.run("toeplitz", **kw), **static)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = mixers.run("toeplitz", **static)
    fresh = _dev(_inputs("toeplitz", 65, seed=5))
    for k, v in fresh.items():
        static[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, mixers.run("toeplitz", **fresh))


def test_torch_compile_fullgraph_without_graph_breaks():
    x = _dev(_inputs("gated-deltanet", 65))

    def f(q, k, v, g, beta):
        return mixers.gated_delta_rule(q, k, v, g, beta) * 2

    explained = torch._dynamo.explain(f)(**x)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(**x), f(**x))
    leaves = {k: v.clone().requires_grad_() for k, v in x.items()}
    compiled(**leaves).sum().backward()
    assert all(v.grad is not None for v in leaves.values())


def _per_call(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    return dt


def test_per_call_overhead_over_the_library_call():
    """Host time per call of the op against the extension's own call on the same tensors (the
    library's work: the checks, the plan, the launches, PyTorch's allocator), at a size where
    the device is not the bound. Printed; bounded loosely (the goal, 10 µs, is in the report)."""
    x = _dev(_inputs("gated-deltanet", 64))
    names = list(x)
    tensors = [x[n] for n in names]
    _, raw = _cuda._prepare(names, tensors, "exact")
    stream = torch.cuda.current_stream().cuda_stream
    alloc = _cuda._allocator(tensors[0].device)
    lib = _per_call(lambda: mixers._mixers.cuda_forward("gated-deltanet", raw, stream, alloc, config="{}"))
    op = _per_call(lambda: mixers.gated_delta_rule(**x))
    raw_op = _per_call(lambda: torch.ops.mixers.gated_deltanet(tensors, names, None, None, False, "{}", "fast", "cuda",
                                                              "exact"))
    # The op's generic eager path (what the function took before its direct path), and the
    # function with inputs that require a gradient (the direct path's autograd Function).
    eager = _per_call(lambda: _ops._Eager.apply("gated-deltanet", names, None, None, False, "{}", "fast", "cuda",
                                                "exact", *tensors))
    leaves = {k: v.clone().requires_grad_() for k, v in x.items()}
    grad = _per_call(lambda: mixers.gated_delta_rule(**leaves))
    allocs = []
    counting = lambda n: (allocs.append(n), alloc(n))[1]  # noqa: E731
    mixers._mixers.cuda_forward("gated-deltanet", raw, stream, counting, config="{}")
    us = lambda t: f"{t * 1e6:.1f} µs"  # noqa: E731
    print(f"\nper call: library {us(lib)} ({len(allocs)} buffers from PyTorch's allocator), "
          f"torch.ops.mixers.gated_deltanet {us(raw_op)}, the generic eager path (_Eager) {us(eager)}, "
          f"mixers.gated_delta_rule {us(op)} (inputs requiring a gradient: {us(grad)}); overhead over the library: "
          f"op {us(raw_op - lib)}, _Eager {us(eager - lib)}, the function (direct path) {us(op - lib)}, "
          f"with gradients {us(grad - lib)}")
    assert op < 1e-3


fla_chunk = None
try:  # fla, where importable (its forward only: its backward may refuse this Triton)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
except Exception:  # noqa: BLE001 - any import failure means: no fla here
    fla_chunk = None


def _event_time(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


@pytest.mark.skipif(fla_chunk is None, reason="fla is not importable")
@pytest.mark.parametrize("shape", [(1, 16384, 16, 64), (8, 4096, 16, 128)])
def test_parity_with_fla_forward(shape):
    B, T, H, D = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, T, H, D, device="cuda", generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda", generator=gen), dim=-1)
    v = torch.randn(B, T, H, D, device="cuda", generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen)) / 16
    beta = torch.rand(B, T, H, device="cuda", generator=gen)
    o, s = mixers.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=False)
    o_fla, _ = fla_chunk(q, k, v, g, beta)
    ours = {p: _event_time(lambda p=p: mixers.chunk_gated_delta_rule(q, k, v, g, beta, precision=p)) for p in TOL}
    theirs = _event_time(lambda: fla_chunk(q, k, v, g, beta))
    print(f"\nfla parity {shape}: fla {theirs:.3f} ms; mixers " + ", ".join(f"{p} {t:.3f} ms" for p, t in ours.items()))
    _close(o, o_fla.float(), TOL["tf32"], f"mixers vs fla at {shape}")
    bf = torch.bfloat16
    o_b, _ = mixers.chunk_gated_delta_rule(q.to(bf), k.to(bf), v.to(bf), g, beta, precision="bf16")
    o_fb, _ = fla_chunk(q.to(bf), k.to(bf), v.to(bf), g, beta)
    _close(o_b.float(), o_fb.float(), (math.sqrt(2) * TOL["bf16"][0], TOL["bf16"][1] * 2), f"bf16 at {shape}")


def test_the_backend_runs_on_the_first_cuda_tensors_device():
    """One device a process: the first CUDA call binds the backend to its tensors' device (0
    here); with a second GPU, tensors there take the host path and give the same ``y``."""
    x = inputs("mamba2", seq=70, batch=1, heads=2, dk=16, dv=16)
    on0 = {k: v.to("cuda:0", torch.float32) for k, v in x.items()}
    y0 = mixers.run("mamba2", {"scale": 0.5}, **on0)
    assert _cuda.DEVICE == 0 and _cuda.device(on0["v"]) == 0
    if torch.cuda.device_count() > 1:
        on1 = {k: v.to("cuda:1") for k, v in on0.items()}
        assert not _cuda.applies(list(on1.values()), "cuda", "fast", False, None)
        y1 = mixers.run("mamba2", {"scale": 0.5}, **on1)
        assert y1.device == torch.device("cuda:1")
        torch.testing.assert_close(y1.cpu(), y0.cpu(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["exact", "tf32", "bf16"])
@pytest.mark.parametrize("name", ["mamba2", "gated-deltanet", "attention"])
def test_packed_batches_on_cuda_tensors_are_zero_copy(name, precision, monkeypatch):
    """A packed batch (``cu_seqlens``: an empty sequence, one token, sequences around a chunk, the
    last offset short of the buffer) on CUDA tensors takes the zero-copy path, forward and
    backward, from one state row per sequence where the mixer has a state on the device; y, the
    final states and every gradient equal the Rust CUDA path's packed call (host arrays) bit for
    bit, and rows past the last offset are zero."""
    calls = []
    # (a packed batch without a state takes the direct path's forward_plain)
    for fn in ("forward", "forward_plain", "backward"):
        real, tag = getattr(_cuda, fn), fn.replace("_plain", "")
        monkeypatch.setattr(_cuda, fn, lambda *a, _f=real, _n=tag, **k: (calls.append(_n), _f(*a, **k))[1])
    cu = [0, 0, 1, 66, 130, 170]
    x = {k: v[:1] for k, v in _inputs(name, 180, torch.float32).items()}
    stateful = name != "attention"
    dev = {k: v.cuda().requires_grad_() for k, v in x.items()}
    cu_dev = torch.tensor(cu, device="cuda", dtype=torch.int32)
    host = {k: v.numpy() for k, v in x.items()}
    kw = {}
    if stateful:
        _, _, h, dk = x["q"].shape
        s0 = torch.randn(len(cu) - 1, h, x["v"].shape[-1], dk, generator=torch.Generator().manual_seed(7))
        s0_dev = s0.cuda().requires_grad_()
        y, fin = mixers.run(name, precision=precision, cu_seqlens=cu_dev, initial_state=s0_dev,
                            output_final_state=True, **dev)
        want_y, want_f = mixers.run_numpy(name, backend="cuda", precision=precision, cu_seqlens=cu,
                                          initial_state={"S": s0.numpy()}, output_final_state=True, **host)
        assert torch.equal(fin.detach().cpu(), torch.from_numpy(want_f["S"])), f"{name} {precision}: final states"
        kw = {"initial_state": {"S": s0.numpy()}}
    else:
        y = mixers.run(name, precision=precision, cu_seqlens=cu_dev, **dev)
        want_y = mixers.run_numpy(name, backend="cuda", precision=precision, cu_seqlens=cu, **host)
    assert torch.equal(y.detach().cpu().float(), torch.from_numpy(want_y)), f"{name} {precision}: y"
    assert not y[:, cu[-1]:].any(), "rows past the last offset"
    if precision != "exact" and not stateful:
        return  # the host-array backward is exact; the device one without a state runs in the mode
    dy = torch.randn_like(y)
    outs, cots = ([y, fin], [dy, torch.zeros_like(fin)]) if stateful else ([y], [dy])
    torch.autograd.backward(outs, cots)
    stored = (lambda t: t.bfloat16().float()) if precision == "bf16" else (lambda t: t)
    xs = {k: (stored(v) if k in ("q", "k", "v") else v).numpy() for k, v in x.items()}
    want = mixers.backward(name, stored(dy.float().cpu()).numpy(), backend="cuda", cu_seqlens=cu, **kw, **xs)
    for k, v in dev.items():
        assert torch.equal(v.grad.cpu(), torch.from_numpy(want["d_" + k])), f"{name} {precision}: d_{k}"
    if stateful:
        assert torch.equal(s0_dev.grad.cpu(), torch.from_numpy(want["d_initial_state"]["S"])), "d_initial_state"
    assert calls == ["forward", "backward"], calls


@pytest.mark.parametrize("name,config", [("glr", {"pattern": "pow2"}), ("toeplitz", {"heads": 3})])
def test_packed_glr_and_toeplitz_on_cuda_tensors_are_zero_copy(name, config, monkeypatch):
    """A packed batch of the GLR (each sequence's slots cut on the device) and of the Toeplitz
    mixer (taps taken whole, their gradient summed over the sequences) on CUDA tensors takes the
    zero-copy path, forward and backward; y and every gradient equal the Rust CUDA path's packed
    call on host arrays bit for bit, and rows past the last offset are zero."""
    calls = []
    # (a packed batch without a state takes the direct path's forward_plain)
    for fn in ("forward", "forward_plain", "backward"):
        real, tag = getattr(_cuda, fn), fn.replace("_plain", "")
        monkeypatch.setattr(_cuda, fn, lambda *a, _f=real, _n=tag, **k: (calls.append(_n), _f(*a, **k))[1])
    cu = [0, 0, 1, 66, 130, 170]
    x = inputs(name, config, dtype=torch.float32, seq=180, seed=3, **dict(SIZES, batch=1))
    dev = {k: v.cuda().requires_grad_() for k, v in x.items()}
    cu_dev = torch.tensor(cu, device="cuda", dtype=torch.int32)
    host = {k: v.numpy() for k, v in x.items()}
    y = mixers.run(name, config, cu_seqlens=cu_dev, **dev)
    want_y = mixers.run_numpy(name, config, backend="cuda", cu_seqlens=cu, **host)
    assert torch.equal(y.detach().cpu(), torch.from_numpy(want_y)), f"{name}: y"
    assert not y[:, cu[-1]:].any(), "rows past the last offset"
    dy = torch.randn_like(y)
    y.backward(dy)
    want = mixers.backward(name, dy.cpu().numpy(), config, backend="cuda", cu_seqlens=cu, **host)
    for k, v in dev.items():
        assert torch.equal(v.grad.cpu(), torch.from_numpy(want["d_" + k])), f"{name}: d_{k}"
    assert calls == ["forward", "backward"], calls
