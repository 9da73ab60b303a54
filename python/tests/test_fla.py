"""The fla-compatible functions: fla's layouts, scale default and state orientation, checked
against naive float64 recurrences written here in fla's own convention (state [K, V] per head,
o_t = scale · S_tᵀ q_t), so a transposed state or a wrong scale fails; and against the
library's own functions with the mapping applied."""

import math

import pytest
import torch

import mixers
from mixers import fla

B, T, H, K, V = 2, 7, 2, 4, 3  # K != V: a transposed state cannot pass silently


def rand_inputs(batch=B, seq=T, heads=H, grouped_qk_heads=None):
    qk_heads = grouped_qk_heads or heads
    q = torch.randn(batch, seq, qk_heads, K, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(batch, seq, qk_heads, K, dtype=torch.float64), dim=-1)
    v = torch.randn(batch, seq, heads, V, dtype=torch.float64)
    g = -0.3 * torch.rand(batch, seq, heads, dtype=torch.float64)
    beta = torch.rand(batch, seq, heads, dtype=torch.float64)
    return q, k, v, g, beta


def naive_gated_delta(q, k, v, g, beta, scale, h0=None, delta=True):
    """fla's recurrence, state S [B, H, K, V]: S ← e^g S; S ← S + k (β (v − Sᵀk))ᵀ (delta
    rule) or S + k vᵀ (simple GLA); o = scale Sᵀ q."""
    b, t, h, _ = q.shape
    S = torch.zeros(b, h, K, V, dtype=torch.float64) if h0 is None else h0.clone()
    o = torch.zeros(b, t, h, V, dtype=torch.float64)
    for i in range(t):
        S = S * g[:, i].exp()[..., None, None]
        ki, vi, qi = k[:, i], v[:, i], q[:, i]
        if delta:
            u = beta[:, i][..., None] * (vi - torch.einsum("bhkv,bhk->bhv", S, ki))
        else:
            u = vi
        S = S + torch.einsum("bhk,bhv->bhkv", ki, u)
        o[:, i] = scale * torch.einsum("bhkv,bhk->bhv", S, qi)
    return o, S


@pytest.mark.parametrize("fn", [fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule])
def test_gated_delta_rule_matches_fla_convention(fn):
    q, k, v, g, beta = rand_inputs()
    h0 = torch.randn(B, H, K, V, dtype=torch.float64)
    o, ht = fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True)  # fla: gk, gv come before beta in the recurrent one
    want_o, want_s = naive_gated_delta(q, k, v, g, beta, K ** -0.5, h0)
    assert ht.shape == (B, H, K, V)
    torch.testing.assert_close(o, want_o, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ht, want_s, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fn", [fla.chunk_simple_gla, fla.fused_recurrent_simple_gla])
def test_simple_gla_matches_fla_convention(fn):
    q, k, v, g, _ = rand_inputs()
    h0 = torch.randn(B, H, K, V, dtype=torch.float64)
    o, ht = fn(q, k, v, g, scale=0.7, initial_state=h0, output_final_state=True)
    want_o, want_s = naive_gated_delta(q, k, v, g, None, 0.7, h0, delta=False)
    torch.testing.assert_close(o, want_o, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ht, want_s, rtol=1e-10, atol=1e-10)
    o2, none = fn(q, k, v, g)  # default scale 1/√K, no state
    assert none is None
    torch.testing.assert_close(o2, naive_gated_delta(q, k, v, g, None, K ** -0.5, delta=False)[0])


def test_simple_gla_without_gate_and_with_g_gamma():
    q, k, v, g, _ = rand_inputs()
    o, _ = fla.chunk_simple_gla(q, k, v)
    torch.testing.assert_close(o, naive_gated_delta(q, k, v, torch.zeros_like(g), None, K ** -0.5, delta=False)[0])
    gamma = -torch.tensor([0.1, 0.5], dtype=torch.float64)
    o, _ = fla.chunk_simple_gla(q, k, v, g_gamma=gamma)
    torch.testing.assert_close(o, naive_gated_delta(q, k, v, gamma.expand(B, T, H), None, K ** -0.5, delta=False)[0])


def test_state_v_first_and_wrappers_equal_our_functions():
    q, k, v, g, beta = rand_inputs()
    h0 = torch.randn(B, H, K, V, dtype=torch.float64)
    o, ht = fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o_vf, ht_vf = fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0.transpose(-1, -2).contiguous(),
                                             output_final_state=True, state_v_first=True)
    assert torch.equal(o, o_vf) and torch.equal(ht, ht_vf.transpose(-1, -2))
    ours, s = mixers.gated_delta_rule(q, k, v, g, beta, scale=K ** -0.5, initial_state=h0.transpose(-1, -2),
                                      output_final_state=True)
    assert torch.equal(o, ours) and torch.equal(ht, s.transpose(-1, -2))


