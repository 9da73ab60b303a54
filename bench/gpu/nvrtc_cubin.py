"""NVRTC through ctypes for the GPU harnesses: compiles a CUDA source to a cubin for an explicit
architecture (e.g. sm_90a, which Hopper's warpgroup MMA needs and CuPy's own compile does not
choose) and loads it as a CuPy module; or compiles to PTX and lets the driver assemble it, as the
mixers runtime does (load_ptx). Unlike CuPy's RawModule(code=...), which appends -ftz=true to the
options, both compile with exactly the options given.

    from nvrtc_cubin import load, load_ptx
    mod = load(src, "sm_90a", ["-DATT_WGMMA=1"])   # a cupy.RawModule
    mod = load_ptx(src, "sm_90", ["-DLLC_DK=64"])  # as the runtime compiles and loads
"""
import ctypes
import glob
import os
import tempfile

import cupy as cp


def _lib():
    names = ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
    for pat in ("/usr/local/cuda/lib64/libnvrtc.so*", "/usr/lib/x86_64-linux-gnu/libnvrtc.so*"):
        names += sorted(glob.glob(pat))
    try:
        import nvidia  # pip wheels: nvidia/cu13/lib or nvidia/cuda_nvrtc/lib
        for d in nvidia.__path__:
            names += sorted(glob.glob(os.path.join(d, "*", "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    raise OSError("libnvrtc not found")


def _compile(src, arch, options, what):
    """NVRTC with exactly these options (no -ftz=true, which CuPy's own compile appends): the
    CUBIN (what="cubin") or the PTX (what="ptx")."""
    lib = _lib()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernel.cu", 0, None, None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"] + [o.encode() for o in options]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        raise RuntimeError(f"NVRTC error {rc}: {log.value.decode()[-3000:]}")
    size, get = (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if what == "cubin" else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
    size(prog, ctypes.byref(n))
    out = ctypes.create_string_buffer(n.value)
    get(prog, out)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return out.raw


def compile_cubin(src, arch, options=()):
    return _compile(src, arch, options, "cubin")


def _module(data, suffix):
    f = tempfile.NamedTemporaryFile(suffix=suffix, delete=False)
    f.write(data)
    f.close()
    return cp.RawModule(path=f.name)


def load(src, arch, options=()):
    """The module of NVRTC's CUBIN."""
    return _module(compile_cubin(src, arch, options), ".cubin")


def load_ptx(src, arch, options=()):
    """The module of NVRTC's PTX, assembled by the driver: what the mixers runtime loads by default
    (mixer-cuda/src/runtime.rs), options included."""
    return _module(_compile(src, arch, options, "ptx").rstrip(b"\0"), ".ptx")
