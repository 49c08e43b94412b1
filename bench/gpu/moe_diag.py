"""A MoE model streamed under a quarter of its weights, one setting changed at a time, each in a process of its
own (a crash ends only its own case), against the resident logits: which part of the expert path breaks.

    python3 bench/gpu/moe_diag.py MODEL.gguf OUT.json [LIMIT_S]

Each case prints max |dlogit| against resident over a prompt in one pass ("prompt") and over passes of one row
("rows": 16 prompt tokens, then 8 more), its expert stats, and on a crash the Python stack (faulthandler) and the
last lines of its output. CUDA_LAUNCH_BLOCKING=1 makes a faulting kernel fail at its own launch.

The cache_* cases put the experts in a device expert cache of an eighth of the weights. One-row passes run
ggml-cuda's mul_mat_vec_q, whose rows do not depend on how many experts a tensor has: there a device cache must
equal resident bit for bit. A pass of many rows runs mul_mat_q, whose stream-k split divides
rows x columns x experts tiles among the SMs: with the cache's slot count in place of the model's expert count
the sums split elsewhere, so the prompt's logits may differ in the last bits there.
"""

import json
import os
import subprocess
import sys
import time

CASES = {
    "default": {},
    "tier_off": {"host_cache": "off"},
    "direct_off": {"direct_io": "off"},
    "place_device": {"placement": "device"},
    "place_host": {"placement": "host"},
    "sync_prefetch": {"async_prefetch": False},
    "no_lookahead": {"expert_lookahead": False},
    "cache_device": {"expert_cache": 0.125, "placement": "device"},
    "cache_auto": {"expert_cache": 0.125},
    "cache_host": {"expert_cache": 0.125, "placement": "host"},
}

CHILD = r"""
import faulthandler, json, sys
import numpy as np
faulthandler.enable()
from common import device_kw, sizes
from superggml import Model
path, kw = sys.argv[1], json.loads(sys.argv[2])
weights, _ = sizes(path)
if "expert_cache" in kw:
    kw["expert_cache"] = int(weights * kw["expert_cache"])
prompt = list(range(100, 140))
def run(**k):
    with Model(path, ctx_size=256, n_batch=512, flash_attn=False, seed=0, repack=False, **device_kw(), **k) as m:
        lg = np.array(m.eval(prompt, logits_all=True), dtype=np.float32).reshape(len(prompt), -1)
        m.reset()
        rows = [np.array(m.eval([t]), dtype=np.float32).reshape(1, -1) for t in prompt[:16] + list(range(5, 13))]
        st = m.stats()
        keep = {x: st[x] for x in st if x.startswith("expert") or x in ("host_slots", "n_slots", "direct_io")}
        return lg, np.concatenate(rows), keep
def diff(a, b):
    return float(np.abs(a - b).max()) if np.isfinite(b).all() else float("nan")
ref, ref_rows, _ = run(device_budget="off")
out, rows, st = run(device_budget=weights // 4, **kw)
print("RESULT " + json.dumps({
    "max_abs_d": diff(ref, out), "equal": bool(np.array_equal(ref, out)),
    "rows_max_abs_d": diff(ref_rows, rows), "rows_equal": bool(np.array_equal(ref_rows, rows)), "stats": st}))
"""


def main():
    path, out = sys.argv[1], sys.argv[2]
    limit = float(sys.argv[3]) if len(sys.argv) > 3 else 30
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1", "PYTHONFAULTHANDLER": "1"}
    res = {"model": os.path.basename(path), "cases": {}}
    for name, kw in CASES.items():
        t0 = time.time()
        try:
            p = subprocess.run(
                [sys.executable, "-c", CHILD, path, json.dumps(kw)],
                cwd=here,
                env=env,
                capture_output=True,
                text=True,
                timeout=limit,
            )
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            r = json.loads(line[7:]) if line else {"rc": p.returncode, "tail": (p.stdout + p.stderr)[-2500:]}
        except subprocess.TimeoutExpired:
            r = {"rc": "timeout"}
        r["seconds"] = round(time.time() - t0, 1)
        res["cases"][name] = r
        print(name, json.dumps(r)[:600], flush=True)
        with open(out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
