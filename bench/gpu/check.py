"""superggml against llama.cpp on one model, on the GPU where there is one; and streamed against resident.

    python3 bench/gpu/check.py MODEL.gguf OUT.json

Both run the same ~32-token prompt (its logits, every row) and 64 greedy tokens after it; llama.cpp with every layer
on the GPU (n_gpu_layers 99), flash attention off in both. Streamed: device_budget a quarter of the weights, against
device_budget "off", repack off in both (the streamed path cannot re-lay weights for the CPU), bit for bit.
On a GPU, each engine's own gap between the GPU and the CPU on the same prompt's logits (superggml's against
llama.cpp's, with n_gpu_layers 0), and the two CPUs' against each other.
"""

import itertools
import json
import os
import sys
import time

import numpy as np

from common import device_kw, device_name, error, reference, run_ref, sizes
from superggml import Model

TEXT = (
    "The old lighthouse keeper climbed the stairs each evening, lit the lamp, and wrote in his log about the "
    "ships that passed, the storms that came, and the letters he never sent."
)
N_GEN, CTX = 64, 256


def superggml_run(path, prompt, cpu=False, **kw):
    """The prompt's logits, the greedy ids after it, the run's stats; prompt None: TEXT's tokens (returned too);
    cpu: on the CPU whatever this build has."""
    dev = {} if cpu else device_kw()
    with Model(path, ctx_size=CTX, n_batch=512, flash_attn=False, seed=0, **dev, **kw) as m:
        prompt = prompt or m.tokenize(TEXT)
        logits = np.array(m.eval(prompt, logits_all=True), dtype=np.float32).reshape(len(prompt), -1)
        m.reset()
        ids = list(itertools.islice(m.generate(prompt, temp=0.0), N_GEN))
        st = m.stats()
        keep = (
            "n_slots",
            "slot_size",
            "layers_pinned",
            "host_slots",
            "bytes_loaded",
            "expert_bytes_loaded",
            "direct_io",
        )
        return prompt, logits, ids, {"device": list(m.device), **{k: st[k] for k in keep if k in st}}


def save(res, out, t0, what):
    """Writes what there is so far (a step stopped at its time limit leaves its part)."""
    res["seconds"] = round(time.time() - t0, 1)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"[{res['seconds']}s] {what}", flush=True)


def main():
    path, out = sys.argv[1], sys.argv[2]
    res = {"model": os.path.basename(path).removesuffix(".gguf"), "device": device_name(), "errors": {}}
    t0 = time.time()
    try:
        prompt, logits, ids, info = superggml_run(path, None, device_budget="off")
        res.update(n_prompt=len(prompt), superggml=info)
    except Exception as e:
        res["errors"]["superggml"] = error(e)
        return save(res, out, t0, "superggml failed")
    save(res, out, t0, "superggml resident")
    try:
        ref = reference()
        res["reference"] = {k: ref[k] for k in ("lib", "llama_cpp")}
        r = run_ref(
            ref,
            {"kind": "check", "model": path, "prompt": prompt, "n_gen": N_GEN, "ngl": 99, "n_ctx": CTX},
            timeout=120,
        )
        res["max_abs_dlogit"] = float(np.abs(logits - r["logits"]).max())
        res["max_abs_logit"] = float(np.abs(r["logits"]).max())
        res["argmax_agree"] = f"{int((logits.argmax(-1) == r['logits'].argmax(-1)).sum())}/{len(prompt)}"
        res["greedy_equal"] = ids == r["ids"].tolist()
        res["greedy_same_prefix"] = next((i for i, (a, b) in enumerate(zip(ids, r["ids"])) if a != b), N_GEN)
    except Exception as e:
        res["errors"]["llama.cpp"] = error(e)
        r = None
    save(res, out, t0, "llama.cpp")
    if device_kw() and r is not None:  # on a GPU: what each engine's own GPU and CPU differ by
        try:
            _, c_logits, _, _ = superggml_run(path, prompt, cpu=True, device_budget="off")
            req = {"kind": "check", "model": path, "prompt": prompt, "n_gen": 1, "ngl": 0, "n_ctx": CTX}
            rc = run_ref(ref, req, timeout=120)["logits"]
            res["cross_backend"] = {
                "superggml_gpu_vs_cpu": float(np.abs(logits - c_logits).max()),
                "llama.cpp_gpu_vs_cpu": float(np.abs(r["logits"] - rc).max()),
                "cpu_superggml_vs_llama.cpp": float(np.abs(c_logits - rc).max()),
            }
        except Exception as e:
            res["errors"]["cross_backend"] = error(e)
        save(res, out, t0, "GPU against CPU")
    try:
        weights, _ = sizes(path)
        _, a_logits, a_ids, _ = superggml_run(path, prompt, device_budget="off", repack=False)
        _, b_logits, b_ids, info = superggml_run(path, prompt, device_budget=weights // 4, repack=False)
        res["streamed"] = {
            "budget": weights // 4,
            "weights": weights,
            **info,
            "logits_equal": bool(np.array_equal(a_logits, b_logits)),
            "max_abs_d": float(np.abs(a_logits - b_logits).max()),
            "greedy_equal": a_ids == b_ids,
        }
    except Exception as e:
        res["errors"]["streamed"] = error(e)
    save(res, out, t0, "streamed against resident")


if __name__ == "__main__":
    main()
