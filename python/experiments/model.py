"""The model of every experiment: token and learned position embeddings, ``layers`` pre-norm
blocks ``h ← h + W_o·mix(RMSNorm(h))``, ``h ← h + MLP(RMSNorm(h))`` (GELU, hidden ``mlp·D``), a
final RMSNorm and a linear head — the Rust trainer's model (docs/training.md), with the mixer run
by the package's op ``mixers.run(name, config, …)`` (the library's forward and backward).

Each family's layer makes the mixer's inputs from the block's normalised input ``u [B, T, D]``
(``H`` heads of ``D/H`` channels), as the Rust trainer's layers do (``train/src/layer.rs``):

==========================  ========================================================================
family                      mixer inputs
==========================  ========================================================================
attention (+ window)        ``q, k, v = u·W_q, u·W_k, u·W_v``; scale ``1/√(D/H)``
GLR (``on = "b"``)          ``x = u·W_x``, ``α = σ(u·W_α + b_α)`` per channel,
                            ``β[t, j] = γ_t · softmax_{j active at t}(q_t·k_{d_j(t)}/√(D/H) + b_j)``
                            per head, ``γ = σ(u·W_γ + b_γ)``: ``Σ_j |β_{t,j}| = γ_t ≤ 1`` (stable)
GLR (``on = "a"``)          ``x = u·W_x``, ``α[t, 0 | 1+j] = softmax over the token itself and the
                            active slots of q'_t·k'_s/√(D/H) + b'`` per head (its own ``W_q', W_k'``,
                            bias ``b' [K+1, H]``): attention restricted to the pattern; no ``β``
GLR (``on = "both"``)       the ``α`` of ``"a"`` and the ``β`` of ``"b"``
Mamba-2                     ``q, k, v`` projections, ``g = −e^{a_h}·softplus(u·W_g + b_g)``,
                            scale ``1/√(D/H)``
gated DeltaNet              the same with ``q, k`` L2-normalised per head, ``β = σ(u·W_β + b_β)``
log-linear lifts            the base's, and ``λ = u·W_λ + b_λ`` under the ``softplus`` scheme
                            ``softplus(θ_{h,ℓ}·λ)`` with ``θ [H, L]`` a parameter (init 1)
Toeplitz                    ``x = u·W_x``; taps ``w [H, T]`` parameters (init: identity tap plus
                            ``0.5/(lag+1)``)
==========================  ========================================================================

The GLR slots — which earlier position ``d_j(t)`` slot ``j`` of token ``t`` reads — are read from
the library itself (:func:`glr_sources`), so the layer holds no copy of the patterns.
"""

from __future__ import annotations

import functools
import math
from typing import Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import mixers

#: Registered mixers by family of layer.
ATTENTION = ("attention", "local-attention")
SSD = ("mamba2", "gated-deltanet", "loglinear-mamba2", "loglinear-gated-deltanet")


def family(name: str) -> str:
    """The layer family of registered mixer ``name`` (``attention``, ``glr``, ``ssd``,
    ``toeplitz``); ``ValueError`` for a mixer without a training layer."""
    if name in ATTENTION:
        return "attention"
    if name in SSD:
        return "ssd"
    fam = mixers.spec(name)["family"]
    if fam in ("glr", "toeplitz"):
        return fam
    raise ValueError(
        f"no training layer for mixer `{name}` (family `{fam}`); expected attention, local-attention, "
        f"a GLR mixer, {', '.join(SSD)} or toeplitz"
    )


