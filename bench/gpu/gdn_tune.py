"""Tuning harness for gated DeltaNet's chunked kernels on a GPU machine with CuPy, without a Rust
build: the sequential state pass (`--kernel delta_h`: mixer-cuda/kernels/loglinear_state_pass.cu,
`llc_delta_h` and its tensor-core forms) and the WY/UT pieces (`--kernel wy`:
mixer-cuda/kernels/loglinear_wy.cu, `llc_wy` and `llc_wy_tc`). It compiles kernel files with NVRTC,
runs each variant on the same device-resident inputs, compares what it writes against the FMA
kernel of the shipped file (delta_h: the entering states Hs and, without a lift, the new values Vn;
wy: W, U and, with a lift, T⁻¹), and times each kernel alone with CUDA events (median of --reps
after a warm-up).

    python3 bench/gpu/gdn_tune.py --plan PLAN.json [--kernel delta_h|wy] [--lineinfo]
        [--cupy-compile] [VARIANT ...]

The launches come from the host, never derived here: each --plan FILE is the JSON of
`mixer_cuda::loglinear::plan` (`serde_json::to_string(&plan(..))`; one plan or a list of plans per
file) for the shape and mode tuned. The sizes (B, T, H, D = Dk = Dv, the lift) are the first plan's;
a kernel's defines, threads, dynamic shared memory and buffers (ARG_ST) are those of a plan's
launch of that function: its `launches` (what the host runs) or its `alternatives` (the other
state-pass variants that fit, and the FMA WY kernel, which hold the FMA reference kernels
`llc_delta_h_f32` and `llc_wy_f32`). --T, --H, --D and --lifted, where given, must match the plans.

With --lineinfo, under `ncu --section SourceCounters --section WarpStateStats -k regex:NAME`, Nsight
Compute names the kernel's source lines with the most stall samples.

Kernels are compiled as the host compiles them: NVRTC with the given defines only, the PTX
assembled by the driver (`nvrtc_cubin.load_ptx`). `--cupy-compile` uses CuPy's RawModule instead,
which appends `-ftz=true` (denormals flushed) and so builds other code than the host runs; timings
before session 13 were taken that way.

VARIANT is `file.cu:function:threads[:NAME=V,NAME=V]` (compiled after common.cuh and
loglinear_common.cuh, as the host does): compile-time defines, except `SMEM=n` (the dynamic shared
memory of the launch; default: that of the plans' launch of the function, which must name every
kernel define the variant gives with the same value), `CARVEOUT=p` (the preferred shared-memory
carveout, percent of the L1/shared capacity: the driver otherwise may pick a smaller configuration
than the blocks per SM that registers and shared memory allow) and `ARG_ST=n`, which passes n as one
more kernel argument (the shipped `llc_delta_h_tc` and `llc_lift_h` take their number of buffers
so). `llc_delta_h_rg_f32:32·DHR_WARPS:DHR_WARPS=w,DHR_ST=s` is the pass without a lift with the state
in registers (grid over value columns in blocks of 16·w); `llc_delta_h_rb_bf16` the same on bf16
operands (k, W, U rounded to bf16 here; bf16 Vn), and `llc_wy_tc_bf16` the WY kernel of the bf16
mode (bf16 k, v in, bf16 W, U out): their outputs differ from the f32 reference by bf16 roundings.
Default: the first plan's launch of the kernel (its state pass, or its WY launch), where this
harness runs that kernel (not the transition form `llc_lift_h`). Inputs are synthetic but shaped
like the real ones: unit-norm key rows, β in (0, 1), log-decays in (−0.05, 0); for delta_h W = 0.5·K
(so that the state update S ← e^a S + K̂ᵀ(U − W S) stays bounded), rounded to tf32 as the WY kernel
stores it.
"""
import argparse, json, os, sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvrtc_cubin import load_ptx  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--kernel", choices=("delta_h", "wy"), default="delta_h")
ap.add_argument("--plan", action="append", required=True, metavar="FILE",
                help="a launch plan of mixer_cuda::loglinear::plan as JSON (repeatable)")
