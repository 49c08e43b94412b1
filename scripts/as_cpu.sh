#!/usr/bin/env bash
# Runs a command as on a CPU with fewer features: both engines (superggml and the reference llama_cpp) compute
# with a ggml-cpu built for that level, so a test's gap can be told from a machine's rounding.
#   bash scripts/as_cpu.sh avx2 -- python3 -m pytest tests/families/test_arch.py -k batch_equals
# Levels: avx2 (AVX2, FMA, F16C, BMI2: an x86-64 without AVX-512, such as a Zen 2 or 3 EPYC), avx (AVX only),
# sse (SSE4.2). The library is built once per level from the pinned source (ggml/fetch.py's cache, about a minute
# on 2 cores) into ~/.cache/superggml/cpu-<level>; the installed packages are copied, not changed.
set -euo pipefail
level=${1:?usage: as_cpu.sh avx2|avx|sse -- command...}
shift
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "as_cpu.sh: no command" >&2; exit 2; }
case "$level" in
    avx2) flags="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" ;;
    avx) flags="-DGGML_AVX=ON -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF" ;;
    sse) flags="-DGGML_SSE42=ON -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF" ;;
    *) echo "as_cpu.sh: unknown level '$level' (avx2, avx, sse)" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
cache="${SUPERGGML_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/superggml}/cpu-$level"
lib="$cache/build/ggml/src/libggml-cpu.so"
if [ ! -f "$lib" ]; then
    src=$("$PY" "$root/ggml/fetch.py")
    mkdir -p "$cache/wrap"
    printf 'cmake_minimum_required(VERSION 3.18)\nproject(cpu C CXX)\nadd_subdirectory(%s ggml)\n' "$src" \
        > "$cache/wrap/CMakeLists.txt"
    # llama.cpp's options (ggml/CMakeLists.txt) but for this level, not the machine's own features
    # shellcheck disable=SC2086
    cmake -S "$cache/wrap" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_OPENMP=ON -DGGML_LLAMAFILE=ON \
        -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF $flags > "$cache/cmake.log"
    cmake --build "$cache/build" --target ggml-cpu -j "$(nproc)" >> "$cache/cmake.log"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pkg=$("$PY" -c 'import os, superggml; print(os.path.dirname(superggml.__file__))')
ref=$("$PY" -c 'import os, llama_cpp; print(os.path.dirname(llama_cpp.__file__))')
cp -r "$pkg" "$work/superggml"
cp -r "$ref" "$work/llama_cpp"
for d in "$work/superggml" "$work/llama_cpp/lib"; do
    for f in "$d"/libggml-cpu.so*; do
        [ -L "$f" ] && rm "$f"
        cp -L "$lib" "$f"
    done
done
echo "as_cpu.sh: ggml-cpu for $level:" \
    "$(PYTHONPATH="$work" "$PY" -c 'from superggml import native; print(" ".join(k for k, v in native.cpu_features().items() if v))')" >&2
PYTHONPATH="$work${PYTHONPATH:+:$PYTHONPATH}" SUPERGGML_REFERENCE=pip "$@"