@functools.lru_cache(maxsize=None)
def glr_sources(name: str, config_json: str, t: int) -> np.ndarray:
    """``d [T, K]``: the position that slot ``j`` of token ``t`` reads (``−1``: inactive), read
    from the library by an impulse probe: with ``x_t = t + 1``, ``α = 1`` and only slot ``c``
    of channel ``c`` set to ``ε``, the recurrence ``y_t = α_t x_t + Σ_j β_{t,j} y_{d_j(t)}`` gives
    ``y_t − x_t = ε·(d_c(t) + 1) + O(ε²·T²)``, which rounds to the source exactly for ``ε = 10⁻⁹``
    and ``T`` up to 10⁴ in float64 (an inactive slot gives 0)."""
    import json

    cfg = json.loads(config_json)
    k = mixers.random_inputs(name, cfg, batch=1, seq=t, channels=1)["beta"].shape[2]
    eps = 1e-9
    out = np.full((t, k), -1, dtype=np.int64)
    for lo in range(0, k, 64):  # slots in groups, to bound the probe's memory (T·64·K)
        c = min(64, k - lo)
        x = torch.arange(1, t + 1, dtype=torch.float64)[None, :, None].expand(1, t, c).contiguous()
        beta = torch.zeros(1, t, k, c, dtype=torch.float64)
        idx = torch.arange(c)
        beta[0, :, lo + idx, idx] = eps
        y = mixers.run(name, cfg, x=x, alpha=torch.ones_like(x), beta=beta, backend="cpu")
        r = ((y - x)[0] / eps).numpy()
        out[:, lo : lo + c] = np.where(r > 0.5, np.rint(r - 1.0), -1).astype(np.int64)
    return out


def linear(fan_in: int, fan_out: int, bias: bool = False) -> nn.Linear:
    """A linear map with weights drawn from ``N(0, 1/fan_in)`` and zero bias (the Rust trainer's
    initialisation of projections)."""
    m = nn.Linear(fan_in, fan_out, bias=bias)
    nn.init.normal_(m.weight, std=1.0 / math.sqrt(fan_in))
    if bias:
        nn.init.zeros_(m.bias)
    return m


