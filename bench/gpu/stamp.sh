#!/usr/bin/env bash
# The stamp of what superggml's native build compiles: csrc/, ggml/ (the glue and the pin), CMakeLists.txt and
# pyproject.toml. build.sh records it; run.sh compares it with the checkout's.  bash bench/gpu/stamp.sh REPO
cd "${1:?usage: stamp.sh REPO}" && find csrc ggml CMakeLists.txt pyproject.toml -type f ! -path '*__pycache__*' \
  | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
