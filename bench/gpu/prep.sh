#!/usr/bin/env bash
# Run here, where PyPI is reachable, before a device run: puts what the bare GPU machine lacks into bench/gpu/carry/
# (ignored): cp312 wheels of what it lacks, and the ggml source cache (with llama.cpp's sources and the llama_cpp
# package) as a tarball. Run it again after ggml/fetch.py changes. Prints the carry list. The build (build.sh's
# build-*.tar.xz) stays.
set -eu
cd "$(dirname "$0")/../.."
C=bench/gpu/carry
rm -rf $C/wheels $C/ggml-src.tar.gz && mkdir -p $C/wheels
python3 -m pip download -q --only-binary :all: --python-version 3.12 --platform manylinux2014_x86_64 --no-deps \
  -d $C/wheels gguf llguidance pyyaml diskcache   # gguf imports yaml, llama_cpp diskcache
export SUPERGGML_CACHE=${SUPERGGML_CACHE:-$HOME/.cache/superggml}
python3 ggml/fetch.py --llama > /dev/null   # fills the cache (llama.cpp and llama_cpp too) unless it is whole
tar czf $C/ggml-src.tar.gz -C "$SUPERGGML_CACHE" ggml-src
ls -l $C/wheels $C/ggml-src.tar.gz $C/build-* 2>/dev/null || true
echo "carried: $(du -cb $C bench/gpu/*.gguf | tail -1 | cut -f1) bytes (of 64 MiB, with the rest of the checkout)"
echo 'carry: ["bench/gpu/carry"]'
