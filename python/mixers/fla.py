"""fla-compatible functions: the signatures, layouts and defaults of flash-linear-attention's
``chunk_simple_gla``, ``fused_recurrent_simple_gla``, ``chunk_gated_delta_rule``,
``fused_recurrent_gated_delta_rule`` and ``chunk_log_linear_attn``, computed by this
library's ops (so with its autograd, CPU backend and checks).

The mapping (docs/python.md has the table):

- layouts ``[B, T, H, D]`` and ``[B, T, H]`` are the library's own: no transposition;
- ``scale=None`` means ``1/√K`` as in fla (the library's own default is 1, so it is always
  passed explicitly); ``chunk_log_linear_attn`` has no scale in fla (its kernel applies
  none), and none here;
- states: fla's ``[N, H, K, V]`` is the transpose (per head) of the library's
  ``S [N, H, V, K]``; with ``state_v_first=True`` fla's state is ``[N, H, V, K]`` already;
- the chunked functions run the library's ``fast`` form, the ``fused_recurrent_*`` ones its
  ``recurrent`` form (token by token); both have the library's backward;
- grouped heads (fewer ``q``/``k`` heads than ``v`` heads) repeat ``q`` and ``k`` per group;
- ``use_qk_l2norm_in_kernel``, ``use_beta_sigmoid_in_kernel`` and ``use_gate_in_kernel``
  (``g = −exp(A_log)·softplus(g + dt_bias)``) are applied with PyTorch before the op.

Options fla has and the library does not (``allow_neg_eigval``: β in [0, 2) — the
library's β is in [0, 1] —, per-channel gates ``gk``/``gv``, ``reverse``,
``cp_context``) raise ``NotImplementedError``. The keyword-only ``backend`` and
``precision`` choose the library's backend and precision mode.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ._ops import call

__all__ = [
    "chunk_simple_gla",
    "fused_recurrent_simple_gla",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "chunk_log_linear_attn",
]


def _refuse(**flags) -> None:
    """``NotImplementedError`` for the first fla option that is set and has no counterpart."""
    for name, value in flags.items():
        if value is not None and value is not False:
            raise NotImplementedError(f"fla option `{name}` is not supported by mixers (given {value!r})")


def _extra(kwargs: dict, state_v_first: bool) -> bool:
    """Takes fla's deprecated alias ``transpose_state_layout`` out of ``kwargs``; refuses any
    other unknown keyword. Returns ``state_v_first``."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        state_v_first = bool(kwargs.pop("transpose_state_layout"))
    for unused in ("chunk_indices", "cu_seqlens_cpu"):
        kwargs.pop(unused, None)
    if kwargs:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(kwargs))}")
    return state_v_first


def _to_ours(state: Optional[torch.Tensor], state_v_first: bool) -> Optional[torch.Tensor]:
    """An fla state (``[N, H, K, V]``, or ``[N, H, V, K]`` when V-first) as the library's
    ``S [N, H, V, K]``."""
    if state is None or state_v_first:
        return state
    return state.transpose(-1, -2)


def _to_fla(state: Optional[torch.Tensor], state_v_first: bool) -> Optional[torch.Tensor]:
    """The library's ``S [N, H, V, K]`` in fla's layout."""
    if state is None or state_v_first:
        return state
    return state.transpose(-1, -2)


def _fla_result(out, output_final_state: bool, state_v_first: bool):
    """``(o, final_state in fla's layout or None)`` from what :func:`call` returned."""
    if output_final_state:
        y, s = out
        return y, _to_fla(s, state_v_first)
    return out, None


def _scale(scale: Optional[float], q: torch.Tensor) -> float:
    """fla's default scale ``1/√K``."""
    return float(q.shape[-1] ** -0.5) if scale is None else float(scale)


def _group(x: torch.Tensor, heads: int, what: str) -> torch.Tensor:
    """Repeats ``x``'s heads (axis 2) to ``heads`` (grouped heads: head ``h`` reads group
    ``h // (heads / groups)``)."""
    groups = x.shape[2]
    if groups == heads:
        return x
    if groups == 0 or heads % groups:
        raise ValueError(f"`{what}` has {groups} heads; the value heads ({heads}) must be a multiple of them")
    return x.repeat_interleave(heads // groups, dim=2)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """fla's L2 normalisation over the last axis: ``x / √(Σx² + 1e−6)``."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _simple_gla(form, q, k, v, g, g_gamma, scale, initial_state, output_final_state, state_v_first, cu_seqlens,
                backend, precision):
    if g is not None and g_gamma is not None:
        raise ValueError("give `g` or `g_gamma`, not both")
    if g is None and g_gamma is not None:
        g = g_gamma.to(v.dtype).expand(v.shape[0], v.shape[1], g_gamma.shape[-1])
    inputs = {"q": q, "k": k, "v": v}
    mixer = "linear-attention"
    if g is not None:
        inputs["g"] = g
        mixer = "mamba2"
    out = call(mixer, {"scale": _scale(scale, q)}, inputs, form=form, backend=backend, precision=precision,
               initial_state=_to_ours(initial_state, state_v_first), output_final_state=output_final_state,
               cu_seqlens=cu_seqlens)
    return _fla_result(out, output_final_state, state_v_first)


