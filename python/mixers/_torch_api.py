"""The library's own PyTorch functions: one per builtin mixer, and ``run`` for any registered
mixer. Layouts and names are the library's (docs/math.md): ``[B, T, H, D]`` for ``q``, ``k``,
``v``; ``[B, T, H]`` for gates; ``[B, T, C]`` for GLR and Toeplitz inputs; states
``S [B, H, Dv, Dk]``. Every function takes the keywords of :func:`mixers._ops.call`:
``form`` (``fast``, ``parallel``, ``recurrent``, ``materialized``), ``backend`` (default: ``cuda``
for CUDA tensors, else ``cpu``), ``precision`` (``exact``, ``tf32``, ``bf16``),
``initial_state``, ``output_final_state`` and ``cu_seqlens``, and returns ``y``, or
``(y, final_state)`` with ``output_final_state=True``.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._ops import call


def _config(**fields) -> dict:
    """A config from the fields that were given (``None``: the mixer's default)."""
    return {k: v for k, v in fields.items() if v is not None}


def run(name: str, config: Optional[dict] = None, **kwargs):
    """Runs any registered mixer ``name`` (plugins linked into the extension included) with a
    config dict; inputs are keywords named as in docs/math.md (``lambda`` may be written
    ``lambda_``); the options are those of the typed functions."""
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in _OPTIONS}
    inputs = {k[:-1] if k.endswith("_") else k: v for k, v in kwargs.items()}
    return call(name, config, inputs, **options)


_OPTIONS = ("form", "backend", "precision", "initial_state", "output_final_state", "cu_seqlens")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: Optional[int] = None,
              scale: Optional[float] = None, **options):
    """Causal softmax attention ``softmax(σ q·k) v`` over ``q, k [B, T, H, Dk]``,
    ``v [B, T, H, Dv]``; ``window`` limits each token to the last ``window`` tokens; ``scale``
    defaults to ``1/√Dk`` (docs/math.md §1.3)."""
    return call("attention", _config(window=window, scale=scale), {"q": q, "k": k, "v": v}, **options)


def linear_attention(q, k, v, *, scale: Optional[float] = None, chunk: Optional[int] = None, **options):
    """Linear attention ``y_t = σ Σ_{s≤t} (q_t·k_s) v_s`` (docs/math.md §2.1; ``scale`` σ
    defaults to 1)."""
    return call("linear-attention", _config(scale=scale, chunk=chunk), {"q": q, "k": k, "v": v}, **options)


def mamba2(q, k, v, g, *, scale: Optional[float] = None, chunk: Optional[int] = None, **options):
    """Mamba-2 (state-space duality form): linear attention with the per-head log decay
    ``g [B, T, H] ≤ 0`` (docs/math.md §2.1; ``scale`` defaults to 1)."""
    return call("mamba2", _config(scale=scale, chunk=chunk), {"q": q, "k": k, "v": v, "g": g}, **options)


def gated_delta_rule(q, k, v, g, beta, *, scale: Optional[float] = None, chunk: Optional[int] = None, **options):
    """Gated DeltaNet: ``S_t = e^{g_t} S_{t−1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ``,
    ``y_t = σ S_t q_t``, with ``g ≤ 0`` and ``beta ∈ [0, 1]`` of shape ``[B, T, H]``
    (docs/math.md §2.1; ``scale`` defaults to 1)."""
    inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    return call("gated-deltanet", _config(scale=scale, chunk=chunk), inputs, **options)


def _lift(mask, lambda_scheme, scale, chunk) -> dict:
    return _config(mask=mask, lambda_scheme=lambda_scheme, scale=scale, chunk=chunk)


def loglinear_attention(q, k, v, lambda_, *, mask: Optional[str] = None, lambda_scheme: Optional[str] = None,
                        scale: Optional[float] = None, chunk: Optional[int] = None, **options):
    """The log-linear lift of linear attention: the contribution of ``s`` to ``t`` weighted by
    ``lambda_[b, t, h, ℓ(t, s)]`` (``[B, T, H, L]``, docs/math.md §2.3)."""
    inputs = {"q": q, "k": k, "v": v, "lambda": lambda_}
    return call("loglinear-attention", _lift(mask, lambda_scheme, scale, chunk), inputs, **options)


def loglinear_mamba2(q, k, v, g, lambda_, *, mask: Optional[str] = None, lambda_scheme: Optional[str] = None,
                     scale: Optional[float] = None, chunk: Optional[int] = None, **options):
    """The log-linear lift of Mamba-2 (docs/math.md §2.3): ``lambda_ [B, T, H, L]`` weights
    each Fenwick level."""
    inputs = {"q": q, "k": k, "v": v, "g": g, "lambda": lambda_}
    return call("loglinear-mamba2", _lift(mask, lambda_scheme, scale, chunk), inputs, **options)


def loglinear_gated_delta_rule(q, k, v, g, beta, lambda_, *, mask: Optional[str] = None,
                               lambda_scheme: Optional[str] = None, scale: Optional[float] = None,
                               chunk: Optional[int] = None, **options):
    """The log-linear lift of gated DeltaNet (docs/math.md §2.3): ``lambda_ [B, T, H, L]``
    weights each Fenwick level."""
    inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "lambda": lambda_}
    return call("loglinear-gated-deltanet", _lift(mask, lambda_scheme, scale, chunk), inputs, **options)


def glr(x, alpha, beta=None, *, pattern: Optional[str] = None, cache_efficient: Optional[bool] = None,
        order: Optional[int] = None, on: Optional[str] = None, **options):
    """A generalized linear recurrence on an offset pattern (docs/math.md §1.2):
    ``x, alpha [B, T, C]`` and ``beta [B, T, K, C]`` for ``on="b"`` (the default); with
    ``on="a"``, ``alpha [B, T, K+1, C]`` and no ``beta``."""
    cfg = _config(pattern=pattern, cache_efficient=cache_efficient, order=order, on=on)
    return call("glr", cfg, {"x": x, "alpha": alpha, "beta": beta}, **options)


def toeplitz(x, w, bias=None, *, heads: Optional[int] = None, kernel_width: Optional[int] = None,
             decoder: Optional[str] = None, **options):
    """The Toeplitz mixer (docs/math.md §3): a causal convolution per head with taps
    ``w [H, Tw]`` (``[Kw, H, Tw]`` with ``kernel_width`` Kw > 1), ``Tw ≥ T``, and an optional
    position ``bias [H, Tw]``."""
    cfg = _config(heads=heads, kernel_width=kernel_width, decoder=decoder)
    return call("toeplitz", cfg, {"x": x, "w": w, "bias": bias}, **options)
