"""A MoE model streamed under a quarter of its weights, one setting changed at a time, each in a process of its
own (a crash ends only its own case), against the resident logits: which part of the expert path breaks.

    python3 bench/gpu/moe_diag.py MODEL.gguf OUT.json [LIMIT_S]

Each case prints max |dlogit| against resident over a short prompt and 8 greedy tokens, its expert stats, and on
a crash the Python stack (faulthandler) and the last lines of its output. CUDA_LAUNCH_BLOCKING=1 makes a faulting
kernel fail at its own launch.
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
}

CHILD = r"""
import faulthandler, json, sys
import numpy as np
faulthandler.enable()
from common import device_kw, sizes
from superggml import Model
path, kw = sys.argv[1], json.loads(sys.argv[2])
weights, _ = sizes(path)
prompt = list(range(100, 140))
def run(**k):
    with Model(path, ctx_size=256, n_batch=512, flash_attn=False, seed=0, repack=False, **device_kw(), **k) as m:
        lg = np.array(m.eval(prompt, logits_all=True), dtype=np.float32).reshape(len(prompt), -1)
        outs = [lg]
        for t in (5, 6, 7, 8, 9, 10, 11, 12):
            outs.append(np.array(m.eval([t]), dtype=np.float32).reshape(1, -1))
        st = m.stats()
        keep = {x: st[x] for x in st if x.startswith("expert") or x in ("host_slots", "n_slots", "direct_io")}
        return np.concatenate(outs), keep
ref, _ = run(device_budget="off")
out, st = run(device_budget=weights // 4, **kw)
d = float(np.nanmax(np.abs(ref - out))) if np.isfinite(out).all() else float("nan")
print("RESULT " + json.dumps({"max_abs_d": d, "equal": bool(np.array_equal(ref, out)), "stats": st}))
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
