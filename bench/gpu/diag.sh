#!/usr/bin/env bash
# A short device call: build superggml for CUDA (no llama.cpp), make the timing models, run diag.py on them.
#     bash bench/gpu/diag.sh OUTDIR        (carry ["bench/gpu/carry"]; about 5 minutes on an H200)
set -u
G=$(cd "$(dirname "$0")" && pwd); R=$(cd "$G/../.." && pwd); OUT=$(mkdir -p "$1" && cd "$1" && pwd)
W=${W:-/tmp/sg-diag}; rm -rf "$W/sg" "$W/site" "$W/cache" "$W/models"; mkdir -p "$W/site" "$W/cache"
for w in "$G"/carry/wheels/*.whl; do python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$w"; done
tar xzf "$G/carry/ggml-src.tar.gz" -C "$W/cache"
export SUPERGGML_CACHE=$W/cache PYTHONPATH=$W/sg:$W/site PYTHONUNBUFFERED=1
[ -x /usr/local/cuda/bin/nvcc ] && PATH=$PATH:/usr/local/cuda/bin
cuda=""
if command -v nvcc > /dev/null && { nvidia-smi -L > /dev/null 2>&1 || [ -e /dev/nvidia0 ]; }; then
  cuda="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF"
fi
python3 "$G/synth.py" timing "$W/models" > "$OUT/synth.log" 2>&1 &
cd "$R" && CMAKE_ARGS="$cuda" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout "${BUILD_LIMIT:-330}" python3 -m pip install \
  --no-build-isolation --no-deps --no-compile --config-settings=build-dir="$W/build" --target "$W/sg" . \
  > "$OUT/build.log" 2>&1
echo "build rc $?"; wait
cd "$G" && timeout "${DIAG_LIMIT:-90}" python3 diag.py "$W/models/l1b.gguf" "$W/models/l8b.gguf" 2>&1 | tee "$OUT/diag.log"
