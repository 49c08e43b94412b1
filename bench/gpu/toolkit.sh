#!/usr/bin/env bash
# A CUDA 13.0 toolkit made of NVIDIA's wheels from PyPI, to compile ggml-cuda for sm_90 on a machine with no GPU:
#   bash bench/gpu/toolkit.sh DIR     -> DIR/cu13 (bin/ include/ lib/ nvvm/), about 840 MB; prints its path
# 13.0.x matches the GPU machine (driver 580, CUDA 13.0). Adds the unversioned library links FindCUDAToolkit needs,
# a lib64 link (nvcc.profile), and a stub libcuda.so.1 for linking only: never carry it (the driver's is there).
set -euo pipefail
P=${1:?usage: toolkit.sh DIR}
CUDA=$P/sp/nvidia/cu13
if [ -x "$CUDA/bin/nvcc" ] && [ -e "$CUDA/lib/stubs/libcuda.so.1" ]; then echo "$CUDA"; exit 0; fi
python3 -m pip download -q --no-deps -d "$P/dl" \
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14 >&2
python3 -m pip install -q --no-deps --no-index --no-compile --target "$P/sp" "$P"/dl/*.whl >&2
ln -sfn lib "$CUDA/lib64"
for l in cudart cublas cublasLt; do ln -sf "lib$l.so.13" "$CUDA/lib/lib$l.so"; done
mkdir -p "$CUDA/lib/stubs"
gcc -E -P -I"$CUDA/include" "$CUDA/include/cuda.h" | grep -oE '\bcu[A-Z][A-Za-z0-9_]*\s*\(' | sed 's/\s*($//' \
  | sort -u | awk '{print "void " $1 "(void){}"}' > "$P/cuda_stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CUDA/lib/stubs/libcuda.so" "$P/cuda_stub.c"
ln -sf libcuda.so "$CUDA/lib/stubs/libcuda.so.1"
echo "$CUDA"
