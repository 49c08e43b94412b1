#!/usr/bin/env bash
# The GPU check in one command:  bash bench/gpu/run.sh RESULTS_DIR
# Builds superggml (CUDA sm_90 where there are a GPU and nvcc, with llama.cpp's libllama and llama-bench over the same
# ggml), makes the models, checks superggml against llama.cpp, benches both, and leaves in RESULTS_DIR results.json,
# results.md, run.log and logs.tar.gz (every step's log: a device call brings back 8 files at most). Every step has a
# time limit inside DEADLINE seconds (default 540); a failed step is recorded and the others still run.
# Needs bench/gpu/carry (made here by bench/gpu/prep.sh). Environment: SIZE=big|small (timing models; default big
# with CUDA, else small), W (work folder: build, models), CUDA=0|1 (default: a GPU and nvcc), BUILD_LIMIT (s, 420).
set -u
T0=$(date +%s)
G=$(cd "$(dirname "$0")" && pwd); R=$(cd "$G/../.." && pwd)
OUT=$(mkdir -p "${1:?usage: run.sh RESULTS_DIR}" && cd "$1" && pwd); L=$OUT/logs
W=${W:-${TMPDIR:-/tmp}/superggml-gpu}; DEADLINE=${DEADLINE:-540}
rm -rf "$L" "$OUT"/results.* "$OUT"/logs.tar.gz "$OUT"/run.log; mkdir -p "$W" "$L"
exec > >(tee -a "$OUT/run.log") 2>&1
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
step() {  # step NAME LIMIT CMD...: CMD within LIMIT seconds and what is left of DEADLINE (25 s kept for the report)
  local name=$1 lim=$2 t rc left; shift 2; t=$(date +%s)
  left=$(( DEADLINE - 25 - (t - T0) )); (( lim > left )) && lim=$left
  if (( lim < 10 )); then rc=skipped; else timeout -k 5 "$lim" "$@" > "$L/$name.log" 2>&1; rc=$?; fi
  echo "{\"step\": \"$name\", \"rc\": \"$rc\", \"seconds\": $(( $(date +%s) - t )), \"limit\": $lim}" \
    >> "$L/steps.jsonl"
  el "$name: rc $rc in $(( $(date +%s) - t )) s"
}

cuda=""
[ -x /usr/local/cuda/bin/nvcc ] && PATH=$PATH:/usr/local/cuda/bin
gpu() { command -v nvcc && { nvidia-smi -L || ls /dev/nvidia0; }; } > /dev/null 2>&1
if [ "${CUDA:-}" = 1 ] || { [ -z "${CUDA:-}" ] && gpu; }; then
  cuda="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF"
fi
export SIZE=${SIZE:-$([ -n "$cuda" ] && echo big || echo small)} PYTHONUNBUFFERED=1
export SUPERGGML_CACHE=$W/cache SUPERGGML_SITE=$W/sg PYTHONPATH=$W/sg:$W/site${PYTHONPATH:+:$PYTHONPATH}
cat > "$L/env.json" <<EOF
{"build": "${cuda:-CPU}", "size": "$SIZE", "nproc": $(nproc),
 "git": "$(git -C "$R" rev-parse --short HEAD 2>/dev/null)",
 "gpu": "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)",
 "python": "$(python3 -V 2>&1)", "nvcc": "$(nvcc --version 2>/dev/null | tail -2 | head -1)"}
EOF

setup() {
  rm -rf "$W/site" "$W/cache" && mkdir -p "$W/cache" || return 1
  for w in "$G"/carry/wheels/*.whl; do     # one by one: a cp312 wheel fails on another python (a CPU test)
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$w" || echo "not installed: $w"
  done
  tar xzf "$G/carry/ggml-src.tar.gz" -C "$W/cache"
}
build() {
  rm -rf "$W/sg" && cd "$R" &&
  CMAKE_ARGS="$cuda -DSUPERGGML_BUILD_LLAMA=ON" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install \
    -v --no-build-isolation --no-deps --no-compile --config-settings=build-dir="$W/build" --target "$W/sg" . &&
  find "$W/sg/superggml" -name 'lib*.so*' -o -name 'llama-bench' -o -name 'native*.so'
}
export -f setup build; export W G R cuda

step setup 60 bash -c setup
step models_timing 400 python3 "$G/synth.py" timing "$W/models" &
timing=$!
step build "${BUILD_LIMIT:-420}" bash -c build
wait $timing
step models_check 90 python3 "$G/synth.py" check "$W/models"
step rate 30 python3 "$G/rate.py" "$L/rate.json"
for m in llama qwen3 qwen3moe gemma3 deepseek2 qwen35; do
  step check_$m 75 python3 "$G/check.py" "$W/models/$m.gguf" "$L/check_$m.json"
done
bench() {  # bench KIND MODEL LIMIT
  step bench_$1_$2 $3 python3 "$G/bench.py" "$W/models/$2.gguf" $1 "$L/bench_$1_$2.json" "$L/rate.json"
}
# what the issue asks first: the dense 8B at 1/4, the MoE with its experts 4x the budget; then the rest
bench resident l8b 100; bench streamed l8b 120; bench streamed m4g 150; bench resident l1b 100
bench streamed l1b 120
timeout 15 python3 "$G/report.py" "$OUT" > "$L/report.log" 2>&1; el "report: rc $?"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$L"
cat "$OUT/results.md" 2>/dev/null
