"""One bench run in a child process under a real RAM limit: a new child memory cgroup (tests/support/memcg.py), the
model file's pages dropped from the page cache first, for bench/at_scale.py and bench/moe_limited.py.

- superggml (SUPERGGML): `Model(path, **req["options"])`, the prompt in one eval then the rest of the tokens one
  by one, teacher-forced, the decode timed; it reports the decode's change of the stats in req["diff"] ("decode")
  and the stats in req["report"] after it (or any child script that reads the request file in argv[1], saves its
  logits to req["out"] (.npy) and prints a JSON line last);
- llama.cpp (LLAMA): tests/support/llama_ref.py's child, the one the tests use, with its "decode" request: mmap, no
  repack, the prompt in one batch then the rest teacher-forced, the decode timed (the pip-installed llama-cpp-python).

Either way: the JSON line's figures, "logits", "wall_s" (the run's seconds) and "stderr" (its lines that start
"superggml:"), or {"error": ...} (exit -9: OOM-killed).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np

SUPPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support")
LLAMA = "llama.cpp"  # the `code` that runs llama.cpp

SUPERGGML = r"""
import json, resource, sys, time
import numpy as np
from superggml import Model
req = json.loads(open(sys.argv[1]).read())
toks = req["tokens"]
t = time.perf_counter()
with Model(req["model"], **req["options"]) as m:
    t_load = time.perf_counter() - t
    first = m.eval(toks[:req["prompt"]])[-1].copy()
    s0 = m.stats()
    t = time.perf_counter()
    for tok in toks[req["prompt"]:]:
        last = m.eval([tok])[-1]
    dt = time.perf_counter() - t
    s = m.stats()
    last = last.copy()
    decode = {k: s[k] - s0[k] for k in req["diff"] if k in s}
np.save(req["out"], np.stack([first, last]))
print(json.dumps(dict(decode_s=dt, load_s=t_load, ctx_size=m.settings.context.ctx_size,
                      maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, decode=decode,
                      **{k: s.get(k) for k in req["report"]})))
"""


def run(code: str, req: dict, path: str, limit: int, timeout: float, workdir: str, name: str) -> dict[str, Any]:
    """One run of `code` (a superggml child script, or LLAMA) over the model at `path` in a memory cgroup of
    `limit` bytes; `name` names its files in `workdir`."""
    if SUPPORT not in sys.path:
        sys.path.insert(0, SUPPORT)
    if code == LLAMA:
        return _llama(req, path, limit, timeout)
    import memcg

    req = dict(req, model=path, out=os.path.join(workdir, name + ".npy"))
    with open(os.path.join(workdir, name + ".json"), "w") as f:
        json.dump(req, f)
    memcg.drop_page_cache(path)
    t = time.perf_counter()
    try:
        r = memcg.run_limited([sys.executable, "-c", code, f.name], limit, timeout=timeout)
    except Exception as e:  # subprocess.TimeoutExpired, no cgroup
        return {"error": f"{type(e).__name__}: {e}"}
    if r.returncode != 0:
        return {
            "error": f"exit {r.returncode}" + (" (OOM-killed)" if r.returncode == -9 else "") + f": {r.stderr[-1500:]}"
        }
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.perf_counter() - t
    out["logits"] = np.load(req["out"])
    out["stderr"] = [ln for ln in r.stderr.splitlines() if ln.startswith("superggml:")]
    return out


def _llama(req: dict, path: str, limit: int, timeout: float) -> dict[str, Any]:
    """llama_ref's "decode" of req (tokens, prompt, n_threads, n_ctx), no repack, in the cgroup."""
    import llama_ref

    t = time.perf_counter()
    try:
        z = llama_ref.run(dict(req, kind="decode", model=path, repack=False), timeout=timeout, which="pip", limit=limit)
    except llama_ref.ChildFailed as e:
        return {"error": f"{e.exit}: {e.stderr[-1500:]}"}
    except Exception as e:  # subprocess.TimeoutExpired, no cgroup
        return {"error": f"{type(e).__name__}: {e}"}
    return dict(
        decode_s=float(z["decode_s"]),
        load_s=float(z["load_s"]),
        maxrss=int(z["maxrss"]),
        wall_s=time.perf_counter() - t,
        logits=z["logits"],
        stderr=[],
    )
