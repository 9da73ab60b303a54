"""A small fla-style gated DeltaNet layer (q/k/v/g/β projections, short convolution left out,
the library's op through the fla signature) trained for a few steps: the loss goes down."""

import torch
import torch.nn.functional as F

import mixers


class GatedDeltaNet(torch.nn.Module):
    def __init__(self, d, heads, dk, dv):
        super().__init__()
        self.h, self.dk, self.dv = heads, dk, dv
        self.q = torch.nn.Linear(d, heads * dk, bias=False)
        self.k = torch.nn.Linear(d, heads * dk, bias=False)
        self.v = torch.nn.Linear(d, heads * dv, bias=False)
        self.a = torch.nn.Linear(d, heads, bias=False)  # decay input
        self.b = torch.nn.Linear(d, heads, bias=False)  # β logits
        self.A_log = torch.nn.Parameter(torch.zeros(heads))
        self.dt_bias = torch.nn.Parameter(torch.zeros(heads))
        self.o = torch.nn.Linear(heads * dv, d, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.dk)
        k = self.k(x).view(b, t, self.h, self.dk)
        v = self.v(x).view(b, t, self.h, self.dv)
        o, _ = mixers.chunk_gated_delta_rule(
            q, k, v, self.a(x), self.b(x), use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            use_gate_in_kernel=True, A_log=self.A_log, dt_bias=self.dt_bias,
        )
        return self.o(o.reshape(b, t, self.h * self.dv))


def test_layer_learns_to_recall_the_previous_token():
    torch.manual_seed(0)
    d, steps = 16, 40
    layer = GatedDeltaNet(d, heads=2, dk=8, dv=8)
    opt = torch.optim.Adam(layer.parameters(), lr=2e-2)
    x = torch.randn(8, 12, d)
    target = F.pad(x[:, :-1], (0, 0, 1, 0))  # y_t = x_{t-1}
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(layer(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())
    assert losses[-1] < 0.7 * losses[0], losses
