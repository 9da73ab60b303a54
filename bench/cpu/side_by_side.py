"""mixers' CPU fast forms side by side with PyTorch CPU, same sizes, same threads, one run.

    python3 bench/cpu/side_by_side.py [--mixers PATH/TO/mixers] [--threads 2] [--seq 4096,16384]
                                      [--out DIR] [--pin 0,1]

Our side: `mixers bench --backend cpu --form fast` (f32, B = 1, H = 4, D = 64; median of
--reps runs after one untimed run), one process per mixer, with RAYON_NUM_THREADS=threads.
PyTorch side (same process count, torch.set_num_threads(threads)), median of the same number
of runs after one warm-up run, wall clock:
  * attention       torch.nn.functional.scaled_dot_product_attention(causal), [B,H,T,D]
  * toeplitz        causal convolution by torch.fft.rfft / irfft with 2T padding, one kernel
                    per channel (C = H·D = 256), the kernel spectrum computed in the call
  * mamba2          chunked SSD (chunk 64) in torch ops: intra-chunk masked (QKᵀ ⊙ L)V,
                    chunk states, a scan over chunks, inter-chunk read
  * gated-deltanet  chunked WY form (chunk 64) in torch ops: (I + strict-lower βKKᵀ⊙Γ)⁻¹ by
                    forward substitution, u = T·βV, w = T·βK·Γ, per-chunk state update
Both torch recurrences are first checked against a token-by-token torch recurrence at T = 100
(relative error printed; the run stops if it exceeds 1e-4).
With --pin, both sides run under `taskset -c PIN` (Linux).
Writes side_by_side.md / .json under --out and prints the Markdown table. torch is installed
with pip if it is missing (this script only; nothing else in the project needs it).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def ensure_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("side_by_side: installing torch with pip (only this script needs it)...", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "torch", "numpy"])
    import torch
    return torch


def our_times(binary, mixer, seqs, threads, reps, pin):
    out = tempfile.mkdtemp(prefix="sbs-")
    cmd = [binary, "bench", "--backend", "cpu", "--form", "fast", "--mixer", mixer, "--seq",
           ",".join(str(s) for s in seqs), "--batch", "1", "--heads", "4", "--dim", "64", "--dtype", "f32",
           "--reps", str(reps), "--max-seconds", "1000", "--quiet", "--out", out]
    if pin:
        cmd = ["taskset", "-c", pin] + cmd
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "bench.json")) as f:
        points = json.load(f)["points"]
    shutil.rmtree(out, ignore_errors=True)
    return {p["seq"]: p["timing"]["median"] for p in points if p["status"] == "ok" and p["form"] == "fast"}


def torch_side(args):
    """Runs in a child process (so that --pin applies to it): prints {name: {T: seconds}}."""
    torch = ensure_torch()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, H, D, C, CH = 1, 4, 64, 256, 64
    seqs = [int(s) for s in args.seq.split(",")]

    def median_time(fn):
        fn()
        ts = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    def mamba2_chunked(q, k, v, g):
        # q, k, v [B,H,T,D]; g [B,H,T] (log-decays ≤ 0); T a multiple of CH
        Bn, Hn, T, Dk = q.shape
        n = T // CH
        qc, kc, vc = (x.reshape(Bn, Hn, n, CH, -1) for x in (q, k, v))
        G = g.reshape(Bn, Hn, n, CH).cumsum(-1)
        mask = torch.ones(CH, CH, dtype=torch.bool).tril()
        L = torch.exp((G[..., :, None] - G[..., None, :]).masked_fill(~mask, float("-inf")))
        y = ((qc @ kc.transpose(-1, -2)) * L) @ vc
        states = (kc * torch.exp(G[..., -1:] - G)[..., None]).transpose(-1, -2) @ vc  # B H n Dk Dv
        S = torch.zeros(Bn, Hn, Dk, vc.shape[-1], dtype=q.dtype)
        for i in range(n):
            y[:, :, i] += (qc[:, :, i] * torch.exp(G[:, :, i])[..., None]) @ S
            S = S * torch.exp(G[:, :, i, -1])[..., None, None] + states[:, :, i]
        return y.reshape(Bn, Hn, T, -1)

    def gdn_chunked(q, k, v, g, beta):
        Bn, Hn, T, Dk = q.shape
        n = T // CH
        qc, kc, vc = (x.reshape(Bn, Hn, n, CH, -1) for x in (q, k, v))
        bc = beta.reshape(Bn, Hn, n, CH)
        G = g.reshape(Bn, Hn, n, CH).cumsum(-1)
        incl = torch.ones(CH, CH, dtype=torch.bool).tril()
        strict = torch.ones(CH, CH, dtype=torch.bool).tril(-1)
        Gam = torch.exp((G[..., :, None] - G[..., None, :]).masked_fill(~incl, float("-inf")))
        kb = kc * bc[..., None]
        A = -((kb @ kc.transpose(-1, -2)) * Gam).masked_fill(~strict, 0.0)  # strictly lower
        Tm = A.clone()
        for i in range(1, CH):  # (I − A')⁻¹ row by row (forward substitution)
            Tm[..., i, :i] = Tm[..., i, :i] + (Tm[..., i, :, None] * Tm[..., :, :i]).sum(-2)
        Tm = Tm + torch.eye(CH, dtype=q.dtype)
        u = Tm @ (vc * bc[..., None])
        w = Tm @ (kb * torch.exp(G)[..., None])
        S = torch.zeros(Bn, Hn, Dk, vc.shape[-1], dtype=q.dtype)
        y = torch.empty_like(vc)
        for i in range(n):
            qi, ki = qc[:, :, i], kc[:, :, i]
            vi = u[:, :, i] - w[:, :, i] @ S
            inner = (qi @ ki.transpose(-1, -2)) * Gam[:, :, i]
            y[:, :, i] = (qi * torch.exp(G[:, :, i])[..., None]) @ S + inner @ vi
            S = S * torch.exp(G[:, :, i, -1])[..., None, None] + (
                ki * torch.exp(G[:, :, i, -1:] - G[:, :, i])[..., None]).transpose(-1, -2) @ vi
        return y.reshape(Bn, Hn, T, -1)

    def recurrent(q, k, v, g, beta=None):
        Bn, Hn, T, Dk = q.shape
        S = torch.zeros(Bn, Hn, Dk, v.shape[-1], dtype=q.dtype)
        ys = []
        for t in range(T):
            S = S * torch.exp(g[:, :, t])[..., None, None]
            kt, vt = k[:, :, t], v[:, :, t]
            if beta is None:
                S = S + kt[..., :, None] * vt[..., None, :]
            else:
                b = beta[:, :, t][..., None]
                vnew = b * (vt - (kt[..., None, :] @ S).squeeze(-2))
                S = S + kt[..., :, None] * vnew[..., None, :]
            ys.append((q[:, :, t][..., None, :] @ S).squeeze(-2))
        return torch.stack(ys, 2)

    # self-check of the two chunked references against the recurrence (T = 128, f64)
    Tc = 128
    q, k, v = (torch.randn(B, H, Tc, D, dtype=torch.float64) for _ in range(3))
    k = k / k.norm(dim=-1, keepdim=True)
    g = -torch.rand(B, H, Tc, dtype=torch.float64) * 0.2
    beta = torch.rand(B, H, Tc, dtype=torch.float64)
    checks = {}
    for name, a, b_ in (("mamba2", mamba2_chunked(q, k, v, g), recurrent(q, k, v, g)),
                        ("gated-deltanet", gdn_chunked(q, k, v, g, beta), recurrent(q, k, v, g, beta))):
        err = float((a - b_).norm() / b_.norm())
        checks[name] = err
        if err > 1e-4:
            raise SystemExit(f"torch reference {name} disagrees with its recurrence: rel err {err}")

    res = {"attention": {}, "toeplitz": {}, "mamba2": {}, "gated-deltanet": {}, "checks": checks,
           "torch": torch.__version__, "threads": torch.get_num_threads()}
    for T in seqs:
        q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
        kn = k / k.norm(dim=-1, keepdim=True)
        g = -torch.rand(B, H, T) * 0.1
        beta = torch.rand(B, H, T)
        res["attention"][T] = median_time(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        res["mamba2"][T] = median_time(lambda: mamba2_chunked(q, k, v, g))
        res["gated-deltanet"][T] = median_time(lambda: gdn_chunked(q, kn, v, g, beta))
        x = torch.randn(B, T, C)
        w = torch.randn(C, T) * torch.exp(-torch.arange(T) / 64.0)

        def conv():
            X = torch.fft.rfft(x, n=2 * T, dim=1)
            W = torch.fft.rfft(w, n=2 * T, dim=1).t()
            return torch.fft.irfft(X * W.unsqueeze(0), n=2 * T, dim=1)[:, :T]

        res["toeplitz"][T] = median_time(conv)
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mixers", default=shutil.which("mixers") or "target/release/mixers")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", default="4096,16384")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pin", default="")
    ap.add_argument("--out", default="out/side_by_side")
    ap.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_child:
        torch_side(a)
        return
    ensure_torch()
    seqs = [int(s) for s in a.seq.split(",")]
    cmd = [sys.executable, __file__, "--torch-child", "--threads", str(a.threads), "--seq", a.seq, "--reps", str(a.reps)]
    if a.pin:
        cmd = ["taskset", "-c", a.pin] + cmd
    ref = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    ours = {
        "attention": our_times(a.mixers, "attention", seqs, a.threads, a.reps, a.pin),
        "toeplitz": our_times(a.mixers, 'toeplitz{"heads":256}', seqs, a.threads, a.reps, a.pin),
        "mamba2": our_times(a.mixers, "mamba2", seqs, a.threads, a.reps, a.pin),
        "gated-deltanet": our_times(a.mixers, "gated-deltanet", seqs, a.threads, a.reps, a.pin),
        "loglinear-mamba2": our_times(a.mixers, "loglinear-mamba2", seqs, a.threads, a.reps, a.pin),
        "loglinear-gated-deltanet": our_times(a.mixers, "loglinear-gated-deltanet", seqs, a.threads, a.reps, a.pin),
    }
    rows = ["| mixer | T | ours (ms) | PyTorch CPU (ms) | ours / PyTorch |", "|---|---|---|---|---|"]
    for name in ("attention", "toeplitz", "mamba2", "gated-deltanet"):
        for T in seqs:
            o, r = ours[name].get(T), ref[name].get(str(T))
            if o is None or r is None:
                rows.append(f"| {name} | {T} | {o} | {r} | n/a |")
                continue
            rows.append(f"| {name} | {T} | {o * 1e3:.1f} | {r * 1e3:.1f} | {o / r:.2f} |")
    for lift, base in (("loglinear-mamba2", "mamba2"), ("loglinear-gated-deltanet", "gated-deltanet")):
        for T in seqs:
            o, b = ours[lift].get(T), ours[base].get(T)
            if o is not None and b is not None:
                rows.append(f"| {lift} (vs our {base}) | {T} | {o * 1e3:.1f} | — | {o / b:.2f} × base |")
    md = "\n".join(rows)
    meta = (f"threads {a.threads}{', pinned to CPUs ' + a.pin if a.pin else ''}; torch {ref['torch']}; "
            f"torch reference self-check rel err: " + ", ".join(f"{k} {v:.1e}" for k, v in ref["checks"].items()))
    print(md)
    print(meta)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "side_by_side.md"), "w") as f:
        f.write(md + "\n\n" + meta + "\n")
    with open(os.path.join(a.out, "side_by_side.json"), "w") as f:
        json.dump({"ours": ours, "torch": ref, "meta": meta}, f, indent=1)


if __name__ == "__main__":
    main()
