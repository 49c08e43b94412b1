#!/usr/bin/env bash
# The GPU check in one command:  bash bench/gpu/run.sh [--quick] RESULTS_DIR
# Takes superggml's build from bench/gpu/carry/build-KIND.tar.xz (made here by build.sh: CUDA sm_90, with llama.cpp's
# libllama and llama-bench over the same ggml) where its stamp matches the checkout's native sources, and compiles
# only where it does not. Then makes the models, checks superggml against llama.cpp, benches both, profiles one
# decoded token of each engine (per-pass host and device times, CUDA graphs; with ncu, a kernel table), and leaves in
# RESULTS_DIR results.json, results.md, run.log and logs.tar.gz (every step's log). Every step has a time limit
# inside DEADLINE seconds (default 540); a failed step is recorded and the others still run.
# --quick: the logits check on two families, resident and streamed l8b, the pass profile, no ncu (DEADLINE 150).
# Needs bench/gpu/carry (prep.sh, build.sh). Environment: SIZE=big|small (timing models; default big with CUDA, else
# small), W (work folder: build, models), CUDA=0|1 (default: a GPU), BUILD_LIMIT (s, 420), NCU=0|1 (the kernel table;
# default 1, 0 with --quick), FAMILIES (the check's, instead of the default), DIAG_MOE=1 (moe_diag.py on the MoE
# families among them), TIMING (the timing models to make, e.g. "m4g") and BENCHES (KIND:MODEL pairs, e.g.
# "streamed:m4g", instead of the default benches).
set -u
T0=$(date +%s)
QUICK=0; [ "${1:-}" = --quick ] && { QUICK=1; shift; }
G=$(cd "$(dirname "$0")" && pwd); R=$(cd "$G/../.." && pwd)
OUT=$(mkdir -p "${1:?usage: run.sh [--quick] RESULTS_DIR}" && cd "$1" && pwd); L=$OUT/logs
W=${W:-${TMPDIR:-/tmp}/superggml-gpu}; DEADLINE=${DEADLINE:-$( ((QUICK)) && echo 150 || echo 540)}
rm -rf "$L" "$OUT"/results.* "$OUT"/logs.tar.gz "$OUT"/run.log; mkdir -p "$W" "$L"
exec > >(tee -a "$OUT/run.log") 2>&1
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
step() {  # step NAME LIMIT CMD...: CMD within LIMIT seconds and what is left of DEADLINE (20 s kept for the report)
  local name=$1 lim=$2 t rc left; shift 2; t=$(date +%s)
  left=$(( DEADLINE - 20 - (t - T0) )); (( lim > left )) && lim=$left
  if (( lim < 5 )); then rc=skipped; else timeout -k 5 "$lim" "$@" > "$L/$name.log" 2>&1; rc=$?; fi
  echo "{\"step\": \"$name\", \"rc\": \"$rc\", \"seconds\": $(( $(date +%s) - t )), \"limit\": $lim}" \
    >> "$L/steps.jsonl"
  el "$name: rc $rc in $(( $(date +%s) - t )) s"
}

[ -x /usr/local/cuda/bin/nvcc ] && PATH=$PATH:/usr/local/cuda/bin
gpu() { nvidia-smi -L || ls /dev/nvidia0; } > /dev/null 2>&1
kind=cpu
if [ "${CUDA:-}" = 1 ] || { [ -z "${CUDA:-}" ] && gpu; }; then kind=cuda; fi
# the system's CUDA runtime and cuBLAS (the build carries none of CUDA)
[ $kind = cuda ] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SIZE=${SIZE:-$([ $kind = cuda ] && echo big || echo small)} PYTHONUNBUFFERED=1
export SUPERGGML_CACHE=$W/cache SUPERGGML_SITE=$W/sg PYTHONPATH=$W/sg:$W/site${PYTHONPATH:+:$PYTHONPATH}
A=$G/carry/build-$kind.tar.xz
carried=$(python3 - "$A" "$R" "$G" <<'EOF'
import json, os, subprocess, sys
a, r, g = sys.argv[1:]
meta = a.replace(".tar.xz", ".json")
if not (os.path.exists(a) and os.path.exists(meta)):
    sys.exit("none")
m = json.load(open(meta))
stamp = subprocess.run(["bash", os.path.join(g, "stamp.sh"), r], capture_output=True, text=True).stdout.strip()
py = "%d.%d" % sys.version_info[:2]
print("yes" if m["stamp"] == stamp and m["python"] == py else f"stale (stamp {m['stamp']} vs {stamp}, python {m['python']} vs {py})")
EOF
)
cat > "$L/env.json" <<EOF
{"build": "$kind", "size": "$SIZE", "nproc": $(nproc), "quick": $QUICK, "carried_build": "$carried",
 "git": "$(git -C "$R" rev-parse --short HEAD 2>/dev/null)",
 "gpu": "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)",
 "python": "$(python3 -V 2>&1)", "nvcc": "$(nvcc --version 2>/dev/null | tail -2 | head -1)"}
EOF
el "build: $kind, carried: $carried"

