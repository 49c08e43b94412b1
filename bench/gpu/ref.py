"""llama.cpp through llama-cpp-python's llama_cpp, in a process of its own (two ggml copies in one process clash).

python3 ref.py REQUEST.json OUT.npz      kinds: "check" (prompt logits, greedy ids), "bench" (pp and tg tok/s)
"""

import json
import sys
import time

import llama_cpp
import numpy as np


def fresh(llm):
    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)


def main():
    with open(sys.argv[1]) as f:
        req = json.load(f)
    llm = llama_cpp.Llama(
        model_path=req["model"],
        n_gpu_layers=req["ngl"],
        n_ctx=req["n_ctx"],
        n_batch=512,
        n_ubatch=512,
        n_threads=req["threads"],
        n_threads_batch=req["threads"],
        flash_attn=False,
        logits_all=req["kind"] == "check",
        verbose=False,
    )
    out = {}
    if req["kind"] == "check":
        prompt = req["prompt"]
        llm.eval(prompt)
        out["logits"] = np.array(llm.scores[: len(prompt)], dtype=np.float32)
        fresh(llm)
        ids = []
        for t in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            ids.append(t)
            if len(ids) == req["n_gen"]:
                break
        out["ids"] = np.array(ids, dtype=np.int64)
    else:  # as llama-bench: pp from an empty context, tg from an empty context, the mean of reps after a warm-up
        rng = np.random.default_rng(1)
        prompt = rng.integers(100, 40000, req["n_prompt"]).tolist()
        pp, tg = [], []
        for rep in range(req["reps"] + 1):
            fresh(llm)
            t0 = time.perf_counter()
            llm.eval(prompt)
            t1 = time.perf_counter()
            fresh(llm)
            for t in prompt[: req["n_gen"]]:
                llm.eval([t])
            t2 = time.perf_counter()
            if rep:
                pp.append(req["n_prompt"] / (t1 - t0))
                tg.append(req["n_gen"] / (t2 - t1))
        out = {"pp": np.array(pp), "tg": np.array(tg)}
    np.savez(sys.argv[2], **out)


if __name__ == "__main__":
    main()