ap.add_argument("--T", type=int)
ap.add_argument("--H", type=int)
ap.add_argument("--D", type=int)
ap.add_argument("--lifted", action="store_true", default=None)
ap.add_argument("--reps", type=int, default=10)
ap.add_argument("--lineinfo", action="store_true", help="compile with -lineinfo (Nsight Compute source counters)")
ap.add_argument("--cupy-compile", action="store_true",
                help="compile with CuPy's RawModule (adds -ftz=true; the default compiles as the host does)")
ap.add_argument("variants", nargs="*")
a = ap.parse_args()
common = open("mixer-cuda/kernels/common.cuh").read() + "\n" + open("mixer-cuda/kernels/loglinear_common.cuh").read()
PLANS = []
for path in a.plan:
    got = json.load(open(path))
    PLANS += got if isinstance(got, list) else [got]
if not PLANS:
    sys.exit("the plan files hold no plan")
shape = PLANS[0]["shape"]
if shape["dk"] != shape["dv"]:
    sys.exit(f"the harness takes Dk = Dv; the plan is for Dk = {shape['dk']}, Dv = {shape['dv']}")
for name, given, want in (("T", a.T, shape["t"]), ("H", a.H, shape["h"]), ("D", a.D, shape["dk"]),
                          ("lifted", a.lifted, PLANS[0]["lifted"])):
    if given is not None and given != want:
        sys.exit(f"--{name} {given} does not match the plan's {want}: make a plan for this shape")
B, T, H, D = shape["b"], shape["t"], shape["h"], shape["dk"]
a.lifted = PLANS[0]["lifted"]
CH = PLANS[0]["chunk"]
nc = (T + CH - 1) // CH
E = (nc - 1).bit_length() + 1 if a.lifted else 1
mods = {}
OPTIN = cp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
ARCH = "sm_" + cp.cuda.Device().compute_capability

def settings(defs):
    """A variant's NAME=V settings as a dict."""
    return dict(x.split("=") for x in defs.split(",") if "=" in x)

def function(path, name, defs=""):
    if (path, defs) not in mods:
        opts = (("-lineinfo",) if a.lineinfo else ()) + tuple(
            f"-D{d}" for d in defs.split(",") if d and not d.startswith("ARG_"))
        src = common + open(path).read()
        if a.cupy_compile:  # CuPy's compile: it appends -ftz=true, which the host does not pass
            mods[(path, defs)] = cp.RawModule(code=src, options=("--std=c++17",) + opts)
        else:  # as the host: NVRTC with these options only, the driver assembling the PTX
            mods[(path, defs)] = load_ptx(src, ARCH, opts)
    f = mods[(path, defs)].get_function(name)
    # As the host's opt_in: the whole opt-in shared memory allowed, the launch asking for what the
    # kernel needs. (Allowing only what the launch asks for can make the driver pick a smaller
    # shared-memory configuration, and fewer blocks per SM, than the host's launches get.)
    f.max_dynamic_shared_size_bytes = OPTIN - f.shared_size_bytes
    d = settings(defs)
    if "CARVEOUT" in d:  # the shared-memory share of the SM's L1 the driver is asked for (percent)
        f.preferred_shared_memory_carveout = int(d["CARVEOUT"])
    return f

HARNESS_KEYS = ("SMEM", "CARVEOUT")

def kernel_defines(defs):
    """A variant's kernel defines (not the harness's own settings) as a dict."""
    return {k: v for k, v in settings(defs).items() if k not in HARNESS_KEYS and not k.startswith("ARG_")}

def planned(name, defs=""):
    """A plan's launch of `name` (among its launches, then its alternatives) that fits the variant's
    settings: every kernel define the variant gives named by the launch with the same value, and its
    ARG_ST the launch's buffers. None where no plan has one."""
    want, st = kernel_defines(defs), settings(defs).get("ARG_ST")
    for plan in PLANS:
        for l in plan["launches"] + plan["alternatives"]:
            have = dict(d.split("=") for d in l["defines"])
            if l["function"] != name or any(have.get(k) != v for k, v in want.items()):
                continue
            if st is not None and str(l.get("stages")) != st:
                continue
            return l
    return None