setup() {
  rm -rf "$W/site" "$W/cache" && mkdir -p "$W/cache" || return 1
  for w in "$G"/carry/wheels/*.whl; do     # one by one: a cp312 wheel fails on another python (a CPU test)
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$w" || echo "not installed: $w"
  done
  tar xzf "$G/carry/ggml-src.tar.gz" -C "$W/cache"
}
unpack() {  # the checkout's Python package, with the carried native build in it
  rm -rf "$W/sg" && mkdir -p "$W/sg" && cp -r "$R/python/superggml" "$W/sg/" &&
  find "$W/sg" -name __pycache__ -prune -exec rm -rf {} + ; tar xJf "$A" -C "$W/sg/superggml" &&
  find "$W/sg/superggml" -name 'lib*.so*' -o -name 'llama-bench' -o -name 'native*.so' &&
  { ldd "$W/sg/superggml"/libggml-cuda.so* 2>/dev/null | grep -E 'cuda|cublas|not found' || true; }
}
build() {
  local args="-DSUPERGGML_BUILD_LLAMA=ON"
  [ $kind = cuda ] && args="$args -DGGML_CUDA=ON -DGGML_CUDA_GRAPHS=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_NCCL=OFF"
  rm -rf "$W/sg" && cd "$R" &&
  CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install \
    -v --no-build-isolation --no-deps --no-compile --config-settings=build-dir="$W/build" --target "$W/sg" . &&
  find "$W/sg/superggml" -name 'lib*.so*' -o -name 'llama-bench' -o -name 'native*.so'
}
smoke() {  # the devices this build sees, and one graph on the first that is not the CPU
  python3 - <<'EOF'
import numpy as np
from superggml import native
devs = native.devices()
print(devs)
dev = next((d["name"] for d in devs if d["name"].startswith("CUDA")), "")
b = native.Backend(dev, 1)
ctx = native.Context(max_tensors=8, graph_size=8)
x = ctx.new_tensor(native.GGMLType.F32, [4])
buf = b.alloc_tensors(ctx)
native.tensor_set(x, np.arange(1, 5, dtype=np.float32))
g = ctx.new_graph()
y = ctx.scale(x, 2.0)
y.set_output()
g.expand(y)
b.compute(g)
got = native.tensor_get(y).tolist()
print(b.name, got)
assert got == [2.0, 4.0, 6.0, 8.0], got
EOF
}
export -f setup unpack build smoke; export W G R A kind

step setup 60 bash -c setup
step models_timing 400 python3 "$G/synth.py" timing "$W/models" ${TIMING:-$( ((QUICK)) && echo l8b)} &
timing=$!
if [ "$carried" = yes ]; then step unpack 60 bash -c unpack; else step build "${BUILD_LIMIT:-420}" bash -c build; fi
step smoke 30 bash -c smoke
wait $timing
families="llama qwen3 qwen3moe gemma3 deepseek2 qwen35"; ((QUICK)) && families="llama gemma3"
families=${FAMILIES:-$families}
step models_check 90 python3 "$G/synth.py" check "$W/models" $families
step rate 30 python3 "$G/rate.py" "$L/rate.json"
for m in $families; do
  step check_$m 75 python3 "$G/check.py" "$W/models/$m.gguf" "$L/check_$m.json"
done
bench() {  # bench KIND MODEL LIMIT
  step bench_$1_$2 $3 python3 "$G/bench.py" "$W/models/$2.gguf" $1 "$L/bench_$1_$2.json" "$L/rate.json"
}
profile() {  # profile MODEL: per-pass host and device times of both engines, then ncu's kernel table of one token
  step passes_$1 60 python3 "$G/passes.py" "$W/models/$1.gguf" "$L/passes_$1.json"
  if [ "${NCU:-$((1 - QUICK))}" = 1 ] && command -v ncu > /dev/null; then
    step kernels_$1 100 python3 "$G/kernels.py" "$W/models/$1.gguf" "$L/kernels_$1"
  fi
}
# what the issue asks first: resident at llama.cpp's speed (and why not: the profile), the dense 8B at 1/4
[ -z "${BENCHES:-}" ] && bench resident l8b 100
if [ -n "${BENCHES:-}" ]; then  # KIND:MODEL ... instead of the default benches (their models in TIMING)
  for b in $BENCHES; do bench "${b%%:*}" "${b#*:}" 150; done
elif ((QUICK)); then
  profile l8b; bench streamed l8b 120
else
  bench resident l1b 100; profile l1b; bench streamed l8b 120; bench streamed m4g 150; bench streamed l1b 120
fi
if [ "${DIAG_MOE:-0}" = 1 ]; then  # the MoE families streamed, one setting changed at a time (moe_diag.py)
  for m in $families; do
    case $m in *moe*|deepseek*) step moe_diag_$m 90 python3 "$G/moe_diag.py" "$W/models/$m.gguf" "$L/moe_diag_$m.json" 25 ;; esac
  done
fi
timeout 15 python3 "$G/report.py" "$OUT" > "$L/report.log" 2>&1; el "report: rc $?"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$L"
cat "$OUT/results.md" 2>/dev/null