def _softplus_inv(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class MixerLayer(nn.Module):
    """One token-mixing layer: the mixer's inputs from ``u``, the op, the output projection."""

    def __init__(self, name: str, config: Dict, width: int, heads: int, seq: int, layers: int,
                 backend: Optional[str] = None, form: str = "fast", conv: int = 0):
        super().__init__()
        # A short causal depthwise convolution of the layer's input (kernel ``conv``; 0: none),
        # as Mamba-2's and gated DeltaNet's layers and Zoology's attention models have: each
        # token's inputs to the mixer see the few tokens before it.
        self.conv = nn.Conv1d(width, width, conv, groups=width, padding=conv - 1) if conv > 0 else None
        if heads < 1 or width % heads:
            raise ValueError(f"width {width} must be a positive multiple of heads {heads}")
        self.name, self.fam, self.backend, self.form = name, family(name), backend, form
        self.d, self.h, self.dh, self.t = width, heads, width // heads, seq
        cfg = dict(config)
        d, h = width, heads
        lin = lambda cols, bias=False: linear(d, cols, bias)  # noqa: E731
        if self.fam == "attention":
            self.wq, self.wk, self.wv = lin(d), lin(d), lin(d)
        elif self.fam == "glr":
            self.on = cfg.get("on", "b")
            if self.on not in ("a", "b", "both"):
                raise ValueError(f"`{name}`: on must be \"a\", \"b\" or \"both\", got on = {self.on!r}")
            import json

            # The slots' sources do not depend on where the pattern sits.
            src = glr_sources(name, json.dumps({**cfg, "on": "b"}, sort_keys=True), seq)
            self.register_buffer("src", torch.from_numpy(np.maximum(src, 0)), persistent=False)
            self.register_buffer("active", torch.from_numpy(src >= 0), persistent=False)
            k = src.shape[1]
            self.wx = lin(d)
            if self.on == "b":
                self.walpha = lin(d, True)
            else:  # the pattern on A: attention over the token itself and its slots
                self.wqa, self.wka = lin(d), lin(d)
                self.slot_bias_a = nn.Parameter(torch.zeros(k + 1, h))
            if self.on != "a":  # the pattern on B
                self.wq, self.wk = lin(d), lin(d)
                self.slot_bias = nn.Parameter(torch.zeros(k, h))
                self.wgamma = lin(h, True)
                nn.init.ones_(self.wgamma.bias)
        elif self.fam == "ssd":
            self.gdn = "deltanet" in name
            self.lift = name.startswith("loglinear-")
            self.wq, self.wk, self.wv = lin(d), lin(d), lin(d)
            self.wg = lin(h, True)
            nn.init.normal_(self.wg.weight, std=0.1 / math.sqrt(d))
            # Δ = softplus(b_g) spread over the heads (slow to fast decay), a_h = 0.
            bg = [_softplus_inv(0.02 * 8.0 ** (i / max(h, 2) * 2.0)) for i in range(h)]
            with torch.no_grad():
                self.wg.bias.copy_(torch.tensor(bg))
            self.a_log = nn.Parameter(torch.zeros(h))
            cfg.setdefault("scale", 1.0 / math.sqrt(self.dh))
            if self.gdn:
                self.wb = lin(h, True)
            if self.lift:
                cfg.setdefault("lambda_scheme", "softplus")
                levels = mixers.random_inputs(name, cfg, batch=1, seq=seq, heads=1)["lambda"].shape[-1]
                self.levels = levels
                self.wlambda = lin(h * levels, True)
                nn.init.normal_(self.wlambda.weight, std=0.1 / math.sqrt(d))
                nn.init.constant_(self.wlambda.bias, _softplus_inv(1.0))
                self.lambda_param = nn.Parameter(torch.ones(h, levels))
        else:  # toeplitz
            cfg.setdefault("heads", h)
            th = int(cfg["heads"])
            kw = int(cfg.get("kernel_width", 1))
            self.wx = lin(d)
            lag = torch.arange(seq, dtype=torch.float32)
            base = torch.where(lag == 0, torch.ones(()), 0.5 / (lag + 1.0))
            taps = torch.zeros(kw, th, seq)
            taps[-1] = base
            self.taps = nn.Parameter(taps[0] if kw == 1 else taps)
        self.config = cfg
        self.wo = linear(d, d)
        nn.init.normal_(self.wo.weight, std=1.0 / math.sqrt(d) / math.sqrt(2.0 * layers))

    def _run(self, **inputs):
        return mixers.run(self.name, self.config, backend=self.backend, form=self.form, **inputs)

    def slot_scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``z [B, T, K, H]``: ``q_t · k_{src(t, j)}`` per slot ``j`` and head, from ``q, k [B, T, H, dh]``:
        every score of a head (``[B, T, H, T]``) and then each slot's, which costs less than
        gathering each slot's key (``[B, T, K, H, dh]``, whose backward scatters into ``k``) once
        ``K·dh`` nears ``T`` (the dense recurrence: ``K = T − 1``)."""
        b, t, h, _ = q.shape
        s = torch.einsum("bthd,bshd->bths", q, k)
        idx = self.src[None, :, None, :].expand(b, t, h, self.src.shape[1])
        return torch.gather(s, 3, idx).transpose(2, 3)

    def slot_weights(self, q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, with_self: bool) -> torch.Tensor:
        """``[B, T, S, H]``: per head, the softmax over a token's active slots (with ``with_self``,
        the token itself first, always active) of ``q_t·k_src/√(D/H) + bias``; 0 at inactive slots
        and for a token without an active one."""
        z, mask = self.slot_scores(q, k), self.active[None, :, :, None]
        if with_self:
            z = torch.cat([(q * k).sum(-1)[:, :, None, :], z], dim=2)
            mask = torch.cat([torch.ones_like(mask[:, :, :1]), mask], dim=2)
        z = z / math.sqrt(self.dh) + bias
        return torch.softmax(z.masked_fill(~mask, -1e30), dim=2) * mask

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        b, t, _ = u.shape
        if t != self.t:
            raise ValueError(f"the layer was built for sequences of {self.t} tokens, got {t}")
        h, dh = self.h, self.dh
        if self.conv is not None:
            u = self.conv(u.transpose(1, 2))[..., :t].transpose(1, 2)
        heads = lambda z: z.view(b, t, h, dh)  # noqa: E731
        if self.fam == "attention":
            y = self._run(q=heads(self.wq(u)), k=heads(self.wk(u)), v=heads(self.wv(u)))
        elif self.fam == "glr":
            inputs = {"x": self.wx(u)}
            if self.on == "b":
                inputs["alpha"] = torch.sigmoid(self.walpha(u))
            else:  # entry 0: the token itself
                pa = self.slot_weights(heads(self.wqa(u)), heads(self.wka(u)), self.slot_bias_a, with_self=True)
                inputs["alpha"] = pa.repeat_interleave(dh, dim=3)  # [B, T, K + 1, D]
            if self.on != "a":
                p = self.slot_weights(heads(self.wq(u)), heads(self.wk(u)), self.slot_bias, with_self=False)
                gamma = torch.sigmoid(self.wgamma(u))  # [B, T, H]
                inputs["beta"] = (p * gamma[:, :, None, :]).repeat_interleave(dh, dim=3)  # [B, T, K, D]
            y = self._run(**inputs)
        elif self.fam == "ssd":
            q, k, v = heads(self.wq(u)), heads(self.wk(u)), heads(self.wv(u))
            if self.gdn:
                q, k = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
            g = -self.a_log.exp() * F.softplus(self.wg(u))
            inputs = {"q": q, "k": k, "v": v, "g": g}
            if self.gdn:
                inputs["beta"] = torch.sigmoid(self.wb(u))
            if self.lift:
                inputs["lambda_"] = self.wlambda(u).view(b, t, h, self.levels)
                inputs["lambda_param"] = self.lambda_param
            y = self._run(**inputs)
        else:
            y = self._run(x=self.wx(u), w=self.taps)
        return self.wo(y.reshape(b, t, self.d))


class Block(nn.Module):
    """``h ← h + mix(RMSNorm(h))``, ``h ← h + W₂·GELU(W₁·RMSNorm(h))``."""

    def __init__(self, mixer: str, config: Dict, width: int, heads: int, seq: int, layers: int, mlp: int,
                 backend: Optional[str], form: str, conv: int = 0):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(width), nn.RMSNorm(width)
        self.mix = MixerLayer(mixer, config, width, heads, seq, layers, backend, form, conv)
        self.mlp = nn.Sequential(linear(width, mlp * width, True), nn.GELU(), linear(mlp * width, width, True))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.mix(self.norm1(h))
        return h + self.mlp(self.norm2(h))


class Model(nn.Module):
    """Embeddings, ``layers`` blocks with mixer ``mixer`` (``config``), final norm and head; the
    mixer runs its form ``form`` on ``backend`` (the package's default for ``None``), after a
    short causal convolution of kernel ``conv`` (0: none)."""

    def __init__(self, mixer: str, config: Dict, vocab: int, seq: int, width: int = 32, layers: int = 2,
                 heads: int = 2, mlp: int = 2, backend: Optional[str] = None, form: str = "fast", conv: int = 0,
                 pos_std: float = 1.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        nn.init.normal_(self.tok.weight, std=1.0)
        # Positions at the tokens' scale by default (``pos_std``): at a tenth of it attention did
        # not learn MQAR in 1500 steps without the short convolution (docs/papers.md).
        nn.init.normal_(self.pos.weight, std=pos_std)
        self.blocks = nn.ModuleList(
            Block(mixer, config, width, heads, seq, layers, mlp, backend, form, conv) for _ in range(layers)
        )
        self.norm = nn.RMSNorm(width)
        self.head = linear(width, vocab, True)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, T]`` → the last block's output ``[B, T, width]``."""
        t = tokens.shape[1]
        h = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        for blk in self.blocks:
            h = blk(h)
        return h

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, T]`` → logits ``[B, T, vocab]``."""
        return self.head(self.norm(self.hidden(tokens)))

    def logits_at(self, tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The logits of the positions ``rows`` (indices into the ``B·T`` flattened positions)
        only, ``[len(rows), vocab]``: the rows of :meth:`forward`'s logits, without the head's
        work for the others (the norm and the head act position by position)."""
        return self.head(self.norm(self.hidden(tokens).flatten(0, 1).index_select(0, rows)))
