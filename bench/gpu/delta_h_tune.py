"""Tuning harness for gated DeltaNet's sequential pass (mixer-cuda/kernels/loglinear_chunked.cu:
`llc_delta_h` and its tensor-core variant `llc_delta_h_tc`) on a GPU machine with CuPy, without a
Rust build. It compiles kernel files with NVRTC, runs each variant on the same device-resident
inputs, compares what it writes (the entering states Hs and, without a lift, the new values Vn)
against the FMA kernel `llc_delta_h_f32` of the shipped file, and times each kernel alone with
CUDA events (median of 10 after a warm-up).

    python3 bench/gpu/delta_h_tune.py [--T 16384] [--H 16] [--D 64] [--lifted] [VARIANT ...]

VARIANT is `file.cu:function:threads[:NAME=V,NAME=V]`: compile-time defines, except `ARG_ST=n`,
which passes n as one more kernel argument (the shipped `llc_delta_h_tc` takes its number of
buffers so). Default: the shipped file's `llc_delta_h_tc_f32:256:ARG_ST=3`.
Inputs are synthetic but shaped like the real ones: unit-norm key rows, W = 0.5·K (so that the
state update S ← e^a S + K̂ᵀ(U − W S) stays bounded), log-decays in (−0.05, 0).
"""
import argparse, cupy as cp, numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--T", type=int, default=16384)
ap.add_argument("--H", type=int, default=16)
ap.add_argument("--D", type=int, default=64)
ap.add_argument("--lifted", action="store_true")
ap.add_argument("--reps", type=int, default=10)
ap.add_argument("variants", nargs="*")
a = ap.parse_args()
common = open("mixer-cuda/kernels/common.cuh").read()
SHIPPED = "mixer-cuda/kernels/loglinear_chunked.cu"
mods = {}
SMEM = 220 * 1024  # below the 227 KB a block may opt in to on sm_90 (static shared memory counts too)

def function(path, name, defs=""):
    if (path, defs) not in mods:
        opts = ("--std=c++17",) + tuple(f"-D{d}" for d in defs.split(",") if d and not d.startswith("ARG_"))
        mods[(path, defs)] = cp.RawModule(code=common + open(path).read(), options=opts)
    f = mods[(path, defs)].get_function(name)
    f.max_dynamic_shared_size_bytes = SMEM
    return f

B, T, H, D = 1, a.T, a.H, a.D
CH = 64
nc = (T + CH - 1) // CH
E = (nc - 1).bit_length() + 1 if a.lifted else 1
slots = sum(bin(j).count("1") for j in range(nc)) if a.lifted else nc
rng = cp.random.default_rng(0)
k = rng.standard_normal((B, T, H, D), dtype=cp.float32)
k /= cp.linalg.norm(k, axis=-1, keepdims=True)
W = (0.5 * k).astype(cp.float32)
U = rng.standard_normal((B, T, H, D), dtype=cp.float32)
g = (-0.05 * rng.random((B, T, H), dtype=cp.float32)).astype(cp.float32)

def run(path, name, threads, defs=""):
    f = function(path, name, defs)
    Vn = cp.zeros((B, T, H, D), cp.float32) if not a.lifted else cp.zeros(1, cp.float32)
    Hs = cp.zeros((B * H, slots, D, D), cp.float32)
    args = (k, g, np.int32(1), W, U, Vn, Hs, np.int32(T), np.int32(H), np.int32(D), np.int32(D), np.int32(nc),
            np.int32(int(a.lifted)), np.int32(E), np.int64(slots))
    args += tuple(np.int32(int(d.split("=")[1])) for d in defs.split(",") if d.startswith("ARG_ST="))
    grid = (B * H, (D + 15) // 16)
    launch = lambda: f(grid, (threads,), args, shared_mem=SMEM)
    launch()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(a.reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(); launch(); e1.record(); e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1))
    return Vn, Hs, float(np.median(times))

def rel(x, y):
    return float(cp.sqrt(cp.mean((x - y) ** 2)) / (cp.sqrt(cp.mean(y ** 2)) + 1e-30))

print(f"T={T} H={H} D={D} lifted={a.lifted} chunks={nc} levels={E} slots={slots}")
rV, rH, rt = run(SHIPPED, "llc_delta_h_f32", 256)
print(f"reference llc_delta_h_f32 (FMA): {rt:.3f} ms, |Hs| rms {float(cp.sqrt(cp.mean(rH**2))):.3g}, finite {bool(cp.isfinite(rH).all())}")
for v in a.variants or [f"{SHIPPED}:llc_delta_h_tc_f32:256:ARG_ST=3"]:
    path, name, threads, *defs = v.split(":")
    try:
        V, Hh, t = run(path, name, int(threads), defs[0] if defs else "")
    except Exception as e:  # a variant that does not compile or launch: say so, go on
        print(f"{v}: failed: {type(e).__name__}: {e}")
        continue
    err = f"Hs rel {rel(Hh, rH):.2e}" + ("" if a.lifted else f", Vn rel {rel(V, rV):.2e}")
    print(f"{v}: {t:.3f} ms ({rt / t:.2f}x the FMA kernel), {err}")
