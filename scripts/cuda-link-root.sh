#!/usr/bin/env bash
# Builds a CUDA toolkit root for compiling with linked CUDA libraries (the `cuda` feature of
# mixers-candle, which candle builds with nvcc and links against the libraries) on a machine
# without a CUDA installation: nvcc, headers and libraries from NVIDIA's PyPI wheels, plus a
# link-time stub of the driver library (at run time the driver's own libcuda.so.1 loads).
#
#   scripts/cuda-link-root.sh DIR
#   export CUDA_ROOT=DIR PATH=DIR/bin:$PATH CUDA_COMPUTE_CAP=90
#   cargo build --release -p mixers-candle --features cuda
#
# The default build needs none of this: it loads the CUDA libraries at run time.
set -euo pipefail
root="${1:?usage: $0 DIR}"
cd "$(dirname "$0")/.."
mkdir -p "$root"
root="$(cd "$root" && pwd)"

venv="$root/venv"
[ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
# The compiler and headers of CUDA 13.0, the version of the H200 machines' driver (580): PTX of a
# newer nvcc would not load there. The libraries keep their sonames across 13.x.
"$venv/bin/pip" install -q 'nvidia-cuda-nvcc==13.0.*' 'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-cccl==13.0.*' \
  'nvidia-cuda-nvrtc==13.0.*' 'nvidia-nvvm==13.0.*' 'nvidia-cuda-crt==13.0.*' nvidia-cublas nvidia-curand nvidia-cufft nvidia-nccl-cu13
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cu="$site/nvidia/cu13"

ln -sfn "$cu/bin" "$root/bin"
ln -sfn "$cu/include" "$root/include"
ln -sfn "$cu/nvvm" "$root/nvvm"
mkdir -p "$root/lib64/stubs"
# The unversioned names the linker asks for (`-lcublas` finds libcublas.so).
for f in "$cu"/lib/lib*.so.* "$site"/nvidia/nccl/lib/libnccl.so.*; do
  base="$(basename "$f")"
  ln -sfn "$f" "$root/lib64/$base"
  ln -sfn "$f" "$root/lib64/${base%%.so.*}.so"
done

# The driver stub: every `cu*` entry point of cudarc's driver bindings, with the driver's
# soname, so the program records libcuda.so.1 and the loader finds the real one.
manifest="$(cargo metadata --format-version 1 | python3 -c '
import json, sys
print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"))')"
bindings="$(dirname "$manifest")/src/driver/sys/mod.rs"
grep -oE '^pub unsafe fn cu[A-Za-z0-9_]+' "$bindings" | sed -E 's/^pub unsafe fn (.*)/int \1(void) { return 999; }/' \
  | sort -u > "$root/lib64/stubs/cuda_stub.c"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$root/lib64/stubs/libcuda.so" "$root/lib64/stubs/cuda_stub.c"
echo "CUDA root: $root (nvcc $("$root/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