def launch_smem(name, defs):
    """The dynamic shared memory the host launches `name` with (the plans' launch), or `SMEM=n` from
    the variant's settings: the number of blocks per SM, and so the timing, depends on it."""
    d = settings(defs)
    if "SMEM" in d:
        return int(d["SMEM"])
    found = planned(name, defs)
    if found is None:
        sys.exit(f"no plan launches {name} with {defs or 'these settings'}: give --plan of a shape and mode "
                 "that runs it, or SMEM=n")
    return found["shared_mem"]

def variant_of(l):
    """The variant string of a plan's launch: its file, function, threads, defines and, for the
    kernels that take it as an argument, the number of buffers."""
    defs = list(l["defines"]) + ([f"ARG_ST={l['stages']}"] if l.get("stages") is not None else [])
    return f"mixer-cuda/kernels/{l['source']}.cu:{l['function']}:{l['block']}:{','.join(defs)}"

slots = sum(bin(j).count("1") for j in range(nc)) if a.lifted else nc
rng = cp.random.default_rng(0)
k = rng.standard_normal((B, T, H, D), dtype=cp.float32)
k /= cp.linalg.norm(k, axis=-1, keepdims=True)
U = rng.standard_normal((B, T, H, D), dtype=cp.float32)
g = (-0.05 * rng.random((B, T, H), dtype=cp.float32)).astype(cp.float32)
beta = (1 / (1 + cp.exp(-rng.standard_normal((B, T, H), dtype=cp.float32)))).astype(cp.float32)
W = (0.5 * k).astype(cp.float32)
# W as llc_wy_tc stores it for the sequential pass: rounded to tf32 (nearest, ties away).
W = ((W.view(cp.uint32) + cp.uint32(0x1000)) & cp.uint32(0xFFFFE000)).view(cp.float32)

