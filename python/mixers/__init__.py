"""mixers: causal token mixers (attention, linear attention, Mamba-2, gated DeltaNet, their
log-linear lifts, generalized linear recurrences, Toeplitz) from the Rust library `mixers`,
as PyTorch ops with autograd.

- ``mixers.attention``, ``linear_attention``, ``mamba2``, ``gated_delta_rule``,
  ``loglinear_attention``, ``loglinear_mamba2``, ``loglinear_gated_delta_rule``, ``glr``,
  ``toeplitz``: the library's layouts and defaults (docs/math.md);
- ``mixers.run(name, config, **inputs)``: any registered mixer (plugins linked into the
  extension included);
- ``chunk_simple_gla``, ``fused_recurrent_simple_gla``, ``chunk_gated_delta_rule``,
  ``fused_recurrent_gated_delta_rule``, ``chunk_log_linear_attn``: flash-linear-attention's
  signatures (``mixers.fla``);
- ``mixers.backward(...)``: the library's backward on tensors or numpy arrays, without autograd;
  ``mixers.list()``: everything registered;
- ``mixers.cuda_warmup(fn, *args, **kwargs)``: one call (and its backward) on a side stream, so
  that its kernels are compiled before a CUDA graph captures it. CUDA tensors run zero-copy on
  PyTorch's current stream (``mixers._cuda``).

docs/python.md in the repository documents the package.
"""

from __future__ import annotations

import json as _json

from . import _mixers

__all__ = ["list", "spec", "random_inputs", "backward", "run_numpy"]


def list() -> dict:  # noqa: A001 - the package's listing, `mixers.list()`
    """Everything registered in the extension: ``{"plugins", "backends", "patterns", "masks",
    "lambda_schemes", "mixers"}``; each mixer with its inputs (default config) and, per backend,
    its forms, backward forms and the forms it runs from a state."""
    return _json.loads(_mixers.registered())


def spec(name: str, config: dict = None) -> dict:
    """The inputs of mixer ``name`` with ``config``: names, symbolic shapes, which is mixed."""
    return _json.loads(_mixers.spec(name, _json.dumps(config or {})))


def random_inputs(name: str, config: dict = None, *, batch: int = 2, seq: int = 8, channels: int = 4,
                  heads: int = 2, dk: int = 4, dv: int = 3, seed: int = 0) -> dict:
    """Valid random float64 inputs of mixer ``name`` (numpy arrays, optional inputs included),
    drawn as the library's own checks draw them (docs/math.md §4: ``g`` in [−0.1, 0], unit
    keys for gated DeltaNet, …); a mixer uses the sizes it needs."""
    return _mixers.random_inputs(name, _json.dumps(config or {}), batch=batch, seq=seq, channels=channels,
                                 heads=heads, dk=dk, dv=dv, seed=seed)


def _arrays(d):
    """Named tensors or arrays as numpy arrays (tensors detached and copied to the host)."""
    out = {}
    for k, v in d.items():
        if v is None:
            continue
        if hasattr(v, "detach"):
            v = v.detach().cpu().numpy()
        out[k[:-1] if k.endswith("_") else k] = v
    return out


def run_numpy(name: str, config: dict = None, *, form: str = "fast", backend: str = "cpu",
              precision: str = "exact", initial_state=None, output_final_state: bool = False,
              cu_seqlens=None, **inputs):
    """Runs mixer ``name`` on numpy arrays (no PyTorch needed): ``y``, or ``(y, final_state)``
    with ``output_final_state``. States are dicts of named arrays (``{"S": …}``)."""
    y, fin = _mixers.forward(name, _arrays(inputs), config=_json.dumps(config or {}), form=form, backend=backend,
                             precision=precision, cu_seqlens=None if cu_seqlens is None else [int(c) for c in cu_seqlens],
                             initial=None if initial_state is None else _arrays(initial_state),
                             want_final=output_final_state)
    return (y, fin) if output_final_state else y


def backward(name: str, dy, config: dict = None, *, form: str = None, forward_form: str = "fast",
             backend: str = "cpu", initial_state=None, d_final_state=None, cu_seqlens=None, requires=None,
             **inputs) -> dict:
    """The library's backward of mixer ``name`` at ``inputs`` (tensors or numpy arrays) for the
    cotangent ``dy`` of ``y``, without autograd: ``{"d_<input>": …}`` for each input in
    ``requires`` (default: all), plus ``"d_initial_state"`` (a dict of named arrays) when an
    initial state is given. States are dicts of named arrays (``{"S": …}``). ``form`` is the
    backward form (default: ``forward_form`` when the backend has its backward, else ``fast``).
    Results are numpy arrays, or tensors when ``dy`` is a tensor."""
    if hasattr(dy, "detach"):
        import torch

        like = dy
        dy = dy.detach().cpu().numpy()
    else:
        torch = like = None
    if hasattr(cu_seqlens, "tolist"):
        cu_seqlens = cu_seqlens.tolist()
    grads, d_init = _mixers.backward(
        name, _arrays(inputs), dy, config=_json.dumps(config or {}), form=form, forward_form=forward_form,
        backend=backend, cu_seqlens=None if cu_seqlens is None else [int(c) for c in cu_seqlens],
        initial=None if initial_state is None else _arrays(initial_state),
        d_final=None if d_final_state is None else _arrays(d_final_state),
        requires=requires,
    )
    if torch is not None:
        grads = {k: torch.from_numpy(v).to(like.device) for k, v in grads.items()}
        d_init = {k: torch.from_numpy(v).to(like.device) for k, v in d_init.items()}
    if initial_state is not None:
        grads["d_initial_state"] = d_init
    return grads


try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as _e:  # the numpy layer works without PyTorch
    if _e.name != "torch":
        raise
else:
    from . import fla
    from ._cuda import warmup as cuda_warmup
    from ._ops import mixer_op as _mixer_op
    from ._torch_api import (
        attention,
        gated_delta_rule,
        glr,
        linear_attention,
        loglinear_attention,
        loglinear_gated_delta_rule,
        loglinear_mamba2,
        mamba2,
        run,
        toeplitz,
    )
    from .context_parallel import context_parallel
    from .fla import (
        chunk_gated_delta_rule,
        chunk_log_linear_attn,
        chunk_simple_gla,
        fused_recurrent_gated_delta_rule,
        fused_recurrent_simple_gla,
    )

    # Every registered mixer's op exists from import on (torch.compile then never defines one
    # while tracing).
    for _m in list()["mixers"]:
        _mixer_op(_m["name"])

    __all__ += [
        "run",
        "attention",
        "linear_attention",
        "mamba2",
        "gated_delta_rule",
        "loglinear_attention",
        "loglinear_mamba2",
        "loglinear_gated_delta_rule",
        "glr",
        "toeplitz",
        "chunk_simple_gla",
        "fused_recurrent_simple_gla",
        "chunk_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
        "chunk_log_linear_attn",
        "fla",
        "cuda_warmup",
        "context_parallel",
    ]
