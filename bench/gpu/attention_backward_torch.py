"""PyTorch's scaled_dot_product_attention (causal, fp32) forward and forward+backward at the
shapes of the CUDA backward's timing test (mixer-cuda/tests/all/backward.rs, `backward_timing`),
for the ratio in docs/gradients.md. CUDA events, median of 5 runs after a warm-up.

    python3 bench/gpu/attention_backward_torch.py
"""

import torch
import torch.nn.functional as F


def median_ms(f):
    f()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        f()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    return sorted(times)[2]


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for b, t, h, d in [(1, 16384, 16, 64), (8, 4096, 16, 64), (8, 4096, 16, 128)]:
        q, k, v = (torch.randn(b, h, t, d, device="cuda", requires_grad=True) for _ in range(3))
        dy = torch.randn(b, h, t, d, device="cuda")

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(y, (q, k, v), dy)

        f, fb = median_ms(fwd), median_ms(fwd_bwd)
        print(f"TORCH sdpa fp32 B={b} T={t} H={h} D={d} ms: fwd={f:.3f} fwd+bwd={fb:.3f} bwd={fb - f:.3f}", flush=True)


if __name__ == "__main__":
    main()