def to_bf16(x):
    """f32 rounded to bf16 (nearest even), as its bits (uint16)."""
    u = x.view(cp.uint32)
    return ((u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)

def from_bf16(b):
    return (b.astype(cp.uint32) << 16).view(cp.float32)

def args_and_outputs(name, defs):
    """The kernel's arguments, grid and the outputs it writes (compared in this order). Kernels
    named *_bf16 (the bf16 mode's llc_wy_tc_bf16, llc_delta_h_rb_bf16) take k, v (U) and W rounded
    to bf16 and write bf16 W, U, Vn."""
    extra = tuple(np.int32(int(d.split("=")[1])) for d in defs.split(",") if d.startswith("ARG_ST="))
    if name.endswith("_bf16"):
        warps = int(settings(defs).get("DHR_WARPS", 1))
        kb, Ub, Wb = to_bf16(k), to_bf16(U), to_bf16(W)
        if a.kernel == "delta_h":
            Vn = cp.zeros((B, T, H, D), cp.uint16)
            Hs = cp.zeros((B * H, slots, D, D), cp.float32)
            args = (kb, g, np.int32(1), Wb, Ub, Vn, Hs, np.int32(T), np.int32(H), np.int32(D), np.int32(D), np.int32(nc))
            return args, (B * H, (D + 16 * warps - 1) // (16 * warps)), {"Hs": Hs, "Vn": Vn}
        Wo = cp.zeros((B, T, H, D), cp.uint16)
        Uo = cp.zeros((B, T, H, D), cp.uint16)
        Ti = cp.zeros(1, cp.float32)
        args = (kb, Ub, g, np.int32(1), beta, Wo, Uo, Ti, np.int32(0), np.int32(T), np.int32(H), np.int32(D), np.int32(D))
        return args, (nc, B * H), {"W": Wo, "U": Uo}
    if a.kernel == "delta_h":
        Vn = cp.zeros((B, T, H, D) if not a.lifted else 1, cp.float32)
        Hs = cp.zeros((B * H, slots, D, D), cp.float32)
        args = (k, g, np.int32(1), W, U, Vn, Hs, np.int32(T), np.int32(H), np.int32(D), np.int32(D), np.int32(nc))
        if name.startswith("llc_delta_h_rg"):  # no lift; warps of 16 value columns
            warps = int(settings(defs).get("DHR_WARPS", 1))
            return args, (B * H, (D + 16 * warps - 1) // (16 * warps)), {"Hs": Hs, "Vn": Vn}
        args += (np.int32(int(a.lifted)), np.int32(E), np.int64(slots)) + extra
        if name == "llc_delta_h_f32":  # no initial or final state: S0, has_s0 = 0, ST, has_st = 0
            args += (Hs, np.int32(0), Hs, np.int32(0))
        return args, (B * H, (D + 15) // 16), {"Hs": Hs} if a.lifted else {"Hs": Hs, "Vn": Vn}
    Wo = cp.zeros((B, T, H, D), cp.float32)
    Uo = cp.zeros((B, T, H, D), cp.float32)
    Ti = cp.zeros((B * H * nc * CH * CH) if a.lifted else 1, cp.float32)
    args = (k, U, g, np.int32(1), beta, Wo, Uo, Ti, np.int32(int(a.lifted)), np.int32(T), np.int32(H), np.int32(D),
            np.int32(D)) + extra
    outs = {"W": Wo, "U": Uo}
    if a.lifted:
        outs["Ti"] = Ti
    return args, (nc, B * H), outs

def run(path, name, threads, defs=""):
    f = function(path, name, defs)
    args, grid, outs = args_and_outputs(name, defs)
    smem = launch_smem(name, defs)
    launch = lambda: f(grid, (threads,), args, shared_mem=smem)
    launch()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(a.reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(); launch(); e1.record(); e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1))
    return outs, float(np.median(times))

def rel(x, y):
    x = from_bf16(x) if x.dtype == cp.uint16 else x
    return float(cp.sqrt(cp.mean((x - y) ** 2)) / (cp.sqrt(cp.mean(y ** 2)) + 1e-30))

print(f"kernel={a.kernel} B={B} T={T} H={H} D={D} lifted={a.lifted} chunks={nc} levels={E} slots={slots}")
ref_name = "llc_delta_h_f32" if a.kernel == "delta_h" else "llc_wy_f32"
ref_launch = planned(ref_name)
if ref_launch is None:
    sys.exit(f"no plan launches the reference {ref_name} (its FMA state pass does not fit?)")
ref_v = variant_of(ref_launch)
ref_path, _, _, ref_defs = ref_v.split(":")
ref, rt = run(ref_path, ref_name, 256, ref_defs)
first = next(iter(ref.values()))
print(f"reference {ref_v} (FMA): {rt:.3f} ms, rms {float(cp.sqrt(cp.mean(first**2))):.3g}, "
      f"finite {all(bool(cp.isfinite(x).all()) for x in ref.values())}")
# the host's launch of the kernel tuned: the first plan's state pass (or WY launch)
step = "state_pass" if a.kernel == "delta_h" else "wy"
runs = ("llc_delta_h_f32", "llc_delta_h_tc_f32", "llc_delta_h_rg_f32", "llc_delta_h_rb_bf16") if a.kernel == "delta_h" \
    else ("llc_wy_f32", "llc_wy_tc_f32", "llc_wy_tc_bf16")
default = [variant_of(l) for l in PLANS[0]["launches"] if l["step"] == step and l["function"] in runs]
if not a.variants and not default:
    sys.exit(f"the first plan has no {step} launch this harness runs ({PLANS[0].get('state_pass')}); name variants")
for v in a.variants or default:
    path, name, threads, *defs = v.split(":")
    try:
        outs, t = run(path, name, int(threads), defs[0] if defs else "")
    except Exception as e:  # a variant that does not compile or launch: say so, go on
        print(f"{v}: failed: {type(e).__name__}: {e}")
        continue
    err = ", ".join(f"{key} rel {rel(outs[key], ref[key]):.2e}" for key in ref)
    print(f"{v}: {t:.3f} ms ({rt / t:.2f}x the FMA kernel), {err}")