def test_packed_sequences_and_state_gradients():
    q, k, v, g, beta = (t[:1].requires_grad_() for t in rand_inputs())
    cu = torch.tensor([0, 3, 7])
    h0 = torch.randn(2, H, K, V, dtype=torch.float64, requires_grad=True)
    o, ht = fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    for i in range(2):
        a, b = cu[i], cu[i + 1]
        want_o, want_s = naive_gated_delta(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], K ** -0.5,
                                           h0[i:i + 1])
        torch.testing.assert_close(o[:, a:b], want_o)
        torch.testing.assert_close(ht[i:i + 1], want_s)
    assert torch.autograd.gradcheck(
        lambda h, q_: fla.chunk_gated_delta_rule(q_, k, v, g, beta, initial_state=h, output_final_state=True,
                                                 cu_seqlens=cu),
        (h0, q),
    )


def test_grouped_value_heads_and_kernel_options():
    q, k, v, g, beta = rand_inputs(heads=4, grouped_qk_heads=2)
    o, _ = fla.chunk_gated_delta_rule(q, k, v, g, beta)
    want, _ = naive_gated_delta(q.repeat_interleave(2, 2), k.repeat_interleave(2, 2), v, g, beta, K ** -0.5)
    torch.testing.assert_close(o, want)
    raw_q, raw_k = 3 * q, 2 * k
    logits = torch.randn_like(beta)
    o, _ = fla.chunk_gated_delta_rule(raw_q, raw_k, v, g, logits, use_qk_l2norm_in_kernel=True,
                                      use_beta_sigmoid_in_kernel=True)
    nq = raw_q / (raw_q.square().sum(-1, keepdim=True) + 1e-6).sqrt()
    nk = raw_k / (raw_k.square().sum(-1, keepdim=True) + 1e-6).sqrt()
    want, _ = naive_gated_delta(nq.repeat_interleave(2, 2), nk.repeat_interleave(2, 2), v, g, logits.sigmoid(),
                                K ** -0.5)
    torch.testing.assert_close(o, want)


def fenwick_level(t, s):
    return 0 if t == s else (t ^ s).bit_length()


def test_log_linear_attention_matches_fenwick_levels():
    q, k, v, g, _ = rand_inputs(grouped_qk_heads=1)
    levels = 1 + (T - 1).bit_length()
    lam = torch.rand(B, T, H, levels, dtype=torch.float64)
    o, none = fla.chunk_log_linear_attn(q, k, v, g, lam)
    assert none is None
    G = g.cumsum(1)
    want = torch.zeros(B, T, H, V, dtype=torch.float64)
    for t in range(T):
        for s in range(t + 1):
            w = lam[:, t, :, fenwick_level(t, s)] * (G[:, t] - G[:, s]).exp()  # [B, H]
            w = w * torch.einsum("bk,bk->b", q[:, t, 0], k[:, s, 0])[:, None]
            want[:, t] += w[..., None] * v[:, s]
    torch.testing.assert_close(o, want, rtol=1e-10, atol=1e-10)
    ours = mixers.loglinear_mamba2(q.expand(-1, -1, H, -1), k.expand(-1, -1, H, -1), v, g, lam)
    assert torch.equal(o, ours)


def test_unsupported_fla_options_raise():
    q, k, v, g, beta = rand_inputs()
    with pytest.raises(NotImplementedError, match="allow_neg_eigval"):
        fla.chunk_gated_delta_rule(q, k, v, g, beta, allow_neg_eigval=True)
    with pytest.raises(NotImplementedError, match="reverse"):
        fla.fused_recurrent_simple_gla(q, k, v, g, reverse=True)
    with pytest.raises(NotImplementedError, match="LogLinearAttentionState"):
        fla.chunk_log_linear_attn(q, k, v, g, torch.rand(B, T, H, 4, dtype=torch.float64), initial_state=object())
    with pytest.raises(TypeError, match="unexpected keyword"):
        fla.chunk_simple_gla(q, k, v, g, bogus=1)


@pytest.mark.parametrize("a", [1, 5, T // 2])
def test_log_linear_attention_continues_from_its_final_state(a):
    """A sequence in two calls, the second from the first's final state, equals one call, and
    the gradients flow through the state (fla's op has no backward through an initial state)."""
    q, k, v, g, _ = rand_inputs(grouped_qk_heads=1)
    lam = torch.rand(B, T, H, 1 + (T - 1).bit_length(), dtype=torch.float64)
    xs = [t.clone().requires_grad_(True) for t in (q, k, v, g, lam)]
    r = torch.randn(B, T, H, V, dtype=torch.float64)
    whole, _ = fla.chunk_log_linear_attn(*xs)
    want = torch.autograd.grad((whole * r).sum(), xs)
    head = [t[:, :a] for t in xs]
    tail = [t[:, a:] for t in xs]
    o1, s = fla.chunk_log_linear_attn(*head, output_final_state=True)
    assert sorted(s) == ["S", "position"] and s["position"].tolist() == [a] * B
    o2, s2 = fla.chunk_log_linear_attn(*tail, initial_state=s, output_final_state=True)
    assert s2["position"].tolist() == [T] * B
    o = torch.cat([o1, o2], dim=1)
    torch.testing.assert_close(o, whole, rtol=1e-10, atol=1e-10)
    got = torch.autograd.grad((o * r).sum(), xs)
    for name, gw, gg in zip("q k v g lambda".split(), want, got):
        torch.testing.assert_close(gg, gw, rtol=1e-9, atol=1e-10, msg=lambda m: f"d_{name}: {m}")
