"""PyTorch reference points for the mixers CUDA backend, timed with CUDA events on the GPU.

    python3 bench/gpu/reference.py --out $OUT/reference.json [--seq 1024,4096,16384,65536] [--batch 1] [--heads 16] [--dim 64]

Measures, per T (fp32, like the mixers kernels):
  * attention: torch.nn.functional.scaled_dot_product_attention, causal;
  * toeplitz:  causal convolution by torch.fft.rfft/irfft (padding 2T), one kernel per channel;
  * mamba2:    a straightforward chunked SSD forward (chunk 64) written with torch ops.
Each result: median milliseconds over repeats after warm-up, tokens/s, and the achieved
FLOP/s or bytes/s from simple operation counts (stated next to each formula below).
"""
import argparse
import json
import math

import torch


def timed(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2], times[0], times[-1]


def attention(B, T, H, D):
    q, k, v = (torch.randn(B, H, T, D, device="cuda") for _ in range(3))
    f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    flops = 2 * 2 * B * H * D * T * T / 2  # QK^T and PV, causal half
    return f, flops, None


def toeplitz(B, T, H, D):
    C = H * D
    x = torch.randn(B, T, C, device="cuda")
    w = torch.randn(C, T, device="cuda") * torch.exp(-torch.arange(T, device="cuda") / 64.0)
    n = 2 * T

    def f():
        X = torch.fft.rfft(x, n=n, dim=1)
        W = torch.fft.rfft(w.t(), n=n, dim=0)
        return torch.fft.irfft(X * W.unsqueeze(0), n=n, dim=1)[:, :T]

    bytes_moved = 4 * (B * T * C * 2 + C * T)  # read x, w; write y (lower bound)
    return f, None, bytes_moved


def mamba2_chunked(B, T, H, D, chunk=64):
    # q=C, k=B, v=Δx, g=ΔA (log-decay ≤ 0); y_t = Σ_{s≤t} (q_t·k_s) exp(G_t − G_s) v_s
    Tp = (T + chunk - 1) // chunk * chunk
    q, k, v = (torch.randn(B, Tp, H, D, device="cuda") for _ in range(3))
    g = -torch.rand(B, Tp, H, device="cuda")
    nc = Tp // chunk

    def f():
        qc, kc, vc = (t.view(B, nc, chunk, H, D).permute(0, 3, 1, 2, 4) for t in (q, k, v))  # B H n c D
        gc = g.view(B, nc, chunk, H).permute(0, 3, 1, 2)  # B H n c
        G = gc.cumsum(-1)
        diff = G.unsqueeze(-1) - G.unsqueeze(-2)  # t, s
        mask = torch.tril(torch.ones(chunk, chunk, device="cuda", dtype=torch.bool))
        L = torch.exp(diff.masked_fill(~mask, float("-inf")))
        intra = ((qc @ kc.transpose(-1, -2)) * L) @ vc
        decay_to_end = torch.exp(G[..., -1:] - G)  # B H n c
        states = (kc * decay_to_end.unsqueeze(-1)).transpose(-1, -2) @ vc  # B H n D D
        chunk_decay = torch.exp(G[..., -1])  # B H n
        S = torch.zeros(B, H, D, D, device="cuda")
        prev = []
        for i in range(nc):
            prev.append(S)
            S = S * chunk_decay[..., i, None, None] + states[:, :, i]
        prev = torch.stack(prev, 2)  # B H n D D
        inter = (qc * torch.exp(G).unsqueeze(-1)) @ prev
        return (intra + inter).permute(0, 2, 3, 1, 4).reshape(B, Tp, H, D)[:, :T]

    flops = B * H * nc * (2 * chunk * chunk * D * 2 + 2 * chunk * D * D * 2)
    return f, flops, None


def check_mamba2(T=200, chunk=64):
    """The chunked reference against the quadratic definition (so its timings time the right thing)."""
    torch.manual_seed(0)
    B, H, D = 1, 2, 8
    fn, _, _ = mamba2_chunked(B, T, H, D, chunk)
    # rebuild the same inputs through the closure's cells
    cells = {name: c.cell_contents for name, c in zip(fn.__code__.co_freevars, fn.__closure__)}
    q, k, v, g = (cells[n][:, :T].double() for n in ("q", "k", "v", "g"))
    G = g.cumsum(1)  # B T H
    y = torch.zeros(B, T, H, D, dtype=torch.float64, device="cuda")
    for t in range(T):
        w = torch.einsum("bhd,bshd->bsh", q[:, t], k[:, : t + 1]) * torch.exp(G[:, t : t + 1] - G[:, : t + 1])
        y[:, t] = torch.einsum("bsh,bshd->bhd", w, v[:, : t + 1])
    got = fn().double()
    return ((got - y).norm() / y.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq", default="1024,4096,16384,65536")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    err = check_mamba2()
    print(json.dumps({"mamba2_reference_rel_err_vs_quadratic": err}), flush=True)
    assert err < 1e-4, f"chunked Mamba-2 reference disagrees with its definition: {err}"
    for T in [int(s) for s in a.seq.split(",")]:
        for name, make in [("attention", attention), ("toeplitz", toeplitz), ("mamba2", mamba2_chunked)]:
            try:
                fn, flops, nbytes = make(a.batch, T, a.heads, a.dim)
                med, lo, hi = timed(fn)
                row = {"mixer": name, "T": T, "batch": a.batch, "heads": a.heads, "dim": a.dim, "ms": med, "ms_min": lo, "ms_max": hi,
                       "tokens_per_s": a.batch * T / (med / 1e3)}
                if flops:
                    row["tflops"] = flops / (med / 1e3) / 1e12
                if nbytes:
                    row["gbytes_per_s"] = nbytes / (med / 1e3) / 1e9
            except Exception as e:  # out of memory at large T is a result, not a crash
                row = {"mixer": name, "T": T, "error": str(e).splitlines()[0]}
            print(json.dumps(row), flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "mamba2_reference_rel_err": err, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