def chunk_simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    g_gamma: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[torch.LongTensor] = None,
    cu_seqlens_cpu: Optional[torch.LongTensor] = None,
    *,
    backend: Optional[str] = None,
    precision: str = "exact",
    **kwargs,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """fla's ``chunk_simple_gla``: the library's ``mamba2`` (``linear-attention`` without
    ``g``), fast form. ``q, k [B, T, H, K]``, ``v [B, T, H, V]``, ``g [B, T, H]`` the log
    decay (≤ 0) or ``g_gamma [H]`` a constant one; returns ``(o [B, T, H, V], final_state
    [N, H, K, V] or None)``."""
    state_v_first = _extra(kwargs, state_v_first)
    return _simple_gla("fast", q, k, v, g, g_gamma, scale, initial_state, output_final_state, state_v_first,
                       cu_seqlens, backend, precision)


def fused_recurrent_simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    g_gamma: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    reverse: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[torch.LongTensor] = None,
    *,
    backend: Optional[str] = None,
    precision: str = "exact",
    **kwargs,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """fla's ``fused_recurrent_simple_gla``: as :func:`chunk_simple_gla`, by the library's
    recurrent form (token by token)."""
    _refuse(reverse=reverse)
    state_v_first = _extra(kwargs, state_v_first)
    return _simple_gla("recurrent", q, k, v, g, g_gamma, scale, initial_state, output_final_state, state_v_first,
                       cu_seqlens, backend, precision)


def _gated_delta(form, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                 use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, state_v_first, cu_seqlens, backend,
                 precision):
    heads = v.shape[2]
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q, k = _group(q, heads, "q"), _group(k, heads, "k")
    if g is None:
        g = v.new_zeros(v.shape[:3])
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("use_gate_in_kernel=True needs `A_log` [HV]")
        g = -A_log.float().exp() * F.softplus(g.float() + (0.0 if dt_bias is None else dt_bias.float()))
        g = g.to(v.dtype)
    if beta is None:
        beta = v.new_ones(v.shape[:3])
    elif use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid()
    inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    out = call("gated-deltanet", {"scale": _scale(scale, q)}, inputs, form=form, backend=backend,
               precision=precision, initial_state=_to_ours(initial_state, state_v_first),
               output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    return _fla_result(out, output_final_state, state_v_first)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[torch.LongTensor] = None,
    cu_seqlens_cpu: Optional[torch.LongTensor] = None,
    chunk_indices: Optional[torch.LongTensor] = None,
    cp_context=None,
    *,
    use_gate_in_kernel: bool = False,
    A_log: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    precision: str = "exact",
    **kwargs,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """fla's ``chunk_gated_delta_rule``: the library's ``gated-deltanet``, fast form.
    ``q, k [B, T, H, K]``, ``v [B, T, HV, V]`` (``HV`` a multiple of ``H``), ``g [B, T, HV]``
    the log decay (≤ 0), ``beta [B, T, HV]`` in [0, 1]; returns ``(o [B, T, HV, V],
    final_state [N, HV, K, V] or None)``."""
    _refuse(allow_neg_eigval=allow_neg_eigval, cp_context=cp_context)
    state_v_first = _extra(kwargs, state_v_first)
    return _gated_delta("fast", q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                        use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, state_v_first, cu_seqlens,
                        backend, precision)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    gk: Optional[torch.Tensor] = None,
    gv: Optional[torch.Tensor] = None,
    beta: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[torch.LongTensor] = None,
    *,
    backend: Optional[str] = None,
    precision: str = "exact",
    **kwargs,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """fla's ``fused_recurrent_gated_delta_rule``: as :func:`chunk_gated_delta_rule`, by the
    library's recurrent form; ``g`` defaults to 0 (no decay) and ``beta`` to 1."""
    _refuse(gk=gk, gv=gv, allow_neg_eigval=allow_neg_eigval)
    state_v_first = _extra(kwargs, state_v_first)
    return _gated_delta("recurrent", q, k, v, g, beta, scale, initial_state, output_final_state,
                        use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                        state_v_first, cu_seqlens, backend, precision)


def chunk_log_linear_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    level_scales: torch.Tensor,
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens: Optional[torch.LongTensor] = None,
    *,
    backend: Optional[str] = None,
    precision: str = "exact",
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """fla's ``chunk_log_linear_attn``: the library's ``loglinear-mamba2`` (Fenwick levels,
    identity λ, scale 1 as fla's kernel), fast form. ``q, k [B, T, G, K]`` with ``G`` dividing
    ``H`` (fla: ``G = 1``, shared across heads), ``v [B, T, H, V]``, ``g [B, T, H]`` (≤ 0),
    ``level_scales [B, T, H, L]`` (≥ 0 here, ``L`` at least the number of Fenwick levels of
    the sequence). ``initial_state`` and the final state are the library's, not fla's
    ``LogLinearAttentionState``: a dict ``{"S": [N, H, L, V, K], "position": [N]}`` (the Fenwick
    level states merged ahead for the next token and the tokens consumed, docs/math.md §7.1),
    as this function returns it with ``output_final_state=True``; pass it back to continue the
    sequence (``L`` must then cover the levels of the whole sequence). Unlike fla's op, the
    backward runs through an initial state, on either backend."""
    if initial_state is not None and not isinstance(initial_state, dict):
        raise NotImplementedError(
            "chunk_log_linear_attn: initial_state is the state this function returns (a dict of the "
            "library's level states `S` and `position`), not fla's LogLinearAttentionState; got "
            f"{type(initial_state).__name__}"
        )
    heads = v.shape[2]
    q, k = _group(q, heads, "q"), _group(k, heads, "k")
    inputs = {"q": q, "k": k, "v": v, "g": g, "lambda": level_scales}
    out = call("loglinear-mamba2", {"scale": 1.0}, inputs, form="fast", backend=backend, precision=precision,
               initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    return out if output_final_state else (out, None)
