#!/usr/bin/env bash
# The GPU machine's build, made here so that no device minute compiles:  bash bench/gpu/build.sh [cuda|cpu]
# Leaves bench/gpu/carry/build-KIND.tar.xz (superggml's native module, ggml's and llama.cpp's libraries and
# llama-bench, stripped) and build-KIND.json (the stamp of the native sources it was built from); run.sh unpacks it
# where the stamp matches the checkout's, and compiles there only where it does not.
# cuda (default): sm_90, CUDA 13.0 from NVIDIA's wheels (toolkit.sh), Python 3.12 (the GPU machine's), GGML_NATIVE off.
# cpu: the same steps for this machine's python3, to test run.sh here. FA=0: ggml-cuda without flash attention's
# kernels (GGML_CUDA_FA=OFF), about 25 minutes less to compile; the check runs with flash attention off anyway.
# The build folder is kept in the cache ($SUPERGGML_CACHE, else ~/.cache/superggml), keyed by the pinned source and
# the options: the first CUDA build is about 40 minutes on 2 cores, later ones recompile only what changed.
set -euo pipefail
KIND=${1:-cuda}
R=$(cd "$(dirname "$0")/../.." && pwd); G=$R/bench/gpu; cd "$R"
export SUPERGGML_CACHE=${SUPERGGML_CACHE:-$HOME/.cache/superggml}
C=$SUPERGGML_CACHE/gpu; mkdir -p "$C" "$G/carry"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

case $KIND in
  cuda) PY=${PY:-$(ls "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)}; PY=${PY:-python3.12}
        CUDA=$(bash "$G/toolkit.sh" "$C/cuda-13.0") && el "toolkit: $CUDA"
        link="-Wl,-rpath-link,$CUDA/lib:$CUDA/lib/stubs"
        ARGS="-DGGML_CUDA=ON -DGGML_CUDA_GRAPHS=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_NCCL=OFF"
        ARGS="$ARGS -DCMAKE_CUDA_COMPILER=$CUDA/bin/nvcc"
        ARGS="$ARGS -DCUDAToolkit_ROOT=$CUDA -DCMAKE_EXE_LINKER_FLAGS=$link -DCMAKE_SHARED_LINKER_FLAGS=$link"
        [ "${FA:-1}" = 0 ] && ARGS="$ARGS -DGGML_CUDA_FA=OFF" ;;
  cpu)  PY=${PY:-$(command -v python3)}; ARGS="" ;;
  *)    echo "usage: build.sh [cuda|cpu]" >&2; exit 2 ;;
esac
ARGS="$ARGS -DGGML_NATIVE=OFF -DSUPERGGML_BUILD_LLAMA=ON"
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
V=$C/venv-$pyver
[ -x "$V/bin/python" ] || "$PY" -m venv "$V"
"$V/bin/python" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "pybind11>=2.12" numpy
src=$(python3 ggml/fetch.py --llama)
sdist=$(python3 -c 'import sys; sys.path.insert(0, "ggml"); import fetch; print(fetch.SHA256)')
key=$(echo "$sdist $KIND $pyver $ARGS" | sha256sum | cut -c1-12)
B=$C/build-$KIND-$key; T=$C/install-$KIND; stamp=$(bash "$G/stamp.sh" "$R")
el "building $KIND for python $pyver in $B (ggml from $src)"
rm -rf "$T"
CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$V/bin/python" -m pip install --disable-pip-version-check \
  --no-build-isolation --no-deps --no-compile --config-settings=build-dir="$B" --target "$T" . > "$C/build-$KIND.log" 2>&1 \
  || { tail -40 "$C/build-$KIND.log"; exit 1; }
el "built"
[ "$(bash "$G/stamp.sh" "$R")" = "$stamp" ] || { echo "the native sources changed during the build: run it again" >&2; exit 1; }
cd "$T/superggml"
files=$(find . \( -name 'native*.so' -o -name 'lib*.so*' -o -path './bin/*' \) \( -type f -o -type l \) | sort)
for f in $files; do [ -L "$f" ] || strip --strip-unneeded "$f"; done
tar cf - $files | xz -9 -T0 > "$G/carry/build-$KIND.tar.xz.tmp"
mv "$G/carry/build-$KIND.tar.xz.tmp" "$G/carry/build-$KIND.tar.xz"
cat > "$G/carry/build-$KIND.json" <<JSON
{"kind": "$KIND", "stamp": "$stamp", "python": "$pyver", "key": "$key", "cmake_args": "$ARGS",
 "git": "$(git -C "$R" rev-parse --short HEAD 2>/dev/null)", "built": "$(date -u +%FT%TZ)"}
JSON
el "carry: $(du -b "$G/carry/build-$KIND.tar.xz" | cut -f1) bytes ($(echo $files | wc -w) files), stamp $stamp"
