"""Tuning harness for the GLR fast-form kernel (mixer-cuda/kernels/glr.cu, glr_tiled) on a GPU
machine with CuPy, without a Rust build: compiles the kernel file with NVRTC under different
compile-time settings (tile length GLR_L, channels per block GLR_CH, taps sorted per token GLR_NN),
checks the first 8 channels against a float64 loop over the first 2500 tokens, and times the
kernel alone with CUDA events (inputs on the device, C = 1024, B = 1, has_a = 0).

    python3 bench/gpu/glr_tune.py [T]            # checks and timings of the default variants
    FILES=a.cu,b.cu python3 bench/gpu/glr_tune.py [T]   # the same for other kernel files, side by side
    ONE=1 python3 bench/gpu/glr_tune.py [T]      # one checked pow2 run (e.g. under compute-sanitizer)
"""
import sys, cupy as cp, numpy as np
import os
# The host prepends common.cuh and glr_common.cuh (glr_dep) to glr.cu.
COMMON = open("mixer-cuda/kernels/common.cuh").read() + open("mixer-cuda/kernels/glr_common.cuh").read()
FILES = os.environ.get("FILES", "mixer-cuda/kernels/glr.cu").split(",")
src = COMMON + open(FILES[0]).read()
T = int(sys.argv[1]) if len(sys.argv) > 1 else 65536
C = 1024
def table(pattern):
    if pattern == "pow2": f = [2**k for k in range(40) if 2**k <= T - 1]
    elif pattern == "sq1": f = [k * k + 1 for k in range(100000) if k * k + 1 <= T - 1]
    else: f = [k + 1 for k in range(4)]
    a = [1]
    for k in range(1, len(f)): a.append(a[-1] * -(-(f[k] - f[k-1]) // a[-1]))
    return np.array(f, np.int64), np.array(a, np.int64)
def knear(f, a, ce, L):
    ks = [k for k in range(len(f)) if f[k] - (a[k] if ce else 1) + 1 <= 2 * L - 1]
    return max(ks) + 1 if ks else 0
rng = cp.random.default_rng(0)
x = rng.standard_normal((T, C), dtype=cp.float32)
al = rng.standard_normal((T, C), dtype=cp.float32)
def run(pattern, ce, L=64, CH=8, NN=None, check=False, tlen=None, extra=(), code=None):
    code = code or src
    Tn = tlen or T
    f, a = table(pattern)
    f, a = f[f <= Tn - 1], a[:len(f[f <= Tn - 1])]
    K = len(f)
    beta = (rng.random((Tn, K, C), dtype=cp.float32) * (0.9 / K)).astype(cp.float32)
    kn_ = knear(f, a, ce, L)
    nn = NN or max(1, min(kn_, 16))
    TH = 32 + L * CH
    opts = ("--std=c++17", f"-DGLR_L={L}", f"-DGLR_CH={CH}", f"-DGLR_NN={nn}")
    if "GLR_NL" in code:
        # records [pre, b1, b2, list] and slot records (the layout of glr/fast.rs's smem_bytes)
        k2 = int(sum(1 for v in f if v <= 2)); nl = max(0, min(kn_, nn) - k2)
        rec, srec = (3 + nl + 3) // 4 * 4, 16 if nl > 8 else 8
        opts += (f"-DGLR_K2={k2}", f"-DGLR_NL={nl}", f"-DGLR_FARNEAR={int(kn_ > nn)}")
        smem = 2 * L * CH * rec * 4 + (2 * L + 1) * CH * 4 + 2 * L * CH * srec * 2
    else:  # the layout before the records (kernel files up to session 7), to time older files
        smem = 4 * L * CH * 4 + 2 * L * nn * CH * 4 + (2 * L + 1) * CH * 4 + 2 * L * nn * CH * 2
    mod = cp.RawModule(code=code, options=opts + tuple(extra))
    fn = mod.get_function("glr_tiled_f32")
    fn.max_dynamic_shared_size_bytes = 160 * 1024
    off, st = cp.asarray(f), cp.asarray(a)
    y = cp.full((Tn, C), cp.nan, cp.float32)
    args = (x, al, beta, off, st, y, np.int32(1), np.int32(Tn), np.int32(C), np.int32(K), np.int32(1), np.int32(0), np.int32(1), np.int32(int(ce)), np.int32(kn_))
    grid = ((C + CH - 1) // CH,)
    fn(grid, (TH,), args, shared_mem=smem)
    cp.cuda.Device().synchronize()
    msg = ""
    if check:
        xb, ab, bb, yb = cp.asnumpy(x[:Tn, :8]).astype(np.float64), cp.asnumpy(al[:Tn, :8]).astype(np.float64), cp.asnumpy(beta[:, :, :8]).astype(np.float64), cp.asnumpy(y[:, :8])
        n = min(Tn, 2500); ref = np.zeros((n, 8))
        for t in range(n):
            acc = ab[t] * xb[t]
            for k in range(K):
                if f[k] > t: break
                d = t - f[k] if not ce else a[k] * (-(-(t + 1 - f[k]) // a[k])) - 1
                acc = acc + bb[t, k] * ref[d]
            ref[t] = acc
        err = np.abs(yb[:n] - ref).max() / np.abs(ref).max()
        msg = f"  rel err {err:.2e}  nan {int(cp.isnan(y).sum())}"
    tag = ""
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(3):
        e0.record(); fn(grid, (TH,), args, shared_mem=smem); e1.record(); e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1))
    print(f"{tag}{' '.join(extra)} {pattern:5s} ce={int(ce)} T={Tn} L={L} CH={CH} NN={nn} knear={kn_} smem={smem}: {np.median(ts):8.3f} ms{msg}", flush=True)
    del beta
if os.environ.get("ONE"):
    run("pow2", False, check=True); sys.exit(0)
for fname in FILES:
    code = COMMON + open(fname).read()
    print("==", fname, flush=True)
    run("pow2", False, check=True, code=code)
    run("pow2", True, check=True, code=code)
    run("kth", False, check=True, code=code)
    run("pow2", False, NN=3, check=True, tlen=5000, code=code)
    run("pow2", True, NN=2, check=True, tlen=5000, code=code)
    run("sq1", False, check=True, tlen=4099, code=code)
    run("sq1", True, check=True, tlen=4099, code=code)
    run("pow2", False, check=True, tlen=777, code=code)
for fname in FILES:
    code = COMMON + open(fname).read()
    print("== timing", fname, flush=True)
    for _ in range(2):
        run("pow2", False, code=code)
        run("pow2", True, code=code)
        run("kth", False, code=code)
if not os.environ.get("FILES"):
    for (L, CH) in [(32, 8), (64, 4), (32, 16), (128, 4)]:
        run("pow2", False, L=L, CH=CH)
