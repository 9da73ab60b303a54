"""NVRTC through ctypes for the GPU harnesses: compiles a CUDA source to a cubin for an explicit
architecture (e.g. sm_90a, which Hopper's warpgroup MMA needs and CuPy's own compile does not
choose) and loads it as a CuPy module.

    from nvrtc_cubin import load
    mod = load(src, "sm_90a", ["-DATT_WGMMA=1"])   # a cupy.RawModule
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


def compile_cubin(src, arch, options=()):
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
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw


def load(src, arch, options=()):
    data = compile_cubin(src, arch, options)
    f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False)
    f.write(data)
    f.close()
    return cp.RawModule(path=f.name)
