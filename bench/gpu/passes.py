"""Where a resident pass's time goes, superggml beside llama.cpp, into OUT.json.

    python3 bench/gpu/passes.py MODEL.gguf OUT.json

superggml: the executor's pass profile (runtime/exec/profile.py) over 512-token prefills, then 64 decoded tokens from an
empty context, as llama-bench runs them, the mean of 3 after the warm-ups, with device events on (a GPU's span per graph), and what ggml-cuda said of its CUDA graphs.
llama.cpp (ref.py "profile"): the same passes through its C API, each llama_decode timed apart from the wait for its
results (llama_synchronize) and the logits' copy, with llama_perf_context's own figures and the same CUDA-graph words.
"""

import json
import os
import sys
import time

import numpy as np

from common import THREADS, device_kw, device_name, error, reference, run_ref
from superggml import Model, native

N_PROMPT, N_GEN, REPS = 512, 64, 3


def superggml_passes(path):
    prompt = np.random.default_rng(1).integers(100, 40000, N_PROMPT).tolist()
    logs0 = native.ggml_log_counts()
    with Model(
        path, ctx_size=1024, n_batch=512, n_threads=THREADS, flash_attn=False, device_budget="off", **device_kw()
    ) as m:
        ex = m.runtime
        events = ex.device_timing(True)
        for rep in range(REPS + 2):  # as llama-bench: the prefill runs, then the decode runs
            if rep == 2:
                ex.profile.reset()  # two warm-ups: the plans before and after the weights' load are built
            m.reset()
            m.eval(prompt)
        profile = {"prefill": ex.profile.as_dict()["prefill"]}
        for rep in range(REPS + 1):
            if rep == 1:
                ex.profile.reset()
            m.reset()
            t0 = time.perf_counter()
            for t in prompt[:N_GEN]:
                m.eval([t])
            tg = time.perf_counter() - t0
        profile["decode"] = ex.profile.as_dict()["decode"]
        st = m.stats()
    logs = {k: v - logs0.get(k, 0) for k, v in native.ggml_log_counts().items() if v != logs0.get(k, 0)}
    return {
        "device_events": events,
        "pass_profile": profile,
        "graphs_per_pass": st["graphs_per_pass"],
        "last_rep_decode_ms_per_token": 1e3 * tg / N_GEN,
        "cuda_graph_log": logs,
    }


def main():
    path, out = sys.argv[1], sys.argv[2]
    res = {"model": os.path.basename(path).removesuffix(".gguf"), "device": device_name(), "errors": {}}
    try:
        res["superggml"] = superggml_passes(path)
    except Exception as e:
        res["errors"]["superggml"] = error(e)
    try:
        r = run_ref(
            reference(),
            {
                "kind": "profile",
                "model": path,
                "ngl": 99,
                "n_ctx": 1024,
                "n_prompt": N_PROMPT,
                "n_gen": N_GEN,
                "reps": REPS,
            },
            timeout=300,
        )
        res["llama.cpp"] = json.loads(str(r["profile"]))
    except Exception as e:
        res["errors"]["llama.cpp"] = error(e)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
